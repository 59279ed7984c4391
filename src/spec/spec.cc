// ParseSpec: byte-level checks, YAML loading, shape detection, the walk, and the checks that span
// fields. Nothing here throws: yaml-cpp's exceptions are caught and become diagnostics.
#include "spec/spec.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <sstream>
#include <tuple>

#include "common/clock.h"
#include "common/strings.h"
#include "spec/walk.h"

namespace tau::spec {

using internal::Ctx;
using internal::Pos;

const char* ShapeName(Shape shape) { return shape == Shape::kManifest ? "manifest" : "direct"; }

const char* WorkloadKindName(WorkloadKind k) { return k == WorkloadKind::kJob ? "job" : "rayjob"; }

recovery::RetryPolicy RetryPolicyOf(const Resilience& resilience) {
  recovery::RetryPolicy policy;
  policy.max_retries = resilience.max_retries;
  policy.retry_on_set = resilience.retry_on_set;
  for (const std::string& name : resilience.retry_on)
    if (auto cls = recovery::ParseFailureClass(name)) policy.retry_on.push_back(*cls);
  policy.backoff_initial_ms = resilience.backoff_initial_ms;
  policy.backoff_max_ms = resilience.backoff_max_ms;
  policy.max_retry_duration_ms = resilience.max_retry_duration_ms;
  return policy;
}

std::string Diagnostic::ToString() const {
  std::string where = file;
  if (line > 0) {
    where += fmt::format("{}{}", where.empty() ? "" : ":", line);
    if (column > 0) where += fmt::format(":{}", column);
  }
  return fmt::format("{}{}{}: {}", where, where.empty() ? "" : ": ", warning ? "warning" : "error",
                     message);
}

std::string SecretStoreKey(const EnvVar& var) {
  return var.secret_name.empty() ? var.value : var.secret_name + "." + var.value;
}

std::string LocateFieldErrors(std::string_view message, std::string_view filename,
                              const std::map<std::string, FieldPosition>& positions) {
  std::vector<std::string> out;
  for (const std::string& line : Split(std::string(message), '\n')) {
    if (line.empty()) continue;
    // "compute.gpus: ..." -> compute.gpus, else compute, else the file alone.
    size_t colon = line.find(": ");
    std::string field = colon == std::string::npos ? "" : line.substr(0, colon);
    bool is_field = !field.empty() && field.find(' ') == std::string::npos;
    Diagnostic d;
    d.file = std::string(filename);
    d.message = line;
    while (is_field && !field.empty()) {
      auto it = positions.find(field);
      if (it != positions.end()) {
        d.line = it->second.line;
        d.column = it->second.column;
        break;
      }
      size_t dot = field.rfind('.');
      field = dot == std::string::npos ? "" : field.substr(0, dot);
    }
    out.push_back(d.ToString());
  }
  return Join(out, "\n");
}

std::string ParseOutcome::ErrorText() const {
  std::vector<std::string> lines;
  for (const Diagnostic& d : diagnostics) lines.push_back(d.ToString());
  return Join(lines, "\n");
}

namespace {

// Binary junk and stray control characters are reported here, with a position, before yaml-cpp sees
// them.
bool CheckBytes(Ctx& ctx, std::string_view text) {
  int line = 1, column = 1;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      ctx.Error({line, column},
                fmt::format("invalid UTF-8 byte 0x{:02x}: tau.yaml must be UTF-8 text", c));
      return false;
    }
    if (c == 0 || (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) {
      ctx.Error({line, column},
                fmt::format("control character 0x{:02x} in the file (is it a binary file?)", c));
      return false;
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += n;
  }
  return true;
}

// yaml-cpp's message for a tab in indentation is cryptic; find the tab so the error can point at
// it.
std::optional<Pos> FirstIndentTab(std::string_view text) {
  int line = 1;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view row = text.substr(start, end - start);
    size_t indent = row.find_first_not_of(" \t");
    std::string_view lead = row.substr(0, indent == std::string_view::npos ? row.size() : indent);
    size_t tab = lead.find('\t');
    if (tab != std::string_view::npos && indent != std::string_view::npos && row[indent] != '#') {
      return Pos{line, static_cast<int>(tab) + 1};
    }
    ++line;
    start = end + 1;
  }
  return std::nullopt;
}

// Counts documents without building them. yaml-cpp 0.7 never reaches the end of some inputs (a ','
// after a top-level quoted scalar, e.g. `'a', 'b'`): each further HandleNextDocument() yields
// another empty document, so YAML::LoadAll() loops until memory runs out. Asking for at most two
// documents is always finite.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  std::vector<YAML::Mark> starts;
};

void ReportYamlError(Ctx& ctx, std::string_view text, const YAML::Exception& e) {
  Pos pos = internal::PosOf(e.mark);
  std::optional<Pos> tab = FirstIndentTab(text);
  if (tab && (pos.line == 0 || tab->line <= pos.line)) {
    ctx.Error(*tab, "tab character in indentation: YAML indents with spaces");
  } else {
    ctx.Error(pos, fmt::format("YAML syntax error: {}", e.msg));
  }
}

