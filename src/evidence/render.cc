// Text for people: sparklines and tables for `tau metrics`, the summary for `tau evidence RUN`.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "evidence/evidence.h"

namespace tau::evidence {

using nlohmann::json;

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  return fmt::format("{:.6g}", v);
}

std::string Sparkline(const std::vector<double>& values, size_t width) {
  static const char* const kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty() || width == 0) return "";
  size_t n = values.size();
  size_t cols = std::min(n, width);
  // Each column is the mean of the finite values of its bucket; none: a gap.
  std::vector<std::optional<double>> col(cols);
  for (size_t c = 0; c < cols; ++c) {
    size_t begin = c * n / cols, end = (c + 1) * n / cols;
    double sum = 0;
    size_t count = 0;
    for (size_t i = begin; i < end; ++i)
      if (std::isfinite(values[i])) {
        sum += values[i];
        ++count;
      }
    if (count > 0) col[c] = sum / static_cast<double>(count);
  }
  std::optional<double> lo, hi;
  for (const auto& v : col)
    if (v) {
      if (!lo || *v < *lo) lo = *v;
      if (!hi || *v > *hi) hi = *v;
    }
  std::string out;
  for (const auto& v : col) {
    if (!v) {
      out += ' ';
      continue;
    }
    size_t level = 3;  // a flat line sits in the middle
    if (*hi > *lo) {
      double x = (*v - *lo) / (*hi - *lo) * 7.0;
      level = static_cast<size_t>(std::lround(std::clamp(x, 0.0, 7.0)));
    }
    out += kBars[level];
  }
  return out;
}

