// The passive checks: each turns readings into a CheckResult that names its threshold and where
// that threshold comes from. Pure functions of (now, previous, thresholds). docs/gpu-health.md has
// the table.
#include <fmt/format.h>

#include <cmath>

#include "health/health.h"
#include "health/nvml.h"

namespace tau::health {
namespace {

// Source names, short enough for a message, precise enough to look up.
constexpr const char* kSrcDcgmMem = "DCGM MEM health watch (DcgmHealthWatch.cpp)";
constexpr const char* kSrcAzureEcc = "azurehpc-health-checks check_gpu_ecc";
constexpr const char* kSrcRef = "tau reference gpu-health.md §5";

class Checks {
 public:
  Checks(const GpuSample& now, const GpuSample* prev, const GpuSample* window, const Thresholds& t)
      : now_(now), prev_(prev), window_(window ? window : prev), t_(t) {}

  std::vector<CheckResult> Run() {
    // Add() hands out references into out_ that must survive later Add() calls: no reallocation.
    out_.reserve(kMaxChecks + now_.xids.size());
    Lost();
    if (now_.lost) {
      // Nothing else can be read from a GPU that is gone; what was active stays active.
      Append(CheckXids(now_.index, now_.xids));
      return std::move(out_);
    }
    NvmlRead();
    Append(CheckXids(now_.index, now_.xids));
    RecoveryAction();
    Ecc();
    RetiredPages();
    RowRemap();
    Temperature();
    Throttle();
    Power();
    Pcie();
    NvLink();
    Inforom();
    Mig();
    return std::move(out_);
  }

 private:
  CheckResult& Add(std::string check, CheckStatus status, std::string threshold,
                   std::string source) {
    CheckResult r;
    r.gpu_index = now_.index;
    r.check = std::move(check);
    r.status = status;
    r.threshold = std::move(threshold);
    r.source = std::move(source);
    out_.push_back(std::move(r));
    return out_.back();
  }
  void Append(std::vector<CheckResult> more) {
    for (CheckResult& r : more) out_.push_back(std::move(r));
  }
  static constexpr size_t kMaxChecks = 32;  // Add() calls per run, with room to spare

  static CheckStatus Pass(bool ok) { return ok ? CheckStatus::kPass : CheckStatus::kFail; }

  void Lost() {
    CheckResult& r = Add("gpu_lost", now_.lost ? CheckStatus::kFail : CheckStatus::kPass,
                         "any NVML call returns GPU_IS_LOST (15)",
                         "nvml.h return codes; XID catalog 79 RESTART_BM; DCGM devastating XIDs");
    r.action = Action::kRebootNode;
    r.clear = ClearRule::kOnReboot;
    r.debounce = 1;
    if (now_.lost) r.message = "the GPU has fallen off the bus (NVML: GPU is lost)";
  }

  void NvmlRead() {
    CheckStatus status = now_.unreadable       ? CheckStatus::kError
                         : !now_.error.empty() ? CheckStatus::kWarn
                                               : CheckStatus::kPass;
    CheckResult& r = Add("nvml_read", status, "every NVML reading answers (or says not supported)",
                         "fail closed: a GPU tau cannot read is not placed");
    r.message = now_.error;
    r.action = now_.unreadable ? Action::kResetGpu : Action::kWatch;
    // An unreadable GPU is Unknown at once; a stray error on one call must repeat.
    if (now_.unreadable) r.debounce = 1;
  }

