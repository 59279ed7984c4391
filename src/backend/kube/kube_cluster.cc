// KubeCluster: tau's attempts as Jobs and RayJobs admitted by Kueue (see kube_cluster.h).
//
// Threads: one per watch (Jobs, RayJobs, Workloads, pods), one reconciler that turns what the
// watches saw into AttemptNews, and one per followed pod log. The watches only record objects and
// mark attempts dirty; the reconciler observes dirty attempts (and all of them every resync) and
// sends news when an observation changes. A pod log is written as the shim writes a local one
// (common/log_file.h: masked, capped), with how far into the pod's log it has got kept beside it.
#include "backend/kube/kube_cluster.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/kube/call_lanes.h"
#include "backend/snapshot.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/log_file.h"
#include "common/mutex.h"
#include "kube/service.h"
#include "recovery/failure_class.h"

namespace tau::server {
namespace {

using nlohmann::json;

constexpr const char* kJobApi = "batch/v1";
constexpr const char* kRayJobApi = "ray.io/v1";
constexpr const char* kWorkloadApi = "kueue.x-k8s.io/v1beta2";

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& Meta(const json& object) {
  static const json kEmpty = json::object();
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string Label(const json& object, const char* key) {
  const json& meta = Meta(object);
  auto labels = meta.find("labels");
  return labels != meta.end() && labels->is_object() ? Str(*labels, key) : "";
}

std::string NsName(const json& object) {
  return Str(Meta(object), "namespace") + "/" + Str(Meta(object), "name");
}

// The attempt an object or pod belongs to, from tau's labels; attempt 0 when it is not tau's, or
// another installation's (`installation`: this one's name; unlabelled objects are adopted).
AttemptKey KeyOf(const json& object, const std::string& installation) {
  std::string theirs = Label(object, kube::kLabelInstallation);
  if (!theirs.empty() && theirs != installation) return {"", 0};
  std::string run = Label(object, kube::kLabelRun);
  std::string attempt = Label(object, kube::kLabelAttempt);
  int n = 0;
  for (char c : attempt) {
    if (c < '0' || c > '9' || n > 100'000) return {"", 0};
    n = n * 10 + (c - '0');
  }
  return {run, run.empty() ? 0 : n};
}

// The label selector of an attempt's objects and pods (tau's labels).
std::string AttemptSelector(const std::string& run, int attempt) {
  return fmt::format("{}={},{}={}", kube::kLabelRun, run, kube::kLabelAttempt, attempt);
}

// A pod's rank: its Indexed Job completion index, else 0.
int RankOf(const json& pod) {
  std::string index = Label(pod, "batch.kubernetes.io/job-completion-index");
  if (index.empty()) {
    const json& meta = Meta(pod);
    auto ann = meta.find("annotations");
    if (ann != meta.end() && ann->is_object())
      index = Str(*ann, "batch.kubernetes.io/job-completion-index");
  }
  int n = 0;
  for (char c : index) {
    if (c < '0' || c > '9' || n > 100'000) return 0;
    n = n * 10 + (c - '0');
  }
  return n;
}

// The init container that installs the run's pip packages ended in failure: its output (pip's
// error) is what the rank has to say, as its worker container never starts.
bool SetupFailed(const json& pod) {
  auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return false;
  auto inits = status->find("initContainerStatuses");
  if (inits == status->end() || !inits->is_array()) return false;
  for (const json& cs : *inits) {
    if (!cs.is_object() || Str(cs, "name") != kube::kSetupContainer) continue;
    auto state = cs.find("state");
    if (state == cs.end() || !state->is_object()) return false;
    auto terminated = state->find("terminated");
    return terminated != state->end() && terminated->is_object() &&
           terminated->value("exitCode", 0) != 0;
  }
  return false;
}

// How long an attempt's end waits for its metrics followers to finish reading: a Job's pods end
// with it (their sidecars' logs then end); a RayJob's head outlives its driver until KubeRay
// deletes its cluster, so its sidecar is given the moment tail needs to print the last lines.
constexpr int64_t kMetricsDrainMs = 30'000;
constexpr int64_t kRayMetricsDrainMs = 3'000;

int64_t MetricsDrainMs(const json& object) {
  return Str(object, "kind") == "RayJob" ? kRayMetricsDrainMs : kMetricsDrainMs;
}

// Whether the pod has tau's metrics sidecar (pods rendered before it existed do not).
bool HasMetricsSidecar(const json& pod) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return false;
  auto inits = spec->find("initContainers");
  if (inits == spec->end() || !inits->is_array()) return false;
  return std::any_of(inits->begin(), inits->end(), [](const json& c) {
    return c.is_object() && Str(c, "name") == kube::kMetricsContainer;
  });
}

// A pod's phase only moves forward (Pending, Running, then Succeeded or Failed): of two views of
// the same pod, one that ended is the newer.
bool PodEnded(const json& pod) {
  auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return false;
  std::string phase = Str(*status, "phase");
  return phase == "Succeeded" || phase == "Failed";
}

// How often an attempt's pods are asked for (ReadPods), a resync apart, before its end is told
// from what the watch has seen of them: an API server that does not answer holds the end up for
// a few resyncs, not for ever.
constexpr int kPodReadTries = 3;

bool PodStarted(const json& pod) {
  auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return false;
  std::string phase = Str(*status, "phase");
  return phase == "Running" || phase == "Succeeded" || phase == "Failed";
}

// rank-R.log.offset, beside a kept pod log: which pod's log it holds, how many bytes of that log
// it has taken (written, or dropped at the cap or on a full disk; not what the redactor still
// holds back, which the next stream brings again) and the file's size then. A log's bytes are no
// longer the pod's (masked, cut at the cap), so this, not the file's size, says where a new
// stream goes on. One fixed-size record rewritten in place: a single small write at offset 0,
// which a reader or a crash sees whole.
struct LogOffset {
  std::string pod;
  int64_t taken = 0;
  int64_t size = 0;
};

std::optional<LogOffset> ReadLogOffset(int fd) {
  char buf[512];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  char pod[254];
  long long taken = 0, size = 0;
  if (std::sscanf(buf, "%253s %lld %lld", pod, &taken, &size) != 3 || taken < 0 || size < 0)
    return std::nullopt;
  return LogOffset{pod, taken, size};
}

bool WriteLogOffset(int fd, const LogOffset& o) {
  // Pod names have at most 253 characters: every record has the same length.
  std::string line = fmt::format("{:<253} {:>20} {:>20}\n", o.pod, o.taken, o.size);
  return ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
}

// What a kept log says of itself (LogTruncated, OutputDropped) becomes an event of its run.
class PostedNotices final : public LogNotices {
 public:
  PostedNotices(std::function<void(InboxMessage)> post, std::string run, int attempt)
      : post_(std::move(post)), run_(std::move(run)), attempt_(attempt) {}
  void Add(const std::string& type, const std::string& message, json data) override {
    data["attempt"] = attempt_;
    if (post_ && !run_.empty()) post_(RunNotice{run_, type, message, std::move(data)});
  }

 private:
  const std::function<void(InboxMessage)> post_;
  const std::string run_;
  const int attempt_;
};

// The namespace's Secret of the workspace's secrets that pods refer to (SECRET:KEY env).
json SecretObject(const std::string& ns, const std::map<std::string, std::string>& secrets) {
  json data = json::object();
  for (const auto& [key, value] : secrets) data[key] = value;
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata",
           {{"name", kube::kRunSecretName},
            {"namespace", ns},
            {"labels", {{kube::kLabelManagedBy, "tau"}}}}},
          {"type", "Opaque"},
          {"stringData", data}};
}

// What Kueue's and the kubelets' view of an attempt says, in the facts every engine reports.
AttemptFact FactOf(const kube::AttemptObservation& o, std::optional<int> position) {
  using Phase = kube::AttemptObservation::Phase;
  AttemptFact f;
  switch (o.phase) {
    case Phase::kPending:
      f.phase = AttemptFact::Phase::kPending;
      break;
    case Phase::kAdmitted:
      f.phase = AttemptFact::Phase::kAdmitted;
      break;
    case Phase::kRunning:
      f.phase = AttemptFact::Phase::kRunning;
      break;
    case Phase::kSucceeded:
      f.phase = AttemptFact::Phase::kSucceeded;
      break;
    case Phase::kFailed:
      f.phase = AttemptFact::Phase::kFailed;
      break;
    case Phase::kEvicted:
      f.phase = AttemptFact::Phase::kStopped;
      break;
  }
  f.failure_class =
      o.failure_class.empty()
          ? recovery::FailureClass::kUnknown
          : recovery::ParseFailureClass(o.failure_class).value_or(recovery::FailureClass::kUnknown);
  f.reason = o.reason;
  f.message = o.message;
  f.exit_code = o.exit_code;
  f.position = position;
  f.flavors = o.flavors;
  f.admitted_by = o.cluster_queue;
  return f;
}

std::string Fingerprint(const kube::AttemptObservation& o, std::optional<int> position) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}", kube::PhaseName(o.phase), o.failure_class, o.reason,
                     o.message, position.value_or(0), JsonText(o.flavors),
                     o.exit_code.value_or(-1000));
}

