// The XID table: NVIDIA's XID catalog "immediate action" buckets (as copied in NVSentinel's
// xiderrorsmapping.csv), DCGM's "devastating" XIDs and the k8s-device-plugin's application-XID
// ignore list. docs/gpu-health.md has the same table with reasons.
#include <fmt/format.h>

#include <array>

#include "health/health.h"

namespace tau::health {
namespace {

enum class Bucket { kApp, kWarn, kReset, kReboot, kHardware, kLegacy };

struct XidRow {
  unsigned first, last;  // an inclusive range, usually one XID
  Bucket bucket;
  const char* mnemonic;
  const char* source;
};

constexpr const char* kCatalog = "NVIDIA XID catalog (NVSentinel xiderrorsmapping.csv)";

// Order matters only for readability: ranges do not overlap.
constexpr std::array kXids = {
    XidRow{8, 8, Bucket::kApp, "FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP"},
    XidRow{11, 11, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{13, 13, Bucket::kApp, "GR_EXCEPTION", "RESTART_APP; k8s-device-plugin ignores it"},
    XidRow{25, 25, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{31, 31, Bucket::kApp, "FIFO_ERROR_MMU_ERR_FLT",
           "RESTART_APP; k8s-device-plugin ignores it"},
    XidRow{32, 32, Bucket::kApp, "PBDMA_ERROR", "RESTART_APP"},
    XidRow{38, 38, Bucket::kApp, "FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE"},
    XidRow{39, 41, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{43, 43, Bucket::kApp, "RESETCHANNEL_VERIF_ERROR",
           "IGNORE; k8s-device-plugin ignores it"},
    XidRow{45, 45, Bucket::kApp, "PREEMPTIVE_REMOVAL",
           "follows the primary XID; k8s-device-plugin ignores it"},
    XidRow{46, 46, Bucket::kReset, "GPU_TIMEOUT_ERROR", "RESET_GPU"},
    XidRow{48, 48, Bucket::kHardware, "GPU_ECC_DBE", "WORKFLOW_XID_48; DCGM devastating"},
    XidRow{54, 54, Bucket::kHardware, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"},
    XidRow{60, 60, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{61, 61, Bucket::kReset, "PMU_BREAKPOINT", "legacy guidance: report and reset"},
    XidRow{62, 62, Bucket::kReset, "PMU_HALT_ERROR", "RESET_GPU"},
    XidRow{63, 63, Bucket::kWarn, "INFOROM_DRAM_RETIREMENT_EVENT",
           "IGNORE (a pending remap is checked separately)"},
    XidRow{64, 64, Bucket::kHardware, "INFOROM_DRAM_RETIREMENT_FAILURE",
           "RESET_GPU; DCGM MEM FAIL"},
    XidRow{68, 68, Bucket::kApp, "NVDEC0_ERROR", "RESTART_APP; k8s-device-plugin ignores it"},
    XidRow{69, 69, Bucket::kApp, "GR_CLASS_ERROR", "RESTART_APP"},
    XidRow{70, 72, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{74, 74, Bucket::kHardware, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR; DCGM devastating"},
    XidRow{75, 77, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{79, 79, Bucket::kReboot, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM; DCGM devastating"},
    XidRow{80, 80, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{82, 86, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{88, 89, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{92, 92, Bucket::kWarn, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE (investigatory)"},
    XidRow{94, 94, Bucket::kApp, "CONTAINED_ERROR", "RESTART_APP; DCGM WARN"},
    XidRow{95, 95, Bucket::kReset, "UNCONTAINED_ERROR", "RESET_GPU; DCGM devastating"},
    XidRow{96, 105, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{109, 109, Bucket::kApp, "CTXSW_TIMEOUT_ERROR",
           "k8s-device-plugin: application error (a repeat is a reset)"},
    XidRow{110, 110, Bucket::kReset, "SEC_FAULT_ERROR", "RESET_GPU"},
    XidRow{119, 119, Bucket::kReset, "GSP_RPC_TIMEOUT", "RESET_GPU; DCGM devastating"},
    XidRow{120, 120, Bucket::kReset, "GSP_ERROR", "RESET_GPU; DCGM devastating"},
    XidRow{121, 121, Bucket::kWarn, "C2C_ERROR (corrected)", "IGNORE; DCGM NVLINK WARN"},
    XidRow{126, 135, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{136, 136, Bucket::kReset, "ALI_TRAINING_FAIL", "RESET_GPU"},
    XidRow{139, 139, Bucket::kApp, "engine exception", "RESTART_APP"},
    XidRow{140, 140, Bucket::kHardware, "UNRECOVERABLE_ECC_ERROR_ESCAPE",
           "RESET_GPU; DCGM devastating"},
    XidRow{143, 143, Bucket::kReset, "GPU_INIT_ERROR", "RESET_GPU"},
    XidRow{144, 150, Bucket::kHardware, "NVLINK5 error", "WORKFLOW_NVLINK5_ERR"},
    XidRow{151, 151, Bucket::kReboot, "KEY_ROTATION_ERROR", "RESTART_VM"},
    XidRow{154, 154, Bucket::kWarn, "GPU_RECOVERY_ACTION_CHANGED",
           "follow the recovery action (checked separately)"},
    XidRow{155, 155, Bucket::kReset, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU"},
    XidRow{156, 156, Bucket::kReset, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU"},
    XidRow{158, 158, Bucket::kReset, "GPU_FATAL_TIMEOUT", "RESET_GPU"},
    XidRow{160, 160, Bucket::kReboot, "CHANNEL_RETIREMENT_EVENT", "RESTART_BM"},
};

// Legacy or unused on A100..GB200: CONTACT_SUPPORT ("unexpected"); seen at all → drain.
constexpr std::array<std::array<unsigned, 2>, 20> kLegacy = {
    {{1, 7},   {9, 10},    {12, 12},   {15, 24},   {26, 30},   {33, 36},  {42, 42},
     {47, 47}, {49, 53},   {55, 59},   {65, 65},   {73, 73},   {81, 81},  {87, 87},
     {90, 91}, {108, 108}, {111, 118}, {122, 125}, {138, 138}, {142, 142}}};

XidClass FromBucket(Bucket bucket, std::string mnemonic, std::string source) {
  XidClass c;
  c.mnemonic = std::move(mnemonic);
  c.source = std::move(source);
  switch (bucket) {
    case Bucket::kApp:
      c.status = CheckStatus::kInfo;
      c.action = Action::kRestartApp;
      c.clear = ClearRule::kAfterQuietPeriod;
      break;
    case Bucket::kWarn:
      c.status = CheckStatus::kWarn;
      c.action = Action::kWatch;
      c.clear = ClearRule::kAfterQuietPeriod;
      break;
    case Bucket::kReset:
      c.status = CheckStatus::kFail;
      c.action = Action::kResetGpu;
      c.clear = ClearRule::kOnGpuReset;
      break;
    case Bucket::kLegacy:
      // Only a suspicion: a reset and clean re-checks are enough to let it go.
      c.status = CheckStatus::kFail;
      c.action = Action::kHardware;
      c.clear = ClearRule::kOnGpuReset;
      break;
    case Bucket::kReboot:
      c.status = CheckStatus::kFail;
      c.action = Action::kRebootNode;
      c.clear = ClearRule::kOnReboot;
      break;
    case Bucket::kHardware:
      c.status = CheckStatus::kFail;
      c.action = Action::kHardware;
      c.clear = ClearRule::kOnReboot;
      break;
  }
  return c;
}

}  // namespace

XidClass ClassifyXid(uint64_t xid) {
  for (const XidRow& row : kXids) {
    if (xid >= row.first && xid <= row.last) {
      return FromBucket(row.bucket, row.mnemonic, fmt::format("{}: {}", kCatalog, row.source));
    }
  }
  for (const auto& range : kLegacy) {
    if (xid >= range[0] && xid <= range[1]) {
      return FromBucket(Bucket::kLegacy, "legacy/unused XID",
                        fmt::format("{}: CONTACT_SUPPORT (unexpected on current GPUs)", kCatalog));
    }
  }
  // 999 is NVML's "unknown XID"; anything else is newer than this table.
  return FromBucket(Bucket::kWarn, xid == 999 ? "unknown XID" : "XID not in tau's table",
                    "reference §5 row 4: an unknown XID is a warning");
}

}  // namespace tau::health
