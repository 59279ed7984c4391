#include "controller/run_storage.h"

#include "common/layout.h"

namespace tau::server {

std::string StorageDir(const std::string& home, const store::RunRecord& r,
                       const std::string& role) {
  if (auto mounts = r.resolved.find("mounts"); mounts != r.resolved.end() && mounts->is_array())
    for (const auto& m : *mounts)
      if (m.value("role", "") == role && !m.value("host_path", "").empty())
        return m.value("host_path", "") + "/" + r.name;
  const std::string run_dir = layout::RunDir(home, r.name);
  return run_dir + (role == "checkpoint" ? "/checkpoints" : "/" + role);
}

}  // namespace tau::server
