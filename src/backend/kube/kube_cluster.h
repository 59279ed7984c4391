// The Kubernetes backend's Cluster (cluster.h) on the Kubernetes API (src/kubeapi): attempts
// become the Jobs and RayJobs that kube::RenderRun makes, created suspended for Kueue; four
// watches (Jobs, RayJobs, Kueue Workloads, the runs' pods) feed kube::ObserveAttempt, whose
// changes become AttemptNews; each attempt's pod logs are streamed into its attempt directory as
// they are written, so they outlive the pods.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/kube/cluster.h"
#include "common/clock.h"
#include "kubeapi/kubeapi.h"

namespace tau::server {

struct KubeClusterOptions {
  // The image of runs whose spec names none (runtime.image).
  std::string default_image;
  // How often everything is looked at again even without watch events (a missed event costs at
  // most this long).
  int64_t resync_ms = 30'000;
  // Watches are re-opened after this (the API server ends them anyway).
  int watch_timeout_seconds = 300;
  // Ask the API server (SubjectAccessReview) whether the submitting user, with their groups, may
  // create the run's Job or RayJob in its namespace, and refuse the run when not. For clusters
  // whose users are tau's users (the same names, e.g. through the same identity provider).
  bool check_access = false;
  // This installation's name (kube::kLabelInstallation) on what it creates; it adopts its own
  // objects and unlabelled ones, never another installation's. "" : no label, and every tau
  // object on the cluster is adopted (one installation per cluster).
  std::string installation;
  // Each create or delete of an attempt's objects, all its tries together, and how long a
  // namespace's calls fail at once after three in a row could not reach the API server.
  int64_t call_budget_ms = 30'000;
  // How often a RayJob's driver log is fetched from Ray while it runs (more seldom as it grows).
  int64_t driver_log_poll_ms = 2000;
  int64_t breaker_open_ms = 30'000;
  // Where its periods and deadlines read the time (resyncs, a finished attempt's retirement, the
  // drain of an ended attempt's outputs); null: the real clock.
  Clock* clock = nullptr;
};

// `client` must outlive the cluster.
std::unique_ptr<Cluster> NewKubeCluster(kubeapi::Client* client, KubeClusterOptions options);

}  // namespace tau::server
