// One polling pass's NVML readings for one GPU. Every reading is optional: an older driver (missing
// symbol) or a GPU that cannot tell (NOT_SUPPORTED) leaves it empty, and the checks skip it.
#include <fmt/format.h>

#include "health/health.h"
#include "health/nvml.h"

namespace tau::health {
namespace {

class Reader {
 public:
  Reader(const Nvml& nvml, GpuSample* sample) : nvml_(nvml), s_(sample) {}

  // True when `rc` is success; otherwise records why not (lost, not supported, error).
  bool Ok(nvml::Return rc, const char* call) {
    if (rc == nvml::kSuccess) return true;
    if (rc == nvml::kErrorGpuIsLost) {
      s_->lost = true;
    } else if (nvml::Unsupported(rc) || rc == nvml::kErrorNoPermission) {
      s_->not_supported.push_back(call);
    } else if (rc == nvml::kErrorInsufficientPower) {
      s_->insufficient_power = true;
    } else if (s_->error.empty()) {
      s_->error = fmt::format("{}: {}", call, nvml_.ErrorString(rc));
    }
    return false;
  }

 private:
  const Nvml& nvml_;
  GpuSample* s_;
};

void ReadNvLinks(const nvml::Functions& f, nvml::Device dev, Reader& r, GpuSample& s) {
  for (unsigned link = 0; link < nvml::kNvLinkMaxLinks; ++link) {
    int active = 0;
    nvml::Return rc = Nvml::Call(f.nvlink_state, dev, link, &active);
    // Links past the GPU's last one answer INVALID_ARGUMENT; a GPU without NVLink, NOT_SUPPORTED.
    if (rc == nvml::kErrorInvalidArgument) break;
    if (nvml::Unsupported(rc)) {
      if (link == 0) r.Ok(rc, "nvmlDeviceGetNvLinkState");
      if (link == 0) break;
      continue;
    }
    if (!r.Ok(rc, "nvmlDeviceGetNvLinkState")) return;
    NvLinkSample l;
    l.link = link;
    l.active = active == 1;
    auto counter = [&](int which) -> std::optional<uint64_t> {
      unsigned long long v = 0;
      nvml::Return crc = Nvml::Call(f.nvlink_error_counter, dev, link, which, &v);
      if (crc == nvml::kSuccess) return v;
      if (crc == nvml::kErrorGpuIsLost) s.lost = true;
      return std::nullopt;
    };
    if (l.active) {
      l.replay = counter(nvml::kNvLinkErrorReplay);
      l.recovery = counter(nvml::kNvLinkErrorRecovery);
      l.crc_flit = counter(nvml::kNvLinkErrorCrcFlit);
      l.crc_data = counter(nvml::kNvLinkErrorCrcData);
    }
    s.nvlinks.push_back(l);
    if (s.lost) return;
  }
}

}  // namespace

GpuSample ReadSample(const Nvml& nvml, nvml::Device dev, int index, const std::string& uuid,
                     int64_t now_ms, bool validate_inforom) {
  const nvml::Functions& f = nvml.fn();
  GpuSample s;
  s.index = index;
  s.uuid = uuid;
  s.at_ms = now_ms;
  if (!dev) {
    s.unreadable = true;
    s.error = "no NVML handle for this GPU";
    return s;
  }
  Reader r(nvml, &s);

  // Memory first: it is the essential reading, and the cheapest way to learn that the GPU is gone.
  nvml::Memory mem{};
  nvml::Return mem_rc = Nvml::Call(f.memory_info, dev, &mem);
  if (r.Ok(mem_rc, "nvmlDeviceGetMemoryInfo")) {
    s.memory_total_bytes = mem.total;
    s.memory_used_bytes = mem.used;
  } else if (!s.lost && !nvml::Unsupported(mem_rc)) {
    s.unreadable = true;
  }
  if (s.lost) return s;

  nvml::Utilization util{};
  if (r.Ok(Nvml::Call(f.utilization, dev, &util), "nvmlDeviceGetUtilizationRates")) {
    s.gpu_util_pct = util.gpu;
    s.memory_util_pct = util.memory;
  }
  // Temperature: the versioned call when the driver has it, else the older (deprecated) one.
  if (f.temperature_v) {
    nvml::Temperature t{nvml::kTemperatureV1Version, unsigned(nvml::kTemperatureGpu), 0};
    if (r.Ok(f.temperature_v(dev, &t), "nvmlDeviceGetTemperatureV") && t.temperature >= 0) {
      s.temperature_c = unsigned(t.temperature);
    }
  } else {
    unsigned t = 0;
    if (r.Ok(Nvml::Call(f.temperature, dev, nvml::kTemperatureGpu, &t),
             "nvmlDeviceGetTemperature")) {
      s.temperature_c = t;
    }
  }
  unsigned v = 0;
  if (r.Ok(Nvml::Call(f.temperature_threshold, dev, nvml::kTempThresholdSlowdown, &v),
           "nvmlDeviceGetTemperatureThreshold")) {
    s.temperature_slowdown_c = v;
  }
  if (r.Ok(Nvml::Call(f.temperature_threshold, dev, nvml::kTempThresholdShutdown, &v),
           "nvmlDeviceGetTemperatureThreshold")) {
    s.temperature_shutdown_c = v;
  }
  if (s.lost) return s;
  if (r.Ok(Nvml::Call(f.power_usage, dev, &v), "nvmlDeviceGetPowerUsage")) s.power_mw = v;
  if (r.Ok(Nvml::Call(f.enforced_power_limit, dev, &v), "nvmlDeviceGetEnforcedPowerLimit")) {
    s.power_limit_mw = v;
  }
  if (r.Ok(Nvml::Call(f.power_default_limit, dev, &v),
           "nvmlDeviceGetPowerManagementDefaultLimit")) {
    s.power_default_limit_mw = v;
  }
  if (r.Ok(Nvml::Call(f.clock_info, dev, nvml::kClockSm, &v), "nvmlDeviceGetClockInfo")) {
    s.sm_clock_mhz = v;
  }
  if (r.Ok(Nvml::Call(f.clock_info, dev, nvml::kClockMem, &v), "nvmlDeviceGetClockInfo")) {
    s.memory_clock_mhz = v;
  }
  int pstate = 0;
  if (r.Ok(Nvml::Call(f.performance_state, dev, &pstate), "nvmlDeviceGetPerformanceState") &&
      pstate >= 0 && pstate <= 15) {
    s.pstate = unsigned(pstate);
  }
  unsigned long long reasons = 0;
  if (r.Ok(Nvml::Call(f.clocks_event_reasons, dev, &reasons),
           "nvmlDeviceGetCurrentClocksEventReasons")) {
    s.clocks_event_reasons = reasons;
  }
  if (s.lost) return s;

  // ECC. The totals need ECC mode on; otherwise NVML answers NOT_SUPPORTED.
  int ecc_current = 0, ecc_pending = 0;
  if (r.Ok(Nvml::Call(f.ecc_mode, dev, &ecc_current, &ecc_pending), "nvmlDeviceGetEccMode")) {
    s.ecc_enabled = ecc_current == 1;
    s.ecc_pending = ecc_pending == 1;
  }
  auto ecc = [&](int type, int counter) -> std::optional<uint64_t> {
    unsigned long long n = 0;
    if (r.Ok(Nvml::Call(f.total_ecc_errors, dev, type, counter, &n),
             "nvmlDeviceGetTotalEccErrors")) {
      return n;
    }
    return std::nullopt;
  };
  if (!s.ecc_enabled.has_value() || *s.ecc_enabled) {
    s.ecc_dbe_volatile = ecc(nvml::kMemoryErrorUncorrected, nvml::kEccVolatile);
    s.ecc_sbe_volatile = ecc(nvml::kMemoryErrorCorrected, nvml::kEccVolatile);
    s.ecc_dbe_aggregate = ecc(nvml::kMemoryErrorUncorrected, nvml::kEccAggregate);
    s.ecc_sbe_aggregate = ecc(nvml::kMemoryErrorCorrected, nvml::kEccAggregate);
  }
  if (s.lost) return s;

  // Page retirement (Kepler..Volta): a zero-sized query returns the count (INSUFFICIENT_SIZE when
  // the buffer would be needed).
  auto retired = [&](int cause) -> std::optional<unsigned> {
    unsigned count = 0;
    nvml::Return rc =
        Nvml::Call(f.retired_pages, dev, cause, &count, static_cast<unsigned long long*>(nullptr));
    if (rc == nvml::kSuccess || rc == nvml::kErrorInsufficientSize) return count;
    r.Ok(rc, "nvmlDeviceGetRetiredPages");
    return std::nullopt;
  };
  s.retired_pages_sbe = retired(nvml::kRetiredMultipleSbe);
  s.retired_pages_dbe = retired(nvml::kRetiredDbe);
  int pending = 0;
  if (r.Ok(Nvml::Call(f.retired_pages_pending, dev, &pending),
           "nvmlDeviceGetRetiredPagesPendingStatus")) {
    s.retired_pages_pending = pending == 1;
  }
  // Row remapping (Ampere+; NOT_SUPPORTED while MIG is on).
  unsigned cor = 0, unc = 0, rpending = 0, failed = 0;
  if (r.Ok(Nvml::Call(f.remapped_rows, dev, &cor, &unc, &rpending, &failed),
           "nvmlDeviceGetRemappedRows")) {
    s.remap = RemapSample{cor, unc, rpending != 0, failed != 0};
  }
  if (s.lost) return s;

  // PCIe.
  if (r.Ok(Nvml::Call(f.pcie_gen, dev, &v), "nvmlDeviceGetCurrPcieLinkGeneration")) s.pcie_gen = v;
  if (r.Ok(Nvml::Call(f.pcie_gen_max, dev, &v), "nvmlDeviceGetMaxPcieLinkGeneration")) {
    s.pcie_gen_max = v;
  }
  if (r.Ok(Nvml::Call(f.pcie_width, dev, &v), "nvmlDeviceGetCurrPcieLinkWidth")) s.pcie_width = v;
  if (r.Ok(Nvml::Call(f.pcie_width_max, dev, &v), "nvmlDeviceGetMaxPcieLinkWidth")) {
    s.pcie_width_max = v;
  }
  if (r.Ok(Nvml::Call(f.pcie_replay_counter, dev, &v), "nvmlDeviceGetPcieReplayCounter")) {
    s.pcie_replay_counter = v;
  }
  if (s.lost) return s;

  ReadNvLinks(f, dev, r, s);
  if (s.lost) return s;

  // The driver's own recovery verdict (r555+), through the field-value API.
  nvml::FieldValue fv{};
  fv.field_id = nvml::kFieldGpuRecoveryAction;
  if (r.Ok(Nvml::Call(f.field_values, dev, 1, &fv), "nvmlDeviceGetFieldValues")) {
    if (fv.nvml_return == unsigned(nvml::kSuccess)) {
      s.recovery_action = fv.value_type == 3 ? unsigned(fv.value.ull) : fv.value.ui;
    } else {
      r.Ok(int(fv.nvml_return), "GPU_RECOVERY_ACTION field");
    }
  }
  nvml::Return inforom = validate_inforom ? Nvml::Call(f.validate_inforom, dev) : nvml::kSuccess;
  if (!validate_inforom) {
    // Left empty: the monitor carries the last validation forward.
  } else if (inforom == nvml::kErrorCorruptedInforom) {
    s.inforom_valid = false;
  } else if (r.Ok(inforom, "nvmlDeviceValidateInforom")) {
    s.inforom_valid = true;
  }
  if (s.lost) return s;

  // MIG: with MIG on, CUDA sees only MIG devices, so a MIG GPU without instances is unusable.
  unsigned mig_current = 0, mig_pending = 0;
  if (r.Ok(Nvml::Call(f.mig_mode, dev, &mig_current, &mig_pending), "nvmlDeviceGetMigMode")) {
    s.mig_enabled = mig_current == 1;
    s.mig_pending = mig_pending == 1;
    unsigned max = 0;
    if (*s.mig_enabled &&
        r.Ok(Nvml::Call(f.max_mig_device_count, dev, &max), "nvmlDeviceGetMaxMigDeviceCount")) {
      unsigned n = 0;
      for (unsigned i = 0; i < max; ++i) {
        nvml::Device mig = nullptr;
        // Empty slots answer NOT_FOUND.
        if (Nvml::Call(f.mig_device_by_index, dev, i, &mig) == nvml::kSuccess) ++n;
      }
      s.mig_instances = n;
    }
  }
  return s;
}

}  // namespace tau::health
