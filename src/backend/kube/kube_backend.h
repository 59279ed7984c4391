// The Kubernetes backend (backend.h) on a Cluster (cluster.h; kube_cluster.h is the one on the
// Kubernetes API): attempts are created suspended for Kueue to admit, and what the cluster says of
// them comes back as AttemptNews.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/engine.h"
#include "backend/kube/cluster.h"

namespace tau::server {

// `cluster` must outlive the backend.
std::unique_ptr<Backend> NewKubeBackend(Cluster* cluster);

// The Kubernetes engine as the registry lists it (engines/engines.h): its factory reads the
// kubeconfig its options name and makes the API client and the KubeCluster the backend drives.
Engine KubeEngine();
Capabilities KubeCapabilities();

}  // namespace tau::server
