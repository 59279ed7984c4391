// NVML through dlopen. Function names, versions and struct layouts come from NVIDIA's documented ABI
// (see docs/architecture.md); a symbol that is missing means "not supported by this driver".
#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>

#include "health/health.h"

namespace tau::health {
namespace {

using NvmlReturn = int;  // nvmlReturn_t: 0 is NVML_SUCCESS
using NvmlDevice = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};

struct NvmlApi {
  void* handle = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*get_count)(unsigned*) = nullptr;
  NvmlReturn (*get_handle)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*get_uuid)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*get_memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*driver_version)(char*, unsigned) = nullptr;
};

template <typename F>
void Resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
}

}  // namespace

GpuInventory DiscoverGpus() {
  GpuInventory inv;
  const char* override_path = std::getenv("TAU_NVML_LIBRARY");
  std::string path = override_path && *override_path ? override_path : "libnvidia-ml.so.1";
  NvmlApi api;
  api.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api.handle) {
    inv.note = fmt::format("no NVIDIA driver found ({} could not be loaded); this machine has no GPUs "
                           "that tau can use",
                           path);
    return inv;
  }
  inv.library = path;
  Resolve(api.handle, "nvmlInit_v2", &api.init);
  Resolve(api.handle, "nvmlShutdown", &api.shutdown);
  Resolve(api.handle, "nvmlDeviceGetCount_v2", &api.get_count);
  Resolve(api.handle, "nvmlDeviceGetHandleByIndex_v2", &api.get_handle);
  Resolve(api.handle, "nvmlDeviceGetUUID", &api.get_uuid);
  Resolve(api.handle, "nvmlDeviceGetName", &api.get_name);
  Resolve(api.handle, "nvmlDeviceGetMemoryInfo", &api.get_memory);
  Resolve(api.handle, "nvmlSystemGetDriverVersion", &api.driver_version);
  if (!api.init || !api.get_count || !api.get_handle) {
    inv.note = fmt::format("{} lacks the NVML entry points tau needs (nvmlInit_v2, "
                           "nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2)",
                           path);
    dlclose(api.handle);
    return inv;
  }
  if (NvmlReturn rc = api.init(); rc != 0) {
    inv.note = fmt::format("NVML failed to initialise (error {}): is the NVIDIA driver loaded?", rc);
    dlclose(api.handle);
    return inv;
  }
  inv.driver_loaded = true;
  char buf[128] = {0};
  if (api.driver_version && api.driver_version(buf, sizeof buf) == 0) inv.driver_version = buf;
  unsigned count = 0;
  if (api.get_count(&count) != 0) count = 0;
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice dev = nullptr;
    if (api.get_handle(i, &dev) != 0) continue;
    GpuDevice d;
    d.index = static_cast<int>(i);
    char text[128] = {0};
    if (api.get_uuid && api.get_uuid(dev, text, sizeof text) == 0) d.uuid = text;
    text[0] = 0;
    if (api.get_name && api.get_name(dev, text, sizeof text) == 0) d.name = text;
    NvmlMemory mem{};
    if (api.get_memory && api.get_memory(dev, &mem) == 0) d.memory_total_bytes = mem.total;
    inv.devices.push_back(std::move(d));
  }
  if (inv.devices.empty()) inv.note = "the NVIDIA driver reports no GPUs";
  if (api.shutdown) api.shutdown();
  dlclose(api.handle);
  return inv;
}

nlohmann::json ToJson(const GpuInventory& inv) {
  nlohmann::json devices = nlohmann::json::array();
  for (const GpuDevice& d : inv.devices) {
    devices.push_back({{"index", d.index},
                       {"uuid", d.uuid},
                       {"name", d.name},
                       {"memory_total_bytes", d.memory_total_bytes}});
  }
  return {{"devices", devices},
          {"driver_loaded", inv.driver_loaded},
          {"driver_version", inv.driver_version},
          {"library", inv.library},
          {"note", inv.note}};
}

}  // namespace tau::health
