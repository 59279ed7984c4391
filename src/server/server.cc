#include "server/server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "backend/local/local_backend.h"  // DetectCpuMilli, DetectMemoryBytes
#include "backend/snapshot.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/layout.h"
#include "common/mutex.h"
#include "common/version.h"
#include "controller/controller.h"
#include "engines/engines.h"
#include "evidence/evidence.h"
#include "health/health.h"
#include "http/http.h"
#include "policy/policy.h"
#include "server/api.h"
#include "server/services.h"
#include "server/webhooks.h"
#include "store/store.h"
#include "tls/tls.h"

#ifndef TAU_VERSION
#define TAU_VERSION "0.0.0-dev"
#endif

namespace tau::server {

namespace {

// Less free space than this at start is a full disk, for the log (SQLite needs a few pages).
constexpr uint64_t kDiskFullBytes = 1 << 20;

// The monitor's latest readings as evidence samples (one per GPU that could be read).
std::vector<evidence::GpuSample> EvidenceSamples(const health::HealthSnapshot& snap) {
  std::vector<evidence::GpuSample> out;
  for (const health::GpuSample& s : snap.samples) {
    if (s.lost || s.unreadable || s.at_ms == 0) continue;
    // Built from whole optionals, not field by field: GCC 12 mistakes the latter for reads of
    // uninitialised members (-Wmaybe-uninitialized).
    auto real = [](const auto& o) { return o ? std::optional<double>(*o) : std::nullopt; };
    auto bytes = [](const auto& o) {
      return o ? std::optional<int64_t>(static_cast<int64_t>(*o)) : std::nullopt;
    };
    evidence::GpuSample e{};
    e.at_ms = s.at_ms;
    e.gpu = s.index;
    e.uuid = s.uuid;
    e.util_pct = real(s.gpu_util_pct);
    e.memory_util_pct = real(s.memory_util_pct);
    e.memory_used_bytes = bytes(s.memory_used_bytes);
    e.memory_total_bytes = bytes(s.memory_total_bytes);
    e.temperature_c = real(s.temperature_c);
    e.power_w = s.power_mw ? std::optional<double>(*s.power_mw / 1000.0) : std::nullopt;
    out.push_back(std::move(e));
  }
  return out;
}

// One server per TAU_HOME: an exclusive lock held for the server's life. The kernel drops it when
// the process dies, however it dies, so a stale lock never blocks a restart.
Result<int> TakeServerLock(const std::string& home) {
  std::string path = layout::LockFile(home);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("cannot open " + path, errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {0};
    (void)!::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    return FailedPrecondition(fmt::format("another tau server (pid {}) is already running for {}",
                                          std::strtol(buf, nullptr, 10), home));
  }
  // Written over the old pid, then cut to length: truncating first would free the block and
  // leave the write needing a new one, which a full disk refuses.
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::pwrite(fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size()))
    (void)!::ftruncate(fd, static_cast<off_t>(pid.size()));
  return fd;
}

// The pid file, written at every start. On a full disk the new file cannot be made: the old one is
// overwritten in place (its block is already there), or removed rather than left naming another
// process.
void WritePidFile(const std::string& path, const std::function<void(const std::string&)>& log) {
  RemoveAbandonedTemporaries(path);  // a server killed while writing it left one behind
  const std::string pid = std::to_string(::getpid()) + "\n";
  Status s = WriteFileAtomic(path, pid);
  if (s.ok()) return;
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  bool written = fd >= 0 &&
                 ::pwrite(fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size()) &&
                 ::ftruncate(fd, static_cast<off_t>(pid.size())) == 0;
  if (fd >= 0) ::close(fd);
  if (written) return;
  ::unlink(path.c_str());
  log("cannot write the pid file: " + s.ToString());
}

// A full disk does not stop the server: it starts, serves what the store holds, and commits
// changes once there is space again (Controller::CommitOrDie). Said once at start, plainly.
void SayWhenDiskIsFull(const std::string& home,
                       const std::function<void(const std::string&)>& log) {
  struct statvfs fs {};
  if (::statvfs(home.c_str(), &fs) != 0) return;
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes >= kDiskFullBytes) return;
  log(fmt::format(
      "the disk of {} is full ({} KiB free): serving reads; runs, cancels and other changes are "
      "recorded once space is freed",
      home, free_bytes / 1024));
}