  void RecoveryAction() {
    const auto& a = now_.recovery_action;
    CheckResult& r =
        Add("recovery_action", CheckStatus::kNotSupported,
            "1 GPU_RESET, 2 NODE_REBOOT, 4 DRAIN_AND_RESET → fail; 3 DRAIN_P2P, "
            "5 RECOVER_IMEX_DOMAIN → warn",
            "nvml.h nvmlGpuRecoveryAction_t; DCGM DRIVER watch (MonitorGpuRecoveryAction)");
    r.debounce = 1;  // the driver's own verdict is not noise
    if (!a) return;
    static const char* kNames[] = {"NONE",      "GPU_RESET",       "NODE_REBOOT",
                                   "DRAIN_P2P", "DRAIN_AND_RESET", "RECOVER_IMEX_DOMAIN"};
    r.message = fmt::format("driver recovery action {} ({})", *a, *a < 6 ? kNames[*a] : "unknown");
    switch (*a) {
      case 0:
        r.status = CheckStatus::kPass;
        r.message.clear();
        break;
      case 1:
        r.status = CheckStatus::kFail;
        r.action = Action::kResetGpu;
        r.clear = ClearRule::kOnGpuReset;
        break;
      case 4:  // the GPU works on, degraded, until drained and reset
        r.status = CheckStatus::kFail;
        r.action = Action::kResetWhenIdle;
        r.clear = ClearRule::kOnGpuReset;
        break;
      case 2:
        r.status = CheckStatus::kFail;
        r.action = Action::kRebootNode;
        r.clear = ClearRule::kOnReboot;
        break;
      default:
        r.status = CheckStatus::kWarn;
        r.action = Action::kWatch;
        break;
    }
  }

  void Ecc() {
    CheckResult& dbe = Add("ecc_dbe_volatile", CheckStatus::kNotSupported,
                           fmt::format("volatile DBE count > {}", t_.ecc_dbe_volatile_max),
                           fmt::format("{}: volatile DBE > 0 = FAIL", kSrcDcgmMem));
    dbe.action = Action::kResetGpu;
    dbe.clear = ClearRule::kOnGpuReset;  // the volatile counter itself restarts at a reset
    dbe.debounce = 1;
    if (now_.ecc_dbe_volatile) {
      dbe.status = Pass(*now_.ecc_dbe_volatile <= t_.ecc_dbe_volatile_max);
      if (dbe.status != CheckStatus::kPass) {
        dbe.message = fmt::format("{} uncorrected (double-bit) ECC error{} since the driver loaded",
                                  *now_.ecc_dbe_volatile, *now_.ecc_dbe_volatile == 1 ? "" : "s");
      }
    }
    CheckResult& agg =
        Add("ecc_aggregate", CheckStatus::kNotSupported,
            fmt::format("lifetime corrected or uncorrected DRAM ECC > {}", t_.ecc_aggregate_max),
            fmt::format("{} (DRAM threshold 2e7)", kSrcAzureEcc));
    agg.action = Action::kHardware;
    agg.clear = ClearRule::kOnReboot;
    agg.debounce = 1;
    if (now_.ecc_sbe_aggregate || now_.ecc_dbe_aggregate) {
      uint64_t sbe = now_.ecc_sbe_aggregate.value_or(0);
      uint64_t dbe_total = now_.ecc_dbe_aggregate.value_or(0);
      agg.status = Pass(sbe <= t_.ecc_aggregate_max && dbe_total <= t_.ecc_aggregate_max);
      if (agg.status != CheckStatus::kPass) {
        agg.message = fmt::format("lifetime ECC: {} corrected, {} uncorrected", sbe, dbe_total);
      }
    }
    CheckResult& pending = Add("ecc_mode_pending", CheckStatus::kNotSupported,
                               "ECC mode current ≠ pending (a reset is needed to apply it)",
                               "DCGM r1 software checks; NVML pending-mode semantics");
    pending.action = Action::kResetWhenIdle;
    if (now_.ecc_enabled && now_.ecc_pending) {
      pending.status =
          *now_.ecc_enabled == *now_.ecc_pending ? CheckStatus::kPass : CheckStatus::kWarn;
      if (pending.status == CheckStatus::kWarn) {
        pending.message =
            fmt::format("ECC is {} and will be {} after a GPU reset",
                        *now_.ecc_enabled ? "on" : "off", *now_.ecc_pending ? "on" : "off");
      }
    }
  }

  // What each memory-repair verdict makes tau do, said in every reason.
  static constexpr const char* kReplace =
      "work is taken off the GPU now and it stays out until it is replaced (RMA)";
  static constexpr const char* kResetToApply =
      "reset the GPU to apply it; work is kept off it until then (running work finishes)";

