// What an evidence record says of this machine, for runs that ran on it (the local backend):
// host, OS, kernel, driver, Python and the packages of the run's virtualenv.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "evidence/evidence.h"
#include "health/health.h"

namespace tau::server {

// `venv_cache`: where the run's virtualenvs are cached (each user its own), asked only when the
// Python facts are looked up; `prev`: the run's previous record, whose Python facts are kept
// unless this is the final save.
void DescribeThisMachine(const health::GpuInventory& gpus,
                         const std::function<std::string()>& venv_cache,
                         const std::vector<std::string>& pip, bool final_save,
                         const evidence::RecordInput* prev, evidence::RuntimeInfo* rt);

}  // namespace tau::server
