// GPU discovery and health: tau's one public header for src/health/.
//
// tau talks to the NVIDIA driver through NVML, loaded with dlopen at run time (libnvidia-ml.so.1,
// or the path in TAU_NVML_LIBRARY), with tau's own declarations of the documented ABI: no NVIDIA
// headers or SDK are needed to build tau, a symbol an older driver lacks means "not supported", and
// a machine without a driver simply has no GPUs. What this header offers:
//
//   DiscoverGpus()          one-shot inventory (index, UUID, name, memory, PCI bus id, driver and
//   CUDA
//                           driver versions, MIG mode). Never fails: problems end up in `note`.
//   GpuSample               one polling pass's readings for one GPU (what NVML could not tell is
//   empty). RunPassiveChecks()      pure: sample (+ the previous one) → one CheckResult per check,
//   each naming its
//                           threshold and the source of that threshold. See docs/gpu-health.md.
//   ClassifyXid()           the XID table (application error / reset / reboot / hardware).
//   VerdictTracker          pure: check results with timestamps → Healthy / Degraded / Unhealthy /
//   Unknown
//                           per GPU, with reasons, first-seen times, debouncing and explicit clear
//                           rules.
//   GpuMonitor              owns NVML, a polling thread and an XID event thread; Snapshot() is
//   thread-safe;
//                           on_verdict_change tells the server when a GPU turns Unhealthy.
//   ToJson(...), RenderMetrics()  JSON for the API and dcgm-exporter style Prometheus lines.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/mutex.h"
#include "common/status.h"

namespace tau::health {

// ---------------------------------------------------------------------------------------------------
// Inventory

struct GpuDevice {
  int index = 0;
  std::string uuid;
  std::string name;
  uint64_t memory_total_bytes = 0;
  std::string pci_bus_id;  // "00000000:3B:00.0"; empty when NVML cannot tell
  int minor_number = -1;   // /dev/nvidiaN; -1 when unknown
  // MIG mode: nullopt when the GPU or driver does not support MIG.
  std::optional<bool> mig_enabled;
  std::optional<bool> mig_pending;  // the mode that applies after the next GPU reset
};

struct GpuInventory {
  std::vector<GpuDevice> devices;
  bool driver_loaded = false;
  std::string driver_version;
  std::string cuda_driver_version;  // "12.4"; empty when the driver cannot tell
  std::string nvml_version;
  std::string library;  // the NVML library that answered
  std::string note;     // why there are no GPUs, in plain words, when there are none
  // The driver is there but NVML cannot be used (not loaded, a library/kernel version mismatch
  // after an update, the GPUs not countable): a node that needs attention, so a health check fails.
  // Empty on a machine with no NVIDIA driver at all, which is simply a machine without GPUs.
  std::string error;
};

// The NVML library tau loads: $TAU_NVML_LIBRARY when set, else libnvidia-ml.so.1.
std::string NvmlLibraryPath();

// Asks NVML for the GPUs of this machine. Never fails: problems end up in `note`.
GpuInventory DiscoverGpus();

nlohmann::json ToJson(const GpuInventory& inventory);

// ---------------------------------------------------------------------------------------------------
// Samples

struct XidEvent {
  uint64_t xid = 0;
  int64_t at_ms = 0;  // wall clock, when tau received it
};

struct NvLinkSample {
  unsigned link = 0;
  bool active = false;
  // Error counters (nvmlNvLinkErrorCounter_t); nullopt when not supported.
  std::optional<uint64_t> replay, recovery, crc_flit, crc_data;
};

struct RemapSample {
  unsigned corrected_rows = 0;
  unsigned uncorrected_rows = 0;
  bool pending = false;  // a GPU reset is needed to apply a remap
  bool failed = false;   // sticky: a remap failed
};

// One polling pass's readings for one GPU. An empty optional means NVML could not tell (missing
// symbol of an older driver, NOT_SUPPORTED on this GPU, or a GPU that was lost before the reading).
struct GpuSample {
  int index = 0;
  std::string uuid;
  int64_t at_ms = 0;  // wall clock of the pass

  // The GPU fell off the bus: a call returned NVML_ERROR_GPU_IS_LOST. Nothing else is read then.
  bool lost = false;
  // The essential readings failed (no handle, no memory info) with an error other than "lost": the
  // GPU's state is unknown.
  bool unreadable = false;
  // The first NVML error other than "not supported" or "lost" while reading, with the call's name.
  std::string error;

