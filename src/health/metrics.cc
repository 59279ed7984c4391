// dcgm-exporter style Prometheus text, so that dashboards built for dcgm-exporter work with tau.
// Metric names and units follow dcgm-exporter's default-counters.csv. Its label names (UUID,
// modelName, Hostname) are written in snake_case here (uuid, model_name, hostname), and its
// device-reported totals are gauges, so the output passes `promtool check metrics`; a dashboard
// built for dcgm-exporter needs only those label names changed.
#include <fmt/format.h>

#include <functional>

#include "health/health.h"

namespace tau::health {
namespace {

std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

struct Metric {
  const char* name;
  const char* type;
  const char* help;
  // The value for one GPU, or nullopt to leave the GPU out.
  std::function<std::optional<double>(const GpuSample&, const GpuVerdict*)> value;
};

template <typename T>
std::optional<double> D(const std::optional<T>& v) {
  return v ? std::optional<double>(double(*v)) : std::nullopt;
}

const std::vector<Metric>& Metrics() {
  static const std::vector<Metric> kMetrics = {
      {"DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.sm_clock_mhz); }},
      {"DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.memory_clock_mhz); }},
      {"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.temperature_c); }},
      {"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         if (!s.power_mw) return std::nullopt;
         return double(*s.power_mw) / 1000.0;
       }},
      // dcgm-exporter's DCGM_FI_DEV_PCIE_REPLAY_COUNTER: a name with a type in it fails promtool.
      {"tau_gpu_pcie_replays_total", "counter", "Total number of PCIe retries.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.pcie_replay_counter); }},
      {"DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe link generation.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.pcie_gen); }},
      {"DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe link width (lanes).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.pcie_width); }},
      {"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.gpu_util_pct); }},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.memory_util_pct); }},
      {"DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
       [](const GpuSample& s, const GpuVerdict*) { return std::optional<double>(s.last_xid); }},
      {"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         if (!s.memory_total_bytes || !s.memory_used_bytes) return std::nullopt;
         return double((*s.memory_total_bytes - *s.memory_used_bytes) >> 20);
       }},
      {"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         if (!s.memory_used_bytes) return std::nullopt;
         return double(*s.memory_used_bytes >> 20);
       }},
      {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
       "Current clock event (throttle) reasons bit mask.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.clocks_event_reasons); }},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "gauge", "Total single-bit volatile ECC errors.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.ecc_sbe_volatile); }},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gauge", "Total double-bit volatile ECC errors.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.ecc_dbe_volatile); }},
      {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "gauge", "Total single-bit persistent ECC errors.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.ecc_sbe_aggregate); }},
      {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "gauge", "Total double-bit persistent ECC errors.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.ecc_dbe_aggregate); }},
      {"DCGM_FI_DEV_RETIRED_SBE", "gauge", "Total pages retired for single-bit errors.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.retired_pages_sbe); }},
      {"DCGM_FI_DEV_RETIRED_DBE", "gauge", "Total pages retired for double-bit errors.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.retired_pages_dbe); }},
      {"DCGM_FI_DEV_RETIRED_PENDING", "gauge", "Page retirement pending (1) or not (0).",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.retired_pages_pending); }},
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "gauge",
       "Number of remapped rows for uncorrectable errors.",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         return s.remap ? std::optional<double>(s.remap->uncorrected_rows) : std::nullopt;
       }},
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "gauge",
       "Number of remapped rows for correctable errors.",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         return s.remap ? std::optional<double>(s.remap->corrected_rows) : std::nullopt;
       }},
      {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed.",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         return s.remap ? std::optional<double>(s.remap->failed) : std::nullopt;
       }},
      {"DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap is pending (reset needed).",
       [](const GpuSample& s, const GpuVerdict*) -> std::optional<double> {
         return s.remap ? std::optional<double>(s.remap->pending) : std::nullopt;
       }},
      {"DCGM_FI_DEV_GPU_RECOVERY_ACTION", "gauge", "The driver's recommended recovery action.",
       [](const GpuSample& s, const GpuVerdict*) { return D(s.recovery_action); }},
      {"tau_gpu_health", "gauge", "tau's verdict: 0 Healthy, 1 Degraded, 2 Unhealthy, 3 Unknown.",
       [](const GpuSample&, const GpuVerdict* v) -> std::optional<double> {
         return double(v ? int(v->verdict) : int(Verdict::kUnknown));
       }},
      {"tau_gpu_lost", "gauge", "1 when the GPU has fallen off the bus.",
       [](const GpuSample& s, const GpuVerdict*) { return std::optional<double>(s.lost); }},
  };
  return kMetrics;
}

}  // namespace

std::string RenderMetrics(const HealthSnapshot& snap, const std::string& hostname) {
  std::vector<std::string> labels;
  for (size_t i = 0; i < snap.inventory.devices.size(); ++i) {
    const GpuDevice& d = snap.inventory.devices[i];
    std::string l =
        fmt::format(R"(gpu="{}",uuid="{}",pci_bus_id="{}",device="nvidia{}",model_name="{}")",
                    d.index, Escape(d.uuid), Escape(d.pci_bus_id),
                    d.minor_number >= 0 ? d.minor_number : d.index, Escape(d.name));
    if (!hostname.empty()) l += fmt::format(R"(,hostname="{}")", Escape(hostname));
    labels.push_back(std::move(l));
  }
  std::string out;
  for (const Metric& m : Metrics()) {
    std::string lines;
    for (size_t i = 0; i < labels.size() && i < snap.samples.size(); ++i) {
      const GpuVerdict* v = i < snap.verdicts.size() ? &snap.verdicts[i] : nullptr;
      std::optional<double> value = m.value(snap.samples[i], v);
      if (!value) continue;
      lines += fmt::format("{}{{{}}} {}\n", m.name, labels[i], *value);
    }
    if (lines.empty()) continue;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", m.name, m.help, m.name, m.type);
    out += lines;
  }
  return out;
}

}  // namespace tau::health