  // Page retirement is how GPUs before Ampere repair memory; row remapping (below) replaced it, so
  // a GPU answers one or the other and the checks of the other report not supported.
  void RetiredPages() {
    CheckResult& count =
        Add("retired_pages", CheckStatus::kNotSupported,
            fmt::format("retired pages (SBE + DBE) ≥ {}", t_.retired_pages_max),
            fmt::format("{}: DCGM_LIMIT_MAX_RETIRED_PAGES; {} row 13", kSrcDcgmMem, kSrcRef));
    count.action = Action::kHardware;
    count.clear = ClearRule::kOnReboot;
    count.debounce = 1;
    unsigned sbe = now_.retired_pages_sbe.value_or(0);
    unsigned dbe = now_.retired_pages_dbe.value_or(0);
    if (now_.retired_pages_sbe || now_.retired_pages_dbe) {
      unsigned total = sbe + dbe;
      count.status = Pass(total < t_.retired_pages_max);
      if (total >= t_.retired_pages_max) {
        count.message = fmt::format(
            "{} retired pages ({} for repeated single-bit errors, {} for double-bit errors), at or "
            "above the limit of {}: {}",
            total, sbe, dbe, t_.retired_pages_max, kReplace);
      }
    }
    CheckResult& recent = Add(
        "retired_pages_dbe", CheckStatus::kNotSupported,
        fmt::format("DBE retired pages > {} and more than {} of them retired in the last {} days",
                    t_.retired_pages_dbe_soft_max, t_.retired_pages_dbe_recent_max,
                    t_.retired_pages_dbe_window_ms / 86'400'000),
        fmt::format("{}: DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT; {} row 13", kSrcDcgmMem,
                    kSrcRef));
    recent.action = Action::kHardware;
    recent.clear = ClearRule::kOnReboot;
    recent.debounce = 1;
    if (now_.retired_pages_dbe) {
      if (dbe <= t_.retired_pages_dbe_soft_max) {
        recent.status = CheckStatus::kPass;
      } else if (now_.retired_pages_dbe_at_ms) {
        // Over the soft limit only a fast rate fails; without retirement times it cannot be told.
        unsigned in_window = 0;
        for (int64_t at : *now_.retired_pages_dbe_at_ms) {
          in_window += at <= now_.at_ms && now_.at_ms - at < t_.retired_pages_dbe_window_ms;
        }
        recent.status = Pass(in_window <= t_.retired_pages_dbe_recent_max);
        if (recent.status != CheckStatus::kPass) {
          recent.message = fmt::format(
              "{} pages retired for double-bit errors (soft limit {}), {} of them in the last {} "
              "days: {}",
              dbe, t_.retired_pages_dbe_soft_max, in_window,
              t_.retired_pages_dbe_window_ms / 86'400'000, kReplace);
        }
      }
    }
    CheckResult& pending =
        Add("retired_pages_pending", CheckStatus::kNotSupported,
            "a page retirement is pending (applies at the next reset)",
            fmt::format("{} row 13 (pending → RESET); DCGM MEM (WARN)", kSrcRef));
    pending.action = Action::kResetWhenIdle;
    pending.clear = ClearRule::kOnGpuReset;
    pending.debounce = 1;
    if (now_.retired_pages_pending) {
      pending.status = Pass(!*now_.retired_pages_pending);
      if (*now_.retired_pages_pending) {
        pending.message = fmt::format("page retirement pending: {}", kResetToApply);
      }
    }
  }

