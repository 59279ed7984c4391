// The tau server: the control plane of the local backend. `tau server` runs it in the foreground;
// other commands are clients of its REST API (/api/v1/...), on a Unix socket under $TAU_HOME by
// default.
#pragma once

#include <string>

#include "common/status.h"

namespace tau::server {

struct ServerOptions {
  std::string home;         // TAU_HOME: store, snapshots, runs, venvs, the socket
  std::string socket_path;  // default: HOME/tau.sock
  std::string listen;       // optional "host:port" TCP listener
  // The TCP listener speaks TLS with this certificate chain and key (PEM). Required with `listen`
  // unless `insecure_listen` and a loopback host.
  std::string tls_cert_file;
  std::string tls_key_file;
  bool insecure_listen =
      false;               // plaintext TCP, allowed on loopback only (tests, local Prometheus)
  std::string tau_binary;  // this program, started as the attempts' supervisor
  int64_t stop_grace_ms = 10'000;
  int64_t gpu_poll_ms = 10'000;  // GPU health polling interval (XID events arrive in between)
  // Retention of ended runs' logs and GPU samples (0: forever); the evidence record stays.
  int64_t retain_logs_ms = 0;
  int64_t retain_samples_ms = 0;
  bool quiet = false;
  // The Unix socket is mode 0600 (only the server's user) unless shared (0666): on a multi-user
  // machine each caller is still known by its peer credentials, and roles decide the rest.
  bool shared_socket = false;
  // A platform file to apply at start (`tau server --platform FILE`); "" keeps the applied one.
  std::string platform_source;
  // "local" (runs are processes on this machine) or "kubernetes" (Jobs and RayJobs admitted by
  // Kueue on the cluster that `kubeconfig` names; in a pod, its service account's).
  std::string backend = "local";
  std::string kubeconfig;          // "" : $KUBECONFIG, ~/.kube/config, else in-cluster
  std::string kube_context;        // "" : the kubeconfig's current context
  std::string default_image;       // Kubernetes: the image of specs that name none
  bool kube_check_access = false;  // Kubernetes: SubjectAccessReview of each submitter
};

// Runs until SIGTERM or SIGINT. Attempts that are running keep running and are re-adopted by the
// next server. Returns the process exit code.
int RunServer(const ServerOptions& options);

}  // namespace tau::server