  std::optional<unsigned> gpu_util_pct, memory_util_pct;
  std::optional<uint64_t> memory_total_bytes, memory_used_bytes;
  std::optional<unsigned> temperature_c;
  std::optional<unsigned> temperature_slowdown_c, temperature_shutdown_c;
  std::optional<unsigned> power_mw, power_limit_mw, power_default_limit_mw;
  bool insufficient_power = false;  // a call returned NVML_ERROR_INSUFFICIENT_POWER
  std::optional<unsigned> sm_clock_mhz, memory_clock_mhz;
  std::optional<unsigned> pstate;                // 0 = P0 ... 15
  std::optional<uint64_t> clocks_event_reasons;  // bit mask, see docs/gpu-health.md
  std::optional<bool> ecc_enabled, ecc_pending;
  std::optional<uint64_t> ecc_sbe_volatile, ecc_dbe_volatile, ecc_sbe_aggregate, ecc_dbe_aggregate;
  // Page retirement (Kepler..Volta; Ampere and later remap rows instead and answer not supported).
  std::optional<unsigned> retired_pages_sbe, retired_pages_dbe;
  std::optional<bool> retired_pages_pending;
  // When DBE pages were retired (wall clock, ms), within Thresholds::retired_pages_dbe_window_ms,
  // for DCGM's "more than one in the last week" rule. GpuMonitor dates each rise of the count at
  // the pass that saw it; pages retired before it started are not listed. nullopt: no dates known.
  std::optional<std::vector<int64_t>> retired_pages_dbe_at_ms;
  std::optional<RemapSample> remap;
  std::optional<unsigned> pcie_gen, pcie_gen_max, pcie_width, pcie_width_max;
  std::optional<unsigned> pcie_replay_counter;
  std::vector<NvLinkSample> nvlinks;        // empty: no NVLink, or not supported
  std::optional<unsigned> recovery_action;  // nvmlGpuRecoveryAction_t (field 230)
  std::optional<bool> inforom_valid;
  std::optional<bool> mig_enabled, mig_pending;
  std::optional<unsigned> mig_instances;  // MIG devices that exist, when MIG is enabled

  // XID events received since the previous sample (filled by GpuMonitor's event thread), and the
  // last XID ever seen on this GPU (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS; 0 = none).
  std::vector<XidEvent> xids;
  uint64_t last_xid = 0;
  bool xid_events_supported = false;