// Where a kept log comes from: a pod's log stream, or a RayJob's driver log, which Ray keeps on
// the head and serves whole through its dashboard's job API.
struct LogSource {
  std::string id;    // recorded beside the kept log: which log its bytes are of
  std::string what;  // in messages: "pod NS/NAME"
  // Reads the log from its beginning, handing what arrives to `on_chunk`.
  std::function<Status(const std::function<bool(std::string_view)>& on_chunk)> read;
  // Whether the log may still grow.
  std::function<bool()> live;
  // A stream (a pod's) ends when its container does, so `live` is asked after it. A fetch (Ray's)
  // has what there is now, so `live` is asked before it: the fetch after the end is the last.
  bool fetched = false;
  int64_t pause_ms = 500;  // between reads (a fetch: more as the log grows, see FollowLog)
};

// Where a follower puts what it reads.
class KeptOutput {
 public:
  virtual ~KeptOutput() = default;
  virtual void Write(std::string_view chunk) = 0;
  // Bytes read but not written yet (a partial line, a possible secret's start): a restarted
  // server takes them from the source again.
  virtual int64_t held() const = 0;
  // The kept file's size as written (recorded, so a restarted server cuts off what went after).
  virtual int64_t size() const = 0;
  virtual void Finish() = 0;  // the source has ended: what is held is written
};

class KeptLog final : public KeptOutput {
 public:
  template <typename... Args>
  explicit KeptLog(Args&&... args) : log_(std::forward<Args>(args)...) {}
  void Write(std::string_view chunk) override { log_.Write(chunk); }
  int64_t held() const override { return static_cast<int64_t>(log_.held()); }
  int64_t size() const override { return log_.size(); }
  void Finish() override { log_.Finish(); }

 private:
  LogFile log_;
};

// Metrics lines, appended whole (one write each batch) to a file other pods of the run append
// to as well; a partial line waits for its end.
class KeptMetrics final : public KeptOutput {
 public:
  explicit KeptMetrics(int fd, std::string what) : fd_(fd), what_(std::move(what)) {}
  ~KeptMetrics() override { ::close(fd_); }
  void Write(std::string_view chunk) override {
    pending_.append(chunk);
    size_t end = pending_.rfind('\n');
    if (end == std::string::npos) return;
    Append(std::string_view(pending_).substr(0, end + 1));
    pending_.erase(0, end + 1);
  }
  int64_t held() const override { return static_cast<int64_t>(pending_.size()); }
  int64_t size() const override { return 0; }
  void Finish() override {
    if (pending_.empty()) return;
    pending_ += '\n';
    Append(pending_);
    pending_.clear();
  }

 private:
  void Append(std::string_view lines) {
    // O_APPEND: each write lands whole at the end, whatever the other pods' followers write.
    if (::write(fd_, lines.data(), lines.size()) != static_cast<ssize_t>(lines.size()))
      std::fprintf(stderr, "tau server: cannot keep the metrics of %s: %s\n", what_.c_str(),
                   std::strerror(errno));
  }
  const int fd_;
  const std::string what_;
  std::string pending_;
};

class KubeCluster final : public Cluster {
 public:
  KubeCluster(kubeapi::Client* client, KubeClusterOptions options)
      : client_(client),
        options_(std::move(options)),
        clock_(options_.clock ? options_.clock : SystemClock()),
        lanes_(CallLanes::Options{options_.call_budget_ms, 3, options_.breaker_open_ms,
                                  [this] { return clock_->MonotonicMillis(); }}) {}
  ~KubeCluster() override { Stop(); }

  Result<std::set<AttemptKey>> Start(
      std::function<void(InboxMessage)> post,
      std::function<std::string(const std::string&, int)> attempt_dir) override;
  void Stop() override;
  void KeepLogs(const std::string& run, int attempt, AttemptLogs logs) override;
  Status Check(const spec::RunSpec& spec, const policy::ResolvedRun& resolved,
               const policy::Platform& platform, const std::string& snapshot_dir,
               const policy::Caller& caller, const std::string& run_name) override;
  Status Launch(const ClusterLaunch& launch) override;
  Status ApplyPlatform(const policy::Platform& platform) override;
  void Delete(const std::string& run, int attempt) override;
  Result<std::vector<json>> RenderService(const ServiceLaunch& launch) override;
  Status ApplyService(const ServiceLaunch& launch, const std::vector<json>& objects) override;
  Status DeleteService(const std::vector<json>& refs) override;
  Result<ServiceObserved> ObserveService(const std::string& ns, const std::string& name,
                                         const std::string& kind) override;
  void KeepServiceLog(const std::string& ns, const std::string& pod, const std::string& container,
                      const std::string& path, AttemptLogs logs) override;

 private:
  struct Attempt {
    json object;                             // the Job or RayJob; null until seen
    std::map<std::string, json> pods;        // name -> pod
    std::set<std::string> followed;          // pods whose logs are being (or were) kept
    bool driver_followed = false;            // RayJob: the driver's log
    std::set<std::string> metrics_followed;  // pods whose metrics are being (or were) kept
    int outputs_following = 0;               // metrics and log followers still reading
    // When its end was first seen while its metrics were still being read (0: not yet).
    int64_t end_seen_ms = 0;
    std::string last_news;  // fingerprint of the last news sent
    // A failure read from its pods is told from pods read from the API server after it was
    // seen (ReadPods): the read in flight; done (or given up after kPodReadTries failures).
    bool pods_reading = false;
    bool pods_read = false;
    int pod_read_failures = 0;
    int64_t pods_read_not_before_ms = 0;  // after a failed read: the next resync's
    std::set<std::string> pods_deleted;   // seen deleted by the watch: a read brings none back
    bool gone = false;                    // its object was deleted
    bool ended = false;                   // its terminal news was sent: no more resyncs
    std::optional<AttemptLogs> logs;      // how to keep its pods' logs; none followed before
    // A finished RayJob (its code inline, twice) is deleted then: its ttlSecondsAfterFinished
    // after its end, when KubeRay deletes its RayCluster (KubeRay keeps the RayJob itself).
    int64_t retire_at_ms = 0;
  };

