// Value checks and the setters that need more than one line: names, paths, env, pip, retry classes.
#include "spec/checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "common/strings.h"
#include "recovery/failure_class.h"

namespace tau::spec::internal {
namespace {

// Lowercases and replaces what a DNS label cannot hold, for the hint on a bad name.
std::string LabelSuggestion(std::string_view s, size_t max_len) {
  std::string out;
  for (char c : s) {
    char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bool ok = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9');
    if (ok) {
      out += l;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  if (out.size() > max_len) out.resize(max_len);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

bool CheckNoNewline(Ctx& c, const std::string& path, const std::string& text, Pos pos) {
  if (text.find_first_of("\r\n") == std::string::npos) return true;
  c.Error(pos, fmt::format("{}: must be a single line", path));
  return false;
}

// Normalises a relative path lexically ("./a//b/../c" -> "a/c") and refuses one that leaves `root`
// (named in the messages).
Result<std::string> NormalizeRelative(std::string_view path, std::string_view root) {
  if (StartsWith(path, "/") || StartsWith(path, "~")) {
    return InvalidArgument(
        fmt::format("'{}' is an absolute path; give a path relative to {}", path, root));
  }
  if (path.find('\\') != std::string_view::npos) {
    return InvalidArgument(fmt::format("'{}' uses '\\'; separate path parts with '/'", path));
  }
  std::vector<std::string> parts;
  for (const std::string& part : Split(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty()) {
        return InvalidArgument(fmt::format("'{}' leaves {}", path, root));
      }
      parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  if (parts.empty()) return InvalidArgument(fmt::format("'{}' names no file", path));
  return Join(parts, "/");
}

// The entrypoint is either a path inside the code directory ("train.py", "src/run.sh") or a bare
// command looked up on PATH ("python3"). Arguments go in run.args, so there is never a shell line
// to split.
Result<std::string> NormalizeEntrypoint(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return InvalidArgument("must not contain control characters");
    }
    if (c == ' ') {
      return InvalidArgument(fmt::format(
          "'{}' holds a space: give one path or command here and its arguments in run.args", text));
    }
  }
  if (StartsWith(text, "-")) {
    return InvalidArgument(fmt::format("'{}' starts with '-'; name a script or command", text));
  }
  if (EndsWith(text, "/")) {
    return InvalidArgument(fmt::format("'{}' names a directory; name a script in it", text));
  }
  // Leading '..' parts are kept: TauGrid resolves `../train.py` against the project, and tau ships
  // the folder such a path reaches (the CLI picks the code's root from it).
  size_t up = 0;
  std::string rest(text);
  while (StartsWith(rest, "../") || StartsWith(rest, "./")) {
    if (StartsWith(rest, "../")) ++up;
    rest.erase(0, rest.find('/') + 1);
    while (StartsWith(rest, "/")) rest.erase(0, 1);
  }
  if (up == 0) return NormalizeRelative(text, "the code directory");
  TAU_ASSIGN_OR_RETURN(std::string inside, NormalizeRelative(rest, "the folder it reaches"));
  std::string out;
  for (size_t i = 0; i < up; ++i) out += "../";
  return out + inside;
}

}  // namespace

bool CheckLabel(Ctx& c, const Value& v, size_t max_len, std::string_view what) {
  if (IsDns1123Label(v.text, max_len)) return true;
  if (v.text.size() > max_len) {
    c.Error(v.pos, fmt::format("{}: '{}' is {} characters long; at most {} allowed{}", v.path,
                               v.text, v.text.size(), max_len, what));
    return false;
  }
  std::string suggestion = LabelSuggestion(v.text, max_len);
  c.Error(v.pos, fmt::format("{}: '{}' is not a DNS-1123 label (lowercase letters, digits and '-', "
                             "starting and ending with a letter or digit){}",
                             v.path, v.text,
                             suggestion.empty() || suggestion == v.text
                                 ? ""
                                 : fmt::format(" (did you mean '{}'?)", suggestion)));
  return false;
}

bool CheckSubdomain(Ctx& c, const Value& v) {
  if (IsDnsSubdomain(v.text)) return true;
  c.Error(v.pos,
          fmt::format("{}: '{}' is not a valid Kubernetes name (lowercase letters, digits, '-' "
                      "and '.')",
                      v.path, v.text));
  return false;
}

void SetName(Ctx& c, const Value& v) {
  if (CheckLabel(c, v, kMaxNameChars, " (tau appends a run suffix)")) c.spec.name = v.text;
}

void SetEntrypoint(Ctx& c, const Value& v, const char* alias) {
  std::string self = v.path;
  if (alias != nullptr && c.Seen(alias)) {
    c.Error(v.key_pos, fmt::format("both '{}' and '{}' are set; 'script' is an alias of "
                                   "'entrypoint': keep one",
                                   alias, self));
    return;
  }
  Result<std::string> normalized = NormalizeEntrypoint(v.text);
  if (!normalized.ok()) {
    c.Error(v.pos, fmt::format("{}: {}", v.path, normalized.status().message()));
    return;
  }
  c.spec.entrypoint = *normalized;
  c.spelled[v.path] = {*normalized, v.pos};
}

void SetArgs(Ctx& c, const Value& v) { c.spec.args = v.list; }

// Env values are strings; unquoted numbers and booleans are accepted and keep their YAML spelling
// (`DEBUG: true` is "true", `RATE: 1.50` is "1.50"), because that is what a shell user expects to
// read back.
void SetEnv(Ctx& c, const Value& v) {
  if (v.pairs.size() > kMaxEnvVars) {
    c.Error(v.pos, fmt::format("{}: {} variables; at most {} allowed", v.path, v.pairs.size(),
                               kMaxEnvVars));
    return;
  }
  size_t total = 0;
  for (const Pair& p : v.pairs) {
    if (!IsEnvVarName(p.key)) {
      c.Error(p.key_pos, fmt::format("{}: '{}' is not a valid environment variable name "
                                     "([A-Za-z_][A-Za-z0-9_]*)",
                                     v.path, Printable(p.key)));
      continue;
    }
    if (auto other = c.env_pos.find(p.key); other != c.env_pos.end()) {
      c.Error(p.key_pos, fmt::format("{}: '{}' is also set in {} (line {}); set it in one place",
                                     v.path, p.key, other->second.text, other->second.pos.line));
      continue;
    }
    c.env_pos[p.key] = {v.path, p.key_pos};
    EnvVar var{p.key, p.value, false, ""};
    if (StartsWith(p.value, "SECRET:")) {
      var.value = p.value.substr(7);
      var.secret_ref = true;
      if (!IsSecretKey(var.value)) {
        c.Error(p.value_pos, fmt::format("{}.{}: 'SECRET:' must be followed by a secret key "
                                         "(letters, digits, '-', '_', '.')",
                                         v.path, p.key));
        continue;
      }
    } else if (p.value.size() > kMaxEnvValueBytes) {
      c.Error(p.value_pos, fmt::format("{}.{}: value is {} bytes; at most {} allowed", v.path,
                                       p.key, p.value.size(), kMaxEnvValueBytes));
      continue;
    } else {
      total += p.value.size();
    }
    c.spec.runtime.env.push_back(std::move(var));
  }
  if (total > kMaxEnvTotalBytes) {
    c.Error(v.pos,
            fmt::format("{}: values total {} bytes; at most {} allowed (use a secret or a file)",
                        v.path, total, kMaxEnvTotalBytes));
  }
}

// TauGrid's env_secret: VAR: "SECRET_NAME:KEY", split at the first ':'.
void SetEnvSecret(Ctx& c, const Value& v) {
  for (const Pair& p : v.pairs) {
    if (!IsEnvVarName(p.key)) {
      c.Error(p.key_pos, fmt::format("{}: '{}' is not a valid environment variable name "
                                     "([A-Za-z_][A-Za-z0-9_]*)",
                                     v.path, Printable(p.key)));
      continue;
    }
    std::string path = fmt::format("{}.{}", v.path, p.key);
    size_t colon = p.value.find(':');
    std::string name = colon == std::string::npos ? "" : p.value.substr(0, colon);
    std::string key = colon == std::string::npos ? "" : p.value.substr(colon + 1);
    if (name.empty() || key.empty() || Trim(name) != name || Trim(key) != key) {
      c.Error(p.value_pos, fmt::format("{}: expected SECRET_NAME:KEY (a Kubernetes Secret and a "
                                       "key in it), got '{}'",
                                       path, Printable(p.value)));
      continue;
    }
    if (!IsDnsSubdomain(name)) {
      c.Error(p.value_pos, fmt::format("{}: secret name '{}' is not a valid Kubernetes name "
                                       "(lowercase letters, digits, '-' and '.')",
                                       path, Printable(name)));
      continue;
    }
    if (!IsSecretKey(key)) {
      c.Error(p.value_pos, fmt::format("{}: secret key '{}' may hold only letters, digits, '-', "
                                       "'_' and '.'",
                                       path, Printable(key)));
      continue;
    }
    if (auto other = c.env_pos.find(p.key); other != c.env_pos.end()) {
      c.Error(p.key_pos, fmt::format("{}: '{}' is also set in {} (line {}); set it in one place",
                                     v.path, p.key, other->second.text, other->second.pos.line));
      continue;
    }
    c.env_pos[p.key] = {v.path, p.key_pos};
    c.spec.runtime.env.push_back(EnvVar{p.key, key, true, name});
  }
}

// Globs relative to the code directory: no absolute paths, no '..' parts.
void SetCodeExcludes(Ctx& c, const Value& v) {
  for (size_t i = 0; i < v.list.size(); ++i) {
    const std::string& glob = v.list[i];
    std::string path = fmt::format("{}[{}]", v.path, i);
    if (!CheckNoNewline(c, path, glob, v.list_pos[i])) continue;
    if (StartsWith(glob, "/") || StartsWith(glob, "~")) {
      c.Error(v.list_pos[i], fmt::format("{}: '{}' is an absolute path; give a glob relative to "
                                         "the code directory",
                                         path, glob));
      continue;
    }
    if (glob.find('\\') != std::string::npos) {
      c.Error(v.list_pos[i],
              fmt::format("{}: '{}' uses '\\'; separate path parts with '/'", path, glob));
      continue;
    }
    std::vector<std::string> parts = Split(glob, '/');
    if (std::find(parts.begin(), parts.end(), "..") != parts.end()) {
      c.Error(v.list_pos[i],
              fmt::format("{}: '{}' has a '..' part; excludes name files inside the code directory",
                          path, glob));
      continue;
    }
    c.spec.code_excludes.push_back(glob);
  }
}

void SetPip(Ctx& c, const Value& v) {
  for (size_t i = 0; i < v.list.size(); ++i) {
    std::string path = fmt::format("{}[{}]", v.path, i);
    if (!CheckNoNewline(c, path, v.list[i], v.list_pos[i])) continue;
    if (StartsWith(v.list[i], "-")) {
      // Options such as --index-url would change where every package comes from; keep the list to
      // specifiers.
      c.Error(v.list_pos[i],
              fmt::format("{}: '{}' is a pip option; list requirement specifiers only", path,
                          v.list[i]));
      continue;
    }
    c.spec.runtime.pip.push_back(v.list[i]);
  }
}

void SetNodeSelector(Ctx& c, const Value& v) {
  for (const Pair& p : v.pairs) {
    if (!IsLabelKey(p.key)) {
      c.Error(p.key_pos,
              fmt::format("{}: '{}' is not a valid label key", v.path, Printable(p.key)));
    } else if (!IsLabelValue(p.value)) {
      c.Error(p.value_pos, fmt::format("{}.{}: '{}' is not a valid label value", v.path, p.key,
                                       Printable(p.value)));
    } else {
      c.spec.policy.node_selector[p.key] = p.value;
    }
  }
}

void SetRetryOn(Ctx& c, const Value& v) {
  c.spec.resilience.retry_on_set = true;
  const std::vector<std::string>& allowed = RetryableFailureClasses();
  for (size_t i = 0; i < v.list.size(); ++i) {
    const std::string& item = v.list[i];
    std::string path = fmt::format("{}[{}]", v.path, i);
    Pos pos = v.list_pos[i];
    const std::optional<recovery::FailureClass> cls = recovery::ParseFailureClass(item);
    const std::vector<recovery::FailureClass>& retryable = recovery::RetryableFailureClasses();
    if (cls == recovery::FailureClass::kUnknown) {
      c.Error(pos, path + ": 'Unknown' is never retried: tau cannot tell whether a retry is safe");
    } else if (cls == recovery::FailureClass::kCancelled) {
      c.Error(pos, path + ": 'Cancelled' is not retryable: a cancelled run stays cancelled");
    } else if (cls == recovery::FailureClass::kSucceeded) {
      c.Error(pos, path + ": 'Succeeded' is not a failure class");
    } else if (!cls || std::find(retryable.begin(), retryable.end(), *cls) == retryable.end()) {
      std::string close = Suggest(item, allowed);
      c.Error(pos, fmt::format("{}: unknown failure class '{}'{}; allowed: {}", path, item,
                               close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close),
                               Join(allowed, ", ")));
    } else if (std::find(c.spec.resilience.retry_on.begin(), c.spec.resilience.retry_on.end(),
                         item) != c.spec.resilience.retry_on.end()) {
      c.Error(pos, fmt::format("{}: '{}' is listed twice", path, item));
    } else {
      c.spec.resilience.retry_on.push_back(item);
    }
  }
}

void SetHistory(Ctx& c, const Value& v) {
  for (size_t i = 0; i < v.list.size(); ++i) {
    Result<std::string> normalized = NormalizeRelative(v.list[i], "storage.output");
    if (!normalized.ok()) {
      c.Error(v.list_pos[i], fmt::format("{}[{}]: {}", v.path, i, normalized.status().message()));
      continue;
    }
    c.spec.metrics.history.push_back(*normalized);
  }
}

}  // namespace tau::spec::internal

namespace tau::spec {

bool IsSecretKey(std::string_view s) {
  return !s.empty() && s.size() <= internal::kMaxSubdomainChars &&
         std::all_of(s.begin(), s.end(), [](char ch) {
           return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ||
                  ch == '.';
         });
}

}  // namespace tau::spec
