// GPU discovery and health. Talks to the NVIDIA driver through NVML, loaded with dlopen at run time
// (libnvidia-ml.so.1, or the path in TAU_NVML_LIBRARY), with tau's own declarations of the documented ABI:
// no NVIDIA headers or SDK are needed to build tau, and a machine without a driver simply has no GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tau::health {

struct GpuDevice {
  int index = 0;
  std::string uuid;
  std::string name;
  uint64_t memory_total_bytes = 0;
};

struct GpuInventory {
  std::vector<GpuDevice> devices;
  bool driver_loaded = false;
  std::string driver_version;
  std::string library;  // the NVML library that answered
  std::string note;     // why there are no GPUs, in plain words, when there are none
};

// Asks NVML for the GPUs of this machine. Never fails: problems end up in `note`.
GpuInventory DiscoverGpus();

nlohmann::json ToJson(const GpuInventory& inventory);

}  // namespace tau::health
