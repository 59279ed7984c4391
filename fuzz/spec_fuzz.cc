// spec::ParseSpec on arbitrary bytes: both tau.yaml shapes through the strict YAML walker.
//
// Beyond "no crash, hang, leak or UB" it checks what the server relies on after a parse: a refused
// spec has at least one diagnostic with a position and a message; an accepted one has none, and its
// canonical JSON serializes (nlohmann throws on invalid UTF-8, which would fail the submission
// after the spec was accepted) and its config hash is stable across a second parse.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "spec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  tau::spec::ParseOutcome out = tau::spec::ParseSpec(text, "tau.yaml");
  if (!out.ok()) {
    TAU_FUZZ_CHECK(!out.diagnostics.empty());
    for (const tau::spec::Diagnostic& d : out.diagnostics) {
      TAU_FUZZ_CHECK(d.line >= 0 && d.column >= 0);
      TAU_FUZZ_CHECK(!d.message.empty());
    }
    TAU_FUZZ_CHECK(!out.ErrorText().empty());
    return 0;
  }
  TAU_FUZZ_CHECK(out.diagnostics.empty());
  const tau::spec::RunSpec& spec = *out.spec;
  std::string canonical = tau::spec::ToJson(spec).dump();
  TAU_FUZZ_CHECK(!canonical.empty());
  std::string hash = tau::spec::ConfigHash(spec);
  TAU_FUZZ_CHECK(hash.size() == 64);
  tau::spec::ParseOutcome again = tau::spec::ParseSpec(text, "tau.yaml");
  TAU_FUZZ_CHECK(again.ok() && tau::spec::ConfigHash(*again.spec) == hash);
  return 0;
}
