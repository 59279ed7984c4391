#include "cli/sweep.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"
#include "spec/yaml_file.h"

namespace tau::cli {
namespace {

// Collects errors at their place in the file; the parse goes on, so all of them are said at once.
struct Errors {
  const std::string& file;
  std::vector<std::string> lines;
  void Add(const YAML::Mark& at, const std::string& message) {
    lines.push_back(fmt::format("{}: error: {}", Origin(at), message));
  }
  std::string Origin(const YAML::Mark& at) const {
    return fmt::format("{}:{}:{}", file, at.line + 1, at.column + 1);
  }
};

// An item of a list as YAML reads it back in a flow list: as written where that reads back the
// same text, else double-quoted, so that "0.1,0.2" or "a: b" stays one item.
std::string FlowItem(const YAML::Node& v) {
  const std::string& s = v.Scalar();
  bool plain = !s.empty() && s.front() != ' ' && s.back() != ' ' && s != "~" && s != "null" &&
               s != "Null" && s != "NULL";
  for (char c : s)
    if (std::string_view(",[]{}:#&*!|>'\"%@`\\").find(c) != std::string_view::npos ||
        static_cast<unsigned char>(c) < 0x20)
      plain = false;
  if (plain && std::string_view("-?").find(s.front()) != std::string_view::npos && s.size() == 1)
    plain = false;
  if (plain) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      (out += '\\') += c;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return out + "\"";
}

// A scalar as --set takes it; a sequence of scalars as a flow list ("[a, b]"); nullopt otherwise.
std::optional<std::string> SetText(const YAML::Node& v) {
  if (v.IsScalar()) return v.Scalar();
  if (!v.IsSequence()) return std::nullopt;
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].IsScalar()) return std::nullopt;
    if (i) out += ", ";
    out += FlowItem(v[i]);
  }
  return out + "]";
}

std::optional<double> Number(const YAML::Node& v, bool* integer) {
  if (!v.IsScalar()) return std::nullopt;
  const std::string& s = v.Scalar();
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(d)) return std::nullopt;
  *integer = s.find_first_of(".eE") == std::string::npos;
  return d;
}

void ParseParameter(const std::string& path, const YAML::Node& v, bool random, Errors* errors,
                    SweepParameter* out) {
  out->path = path;
  out->line = v.Mark().line + 1;
  out->column = v.Mark().column + 1;
  out->range_origin = errors->Origin(v.Mark());
  if (v.IsSequence()) {
    if (v.size() == 0) errors->Add(v.Mark(), "parameters." + path + ": no values");
    for (const YAML::Node& item : v) {
      auto text = SetText(item);
      if (!text)
        errors->Add(item.Mark(),
                    "parameters." + path + ": a value is a scalar or a list of scalars");
      else
        out->values.push_back(*text), out->origins.push_back(errors->Origin(item.Mark()));
    }
    return;
  }
  if (!v.IsMap()) {
    errors->Add(v.Mark(), "parameters." + path +
                              ": give a list of values, or (method random) {min, max, scale}");
    return;
  }
  if (!random) {
    errors->Add(v.Mark(), "parameters." + path +
                              ": a range needs method: random; a grid takes a list of values");
    return;
  }
  bool int_min = false, int_max = false;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (key == "min") {
      out->min = Number(it->second, &int_min);
      if (!out->min) errors->Add(it->second.Mark(), "parameters." + path + ".min: not a number");
    } else if (key == "max") {
      out->max = Number(it->second, &int_max);
      if (!out->max) errors->Add(it->second.Mark(), "parameters." + path + ".max: not a number");
    } else if (key == "scale") {
      const std::string s = it->second.IsScalar() ? it->second.Scalar() : "";
      if (s == "log")
        out->log = true;
      else if (s != "linear")
        errors->Add(it->second.Mark(), "parameters." + path + ".scale: linear or log");
    } else {
      errors->Add(it->first.Mark(),
                  "parameters." + path + ": unknown field '" + key + "' (min, max, scale)");
    }
  }
  if (!out->min || !out->max) {
    if (v["min"] && v["max"]) return;  // said above
    errors->Add(v.Mark(), "parameters." + path + ": a range needs min and max");
    return;
  }
  out->integer = int_min && int_max;
  if (*out->min > *out->max) errors->Add(v.Mark(), "parameters." + path + ": min is above max");
  if (out->log && *out->min <= 0)
    errors->Add(v.Mark(), "parameters." + path + ": a log scale needs min > 0");
}