  Result<std::vector<CodeFile>> Code(const std::string& snapshot_dir);
  void Watch(std::string api_version, std::string kind, std::string selector);
  void OnEvent(const std::string& kind, const kubeapi::WatchEvent& event);
  void Reconcile();
  void ObserveAll(std::set<AttemptKey> keys);
  // Keeps the log `source` reads as rank `rank`'s of the attempt `key`, at `path`.
  void FollowLog(LogSource source, const std::string& path, const AttemptKey& key, int rank,
                 const AttemptLogs& logs);
  // Appends the metrics lines `source` reads (a pod's metrics sidecar's log) to the run's
  // metrics file; `offset_path` keeps how far it got.
  void FollowMetrics(LogSource source, const std::string& offset_path, const AttemptKey& key,
                     const std::string& metrics_file);
  // Reads `source` into `out` until it ends or the cluster stops, skipping the `taken` bytes
  // kept already and recording how far it got in `offset_fd`.
  void Follow(const LogSource& source, int offset_fd, int64_t taken, KeptOutput* out);
  // Runs `body` on a thread of its own, joined once done.
  void Spawn(std::function<void()> body);
  LogSource PodLog(const std::string& ns, const std::string& pod, const std::string& container);
  // A RayJob's driver log: Ray's job log, through the API server's proxy to the head's dashboard.
  LogSource DriverLog(const AttemptKey& key, const std::string& ns, const std::string& job_id,
                      const std::string& ray_cluster);
  // Whether the watches last saw the pod Pending or Running (false for pods they do not follow).
  bool PodRunning(const std::string& ns, const std::string& pod);
  // Whether the attempt's RayJob may still run (not Complete or Failed, not deleted).
  bool RayJobLive(const AttemptKey& key);
  // Deletes the attempt's objects (`targets`, else those the API lists) and its gang Service.
  Status DeleteObjects(const std::string& run, int attempt, std::vector<json> targets);
  // Applies an attempt's objects in order; a gang's Service is then owned by its Job.
  Status ApplyObjects(const std::vector<json>& objects);
  // Tells the decision thread how a call it asked for ended.
  void PostCall(const AttemptKey& key, AttemptNews::Call call, const Status& result);
  // The attempt's failure is read from its pods (AttemptObservation::read_from_pods), and the
  // watch's view of them may be older than the object's failure: lists them from the API server
  // off this thread (in a lane); PodsRead merges them in and has the attempt observed again.
  void ReadPods(const AttemptKey& key, const std::string& ns);
  void PodsRead(const AttemptKey& key, const Status& s, std::vector<json> pods);

  kubeapi::Client* const client_;
  const KubeClusterOptions options_;
  Clock* const clock_;
  std::function<void(InboxMessage)> post_;
  std::function<std::string(const std::string&, int)> attempt_dir_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  CallLanes lanes_;  // creates, deletes and reads of pods, off the decision thread

  Mutex mu_;
  CondVar cv_;
  std::map<AttemptKey, Attempt> attempts_ TAU_GUARDED_BY(mu_);
  std::map<std::string, json> workloads_ TAU_GUARDED_BY(mu_);     // "ns/name" -> Workload
  std::map<std::string, AttemptKey> by_uid_ TAU_GUARDED_BY(mu_);  // object uid -> attempt
  std::set<AttemptKey> dirty_ TAU_GUARDED_BY(mu_);
  std::set<std::string> deleted_ TAU_GUARDED_BY(mu_);                   // "run/attempt" tau deleted
  std::map<AttemptKey, std::string> namespace_of_ TAU_GUARDED_BY(mu_);  // attempts created here
  struct LogFollower {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // Joined by the reconciler once done (a long-lived server follows thousands of pods).
  std::vector<LogFollower> log_threads_ TAU_GUARDED_BY(mu_);
};

Result<std::set<AttemptKey>> KubeCluster::Start(
    std::function<void(InboxMessage)> post,
    std::function<std::string(const std::string&, int)> attempt_dir) {
  post_ = std::move(post);
  attempt_dir_ = std::move(attempt_dir);
  std::set<AttemptKey> existing;
  kubeapi::ListOptions list;
  list.label_selector = std::string(kube::kLabelManagedBy) + "=tau";
  for (const auto& [api, kind] : {std::pair{kJobApi, "Job"}, std::pair{kRayJobApi, "RayJob"}}) {
    auto objects = client_->List(api, kind, "", list);
    if (!objects.ok()) {
      // Without KubeRay there are no RayJobs; anything else means the cluster cannot be read.
      if (std::string(kind) == "RayJob" && objects.status().code() == StatusCode::kNotFound)
        continue;
      return Status(objects.status().code(), fmt::format("cannot list the cluster's {}s: {}", kind,
                                                         objects.status().message()));
    }
    for (const json& o : objects->items)
      if (AttemptKey key = KeyOf(o, options_.installation); key.second > 0) existing.insert(key);
  }
  threads_.emplace_back(&KubeCluster::Watch, this, kJobApi, "Job", list.label_selector);
  threads_.emplace_back(&KubeCluster::Watch, this, kRayJobApi, "RayJob", list.label_selector);
  threads_.emplace_back(&KubeCluster::Watch, this, kWorkloadApi, "Workload", "");
  threads_.emplace_back(&KubeCluster::Watch, this, "v1", "Pod", kube::kLabelRun);
  threads_.emplace_back(&KubeCluster::Reconcile, this);
  return existing;
}

void KubeCluster::Stop() {
  lanes_.Stop();
  stop_ = true;
  cv_.SignalAll();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
  std::vector<LogFollower> logs;
  {
    MutexLock lock(&mu_);
    logs.swap(log_threads_);
  }
  for (LogFollower& f : logs)
    if (f.thread.joinable()) f.thread.join();
}

void KubeCluster::KeepLogs(const std::string& run, int attempt, AttemptLogs logs) {
  MutexLock lock(&mu_);
  attempts_[{run, attempt}].logs = std::move(logs);
  // Its pods that started meanwhile are followed on the next pass.
  dirty_.insert({run, attempt});
  cv_.SignalAll();
}

void KubeCluster::Watch(std::string api_version, std::string kind, std::string selector) {
  kubeapi::WatchLoop::Options options;
  options.list.label_selector = selector;
  options.watch_timeout_seconds = options_.watch_timeout_seconds;
  while (!stop_) {
    kubeapi::WatchLoop loop(client_, api_version, kind, "", options);
    Status s = loop.Run([&](const kubeapi::WatchEvent& e) { OnEvent(kind, e); }, stop_);
    if (stop_) return;
    // Run only returns for errors not worth retrying at once (no such kind: Kueue or KubeRay not
    // installed; no permission). Say so, and look again later: they may be installed meanwhile.
    std::fprintf(stderr, "tau server: watching %ss on the cluster: %s (trying again in 30s)\n",
                 kind.c_str(), s.ToString().c_str());
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, std::chrono::seconds(30), [&] { return stop_.load(); });
  }
}

