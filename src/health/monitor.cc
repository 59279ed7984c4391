// GpuMonitor: a polling thread (every GPU, every poll_interval_ms) and an XID event thread
// (nvmlEventSetWait_v2), feeding one VerdictTracker. NVML calls run outside the lock; the tracker,
// the samples and the outbox of verdict changes are guarded by mu_.
#include <fmt/format.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "health/health.h"
#include "health/nvml.h"

namespace tau::health {
namespace {

nvml::Device Dev(void* handle) { return static_cast<nvml::Device>(handle); }

}  // namespace

GpuMonitor::GpuMonitor(MonitorOptions options)
    : options_(std::move(options)), tracker_(options_.policy) {}

GpuMonitor::~GpuMonitor() {
  Stop();
  if (event_set_ && nvml_) Nvml::Call(nvml_->fn().event_set_free, nvml::EventSet(event_set_));
  event_set_ = nullptr;
}

Status GpuMonitor::Start(bool start_threads) {
  std::string path = options_.library_path.empty() ? NvmlLibraryPath() : options_.library_path;
  Result<std::unique_ptr<Nvml>> loaded = Nvml::Load(path);
  if (!loaded.ok()) {
    // No driver is a normal machine without GPUs, not an error of the monitor.
    MutexLock lock(&mu_);
    inventory_.note = loaded.status().message();
    if (loaded.status().code() != StatusCode::kNotFound) {
      inventory_.library = path;
      inventory_.error = inventory_.note;
    }
    return Status::Ok();
  }
  nvml_ = std::move(loaded).value();
  std::vector<nvml::Device> handles;
  GpuInventory inventory = ReadInventory(*nvml_, &handles);
  for (nvml::Device d : handles) handles_.push_back(d);
  events_supported_.assign(handles_.size(), false);
  {
    MutexLock lock(&mu_);
    inventory_ = std::move(inventory);
    samples_.resize(handles_.size());
    history_.assign(handles_.size(), {});
    pending_xids_.resize(handles_.size());
    last_xid_.assign(handles_.size(), 0);
  }
  // Events first, so that nothing that happens during the first pass is missed.
  if (options_.watch_events) SetupEvents();
  PollOnce();
  if (!start_threads) return Status::Ok();
  poll_thread_ = std::thread([this] { PollLoop(); });
  if (event_set_) {
    {
      MutexLock lock(&mu_);
      events_running_ = true;
    }
    event_thread_ = std::thread([this] { EventLoop(); });
  }
  return Status::Ok();
}

void GpuMonitor::SetupEvents() {
  const nvml::Functions& f = nvml_->fn();
  nvml::EventSet set = nullptr;
  if (Nvml::Call(f.event_set_create, &set) != nvml::kSuccess || !set) return;
  bool any = false;
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (!handles_[i]) continue;
    // As the k8s-device-plugin does: ask for XID events only where the GPU says it can deliver
    // them.
    unsigned long long supported = 0;
    nvml::Return rc = Nvml::Call(f.supported_event_types, Dev(handles_[i]), &supported);
    if (rc != nvml::kSuccess || !(supported & nvml::kEventXidCritical)) continue;
    if (Nvml::Call(f.register_events, Dev(handles_[i]), nvml::kEventXidCritical, set) ==
        nvml::kSuccess) {
      events_supported_[i] = true;
      any = true;
    }
  }
  if (!any) {
    Nvml::Call(f.event_set_free, set);
    return;
  }
  event_set_ = set;
}

void GpuMonitor::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (poll_thread_.joinable()) poll_thread_.join();
  // The event thread notices within one event_wait_ms slice.
  if (event_thread_.joinable()) event_thread_.join();
  MutexLock lock(&mu_);
  events_running_ = false;
}

void GpuMonitor::PollLoop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (wake_.WaitFor(&mu_, std::chrono::milliseconds(options_.poll_interval_ms),
                        [this]() TAU_REQUIRES(mu_) { return stopping_; }))
        break;
    }
    PollOnce();
  }
}

constexpr size_t kMaxHistory = 600;

namespace {

// DCGM fails a GPU with many DBE retired pages only while more keep coming (more than one in the
// last week). NVML's count carries no dates, so each rise is dated at the pass that saw it and kept
// for the window; pages retired before this process started stay undated and count as older.
void DateDbeRetirements(GpuSample& s, const GpuSample* prev, int64_t window_ms) {
  if (!s.retired_pages_dbe) return;
  std::vector<int64_t> at;
  if (prev && prev->retired_pages_dbe_at_ms) at = *prev->retired_pages_dbe_at_ms;
  if (prev && prev->retired_pages_dbe && *s.retired_pages_dbe > *prev->retired_pages_dbe) {
    at.insert(at.end(), *s.retired_pages_dbe - *prev->retired_pages_dbe, s.at_ms);
  }
  std::erase_if(at, [&](int64_t t) { return s.at_ms - t >= window_ms; });
  s.retired_pages_dbe_at_ms = std::move(at);
}

}  // namespace

