// KubeCluster: tau's attempts as Jobs and RayJobs admitted by Kueue (see kube_cluster.h).
//
// Threads: one per watch (Jobs, RayJobs, Workloads, pods), one reconciler that turns what the
// watches saw into ClusterNews, and one per followed pod log. The watches only record objects and
// mark attempts dirty; the reconciler observes dirty attempts (and all of them every resync) and
// sends news when an observation changes.
#include "backend/kube/kube_cluster.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/snapshot.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/mutex.h"
#include "recovery/failure_class.h"

namespace tau::server {
namespace {

using nlohmann::json;

constexpr const char* kJobApi = "batch/v1";
constexpr const char* kRayJobApi = "ray.io/v1";
constexpr const char* kWorkloadApi = "kueue.x-k8s.io/v1beta1";

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

// The attempt an object or pod belongs to, from tau's labels; attempt 0 when it is not tau's.
AttemptKey KeyOf(const json& object) {
  std::string run = Label(object, kube::kLabelRun);
  std::string attempt = Label(object, kube::kLabelAttempt);
  int n = 0;
  for (char c : attempt) {
    if (c < '0' || c > '9' || n > 100'000) return {"", 0};
    n = n * 10 + (c - '0');
  }
  return {run, run.empty() ? 0 : n};
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

bool PodStarted(const json& pod) {
  auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return false;
  std::string phase = Str(*status, "phase");
  return phase == "Running" || phase == "Succeeded" || phase == "Failed";
}

// Appends all of `data` to `fd`; false on an error (a full disk, ...).
bool AppendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Fingerprint(const kube::AttemptObservation& o, std::optional<int> position) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}", kube::PhaseName(o.phase), o.failure_class, o.reason,
                     o.message, position.value_or(0), JsonText(o.flavors),
                     o.exit_code.value_or(-1000));
}

class KubeCluster final : public Cluster {
 public:
  KubeCluster(kubeapi::Client* client, KubeClusterOptions options)
      : client_(client), options_(std::move(options)) {}
  ~KubeCluster() override { Stop(); }

  Result<std::set<AttemptKey>> Start(
      std::function<void(ClusterNews)> on_news,
      std::function<std::string(const std::string&, int)> attempt_dir) override;
  void Stop() override;
  Status Check(const spec::RunSpec& spec, const policy::ResolvedRun& resolved,
               const policy::Platform& platform, const std::string& snapshot_dir,
               const policy::Caller& caller) override;
  Status Launch(const ClusterLaunch& launch) override;
  Status ApplyPlatform(const policy::Platform& platform) override;
  Status Delete(const std::string& run, int attempt) override;

 private:
  struct Attempt {
    json object;                       // the Job or RayJob; null until seen
    std::map<std::string, json> pods;  // name -> pod
    std::set<std::string> followed;    // pods whose logs are being (or were) kept
    bool submitter_followed = false;   // RayJob: the submitter pod's log
    std::string last_news;             // fingerprint of the last news sent
    bool gone = false;                 // its object was deleted
    bool ended = false;                // its terminal news was sent: no more resyncs
  };

  Result<std::vector<CodeFile>> Code(const std::string& snapshot_dir);
  void Watch(std::string api_version, std::string kind, std::string selector);
  void OnEvent(const std::string& kind, const kubeapi::WatchEvent& event);
  void Reconcile();
  void ObserveAll(std::set<AttemptKey> keys);
  void FollowLog(const std::string& ns, const std::string& pod, const std::string& container,
                 const std::string& path);
  // Whether the watches last saw the pod Pending or Running (false for pods they do not follow).
  bool PodRunning(const std::string& ns, const std::string& pod);

  kubeapi::Client* const client_;
  const KubeClusterOptions options_;
  std::function<void(ClusterNews)> on_news_;
  std::function<std::string(const std::string&, int)> attempt_dir_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;

