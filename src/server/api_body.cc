// Decoding of the API's JSON request bodies (declared in api.h). Kept out of api.cc so that the
// fuzz harness (fuzz/api_json_fuzz.cc) compiles this file alone, without the store, runtime and
// health code the routes need.
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/hash.h"
#include "server/api.h"

namespace tau::server {
namespace {

using nlohmann::json;

// The DOM parser, counting what it builds and refusing past the bounds: each value costs 16 bytes
// or more in the DOM (a member of an object some 80 more), so a body of tiny elements would take
// many times its size in memory.
class BoundedSax {
 public:
  explicit BoundedSax(json* root) : dom_(*root, /*allow_exceptions_=*/false) {}

  bool null() { return Count() && dom_.null(); }
  bool boolean(bool v) { return Count() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return Count() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Count() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return Count() && dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return Count() && dom_.string(v); }
  bool binary(json::binary_t& v) { return Count() && dom_.binary(v); }
  bool start_object(std::size_t n) { return Count() && Deeper() && dom_.start_object(n); }
  bool key(json::string_t& v) { return dom_.key(v); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Count() && Deeper() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& e) {
    return dom_.parse_error(position, last_token, e);
  }

  // Why the parse stopped at a bound; OK when it did not.
  const Status& exceeded() const { return exceeded_; }

 private:
  bool Count() {
    if (++elements_ <= kMaxJsonElements) return true;
    exceeded_ = ResourceExhausted(
        fmt::format("request body holds more than {} JSON values, the most a request may hold",
                    kMaxJsonElements));
    return false;
  }
  bool Deeper() {
    if (++depth_ <= kMaxJsonDepth) return true;
    exceeded_ = InvalidArgument(
        fmt::format("request body nests JSON deeper than {} levels", kMaxJsonDepth));
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  size_t elements_ = 0;
  int depth_ = 0;
  Status exceeded_;
};

// Invalid JSON is a discarded value, which each body's parser words in its own terms; a body past
// the bounds is the error naming the bound.
Result<json> ParseObject(std::string_view body) { return ParseJsonBody(body); }

// An optional string member: the fallback when absent. json::value() would throw on a member of
// another type, which the HTTP layer reports as a 500; the client's mistake deserves a 400.
Result<std::string> OptionalString(const json& object, const char* key, const char* where,
                                   std::string fallback) {
  auto it = object.find(key);
  if (it == object.end()) return fallback;
  if (!it->is_string()) return InvalidArgument(fmt::format("{}{} must be a string", where, key));
  return it->get<std::string>();
}

Result<std::vector<CodeManifestEntry>> ParseManifest(const json& files, const char* where) {
  if (!files.is_array())
    return InvalidArgument(
        fmt::format("{} must be an array of {{path, mode, size, sha256}}", where));
  std::vector<CodeManifestEntry> out;
  out.reserve(files.size());
  for (const json& f : files) {
    auto member = [&](const char* key, json::value_t type) {
      auto it = f.find(key);
      return it != f.end() && (it->type() == type ||
                               (type == json::value_t::number_integer && it->is_number_unsigned()));
    };
    if (!f.is_object() || !member("path", json::value_t::string) ||
        !member("sha256", json::value_t::string) || !member("size", json::value_t::number_integer))
      return InvalidArgument(
          fmt::format("each entry of {} needs 'path' and 'sha256' strings and an integer 'size' "
                      "('mode' optional)",
                      where));
    CodeManifestEntry e;
    e.path = f["path"].get<std::string>();
    e.sha256 = f["sha256"].get<std::string>();
    // An unsigned size past int64 reads as -1: refused by the size check, never wrapped.
    e.size = f["size"].is_number_unsigned() && f["size"].get<uint64_t>() > INT64_MAX
                 ? -1
                 : f["size"].get<int64_t>();
    e.mode = f.contains("mode") && f["mode"].is_number_integer() ? f["mode"].get<int>() : 0644;
    out.push_back(std::move(e));
  }
  return out;
}

// Members of `object` other than `known` are refused, named by their path: a batch never takes a
// member and ignores it.
Status OnlyMembers(const json& object, std::initializer_list<const char*> known,
                   const std::string& where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok)
      return InvalidArgument(fmt::format("{}{}: unknown member (known: {})", where, it.key(), [&] {
        std::string names;
        for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
        return names;
      }()));
  }
  return Status::Ok();
}

// A code object as a single submission's `code`, at `where` ("codes[0]."): {"files"} or
// {"manifest"}, and "dir".
Result<BatchCode> ParseBatchCode(const json& code, const std::string& where) {
  if (!code.is_object() || code.contains("files") == code.contains("manifest"))
    return InvalidArgument(fmt::format(
        "{}: must be an object with a 'files' array (the contents inline) or a 'manifest' array "
        "(blobs uploaded first), not both",
        where.substr(0, where.size() - 1)));
  TAU_RETURN_IF_ERROR(OnlyMembers(code, {"files", "manifest", "dir"}, where));
  BatchCode out;
  if (code.contains("manifest")) {
    const std::string at = where + "manifest";
    TAU_ASSIGN_OR_RETURN(out.manifest, ParseManifest(code["manifest"], at.c_str()));
  } else {
    if (!code["files"].is_array()) return InvalidArgument(where + "files must be an array");
    for (const json& f : code["files"]) {
      if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("data") ||
          !f["data"].is_string())
        return InvalidArgument(where + "files: each file needs 'path' and 'data' (base64) strings");
      CodeFile cf;
      cf.path = f["path"].get<std::string>();
      cf.mode = f.contains("mode") && f["mode"].is_number_integer() ? f["mode"].get<int>() : 0644;
      TAU_ASSIGN_OR_RETURN(cf.data, Base64Decode(f["data"].get_ref<const std::string&>()));
      out.files.push_back(std::move(cf));
    }
  }
  TAU_ASSIGN_OR_RETURN(out.dir, OptionalString(code, "dir", where.c_str(), ""));
  return out;
}