  // The NVML calls that answered "not supported" (or whose symbol is missing), for the record.
  std::vector<std::string> not_supported;
};

nlohmann::json ToJson(const GpuSample& sample);

// ---------------------------------------------------------------------------------------------------
// Checks

enum class CheckStatus {
  kPass,
  kInfo,          // worth recording (an application XID), never changes a verdict on its own
  kWarn,          // → Degraded
  kFail,          // → Unhealthy
  kError,         // the check could not be evaluated (NVML error) → Unknown, fail closed
  kNotSupported,  // this GPU or driver cannot tell: the check is skipped, not failed
};

// What the operator (or the server) should do, after the reference's verdict classes.
enum class Action {
  kNone,
  kRestartApp,  // application error: restart the job, no node action
  kWatch,       // warning only
  kFixConfig,   // a configuration the GPU cannot be used in (MIG without instances)
  kResetGpu,    // drain the GPU, reset it (nvidia-smi -r), re-check
  // The GPU still works, and a reset applies a pending repair (row remap, page retirement): no new
  // work, the running work finishes, then reset. Never a reason to stop what runs.
  kResetWhenIdle,
  kRebootNode,  // drain, reboot the machine
  kHardware,    // drain, keep out, field diagnostics / RMA
};

// When an active condition may clear. See docs/gpu-health.md "Clear rules".
enum class ClearRule {
  kAfterHealthyObservations,  // the check passed in M consecutive observations (transient
                              // conditions)
  kAfterQuietPeriod,          // an event-only warning: no recurrence for a hold time
  kOnGpuReset,                // only after VerdictTracker::ClearAfterReset (a GPU reset was done)
  kOnReboot,  // never within this process: a reboot (new process) or an operator override
};

const char* CheckStatusName(CheckStatus status);
const char* ActionName(Action action);
const char* ClearRuleName(ClearRule rule);

struct CheckResult {
  int gpu_index = 0;
  std::string check;  // stable name: "xid_79", "ecc_dbe_volatile", "temperature", ...
  CheckStatus status = CheckStatus::kPass;
  Action action = Action::kNone;
  ClearRule clear = ClearRule::kAfterHealthyObservations;
  std::string message;    // what was seen, with values
  std::string threshold;  // the rule, e.g. "volatile DBE count > 0"
  std::string source;     // where the threshold comes from
  // Observations needed before a warn/fail counts: 0 = the policy's default; 1 = at once (events
  // and latched driver facts that cannot be noise).
  int debounce = 0;
  // A warning that stays active this long becomes a failure (0 = never), e.g. throttling > 10 min.
  int64_t escalate_after_ms = 0;
  uint64_t xid = 0;  // for XID results
};

nlohmann::json ToJson(const CheckResult& result);

// Thresholds. Defaults come from the sources named in docs/gpu-health.md.
struct Thresholds {
  int temperature_slowdown_margin_c = 2;  // warn at slowdown threshold - 2 °C
  int temperature_shutdown_margin_c = 5;  // fail at shutdown threshold - 5 °C
  int throttle_debounce = 3;              // consecutive samples with HW slowdown / power brake
  int64_t throttle_unhealthy_after_ms = 10 * 60 * 1000;
  uint64_t ecc_dbe_volatile_max = 0;        // fail above
  uint64_t ecc_aggregate_max = 20'000'000;  // fail above (lifetime DRAM ECC)
  unsigned retired_pages_max = 63;          // fail at or above (SBE + DBE pages)
  // DCGM's soft limit: more than this many DBE pages fails when more than
  // retired_pages_dbe_recent_max of them were retired within retired_pages_dbe_window_ms.
  unsigned retired_pages_dbe_soft_max = 15;
  unsigned retired_pages_dbe_recent_max = 1;
  int64_t retired_pages_dbe_window_ms = 7 * 24 * 3'600'000LL;
  unsigned remapped_rows_uncorrectable_max = 512;  // fail at or above
  unsigned nvlink_inactive_max = 0;                // fail above
  uint64_t nvlink_error_delta_max = 0;             // warn above, per pass
  double nvlink_crc_per_second_max = 100;          // fail at or above, averaged over the window
  double power_limit_min_fraction = 0.9;  // warn when enforced limit < this × default limit
  // Counter rates (PCIe replays, NVLink CRC) are the rise over this window, as DCGM compares them,
  // never one poll interval extrapolated: a short burst is not a sustained rate.
  int64_t rate_window_ms = 60'000;
};

// The XID table (docs/gpu-health.md; NVIDIA's XID catalog buckets as copied by NVSentinel, with
// DCGM's "devastating" list and the k8s-device-plugin ignore list).
struct XidClass {
  CheckStatus status = CheckStatus::kWarn;
  Action action = Action::kWatch;
  ClearRule clear = ClearRule::kAfterQuietPeriod;
  std::string mnemonic;
  std::string source;
};
XidClass ClassifyXid(uint64_t xid);

// Runs every passive check on `now`. `previous` (may be null) is the GPU's sample of the previous
// pass, for counters that must not rise at all (NVLink errors). `window_start` (null: `previous`)
// begins the rate window: the newest sample at least Thresholds::rate_window_ms old, or the oldest
// one kept while the history is shorter. Pure.
std::vector<CheckResult> RunPassiveChecks(const GpuSample& now, const GpuSample* previous,
                                          const Thresholds& thresholds,
                                          const GpuSample* window_start = nullptr);
// The checks for XID events alone (the event thread uses this to act before the next poll).
std::vector<CheckResult> CheckXids(int gpu_index, const std::vector<XidEvent>& xids);

// ---------------------------------------------------------------------------------------------------
// Verdicts

enum class Verdict { kHealthy, kDegraded, kUnhealthy, kUnknown };
const char* VerdictName(Verdict verdict);
// Healthy and Degraded GPUs may be given to runs; Unhealthy and Unknown may not (fail closed).
inline bool Placeable(Verdict v) { return v == Verdict::kHealthy || v == Verdict::kDegraded; }

struct Reason;
// Whether the work running on a GPU must stop now: only when it is Unhealthy with a failing
// condition whose remedy does not wait for the GPU to be idle. An Unknown GPU (a read that failed)
// and a repair pending until the next reset keep new work off and leave running work alone.
bool StopsRunningWork(Verdict verdict, const std::vector<Reason>& reasons);

struct Reason {
  std::string check;
  CheckStatus status = CheckStatus::kWarn;
  Action action = Action::kNone;
  ClearRule clear = ClearRule::kAfterHealthyObservations;
  std::string message, threshold, source;
  int64_t first_seen_ms = 0;    // first failing observation
  int64_t last_seen_ms = 0;     // latest failing observation
  int64_t active_since_ms = 0;  // when it started to count (after debouncing)
  int count = 0;                // failing observations (or events) so far
};

struct GpuVerdict {
  int gpu_index = 0;
  Verdict verdict = Verdict::kUnknown;
  int64_t since_ms = 0;               // when the GPU entered this verdict
  std::vector<Reason> reasons;        // active conditions, worst first
  std::vector<Reason> pending;        // failing but not yet debounced
  std::vector<XidEvent> recent_xids;  // application XIDs etc. within the escalation window
};

nlohmann::json ToJson(const Reason& reason);
nlohmann::json ToJson(const GpuVerdict& verdict);

struct VerdictPolicy {
  int debounce_observations = 2;  // consecutive failing polls before a polled condition counts
  int clear_observations = 3;     // consecutive passing polls before a transient condition clears
  int64_t quiet_period_ms =
      60 * 60 * 1000;      // event-only warnings clear after this without recurrence
  int app_xid_repeat = 3;  // application XIDs within the window → Degraded
  int64_t app_xid_window_ms = 24 * 60 * 60 * 1000;
};

struct VerdictChange {
  int gpu_index = 0;
  Verdict old_verdict = Verdict::kUnknown;
  Verdict new_verdict = Verdict::kUnknown;
  std::vector<Reason> reasons;
  int64_t at_ms = 0;
};

// Turns check results into verdicts. Pure (time comes in with each call) and not thread-safe: the
// owner locks. Rules, in order (docs/gpu-health.md "Verdict rules"):
//  - A GPU never observed is Unknown.
//  - A failing result counts once it has failed `debounce` consecutive observations (the result's
//  own
//    debounce, else the policy's); until then it is "pending". Events and latched driver facts
//    count at once.
//  - Verdict = Unhealthy if any active condition is kFail, else Unknown if any is kError, else
//  Degraded
//    if any is kWarn, else Healthy.
//  - A condition clears by its ClearRule only; a pass does not clear a condition that needs a reset
//  or a
//    reboot.
class VerdictTracker {
 public:
  explicit VerdictTracker(VerdictPolicy policy = {});