// A TCP listener is reachable by other machines' users, so it speaks TLS; plaintext is allowed only
// on loopback, where just this machine's processes can connect.
Status CheckListenerPolicy(const ServerOptions& options, const std::string& host) {
  bool has_cert = !options.tls_cert_file.empty(), has_key = !options.tls_key_file.empty();
  if (has_cert != has_key) return InvalidArgument("--tls-cert and --tls-key go together");
  if (options.listen.empty()) {
    if (has_cert) return InvalidArgument("--tls-cert and --tls-key need --listen");
    return Status::Ok();
  }
  if (has_cert) {
    // Loaded here too, before anything starts, so a bad file stops the server at once.
    auto checked = tls::ServerContext::Create({options.tls_cert_file, options.tls_key_file});
    return checked.ok() ? Status::Ok() : checked.status();
  }
  if (!options.insecure_listen)
    return InvalidArgument(
        "a TCP listener requires TLS: pass --tls-cert and --tls-key, or --insecure-listen for a "
        "loopback-only plaintext listener (tests, local Prometheus)");
  if (host != "127.0.0.1" && host != "::1" && host != "[::1]" && host != "localhost")
    return InvalidArgument(fmt::format(
        "--insecure-listen is for loopback addresses only (127.0.0.1, ::1, localhost), not '{}'; "
        "pass --tls-cert and --tls-key to listen there",
        host));
  return Status::Ok();
}

}  // namespace

// `--platform FILE` (a ConfigMap on Kubernetes): the file becomes the applied platform at start,
// as `tau platform apply` would make it, unless it already is. A bad file stops the server: running
// with another policy than the one the operator gave would be worse.
static Status AdoptPlatformFile(const std::string& source, const std::string& applied) {
  TAU_ASSIGN_OR_RETURN(std::string yaml, ReadFile(source));
  policy::PlatformOutcome parsed = policy::ParsePlatform(yaml, source);
  if (!parsed.ok()) return InvalidArgument(parsed.ErrorText());
  if (auto current = ReadFile(applied); current.ok() && *current == yaml) return Status::Ok();
  TAU_RETURN_IF_ERROR(WriteFileAtomic(applied, yaml, 0600));
  nlohmann::json meta = {{"source", source}, {"applied_ms", NowMillis()}};
  return WriteFileAtomic(applied + ".applied", JsonText(meta) + "\n", 0600);
}