void KubeCluster::OnEvent(const std::string& kind, const kubeapi::WatchEvent& event) {
  const json& o = event.object;
  const bool deleted = event.type == "DELETED";
  MutexLock lock(&mu_);
  if (kind == "Workload") {
    if (deleted) {
      workloads_.erase(NsName(o));
    } else {
      workloads_[NsName(o)] = o;
    }
    // Its owner, and every attempt waiting in a queue (their positions may have moved).
    const json& meta = Meta(o);
    if (auto refs = meta.find("ownerReferences"); refs != meta.end() && refs->is_array())
      for (const json& ref : *refs)
        if (auto it = by_uid_.find(Str(ref, "uid")); it != by_uid_.end()) dirty_.insert(it->second);
    for (auto& [key, a] : attempts_)
      if (!a.gone && !a.ended) dirty_.insert(key);
    cv_.SignalAll();
    return;
  }
  AttemptKey key = KeyOf(o, options_.installation);
  if (key.second == 0) return;
  if (deleted_.count(fmt::format("{}/{}", key.first, key.second))) return;
  Attempt& a = attempts_[key];
  if (kind == "Pod") {
    const std::string name = Str(Meta(o), "name");
    if (deleted) {
      a.pods.erase(name);
      a.pods_deleted.insert(name);
    } else if (auto it = a.pods.find(name); it == a.pods.end()) {
      a.pods.emplace(name, o);
    } else if (!PodEnded(it->second) || PodEnded(o)) {
      // An event older than a read that saw the pod end (ReadPods) does not undo its end.
      it->second = o;
    }
  } else if (deleted) {
    if (a.ended) {
      // Its end was told; its object is gone (a TTL, a user): nothing left to follow.
      by_uid_.erase(Str(Meta(o), "uid"));
      attempts_.erase(key);
      namespace_of_.erase(key);
      return;
    }
    a.gone = true;
  } else {
    a.object = o;
    a.gone = false;
    by_uid_[Str(Meta(o), "uid")] = key;
  }
  dirty_.insert(key);
  cv_.SignalAll();
}

void KubeCluster::Reconcile() {
  int64_t next_resync = clock_->MonotonicMillis() + options_.resync_ms;
  while (!stop_) {
    std::set<AttemptKey> keys;
    std::vector<LogFollower> finished;
    std::vector<AttemptKey> retire;
    {
      MutexLock lock(&mu_);
      cv_.WaitFor(&mu_, std::chrono::milliseconds(200),
                  [&]() TAU_REQUIRES(mu_) { return stop_.load() || !dirty_.empty(); });
      if (stop_) return;
      for (auto it = log_threads_.begin(); it != log_threads_.end();) {
        if (it->done->load()) {
          finished.push_back(std::move(*it));
          it = log_threads_.erase(it);
        } else {
          ++it;
        }
      }
      for (const auto& [key, a] : attempts_) {
        if (a.retire_at_ms != 0 && clock_->MonotonicMillis() >= a.retire_at_ms)
          retire.push_back(key);
        // An end held for its metrics is told once the wait is over, not at the next resync.
        if (!a.ended && a.end_seen_ms != 0 &&
            clock_->MonotonicMillis() - a.end_seen_ms >= MetricsDrainMs(a.object))
          keys.insert(key);
      }
      if (clock_->MonotonicMillis() >= next_resync) {
        next_resync = clock_->MonotonicMillis() + options_.resync_ms;
        for (const auto& [key, a] : attempts_)
          if (!a.ended) keys.insert(key);
      }
      keys.merge(dirty_);
      dirty_.clear();
    }
    for (LogFollower& f : finished) f.thread.join();
    for (const AttemptKey& key : retire) Delete(key.first, key.second);
    if (!keys.empty()) ObserveAll(std::move(keys));
  }
}

void KubeCluster::ObserveAll(std::set<AttemptKey> keys) {
  struct Todo {
    AttemptKey key;
    json object;
    std::vector<json> pods;
    struct Follow {
      std::string pod, container;
      int rank;
    };
    std::vector<Follow> follow;
    std::vector<Follow> metrics;  // pods whose metrics sidecar to follow
    int outputs_following = 0;
    std::string driver_job, driver_cluster;  // RayJob: its Ray job and cluster
    bool gone = false;
    bool pods_read = false;
    std::string last_news;
    std::optional<AttemptLogs> logs;
  };
  std::vector<Todo> todo;
  std::vector<json> workloads;
  {
    MutexLock lock(&mu_);
    for (const auto& [name, w] : workloads_) workloads.push_back(w);
    for (const AttemptKey& key : keys) {
      auto it = attempts_.find(key);
      if (it == attempts_.end() || it->second.object.is_null()) continue;
      Attempt& a = it->second;
      Todo t;
      t.key = key;
      t.object = a.object;
      t.gone = a.gone;
      t.pods_read = a.pods_read;
      t.last_news = a.last_news;
      t.logs = a.logs;
      for (const auto& [pod_name, pod] : a.pods) {
        t.pods.push_back(pod);
        if (a.logs && PodStarted(pod) && a.followed.insert(pod_name).second)
          t.follow.push_back({pod_name,
                              SetupFailed(pod) ? kube::kSetupContainer : kube::kWorkerContainer,
                              RankOf(pod)});
        if (a.logs && !a.logs->metrics_file.empty() && PodStarted(pod) && HasMetricsSidecar(pod) &&
            a.metrics_followed.insert(pod_name).second)
          t.metrics.push_back({pod_name, kube::kMetricsContainer, RankOf(pod)});
      }
      const bool ray_job = Str(a.object, "kind") == "RayJob";
      t.outputs_following =
          a.outputs_following + static_cast<int>(t.follow.size() + t.metrics.size());
      if (a.logs && ray_job && !a.driver_followed) {
        // Once KubeRay has submitted the Ray job (HTTPMode: no submitter pod) and said where.
        const json& status = a.object.contains("status") ? a.object["status"] : json::object();
        std::string ds = status.is_object() ? Str(status, "jobDeploymentStatus") : "";
        std::string job = status.is_object() ? Str(status, "jobId") : "";
        std::string cluster = status.is_object() ? Str(status, "rayClusterName") : "";
        if ((ds == "Running" || ds == "Complete" || ds == "Failed") && !job.empty() &&
            !cluster.empty()) {
          t.driver_job = job;
          t.driver_cluster = cluster;
          a.driver_followed = true;
          ++t.outputs_following;
        }
      }
      todo.push_back(std::move(t));
    }
  }
  std::map<std::string, int> positions = kube::PendingPositions(workloads);
  for (Todo& t : todo) {
    const std::string ns = Str(Meta(t.object), "namespace");
    const std::string dir = attempt_dir_ ? attempt_dir_(t.key.first, t.key.second) + "/logs" : "";
    bool ray = Str(t.object, "kind") == "RayJob";
    if (!dir.empty() && t.logs) {
      // Jobs: each worker pod's log is its rank's (its setup's, when that failed). RayJobs: the
      // driver's output (Ray's job log) is rank 0; the Ray head and workers keep theirs in Ray.
      if (!ray)
        for (const auto& f : t.follow)
          FollowLog(PodLog(ns, f.pod, f.container), fmt::format("{}/rank-{}.log", dir, f.rank),
                    t.key, f.rank, *t.logs);
      for (const auto& f : t.metrics)
        FollowMetrics(PodLog(ns, f.pod, f.container),
                      fmt::format("{}/metrics-{}.offset", dir, f.rank), t.key,
                      t.logs->metrics_file);
      if (!t.driver_job.empty()) {
        // The driver's is the attempt's one log: all of the cap is its.
        AttemptLogs driver = *t.logs;
        driver.workers = 1;
        FollowLog(DriverLog(t.key, ns, t.driver_job, t.driver_cluster), dir + "/rank-0.log", t.key,
                  0, driver);
      }
    }
    kube::AttemptObservation observed;
    std::optional<int> position;
    if (t.gone) {
      observed = kube::ObserveAttempt(t.object, kube::OwnedWorkload(t.object, workloads), t.pods);
      if (!observed.Terminal()) {
        observed.read_from_pods = false;  // tau's own word: deleted outside tau
        observed.phase = kube::AttemptObservation::Phase::kFailed;
        observed.failure_class = recovery::FailureClassName(recovery::FailureClass::kUnknown);
        observed.message = fmt::format("its {} {} was deleted outside tau", Str(t.object, "kind"),
                                       NsName(t.object));
      }
    } else {
      const json* workload = kube::OwnedWorkload(t.object, workloads);
      observed = kube::ObserveAttempt(t.object, workload, t.pods);
      if (observed.phase == kube::AttemptObservation::Phase::kPending && workload) {
        if (auto p = positions.find(NsName(*workload)); p != positions.end()) position = p->second;
      }
    }
    if (observed.read_from_pods && !t.pods_read) {
      // Its end is told once its pods are read as they are after its failure (PodsRead).
      ReadPods(t.key, ns);
      continue;
    }
    std::string fp = Fingerprint(observed, position);
    if (fp == t.last_news) continue;
    if (observed.Terminal() && (t.outputs_following > 0 || !t.logs)) {
      // The end is told once its metrics and logs are all kept (the evidence
      // worker reads the metrics to their end and records the log's hash then), or
      // kMetricsDrainMs after it was seen, whichever is first. Not before the server has said how
      // its logs are kept (KeepLogs, at once for a new attempt, after a restart when the backend
      // recovers it): an end seen first would be told before the rest of its logs is.
      const int64_t now = clock_->MonotonicMillis();
      MutexLock lock(&mu_);
      auto it = attempts_.find(t.key);
      if (it != attempts_.end()) {
        if (it->second.end_seen_ms == 0) it->second.end_seen_ms = now;
        if (now - it->second.end_seen_ms < MetricsDrainMs(t.object)) continue;
      }
    }
    {
      MutexLock lock(&mu_);
      auto it = attempts_.find(t.key);
      if (it != attempts_.end()) {
        it->second.last_news = fp;
        it->second.ended = observed.Terminal();
        if (it->second.ended && Str(t.object, "kind") == "RayJob" && !t.gone &&
            it->second.retire_at_ms == 0) {
          const json& spec = t.object.contains("spec") ? t.object["spec"] : json::object();
          int64_t ttl = spec.is_object() ? spec.value("ttlSecondsAfterFinished", 15) : 15;
          it->second.retire_at_ms = clock_->MonotonicMillis() + std::max<int64_t>(ttl, 0) * 1000;
        }
      }
    }
    AttemptNews news;
    news.run = t.key.first;
    news.attempt = t.key.second;
    news.fact = FactOf(observed, position);
    if (post_) post_(std::move(news));
  }
}