  // Row remapping (Ampere and later). A pending remap is a repair that a reset applies: the GPU is
  // drained and reset, not replaced. A failed remap, or too many rows remapped for uncorrectable
  // errors, means the memory cannot be repaired any more: replace. Correctable remapped rows have
  // no limit in any source and change nothing.
  void RowRemap() {
    const auto& m = now_.remap;
    CheckResult& failed =
        Add("row_remap_failure", CheckStatus::kNotSupported, "row remapping failed (sticky)",
            fmt::format("{}: ROW_REMAP_FAILED > 0 = FAIL; {}; {} row 11", kSrcDcgmMem, kSrcAzureEcc,
                        kSrcRef));
    failed.action = Action::kHardware;
    failed.clear = ClearRule::kOnReboot;
    failed.debounce = 1;
    CheckResult& pending =
        Add("row_remap_pending", CheckStatus::kNotSupported,
            "a row remap is pending (a GPU reset applies it)",
            fmt::format("nvml doc (reset required); {} (pending > 0 fails); {} row 10",
                        kSrcAzureEcc, kSrcRef));
    pending.action = Action::kResetWhenIdle;
    pending.clear = ClearRule::kOnGpuReset;
    pending.debounce = 1;
    CheckResult& unc =
        Add("row_remap_uncorrectable", CheckStatus::kNotSupported,
            fmt::format("uncorrectable remapped rows ≥ {}", t_.remapped_rows_uncorrectable_max),
            fmt::format("DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE (DcgmGPUHardwareLimits.h; DCGM "
                        "warns); {} row 12 (hardware)",
                        kSrcRef));
    unc.action = Action::kHardware;
    unc.clear = ClearRule::kOnReboot;
    unc.debounce = 1;
    if (!m) return;
    std::string rows =
        fmt::format("{} row{} remapped for uncorrectable errors, {} for correctable",
                    m->uncorrected_rows, m->uncorrected_rows == 1 ? "" : "s", m->corrected_rows);
    failed.status = Pass(!m->failed);
    if (m->failed) {
      failed.message = fmt::format(
          "row remapping failed ({}): the GPU has memory it cannot repair; {}", rows, kReplace);
    }
    pending.status = Pass(!m->pending);
    if (m->pending) {
      pending.message = fmt::format("row remapping pending ({}): {}", rows, kResetToApply);
    }
    unc.status = Pass(m->uncorrected_rows < t_.remapped_rows_uncorrectable_max);
    if (unc.status != CheckStatus::kPass) {
      unc.message = fmt::format(
          "{} rows remapped for uncorrectable errors, at or above the limit of "
          "{}: {}",
          m->uncorrected_rows, t_.remapped_rows_uncorrectable_max, kReplace);
    }
  }

  void Temperature() {
    CheckResult& r =
        Add("temperature", CheckStatus::kNotSupported,
            fmt::format("warn at ≥ slowdown − {} °C; fail at ≥ shutdown − {} °C",
                        t_.temperature_slowdown_margin_c, t_.temperature_shutdown_margin_c),
            fmt::format("{} row 18 (NVML temperature thresholds; DCGM THERMAL watch)", kSrcRef));
    r.action = Action::kWatch;
    if (!now_.temperature_c || (!now_.temperature_slowdown_c && !now_.temperature_shutdown_c))
      return;
    int temp = int(*now_.temperature_c);
    r.status = CheckStatus::kPass;
    if (now_.temperature_shutdown_c &&
        temp >= int(*now_.temperature_shutdown_c) - t_.temperature_shutdown_margin_c) {
      r.status = CheckStatus::kFail;
      r.action = Action::kHardware;  // cooling
      r.message = fmt::format("{} °C, shutdown at {} °C", temp, *now_.temperature_shutdown_c);
    } else if (now_.temperature_slowdown_c &&
               temp >= int(*now_.temperature_slowdown_c) - t_.temperature_slowdown_margin_c) {
      r.status = CheckStatus::kWarn;
      r.message = fmt::format("{} °C, slowdown at {} °C", temp, *now_.temperature_slowdown_c);
    }
  }

  void Throttle() {
    const char* src =
        "Azure check_gpu_clock_throttling; AKS GPUClockThrottling; tau reference §5 "
        "row 19";
    CheckResult& thermal =
        Add("thermal_slowdown", CheckStatus::kNotSupported,
            fmt::format("HW slowdown (0x8) or HW thermal slowdown (0x40) active "
                        "in {} consecutive samples → warn; > {} → fail",
                        t_.throttle_debounce, FormatMinutes(t_.throttle_unhealthy_after_ms)),
            src);
    CheckResult& brake =
        Add("power_brake", CheckStatus::kNotSupported,
            fmt::format("HW power brake slowdown (0x80) active in {} consecutive "
                        "samples → warn; > {} → fail",
                        t_.throttle_debounce, FormatMinutes(t_.throttle_unhealthy_after_ms)),
            src);
    for (CheckResult* r : {&thermal, &brake}) {
      r->action = Action::kWatch;
      r->debounce = t_.throttle_debounce;
      r->escalate_after_ms = t_.throttle_unhealthy_after_ms;
    }
    if (!now_.clocks_event_reasons) return;
    uint64_t bits = *now_.clocks_event_reasons;
    uint64_t thermal_bits = bits & (nvml::kClocksHwSlowdown | nvml::kClocksHwThermal);
    thermal.status = thermal_bits ? CheckStatus::kWarn : CheckStatus::kPass;
    if (thermal_bits) {
      thermal.message = fmt::format("clocks held back: reasons 0x{:x}{}{}", bits,
                                    bits & nvml::kClocksHwSlowdown ? " HwSlowdown" : "",
                                    bits & nvml::kClocksHwThermal ? " HwThermalSlowdown" : "");
    }
    brake.status = bits & nvml::kClocksHwPowerBrake ? CheckStatus::kWarn : CheckStatus::kPass;
    if (brake.status == CheckStatus::kWarn) {
      brake.message = fmt::format("power brake engaged: reasons 0x{:x}", bits);
    }
  }

