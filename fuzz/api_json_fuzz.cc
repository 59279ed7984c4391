// The API's JSON request bodies on arbitrary bytes: POST /api/v1/runs (ParseSubmitBody, with the
// base64 code files or a code manifest), POST /api/v1/runs/batch (ParseBatchBody: every item's
// code is an index it holds), POST /api/v1/code/missing (ParseManifestBody), POST
// /api/v1/validate (ParseValidateBody), POST /api/v1/resolve (ParseResolveBody: its "set" checked
// as --set), POST /api/v1/runs/NAME/rerun (ParseRerunBody) and POST
// /api/v1/runs/NAME/resume (ParseResumeBody), POST /api/v1/tokens (ParseTokenBody), and the
// one-member bodies of /api/v1/session and workspace secrets (ParseSingleStringBody). Every input
// goes to all of them; they must refuse, never throw.
//
// For an accepted submission it also checks the round trip: encoding the decoded request again (as
// the CLI does) and decoding that gives the same request.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "fuzz_check.h"
#include "server/api.h"

namespace {

using nlohmann::json;
using tau::server::SubmitRequest;

json Encode(const std::vector<tau::CodeManifestEntry>& manifest) {
  json out = json::array();
  for (const tau::CodeManifestEntry& e : manifest)
    out.push_back({{"path", e.path}, {"mode", e.mode}, {"size", e.size}, {"sha256", e.sha256}});
  return out;
}

json Encode(const SubmitRequest& req) {
  json code = json::object();
  if (req.manifest) {
    code["manifest"] = Encode(*req.manifest);
  } else {
    json files = json::array();
    for (const tau::CodeFile& f : req.code)
      files.push_back({{"path", f.path}, {"mode", f.mode}, {"data", tau::Base64Encode(f.data)}});
    code["files"] = files;
  }
  json spec = {{"yaml", req.spec_yaml}, {"file", req.spec_file}};
  if (!req.spec_overrides.empty()) {
    json set = json::array();
    for (const tau::spec::Override& o : req.spec_overrides) set.push_back(o.Text());
    spec["set"] = set;
  }
  return {{"spec", spec}, {"code", code}};
}

bool Same(const std::vector<tau::CodeManifestEntry>& a,
          const std::vector<tau::CodeManifestEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].path != b[i].path || a[i].mode != b[i].mode || a[i].size != b[i].size ||
        a[i].sha256 != b[i].sha256)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);

  auto submit = tau::server::ParseSubmitBody(body);
  if (submit.ok()) {
    for (const tau::CodeFile& f : submit->code) {
      auto decoded = tau::Base64Decode(tau::Base64Encode(f.data));
      TAU_FUZZ_CHECK(decoded.ok() && *decoded == f.data);
    }
    auto again = tau::server::ParseSubmitBody(Encode(*submit).dump());
    TAU_FUZZ_CHECK(again.ok());
    TAU_FUZZ_CHECK(again->spec_yaml == submit->spec_yaml && again->spec_file == submit->spec_file);
    TAU_FUZZ_CHECK(again->spec_overrides.size() == submit->spec_overrides.size());
    for (size_t i = 0; i < again->spec_overrides.size(); ++i)
      TAU_FUZZ_CHECK(again->spec_overrides[i].Text() == submit->spec_overrides[i].Text());
    TAU_FUZZ_CHECK(again->manifest.has_value() == submit->manifest.has_value());
    if (submit->manifest) TAU_FUZZ_CHECK(Same(*again->manifest, *submit->manifest));
    TAU_FUZZ_CHECK(again->code.size() == submit->code.size());
    for (size_t i = 0; i < again->code.size(); ++i) {
      TAU_FUZZ_CHECK(again->code[i].path == submit->code[i].path);
      TAU_FUZZ_CHECK(again->code[i].mode == submit->code[i].mode);
      TAU_FUZZ_CHECK(again->code[i].data == submit->code[i].data);
    }
  } else {
    TAU_FUZZ_CHECK(!submit.status().message().empty());
  }

  auto batch = tau::server::ParseBatchBody(body);
  if (batch.ok()) {
    TAU_FUZZ_CHECK(!batch->items.empty() && batch->items.size() <= tau::server::kMaxBatchRuns);
    for (const tau::server::BatchItem& item : batch->items)
      TAU_FUZZ_CHECK(item.code < batch->codes.size());
  } else {
    TAU_FUZZ_CHECK(!batch.status().message().empty());
  }

  auto manifest = tau::server::ParseManifestBody(body);
  if (manifest.ok()) {
    auto again = tau::server::ParseManifestBody(json{{"files", Encode(*manifest)}}.dump());
    TAU_FUZZ_CHECK(again.ok() && Same(*again, *manifest));
  } else {
    TAU_FUZZ_CHECK(!manifest.status().message().empty());
  }

  auto validate = tau::server::ParseValidateBody(body);
  if (!validate.ok()) TAU_FUZZ_CHECK(!validate.status().message().empty());

  auto resolve = tau::server::ParseResolveBody(body);
  if (!resolve.ok()) TAU_FUZZ_CHECK(!resolve.status().message().empty());

  auto rerun = tau::server::ParseRerunBody(body);
  if (!rerun.ok()) TAU_FUZZ_CHECK(!rerun.status().message().empty());

  auto resume = tau::server::ParseResumeBody(body);
  if (!resume.ok()) TAU_FUZZ_CHECK(!resume.status().message().empty());

  auto token = tau::server::ParseTokenBody(body);
  if (token.ok()) {
    // What passed the checks is what the store may hold: names without separators.
    TAU_FUZZ_CHECK(token->user.find_first_of(" \t:*/") == std::string::npos);
    for (const std::string& g : token->groups) TAU_FUZZ_CHECK(!g.empty());
  } else {
    TAU_FUZZ_CHECK(!token.status().message().empty());
  }
  for (const char* member : {"token", "value"}) {
    auto single = tau::server::ParseSingleStringBody(body, member);
    if (!single.ok()) TAU_FUZZ_CHECK(!single.status().message().empty());
  }
  return 0;
}
