// The active probe: a short real workload on each GPU through the CUDA driver API, loaded with
// dlopen (libcuda.so.1) like NVML, with tau's own declarations of the documented entry points. It
// catches what passive counters miss: a GPU that NVML lists but that cannot create a context,
// allocate or move memory. It runs in a child process (`tau __gpu-probe`) so that CUDA never
// initialises inside the server.
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "health/health.h"

namespace tau::health {
namespace {

using CuResult = int;  // CUresult: 0 is CUDA_SUCCESS
using CuDevice = int;
using CuContext = void*;
using CuDevicePtr = unsigned long long;

struct CudaApi {
  CuResult (*init)(unsigned) = nullptr;
  CuResult (*device_count)(int*) = nullptr;
  CuResult (*device_get)(CuDevice*, int) = nullptr;
  CuResult (*device_name)(char*, int, CuDevice) = nullptr;
  CuResult (*ctx_create)(CuContext*, unsigned, CuDevice) = nullptr;
  CuResult (*ctx_destroy)(CuContext) = nullptr;
  CuResult (*mem_alloc)(CuDevicePtr*, size_t) = nullptr;
  CuResult (*mem_free)(CuDevicePtr) = nullptr;
  CuResult (*memset_d8)(CuDevicePtr, unsigned char, size_t) = nullptr;
  CuResult (*memcpy_dtoh)(void*, CuDevicePtr, size_t) = nullptr;
  CuResult (*ctx_synchronize)() = nullptr;
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

constexpr size_t kProbeBytes = 64u << 20;
constexpr size_t kCheckBytes = 1u << 20;

}  // namespace

nlohmann::json RunActiveProbe() {
  // Device ordinals in PCI bus order, as NVML numbers them, whatever the environment asks.
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  nlohmann::json out = {{"ran", false}, {"gpus", nlohmann::json::array()}};
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    out["note"] = "active probe skipped: the CUDA driver (libcuda.so.1) is not installed";
    return out;
  }
  CudaApi cu;
  bool ok =
      Resolve(lib, "cuInit", &cu.init) && Resolve(lib, "cuDeviceGetCount", &cu.device_count) &&
      Resolve(lib, "cuDeviceGet", &cu.device_get) &&
      Resolve(lib, "cuDeviceGetName", &cu.device_name) &&
      Resolve(lib, "cuCtxCreate_v2", &cu.ctx_create) &&
      Resolve(lib, "cuCtxDestroy_v2", &cu.ctx_destroy) &&
      Resolve(lib, "cuMemAlloc_v2", &cu.mem_alloc) && Resolve(lib, "cuMemFree_v2", &cu.mem_free) &&
      Resolve(lib, "cuMemsetD8_v2", &cu.memset_d8) &&
      Resolve(lib, "cuMemcpyDtoH_v2", &cu.memcpy_dtoh) &&
      Resolve(lib, "cuCtxSynchronize", &cu.ctx_synchronize);
  if (!ok) {
    out["note"] = "active probe skipped: libcuda.so.1 lacks the driver API entry points it needs";
    return out;
  }
  if (CuResult rc = cu.init(0); rc != 0) {
    out["note"] = fmt::format("active probe: cuInit failed (CUDA error {})", rc);
    return out;
  }
  int count = 0;
  cu.device_count(&count);
  out["ran"] = true;
  for (int i = 0; i < count; ++i) {
    auto start = std::chrono::steady_clock::now();
    nlohmann::json g = {{"cuda_ordinal", i}, {"passed", false}};
    auto step = [&](const char* what, CuResult rc) {
      if (rc != 0 && !g.contains("error"))
        g["error"] = fmt::format("{} failed (CUDA error {})", what, rc);
      return rc == 0;
    };
    CuDevice dev = 0;
    CuContext ctx = nullptr;
    CuDevicePtr mem = 0;
    char name[128] = {0};
    if (step("cuDeviceGet", cu.device_get(&dev, i))) {
      cu.device_name(name, sizeof name, dev);
      g["name"] = name;
      if (step("cuCtxCreate", cu.ctx_create(&ctx, 0, dev)) &&
          step("cuMemAlloc", cu.mem_alloc(&mem, kProbeBytes)) &&
          step("cuMemsetD8", cu.memset_d8(mem, 0xA5, kProbeBytes)) &&
          step("cuCtxSynchronize", cu.ctx_synchronize())) {
        std::vector<unsigned char> back(kCheckBytes, 0);
        if (step("cuMemcpyDtoH",
                 cu.memcpy_dtoh(back.data(), mem + kProbeBytes - kCheckBytes, kCheckBytes))) {
          bool pattern = true;
          for (unsigned char b : back) pattern = pattern && b == 0xA5;
          if (!pattern) g["error"] = "memory read back does not match what was written";
          g["passed"] = pattern;
        }
      }
      if (mem) cu.mem_free(mem);
      if (ctx) cu.ctx_destroy(ctx);
    }
    g["ms"] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    out["gpus"].push_back(g);
  }
  return out;
}

}  // namespace tau::health
