// The GPU inventory: what the server places runs on.
#include <fmt/format.h>

#include "health/health.h"
#include "health/nvml.h"

namespace tau::health {

GpuInventory ReadInventory(const Nvml& nvml, std::vector<nvml::Device>* handles) {
  const nvml::Functions& f = nvml.fn();
  GpuInventory inv;
  inv.driver_loaded = true;
  inv.library = nvml.path();
  char buf[96] = {0};
  if (Nvml::Call(f.system_driver_version, buf, unsigned{sizeof buf}) == nvml::kSuccess) {
    inv.driver_version = buf;
  }
  buf[0] = 0;
  if (Nvml::Call(f.system_nvml_version, buf, unsigned{sizeof buf}) == nvml::kSuccess) {
    inv.nvml_version = buf;
  }
  // The CUDA driver API version as an integer: 12040 means 12.4.
  int cuda = 0;
  if (Nvml::Call(f.system_cuda_driver_version, &cuda) == nvml::kSuccess && cuda > 0) {
    inv.cuda_driver_version = fmt::format("{}.{}", cuda / 1000, (cuda % 1000) / 10);
  }
  unsigned count = 0;
  if (nvml::Return rc = f.device_count(&count); rc != nvml::kSuccess) {
    inv.note = fmt::format("NVML could not count the GPUs ({})", nvml.ErrorString(rc));
    inv.error = inv.note;
    count = 0;
  }
  for (unsigned i = 0; i < count; ++i) {
    nvml::Device dev = nullptr;
    if (f.handle_by_index(i, &dev) != nvml::kSuccess) dev = nullptr;
    if (handles) handles->push_back(dev);
    // A GPU whose handle cannot be had is still listed (its index exists; the monitor reports it as
    // Unknown or lost) so that indices match CUDA_VISIBLE_DEVICES.
    GpuDevice d;
    d.index = static_cast<int>(i);
    if (!dev) {
      inv.devices.push_back(std::move(d));
      continue;
    }
    char text[96] = {0};
    if (Nvml::Call(f.uuid, dev, text, unsigned{sizeof text}) == nvml::kSuccess) d.uuid = text;
    text[0] = 0;
    if (Nvml::Call(f.name, dev, text, unsigned{sizeof text}) == nvml::kSuccess) d.name = text;
    nvml::Memory mem{};
    if (Nvml::Call(f.memory_info, dev, &mem) == nvml::kSuccess) d.memory_total_bytes = mem.total;
    nvml::PciInfo pci{};
    if (Nvml::Call(f.pci_info, dev, &pci) == nvml::kSuccess) {
      pci.bus_id[sizeof pci.bus_id - 1] = 0;
      d.pci_bus_id = pci.bus_id;
    }
    unsigned minor = 0;
    if (Nvml::Call(f.minor_number, dev, &minor) == nvml::kSuccess) d.minor_number = int(minor);
    unsigned mig_current = 0, mig_pending = 0;
    if (Nvml::Call(f.mig_mode, dev, &mig_current, &mig_pending) == nvml::kSuccess) {
      d.mig_enabled = mig_current == 1;
      d.mig_pending = mig_pending == 1;
    }
    inv.devices.push_back(std::move(d));
  }
  if (inv.devices.empty() && inv.note.empty()) inv.note = "the NVIDIA driver reports no GPUs";
  return inv;
}

GpuInventory DiscoverGpus() {
  std::string path = NvmlLibraryPath();
  Result<std::unique_ptr<Nvml>> nvml = Nvml::Load(path);
  if (!nvml.ok()) {
    GpuInventory inv;
    inv.note = nvml.status().message();
    if (nvml.status().code() != StatusCode::kNotFound) {
      inv.library = path;
      inv.error = inv.note;
    }
    return inv;
  }
  return ReadInventory(**nvml, nullptr);
}

nlohmann::json ToJson(const GpuInventory& inv) {
  nlohmann::json devices = nlohmann::json::array();
  for (const GpuDevice& d : inv.devices) {
    nlohmann::json j = {{"index", d.index},
                        {"uuid", d.uuid},
                        {"name", d.name},
                        {"memory_total_bytes", d.memory_total_bytes},
                        {"pci_bus_id", d.pci_bus_id}};
    if (d.minor_number >= 0) j["minor_number"] = d.minor_number;
    j["mig_enabled"] = d.mig_enabled ? nlohmann::json(*d.mig_enabled) : nlohmann::json();
    j["mig_pending"] = d.mig_pending ? nlohmann::json(*d.mig_pending) : nlohmann::json();
    devices.push_back(std::move(j));
  }
  nlohmann::json out = {{"devices", devices},
                        {"driver_loaded", inv.driver_loaded},
                        {"driver_version", inv.driver_version},
                        {"cuda_driver_version", inv.cuda_driver_version},
                        {"nvml_version", inv.nvml_version},
                        {"library", inv.library},
                        {"note", inv.note}};
  if (!inv.error.empty()) out["error"] = inv.error;  // only when the driver is there but unusable
  return out;
}

}  // namespace tau::health