void GpuMonitor::PollOnce() {
  int64_t now = NowMillis();
  std::vector<GpuSample> fresh;
  if (nvml_) {
    std::vector<std::string> uuids;
    bool validate_inforom = false;
    {
      MutexLock lock(&mu_);
      for (const GpuDevice& d : inventory_.devices) uuids.push_back(d.uuid);
      validate_inforom =
          passes_ == 0 || now - inforom_checked_ms_ >= options_.inforom_check_interval_ms;
      if (validate_inforom) inforom_checked_ms_ = now;
    }
    // NVML calls take time (ioctls on a real driver): never under the lock.
    for (size_t i = 0; i < handles_.size(); ++i) {
      fresh.push_back(
          ReadSample(*nvml_, Dev(handles_[i]), int(i), uuids[i], now, validate_inforom));
    }
  }
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < fresh.size(); ++i) {
      GpuSample& s = fresh[i];
      s.xids = std::move(pending_xids_[i]);
      pending_xids_[i].clear();
      s.last_xid = last_xid_[i];
      s.xid_events_supported = events_supported_[i];
      const GpuSample* prev = passes_ > 0 ? &samples_[i] : nullptr;
      if (!s.inforom_valid && prev) s.inforom_valid = prev->inforom_valid;
      DateDbeRetirements(s, prev, options_.thresholds.retired_pages_dbe_window_ms);
      std::deque<GpuSample>& history = history_[i];
      if (prev) history.push_back(*prev);
      // Keep one sample at least a window old (the window's start); drop the ones before it.
      // A bound for very short poll intervals: the window then starts a little later.
      while (history.size() > 1 &&
             (s.at_ms - history[1].at_ms >= options_.thresholds.rate_window_ms ||
              history.size() > kMaxHistory))
        history.pop_front();
      const GpuSample* window = history.empty() ? nullptr : &history.front();
      std::vector<CheckResult> results = RunPassiveChecks(s, prev, options_.thresholds, window);
      // The event thread has already fed these XIDs to the tracker; the sample keeps them on
      // record.
      std::erase_if(results, [](const CheckResult& r) { return r.xid != 0; });
      if (auto change = tracker_.Observe(int(i), now, results)) outbox_.push_back(*change);
      samples_[i] = std::move(s);
    }
    ++passes_;
  }
  Deliver();
}

void GpuMonitor::EventLoop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stopping_) break;
    }
    WaitForEventOnce(options_.event_wait_ms);
  }
}

void GpuMonitor::FeedAll(const std::string& check, CheckStatus status, const std::string& message) {
  int64_t now = NowMillis();
  MutexLock lock(&mu_);
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (!events_supported_[i]) continue;
    CheckResult r;
    r.gpu_index = int(i);
    r.check = check;
    r.status = status;
    r.action = Action::kWatch;
    r.debounce = 1;
    r.message = message;
    r.threshold = "nvmlEventSetWait_v2 answers (an event or a timeout)";
    r.source = "k8s-device-plugin health.go: any other error marks every device unhealthy";
    if (auto change = tracker_.Observe(int(i), now, {r})) outbox_.push_back(*change);
  }
}

bool GpuMonitor::WaitForEventOnce(int timeout_ms) {
  if (!event_set_) return false;
  nvml::EventData data{};
  nvml::Return rc = Nvml::Call(nvml_->fn().event_set_wait, nvml::EventSet(event_set_), &data,
                               unsigned(timeout_ms));
  bool failed;
  {
    MutexLock lock(&mu_);
    failed = events_failed_;
    events_failed_ = rc != nvml::kSuccess && rc != nvml::kErrorTimeout;
  }
  if (rc != nvml::kSuccess && rc != nvml::kErrorTimeout) {
    // tau cannot watch XIDs: fail closed (Unknown) until the wait works again, and do not spin.
    FeedAll("xid_events", CheckStatus::kError,
            fmt::format("waiting for XID events failed: {}", nvml_->ErrorString(rc)));
    Deliver();
    MutexLock lock(&mu_);
    wake_.WaitFor(&mu_, std::chrono::milliseconds(timeout_ms),
                  [this]() TAU_REQUIRES(mu_) { return stopping_; });
    return false;
  }
  if (failed) FeedAll("xid_events", CheckStatus::kPass, "");
  if (rc == nvml::kErrorTimeout || !(data.event_type & nvml::kEventXidCritical)) {
    Deliver();
    return false;
  }
  int index = -1;
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (Dev(handles_[i]) == data.device) index = int(i);
  }
  if (index < 0) return false;
  XidEvent event{data.event_data, NowMillis()};
  {
    MutexLock lock(&mu_);
    pending_xids_[index].push_back(event);
    last_xid_[index] = event.xid;
    samples_[index].last_xid = event.xid;
    // Acting on the event now, not at the next poll: an XID 79 must stop placement at once.
    if (auto change = tracker_.Observe(index, event.at_ms, CheckXids(index, {event}))) {
      outbox_.push_back(*change);
    }
  }
  Deliver();
  return true;
}

void GpuMonitor::Deliver() {
  MutexLock callbacks(&callback_mu_);
  std::vector<VerdictChange> changes;
  {
    MutexLock lock(&mu_);
    changes.swap(outbox_);
  }
  if (!options_.on_verdict_change) return;
  for (const VerdictChange& c : changes) {
    options_.on_verdict_change(c.gpu_index, c.old_verdict, c.new_verdict, c.reasons);
  }
}

void GpuMonitor::ClearAfterReset(int gpu_index) {
  {
    MutexLock lock(&mu_);
    if (auto change = tracker_.ClearAfterReset(gpu_index, NowMillis())) outbox_.push_back(*change);
  }
  Deliver();
  PollOnce();  // re-check at once rather than leave the GPU Unknown for a whole interval
}

void GpuMonitor::ClearAll(int gpu_index) {
  {
    MutexLock lock(&mu_);
    if (auto change = tracker_.ClearAll(gpu_index, NowMillis())) outbox_.push_back(*change);
  }
  Deliver();
  PollOnce();
}

HealthSnapshot GpuMonitor::Snapshot() const {
  MutexLock lock(&mu_);
  HealthSnapshot snap;
  snap.inventory = inventory_;
  snap.samples = samples_;
  for (size_t i = 0; i < inventory_.devices.size(); ++i)
    snap.verdicts.push_back(tracker_.Get(int(i)));
  snap.taken_ms = NowMillis();
  snap.passes = passes_;
  snap.xid_events = events_running_;
  return snap;
}

}  // namespace tau::health