  Mutex mu_;
  CondVar cv_;
  std::map<AttemptKey, Attempt> attempts_ TAU_GUARDED_BY(mu_);
  std::map<std::string, json> workloads_ TAU_GUARDED_BY(mu_);     // "ns/name" -> Workload
  std::map<std::string, AttemptKey> by_uid_ TAU_GUARDED_BY(mu_);  // object uid -> attempt
  std::set<AttemptKey> dirty_ TAU_GUARDED_BY(mu_);
  std::set<std::string> deleted_ TAU_GUARDED_BY(mu_);  // "run/attempt" tau deleted
  struct LogFollower {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // Joined by the reconciler once done (a long-lived server follows thousands of pods).
  std::vector<LogFollower> log_threads_ TAU_GUARDED_BY(mu_);
};

Result<std::set<AttemptKey>> KubeCluster::Start(
    std::function<void(ClusterNews)> on_news,
    std::function<std::string(const std::string&, int)> attempt_dir) {
  on_news_ = std::move(on_news);
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
      if (AttemptKey key = KeyOf(o); key.second > 0) existing.insert(key);
  }
  threads_.emplace_back(&KubeCluster::Watch, this, kJobApi, "Job", list.label_selector);
  threads_.emplace_back(&KubeCluster::Watch, this, kRayJobApi, "RayJob", list.label_selector);
  threads_.emplace_back(&KubeCluster::Watch, this, kWorkloadApi, "Workload", "");
  threads_.emplace_back(&KubeCluster::Watch, this, "v1", "Pod", kube::kLabelRun);
  threads_.emplace_back(&KubeCluster::Reconcile, this);
  return existing;
}

void KubeCluster::Stop() {
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
  AttemptKey key = KeyOf(o);
  if (key.second == 0) return;
  if (deleted_.count(fmt::format("{}/{}", key.first, key.second))) return;
  Attempt& a = attempts_[key];
  if (kind == "Pod") {
    if (deleted) {
      a.pods.erase(Str(Meta(o), "name"));
    } else {
      a.pods[Str(Meta(o), "name")] = o;
    }
  } else if (deleted) {
    if (a.ended) {
      // Its end was told; its object is gone (a TTL, a user): nothing left to follow.
      by_uid_.erase(Str(Meta(o), "uid"));
      attempts_.erase(key);
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
  int64_t next_resync = MonotonicMillis() + options_.resync_ms;
  while (!stop_) {
    std::set<AttemptKey> keys;
    std::vector<LogFollower> finished;
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
      if (MonotonicMillis() >= next_resync) {
        next_resync = MonotonicMillis() + options_.resync_ms;
        for (const auto& [key, a] : attempts_)
          if (!a.ended) keys.insert(key);
      }
      keys.merge(dirty_);
      dirty_.clear();
    }
    for (LogFollower& f : finished) f.thread.join();
    if (!keys.empty()) ObserveAll(std::move(keys));
  }
}

void KubeCluster::ObserveAll(std::set<AttemptKey> keys) {
  struct Todo {
    AttemptKey key;
    json object;
    std::vector<json> pods;
    std::vector<std::pair<std::string, int>> follow;  // pod, rank
    bool find_submitter = false;
    bool gone = false;
    std::string last_news;
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
      Todo t{key, a.object, {}, {}, false, a.gone, a.last_news};
      for (const auto& [pod_name, pod] : a.pods) {
        t.pods.push_back(pod);
        if (PodStarted(pod) && a.followed.insert(pod_name).second)
          t.follow.emplace_back(pod_name, RankOf(pod));
      }
      if (Str(a.object, "kind") == "RayJob" && !a.submitter_followed) {
        const json& status = a.object.contains("status") ? a.object["status"] : json::object();
        std::string ds = status.is_object() ? Str(status, "jobDeploymentStatus") : "";
        if (ds == "Running" || ds == "Complete" || ds == "Failed") {
          t.find_submitter = true;
          a.submitter_followed = true;
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
    if (!dir.empty()) {
      // Jobs: each worker pod's log is its rank's. RayJobs: the submitter's (the driver's output)
      // is rank 0; the Ray head and workers keep theirs in Ray.
      if (!ray)
        for (const auto& [pod, rank] : t.follow)
          FollowLog(ns, pod, "worker", fmt::format("{}/rank-{}.log", dir, rank));
      if (t.find_submitter) {
        kubeapi::ListOptions list;
        list.label_selector = "batch.kubernetes.io/job-name=" + Str(Meta(t.object), "name");
        auto pods = client_->List("v1", "Pod", ns, list);
        if (pods.ok() && !pods->items.empty())
          FollowLog(ns, Str(Meta(pods->items.back()), "name"), "", dir + "/rank-0.log");
      }
    }
    ClusterNews news;
    news.run = t.key.first;
    news.attempt = t.key.second;
    if (t.gone) {
      news.observed =
          kube::ObserveAttempt(t.object, kube::OwnedWorkload(t.object, workloads), t.pods);
      if (!news.observed.Terminal()) {
        news.observed.phase = kube::AttemptObservation::Phase::kFailed;
        news.observed.failure_class = recovery::FailureClassName(recovery::FailureClass::kUnknown);
        news.observed.message = fmt::format("its {} {} was deleted outside tau",
                                            Str(t.object, "kind"), NsName(t.object));
      }
    } else {
      const json* workload = kube::OwnedWorkload(t.object, workloads);
      news.observed = kube::ObserveAttempt(t.object, workload, t.pods);
      if (news.observed.phase == kube::AttemptObservation::Phase::kPending && workload) {
        if (auto p = positions.find(NsName(*workload)); p != positions.end())
          news.position = p->second;
      }
    }
    std::string fp = Fingerprint(news.observed, news.position);
    if (fp == t.last_news) continue;
    {
      MutexLock lock(&mu_);
      auto it = attempts_.find(t.key);
      if (it != attempts_.end()) {
        it->second.last_news = fp;
        it->second.ended = news.observed.Terminal();
      }
    }
    if (on_news_) on_news_(std::move(news));
  }
}

void KubeCluster::FollowLog(const std::string& ns, const std::string& pod,
                            const std::string& container, const std::string& path) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([this, ns, pod, container, path, done] {
    struct MarkDone {
      std::atomic<bool>* flag;
      ~MarkDone() { *flag = true; }
    } mark{done.get()};
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
      std::fprintf(stderr, "tau server: cannot keep the log of pod %s/%s in %s\n", ns.c_str(),
                   pod.c_str(), path.c_str());
      return;
    }
    kubeapi::LogOptions options;
    options.container = container;
    options.follow = true;
    // A stream can end while the container still runs (a kubelet or API server restart, a
    // proxy's timeout; days-long runs see them). Each new stream starts at the log's beginning,
    // and what the file already holds, a prefix of the same log, is skipped: so a restarted server
    // and a cut stream both keep every byte exactly once.
    bool disk_full = false;
    while (!stop_ && !disk_full) {
      struct stat st;
      off_t skip = ::fstat(fd, &st) == 0 ? st.st_size : 0;
      Status s = client_->StreamLogs(
          ns, pod, options,
          [&](std::string_view chunk) {
            if (skip > 0) {
              size_t n = std::min<size_t>(static_cast<size_t>(skip), chunk.size());
              chunk.remove_prefix(n);
              skip -= static_cast<off_t>(n);
            }
            disk_full = !AppendAll(fd, chunk);  // stops keeping the log, not the server
            return !disk_full;
          },
          &stop_);
      if (stop_ || !PodRunning(ns, pod)) break;
      if (!s.ok())
        std::fprintf(stderr, "tau server: the log of pod %s/%s: %s (following it again)\n",
                     ns.c_str(), pod.c_str(), s.ToString().c_str());
      MutexLock lock(&mu_);
      cv_.WaitFor(&mu_, std::chrono::milliseconds(500), [&] { return stop_.load(); });
    }
    ::close(fd);
  });
  MutexLock lock(&mu_);
  log_threads_.push_back({std::move(thread), std::move(done)});
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

Result<std::vector<CodeFile>> KubeCluster::Code(const std::string& snapshot_dir) {
  return ReadSnapshot(snapshot_dir);
}

Status KubeCluster::Check(const spec::RunSpec& spec, const policy::ResolvedRun& resolved,
                          const policy::Platform& platform, const std::string& snapshot_dir,
                          const policy::Caller& caller) {
  kube::RenderOptions options;
  options.run_name = spec.name + "-0000";  // as long as the names tau gives runs
  options.default_image = options_.default_image;
  TAU_ASSIGN_OR_RETURN(options.code, Code(snapshot_dir));
  TAU_ASSIGN_OR_RETURN(std::vector<json> objects,
                       kube::RenderRun(spec, resolved, platform, options));
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
  options.resume_from = launch.resume_from;
  options.failure_reason = launch.failure_reason;
  TAU_ASSIGN_OR_RETURN(options.code, Code(launch.snapshot_dir));
  TAU_ASSIGN_OR_RETURN(std::vector<json> objects,
                       kube::RenderRun(*launch.spec, *launch.resolved, *launch.platform, options));
  if (objects.empty()) return Internal("the run rendered to no objects");
  if (!launch.secrets.empty()) {
    json data = json::object();
    for (const auto& [key, value] : launch.secrets) data[key] = value;
    json secret = {{"apiVersion", "v1"},
                   {"kind", "Secret"},
                   {"metadata",
                    {{"name", kube::kRunSecretName},
                     {"namespace", Str(Meta(objects.front()), "namespace")},
                     {"labels", {{kube::kLabelManagedBy, "tau"}}}}},
                   {"type", "Opaque"},
                   {"stringData", data}};
    TAU_RETURN_IF_ERROR(client_->Apply(secret).status());
  }
  {
    MutexLock lock(&mu_);
    deleted_.erase(fmt::format("{}/{}", launch.run, launch.attempt));
  }
  for (const json& object : objects) TAU_RETURN_IF_ERROR(client_->Apply(object).status());
  return Status::Ok();
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

Status KubeCluster::Delete(const std::string& run, int attempt) {
  std::vector<json> targets;
  {
    MutexLock lock(&mu_);
    deleted_.insert(fmt::format("{}/{}", run, attempt));
    auto it = attempts_.find({run, attempt});
    if (it != attempts_.end()) {
      if (!it->second.object.is_null()) targets.push_back(it->second.object);
      attempts_.erase(it);
    }
  }
  kubeapi::ListOptions list;
  list.label_selector =
      fmt::format("{}={},{}={}", kube::kLabelRun, run, kube::kLabelAttempt, attempt);
  if (targets.empty()) {
    // Not seen by the watches yet (just created, or right after a restart): ask.
    for (const auto& [api, kind] : {std::pair{kJobApi, "Job"}, std::pair{kRayJobApi, "RayJob"}}) {
      auto found = client_->List(api, kind, "", list);
      if (found.ok()) targets.insert(targets.end(), found->items.begin(), found->items.end());
    }
  }
  for (const json& t : targets) {
    std::string api = Str(t, "apiVersion"), kind = Str(t, "kind");
    std::string ns = Str(Meta(t), "namespace");
    TAU_RETURN_IF_ERROR(client_->Delete(api, kind, ns, Str(Meta(t), "name")));
    // The gang's headless Service goes with it.
    auto services = client_->List("v1", "Service", ns, list);
    if (services.ok())
      for (const json& s : services->items)
        TAU_RETURN_IF_ERROR(client_->Delete("v1", "Service", ns, Str(Meta(s), "name")));
  }
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Cluster> NewKubeCluster(kubeapi::Client* client, KubeClusterOptions options) {
  return std::make_unique<KubeCluster>(client, std::move(options));
}

}  // namespace tau::server
