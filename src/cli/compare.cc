#include "cli/compare.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "spec/set_fields.h"

namespace tau::cli {

using nlohmann::json;

namespace {

std::string LeafText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

const json& At(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// A field's resolved value and its source, for one run.
struct Setting {
  std::string value, source;
};

// The provenance entry that covers `field`: itself, or the nearest section above it.
const Setting* SourceFor(const std::map<std::string, Setting>& provenance,
                         const std::string& field) {
  std::string f = field;
  while (true) {
    auto it = provenance.find(f);
    if (it != provenance.end()) return &it->second;
    size_t cut = f.find_last_of(".[");
    if (cut == std::string::npos || cut == 0) return nullptr;
    f.resize(cut);
  }
}

// Whether `field` is `name` or a part of it (name.x, name[0]).
bool Under(const std::string& field, const std::string& name) {
  return field == name || (field.size() > name.size() && field.compare(0, name.size(), name) == 0 &&
                           (field[name.size()] == '.' || field[name.size()] == '['));
}

// The config as `tau run --set` names it: the fields of the spec file the run was submitted with,
// its --set overrides applied (spec::SetFields), each with the source of the resolution's entry
// that covers it; then what the resolution alone decided (a queue or a request the platform gave,
// named as resolution names it), where the file has no field of that name.
std::map<std::string, Setting> SetConfigOf(const std::string& yaml, const json& spec,
                                           const std::map<std::string, Setting>& prov) {
  std::map<std::string, Setting> out;
  for (const auto& [field, value] : spec::SetFields(yaml, spec::RecordedOverrides(spec))) {
    const std::string canonical = spec::CanonicalField(field);
    const Setting* s = SourceFor(prov, field);
    if (!s) s = SourceFor(prov, canonical);
    Setting& o = out[field];
    o.value = value;
    o.source = s ? s->source : "";
    // The resolution replaced what the file said (a profile won): the value the run ran with.
    auto own = prov.find(canonical);
    if (own != prov.end() && own->second.source != "spec" && own->second.source != "command line")
      o.value = own->second.value;
  }
  std::vector<std::string> named;
  for (const auto& [field, s] : out) named.push_back(spec::CanonicalField(field));
  for (const auto& [field, s] : prov) {
    bool covered = false;
    for (size_t i = 0; i < named.size() && !covered; ++i)
      covered = Under(named[i], field) || Under(field, named[i]);
    for (const auto& [set, value] : out) covered = covered || Under(set, field);
    if (!covered) out[field] = s;
  }
  return out;
}

std::map<std::string, Setting> ConfigOf(const json& record) {
  const json& config = At(record, "config");
  std::map<std::string, Setting> prov;
  const json& entries = At(config, "provenance");
  if (entries.is_array())
    for (const json& p : entries)
      if (p.is_object() && At(p, "field").is_string())
        prov[At(p, "field").get<std::string>()] = {LeafText(At(p, "value")),
                                                   LeafText(At(p, "source"))};
  if (At(config, "spec_yaml").is_string() && !At(config, "spec_yaml").get<std::string>().empty()) {
    std::map<std::string, Setting> out =
        SetConfigOf(At(config, "spec_yaml").get<std::string>(), At(config, "spec"), prov);
    if (!out.empty()) return out;
  }
  // A record without the file's text (or one that no longer parses): the canonical spec's fields.
  json spec = At(config, "spec");
  if (spec.is_object()) spec.erase("overrides");
  std::vector<std::pair<std::string, std::string>> leaves;
  if (spec.is_object() && !spec.empty()) FlattenJson(spec, "", &leaves);
  std::map<std::string, Setting> out;
  for (const auto& [field, value] : leaves) {
    const Setting* s = SourceFor(prov, field);
    out[field] = {value, s ? s->source : ""};
  }
  // The resolution's values win: a profile or a platform default may have set what the spec says
  // nothing of, or replaced what it said.
  for (const auto& [field, s] : prov) out[field] = s;
  return out;
}

json OptText(const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); }

json Number(double v) { return std::isfinite(v) ? json(v) : json(evidence::FormatValue(v)); }

std::string Short(const std::string& digest) {
  std::string d = digest;
  if (d.rfind("sha256:", 0) == 0) d = d.substr(7);
  return d.substr(0, 12);
}

// Columns padded to their widest cell, two spaces apart.
std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], r[i].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      out += cells[i];
      if (i + 1 < cells.size()) out += std::string(width[i] - cells[i].size() + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

// The version a `pip freeze` line gives its package: "1.2" of "x==1.2", the reference of
// "x @ URL", the whole line otherwise (an editable checkout, a line pip freeze may change).
std::string ResolvedVersion(const std::string& line) {
  if (size_t at = line.find(" @ "); at != std::string::npos) return line.substr(at + 3);
  if (size_t eq = line.find("==="); eq != std::string::npos) return line.substr(eq + 3);
  if (size_t eq = line.find("=="); eq != std::string::npos) return line.substr(eq + 2);
  return line;
}

std::vector<std::string> StringList(const json& j) {
  std::vector<std::string> out;
  if (j.is_array())
    for (const json& v : j)
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

// A package's requested or resolved line per run, keyed by its name ("" names: the line itself).
void AddPackageLines(const std::vector<std::string>& lines, bool resolved, size_t run,
                     std::map<std::string, PackageDiff>* out, size_t n) {
  for (const std::string& line : lines) {
    std::string name = PackageName(line);
    if (name.empty()) name = line;
    PackageDiff& d = (*out)[name];
    if (d.name.empty()) {
      d.name = name;
      d.requested.resize(n);
      d.resolved.resize(n);
    }
    if (resolved)
      d.resolved[run] = ResolvedVersion(line);
    else
      d.requested[run] = line;
  }
}

// " (asked: REQ)" of a package cell, the requirement as the spec gave it.
std::string PackageCell(const std::optional<std::string>& requested,
                        const std::optional<std::string>& resolved) {
  if (!requested && !resolved) return "-";
  if (!requested) return *resolved;
  return (resolved ? *resolved + " " : "") + "(asked: " + *requested + ")";
}

}  // namespace

std::string PackageName(const std::string& line) {
  std::string text = line;
  if (size_t egg = text.find("#egg="); egg != std::string::npos) {
    text = text.substr(egg + 5);
  } else {
    size_t start = text.find_first_not_of(" \t");
    if (start == std::string::npos || text[start] == '-') return "";
    text = text.substr(start);
  }
  std::string name;
  bool dash = false;
  for (char ch : text) {
    const bool word = std::isalnum(static_cast<unsigned char>(ch));
    if (!word && ch != '-' && ch != '_' && ch != '.') break;
    if (!word) {
      dash = true;
      continue;
    }
    if (dash && !name.empty()) name += '-';
    dash = false;
    name += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  return name;
}

bool MetricMatches(const std::string& name, const std::string& split, const std::string& metric) {
  return name == metric || (!split.empty() && name + "/" + split == metric);
}

SeriesStats StatsOf(const std::vector<evidence::MetricPoint>& points) {
  SeriesStats s;
  s.count = static_cast<int64_t>(points.size());
  if (points.empty()) return s;
  s.last_step = points.back().step;
  s.last = points.back().value;
  for (const auto& p : points) {
    if (!std::isfinite(p.value)) continue;
    if (!s.min || p.value < *s.min) {
      s.min = p.value;
      s.min_step = p.step;
    }
    if (!s.max || p.value > *s.max) {
      s.max = p.value;
      s.max_step = p.step;
    }
  }
  return s;
}

void FlattenJson(const json& value, const std::string& prefix,
                 std::vector<std::pair<std::string, std::string>>* out) {
  if (value.is_object() && !value.empty()) {
    for (auto it = value.begin(); it != value.end(); ++it)
      FlattenJson(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else if (value.is_array() && !value.empty()) {
    for (size_t i = 0; i < value.size(); ++i)
      FlattenJson(value[i], fmt::format("{}[{}]", prefix, i), out);
  } else {
    out->emplace_back(prefix, LeafText(value));
  }
}

Comparison CompareRuns(const std::vector<CompareInput>& runs, const std::string& metric) {
  Comparison c;
  const size_t n = runs.size();
  std::vector<std::map<std::string, Setting>> configs;
  std::vector<std::map<std::string, std::string>> files(n);
  std::set<std::string> fields, paths;
  std::set<std::pair<std::string, std::string>> series;
  std::map<std::string, PackageDiff> packages;
  for (size_t i = 0; i < n; ++i) {
    const CompareInput& r = runs[i];
    c.runs.push_back(r.run);
    configs.push_back(ConfigOf(r.record));
    for (const auto& [f, s] : configs.back()) fields.insert(f);
    const json& snap = At(r.record, "snapshot");
    c.snapshot_digests.push_back(
        At(snap, "digest").is_string() ? At(snap, "digest").get<std::string>() : "");
    const json& list = At(snap, "files");
    if (list.is_array())
      for (const json& f : list)
        if (At(f, "path").is_string()) {
          files[i][At(f, "path").get<std::string>()] = LeafText(At(f, "sha256"));
          paths.insert(At(f, "path").get<std::string>());
        }
    c.file_counts.push_back(static_cast<int64_t>(files[i].size()));
    const json& runtime = At(r.record, "runtime");
    std::vector<std::string> resolved = StringList(At(runtime, "packages"));
    c.package_counts.push_back(static_cast<int64_t>(resolved.size()));
    AddPackageLines(StringList(At(runtime, "pip")), false, i, &packages, n);
    AddPackageLines(resolved, true, i, &packages, n);
    for (const auto& key : r.metrics.SeriesKeys())
      if (metric.empty() || MetricMatches(key.first, key.second, metric)) series.insert(key);
  }
  c.any_packages = !packages.empty();
  for (auto& [name, d] : packages) {
    std::set<std::pair<std::optional<std::string>, std::optional<std::string>>> distinct;
    for (size_t i = 0; i < n; ++i) distinct.insert({d.requested[i], d.resolved[i]});
    if (distinct.size() > 1) c.packages.push_back(std::move(d));
  }
  for (const std::string& f : fields) {
    ConfigDiff d;
    d.field = f;
    std::set<std::optional<std::string>> distinct;
    for (size_t i = 0; i < n; ++i) {
      auto it = configs[i].find(f);
      d.values.push_back(it == configs[i].end() ? std::nullopt
                                                : std::optional<std::string>(it->second.value));
      d.sources.push_back(it == configs[i].end() ? "" : it->second.source);
      distinct.insert(d.values.back());
    }
    if (distinct.size() > 1) c.config.push_back(std::move(d));
  }
  for (const std::string& p : paths) {
    FileDiff d;
    d.path = p;
    std::set<std::optional<std::string>> distinct;
    for (size_t i = 0; i < n; ++i) {
      auto it = files[i].find(p);
      d.digests.push_back(it == files[i].end() ? std::nullopt
                                               : std::optional<std::string>(it->second));
      distinct.insert(d.digests.back());
    }
    if (distinct.size() > 1) c.files.push_back(std::move(d));
  }
  for (const auto& [name, split] : series) {
    MetricRow row;
    row.name = name;
    row.split = split;
    for (size_t i = 0; i < n; ++i) {
      std::vector<evidence::MetricPoint> points = runs[i].metrics.Series(name, split);
      row.stats.push_back(points.empty() ? std::nullopt
                                         : std::optional<SeriesStats>(StatsOf(points)));
    }
    c.metrics.push_back(std::move(row));
  }
  return c;
}

std::vector<PlotCurve> MetricCurves(const std::vector<CompareInput>& runs,
                                    const std::string& metric) {
  std::set<std::pair<std::string, std::string>> keys;
  for (const CompareInput& r : runs)
    for (const auto& key : r.metrics.SeriesKeys())
      if (MetricMatches(key.first, key.second, metric)) keys.insert(key);
  std::vector<PlotCurve> out;
  for (const CompareInput& r : runs)
    for (const auto& [name, split] : keys) {
      std::vector<evidence::MetricPoint> points = r.metrics.Series(name, split);
      if (points.empty()) continue;
      PlotCurve curve;
      curve.label = r.run;
      if (keys.size() > 1) curve.label += " " + name + (split.empty() ? "" : "/" + split);
      for (const evidence::MetricPoint& p : points)
        curve.points.emplace_back(static_cast<double>(p.step), p.value);
      out.push_back(std::move(curve));
    }
  return out;
}

json ComparisonJson(const Comparison& c) {
  json runs = json::array();
  for (size_t i = 0; i < c.runs.size(); ++i)
    runs.push_back({{"name", c.runs[i]},
                    {"snapshot_digest", c.snapshot_digests[i]},
                    {"file_count", c.file_counts[i]},
                    {"package_count", c.package_counts[i]}});
  json config = json::array();
  for (const ConfigDiff& d : c.config) {
    json values = json::array();
    for (size_t i = 0; i < d.values.size(); ++i)
      values.push_back({{"value", OptText(d.values[i])}, {"source", d.sources[i]}});
    config.push_back({{"field", d.field}, {"values", values}});
  }
  json files = json::array();
  for (const FileDiff& d : c.files) {
    json digests = json::array();
    for (const auto& v : d.digests) digests.push_back(OptText(v));
    files.push_back({{"path", d.path}, {"sha256", digests}});
  }
  json packages = json::array();
  for (const PackageDiff& d : c.packages) {
    json per_run = json::array();
    for (size_t i = 0; i < d.requested.size(); ++i)
      per_run.push_back(
          {{"requested", OptText(d.requested[i])}, {"resolved", OptText(d.resolved[i])}});
    packages.push_back({{"name", d.name}, {"runs", per_run}});
  }
  json metrics = json::array();
  for (const MetricRow& m : c.metrics) {
    json per_run = json::array();
    for (const auto& s : m.stats) {
      if (!s) {
        per_run.push_back(nullptr);
        continue;
      }
      per_run.push_back({{"count", s->count},
                         {"last", Number(s->last)},
                         {"last_step", s->last_step},
                         {"min", s->min ? json(*s->min) : json(nullptr)},
                         {"min_step", s->min ? json(s->min_step) : json(nullptr)},
                         {"max", s->max ? json(*s->max) : json(nullptr)},
                         {"max_step", s->max ? json(s->max_step) : json(nullptr)}});
    }
    metrics.push_back({{"name", m.name}, {"split", m.split}, {"runs", per_run}});
  }
  return {{"runs", runs},
          {"same_code",
           std::set<std::string>(c.snapshot_digests.begin(), c.snapshot_digests.end()).size() <= 1},
          {"config", config},
          {"files", files},
          {"packages", packages},
          {"metrics", metrics}};
}

std::string FormatComparison(const Comparison& c) {
  std::vector<std::string> header = {""};
  for (const std::string& r : c.runs) header.push_back(r);
  std::string out = "Config (the fields that differ):\n";
  if (c.config.empty()) {
    out += "  (the same in every run)\n";
  } else {
    std::vector<std::string> h = header;
    h[0] = "FIELD";
    std::vector<std::vector<std::string>> rows;
    for (const ConfigDiff& d : c.config) {
      std::vector<std::string> row = {d.field};
      for (size_t i = 0; i < d.values.size(); ++i) {
        std::string cell = d.values[i] ? *d.values[i] : "-";
        if (d.values[i] && !d.sources[i].empty()) cell += " (" + d.sources[i] + ")";
        row.push_back(cell);
      }
      rows.push_back(row);
    }
    out += Table(h, rows);
  }
  out += "\nCode:\n";
  {
    std::vector<std::string> h = header;
    h[0] = "";
    std::vector<std::string> digest = {"snapshot"}, count = {"files"};
    for (size_t i = 0; i < c.runs.size(); ++i) {
      digest.push_back(c.snapshot_digests[i].empty() ? "-" : Short(c.snapshot_digests[i]));
      count.push_back(std::to_string(c.file_counts[i]));
    }
    std::vector<std::vector<std::string>> rows = {digest, count};
    for (const FileDiff& d : c.files) {
      std::vector<std::string> row = {d.path};
      for (const auto& v : d.digests) row.push_back(v ? Short(*v) : "(absent)");
      rows.push_back(row);
    }
    out += Table(h, rows);
    if (c.files.empty()) out += "  (no file differs)\n";
  }
  out += "\nPackages (the ones that differ: installed version, and what the spec asked for):\n";
  if (c.packages.empty()) {
    out += c.any_packages ? "  (the same in every run)\n"
                          : "  (none: no run asks for packages with runtime.pip)\n";
  } else {
    std::vector<std::string> h = header;
    h[0] = "PACKAGE";
    std::vector<std::vector<std::string>> rows;
    for (const PackageDiff& d : c.packages) {
      std::vector<std::string> row = {d.name};
      for (size_t i = 0; i < d.requested.size(); ++i)
        row.push_back(PackageCell(d.requested[i], d.resolved[i]));
      rows.push_back(row);
    }
    out += Table(h, rows);
  }
  out += "\nMetrics (last, min@step, max@step):\n";
  if (c.metrics.empty()) {
    out += "  (no run has metric points)\n";
  } else {
    std::vector<std::string> h = header;
    h[0] = "SERIES";
    std::vector<std::vector<std::string>> rows;
    for (const MetricRow& m : c.metrics) {
      std::string label = m.name + (m.split.empty() ? "" : "/" + m.split);
      std::vector<std::string> last = {label + " last"}, min = {label + " min"},
                               max = {label + " max"};
      for (const auto& s : m.stats) {
        if (!s) {
          last.push_back("-");
          min.push_back("-");
          max.push_back("-");
          continue;
        }
        last.push_back(fmt::format("{} @{}", evidence::FormatValue(s->last), s->last_step));
        min.push_back(s->min ? fmt::format("{} @{}", evidence::FormatValue(*s->min), s->min_step)
                             : "-");
        max.push_back(s->max ? fmt::format("{} @{}", evidence::FormatValue(*s->max), s->max_step)
                             : "-");
      }
      rows.push_back(last);
      rows.push_back(min);
      rows.push_back(max);
    }
    out += Table(h, rows);
  }
  return out;
}

}  // namespace tau::cli
