// What an engine can do, asked instead of its name (docs/backends.md, "Registering an engine"):
// every place that would branch on "local" or "kubernetes" asks one of these.
#pragma once

namespace tau::server {

class ServiceDriver;  // service_driver.h: an optional interface (Backend::services())

struct Capabilities {
  // A run's attempt directories, checkpoints and outputs are on this server's disk (the API's
  // artifact routes serve them); else they are on the engine's own volumes.
  bool files_on_server = false;
  // A run's processes run on this machine: their loopback ports reach them (a service's replicas
  // are probed and served there when the engine has no ServiceDriver).
  bool processes_here = false;
  // runtime.env_secret's NAME:KEY names the engine's own secret (a cluster's Secret NAME); else
  // it is tau's secret NAME.KEY in the workspace's store.
  bool own_secrets = false;
  // Runs run in their spec's runtime.image (else the image is recorded and not used).
  bool runs_images = false;
  // A run is Kubernetes objects (kube::RenderRun's), which `tau plan` prints.
  bool kube_objects = false;
};

}  // namespace tau::server
