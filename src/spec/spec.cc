// ParseSpec: byte-level checks, YAML loading, shape detection, the walk, and the checks that span
// fields. Nothing here throws: yaml-cpp's exceptions are caught and become diagnostics.
#include "spec/spec.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <exception>
#include <map>
#include <sstream>
#include <tuple>

#include "common/clock.h"
#include "common/strings.h"
#include "common/yaml_text.h"
#include "spec/set_fields.h"
#include "spec/walk.h"
#include "spec/yaml_file.h"

namespace tau::spec {

using internal::Ctx;
using internal::Pos;
using internal::Printable;

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

std::vector<std::pair<std::string, std::string>> LauncherEnv(const RunSpec& spec) {
  const Execution& e = spec.execution;
  std::vector<std::pair<std::string, std::string>> env;
  if (e.launcher == "ray-tune") {
    if (!e.tune_metric.empty()) env.emplace_back("TAU_TUNE_METRIC", e.tune_metric);
    if (!e.tune_mode.empty()) env.emplace_back("TAU_TUNE_MODE", e.tune_mode);
    if (e.num_samples) env.emplace_back("TAU_TUNE_NUM_SAMPLES", std::to_string(*e.num_samples));
    if (e.max_concurrent_trials)
      env.emplace_back("TAU_TUNE_MAX_CONCURRENT_TRIALS", std::to_string(*e.max_concurrent_trials));
    if (!e.configs.is_null()) env.emplace_back("TAU_TUNE_PARAM_SPACE", e.configs.dump());
  } else if (e.launcher == "ray-train" && !e.configs.is_null()) {
    env.emplace_back("TAU_RAY_TRAIN_CONFIG_JSON", e.configs.dump());
  }
  return env;
}

bool UsesTorchrun(const RunSpec& spec) {
  const std::string& launcher = spec.execution.launcher;
  if (launcher == "torchrun") return true;
  if (!launcher.empty()) return false;
  const std::string& entry = spec.entrypoint;
  return spec.compute.gpus > 1 && entry.size() > 3 &&
         entry.compare(entry.size() - 3, 3, ".py") == 0;
}

int ProcessesPerNode(const RunSpec& spec) {
  return spec.execution.processes_per_node.value_or(std::max(spec.compute.gpus, 1));
}

const std::vector<std::string>& WebhookEventKinds() {
  static const auto* kinds = new std::vector<std::string>{"state", "guardrail", "budget"};
  return *kinds;
}

std::string WebhookUrlProblem(const std::string& url) {
  size_t scheme = url.find("://");
  if (scheme == std::string::npos ||
      (url.substr(0, scheme) != "http" && url.substr(0, scheme) != "https"))
    return "is not an http:// or https:// URL";
  std::string rest = url.substr(scheme + 3);
  std::string authority = rest.substr(0, rest.find('/'));
  if (authority.find('@') != std::string::npos)
    return "has credentials in it; the payload is signed with the webhook's secret instead";
  std::string host = authority, port;
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    size_t close = authority.find(']');
    if (close == std::string::npos) return "has an unclosed '[' in its host";
    host = authority.substr(0, close + 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return "has something after its host's ']'";
      port = authority.substr(close + 2);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) return "has no host";
  if (authority.size() > host.size() &&
      (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
       port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535))
    return "has a port that is not 1 to 65535";
  if (url.find_first_of(" \t\r\n") != std::string::npos) return "has white space in it";
  return "";
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
        if (!it->second.origin.empty()) d.file = it->second.origin;  // given by a --set
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

void ReportYamlError(Ctx& ctx, std::string_view text, const YAML::Exception& e,
                     const YamlOpenings& open) {
  Pos pos = internal::PosOf(e.mark);
  std::optional<Pos> tab = FirstIndentTab(text);
  if (tab && (pos.line == 0 || tab->line <= pos.line)) {
    ctx.Error(*tab, "tab character in indentation: YAML indents with spaces");
  } else if (auto flow = UnclosedFlow(open, e.msg, pos.line, pos.column)) {
    // The parser gives up at the end of the file; the mistake is the bracket that opened there.
    ctx.Error(Pos{flow->line, flow->column}, flow->message);
  } else {
    // Where the parser gave up, and (as a compiler's note) the likely mistake on a line before.
    std::string note;
    if (auto likely = LikelyCause(text, e.msg, pos.line))
      note = fmt::format("\n{}:{}:{}: note: {}", ctx.file, likely->line, likely->column,
                         likely->message);
    ctx.Error(pos, fmt::format("YAML syntax error: {}{}", e.msg, note));
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

// `kind` names the file in messages: "spec", "workflow file", "sweep file".
std::optional<YAML::Node> LoadDocument(Ctx& ctx, std::string_view text, const YamlOpenings& open,
                                       std::string_view kind) {
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
                  fmt::format("more than one YAML document (a '---' separator, or stray text such "
                              "as a ',' after the first value); a {} is exactly one mapping",
                              kind));
        return std::nullopt;
      }
    }
  } catch (const YAML::DeepRecursion& e) {
    ctx.Error(internal::PosOf(e.mark), "the YAML is nested too deeply");
    return std::nullopt;
  } catch (const YAML::Exception& e) {
    ReportYamlError(ctx, text, e, open);
    return std::nullopt;
  }
  if (!root.IsDefined() || root.IsNull()) {
    ctx.Error({1, 1}, kind == "spec" ? std::string("the file is empty: expected fields such as "
                                                   "'schema_version: 1' or 'engine: job'")
                                     : fmt::format("the file is empty: expected a {}", kind));
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
  // TauGrid's examples may give the engine under run: only.
  if (!version && !engine && root["run"].IsMap()) {
    for (const auto& entry : root["run"]) {
      YAML::Node key = entry.first;
      if (key.IsScalar() && key.Scalar() == "engine") engine = internal::PosOf(key.Mark());
    }
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
  // A value from the command line comes after the whole file.
  if (pa.line < 0 || pb.line < 0) return pa.line < 0 ? a : b;
  return std::tie(pa.line, pa.column) > std::tie(pb.line, pb.column) ? a : b;
}

std::string At(Pos pos) { return fmt::format("{}:{}", pos.line, pos.column); }

// Where a value is, for a message about another: "3:5", or "--set PATH=VALUE".
std::string At(const Ctx& ctx, Pos pos) {
  std::string origin = pos.line < 0 ? ctx.OriginOf(pos) : "";
  return origin.empty() ? At(pos) : origin;
}

// One field given at two levels of the direct shape (`name` and `run.name`, ...): both must say the
// same. Returns the value that applies, if either was given.
std::optional<std::string> OneOf(Ctx& ctx, const std::vector<std::string>& top,
                                 const std::vector<std::string>& nested, const char* what) {
  auto first = [&](const std::vector<std::string>& paths)
      -> std::optional<std::pair<std::string, Ctx::Spelled>> {
    for (const std::string& p : paths) {
      if (auto it = ctx.spelled.find(p); it != ctx.spelled.end()) return *it;
    }
    return std::nullopt;
  };
  auto a = first(top), b = first(nested);
  if (a && b && a->second.text != b->second.text) {
    ctx.Error(b->second.pos,
              fmt::format("{} ('{}', at {}) and {} ('{}', at {}) disagree: both give the {}; keep "
                          "one",
                          b->first, Printable(b->second.text), At(ctx, b->second.pos), a->first,
                          Printable(a->second.text), At(ctx, a->second.pos), what));
  }
  if (b) return b->second.text;
  if (a) return a->second.text;
  return std::nullopt;
}

// Direct-shape aliases: `script` for `entrypoint`, the run: spellings of name, engine, entrypoint
// and image, top-level `image`, `gpus` vs `gpus_per_worker`.
void ResolveDirectAliases(Ctx& ctx, Pos root) {
  RunSpec& spec = ctx.spec;
  if (!ctx.Seen("name") && !ctx.Seen("run.name")) {
    ctx.Error(root, "missing required field 'name' (or run.name)");
  }
  if (!ctx.Seen("entrypoint") && !ctx.Seen("script") && !ctx.Seen("run.entrypoint") &&
      !ctx.Seen("run.script")) {
    ctx.Error(root, "missing required field 'entrypoint' (or its alias 'script')");
  }
  OneOf(ctx, {"name"}, {"run.name"}, "run's name");
  OneOf(ctx, {"engine"}, {"run.engine"}, "engine");
  if (auto entry =
          OneOf(ctx, {"entrypoint", "script"}, {"run.entrypoint", "run.script"}, "entrypoint")) {
    spec.entrypoint = *entry;
  }
  // runtime.image, then run.image, then the top-level image.
  std::optional<std::string> image = OneOf(ctx, {"image"}, {"run.image"}, "image");
  if (spec.runtime.image.empty()) {
    spec.runtime.image = image.value_or("");
  } else if (image && *image != spec.runtime.image) {
    std::string path = ctx.Seen("run.image") ? "run.image" : "image";
    ctx.Warn(ctx.ValuePos(path),
             fmt::format("{}: '{}' is not used: runtime.image ('{}') takes "
                         "precedence",
                         path, Printable(*image), Printable(spec.runtime.image)));
  }
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
  if (ctx.Seen("run.source")) {
    // The code is copied out of the image at that path (the Kubernetes backend; the local one
    // refuses run.source at submission).
    if (spec.source.image.empty())
      ctx.Error(ctx.KeyPos("run.source"),
                "run.source: give run.source.image, the image that holds the code");
    if (spec.source.path.empty()) {
      ctx.Error(ctx.KeyPos("run.source"),
                "run.source: give run.source.path, where the code is inside run.source.image");
    } else if (spec.source.path.front() != '/') {
      ctx.Error(ctx.ValuePos("run.source.path"),
                fmt::format("run.source.path: '{}' must be an absolute path inside the image",
                            spec.source.path));
    }
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

// Why tau refuses a variable in runtime.env / env_secret, or "" when it may be set. tau sets these
// itself for every worker; TauGrid refuses MASTER_ADDR, MASTER_PORT, NCCL_* and TAU_* the same way
// (case-insensitively); tau also owns the rendezvous and device variables it sets.
std::string ReservedEnvReason(const std::string& name, bool allow_nccl) {
  std::string upper = name;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (StartsWith(upper, "TAU_")) {
    return "tau owns the TAU_ namespace and sets these variables itself (TAU_RUN_NAME, "
           "TAU_CHECKPOINT_DIR, TAU_RESUME_FROM, TAU_METRICS_FILE, ...); rename the variable";
  }
  if (upper == "MASTER_ADDR" || upper == "MASTER_PORT") {
    return "tau sets it for every worker (the torch.distributed rendezvous); remove it";
  }
  if (StartsWith(upper, "NCCL_") && !allow_nccl) {
    return "tau leaves NCCL_* to its own network setup; set execution.allow_nccl_override: true "
           "to set it yourself";
  }
  for (const char* exact : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"}) {
    if (name == exact) {
      return "tau sets it for every worker process from compute.workers and compute.gpus; "
             "remove it";
    }
  }
  if (name == "CUDA_VISIBLE_DEVICES" || name == "NVIDIA_VISIBLE_DEVICES") {
    return "tau (or the cluster's device plugin) sets it to the GPUs assigned to each worker; ask "
           "for GPUs with compute.gpus";
  }
  if (name == "CUDA_DEVICE_ORDER") {
    return "tau sets it to PCI_BUS_ID so that GPU indices mean what tau's health checks mean";
  }
  return "";
}

void CheckEnv(Ctx& ctx) {
  for (const EnvVar& var : ctx.spec.runtime.env) {
    std::string why = ReservedEnvReason(var.name, ctx.spec.execution.allow_nccl_override);
    if (why.empty()) continue;
    auto it = ctx.env_pos.find(var.name);
    std::string source = it == ctx.env_pos.end() ? "runtime.env" : it->second.text;
    ctx.Error(it == ctx.env_pos.end() ? Pos{} : it->second.pos,
              fmt::format("{}: {} is reserved: {}", source, var.name, why));
  }
}

// execution.* against the engine and compute (TauGrid's ValidateExecution, with tau's messages).
void CheckExecution(Ctx& ctx) {
  RunSpec& spec = ctx.spec;
  Execution& e = spec.execution;
  const std::string& launcher = e.launcher;
  bool ray_launcher = launcher == "ray-train" || launcher == "ray-tune";
  bool job_launcher = launcher == "python" || launcher == "torchrun";
  std::string engine_path = ctx.Seen("run.workload_kind") ? "run.workload_kind"
                            : ctx.Seen("run.engine")      ? "run.engine"
                                                          : "engine";
  if (!launcher.empty()) {
    Pos pos = ctx.ValuePos("execution.launcher");
    if (!ctx.kind_set && job_launcher) {
      // The manifest's default engine is rayjob; python and torchrun say job.
      spec.kind = WorkloadKind::kJob;
    } else if (job_launcher && spec.kind != WorkloadKind::kJob) {
      ctx.Error(pos, fmt::format("execution.launcher: '{}' needs engine job ({} is rayjob); Ray "
                                 "jobs launch with ray-train or ray-tune",
                                 launcher, engine_path));
    } else if (ray_launcher && spec.kind != WorkloadKind::kRayJob) {
      ctx.Error(pos, fmt::format("execution.launcher: '{}' needs engine rayjob ({} is job); Jobs "
                                 "launch with python or torchrun",
                                 launcher, ctx.kind_set ? engine_path : "the engine"));
    }
  }
  bool job = spec.kind == WorkloadKind::kJob;
  if (e.nodes) {
    Pos pos = ctx.ValuePos("execution.nodes");
    if (!job && *e.nodes > 1) {
      ctx.Error(pos, "execution.nodes: a Ray job's size is compute.workers; use compute.workers");
    } else if (*e.nodes > 1 && launcher == "python") {
      ctx.Error(pos, "execution.nodes: more than one node needs execution.launcher: torchrun");
    } else if (ctx.Seen("compute.workers") && spec.compute.workers != *e.nodes) {
      ctx.Error(pos, fmt::format("execution.nodes ({}) and compute.workers ({}, at {}) disagree: "
                                 "both give the number of workers; keep one",
                                 *e.nodes, spec.compute.workers,
                                 At(ctx, ctx.ValuePos("compute.workers"))));
    } else if (job) {
      spec.compute.workers = *e.nodes;
    }
  }
  if (e.processes_per_node && *e.processes_per_node > 1) {
    Pos pos = ctx.ValuePos("execution.processes_per_node");
    if (launcher != "torchrun") {
      ctx.Error(pos,
                "execution.processes_per_node: more than one process per node needs "
                "execution.launcher: torchrun");
    } else if (spec.compute.gpus > 0 && *e.processes_per_node > spec.compute.gpus) {
      ctx.Error(pos, fmt::format("execution.processes_per_node ({}) is more than the GPUs per "
                                 "worker ({}): one process per GPU at most",
                                 *e.processes_per_node, spec.compute.gpus));
    }
  }
  for (const char* field : {"execution.metric", "execution.mode", "execution.num_samples",
                            "execution.max_concurrent_trials"}) {
    if (ctx.Seen(field) && launcher != "ray-tune") {
      ctx.Error(
          ctx.KeyPos(field),
          fmt::format("{} is a Ray Tune setting: it needs execution.launcher: ray-tune", field));
    }
  }
  if (launcher == "ray-tune") {
    if (e.tune_metric.empty()) {
      ctx.Error(ctx.KeyPos("execution.launcher"),
                "execution.launcher: ray-tune needs execution.metric (the metric to optimise)");
    }
    if (!e.configs.is_object() || e.configs.empty()) {
      ctx.Error(ctx.KeyPos("execution.launcher"),
                "execution.launcher: ray-tune needs execution.configs (the search space)");
    }
  }
  if (!e.configs.is_object() || e.configs.empty()) return;
  // What configs means depends on the launcher (the engine's default when not given).
  std::string effective = !launcher.empty() ? launcher : job ? "python" : "ray-train";
  Pos pos = ctx.ValuePos("execution.configs");
  if (effective == "python" || effective == "torchrun") {
    static const std::vector<std::string> kTorchrunOwned = {
        "standalone", "nnodes",      "nproc-per-node", "node-rank", "rdzv-backend", "rdzv-endpoint",
        "rdzv-id",    "master-addr", "master-port",    "module",    "no-python",    "run-path"};
    std::map<std::string, std::string> seen;
    for (const auto& [key, value] : e.configs.items()) {
      bool key_ok = !key.empty() && std::isalnum(static_cast<unsigned char>(key[0])) &&
                    std::all_of(key.begin(), key.end(), [](char ch) {
                      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' ||
                             ch == '.' || ch == '-';
                    });
      if (!key_ok) {
        ctx.Error(pos, fmt::format("execution.configs: '{}' is not a flag name "
                                   "([A-Za-z0-9][A-Za-z0-9_.-]*)",
                                   Printable(key)));
        continue;
      }
      if (!value.is_primitive() || value.is_null()) {
        ctx.Error(pos, fmt::format("execution.configs.{}: {} flags take a string, number or "
                                   "boolean",
                                   key, effective));
        continue;
      }
      if (effective != "torchrun") continue;
      std::string flag = key;
      for (char& ch : flag) {
        ch = ch == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      }
      if (std::find(kTorchrunOwned.begin(), kTorchrunOwned.end(), flag) != kTorchrunOwned.end()) {
        ctx.Error(pos, fmt::format("execution.configs.{}: tau sets torchrun's --{} itself (from "
                                   "execution.nodes, processes_per_node and the gang)",
                                   key, flag));
      } else if (auto dup = seen.find(flag); dup != seen.end()) {
        ctx.Error(pos, fmt::format("execution.configs: '{}' and '{}' are the same torchrun flag",
                                   dup->second, key));
      } else {
        seen[flag] = key;
      }
    }
  } else if (effective == "ray-train") {
    for (const auto& [key, value] : e.configs.items()) {
      if (key != "torch_config" && key != "scaling_config" && key != "failure_config") {
        ctx.Error(pos, fmt::format("execution.configs: '{}' is not a Ray Train section; allowed: "
                                   "torch_config, scaling_config, failure_config",
                                   Printable(key)));
      } else if (!value.is_object()) {
        ctx.Error(pos, fmt::format("execution.configs.{}: expected a mapping", key));
      } else if (key == "scaling_config") {
        for (const char* owned : {"num_workers", "resources_per_worker"}) {
          if (value.contains(owned)) {
            ctx.Error(pos, fmt::format("execution.configs.scaling_config.{}: tau sets it from "
                                       "compute.workers and compute.gpus",
                                       owned));
          }
        }
      }
    }
  }
}

// policy.topology against the engine and the gang.
void CheckTopology(Ctx& ctx) {
  const RunSpec& spec = ctx.spec;
  const std::string& topology = spec.policy.topology;
  Pos pos = ctx.ValuePos("policy.topology");
  bool job = spec.kind == WorkloadKind::kJob;
  if (topology == "single-node-nvlink" && job && spec.compute.workers > 1) {
    ctx.Error(pos, fmt::format("policy.topology: single-node-nvlink keeps every GPU on one node, "
                               "but engine job with {} workers runs {} pods; use one worker with "
                               "all {} GPUs (compute.workers: 1, compute.gpus: {})",
                               spec.compute.workers, spec.compute.workers,
                               spec.compute.workers * std::max(spec.compute.gpus, 1),
                               spec.compute.workers * std::max(spec.compute.gpus, 1)));
  }
  if (topology == "elastic-workers" && job) {
    ctx.Error(pos,
              "policy.topology: elastic-workers is only for engine: rayjob (a Job's gang has "
              "a fixed size)");
  }
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

// A service's rules beyond its fields' own: only `kind: service` has a serve section, a replica is
// one process, and the fields of a run that do not apply to a server are refused, not ignored.
void CheckServe(Ctx& ctx) {
  const bool service = ctx.spelled.count("kind") && ctx.spelled["kind"].text == "service";
  if (!service) {
    if (ctx.Seen("serve"))
      ctx.Error(ctx.KeyPos("serve"),
                "serve: only a service has a serve section: add 'kind: service' at the top "
                "(and deploy it with `tau serve deploy`), or remove it");
    ctx.spec.serve.reset();
    return;
  }
  Serve& s = *ctx.spec.serve;
  if (ctx.spec.compute.workers != 1)
    ctx.Error(ctx.KeyPos("compute.workers"),
              fmt::format("compute.workers: a service's replica is one process, not a gang of {}; "
                          "set serve.replicas for more copies",
                          ctx.spec.compute.workers));
  if (ctx.spec.max_runtime_ms)
    ctx.Error(ctx.KeyPos("run.max_runtime"),
              "run.max_runtime: a service runs until it is deleted (tau serve delete); remove it");
  if (ctx.Seen("resilience.max_retries") || ctx.Seen("resilience.retry_on"))
    ctx.Error(ctx.KeyPos(ctx.Seen("resilience.max_retries") ? "resilience.max_retries"
                                                            : "resilience.retry_on"),
              "resilience: a service's replicas are restarted whenever they stop, with "
              "serve.restart_backoff_initial and serve.restart_backoff_max; remove max_retries and "
              "retry_on");
  if (s.restart_backoff_max_ms < s.restart_backoff_initial_ms)
    ctx.Error(ctx.KeyPos(ctx.Seen("serve.restart_backoff_max") ? "serve.restart_backoff_max"
                                                               : "serve.restart_backoff_initial"),
              fmt::format("serve.restart_backoff_max ({} ms) is shorter than "
                          "serve.restart_backoff_initial ({} ms)",
                          s.restart_backoff_max_ms, s.restart_backoff_initial_ms));
  // Restarted whenever they stop, whatever stopped them: the retry policy the controller
  // applies to every run says so for a replica.
  Resilience& r = ctx.spec.resilience;
  r.max_retries = kServiceRestarts;
  r.retry_on = recovery::FailureClassNames(recovery::RetryableFailureClasses());
  r.retry_on_set = true;
  r.backoff_initial_ms = s.restart_backoff_initial_ms;
  r.backoff_max_ms = s.restart_backoff_max_ms;
  if (!s.import_path.empty() && ctx.spec.kind != WorkloadKind::kRayJob)
    ctx.Error(ctx.KeyPos("serve.import_path"),
              "serve.import_path: a Ray Serve application is served by a rayjob service; set "
              "run.workload_kind: rayjob, or remove it");
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
  CheckLimit(ctx, c.cpu_limit, c.cpus, "compute.cpu_limit", "CPU request");
  CheckLimit(ctx, c.memory_limit, c.memory, "compute.memory_limit", "memory request");
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

// The text checks and the load every YAML file tau reads as a spec-like file gets: the document's
// top mapping, or nullopt after an error.
std::optional<YAML::Node> LoadChecked(Ctx& ctx, std::string_view text, std::string_view kind) {
  if (text.size() > kMaxSpecBytes) {
    ctx.Error({}, fmt::format("the file is {} bytes; a {} may be at most {} bytes", text.size(),
                              kind, kMaxSpecBytes));
    return std::nullopt;
  }
  if (std::optional<TextProblem> wrong = WrongEncoding(text)) {
    ctx.Error({wrong->line, wrong->column}, wrong->message);
    return std::nullopt;
  }
  std::string normalized(text);
  NormalizeLineBreaks(&normalized);
  text = normalized;
  if (!CheckBytes(ctx, text)) return std::nullopt;
  const YamlOpenings open = FindUnclosed(text);
  if (open.quote) {
    ctx.Error({open.quote->line, open.quote->column}, open.quote->message);
    return std::nullopt;
  }
  return LoadDocument(ctx, text, open, kind);
}

// Every mapping under `node`: a key given twice is an error at the second, naming the first
// (yaml-cpp keeps one of them, silently). The run-spec walker makes this check field by field.
void CheckDuplicateKeys(Ctx& ctx, const YAML::Node& node, const std::string& path, int depth) {
  if (depth > 64) return;  // yaml-cpp's own depth guard stops deeper documents
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i)
      CheckDuplicateKeys(ctx, node[i], fmt::format("{}[{}]", path, i), depth + 1);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, Pos> seen;
  for (const auto& entry : node) {
    // Copies: yaml-cpp's iterator proxies are temporaries.
    YAML::Node key = entry.first;
    YAML::Node value = entry.second;
    if (!key.IsScalar()) {
      ctx.Error(internal::PosOf(key.Mark()),
                fmt::format("{}expected a field name, got {}",
                            path.empty() ? "" : "in '" + path + "': ", internal::Describe(key)));
      continue;
    }
    const Pos at = internal::PosOf(key.Mark());
    const std::string child = path.empty() ? key.Scalar() : path + "." + key.Scalar();
    if (auto first = seen.find(key.Scalar()); first != seen.end()) {
      ctx.Error(at, fmt::format("duplicate field '{}'{} (first given on line {}, column {}); "
                                "give each field once",
                                Printable(key.Scalar()), path.empty() ? "" : " in '" + path + "'",
                                first->second.line, first->second.column));
      continue;
    }
    seen.emplace(key.Scalar(), at);
    CheckDuplicateKeys(ctx, value, child, depth + 1);
  }
}

void Parse(Ctx& ctx, std::string_view text) {
  std::optional<YAML::Node> root = LoadChecked(ctx, text, "spec");
  if (!root) return;
  std::optional<Shape> shape = DetectShape(ctx, *root);
  if (!shape) return;
  ctx.spec.shape = *shape;
  bool manifest = *shape == Shape::kManifest;
  Pos root_pos = internal::PosOf(root->Mark());
  if (root_pos.line == 0) root_pos = {1, 1};
  if (!ctx.overrides.empty()) {
    // On the parsed document, before the walk: a --set value gets every check a file's value
    // gets. A path the shape has not stops here, before any value is read.
    *root = internal::ApplyOverrides(
        ctx, *root, manifest ? internal::ManifestFields() : internal::DirectFields());
    if (!ctx.diagnostics.empty()) return;
    ctx.spec.overrides = ctx.overrides;
  }
  internal::WalkMapping(ctx, *root,
                        manifest ? internal::ManifestFields() : internal::DirectFields(),
                        manifest ? internal::ManifestRequired() : internal::DirectRequired(), "",
                        root_pos, manifest ? &internal::DirectFields : &internal::ManifestFields);
  if (!manifest) ResolveDirectAliases(ctx, root_pos);
  CheckExecution(ctx);
  CheckTopology(ctx);
  CheckEnv(ctx);
  CheckCrossField(ctx);
  if (manifest) CheckServe(ctx);
}

// The positions of every field present: as written, and under the canonical names resolution
// messages use (the first spelling present wins, in the order the values take precedence).
FieldPosition PositionOf(const Ctx& ctx, Pos pos) {
  FieldPosition out;
  if (pos.line < 0) {
    out.origin = ctx.OriginOf(pos);
  } else {
    out.line = pos.line;
    out.column = pos.column;
  }
  return out;
}

// The canonical names and their spellings, in the order the values take precedence.
const std::vector<std::pair<std::string, std::vector<std::string>>>& CanonicalSpellings() {
  static const auto* table = new std::vector<std::pair<std::string, std::vector<std::string>>>{
      {"name", {"name", "run.name"}},
      {"run.workload_kind", {"run.workload_kind", "run.engine", "engine"}},
      {"run.entrypoint", {"run.entrypoint", "run.script", "entrypoint", "script"}},
      {"runtime.image", {"runtime.image", "run.image", "image"}},
      {"compute.gpus", {"compute.gpus_per_worker", "compute.gpus"}},
      {"compute.workers", {"compute.workers", "execution.nodes"}},
      {"compute.cpus", {"compute.cpu_request", "compute.cpus"}},
      {"compute.memory", {"compute.memory_request", "compute.memory"}},
      {"compute.worker_cpus", {"compute.worker_cpu_request", "compute.worker_cpus"}},
      {"compute.worker_memory", {"compute.worker_memory_request", "compute.worker_memory"}},
      {"compute.head_cpus", {"compute.head_cpu_request"}},
      {"compute.head_memory", {"compute.head_memory_request"}},
      {"run.code_excludes", {"run.working_dir_excludes"}},
  };
  return *table;
}

std::map<std::string, FieldPosition> Positions(const Ctx& ctx) {
  std::map<std::string, FieldPosition> out;
  for (const auto& [path, pos] : ctx.key_pos) out[path] = PositionOf(ctx, pos);
  for (const auto& [name, where] : ctx.env_pos) {
    out[where.text + "." + name] = PositionOf(ctx, where.pos);
  }
  for (const auto& [canonical, spellings] : CanonicalSpellings()) {
    for (const std::string& path : spellings) {
      auto it = ctx.key_pos.find(path);
      if (it == ctx.key_pos.end()) continue;
      out[canonical] = PositionOf(ctx, it->second);
      break;
    }
  }
  return out;
}

}  // namespace

namespace {

// A node as a --set value: a scalar's text, a list or mapping in flow style ([a, b], {K: v}).
std::string SetValueText(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (!node.IsDefined() || node.IsNull()) return "null";
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

// The leaves of `node` under `path` as --set names them: a section's fields by name, an item of a
// list of sections by index, an entry of a mapping field by key, free-form keys by key; any other
// value (a list of values, an env entry) whole. `fields`: the section's, or null for a mapping.
void SetLeaves(const YAML::Node& node, const std::string& path,
               const std::vector<internal::FieldDef>* fields, bool free_form, int depth,
               std::vector<std::pair<std::string, std::string>>* out) {
  using internal::Kind;
  if (depth > 32 || !node.IsMap() || node.size() == 0) {
    out->emplace_back(path, SetValueText(node));
    return;
  }
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) continue;
    const std::string key = entry.first.Scalar();
    const std::string at = path.empty() ? key : path + "." + key;
    const YAML::Node& value = entry.second;
    const internal::FieldDef* def = nullptr;
    if (fields)
      for (const internal::FieldDef& f : *fields)
        if (f.name == key) def = &f;
    if (def && def->kind == Kind::kObject) {
      SetLeaves(value, at, &def->children, false, depth + 1, out);
    } else if (def && def->kind == Kind::kObjectList && value.IsSequence()) {
      for (size_t i = 0; i < value.size(); ++i)
        SetLeaves(value[i], fmt::format("{}[{}]", at, i), &def->children, false, depth + 1, out);
    } else if (def && (def->kind == Kind::kStringMap || def->kind == Kind::kEnv) && value.IsMap() &&
               value.size() > 0) {
      for (const auto& item : value)
        if (item.first.IsScalar())
          out->emplace_back(at + "." + item.first.Scalar(), SetValueText(item.second));
    } else if ((def && def->kind == Kind::kAny) || free_form || (!def && fields)) {
      // Free-form (execution.configs.lr), or a key the walker reads otherwise: by key.
      SetLeaves(value, at, nullptr, true, depth + 1, out);
    } else {
      out->emplace_back(at, SetValueText(value));
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> SetFields(std::string_view text,
                                                           const std::vector<Override>& overrides) {
  std::vector<std::pair<std::string, std::string>> out;
  Ctx ctx{"spec"};
  ctx.overrides = overrides;
  try {
    std::optional<YAML::Node> root = LoadChecked(ctx, text, "spec");
    if (!root) return out;
    std::optional<Shape> shape = DetectShape(ctx, *root);
    if (!shape) return out;
    const std::vector<internal::FieldDef>& fields =
        *shape == Shape::kManifest ? internal::ManifestFields() : internal::DirectFields();
    YAML::Node doc = *root;
    if (!overrides.empty()) doc = internal::ApplyOverrides(ctx, *root, fields);
    if (!ctx.diagnostics.empty()) return out;
    SetLeaves(doc, "", &fields, false, 0, &out);
  } catch (const std::exception&) {
    out.clear();
  }
  return out;
}

std::string CanonicalField(std::string_view path) {
  for (const auto& [canonical, spellings] : CanonicalSpellings())
    for (const std::string& spelling : spellings)
      if (spelling == path) return canonical;
  return std::string(path);
}

ParseOutcome ParseSpec(std::string_view text, std::string_view filename,
                       const std::vector<Override>& overrides) {
  Ctx ctx{std::string(filename)};
  ctx.overrides = overrides;
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
  SortDiagnostics(ctx.warnings);
  outcome.warnings = std::move(ctx.warnings);
  outcome.positions = Positions(ctx);
  if (outcome.diagnostics.empty()) outcome.spec = std::move(ctx.spec);
  return outcome;
}

Result<YAML::Node> LoadStrictYaml(std::string_view text, const std::string& file,
                                  std::string_view kind) {
  Ctx ctx(file);
  std::optional<YAML::Node> root = LoadChecked(ctx, text, kind);
  if (root) CheckDuplicateKeys(ctx, *root, "", 0);
  if (ctx.diagnostics.empty()) return *root;
  SortDiagnostics(ctx.diagnostics);
  std::vector<std::string> lines;
  for (const Diagnostic& d : ctx.diagnostics) lines.push_back(d.ToString());
  return InvalidArgument(Join(lines, "\n"));
}

}  // namespace tau::spec
