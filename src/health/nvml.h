// NVML through dlopen (internal to src/health/). tau's own declarations, written from NVML's
// documented ABI (function names and versions, return codes, enum values, struct layouts: see
// docs/gpu-health.md and the reference notes it cites). No NVIDIA header is included or copied.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "health/health.h"

namespace tau::health {

namespace nvml {

// nvmlReturn_t is a C enum: a 32-bit int.
using Return = int;
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorInsufficientPower = 8;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorTimeout = 10;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorFunctionNotFound = 13;  // also what tau returns for a missing symbol
inline constexpr Return kErrorCorruptedInforom = 14;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorResetRequired = 16;
inline constexpr Return kErrorLibRmVersionMismatch = 18;
inline constexpr Return kErrorUnknown = 999;

// "Not supported" in either form: the driver says so, or the symbol is missing (an older driver).
inline bool Unsupported(Return rc) {
  return rc == kErrorNotSupported || rc == kErrorFunctionNotFound;
}

// Opaque handles.
using Device = struct DeviceOpaque*;
using EventSet = struct EventSetOpaque*;

inline constexpr unsigned kInitFlagNoGpus = 1;

// Event type bits (u64 mask).
inline constexpr unsigned long long kEventSingleBitEcc = 0x1;
inline constexpr unsigned long long kEventDoubleBitEcc = 0x2;
inline constexpr unsigned long long kEventXidCritical = 0x8;

// Clocks event (throttle) reason bits.
inline constexpr unsigned long long kClocksGpuIdle = 0x1;
inline constexpr unsigned long long kClocksSwPowerCap = 0x4;
inline constexpr unsigned long long kClocksHwSlowdown = 0x8;
inline constexpr unsigned long long kClocksSwThermal = 0x20;
inline constexpr unsigned long long kClocksHwThermal = 0x40;
inline constexpr unsigned long long kClocksHwPowerBrake = 0x80;

// Enum values used as arguments.
inline constexpr int kTemperatureGpu = 0;
inline constexpr int kTempThresholdShutdown = 0;
inline constexpr int kTempThresholdSlowdown = 1;
inline constexpr int kMemoryErrorCorrected = 0;
inline constexpr int kMemoryErrorUncorrected = 1;
inline constexpr int kEccVolatile = 0;
inline constexpr int kEccAggregate = 1;
inline constexpr int kRetiredMultipleSbe = 0;
inline constexpr int kRetiredDbe = 1;
inline constexpr int kClockSm = 1;
inline constexpr int kClockMem = 2;
inline constexpr int kNvLinkErrorReplay = 0;
inline constexpr int kNvLinkErrorRecovery = 1;
inline constexpr int kNvLinkErrorCrcFlit = 2;
inline constexpr int kNvLinkErrorCrcData = 3;
inline constexpr unsigned kNvLinkMaxLinks = 36;
inline constexpr unsigned kFieldGpuRecoveryAction = 230;
// nvmlTemperature_v1: sizeof | version << 24.
inline constexpr unsigned kTemperatureV1Version = 12u | (1u << 24);

// Struct layouts (LP64).
struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
static_assert(sizeof(PciInfo) == 68);

struct Memory {
  unsigned long long total, free, used;
};
static_assert(sizeof(Memory) == 24);

struct Utilization {
  unsigned gpu, memory;
};
static_assert(sizeof(Utilization) == 8);

struct Temperature {
  unsigned version;
  unsigned sensor_type;
  int temperature;
};
static_assert(sizeof(Temperature) == 12);

struct EventData {
  Device device;
  unsigned long long event_type;
  unsigned long long event_data;  // the XID number for XID events
  unsigned gpu_instance_id, compute_instance_id;
};
static_assert(sizeof(EventData) == 32);

struct FieldValue {
  unsigned field_id;
  unsigned scope_id;
  long long timestamp;
  long long latency_usec;
  unsigned value_type;  // 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint, 6 ushort
  unsigned nvml_return;
  union {
    double d;
    unsigned ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    int si;
    unsigned short us;
  } value;
};
static_assert(sizeof(FieldValue) == 40);

// The entry points tau uses; null when the library lacks the symbol.
struct Functions {
  Return (*init_v2)() = nullptr;
  Return (*init_with_flags)(unsigned) = nullptr;
  Return (*shutdown)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*system_driver_version)(char*, unsigned) = nullptr;
  Return (*system_nvml_version)(char*, unsigned) = nullptr;
  Return (*system_cuda_driver_version)(int*) = nullptr;  // _v2, else the plain name
  Return (*device_count)(unsigned*) = nullptr;
  Return (*handle_by_index)(unsigned, Device*) = nullptr;
  Return (*uuid)(Device, char*, unsigned) = nullptr;
  Return (*name)(Device, char*, unsigned) = nullptr;
  Return (*pci_info)(Device, PciInfo*) = nullptr;
  Return (*minor_number)(Device, unsigned*) = nullptr;
  Return (*memory_info)(Device, Memory*) = nullptr;
  Return (*utilization)(Device, Utilization*) = nullptr;
  Return (*temperature)(Device, int, unsigned*) = nullptr;
  Return (*temperature_v)(Device, Temperature*) = nullptr;
  Return (*temperature_threshold)(Device, int, unsigned*) = nullptr;
  Return (*power_usage)(Device, unsigned*) = nullptr;
  Return (*enforced_power_limit)(Device, unsigned*) = nullptr;
  Return (*power_default_limit)(Device, unsigned*) = nullptr;
  Return (*clocks_event_reasons)(Device, unsigned long long*) = nullptr;  // new name, else the old
  Return (*clock_info)(Device, int, unsigned*) = nullptr;
  Return (*performance_state)(Device, int*) = nullptr;
  Return (*ecc_mode)(Device, int*, int*) = nullptr;
  Return (*total_ecc_errors)(Device, int, int, unsigned long long*) = nullptr;
  Return (*retired_pages)(Device, int, unsigned*, unsigned long long*) = nullptr;
  Return (*retired_pages_pending)(Device, int*) = nullptr;
  Return (*remapped_rows)(Device, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;
  Return (*pcie_gen)(Device, unsigned*) = nullptr;
  Return (*pcie_width)(Device, unsigned*) = nullptr;
  Return (*pcie_gen_max)(Device, unsigned*) = nullptr;
  Return (*pcie_width_max)(Device, unsigned*) = nullptr;
  Return (*pcie_replay_counter)(Device, unsigned*) = nullptr;
  Return (*nvlink_state)(Device, unsigned, int*) = nullptr;
  Return (*nvlink_error_counter)(Device, unsigned, int, unsigned long long*) = nullptr;
  Return (*mig_mode)(Device, unsigned*, unsigned*) = nullptr;
  Return (*max_mig_device_count)(Device, unsigned*) = nullptr;
  Return (*mig_device_by_index)(Device, unsigned, Device*) = nullptr;
  Return (*field_values)(Device, int, FieldValue*) = nullptr;
  Return (*validate_inforom)(Device) = nullptr;
  Return (*event_set_create)(EventSet*) = nullptr;
  Return (*supported_event_types)(Device, unsigned long long*) = nullptr;
  Return (*register_events)(Device, unsigned long long, EventSet) = nullptr;
  Return (*event_set_wait)(EventSet, EventData*, unsigned) = nullptr;  // _v2, else the plain name
  Return (*event_set_free)(EventSet) = nullptr;
};

}  // namespace nvml

// A loaded and initialised NVML. Destroying it shuts NVML down and unloads the library.
class Nvml {
 public:
  // dlopen(path), resolve the symbols, nvmlInit. Errors: kNotFound when the library cannot be
  // loaded, kFailedPrecondition when it lacks the essential entry points or init fails (the message
  // says which).
  static Result<std::unique_ptr<Nvml>> Load(const std::string& path);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const nvml::Functions& fn() const { return fn_; }
  const std::string& path() const { return path_; }
  // "GPU is lost (15)"; uses nvmlErrorString when the library has it.
  std::string ErrorString(nvml::Return rc) const;

  // Calls `f` if the library has it, else answers kErrorFunctionNotFound ("not supported").
  template <typename F, typename... A>
  static nvml::Return Call(F* f, A... args) {
    return f ? f(args...) : nvml::kErrorFunctionNotFound;
  }

 private:
  Nvml() = default;
  void* handle_ = nullptr;
  std::string path_;
  nvml::Functions fn_;
};

// Readings of one GPU through `nvml` (sample.cc). Does not touch the XID fields. Without
// `validate_inforom`, inforom_valid stays empty (the check is costly; see MonitorOptions).
GpuSample ReadSample(const Nvml& nvml, nvml::Device device, int index, const std::string& uuid,
                     int64_t now_ms, bool validate_inforom);
// The inventory through an already loaded NVML (inventory.cc); `handles` receives the device
// handles.
GpuInventory ReadInventory(const Nvml& nvml, std::vector<nvml::Device>* handles);

}  // namespace tau::health