// Whether text after the first document could start another: YAML::Load reads the first and
// ignores the rest. After a top-level mapping in block style, only a document marker ('---' or
// '...' at the start of a line) ends a document; after a value in flow style, stray text does too.
bool MayHoldMoreDocuments(std::string_view text, const YAML::Node& root) {
  if (!root.IsMap() || root.Style() != YAML::EmitterStyle::Block) return true;
  for (size_t at = 0; at < text.size();) {
    std::string_view line = text.substr(at, text.find('\n', at) - at);
    if (StartsWith(line, "---") || StartsWith(line, "...")) return true;
    at += line.size() + 1;
  }
  return false;
}

std::optional<YAML::Node> LoadDocument(Ctx& ctx, std::string_view text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
    // Counting documents is a second parse, made only where a second document can be.
    if (MayHoldMoreDocuments(text, root)) {
      std::istringstream in{std::string(text)};
      YAML::Parser parser(in);
      DocumentCounter counter;
      for (int i = 0; i < 2 && parser.HandleNextDocument(counter); ++i) {
      }
      if (counter.starts.size() > 1) {
        ctx.Error(internal::PosOf(counter.starts[1]),
                  "more than one YAML document (a '---' separator, or stray text such as a ',' "
                  "after the first value); a spec is exactly one mapping");
        return std::nullopt;
      }
    }
  } catch (const YAML::DeepRecursion& e) {
    ctx.Error(internal::PosOf(e.mark), "the YAML is nested too deeply");
    return std::nullopt;
  } catch (const YAML::Exception& e) {
    ReportYamlError(ctx, text, e);
    return std::nullopt;
  }
  if (!root.IsDefined() || root.IsNull()) {
    ctx.Error({1, 1},
              "the file is empty: expected fields such as 'schema_version: 1' or 'engine: job'");
    return std::nullopt;
  }
  if (!root.IsMap()) {
    Pos pos = internal::PosOf(root.Mark());
    ctx.Error(pos.line ? pos : Pos{1, 1},
              fmt::format("expected a mapping of fields at the top level, got {}",
                          internal::Describe(root)));
    return std::nullopt;
  }
  return root;
}

// Which shape: schema_version means manifest, engine means direct. Reports both and neither.
std::optional<Shape> DetectShape(Ctx& ctx, const YAML::Node& root) {
  std::optional<Pos> version, engine;
  for (const auto& entry : root) {
    YAML::Node key = entry.first;
    if (!key.IsScalar()) continue;
    if (key.Scalar() == "schema_version" && !version) version = internal::PosOf(key.Mark());
    if (key.Scalar() == "engine" && !engine) engine = internal::PosOf(key.Mark());
  }
  if (version && engine) {
    Pos later = version->line > engine->line ? *version : *engine;
    ctx.Error(
        later,
        "both 'schema_version' (manifest shape) and 'engine' (direct shape) are set: keep "
        "'schema_version: 1' and put the engine in run.workload_kind, or drop schema_version");
    return std::nullopt;
  }
  if (version) return Shape::kManifest;
  if (engine) return Shape::kDirect;
  Pos pos = internal::PosOf(root.Mark());
  ctx.Error(pos.line ? pos : Pos{1, 1},
            "cannot tell the spec's shape: add 'schema_version: 1' (manifest shape) or "
            "'engine: job|rayjob' (direct shape)");
  return std::nullopt;
}

std::string Later(const Ctx& ctx, const std::string& a, const std::string& b) {
  Pos pa = ctx.KeyPos(a), pb = ctx.KeyPos(b);
  return std::tie(pa.line, pa.column) > std::tie(pb.line, pb.column) ? a : b;
}

// Direct-shape aliases: `script` for `entrypoint`, top-level `image`, `gpus` vs `gpus_per_worker`.
void ResolveDirectAliases(Ctx& ctx, Pos root) {
  RunSpec& spec = ctx.spec;
  if (!ctx.Seen("entrypoint") && !ctx.Seen("script")) {
    ctx.Error(root, "missing required field 'entrypoint' (or its alias 'script')");
  }
  if (spec.runtime.image.empty()) spec.runtime.image = ctx.top_level_image;
  if (ctx.direct_gpus && ctx.direct_gpus_per_worker &&
      *ctx.direct_gpus != *ctx.direct_gpus_per_worker) {
    ctx.Error(
        ctx.KeyPos(Later(ctx, "compute.gpus", "compute.gpus_per_worker")),
        fmt::format("compute.gpus ({}) and compute.gpus_per_worker ({}) disagree: both mean GPUs "
                    "per worker; give one",
                    *ctx.direct_gpus, *ctx.direct_gpus_per_worker));
  }
  if (ctx.direct_gpus_per_worker) {
    spec.compute.gpus = static_cast<int>(*ctx.direct_gpus_per_worker);
  } else if (ctx.direct_gpus) {
    spec.compute.gpus = static_cast<int>(*ctx.direct_gpus);
  }
  if (!ctx.kind_set) return;
  // Engine-specific fields (public TauGrid semantics): a Job takes its code from run.source and
  // runs in runtime.working_dir; a Ray job packs the local project named by run.working_dir.
  bool job = spec.kind == WorkloadKind::kJob;
  auto only_for = [&](const std::string& path, bool allowed, const char* engine) {
    if (ctx.Seen(path) && !allowed) {
      ctx.Error(ctx.KeyPos(path), fmt::format("{} is only for engine: {}", path, engine));
    }
  };
  only_for("run.source", job, "job");
  only_for("runtime.working_dir", job, "job");
  only_for("run.working_dir", !job, "rayjob");
}

