// Limits that both sides of the API enforce: the CLI refuses early with advice, the server refuses
// again because it cannot trust a client.
#pragma once

#include <cstddef>

namespace tau {

inline constexpr size_t kMaxSnapshotBytes = 64u << 20;  // a run's code directory
inline constexpr size_t kMaxSnapshotFiles = 20000;

}  // namespace tau