  static std::string FormatMinutes(int64_t ms) { return fmt::format("{} min", ms / 60000); }

  void Power() {
    CheckResult& r =
        Add("power", CheckStatus::kNotSupported,
            fmt::format("INSUFFICIENT_POWER (8) → fail; enforced limit < {:.0f}% of the "
                        "default limit → warn",
                        t_.power_limit_min_fraction * 100),
            fmt::format("{} row 20; nvml.h return codes; XID 54 CHECK_MECHANICALS", kSrcRef));
    r.action = Action::kWatch;
    if (now_.insufficient_power) {
      r.status = CheckStatus::kFail;
      r.action = Action::kHardware;
      r.clear = ClearRule::kOnReboot;
      r.debounce = 1;
      r.message = "NVML reports insufficient power: check the power cables";
      return;
    }
    if (!now_.power_limit_mw || !now_.power_default_limit_mw || *now_.power_default_limit_mw == 0) {
      return;
    }
    double fraction = double(*now_.power_limit_mw) / double(*now_.power_default_limit_mw);
    r.status = fraction < t_.power_limit_min_fraction ? CheckStatus::kWarn : CheckStatus::kPass;
    if (r.status == CheckStatus::kWarn) {
      r.message = fmt::format("power limit {} W of a default {} W", *now_.power_limit_mw / 1000,
                              *now_.power_default_limit_mw / 1000);
    }
  }

  void Pcie() {
    CheckResult& width =
        Add("pcie_width", CheckStatus::kNotSupported, "current PCIe link width < maximum width",
            fmt::format("{} row 14 (NVIDIA health-validation PCIe checks)", kSrcRef));
    width.action = Action::kHardware;
    width.clear = ClearRule::kOnGpuReset;  // a reset retrains the link
    if (now_.pcie_width && now_.pcie_width_max) {
      width.status = Pass(*now_.pcie_width >= *now_.pcie_width_max);
      if (width.status != CheckStatus::kPass) {
        width.message = fmt::format("PCIe link x{} of x{}", *now_.pcie_width, *now_.pcie_width_max);
      }
    }
    CheckResult& gen =
        Add("pcie_gen", CheckStatus::kNotSupported,
            "current PCIe generation < maximum while not idle (P0..P7)",
            fmt::format("{} row 14: links down-train at idle, so only under load", kSrcRef));
    gen.action = Action::kWatch;
    if (now_.pcie_gen && now_.pcie_gen_max) {
      // Without a P-state, utilisation tells whether the GPU is busy.
      bool busy = now_.pstate ? *now_.pstate < 8 : now_.gpu_util_pct.value_or(0) > 0;
      gen.status =
          busy && *now_.pcie_gen < *now_.pcie_gen_max ? CheckStatus::kWarn : CheckStatus::kPass;
      if (gen.status == CheckStatus::kWarn) {
        gen.message =
            fmt::format("PCIe Gen{} of Gen{} under load", *now_.pcie_gen, *now_.pcie_gen_max);
      }
    }
    CheckResult& replay = Add("pcie_replay", CheckStatus::kNotSupported,
                              "PCIe replays per minute > ceil(rate[gen] × lanes) (Gen4 x16: 16, "
                              "Gen5 x16: 31)",
                              "DCGM PCIE watch (GetExpectedPcieReplayRate, BER 1e-12)");
    replay.action = Action::kWatch;
    replay.debounce = 1;
    const GpuSample* w = window_;
    if (w && now_.pcie_replay_counter && w->pcie_replay_counter && now_.pcie_gen &&
        now_.pcie_width && now_.at_ms > w->at_ms) {
      static constexpr double kPerLanePerMinute[] = {0, 0.15, 0.3, 0.48, 0.96, 1.92, 3.84};
      unsigned g = std::min(*now_.pcie_gen, 6u);
      double allowed = std::ceil(kPerLanePerMinute[g] * *now_.pcie_width);
      double rise = *now_.pcie_replay_counter >= *w->pcie_replay_counter
                        ? double(*now_.pcie_replay_counter - *w->pcie_replay_counter)
                        : 0.0;
      // DCGM compares the rise over a full minute. Over a shorter history the rise itself is all
      // that is known of the last minute: never extrapolated from a few seconds.
      int64_t span = now_.at_ms - w->at_ms;
      double per_minute = span >= 60'000 ? rise * 60000.0 / double(span) : rise;
      replay.status = per_minute > allowed ? CheckStatus::kWarn : CheckStatus::kPass;
      if (replay.status == CheckStatus::kWarn) {
        replay.message = fmt::format("{:.0f} PCIe replays/min over the last {} s (allowed {:.0f})",
                                     per_minute, span / 1000, allowed);
      }
    }
  }

