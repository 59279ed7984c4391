// Internal to the spec module: value checks and the setters with real logic, used by the field
// trees.
#pragma once

#include <cstddef>
#include <string_view>

#include "spec/walk.h"

namespace tau::spec::internal {

// Names get a run suffix appended ("-<8 hex>" and more), so they must stay well below the 63 of a
// label.
inline constexpr size_t kMaxNameChars = 53;
inline constexpr size_t kMaxSubdomainChars = 253;

// Report an error (with a suggested fix) and return false when v.text is not a DNS-1123 label.
bool CheckLabel(Ctx& c, const Value& v, size_t max_len, std::string_view what);
bool CheckSubdomain(Ctx& c, const Value& v);

void SetName(Ctx& c, const Value& v);
// `alias` is the path of the other spelling (entrypoint/script), or null; giving both is an error.
void SetEntrypoint(Ctx& c, const Value& v, const char* alias);
void SetArgs(Ctx& c, const Value& v);
void SetEnv(Ctx& c, const Value& v);
void SetPip(Ctx& c, const Value& v);
void SetNodeSelector(Ctx& c, const Value& v);
void SetRetryOn(Ctx& c, const Value& v);
void SetHistory(Ctx& c, const Value& v);
void SetEnvSecret(Ctx& c, const Value& v);
void SetCodeExcludes(Ctx& c, const Value& v);

}  // namespace tau::spec::internal
