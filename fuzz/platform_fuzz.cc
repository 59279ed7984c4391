// policy::ParsePlatform on arbitrary bytes: platform.yaml, its admission sections and the
// cross-references between queues, cohorts, flavors, priorities, workspaces, profiles and storage.
//
// Beyond "no crash, hang, leak or UB" it checks the promises policy.h makes about a parsed
// platform: the admission engine accepts its configuration (ToAdmissionConfig), `tau platform show`
// can print it (ToJson serializes), and resolving a plain run against it returns a result or a
// reasoned refusal.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "admission/admission.h"
#include "fuzz_check.h"
#include "policy/policy.h"
#include "spec/spec.h"

namespace {

// A run that asks for something of every kind, so resolution walks defaults, profiles and limits.
const tau::spec::RunSpec& PlainRun() {
  static const tau::spec::RunSpec spec = *tau::spec::ParseSpec(
                                              R"(schema_version: 1
name: fuzz
run:
  entrypoint: train.py
compute:
  gpus: 1
  workers: 2
  cpus: 2
  memory: 4Gi
)",
                                              "tau.yaml")
                                              .spec;
  return spec;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  tau::policy::PlatformOutcome out = tau::policy::ParsePlatform(text, "platform.yaml");
  if (!out.ok()) {
    TAU_FUZZ_CHECK(!out.diagnostics.empty());
    for (const tau::policy::Diagnostic& d : out.diagnostics) TAU_FUZZ_CHECK(!d.message.empty());
    return 0;
  }
  TAU_FUZZ_CHECK(out.diagnostics.empty());
  const tau::policy::Platform& platform = *out.platform;
  TAU_FUZZ_CHECK(tau::admission::Engine::Create(tau::policy::ToAdmissionConfig(platform)).ok());
  TAU_FUZZ_CHECK(!tau::policy::ToJson(platform).dump().empty());
  auto resolved = tau::policy::Resolve(PlainRun(), platform, "alice");
  if (resolved.ok()) {
    (void)tau::policy::ExplainText(*resolved);
  } else {
    TAU_FUZZ_CHECK(!resolved.status().message().empty());
  }
  return 0;
}