// A limit below its request can never be scheduled; say so at parse time.
void CheckLimit(Ctx& ctx, const std::optional<Quantity>& limit,
                const std::optional<Quantity>& request, const std::string& limit_path,
                const char* what) {
  if (limit && request && *limit < *request) {
    ctx.Error(ctx.ValuePos(limit_path), fmt::format("{} ({}) is below the {} ({})", limit_path,
                                                    limit->ToString(), what, request->ToString()));
  }
}

void CheckCrossField(Ctx& ctx) {
  const Compute& c = ctx.spec.compute;
  auto or_default = [](const std::optional<Quantity>& a, const std::optional<Quantity>& b) {
    return a ? a : b;
  };
  CheckLimit(ctx, c.worker_cpu_limit, or_default(c.worker_cpus, c.cpus), "compute.worker_cpu_limit",
             "worker CPU request");
  CheckLimit(ctx, c.worker_memory_limit, or_default(c.worker_memory, c.memory),
             "compute.worker_memory_limit", "worker memory request");
  CheckLimit(ctx, c.head_cpu_limit, or_default(c.head_cpus, c.cpus), "compute.head_cpu_limit",
             "head CPU request");
  CheckLimit(ctx, c.head_memory_limit, or_default(c.head_memory, c.memory),
             "compute.head_memory_limit", "head memory request");
  const Resilience& r = ctx.spec.resilience;
  if (r.backoff_initial_ms > r.backoff_max_ms) {
    std::string path = ctx.Seen("resilience.backoff_initial") ? "resilience.backoff_initial"
                                                              : "resilience.backoff_max";
    ctx.Error(
        ctx.ValuePos(path),
        fmt::format("resilience.backoff_initial ({}) is longer than resilience.backoff_max ({}{})",
                    FormatDuration(r.backoff_initial_ms), FormatDuration(r.backoff_max_ms),
                    ctx.Seen("resilience.backoff_max") ? "" : ", the default"));
  }
}

void SortDiagnostics(std::vector<Diagnostic>& diagnostics) {
  // File order; diagnostics without a position (whole-file problems) go last.
  std::stable_sort(diagnostics.begin(), diagnostics.end(),
                   [](const Diagnostic& a, const Diagnostic& b) {
                     int la = a.line ? a.line : INT_MAX, lb = b.line ? b.line : INT_MAX;
                     return std::tie(la, a.column) < std::tie(lb, b.column);
                   });
}

void Parse(Ctx& ctx, std::string_view text) {
  if (text.size() > kMaxSpecBytes) {
    ctx.Error({}, fmt::format("the file is {} bytes; a spec may be at most {} bytes", text.size(),
                              kMaxSpecBytes));
    return;
  }
  if (!CheckBytes(ctx, text)) return;
  std::optional<YAML::Node> root = LoadDocument(ctx, text);
  if (!root) return;
  std::optional<Shape> shape = DetectShape(ctx, *root);
  if (!shape) return;
  ctx.spec.shape = *shape;
  bool manifest = *shape == Shape::kManifest;
  Pos root_pos = internal::PosOf(root->Mark());
  if (root_pos.line == 0) root_pos = {1, 1};
  internal::WalkMapping(
      ctx, *root, manifest ? internal::ManifestFields() : internal::DirectFields(),
      manifest ? internal::ManifestRequired() : internal::DirectRequired(), "", root_pos,
      manifest ? &internal::DirectFields() : &internal::ManifestFields());
  if (!manifest) ResolveDirectAliases(ctx, root_pos);
  CheckCrossField(ctx);
}

}  // namespace

ParseOutcome ParseSpec(std::string_view text, std::string_view filename) {
  Ctx ctx{std::string(filename)};
  try {
    Parse(ctx, text);
  } catch (const YAML::Exception& e) {
    ctx.Error(internal::PosOf(e.mark), fmt::format("could not read the YAML: {}", e.msg));
  } catch (const std::exception& e) {
    ctx.Error({}, fmt::format("internal error while reading the spec: {}", e.what()));
  } catch (...) {
    ctx.Error({}, "internal error while reading the spec");
  }
  ParseOutcome outcome;
  SortDiagnostics(ctx.diagnostics);
  if (ctx.suppressed > 0) {
    ctx.diagnostics.push_back(
        Diagnostic{ctx.file, 0, 0, fmt::format("{} more errors not shown", ctx.suppressed)});
  }
  outcome.diagnostics = std::move(ctx.diagnostics);
  if (outcome.diagnostics.empty()) outcome.spec = std::move(ctx.spec);
  return outcome;
}

}  // namespace tau::spec