// spec.set: the --set overrides, ["PATH=VALUE", ...], checked as the CLI checks them.
Result<std::vector<spec::Override>> ParseSet(const json& object, const std::string& where) {
  auto it = object.find("set");
  if (it == object.end()) return std::vector<spec::Override>();
  std::vector<std::string> texts;
  if (it->is_array())
    for (const json& t : *it)
      if (t.is_string()) texts.push_back(t.get<std::string>());
  if (!it->is_array() || texts.size() != it->size())
    return InvalidArgument(where + "set must be an array of \"PATH=VALUE\" strings");
  return spec::ParseOverrides(texts);
}

Result<int64_t> IntegerMember(const json& object, const char* key, const std::string& where) {
  const json& v = object[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
    return InvalidArgument(fmt::format("{}{} must be an integer", where, key));
  return v.get<int64_t>();
}

// A workflow item's "after": [{"stage": S, "condition": "succeeded"|"finished"}, ...].
Result<std::vector<spec::StageDependency>> ParseAfter(const json& after, const std::string& where) {
  if (!after.is_array())
    return InvalidArgument(where + " must be an array of {\"stage\", \"condition\"?}");
  std::vector<spec::StageDependency> out;
  for (size_t i = 0; i < after.size(); ++i) {
    const json& a = after[i];
    const std::string at = fmt::format("{}[{}].", where, i);
    if (!a.is_object() || !a.contains("stage") || !a["stage"].is_string())
      return InvalidArgument(fmt::format("{}[{}] must be {{\"stage\", \"condition\"?}}", where, i));
    TAU_RETURN_IF_ERROR(OnlyMembers(a, {"stage", "condition"}, at));
    spec::StageDependency d;
    d.stage = a["stage"].get<std::string>();
    TAU_ASSIGN_OR_RETURN(std::string condition,
                         OptionalString(a, "condition", at.c_str(), "succeeded"));
    auto c = spec::ParseCondition(condition);
    if (!c)
      return InvalidArgument(at + "condition: 'succeeded' or 'finished', not '" + condition + "'");
    d.condition = *c;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

Result<json> ParseJsonBody(std::string_view body) {
  json root;
  BoundedSax sax(&root);
  if (json::sax_parse(body.begin(), body.end(), &sax)) return root;
  if (!sax.exceeded().ok()) return sax.exceeded();
  return json(json::value_t::discarded);
}

Result<BatchRequest> ParseBatchBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, ParseObject(body));
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  TAU_RETURN_IF_ERROR(OnlyMembers(j, {"codes", "runs", "array", "workflow"}, ""));
  if (!j.contains("runs") || !j["runs"].is_array())
    return InvalidArgument(
        "request needs 'runs': an array of {\"spec\": {\"yaml\", \"file\"?}, \"code\"?, "
        "\"array_index\"?}");
  const json& runs = j["runs"];
  if (runs.empty()) return InvalidArgument("runs: a batch needs at least one run");
  if (runs.size() > kMaxBatchRuns)
    return ResourceExhausted(
        fmt::format("runs: a batch holds at most {} runs; this one has {}: send it as several",
                    kMaxBatchRuns, runs.size()));
  BatchRequest out;
  if (j.contains("codes")) {
    if (!j["codes"].is_array()) return InvalidArgument("codes must be an array of code objects");
    for (size_t i = 0; i < j["codes"].size(); ++i) {
      TAU_ASSIGN_OR_RETURN(BatchCode code,
                           ParseBatchCode(j["codes"][i], fmt::format("codes[{}].", i)));
      out.codes.push_back(std::move(code));
    }
  }
  const size_t shared = out.codes.size();
  std::optional<size_t> no_code;  // the one empty code that items without code share
  out.items.reserve(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const json& run = runs[i];
    const std::string where = fmt::format("runs[{}].", i);
    if (!run.is_object()) return InvalidArgument(fmt::format("runs[{}] must be an object", i));
    TAU_RETURN_IF_ERROR(OnlyMembers(run, {"spec", "code", "array_index", "stage", "after"}, where));
    if (!run.contains("spec") || !run["spec"].is_object() || !run["spec"].contains("yaml") ||
        !run["spec"]["yaml"].is_string())
      return InvalidArgument(where + "spec.yaml (the tau.yaml text) must be a string");
    TAU_RETURN_IF_ERROR(OnlyMembers(run["spec"], {"yaml", "file", "set"}, where + "spec."));
    BatchItem item;
    item.spec_yaml = run["spec"]["yaml"].get<std::string>();
    TAU_ASSIGN_OR_RETURN(item.spec_overrides, ParseSet(run["spec"], where + "spec."));
    TAU_ASSIGN_OR_RETURN(
        item.spec_file, OptionalString(run["spec"], "file", (where + "spec.").c_str(), "tau.yaml"));
    if (!run.contains("code")) {
      if (!no_code) {
        no_code = out.codes.size();
        out.codes.emplace_back();
      }
      item.code = *no_code;
    } else if (run["code"].is_number_integer()) {
      TAU_ASSIGN_OR_RETURN(int64_t index, IntegerMember(run, "code", where));
      if (index < 0 || static_cast<size_t>(index) >= shared)
        return InvalidArgument(
            fmt::format("{}code: {} is not an index of 'codes' (it has {})", where, index, shared));
      item.code = static_cast<size_t>(index);
    } else {
      TAU_ASSIGN_OR_RETURN(BatchCode code, ParseBatchCode(run["code"], where + "code."));
      item.code = out.codes.size();
      out.codes.push_back(std::move(code));
    }
    if (run.contains("array_index")) {
      TAU_ASSIGN_OR_RETURN(item.array_index, IntegerMember(run, "array_index", where));
    }
    TAU_ASSIGN_OR_RETURN(item.stage, OptionalString(run, "stage", where.c_str(), ""));
    if (run.contains("after")) {
      TAU_ASSIGN_OR_RETURN(item.after, ParseAfter(run["after"], where + "after"));
    }
    out.items.push_back(std::move(item));
  }
  if (j.contains("array")) {
    const json& a = j["array"];
    if (!a.is_object() || !a.contains("first") || !a.contains("last"))
      return InvalidArgument("array must be {\"first\", \"last\", \"step\"?} (integers)");
    TAU_RETURN_IF_ERROR(OnlyMembers(a, {"first", "last", "step", "max_parallel"}, "array."));
    BatchArray array;
    TAU_ASSIGN_OR_RETURN(array.first, IntegerMember(a, "first", "array."));
    TAU_ASSIGN_OR_RETURN(array.last, IntegerMember(a, "last", "array."));
    if (a.contains("step")) {
      TAU_ASSIGN_OR_RETURN(array.step, IntegerMember(a, "step", "array."));
    }
    if (a.contains("max_parallel")) {
      TAU_ASSIGN_OR_RETURN(array.max_parallel, IntegerMember(a, "max_parallel", "array."));
    }
    out.array = array;
  }
  if (j.contains("workflow")) {
    if (!j["workflow"].is_string() || j["workflow"].get<std::string>().empty())
      return InvalidArgument("workflow must be the workflow's name (a string)");
    out.workflow = j["workflow"].get<std::string>();
  }
  return out;
}

Result<std::vector<CodeManifestEntry>> ParseManifestBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, ParseObject(body));
  if (j.is_discarded() || !j.is_object() || !j.contains("files"))
    return InvalidArgument(
        "request needs {\"files\": [{\"path\", \"mode\", \"size\", \"sha256\"}]}");
  return ParseManifest(j["files"], "files");
}