int RunServer(const ServerOptions& options) {
  auto log = [&](const std::string& line) {
    if (!options.quiet) std::fprintf(stderr, "tau server: %s\n", line.c_str());
  };
  // Signals are taken by one thread with sigwait; every other thread is created with them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  size_t listen_colon = options.listen.rfind(':');
  std::string listen_host =
      listen_colon == std::string::npos ? "127.0.0.1" : options.listen.substr(0, listen_colon);
  if (Status s = CheckListenerPolicy(options, listen_host); !s.ok()) {
    log(s.message());
    return 2;
  }

  if (Status s = MakeDirs(options.home, 0700); !s.ok()) {
    log(s.ToString());
    return 1;
  }
  auto lock = TakeServerLock(options.home);
  if (!lock.ok()) {
    log(lock.status().message());
    return lock.status().code() == StatusCode::kFailedPrecondition ? 3 : 1;
  }
  SayWhenDiskIsFull(options.home, log);
  for (const std::string& dir : {layout::RunsDir(options.home), layout::SnapshotsDir(options.home),
                                 layout::BlobsDir(options.home), layout::VenvsDir(options.home)})
    (void)MakeDirs(dir, 0700);
  if (!options.platform_source.empty()) {
    if (Status s = AdoptPlatformFile(options.platform_source, layout::PlatformFile(options.home));
        !s.ok()) {
      log(s.message());
      return 2;
    }
  }
  auto store = store::Store::Open(layout::StoreFile(options.home));
  if (!store.ok()) {
    log(store.status().ToString());
    return 1;
  }
  // The GPU monitor starts first (its first pass tells which GPUs may be used) and reports verdict
  // changes to the controller, which it may only do once the controller exists.
  std::atomic<Controller*> verdict_sink{nullptr};
  health::MonitorOptions mopts;
  mopts.poll_interval_ms = options.gpu_poll_ms;
  mopts.on_verdict_change = [&verdict_sink](int gpu, health::Verdict, health::Verdict now,
                                            const std::vector<health::Reason>& reasons) {
    std::string why = health::VerdictName(now);
    if (!reasons.empty()) why += ": " + reasons.front().message;
    if (Controller* c = verdict_sink.load())
      c->OnGpuVerdict(gpu, health::Placeable(now), health::StopsRunningWork(now, reasons), why);
  };
  health::GpuMonitor monitor(mopts);
  if (Status s = monitor.Start(); !s.ok()) log("GPU monitor: " + s.ToString());
  health::HealthSnapshot first = monitor.Snapshot();
  const health::GpuInventory& gpus = first.inventory;
  log(gpus.devices.empty()
          ? "no GPUs: " + gpus.note
          : fmt::format("{} GPU(s), driver {}", gpus.devices.size(), gpus.driver_version));
  // The backend, made by its engine's factory (a cluster is read before the controller recovers
  // its runs).
  const int64_t cpu_milli = DetectCpuMilli(), memory_bytes = DetectMemoryBytes();
  auto engine = engines::Find(options.backend);
  if (!engine.ok()) {
    log(engine.status().message());
    return 2;
  }
  EngineInputs inputs;
  inputs.home = options.home;
  inputs.tau_binary = options.tau_binary;
  inputs.stop_grace_ms = options.stop_grace_ms;
  inputs.gpus = gpus;
  inputs.cpu_milli = cpu_milli;
  inputs.memory_bytes = memory_bytes;
  inputs.platform_file = PathExists(layout::PlatformFile(options.home));
  inputs.options = options.engine_options;
  inputs.log = log;
  auto made = (*engine)->make(inputs);
  if (!made.ok()) {
    log(fmt::format("{} backend: {}", (*engine)->name, made.status().message()));
    return 2;
  }
  std::unique_ptr<Backend>& backend = made->backend;
  Metrics metrics;
  ControllerOptions copts;
  copts.home = options.home;
  copts.cpu_capacity_milli = cpu_milli;
  copts.memory_capacity_bytes = memory_bytes;
  copts.platform_file = layout::PlatformFile(options.home);
  copts.metrics = &metrics;
  copts.backend = backend.get();
  copts.max_unreferenced_blob_bytes = options.max_unreferenced_blob_bytes;
  copts.max_tokens_per_user = options.max_tokens_per_user;
  if (made->default_platform_size)
    copts.default_platform_size = {made->default_platform_size->gpus,
                                   made->default_platform_size->cpu_milli,
                                   made->default_platform_size->memory_bytes};
  Controller controller(copts, store->get(), gpus);
  verdict_sink = &controller;
  // Verdicts from the first pass (and any change since) decide which GPUs placement may use.
  for (const health::GpuVerdict& v : monitor.Snapshot().verdicts) {
    if (!health::Placeable(v.verdict))
      controller.OnGpuVerdict(v.gpu_index, false, health::StopsRunningWork(v.verdict, v.reasons),
                              std::string(health::VerdictName(v.verdict)) +
                                  (v.reasons.empty() ? "" : ": " + v.reasons.front().message));
  }
  if (Status s = controller.Start(); !s.ok()) {
    log(s.ToString());
    return 1;
  }
  // The API's routes, declared before the server so that they outlive its connections.
  std::unique_ptr<SecureRouter> router;
  http::HttpServer http;
  http::HttpServer::Limits limits;
  limits.max_connections = options.max_connections;
  limits.max_connections_per_peer = options.max_connections_per_address;
  limits.max_streams_per_owner = options.max_streams_per_identity;
  limits.header_deadline_ms = static_cast<int>(options.header_deadline_ms);
  limits.idle_timeout_ms = static_cast<int>(options.idle_timeout_ms);
  limits.body_grace_ms = static_cast<int>(options.body_grace_ms);
  limits.body_min_bytes_per_second = options.body_min_bytes_per_second;
  limits.max_body_bytes_in_flight = options.max_body_bytes_in_flight;
  limits.max_body_bytes_in_flight_per_identity = options.max_body_bytes_in_flight_per_identity;
  http.set_limits(limits);
  http.set_refusal_observer([&metrics](const char* reason) {
    metrics.Count("tau_http_connections_refused_total", {{"reason", reason}});
  });
  http.set_observer(
      [&metrics](const std::string& method, const std::string& route, int status, double seconds) {
        metrics.Observe("tau_http_request_duration_seconds", {{"method", method}, {"route", route}},
                        seconds);
      });
  ServiceManager::Options service_options;
  service_options.driver = backend->services();  // null: replicas are runs
  service_options.home = options.home;
  ServiceManager services(service_options, &controller, store->get(), &metrics);
  if (Status s = services.Start(); !s.ok()) {
    log(s.ToString());
    return 1;
  }
  Webhooks webhooks(
      {}, store->get(), [&controller] { return controller.CurrentPlatform().platform; }, &metrics);
  webhooks.Start();
  router =
      RegisterApi(&http, &controller, store->get(), &monitor, &metrics,
                  {options.audit_refusals_per_minute, options.audit_refusal_window_ms}, &services);
  std::string socket_path =
      options.socket_path.empty() ? layout::SocketPath(options.home) : options.socket_path;
  // Other users reach a shared socket through the home directory: traversable, not listable.
  if (options.shared_socket) (void)::chmod(options.home.c_str(), 0711);
  if (Status s = http.ListenUnix(socket_path, options.shared_socket ? 0666 : 0600); !s.ok()) {
    log(s.ToString());
    return 1;
  }
  if (!options.listen.empty()) {
    size_t colon = options.listen.rfind(':');
    std::string host = colon == std::string::npos ? "127.0.0.1" : options.listen.substr(0, colon);
    int port = std::atoi(options.listen.substr(colon == std::string::npos ? 0 : colon + 1).c_str());
    http::TlsServerConfig tls{options.tls_cert_file, options.tls_key_file};
    bool with_tls = !options.tls_cert_file.empty();
    if (Status s = http.ListenTcp(host, port, with_tls ? &tls : nullptr); !s.ok()) {
      log(s.ToString());
      return 1;
    }
    log(fmt::format("listening on {}://{}:{}", with_tls ? "https" : "http", host, http.tcp_port()));
  }
  log(fmt::format("tau {} serving on unix://{} (pid {})", Version(), socket_path, ::getpid()));

  // Evidence housekeeping, off the controller's loop: the GPU monitor's readings go to the runs
  // holding those GPUs (once per poll interval, only new passes), and retention prunes old runs'
  // logs and samples.
  Mutex housekeeping_mu;
  CondVar housekeeping_cv;
  bool housekeeping_stop = false;
  std::thread housekeeping([&] {
    evidence::RetentionPolicy retention{options.retain_logs_ms, options.retain_samples_ms};
    int64_t shortest = 0;
    for (int64_t keep : {retention.keep_logs_ms, retention.keep_samples_ms})
      if (keep > 0) shortest = shortest == 0 ? keep : std::min(shortest, keep);
    // Often enough that a short retention is kept to within about half of it; not more than once a
    // second nor less than once a minute.
    int64_t retention_every = std::clamp<int64_t>(shortest / 2, 1000, 60'000);
    int64_t sample_every = std::max<int64_t>(options.gpu_poll_ms, 200);
    int64_t last_pass = -1, next_retention = 0, next_blob_sweep = 0;
    while (true) {
      // Uploaded code no snapshot took (a submission refused or never sent) is kept a day, for a
      // submission that may still come.
      if (NowMillis() >= next_blob_sweep) {
        std::vector<std::string> gone;
        int removed = RemoveUnreferencedBlobs(layout::BlobsDir(options.home), 24 * 3600, &gone);
        if (removed > 0) log(fmt::format("removed {} unreferenced code blobs", removed));
        // A removed blob is nobody's: it no longer counts against its uploaders' quota.
        if (Status s = (*store)->ForgetBlobs(gone); !s.ok()) log("code blobs: " + s.ToString());
        next_blob_sweep = NowMillis() + 3600 * 1000;
      }
      if (!gpus.devices.empty()) {
        health::HealthSnapshot snap = monitor.Snapshot();
        if (snap.passes != last_pass) {
          last_pass = snap.passes;
          controller.OnGpuSamples(EvidenceSamples(snap));
        }
      }
      if (shortest > 0 && NowMillis() >= next_retention) {
        if (Status s = controller.ApplyRetention(retention, NowMillis()); !s.ok())
          log("retention: " + s.ToString());
        next_retention = NowMillis() + retention_every;
      }
      MutexLock lock(&housekeeping_mu);
      if (housekeeping_cv.WaitFor(
              &housekeeping_mu, std::chrono::milliseconds(std::min(sample_every, retention_every)),
              [&]() TAU_REQUIRES(housekeeping_mu) { return housekeeping_stop; }))
        break;
    }
  });
  WritePidFile(layout::PidFile(options.home), log);

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    log(fmt::format("received {}, shutting down (running attempts keep running)", strsignal(sig)));
    http.Shutdown(2000);
  });
  http.Serve();
  signal_thread.join();
  {
    MutexLock lock(&housekeeping_mu);
    housekeeping_stop = true;
    housekeeping_cv.SignalAll();
  }
  housekeeping.join();
  verdict_sink = nullptr;
  monitor.Stop();
  services.Stop();
  webhooks.Stop();
  controller.Stop();
  ::unlink(layout::PidFile(options.home).c_str());
  log("stopped");
  // Streams that outlived the grace period still hold threads; end the process without unwinding
  // them.
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace tau::server