namespace {

// Columns aligned by their widths; `right[i]` right-aligns column i. The last column is not
// padded (it may hold multibyte sparklines).
std::string Table(const std::vector<std::vector<std::string>>& rows,
                  const std::vector<bool>& right) {
  if (rows.empty()) return "";
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      bool last = i + 1 == row.size();
      if (i > 0) line += "  ";
      if (last && !right[i]) {
        line += row[i];
      } else if (right[i]) {
        line += std::string(width[i] - row[i].size(), ' ') + row[i];
      } else {
        line += row[i] + std::string(width[i] - row[i].size(), ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string FormatMetricTable(const std::vector<MetricPoint>& points) {
  std::vector<std::vector<std::string>> rows = {{"STEP", "VALUE", "ATTEMPT"}};
  for (const MetricPoint& p : points)
    rows.push_back({std::to_string(p.step), FormatValue(p.value), std::to_string(p.attempt)});
  return Table(rows, {true, true, true});
}

std::string FormatSummaryTable(const std::vector<MetricSummary>& summaries,
                               const MetricHistory* history, size_t spark_width) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"METRIC", "COUNT",  "STEPS", "MIN",
                                     "MAX",    "LATEST", "NAN",   "INF"};
  if (history) header.push_back("TREND");
  rows.push_back(header);
  for (const MetricSummary& m : summaries) {
    std::vector<std::string> row = {m.split.empty() ? m.name : m.name + " [" + m.split + "]",
                                    std::to_string(m.count),
                                    fmt::format("{}..{}", m.first_step, m.last_step),
                                    m.min ? FormatValue(*m.min) : "-",
                                    m.max ? FormatValue(*m.max) : "-",
                                    FormatValue(m.latest) + (m.unit.empty() ? "" : " " + m.unit),
                                    std::to_string(m.nan_count),
                                    std::to_string(m.inf_count)};
    if (history) {
      std::vector<double> values;
      for (const MetricPoint& p : history->Series(m.name, m.split)) values.push_back(p.value);
      row.push_back(Sparkline(values, spark_width));
    }
    rows.push_back(std::move(row));
  }
  std::vector<bool> right = {false, true, true, true, true, true, true, true, false};
  return Table(rows, right);
}

namespace {

std::string Time(const json& ms) {
  return ms.is_number_integer() ? FormatRfc3339(ms.get<int64_t>()) : "-";
}

std::string Bytes(int64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  if (n < (1 << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / 1024);
  if (n < (int64_t{1} << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(n) / (1 << 20));
  return fmt::format("{:.2f} GiB", static_cast<double>(n) / (int64_t{1} << 30));
}

std::string Str(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t Int(const json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string Short(const std::string& hash) { return hash.size() > 12 ? hash.substr(0, 12) : hash; }

std::string NumText(const json& v) {
  if (v.is_number()) return FormatValue(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return "-";
}

}  // namespace

std::string FormatRecordSummary(const json& record) {
  try {
    std::string out;
    const json& run = record.value("run", json::object());
    const json& config = record.value("config", json::object());
    const json& snap = record.value("snapshot", json::object());
    const json& rt = record.value("runtime", json::object());
    std::string state = Str(run, "state");
    if (!Str(run, "reason").empty() && Str(run, "reason") != state)
      state += " (" + Str(run, "reason") + ")";
    out += fmt::format("Run:        {}  {}\n", Str(run, "name"), state);
    if (!Str(run, "message").empty()) out += fmt::format("Message:    {}\n", Str(run, "message"));
    out += fmt::format("Spec:       {}  config sha256:{}\n", Str(config, "spec_file"),
                       Short(Str(config, "config_hash")));
    out += fmt::format("Code:       snapshot sha256:{}  {} files, {}\n", Short(Str(snap, "digest")),
                       Int(snap, "file_count"), Bytes(Int(snap, "bytes")));
    std::vector<std::string> env;
    if (!Str(rt, "image").empty()) env.push_back("image " + Str(rt, "image"));
    if (!Str(rt, "python_version").empty()) env.push_back("python " + Str(rt, "python_version"));
    if (!Str(rt, "host").empty()) env.push_back("host " + Str(rt, "host"));
    if (!Str(rt, "os").empty()) env.push_back(Str(rt, "os"));
    if (!Str(rt, "driver_version").empty()) env.push_back("driver " + Str(rt, "driver_version"));
    if (rt.contains("packages") && rt["packages"].is_array() && !rt["packages"].empty())
      env.push_back(fmt::format("{} packages", rt["packages"].size()));
    out += fmt::format("Runtime:    {}\n",
                       env.empty() ? "-" : fmt::format("{}", fmt::join(env, ", ")));
    if (rt.contains("gpus") && rt["gpus"].is_array())
      for (const json& g : rt["gpus"])
        out +=
            fmt::format("GPU:        {} {} {}\n", Int(g, "index"), Str(g, "name"), Str(g, "uuid"));
    out += fmt::format("tau:        {}\n", Str(rt, "tau_version"));
    // A workflow stage's lineage: what each upstream run handed on.
    for (const json& l : record.value("lineage", json::array())) {
      std::string checkpoint = "no checkpoint";
      if (!Str(l, "checkpoint").empty())
        checkpoint = fmt::format("checkpoint {} sha256:{} ({} files, {})", Str(l, "checkpoint"),
                                 Short(Str(l, "checkpoint_sha256")), Int(l, "checkpoint_files"),
                                 Bytes(Int(l, "checkpoint_bytes")));
      out += fmt::format("Upstream:   {} <- run {} ({})  {}\n", Str(l, "stage"), Str(l, "run"),
                         Str(l, "state"), checkpoint);
    }

    out += "\nLifecycle:\n";
    for (const json& e : record.value("events", json::array()))
      out += fmt::format("  {}  {:<10}  {}\n", Time(e.value("ts_ms", json())), Str(e, "type"),
                         Str(e, "message"));

    out += "\nAttempts:\n";
    for (const json& a : record.value("attempts", json::array())) {
      std::string end;
      if (a.value("exit_code", json()).is_number_integer())
        end = fmt::format("exit {}", a["exit_code"].get<int64_t>());
      else if (a.value("signal", json()).is_number_integer())
        end = fmt::format("signal {}", a["signal"].get<int64_t>());
      out += fmt::format(
          "  #{}  {} -> {}  {}  {}\n", Int(a, "number"), Time(a.value("started_ms", json())),
          Time(a.value("ended_ms", json())),
          Str(a, "failure_class").empty() ? Str(a, "state") : Str(a, "failure_class"), end);
      std::string summary = Str(a.value("diagnosis", json::object()), "summary");
      if (!summary.empty()) out += fmt::format("      diagnosis: {}\n", summary);
      for (const json& l : a.value("logs", json::array()))
        out += fmt::format("      {}  {}  sha256:{}  {}\n", Str(l, "path"), Bytes(Int(l, "size")),
                           Short(Str(l, "sha256")), Str(l, "state"));
    }

    const json& m = record.value("metrics", json::object());
    out += fmt::format(
        "\nMetrics:    {} points in {} series ({} replaced by retried attempts, {} "
        "malformed lines)\n",
        Int(m, "distinct_points"), m.value("series", json::array()).size(), Int(m, "replaced"),
        Int(m, "malformed"));
    for (const json& s : m.value("series", json::array())) {
      std::string name = Str(s, "name");
      if (!Str(s, "split").empty()) name += " [" + Str(s, "split") + "]";
      out += fmt::format("  {:<24} {:>8} steps {}..{}  min {}  max {}  latest {}\n", name,
                         Int(s, "count"), Int(s, "first_step"), Int(s, "last_step"),
                         NumText(s.value("min", json())), NumText(s.value("max", json())),
                         NumText(s.value("latest", json())));
    }
    for (const json& g : record.value("gpu_samples", json::array()))
      out += fmt::format("GPU {}:      {} samples, mean util {}%, max {} W, max {} C\n",
                         Int(g, "gpu"), Int(g, "count"), NumText(g.value("mean_util_pct", json())),
                         NumText(g.value("max_power_w", json())),
                         NumText(g.value("max_temperature_c", json())));
    int64_t ckpt_bytes = 0;
    size_t ckpts = 0;
    for (const json& a : record.value("artifacts", json::array())) {
      ckpt_bytes += Int(a, "size");
      ++ckpts;
    }
    out += fmt::format("Artifacts:  {} files, {}\n", ckpts, Bytes(ckpt_bytes));
    out += fmt::format("Chain head: {} ({} events)\n", Str(record, "chain_head"),
                       record.value("events", json::array()).size());
    const json& ret = record.value("retention", json::object());
    if (ret.value("logs_pruned_ms", json()).is_number_integer())
      out += fmt::format("Retention:  logs pruned at {}\n", Time(ret["logs_pruned_ms"]));
    if (ret.value("samples_pruned_ms", json()).is_number_integer())
      out += fmt::format("Retention:  GPU samples pruned at {}\n", Time(ret["samples_pruned_ms"]));
    return out;
  } catch (const std::exception& e) {
    return std::string("(the record cannot be summarised: ") + e.what() + ")\n";
  }
}

}  // namespace tau::evidence
