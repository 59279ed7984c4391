#include "recovery/failure_class.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

namespace tau::recovery {
namespace {

// The one name table.
constexpr std::array<std::pair<FailureClass, std::string_view>, 15> kNames = {{
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
    {FailureClass::kLivenessFailed, "LivenessFailed"},
    {FailureClass::kIdle, "Idle"},
    {FailureClass::kStalled, "Stalled"},
    {FailureClass::kUnknown, "Unknown"},
}};

}  // namespace

const std::string& FailureClassName(FailureClass c) {
  // As strings, so that records, events and labels take them without a copy of their own.
  static const auto* names = [] {
    auto* v = new std::array<std::string, kNames.size()>;
    for (size_t i = 0; i < kNames.size(); ++i) (*v)[i] = std::string(kNames[i].second);
    return v;
  }();
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i].first == c) return (*names)[i];
  return names->back();  // Unknown
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
  static const auto* values = new std::vector<FailureClass>{
      C::kUserError, C::kOOMKilled,  C::kPreempted,      C::kEvicted, C::kGPUError, C::kNodeLost,
      C::kTimeout,   C::kSetupError, C::kLivenessFailed, C::kIdle,    C::kStalled};
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