// splitmix64: a draw that is the same on every machine and library.
uint64_t Next(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double Unit(uint64_t* state) { return static_cast<double>(Next(state) >> 11) * 0x1.0p-53; }

// A value of `p`, and where the file writes it.
std::pair<std::string, std::string> Draw(const SweepParameter& p, uint64_t* state) {
  if (!p.values.empty()) {
    const size_t i = Next(state) % p.values.size();
    return {p.values[i], p.origins[i]};
  }
  const double u = Unit(state);
  double v = p.log ? std::exp(std::log(*p.min) + u * (std::log(*p.max) - std::log(*p.min)))
                   : *p.min + u * (*p.max - *p.min);
  if (p.integer) return {fmt::format("{}", static_cast<int64_t>(std::llround(v))), p.range_origin};
  return {fmt::format("{:.6g}", v), p.range_origin};
}

}  // namespace

Result<SweepFile> ParseSweep(const std::string& text, const std::string& file) {
  // The run-spec reader's checks: text, syntax, and no key given twice anywhere.
  Result<YAML::Node> loaded = spec::LoadStrictYaml(text, file, "sweep file");
  if (!loaded.ok()) return loaded.status();
  const YAML::Node root = *loaded;
  SweepFile out;
  out.file = file;
  Errors errors{file, {}};
  auto scalar = [&](const YAML::Node& v, const std::string& what) -> std::string {
    if (v.IsScalar() && !v.Scalar().empty()) return v.Scalar();
    errors.Add(v.Mark(), what + ": expected a string");
    return "";
  };
  YAML::Node parameters;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.Scalar();
    const YAML::Node v = it->second;  // a copy: operator-> gives a temporary
    if (key == "spec") {
      out.spec = scalar(v, "spec");
      out.spec_line = v.Mark().line + 1;
      out.spec_column = v.Mark().column + 1;
    } else if (key == "group") {
      out.group = scalar(v, "group");
    } else if (key == "method") {
      const std::string m = scalar(v, "method");
      if (m == "random")
        out.random = true;
      else if (m != "grid" && !m.empty())
        errors.Add(v.Mark(), "method: grid or random, not '" + m + "'");
    } else if (key == "max_parallel") {
      bool integer = false;
      auto n = Number(v, &integer);
      if (!n || !integer || *n < 1 || *n > kMaxSweepRuns)
        errors.Add(v.Mark(), fmt::format("max_parallel: expected a whole number from 1 to {}",
                                         kMaxSweepRuns));
      else
        out.max_parallel = static_cast<int64_t>(*n);
    } else if (key == "samples" || key == "seed") {
      bool integer = false;
      auto n = Number(v, &integer);
      if (!n || !integer || *n < (key == "samples" ? 1 : 0) || *n > 1e15)
        errors.Add(v.Mark(), key + ": expected a whole number" +
                                 (key == "samples" ? " of at least 1" : " >= 0"));
      else if (key == "samples")
        out.samples = static_cast<int64_t>(*n);
      else
        out.seed = static_cast<uint64_t>(*n);
    } else if (key == "objective") {
      if (!v.IsMap()) {
        errors.Add(v.Mark(), "objective: expected {metric, split?, goal}");
        continue;
      }
      for (auto o = v.begin(); o != v.end(); ++o) {
        const std::string ok = o->first.Scalar();
        if (ok == "metric") {
          out.metric = scalar(o->second, "objective.metric");
        } else if (ok == "split") {
          out.split = scalar(o->second, "objective.split");
        } else if (ok == "goal") {
          const std::string g = scalar(o->second, "objective.goal");
          if (g == "maximize")
            out.maximize = true;
          else if (g != "minimize" && !g.empty())
            errors.Add(o->second.Mark(), "objective.goal: minimize or maximize, not '" + g + "'");
        } else {
          errors.Add(o->first.Mark(),
                     "objective: unknown field '" + ok + "' (metric, split, goal)");
        }
      }
      if (out.metric.empty() && !v["metric"]) errors.Add(v.Mark(), "objective: needs a metric");
      // "NAME/SPLIT", as tau compare takes it, is the same as {metric: NAME, split: SPLIT}.
      if (size_t slash = out.metric.rfind('/'); slash != std::string::npos) {
        if (!out.split.empty() || slash == 0 || slash + 1 == out.metric.size()) {
          errors.Add(v["metric"].Mark(),
                     "objective.metric: '" + out.metric +
                         "': name the split once, as {metric: NAME, split: SPLIT} or NAME/SPLIT");
        } else {
          out.split = out.metric.substr(slash + 1);
          out.metric = out.metric.substr(0, slash);
        }
      }
    } else if (key == "parameters") {
      parameters = v;
    } else {
      errors.Add(it->first.Mark(), "unknown field '" + key +
                                       "' (spec, group, method, samples, seed, max_parallel, "
                                       "objective, parameters)");
    }
  }
  if (out.spec.empty() && !root["spec"])
    errors.Add(root.Mark(), "spec: missing; name the spec file the sweep runs");
  if (!parameters || !parameters.IsMap() || parameters.size() == 0) {
    errors.Add(parameters ? parameters.Mark() : root.Mark(),
               "parameters: give at least one spec path and its values");
  } else {
    // A path given twice was refused by LoadStrictYaml.
    for (auto it = parameters.begin(); it != parameters.end(); ++it) {
      const std::string path = it->first.Scalar();
      SweepParameter p;
      ParseParameter(path, it->second, out.random, &errors, &p);
      out.parameters.push_back(std::move(p));
    }
  }
  if (out.random && out.samples == 0 && !root["samples"])
    errors.Add(root.Mark(), "samples: method random needs the number of runs to draw");
  if (!out.random && root["samples"])
    errors.Add(root["samples"].Mark(), "samples: only for method random (a grid runs every point)");
  if (errors.lines.empty()) {
    int64_t runs = out.random ? out.samples : 1;
    if (!out.random)
      for (const SweepParameter& p : out.parameters)
        runs = std::min<int64_t>(runs * static_cast<int64_t>(p.values.size()), kMaxSweepRuns + 1);
    if (runs > kMaxSweepRuns)
      errors.Add(root.Mark(),
                 fmt::format("the sweep makes more than {} runs; split it", kMaxSweepRuns));
  }
  if (!errors.lines.empty()) {
    std::string message;
    for (const std::string& line : errors.lines) (message += message.empty() ? "" : "\n") += line;
    return InvalidArgument(message);
  }
  return out;
}