LogSource KubeCluster::PodLog(const std::string& ns, const std::string& pod,
                              const std::string& container) {
  LogSource source;
  source.id = pod;
  source.what = fmt::format("pod {}/{}", ns, pod);
  source.read = [this, ns, pod, container](const std::function<bool(std::string_view)>& on_chunk) {
    kubeapi::LogOptions options;
    options.container = container;
    options.follow = true;
    return client_->StreamLogs(ns, pod, options, on_chunk, &stop_);
  };
  source.live = [this, ns, pod] { return PodRunning(ns, pod); };
  return source;
}

LogSource KubeCluster::DriverLog(const AttemptKey& key, const std::string& ns,
                                 const std::string& job_id, const std::string& ray_cluster) {
  LogSource source;
  source.id = "ray-job:" + job_id;
  source.what = fmt::format("Ray job {} of RayJob {}/{}-{}", job_id, ns, key.first, key.second);
  source.fetched = true;
  source.pause_ms = options_.driver_log_poll_ms;
  source.read = [this, ns, job_id,
                 ray_cluster](const std::function<bool(std::string_view)>& on_chunk) -> Status {
    // KubeRay's head Service, and the dashboard's port on it.
    TAU_ASSIGN_OR_RETURN(std::string body,
                         client_->ServiceProxyGet(ns, ray_cluster + "-head-svc", "8265",
                                                  "/api/jobs/" + job_id + "/logs"));
    json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("logs") || !doc["logs"].is_string())
      return Internal("Ray's job API answered something else than {\"logs\": ...}");
    on_chunk(doc["logs"].get_ref<const std::string&>());
    return Status::Ok();
  };
  source.live = [this, key] { return RayJobLive(key); };
  return source;
}

void KubeCluster::Spawn(std::function<void()> body) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([body = std::move(body), done] {
    struct MarkDone {
      std::atomic<bool>* flag;
      ~MarkDone() { *flag = true; }
    } mark{done.get()};
    body();
  });
  MutexLock lock(&mu_);
  log_threads_.push_back({std::move(thread), std::move(done)});
}

