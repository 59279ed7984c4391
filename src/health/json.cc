// JSON for the API: inventory is in inventory.cc; samples, checks, verdicts and snapshots here.
#include "common/clock.h"
#include "health/health.h"

namespace tau::health {
namespace {

template <typename T>
nlohmann::json Opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

}  // namespace

const char* CheckStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass:
      return "pass";
    case CheckStatus::kInfo:
      return "info";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
    case CheckStatus::kError:
      return "error";
    case CheckStatus::kNotSupported:
      return "not_supported";
  }
  return "?";
}

const char* ActionName(Action action) {
  switch (action) {
    case Action::kNone:
      return "none";
    case Action::kRestartApp:
      return "restart_app";
    case Action::kWatch:
      return "watch";
    case Action::kFixConfig:
      return "fix_config";
    case Action::kResetGpu:
      return "reset_gpu";
    case Action::kResetWhenIdle:
      return "reset_when_idle";
    case Action::kRebootNode:
      return "reboot_node";
    case Action::kHardware:
      return "hardware";
  }
  return "?";
}

const char* ClearRuleName(ClearRule rule) {
  switch (rule) {
    case ClearRule::kAfterHealthyObservations:
      return "after_healthy_observations";
    case ClearRule::kAfterQuietPeriod:
      return "after_quiet_period";
    case ClearRule::kOnGpuReset:
      return "on_gpu_reset";
    case ClearRule::kOnReboot:
      return "on_reboot";
  }
  return "?";
}

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kHealthy:
      return "Healthy";
    case Verdict::kDegraded:
      return "Degraded";
    case Verdict::kUnhealthy:
      return "Unhealthy";
    case Verdict::kUnknown:
      return "Unknown";
  }
  return "?";
}

nlohmann::json ToJson(const GpuSample& s) {
  nlohmann::json links = nlohmann::json::array();
  for (const NvLinkSample& l : s.nvlinks) {
    links.push_back({{"link", l.link},
                     {"active", l.active},
                     {"replay", Opt(l.replay)},
                     {"recovery", Opt(l.recovery)},
                     {"crc_flit", Opt(l.crc_flit)},
                     {"crc_data", Opt(l.crc_data)}});
  }
  nlohmann::json xids = nlohmann::json::array();
  for (const XidEvent& e : s.xids) xids.push_back({{"xid", e.xid}, {"at", FormatRfc3339(e.at_ms)}});
  nlohmann::json remap;
  if (s.remap) {
    remap = {{"corrected_rows", s.remap->corrected_rows},
             {"uncorrected_rows", s.remap->uncorrected_rows},
             {"pending", s.remap->pending},
             {"failed", s.remap->failed}};
  }
  return {{"index", s.index},
          {"uuid", s.uuid},
          {"at", FormatRfc3339(s.at_ms)},
          {"lost", s.lost},
          {"error", s.error},
          {"gpu_util_pct", Opt(s.gpu_util_pct)},
          {"memory_util_pct", Opt(s.memory_util_pct)},
          {"memory_total_bytes", Opt(s.memory_total_bytes)},
          {"memory_used_bytes", Opt(s.memory_used_bytes)},
          {"temperature_c", Opt(s.temperature_c)},
          {"temperature_slowdown_c", Opt(s.temperature_slowdown_c)},
          {"temperature_shutdown_c", Opt(s.temperature_shutdown_c)},
          {"power_mw", Opt(s.power_mw)},
          {"power_limit_mw", Opt(s.power_limit_mw)},
          {"power_default_limit_mw", Opt(s.power_default_limit_mw)},
          {"sm_clock_mhz", Opt(s.sm_clock_mhz)},
          {"memory_clock_mhz", Opt(s.memory_clock_mhz)},
          {"pstate", Opt(s.pstate)},
          {"clocks_event_reasons", Opt(s.clocks_event_reasons)},
          {"ecc_enabled", Opt(s.ecc_enabled)},
          {"ecc_sbe_volatile", Opt(s.ecc_sbe_volatile)},
          {"ecc_dbe_volatile", Opt(s.ecc_dbe_volatile)},
          {"ecc_sbe_aggregate", Opt(s.ecc_sbe_aggregate)},
          {"ecc_dbe_aggregate", Opt(s.ecc_dbe_aggregate)},
          {"retired_pages_sbe", Opt(s.retired_pages_sbe)},
          {"retired_pages_dbe", Opt(s.retired_pages_dbe)},
          {"retired_pages_pending", Opt(s.retired_pages_pending)},
          {"retired_pages_dbe_at_ms", Opt(s.retired_pages_dbe_at_ms)},
          {"remap", remap},
          {"pcie_gen", Opt(s.pcie_gen)},
          {"pcie_gen_max", Opt(s.pcie_gen_max)},
          {"pcie_width", Opt(s.pcie_width)},
          {"pcie_width_max", Opt(s.pcie_width_max)},
          {"pcie_replay_counter", Opt(s.pcie_replay_counter)},
          {"nvlinks", links},
          {"recovery_action", Opt(s.recovery_action)},
          {"inforom_valid", Opt(s.inforom_valid)},
          {"mig_enabled", Opt(s.mig_enabled)},
          {"mig_pending", Opt(s.mig_pending)},
          {"mig_instances", Opt(s.mig_instances)},
          {"xids", xids},
          {"last_xid", s.last_xid},
          {"xid_events_supported", s.xid_events_supported},
          {"not_supported", s.not_supported}};
}

