// The tau server: the control plane of every engine (the registry's, engines.h). `tau server` runs
// it in the foreground; other commands are clients of its REST API (/api/v1/...), on a Unix socket
// under $TAU_HOME by default.
#pragma once

#include <map>
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
  // Where runs run: a registered engine's name (engines/engines.h; "": the first registered), and
  // that engine's own options by name (the Kubernetes engine's kubeconfig, context, ...).
  std::string backend;
  std::map<std::string, std::string> engine_options;
  // Limits that keep one client from wedging the API for everyone (docs/security.md,
  // "Hardening"). Connections are counted per kind of listener (the Unix socket, TCP) and per
  // source: a TCP address (IPv6: its /64) or a Unix uid.
  int max_connections = 512;
  int max_connections_per_address = 64;
  int max_streams_per_identity = 32;    // event streams, log follows, downloads
  int64_t header_deadline_ms = 10'000;  // from the accept to the end of the first headers
  int64_t idle_timeout_ms = 15'000;     // a kept-alive connection between requests
  int64_t body_grace_ms = 10'000;       // then a body must keep up with body_min_bytes_per_second
  int64_t body_min_bytes_per_second = 64 * 1024;
  // Request bodies over 64 KiB being received and handled at once, by declared length: in all,
  // and per identity (an anonymous caller: per address). Past either, refused before the body is
  // read.
  int64_t max_body_bytes_in_flight = int64_t{384} << 20;
  int64_t max_body_bytes_in_flight_per_identity = int64_t{128} << 20;
  // Refusals (401, 403, 429, 503) written to the audit trail per caller, status and route and
  // minute; every one is counted in tau_http_refused_total.
  int audit_refusals_per_minute = 10;
  int64_t audit_refusal_window_ms = 60'000;
  // Code blobs one identity uploaded that no run uses yet, in bytes; live API tokens per user
  // (docs/security.md, "Code blobs").
  int64_t max_unreferenced_blob_bytes = int64_t{1} << 30;
  int64_t max_tokens_per_user = 100;
};

// Runs until SIGTERM or SIGINT. Attempts that are running keep running and are re-adopted by the
// next server. Returns the process exit code.
int RunServer(const ServerOptions& options);

}  // namespace tau::server