  void NvLink() {
    CheckResult& inactive = Add("nvlink_inactive", CheckStatus::kNotSupported,
                                fmt::format("inactive NVLink links > {}", t_.nvlink_inactive_max),
                                "Azure check_nvlink_status; AKS NVLinkStatusInactive; "
                                "health-validation max_inactive_nvlinks=0");
    inactive.action = Action::kHardware;
    inactive.clear = ClearRule::kOnReboot;
    CheckResult& errors = Add("nvlink_errors", CheckStatus::kNotSupported,
                              fmt::format("replay/recovery/CRC counter rise > {} per pass → warn; "
                                          "CRC ≥ {:.0f}/s → fail",
                                          t_.nvlink_error_delta_max, t_.nvlink_crc_per_second_max),
                              "DCGM NVLINK watch: DCGM_LIMIT_MAX_NVLINK_ERROR=1, "
                              "DCGM_LIMIT_MAX_NVLINK_CRC_ERROR=100/s");
    errors.action = Action::kWatch;
    errors.debounce = 1;  // counters are facts, not noise
    if (now_.nvlinks.empty()) return;
    unsigned down = 0;
    std::string which;
    for (const NvLinkSample& l : now_.nvlinks) {
      if (l.active) continue;
      ++down;
      which += fmt::format("{}{}", which.empty() ? "" : ",", l.link);
    }
    inactive.status = Pass(down <= t_.nvlink_inactive_max);
    if (down > t_.nvlink_inactive_max) {
      inactive.message = fmt::format("{} of {} NVLink links inactive (links {})", down,
                                     now_.nvlinks.size(), which);
    }
    if (!prev_) {
      errors.status = CheckStatus::kPass;
      return;
    }
    auto delta = [](const std::optional<uint64_t>& a, const std::optional<uint64_t>& b) {
      return a && b && *a > *b ? *a - *b : uint64_t{0};
    };
    // Any rise since the last pass warns; the CRC rate that fails is averaged over the window (at
    // least rate_window_ms), as DCGM rates it, so a sub-second burst does not take a GPU out.
    auto rises = [&](const GpuSample& from, uint64_t* other, uint64_t* crc) {
      for (const NvLinkSample& l : now_.nvlinks)
        for (const NvLinkSample& p : from.nvlinks) {
          if (p.link != l.link) continue;
          *other += delta(l.replay, p.replay) + delta(l.recovery, p.recovery);
          *crc += delta(l.crc_flit, p.crc_flit) + delta(l.crc_data, p.crc_data);
        }
    };
    uint64_t rise = 0, crc_rise = 0, window_other = 0, window_crc = 0;
    rises(*prev_, &rise, &crc_rise);
    rises(*window_, &window_other, &window_crc);
    int64_t span = std::max<int64_t>(now_.at_ms - window_->at_ms, t_.rate_window_ms);
    double crc_rate = double(window_crc) / (double(std::max<int64_t>(span, 1)) / 1000.0);
    if (crc_rate >= t_.nvlink_crc_per_second_max) {
      errors.status = CheckStatus::kFail;
      errors.action = Action::kHardware;
      errors.clear = ClearRule::kOnReboot;
      errors.debounce = 0;  // a rate: must hold for the policy's debounce
      errors.message =
          fmt::format("NVLink CRC errors at {:.0f}/s over the last {} s", crc_rate, span / 1000);
    } else if (rise + crc_rise > t_.nvlink_error_delta_max) {
      errors.status = CheckStatus::kWarn;
      errors.message = fmt::format("NVLink error counters rose by {} (replay/recovery {}, CRC {})",
                                   rise + crc_rise, rise, crc_rise);
    } else {
      errors.status = CheckStatus::kPass;
    }
  }