  // Feeds the results of one observation of `gpu` at `now_ms` (a polling pass or an event). Checks
  // absent from `results` are left as they were. Returns the change, if the verdict changed.
  std::optional<VerdictChange> Observe(int gpu, int64_t now_ms,
                                       const std::vector<CheckResult>& results);
  // A GPU reset was done: clears every condition except those that need a reboot. The next
  // observations re-establish anything that is still wrong.
  std::optional<VerdictChange> ClearAfterReset(int gpu, int64_t now_ms);
  // An operator says the GPU is fine (after a repair): clears everything.
  std::optional<VerdictChange> ClearAll(int gpu, int64_t now_ms);

  GpuVerdict Get(int gpu) const;
  std::vector<GpuVerdict> All() const;

 private:
  struct Condition {
    Reason reason;
    int consecutive_fail = 0;
    int consecutive_pass = 0;
    int debounce = 1;
    bool active = false;
    int64_t escalate_after_ms = 0;
  };
  struct GpuState {
    bool observed = false;
    Verdict verdict = Verdict::kUnknown;
    int64_t since_ms = 0;
    std::map<std::string, Condition> conditions;
    std::vector<XidEvent> app_xids;  // within the escalation window
  };

  void Apply(GpuState& state, int64_t now_ms, const CheckResult& r);
  std::optional<VerdictChange> Recompute(int gpu, GpuState& state, int64_t now_ms);
  GpuVerdict Describe(int gpu, const GpuState& state) const;
  std::string FormatWindow() const;

