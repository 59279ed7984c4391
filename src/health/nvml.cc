// The dlopen binding: resolve NVML's versioned entry points, treat missing ones as "not supported".
#include "health/nvml.h"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>

namespace tau::health {
namespace {

template <typename F>
void Resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
}

// A newer versioned name first, then the older one with the same signature (older drivers export
// only that one).
template <typename F>
void ResolveEither(void* handle, const char* newer, const char* older, F* out) {
  Resolve(handle, newer, out);
  if (!*out) Resolve(handle, older, out);
}

void ResolveAll(void* h, nvml::Functions* f) {
  Resolve(h, "nvmlInit_v2", &f->init_v2);
  Resolve(h, "nvmlInitWithFlags", &f->init_with_flags);
  Resolve(h, "nvmlShutdown", &f->shutdown);
  Resolve(h, "nvmlErrorString", &f->error_string);
  Resolve(h, "nvmlSystemGetDriverVersion", &f->system_driver_version);
  Resolve(h, "nvmlSystemGetNVMLVersion", &f->system_nvml_version);
  ResolveEither(h, "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion",
                &f->system_cuda_driver_version);
  Resolve(h, "nvmlDeviceGetCount_v2", &f->device_count);
  Resolve(h, "nvmlDeviceGetHandleByIndex_v2", &f->handle_by_index);
  Resolve(h, "nvmlDeviceGetUUID", &f->uuid);
  Resolve(h, "nvmlDeviceGetName", &f->name);
  Resolve(h, "nvmlDeviceGetPciInfo_v3", &f->pci_info);
  Resolve(h, "nvmlDeviceGetMinorNumber", &f->minor_number);
  Resolve(h, "nvmlDeviceGetMemoryInfo", &f->memory_info);
  Resolve(h, "nvmlDeviceGetUtilizationRates", &f->utilization);
  Resolve(h, "nvmlDeviceGetTemperature", &f->temperature);
  Resolve(h, "nvmlDeviceGetTemperatureV", &f->temperature_v);
  Resolve(h, "nvmlDeviceGetTemperatureThreshold", &f->temperature_threshold);
  Resolve(h, "nvmlDeviceGetPowerUsage", &f->power_usage);
  Resolve(h, "nvmlDeviceGetEnforcedPowerLimit", &f->enforced_power_limit);
  Resolve(h, "nvmlDeviceGetPowerManagementDefaultLimit", &f->power_default_limit);
  // Renamed in r530; the old name stays exported (deprecated) for a while.
  ResolveEither(h, "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrentClocksThrottleReasons", &f->clocks_event_reasons);
  Resolve(h, "nvmlDeviceGetClockInfo", &f->clock_info);
  Resolve(h, "nvmlDeviceGetPerformanceState", &f->performance_state);
  Resolve(h, "nvmlDeviceGetEccMode", &f->ecc_mode);
  Resolve(h, "nvmlDeviceGetTotalEccErrors", &f->total_ecc_errors);
  Resolve(h, "nvmlDeviceGetRetiredPages", &f->retired_pages);
  Resolve(h, "nvmlDeviceGetRetiredPagesPendingStatus", &f->retired_pages_pending);
  Resolve(h, "nvmlDeviceGetRemappedRows", &f->remapped_rows);
  Resolve(h, "nvmlDeviceGetCurrPcieLinkGeneration", &f->pcie_gen);
  Resolve(h, "nvmlDeviceGetCurrPcieLinkWidth", &f->pcie_width);
  Resolve(h, "nvmlDeviceGetMaxPcieLinkGeneration", &f->pcie_gen_max);
  Resolve(h, "nvmlDeviceGetMaxPcieLinkWidth", &f->pcie_width_max);
  Resolve(h, "nvmlDeviceGetPcieReplayCounter", &f->pcie_replay_counter);
  Resolve(h, "nvmlDeviceGetNvLinkState", &f->nvlink_state);
  Resolve(h, "nvmlDeviceGetNvLinkErrorCounter", &f->nvlink_error_counter);
  Resolve(h, "nvmlDeviceGetMigMode", &f->mig_mode);
  Resolve(h, "nvmlDeviceGetMaxMigDeviceCount", &f->max_mig_device_count);
  Resolve(h, "nvmlDeviceGetMigDeviceHandleByIndex", &f->mig_device_by_index);
  Resolve(h, "nvmlDeviceGetFieldValues", &f->field_values);
  Resolve(h, "nvmlDeviceValidateInforom", &f->validate_inforom);
  Resolve(h, "nvmlEventSetCreate", &f->event_set_create);
  Resolve(h, "nvmlDeviceGetSupportedEventTypes", &f->supported_event_types);
  Resolve(h, "nvmlDeviceRegisterEvents", &f->register_events);
  // v1's event data lacks the trailing MIG instance ids; tau's buffer has room for both.
  ResolveEither(h, "nvmlEventSetWait_v2", "nvmlEventSetWait", &f->event_set_wait);
  Resolve(h, "nvmlEventSetFree", &f->event_set_free);
}

std::string InitAdvice(nvml::Return rc) {
  switch (rc) {
    case nvml::kErrorDriverNotLoaded:
      return "the NVIDIA kernel driver is not loaded";
    case nvml::kErrorLibRmVersionMismatch:
      return "the NVML library and the kernel driver differ in version (driver upgraded without a "
             "reboot?)";
    case nvml::kErrorNoPermission:
      return "no permission to open the GPU devices";
    default:
      return "is the NVIDIA driver loaded?";
  }
}

}  // namespace

std::string NvmlLibraryPath() {
  const char* override_path = std::getenv("TAU_NVML_LIBRARY");
  return override_path && *override_path ? override_path : "libnvidia-ml.so.1";
}

Result<std::unique_ptr<Nvml>> Nvml::Load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    return NotFound(
        fmt::format("no NVIDIA driver found ({} could not be loaded); this machine has no "
                    "GPUs that tau can use",
                    path));
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->handle_ = handle;
  nvml->path_ = path;
  ResolveAll(handle, &nvml->fn_);
  const nvml::Functions& f = nvml->fn_;
  if (!f.init_v2 || !f.device_count || !f.handle_by_index) {
    nvml->fn_.shutdown = nullptr;  // never initialised: the destructor only unloads
    return FailedPrecondition(
        fmt::format("{} lacks the NVML entry points tau needs (nvmlInit_v2, "
                    "nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2)",
                    path));
  }
  if (nvml::Return rc = f.init_v2(); rc != nvml::kSuccess) {
    std::string text = nvml->ErrorString(rc);
    nvml->fn_.shutdown = nullptr;
    return FailedPrecondition(
        fmt::format("NVML failed to initialise ({}): {}", text, InitAdvice(rc)));
  }
  return nvml;
}

Nvml::~Nvml() {
  if (fn_.shutdown) fn_.shutdown();
  if (handle_) dlclose(handle_);
}

std::string Nvml::ErrorString(nvml::Return rc) const {
  const char* text = fn_.error_string ? fn_.error_string(rc) : nullptr;
  if (text && *text) return fmt::format("{} ({})", text, rc);
  return fmt::format("error {}", rc);
}

}  // namespace tau::health