void KubeCluster::FollowLog(LogSource source, const std::string& path, const AttemptKey& key,
                            int rank, const AttemptLogs& logs) {
  // The attempt's end is told once each of its logs is kept to its end, so that the evidence
  // records the whole log: a pod's log stream ends with its container, and a fetched log (a
  // RayJob driver's) is fetched once more after the end.
  bool counted = false;
  {
    MutexLock lock(&mu_);
    if (auto it = attempts_.find(key); it != attempts_.end()) {
      ++it->second.outputs_following;
      counted = true;
    }
  }
  Spawn([this, source = std::move(source), path, key, rank, logs, counted] {
    struct Done {
      KubeCluster* self;
      AttemptKey key;
      bool counted;
      ~Done() {
        if (!counted) return;
        // The attempt's end may be told once its logs are all kept.
        MutexLock lock(&self->mu_);
        if (auto it = self->attempts_.find(key); it != self->attempts_.end())
          --it->second.outputs_following;
        self->dirty_.insert(key);
        self->cv_.SignalAll();
      }
    } done{this, key, counted};
    auto cannot = [&](const char* what) {
      std::fprintf(stderr, "tau server: cannot keep the log of %s in %s: %s %s\n",
                   source.what.c_str(), path.c_str(), what, std::strerror(errno));
    };
    // Read and write: a cut at the cap copies the newest part out of it.
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return cannot("opening it:");
    const std::string offset_path = path + ".offset";
    int offset_fd = ::open(offset_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (offset_fd < 0) {
      ::close(fd);
      return cannot("opening its offset:");
    }
    // A stream can end while the container still runs (a kubelet or API server restart, a
    // proxy's timeout; days-long runs see them), and the server can restart. Each new stream
    // starts at the pod log's beginning and skips what was taken already: so every byte is kept
    // once, and masked.
    int64_t taken = 0;
    std::optional<LogOffset> at = ReadLogOffset(offset_fd);
    struct stat st;
    const int64_t file_size = ::fstat(fd, &st) == 0 ? st.st_size : 0;
    if (at && at->pod == source.id) {
      taken = at->taken;
      // Written after the offset was last recorded (the server stopped between the two): cut
      // off, and taken again from the pod. (A cut at the cap just then leaves the file smaller;
      // what went after it may then be kept twice.)
      if (file_size > at->size && ::ftruncate(fd, at->size) != 0) {
        ::close(offset_fd);
        ::close(fd);
        return cannot("truncating it:");
      }
    } else if (!at) {
      // Kept by a server that recorded no offsets: the file is a prefix of the pod's log.
      taken = file_size;
    }  // else another pod of the same rank (a replacement): its log follows the first one's.
    const int workers = std::max(1, logs.workers);
    PostedNotices notices(post_, key.first, key.second);
    KeptLog log(rank, path, fd, logs.max_bytes > 0 ? logs.max_bytes / workers : 0, logs.max_bytes,
                static_cast<size_t>(workers), logs.secrets, &notices);
    Follow(source, offset_fd, taken, &log);
    ::close(offset_fd);
  });
}

void KubeCluster::FollowMetrics(LogSource source, const std::string& offset_path,
                                const AttemptKey& key, const std::string& metrics_file) {
  {
    MutexLock lock(&mu_);
    ++attempts_[key].outputs_following;
  }
  Spawn([this, source = std::move(source), offset_path, key, metrics_file] {
    struct Done {
      KubeCluster* self;
      AttemptKey key;
      ~Done() {
        // The attempt's end may be told once its metrics are all kept.
        MutexLock lock(&self->mu_);
        if (auto it = self->attempts_.find(key); it != self->attempts_.end())
          --it->second.outputs_following;
        self->dirty_.insert(key);
        self->cv_.SignalAll();
      }
    } done{this, key};
    int fd =
        ::open(metrics_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    int offset_fd =
        fd < 0 ? -1 : ::open(offset_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (offset_fd < 0) {
      std::fprintf(stderr, "tau server: cannot keep the metrics of %s in %s: %s\n",
                   source.what.c_str(), metrics_file.c_str(), std::strerror(errno));
      if (fd >= 0) ::close(fd);
      return;
    }
    // Other pods append to the same file, so nothing is cut off after a restart: a line kept
    // twice is one point twice, which the collector's compaction drops.
    std::optional<LogOffset> at = ReadLogOffset(offset_fd);
    KeptMetrics out(fd, source.what);
    Follow(source, offset_fd, at && at->pod == source.id ? at->taken : 0, &out);
    ::close(offset_fd);
  });
}

void KubeCluster::Follow(const LogSource& source, int offset_fd, int64_t taken, KeptOutput* out) {
  auto record = [&] {
    if (!WriteLogOffset(offset_fd, {source.id, taken - out->held(), out->size()}))
      std::fprintf(stderr, "tau server: cannot record how far the log of %s was kept: %s\n",
                   source.what.c_str(), std::strerror(errno));
  };
  std::string last_error;
  int final_failures = 0;
  bool ended = false;
  while (!stop_) {
    const bool more = !source.fetched || source.live();
    // The output keeps what it holds back across reads of this thread: skip all of it.
    int64_t skip = taken;
    Status s = source.read([&](std::string_view chunk) {
      if (skip > 0) {
        size_t n = std::min<size_t>(static_cast<size_t>(skip), chunk.size());
        chunk.remove_prefix(n);
        skip -= static_cast<int64_t>(n);
      }
      if (chunk.empty()) return true;
      out->Write(chunk);  // a full disk drops output (and says so), not the stream
      taken += static_cast<int64_t>(chunk.size());
      record();
      return true;
    });
    if (stop_) break;
    if (source.fetched ? !more : !source.live()) {
      // A fetch after the end that failed is tried again a little (the RayCluster goes
      // ttlSecondsAfterFinished after its job).
      if (s.ok() || !source.fetched || ++final_failures >= 3) {
        ended = true;
        if (!s.ok())
          std::fprintf(stderr, "tau server: the end of the log of %s is lost: %s\n",
                       source.what.c_str(), s.ToString().c_str());
        break;
      }
    }
    if (!s.ok() && s.message() != last_error) {
      // Said once per failure, not on every try.
      last_error = s.message();
      std::fprintf(stderr, "tau server: the log of %s: %s (following it again)\n",
                   source.what.c_str(), s.ToString().c_str());
    }
    // A fetch brings the whole log every time: the longer it is, the less often.
    int64_t pause_ms = source.pause_ms;
    // At most 10 s: the fetch after the end must come before KubeRay deletes the RayCluster
    // (ttlSecondsAfterFinished, 15 s unless the spec says).
    if (source.fetched)
      pause_ms = std::max(pause_ms, std::min<int64_t>(pause_ms + taken / (1 << 20) * 1000, 10'000));
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, std::chrono::milliseconds(pause_ms), [&] { return stop_.load(); });
  }
  // The output has ended: what was held back is no secret's start (or partial line) after all.
  // A server that stops instead leaves it to the next one, which takes it from the pod again.
  if (ended) {
    out->Finish();
    record();
  }
}

bool KubeCluster::PodRunning(const std::string& ns, const std::string& pod) {
  MutexLock lock(&mu_);
  for (const auto& [key, a] : attempts_) {
    auto it = a.pods.find(pod);
    if (it == a.pods.end() || Str(Meta(it->second), "namespace") != ns) continue;
    auto status = it->second.find("status");
    std::string phase =
        status != it->second.end() && status->is_object() ? Str(*status, "phase") : "";
    return phase == "Running" || phase == "Pending";
  }
  return false;
}

bool KubeCluster::RayJobLive(const AttemptKey& key) {
  MutexLock lock(&mu_);
  auto it = attempts_.find(key);
  if (it == attempts_.end() || it->second.gone) return false;
  const json& object = it->second.object;
  auto status = object.find("status");
  std::string ds =
      status != object.end() && status->is_object() ? Str(*status, "jobDeploymentStatus") : "";
  return ds != "Complete" && ds != "Failed";
}

Result<std::vector<CodeFile>> KubeCluster::Code(const std::string& snapshot_dir) {
  return ReadSnapshot(snapshot_dir);
}

Status KubeCluster::Check(const spec::RunSpec& spec, const policy::ResolvedRun& resolved,
                          const policy::Platform& platform, const std::string& snapshot_dir,
                          const policy::Caller& caller, const std::string& run_name) {
  kube::RenderOptions options;
  options.run_name = run_name;
  options.default_image = options_.default_image;
  options.installation = options_.installation;
  TAU_ASSIGN_OR_RETURN(options.code, Code(snapshot_dir));
  std::vector<json> objects;
  if (spec.serve) {
    // A service's replica is checked as the service's objects (its name is the run name's
    // base: a replica's suffix is not part of any object's name).
    kube::ServiceRenderOptions service;
    service.service_name = run_name.substr(0, run_name.rfind('-'));
    service.default_image = options.default_image;
    service.installation = options.installation;
    service.code = std::move(options.code);
    TAU_ASSIGN_OR_RETURN(objects, kube::RenderService(spec, resolved, platform, service));
  } else {
    TAU_ASSIGN_OR_RETURN(objects, kube::RenderRun(spec, resolved, platform, options));
  }
  if (!options_.check_access || objects.empty()) return Status::Ok();
  const json& main = objects.back();  // the Job or RayJob (a gang's Service comes first)
  bool ray = Str(main, "kind") == "RayJob";
  const std::string ns = Str(Meta(main), "namespace");
  auto allowed = client_->CheckAccess(caller.user, caller.groups, "create",
                                      ray ? "ray.io" : "batch", ray ? "rayjobs" : "jobs", ns);
  if (!allowed.ok())
    return Status(allowed.status().code(),
                  fmt::format("cannot ask the cluster whether {} may run in namespace {}: {}",
                              caller.user, ns, allowed.status().message()));
  if (!*allowed)
    return PermissionDenied(fmt::format(
        "the cluster's RBAC does not let {} create {} in namespace {}; ask an administrator "
        "for the workspace's role there",
        caller.user, ray ? "rayjobs.ray.io" : "jobs.batch", ns));
  return Status::Ok();
}

Status KubeCluster::Launch(const ClusterLaunch& launch) {
  kube::RenderOptions options;
  options.run_name = launch.run;
  options.attempt = launch.attempt;
  options.default_image = options_.default_image;
  options.installation = options_.installation;
  options.resume_from = launch.resume_from;
  options.failure_reason = launch.failure_reason;
  options.array_index = launch.array_index;
  options.upstreams = launch.upstreams;
  TAU_ASSIGN_OR_RETURN(options.code, Code(launch.snapshot_dir));
  TAU_ASSIGN_OR_RETURN(std::vector<json> objects,
                       kube::RenderRun(*launch.spec, *launch.resolved, *launch.platform, options));
  if (objects.empty()) return Internal("the run rendered to no objects");
  const std::string ns = Str(Meta(objects.front()), "namespace");
  if (!launch.secrets.empty()) objects.insert(objects.begin(), SecretObject(ns, launch.secrets));
  const AttemptKey key{launch.run, launch.attempt};
  {
    MutexLock lock(&mu_);
    deleted_.erase(fmt::format("{}/{}", launch.run, launch.attempt));
    namespace_of_[key] = ns;
  }
  lanes_.Submit(
      ns, [this, objects = std::move(objects)] { return ApplyObjects(objects); },
      [this, key](const Status& s) { PostCall(key, AttemptNews::Call::kLaunched, s); });
  return Status::Ok();
}

Status KubeCluster::ApplyObjects(const std::vector<json>& objects) {
  json owner;  // the Job, once applied: a gang's Service goes with it (garbage collection)
  for (const json& object : objects) {
    TAU_ASSIGN_OR_RETURN(json applied, client_->Apply(object));
    if (Str(object, "kind") == "Job")
      owner = {{"apiVersion", kJobApi},
               {"kind", "Job"},
               {"name", Str(Meta(applied), "name")},
               {"uid", Str(Meta(applied), "uid")}};
  }
  if (owner.is_null() || Str(owner, "uid").empty()) return Status::Ok();
  for (const json& object : objects) {
    if (Str(object, "kind") != "Service") continue;
    // Its UID is known only now: the Service is rendered, and applied, before its Job.
    json patch = {{"metadata", {{"ownerReferences", json::array({owner})}}}};
    TAU_RETURN_IF_ERROR(client_
                            ->MergePatch("v1", "Service", Str(Meta(object), "namespace"),
                                         Str(Meta(object), "name"), patch)
                            .status());
  }
  return Status::Ok();
}

void KubeCluster::PostCall(const AttemptKey& key, AttemptNews::Call call, const Status& result) {
  AttemptNews news;
  news.run = key.first;
  news.attempt = key.second;
  news.call = call;
  news.result = result;
  if (post_) post_(std::move(news));
}

void KubeCluster::ReadPods(const AttemptKey& key, const std::string& ns) {
  {
    MutexLock lock(&mu_);
    auto it = attempts_.find(key);
    if (it == attempts_.end() || it->second.pods_reading || it->second.pods_read ||
        clock_->MonotonicMillis() < it->second.pods_read_not_before_ms)
      return;
    it->second.pods_reading = true;
  }
  // A lane of its own beside the namespace's creates and deletes: a create held up there (a
  // webhook that hangs) does not hold up how another attempt's end is told.
  auto pods = std::make_shared<std::vector<json>>();
  lanes_.Submit(
      ns + " (reads)",
      [this, key, ns, pods]() -> Status {
        kubeapi::ListOptions list;
        list.label_selector = AttemptSelector(key.first, key.second);
        TAU_ASSIGN_OR_RETURN(kubeapi::ObjectList found, client_->List("v1", "Pod", ns, list));
        for (json& pod : found.items)  // not another installation's run of the same name
          if (KeyOf(pod, options_.installation) == key) pods->push_back(std::move(pod));
        return Status::Ok();
      },
      [this, key, pods](const Status& s) { PodsRead(key, s, std::move(*pods)); });
}

void KubeCluster::PodsRead(const AttemptKey& key, const Status& s, std::vector<json> pods) {
  if (lanes_.stopping()->load()) return;  // the next server reads them again
  MutexLock lock(&mu_);
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return;  // deleted meanwhile
  Attempt& a = it->second;
  a.pods_reading = false;
  if (!s.ok()) {
    // Asked again at the next resync; after kPodReadTries, told from the watch's pods.
    const bool again = ++a.pod_read_failures < kPodReadTries;
    a.pods_read_not_before_ms = clock_->MonotonicMillis() + options_.resync_ms;
    std::fprintf(stderr, "tau server: reading the pods of run %s attempt %d: %s (%s)\n",
                 key.first.c_str(), key.second, s.ToString().c_str(),
                 again ? "trying again" : "its end is told from the pods the watch has seen");
    if (again) return;
  }
  for (json& pod : pods) {
    const std::string name = Str(Meta(pod), "name");
    if (a.pods_deleted.count(name)) continue;  // the watch saw it go after the list read it
    auto [at, added] = a.pods.try_emplace(name, pod);
    if (!added && !PodEnded(at->second)) at->second = std::move(pod);
  }
  a.pods_read = true;
  dirty_.insert(key);
  cv_.SignalAll();
}

Status KubeCluster::ApplyPlatform(const policy::Platform& platform) {
  TAU_ASSIGN_OR_RETURN(std::vector<json> objects, kube::RenderPlatform(platform));
  for (const json& object : objects) {
    auto applied = client_->Apply(object);
    if (!applied.ok())
      return Status(applied.status().code(),
                    fmt::format("{} {}: {}", Str(object, "kind"), Str(Meta(object), "name"),
                                applied.status().message()));
  }
  return Status::Ok();
}

void KubeCluster::Delete(const std::string& run, int attempt) {
  std::vector<json> targets;
  std::string lane;  // the attempt's namespace; "" when not known (right after a restart)
  const AttemptKey key{run, attempt};
  {
    MutexLock lock(&mu_);
    deleted_.insert(fmt::format("{}/{}", run, attempt));
    auto it = attempts_.find(key);
    if (it != attempts_.end()) {
      if (!it->second.object.is_null()) targets.push_back(it->second.object);
      attempts_.erase(it);
    }
    if (auto ns = namespace_of_.find(key); ns != namespace_of_.end()) {
      lane = ns->second;
      namespace_of_.erase(ns);
    } else if (!targets.empty()) {
      lane = Str(Meta(targets.front()), "namespace");
    }
  }
  lanes_.Submit(
      lane,
      [this, run, attempt, targets = std::move(targets)]() mutable {
        return DeleteObjects(run, attempt, std::move(targets));
      },
      [this, key](const Status& s) { PostCall(key, AttemptNews::Call::kDeleted, s); });
}

Status KubeCluster::DeleteObjects(const std::string& run, int attempt, std::vector<json> targets) {
  kubeapi::ListOptions list;
  list.label_selector = AttemptSelector(run, attempt);
  if (targets.empty()) {
    // Not seen by the watches yet (just created, or right after a restart): ask.
    for (const auto& [api, kind] : {std::pair{kJobApi, "Job"}, std::pair{kRayJobApi, "RayJob"}}) {
      auto found = client_->List(api, kind, "", list);
      if (found.ok()) {
        for (const json& item : found->items)  // another installation's run of the same name
          if (KeyOf(item, options_.installation).second > 0) targets.push_back(item);
      } else if (found.status().code() != StatusCode::kNotFound) {  // NotFound: no KubeRay
        return found.status();
      }
    }
  }
  for (const json& t : targets) {
    std::string ns = Str(Meta(t), "namespace");
    TAU_RETURN_IF_ERROR(
        client_->Delete(Str(t, "apiVersion"), Str(t, "kind"), ns, Str(Meta(t), "name")));
    // The gang's headless Service goes with it.
    TAU_ASSIGN_OR_RETURN(kubeapi::ObjectList services, client_->List("v1", "Service", ns, list));
    for (const json& svc : services.items)
      if (KeyOf(svc, options_.installation).second > 0)
        TAU_RETURN_IF_ERROR(client_->Delete("v1", "Service", ns, Str(Meta(svc), "name")));
  }
  return Status::Ok();
}

Result<std::vector<json>> KubeCluster::RenderService(const ServiceLaunch& launch) {
  kube::ServiceRenderOptions options;
  options.service_name = launch.service;
  options.revision = launch.revision;
  options.default_image = options_.default_image;
  options.installation = options_.installation;
  options.model_run = launch.model_run;
  TAU_ASSIGN_OR_RETURN(options.code, Code(launch.snapshot_dir));
  return kube::RenderService(*launch.spec, *launch.resolved, *launch.platform, options);
}

Status KubeCluster::ApplyService(const ServiceLaunch& launch, const std::vector<json>& objects) {
  if (objects.empty()) return Internal("the service rendered to no objects");
  kubeapi::CallBudget budget(options_.call_budget_ms, &stop_);
  if (!launch.secrets.empty())
    TAU_RETURN_IF_ERROR(
        client_->Apply(SecretObject(Str(Meta(objects.front()), "namespace"), launch.secrets))
            .status());
  for (const json& object : objects) {
    auto applied = client_->Apply(object);
    if (!applied.ok())
      return Status(applied.status().code(),
                    fmt::format("{} {}/{}: {}", Str(object, "kind"), Str(Meta(object), "namespace"),
                                Str(Meta(object), "name"), applied.status().message()));
  }
  return Status::Ok();
}

Status KubeCluster::DeleteService(const std::vector<json>& refs) {
  kubeapi::CallBudget budget(options_.call_budget_ms, &stop_);
  // The workload first: its pods stop being replaced before the Service in front goes.
  for (auto it = refs.rbegin(); it != refs.rend(); ++it) {
    Status deleted = client_->Delete(Str(*it, "apiVersion"), Str(*it, "kind"),
                                     Str(*it, "namespace"), Str(*it, "name"));
    if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) return deleted;
  }
  return Status::Ok();
}

namespace {
int64_t Int(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// A replica pod as ServicePod says it.
ServicePod ServicePodOf(const json& pod) {
  ServicePod p;
  p.name = Str(Meta(pod), "name");
  p.deleting = Meta(pod).contains("deletionTimestamp");
  const json& meta = Meta(pod);
  if (auto a = meta.find("annotations"); a != meta.end() && a->is_object())
    p.revision = std::atoll(Str(*a, kube::kAnnotationRevision).c_str());
  const json status = pod.value("status", json::object());
  p.phase = Str(status, "phase");
  if (auto spec = pod.find("spec"); spec != pod.end() && spec->is_object()) {
    auto containers = spec->find("containers");
    if (containers != spec->end() && containers->is_array() && !containers->empty())
      p.container = Str((*containers)[0], "name");
  }
  std::string why;
  for (const json& c : status.value("containerStatuses", json::array())) {
    p.restarts += Int(c, "restartCount");
    const json state = c.value("state", json::object());
    if (auto waiting = state.find("waiting"); waiting != state.end() && waiting->is_object()) {
      why = Str(*waiting, "reason");
      if (std::string m = Str(*waiting, "message"); !m.empty()) why += ": " + m;
    }
  }
  for (const json& c : status.value("conditions", json::array())) {
    if (Str(c, "type") != "Ready") continue;
    p.ready = Str(c, "status") == "True";
    if (!p.ready && why.empty()) why = Str(c, "message");
  }
  if (!p.ready) p.reason = why.empty() ? Str(status, "reason") : why;
  return p;
}
}  // namespace

Result<ServiceObserved> KubeCluster::ObserveService(const std::string& ns, const std::string& name,
                                                    const std::string& kind) {
  kubeapi::CallBudget budget(options_.call_budget_ms, &stop_);
  ServiceObserved out;
  const char* api = kind == "RayService" ? "ray.io/v1" : "apps/v1";
  auto workload = client_->Get(api, kind, ns, name);
  if (workload.ok()) {
    out.found = true;
    const json status = workload->value("status", json::object());
    if (kind == "RayService") {
      out.message = Str(status, "serviceStatus");
      out.desired = Int(workload->value("spec", json::object()), "replicas");
    } else {
      out.desired = Int(workload->value("spec", json::object()), "replicas");
      out.ready = Int(status, "readyReplicas");
      out.updated = Int(status, "updatedReplicas");
      for (const json& c : status.value("conditions", json::array()))
        if (Str(c, "status") == "False") out.message = Str(c, "message");
    }
  } else if (workload.status().code() != StatusCode::kNotFound) {
    return workload.status();
  }
  kubeapi::ListOptions list;
  list.label_selector = fmt::format("{}={}", kube::kLabelService, name);
  TAU_ASSIGN_OR_RETURN(kubeapi::ObjectList pods, client_->List("v1", "Pod", ns, list));
  for (const json& pod : pods.items) {
    // Another installation's service of the same name is not this one's.
    if (!options_.installation.empty() &&
        Label(pod, kube::kLabelInstallation) != options_.installation)
      continue;
    out.pods.push_back(ServicePodOf(pod));
  }
  if (kind == "RayService") {
    for (const ServicePod& p : out.pods) out.ready += p.ready ? 1 : 0;
  }
  std::sort(out.pods.begin(), out.pods.end(),
            [](const ServicePod& a, const ServicePod& b) { return a.name < b.name; });
  return out;
}

void KubeCluster::KeepServiceLog(const std::string& ns, const std::string& pod,
                                 const std::string& container, const std::string& path,
                                 AttemptLogs logs) {
  LogSource source = PodLog(ns, pod, container);
  // Not a pod the watches follow: asked of the API server when its stream ends.
  source.live = [this, ns, pod] {
    auto got = client_->Get("v1", "Pod", ns, pod);
    if (!got.ok()) return got.status().code() != StatusCode::kNotFound;
    const std::string phase = Str(got->value("status", json::object()), "phase");
    return phase != "Succeeded" && phase != "Failed";
  };
  FollowLog(std::move(source), path, AttemptKey{"", 0}, 0, logs);
}

}  // namespace

std::unique_ptr<Cluster> NewKubeCluster(kubeapi::Client* client, KubeClusterOptions options) {
  return std::make_unique<KubeCluster>(client, std::move(options));
}

}  // namespace tau::server