  VerdictPolicy policy_;
  std::map<int, GpuState> gpus_;
};

// ---------------------------------------------------------------------------------------------------
// The monitor

class Nvml;  // nvml.h: the dlopen binding (internal)

struct HealthSnapshot {
  GpuInventory inventory;
  std::vector<GpuSample> samples;    // latest per GPU, by index
  std::vector<GpuVerdict> verdicts;  // per GPU, by index
  int64_t taken_ms = 0;
  int64_t passes = 0;       // polling passes done
  bool xid_events = false;  // the XID event thread is running
};

nlohmann::json ToJson(const HealthSnapshot& snapshot);

// dcgm-exporter style Prometheus text: DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-…",modelName="…",…}
// 37, plus tau_gpu_health{…} (0 Healthy, 1 Degraded, 2 Unhealthy, 3 Unknown).
std::string RenderMetrics(const HealthSnapshot& snapshot, const std::string& hostname = "");

// The active probe (`tau health check --active`): creates a context on every GPU through the CUDA
// driver API (libcuda.so.1, loaded with dlopen), allocates 64 MiB, writes a pattern and reads it
// back. Call it in a short-lived process: it initialises CUDA. Without a CUDA driver it says so and
// runs nothing.
//   {"ran": bool, "note": "...", "gpus": [{"cuda_ordinal", "name", "passed", "error", "ms"}]}
nlohmann::json RunActiveProbe();

using VerdictCallback = std::function<void(int gpu_index, Verdict old_verdict, Verdict new_verdict,
                                           const std::vector<Reason>& reasons)>;

struct MonitorOptions {
  std::string library_path;  // empty: NvmlLibraryPath()
  int64_t poll_interval_ms = 10'000;
  int event_wait_ms = 500;  // slice of nvmlEventSetWait_v2, bounds how long Stop() waits
  bool watch_events = true;
  // nvmlDeviceValidateInforom checksums the InfoROM: ~70 ms of CPU per GPU on an H200 with driver
  // 580 (the rest of a pass is under 1 ms), for a condition that hardly ever changes. The first
  // pass always validates; later passes only this often, and carry the last answer in between.
  int64_t inforom_check_interval_ms = 3'600'000;
  Thresholds thresholds;
  VerdictPolicy policy;
  // Called from the monitor's threads, outside its lock, in order. Keep it short; do not call
  // Stop().
  VerdictCallback on_verdict_change;
};

// Polls every GPU every poll_interval_ms and watches XID events in between. Thread-safe.
class GpuMonitor {
 public:
  explicit GpuMonitor(MonitorOptions options);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  // Loads NVML, reads the inventory, does a first polling pass and starts the threads. A machine
  // without a driver is not an error: the monitor runs with no GPUs and the inventory says why.
  // With start_threads=false nothing runs in the background (tests, benchmarks: call PollOnce()).
  Status Start(bool start_threads = true);
  void Stop();

  // One polling pass over every GPU, now, on the caller's thread.
  void PollOnce();
  // Waits for one XID event (up to timeout_ms) and handles it, on the caller's thread (tests
  // without threads). Returns whether an event was handled.
  bool WaitForEventOnce(int timeout_ms);

  // A GPU reset / an operator repair was done: see VerdictTracker.
  void ClearAfterReset(int gpu_index);
  void ClearAll(int gpu_index);

  HealthSnapshot Snapshot() const;

 private:
  void PollLoop();
  void EventLoop();
  void Deliver();  // hands outbox_ to the callback, in order
  void SetupEvents();
  void FeedAll(const std::string& check, CheckStatus status, const std::string& message);

  const MonitorOptions options_;
  // Set in Start, then read-only (NVML itself is thread-safe).
  std::unique_ptr<Nvml> nvml_;
  std::vector<void*> handles_;          // nvmlDevice_t per GPU index
  std::vector<bool> events_supported_;  // XID events registered, per GPU index
  void* event_set_ = nullptr;           // nvmlEventSet_t

  mutable Mutex mu_;
  GpuInventory inventory_ TAU_GUARDED_BY(mu_);
  std::vector<GpuSample> samples_ TAU_GUARDED_BY(mu_);
  // Per GPU, earlier samples back to the newest one at least rate_window_ms old: where the rate
  // window of the next pass begins (RunPassiveChecks' window_start).
  std::vector<std::deque<GpuSample>> history_ TAU_GUARDED_BY(mu_);
  std::vector<std::vector<XidEvent>> pending_xids_
      TAU_GUARDED_BY(mu_);  // for the next sample's record
  std::vector<uint64_t> last_xid_ TAU_GUARDED_BY(mu_);
  VerdictTracker tracker_ TAU_GUARDED_BY(mu_);
  std::vector<VerdictChange> outbox_ TAU_GUARDED_BY(mu_);  // changes not yet delivered
  int64_t passes_ TAU_GUARDED_BY(mu_) = 0;
  int64_t inforom_checked_ms_ TAU_GUARDED_BY(mu_) = 0;
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  bool events_running_ TAU_GUARDED_BY(mu_) = false;
  bool events_failed_ TAU_GUARDED_BY(mu_) = false;
  CondVar wake_;  // signalled on Stop

  // Serialises callbacks so that changes arrive in the order they happened. Lock order:
  // callback_mu_ before mu_, never the other way (a callback may call Snapshot()).
  Mutex callback_mu_;
  std::thread poll_thread_;
  std::thread event_thread_;
};

}  // namespace tau::health