  void Inforom() {
    CheckResult& r = Add("inforom", CheckStatus::kNotSupported,
                         "nvmlDeviceValidateInforom returns CORRUPTED_INFOROM (14)",
                         "DCGM INFOROM watch (WARN)");
    r.action = Action::kHardware;
    if (!now_.inforom_valid) return;
    r.status = *now_.inforom_valid ? CheckStatus::kPass : CheckStatus::kWarn;
    if (!*now_.inforom_valid)
      r.message = "the InfoROM is corrupted: replace at the next maintenance";
  }

  void Mig() {
    CheckResult& none = Add("mig_no_instances", CheckStatus::kNotSupported,
                            "MIG enabled and no MIG instance exists",
                            "NVML MIG semantics: with MIG on, CUDA sees only MIG devices, so NVML "
                            "lists a GPU that no program can use");
    none.action = Action::kFixConfig;
    none.debounce = 1;  // fail closed at once: nothing can run there
    if (now_.mig_enabled) {
      bool unusable = *now_.mig_enabled && now_.mig_instances.value_or(0) == 0;
      none.status = Pass(!unusable);
      if (unusable) {
        none.message = "MIG is enabled but no GPU instance exists: create instances or disable MIG";
      }
    }
    CheckResult& pending = Add("mig_mode_pending", CheckStatus::kNotSupported,
                               "MIG mode current ≠ pending (a GPU reset is needed to apply it)",
                               fmt::format("{} row 22 (NVML pending-mode semantics)", kSrcRef));
    pending.action = Action::kResetWhenIdle;
    if (now_.mig_enabled && now_.mig_pending) {
      pending.status =
          *now_.mig_enabled == *now_.mig_pending ? CheckStatus::kPass : CheckStatus::kWarn;
      if (pending.status == CheckStatus::kWarn) {
        pending.message =
            fmt::format("MIG is {} and will be {} after a GPU reset",
                        *now_.mig_enabled ? "on" : "off", *now_.mig_pending ? "on" : "off");
      }
    }
  }

  const GpuSample& now_;
  const GpuSample* prev_;
  const GpuSample* window_;  // where the rate window begins
  const Thresholds& t_;
  std::vector<CheckResult> out_;
};

}  // namespace

std::vector<CheckResult> CheckXids(int gpu_index, const std::vector<XidEvent>& xids) {
  std::vector<CheckResult> out;
  for (const XidEvent& e : xids) {
    XidClass c = ClassifyXid(e.xid);
    CheckResult r;
    r.gpu_index = gpu_index;
    r.check = fmt::format("xid_{}", e.xid);
    r.status = c.status;
    r.action = c.action;
    r.clear = c.clear;
    r.message = fmt::format("XID {} ({})", e.xid, c.mnemonic);
    r.threshold = "any occurrence, classified by the XID table";
    r.source = c.source;
    r.debounce = 1;
    r.xid = e.xid;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<CheckResult> RunPassiveChecks(const GpuSample& now, const GpuSample* previous,
                                          const Thresholds& thresholds,
                                          const GpuSample* window_start) {
  return Checks(now, previous, window_start, thresholds).Run();
}

}  // namespace tau::health