std::vector<std::vector<spec::Override>> SweepPoints(
    const SweepFile& sweep, std::vector<std::vector<std::string>>* origins) {
  std::vector<std::vector<spec::Override>> points;
  std::vector<std::vector<std::string>> at;
  if (sweep.random) {
    uint64_t state = sweep.seed;
    for (int64_t i = 0; i < sweep.samples; ++i) {
      std::vector<spec::Override> point;
      std::vector<std::string> point_at;
      for (const SweepParameter& p : sweep.parameters) {
        auto [value, origin] = Draw(p, &state);
        point.push_back({p.path, std::move(value)});
        point_at.push_back(std::move(origin));
      }
      points.push_back(std::move(point));
      at.push_back(std::move(point_at));
    }
  } else {
    points.push_back({});
    at.push_back({});
    for (const SweepParameter& p : sweep.parameters) {
      std::vector<std::vector<spec::Override>> next;
      std::vector<std::vector<std::string>> next_at;
      for (size_t k = 0; k < points.size(); ++k)
        for (size_t i = 0; i < p.values.size(); ++i) {
          next.push_back(points[k]);
          next.back().push_back({p.path, p.values[i]});
          next_at.push_back(at[k]);
          next_at.back().push_back(p.origins[i]);
        }
      points = std::move(next);
      at = std::move(next_at);
    }
  }
  if (origins) *origins = std::move(at);
  return points;
}

std::optional<std::string> ObjectiveSplit(
    const std::vector<std::pair<std::string, std::string>>& keys, const SweepFile& sweep,
    std::vector<std::string>* splits) {
  splits->clear();
  for (const auto& key : keys)
    if (key.first == sweep.metric) splits->push_back(key.second);
  if (!sweep.split.empty()) {
    if (std::find(splits->begin(), splits->end(), sweep.split) != splits->end()) return sweep.split;
    return std::nullopt;
  }
  if (splits->size() == 1) return splits->front();
  // Several: the series without a split is the metric itself, the others its phases.
  if (std::find(splits->begin(), splits->end(), "") != splits->end()) return "";
  return std::nullopt;
}

std::string ObjectiveProblem(const SweepFile& sweep, const std::vector<std::string>& splits_found,
                             size_t runs) {
  std::vector<std::string> named;
  for (const std::string& s : splits_found) named.push_back(s.empty() ? "(none)" : s);
  const std::string where = sweep.file + ": objective";
  if (splits_found.empty())
    return fmt::format(
        "{}: no run of the {} logged the metric '{}'; check its name (tau metrics RUN lists a "
        "run's metrics)",
        where, runs, sweep.metric);
  if (sweep.split.empty())
    return fmt::format(
        "{}: the metric '{}' is logged with several splits ({}); name one, such as objective: "
        "{{metric: {}, split: {}, goal: {}}}",
        where, sweep.metric, Join(named, ", "), sweep.metric, named.back(),
        sweep.maximize ? "maximize" : "minimize");
  return fmt::format(
      "{}: no run logged the metric '{}' with split '{}' (its splits: {}); name one of those",
      where, sweep.metric, sweep.split, Join(named, ", "));
}

}  // namespace tau::cli
