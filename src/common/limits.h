// Limits that both sides of the API enforce: the CLI refuses early with advice, the server refuses
// again because it cannot trust a client.
#pragma once

#include <cstddef>

namespace tau {

inline constexpr size_t kMaxSnapshotBytes = 64u << 20;  // a run's code directory
inline constexpr size_t kMaxSnapshotFiles = 20000;
// One code file's path relative to the code directory, and each of its parts: the server writes it
// under $TAU_HOME/snapshots/<sha256>/, which must stay within PATH_MAX, and a part within NAME_MAX.
inline constexpr size_t kMaxCodePathBytes = 1024;
inline constexpr size_t kMaxCodePathPartBytes = 255;

}  // namespace tau
