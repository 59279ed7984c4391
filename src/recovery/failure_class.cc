#include "recovery/failure_class.h"

#include <algorithm>
#include <array>
#include <utility>

namespace tau::recovery {
namespace {

// The one name table.
constexpr std::array<std::pair<FailureClass, std::string_view>, 12> kNames = {{
    {FailureClass::kSucceeded, "Succeeded"},
    {FailureClass::kUserError, "UserError"},
    {FailureClass::kOOMKilled, "OOMKilled"},
    {FailureClass::kSetupError, "SetupError"},
    {FailureClass::kTimeout, "Timeout"},
    {FailureClass::kCancelled, "Cancelled"},
    {FailureClass::kNodeLost, "NodeLost"},
    {FailureClass::kEvicted, "Evicted"},
    {FailureClass::kGPUError, "GPUError"},
    {FailureClass::kPreempted, "Preempted"},
    {FailureClass::kSecretNotFound, "SecretNotFound"},
    {FailureClass::kUnknown, "Unknown"},
}};

}  // namespace

std::string_view FailureClassName(FailureClass c) {
  for (const auto& [cls, name] : kNames)
    if (cls == c) return name;
  return "Unknown";
}

std::optional<FailureClass> ParseFailureClass(std::string_view name) {
  for (const auto& [cls, n] : kNames)
    if (n == name) return cls;
  return std::nullopt;
}

const std::vector<FailureClass>& AllFailureClasses() {
  static const auto* values = [] {
    auto* v = new std::vector<FailureClass>;
    for (const auto& entry : kNames) v->push_back(entry.first);
    return v;
  }();
  return *values;
}

const std::vector<FailureClass>& RetryableFailureClasses() {
  using C = FailureClass;
  static const auto* values =
      new std::vector<FailureClass>{C::kUserError, C::kOOMKilled, C::kPreempted, C::kEvicted,
                                    C::kGPUError,  C::kNodeLost,  C::kTimeout,   C::kSetupError};
  return *values;
}

const std::vector<FailureClass>& DefaultRetryOn() {
  using C = FailureClass;
  static const auto* values =
      new std::vector<FailureClass>{C::kPreempted, C::kEvicted, C::kGPUError, C::kNodeLost};
  return *values;
}

std::vector<std::string> FailureClassNames(const std::vector<FailureClass>& classes) {
  std::vector<std::string> names;
  names.reserve(classes.size());
  for (FailureClass c : classes) names.emplace_back(FailureClassName(c));
  return names;
}

}  // namespace tau::recovery