Result<SubmitRequest> ParseSubmitBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, ParseObject(body));
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  if (!j.contains("spec") || !j["spec"].is_object() || !j["spec"].contains("yaml") ||
      !j["spec"]["yaml"].is_string())
    return InvalidArgument("request needs spec.yaml (the tau.yaml text) as a string");
  SubmitRequest req;
  req.spec_yaml = j["spec"]["yaml"].get<std::string>();
  TAU_ASSIGN_OR_RETURN(req.spec_file, OptionalString(j["spec"], "file", "spec.", "tau.yaml"));
  TAU_ASSIGN_OR_RETURN(req.spec_overrides, ParseSet(j["spec"], "spec."));
  if (j.contains("code")) {
    const json& code = j["code"];
    if (!code.is_object() || code.contains("files") == code.contains("manifest"))
      return InvalidArgument(
          "code must be an object with a 'files' array (the contents inline) or a 'manifest' "
          "array (blobs uploaded first), not both");
    if (code.contains("manifest")) {
      TAU_ASSIGN_OR_RETURN(req.manifest, ParseManifest(code["manifest"], "code.manifest"));
    } else if (!code["files"].is_array()) {
      return InvalidArgument("code.files must be an array");
    }
    // Not code.value(): that copies the files, their contents with them.
    static const json kNoFiles = json::array();
    for (const json& f : code.contains("files") ? code["files"] : kNoFiles) {
      if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("data") ||
          !f["data"].is_string())
        return InvalidArgument("each code file needs 'path' and 'data' (base64) strings");
      CodeFile cf;
      cf.path = f["path"].get<std::string>();
      cf.mode = f.contains("mode") && f["mode"].is_number_integer() ? f["mode"].get<int>() : 0644;
      TAU_ASSIGN_OR_RETURN(cf.data, Base64Decode(f["data"].get_ref<const std::string&>()));
      req.code.push_back(std::move(cf));
    }
    TAU_ASSIGN_OR_RETURN(req.code_dir, OptionalString(code, "dir", "code.", ""));
  }
  return req;
}