nlohmann::json ToJson(const CheckResult& r) {
  nlohmann::json j = {{"gpu", r.gpu_index},
                      {"check", r.check},
                      {"status", CheckStatusName(r.status)},
                      {"action", ActionName(r.action)},
                      {"clear", ClearRuleName(r.clear)},
                      {"message", r.message},
                      {"threshold", r.threshold},
                      {"source", r.source}};
  if (r.xid) j["xid"] = r.xid;
  return j;
}

nlohmann::json ToJson(const Reason& r) {
  return {{"check", r.check},
          {"status", CheckStatusName(r.status)},
          {"action", ActionName(r.action)},
          {"clear", ClearRuleName(r.clear)},
          {"message", r.message},
          {"threshold", r.threshold},
          {"source", r.source},
          {"first_seen", r.first_seen_ms ? FormatRfc3339(r.first_seen_ms) : ""},
          {"last_seen", r.last_seen_ms ? FormatRfc3339(r.last_seen_ms) : ""},
          {"count", r.count}};
}

nlohmann::json ToJson(const GpuVerdict& v) {
  nlohmann::json reasons = nlohmann::json::array(), pending = nlohmann::json::array();
  for (const Reason& r : v.reasons) reasons.push_back(ToJson(r));
  for (const Reason& r : v.pending) pending.push_back(ToJson(r));
  nlohmann::json xids = nlohmann::json::array();
  for (const XidEvent& e : v.recent_xids) {
    xids.push_back({{"xid", e.xid}, {"at", FormatRfc3339(e.at_ms)}});
  }
  return {{"gpu", v.gpu_index},
          {"verdict", VerdictName(v.verdict)},
          {"placeable", Placeable(v.verdict)},
          {"since", v.since_ms ? FormatRfc3339(v.since_ms) : ""},
          {"reasons", reasons},
          {"pending", pending},
          {"recent_application_xids", xids}};
}

nlohmann::json ToJson(const HealthSnapshot& snap) {
  nlohmann::json gpus = nlohmann::json::array();
  for (size_t i = 0; i < snap.inventory.devices.size(); ++i) {
    GpuInventory one;
    one.devices.push_back(snap.inventory.devices[i]);
    nlohmann::json g = {{"device", ToJson(one)["devices"][0]}};
    g["sample"] = i < snap.samples.size() ? ToJson(snap.samples[i]) : nlohmann::json();
    g["health"] = i < snap.verdicts.size() ? ToJson(snap.verdicts[i]) : nlohmann::json();
    gpus.push_back(std::move(g));
  }
  return {{"inventory", ToJson(snap.inventory)},
          {"gpus", gpus},
          {"taken", FormatRfc3339(snap.taken_ms)},
          {"passes", snap.passes},
          {"xid_events", snap.xid_events}};
}

}  // namespace tau::health