namespace {

Result<ValidateBody> ValidateBodyOf(const json& j) {
  if (j.is_discarded() || !j.is_object() || !j.contains("yaml") || !j["yaml"].is_string())
    return InvalidArgument("request needs 'yaml' (the spec text) as a string");
  ValidateBody out;
  out.yaml = j["yaml"].get<std::string>();
  TAU_ASSIGN_OR_RETURN(out.file, OptionalString(j, "file", "", "tau.yaml"));
  return out;
}

}  // namespace

Result<ValidateBody> ParseValidateBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, ParseObject(body));
  return ValidateBodyOf(j);
}

Result<ResolveBody> ParseResolveBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, ParseObject(body));
  ResolveBody out;
  TAU_ASSIGN_OR_RETURN(out.spec, ValidateBodyOf(j));
  TAU_ASSIGN_OR_RETURN(out.set, ParseSet(j, ""));
  return out;
}

Result<TokenBody> ParseTokenBody(std::string_view body) {
  constexpr int64_t kMaxTokenLifetimeMs = int64_t{10} * 365 * 24 * 3600 * 1000;
  TAU_ASSIGN_OR_RETURN(json j, body.empty() ? Result<json>(json::object()) : ParseObject(body));
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  auto string_member = [&](const char* key) -> Result<std::string> {
    if (j.contains(key) && j[key].is_null()) return std::string();  // null reads as absent
    return OptionalString(j, key, "", "");
  };
  TokenBody r;
  TAU_ASSIGN_OR_RETURN(r.user, string_member("user"));
  TAU_ASSIGN_OR_RETURN(r.description, string_member("description"));
  if (r.description.size() > 1024) return InvalidArgument("'description' is over 1024 bytes");
  if (auto it = j.find("groups"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 256)
      return InvalidArgument("'groups' must be a list of at most 256 group names");
    for (const json& g : *it) {
      if (!g.is_string() || g.get<std::string>().empty() ||
          g.get<std::string>().find_first_of(" \t:*") != std::string::npos)
        return InvalidArgument("'groups' must hold group names (no spaces, ':' or '*')");
      r.groups.push_back(g.get<std::string>());
    }
  }
  TAU_ASSIGN_OR_RETURN(std::string expires, string_member("expires_in"));
  if (!expires.empty()) {
    auto ms = ParseDurationMillis(expires);
    if (!ms.ok() || *ms <= 0 || *ms > kMaxTokenLifetimeMs)
      return InvalidArgument(fmt::format(
          "'expires_in' must be a duration such as 12h or 90d, at most ten years; got '{}'",
          expires));
    r.expires_in_ms = *ms;
  }
  if (r.user.size() > 256 || r.user.find_first_of(" \t:*/") != std::string::npos)
    return InvalidArgument(fmt::format("'{}' is not a user name", r.user));
  return r;
}

Result<std::string> ParseSingleStringBody(std::string_view body, const char* member) {
  TAU_ASSIGN_OR_RETURN(json j, ParseObject(body));
  if (j.is_discarded() || !j.is_object() || !j.contains(member) || !j[member].is_string())
    return InvalidArgument(fmt::format("request needs {{\"{}\": \"...\"}}", member));
  return j[member].get<std::string>();
}

Result<RerunBody> ParseRerunBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, body.empty() ? Result<json>(json::object()) : ParseObject(body));
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  TAU_RETURN_IF_ERROR(OnlyMembers(j, {"set"}, ""));
  RerunBody out;
  TAU_ASSIGN_OR_RETURN(out.overrides, ParseSet(j, ""));
  return out;
}

Result<ResumeBody> ParseResumeBody(std::string_view body) {
  TAU_ASSIGN_OR_RETURN(json j, body.empty() ? Result<json>(json::object()) : ParseObject(body));
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  ResumeBody out;
  // Members of another type are ignored, as they always were.
  if (j.contains("from") && j["from"].is_string()) out.from = j["from"].get<std::string>();
  out.force = j.contains("force") && j["force"].is_boolean() && j["force"].get<bool>();
  return out;
}

}  // namespace tau::server
