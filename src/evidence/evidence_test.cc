#include "evidence/evidence.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/files.h"
#include "common/hash.h"
#include "evidence/internal.h"
#include "store/store.h"

namespace tau::evidence {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = ::testing::TempDir() + "/tau_evidence_test_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter_++);
    (void)RemoveTree(path_);
    EXPECT_TRUE(MakeDirs(path_).ok());
  }
  ~TempDir() { (void)RemoveTree(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

void Write(const std::string& path, const std::string& text) {
  ASSERT_TRUE(MakeDirs(fs::path(path).parent_path().string()).ok());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::app) << text;
}

// ---------------------------------------------------------------------------------------------
// A small JSON Schema checker: exactly the keywords docs/evidence-record.schema.json uses. Any
// other keyword is an error, so the schema cannot come to rely on something this does not check.

std::string CheckSchema(const json& root, const json& schema, const json& v,
                        const std::string& at) {
  static const std::set<std::string> kKnown = {
      "$schema", "$id",     "title",     "description", "$defs",
      "type",    "enum",    "required",  "properties",  "additionalProperties",
      "items",   "minimum", "minLength", "pattern",     "$ref"};
  for (const auto& [k, _] : schema.items())
    if (!kKnown.count(k)) return at + ": the checker does not know keyword " + k;
  if (schema.contains("$ref")) {
    std::string ref = schema["$ref"];
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0) return at + ": unsupported $ref " + ref;
    std::string err = CheckSchema(root, root["$defs"][ref.substr(prefix.size())], v, at);
    if (!err.empty()) return err;
  }
  if (schema.contains("type")) {
    std::vector<std::string> types;
    if (schema["type"].is_string())
      types.push_back(schema["type"]);
    else
      for (const json& t : schema["type"]) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types) {
      if ((t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
          (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
          (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
          (t == "null" && v.is_null()))
        ok = true;
    }
    if (!ok) return at + ": " + v.dump() + " is not of type " + schema["type"].dump();
  }
  if (schema.contains("enum")) {
    bool ok = false;
    for (const json& e : schema["enum"])
      if (e == v) ok = true;
    if (!ok) return at + ": " + v.dump() + " is not one of " + schema["enum"].dump();
  }
  if (schema.contains("minimum") && v.is_number() &&
      v.get<double>() < schema["minimum"].get<double>())
    return at + ": below the minimum";
  if (schema.contains("minLength") && v.is_string() &&
      v.get<std::string>().size() < schema["minLength"].get<size_t>())
    return at + ": too short";
  if (schema.contains("pattern") && v.is_string() &&
      !std::regex_search(v.get<std::string>(), std::regex(schema["pattern"].get<std::string>())))
    return at + ": " + v.dump() + " does not match " + schema["pattern"].get<std::string>();
  if (v.is_object()) {
    for (const json& r : schema.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
    const json props = schema.value("properties", json::object());
    for (const auto& [k, child] : v.items()) {
      if (props.contains(k)) {
        std::string err = CheckSchema(root, props[k], child, at + "." + k);
        if (!err.empty()) return err;
      } else if (schema.contains("additionalProperties") && !schema["additionalProperties"]) {
        return at + ": unexpected property " + k;
      }
    }
  }
  if (v.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < v.size(); ++i) {
      std::string err = CheckSchema(root, schema["items"], v[i], fmt::format("{}[{}]", at, i));
      if (!err.empty()) return err;
    }
  }
  return "";
}

json LoadSchema() {
  const char* src = std::getenv("TAU_SOURCE_DIR");
  std::string dir = src ? src : ".";
  auto text = ReadFile(dir + "/docs/evidence-record.schema.json");
  EXPECT_TRUE(text.ok()) << "set TAU_SOURCE_DIR to the source tree";
  return text.ok() ? json::parse(*text) : json::object();
}

// ---------------------------------------------------------------------------------------------
// Metrics

TEST(MetricLine, ValidPointsAndNonFiniteForms) {
  auto p = ParseMetricLine(
      R"({"name":"loss","step":3,"value":0.25,"split":"train","unit":"nats","tags":{"lr":"3e-4","warm":true,"k":2},"time":12})");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->name, "loss");
  EXPECT_EQ(p->step, 3);
  EXPECT_EQ(p->value, 0.25);
  EXPECT_EQ(p->split, "train");
  EXPECT_EQ(p->unit, "nats");
  EXPECT_EQ(p->tags.at("lr"), "3e-4");
  EXPECT_EQ(p->tags.at("warm"), "true");
  EXPECT_EQ(p->tags.at("k"), "2");

  for (const char* line :
       {R"({"name":"a","step":0,"value":"NaN"})", R"({"name":"a","step":0,"value":NaN})",
        R"({"name":"a","step":0,"value":"nan"})"}) {
    auto q = ParseMetricLine(line);
    ASSERT_TRUE(q.ok()) << line << ": " << q.status().ToString();
    EXPECT_TRUE(std::isnan(q->value)) << line;
  }
  auto inf = ParseMetricLine(R"({"name":"a","step":1,"value":Infinity})");
  ASSERT_TRUE(inf.ok());
  EXPECT_TRUE(std::isinf(inf->value) && inf->value > 0);
  auto ninf = ParseMetricLine(R"({"name":"a","step":1,"value":-Infinity})");
  ASSERT_TRUE(ninf.ok());
  EXPECT_TRUE(std::isinf(ninf->value) && ninf->value < 0);
  // A bare token inside a string stays a string.
  auto s = ParseMetricLine(R"({"name":"NaN is a name","step":1,"value":"-inf"})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "NaN is a name");
  // An integral float step is an integer.
  EXPECT_EQ(ParseMetricLine(R"({"name":"a","step":100.0,"value":1})")->step, 100);
}

TEST(MetricLine, BadLinesSayWhy) {
  struct Case {
    const char* line;
    const char* error;
  } cases[] = {
      {"not json", "not valid JSON"},
      {"[1,2]", "not a JSON object"},
      {R"({"step":1,"value":1})", "missing \"name\""},
      {R"({"name":"a","value":1})", "missing \"step\""},
      {R"({"name":"a","step":1})", "missing \"value\""},
      {R"({"name":"a","step":-1,"value":1})", "\"step\" must be an integer >= 0"},
      {R"({"name":"a","step":1.5,"value":1})", "\"step\" must be an integer >= 0"},
      {R"({"name":"a","step":"1","value":1})", "\"step\" must be an integer >= 0"},
      {R"({"name":"a","step":1,"value":"x"})", "\"value\" must be a number"},
      {R"({"name":"a","step":1,"value":true})", "\"value\" must be a number"},
      {R"({"name":"","step":1,"value":1})", "\"name\" must be 1 to 256 bytes"},
      {R"({"name":5,"step":1,"value":1})", "\"name\" must be a string"},
      {R"({"name":{"x":1},"step":1,"value":1})", "\"name\" must not be an object or array"},
      {R"({"name":"a","step":1,"value":1,"tags":{"a":{"b":1}}})", "\"tags\" values must be"},
      {R"({"name":"a","step":1,"value":1,"tags":[1]})", ""},
      {R"({"name":"a","step":1,"value":1,"split":3})", "\"split\" must be a string"},
  };
  for (const Case& c : cases) {
    auto p = ParseMetricLine(c.line);
    EXPECT_FALSE(p.ok()) << c.line;
    if (!p.ok()) {
      EXPECT_NE(p.status().message().find(c.error), std::string::npos)
          << c.line << " -> " << p.status().message();
    }
  }
  MetricLimits small;
  small.max_line_bytes = 10;
  EXPECT_FALSE(ParseMetricLine(R"({"name":"a","step":1,"value":1})", small).ok());
}

TEST(MetricLine, OwnFormRoundTrips) {
  MetricPoint p{"acc \"x\"\n", "val", 7, -1.5e-300, "%", {{"k", "v"}}, 3};
  auto q = ParseMetricLine(MetricPointJson(p));
  ASSERT_TRUE(q.ok()) << MetricPointJson(p);
  EXPECT_EQ(q->name, p.name);
  EXPECT_EQ(q->split, "val");
  EXPECT_EQ(q->step, 7);
  EXPECT_EQ(q->value, p.value);
  EXPECT_EQ(q->unit, "%");
  EXPECT_EQ(q->tags, p.tags);
  EXPECT_EQ(q->attempt, 3);
  for (double v : {std::nan(""), HUGE_VAL, -HUGE_VAL, 0.1, 1e20, 3.0}) {
    p.value = v;
    auto r = ParseMetricLine(MetricPointJson(p));
    ASSERT_TRUE(r.ok());
    if (std::isnan(v))
      EXPECT_TRUE(std::isnan(r->value));
    else
      EXPECT_EQ(r->value, v);
  }
}

TEST(MetricsChunk, PartialLinesWaitAndMalformedLinesAreCounted) {
  MetricsCursor cur;
  std::string data =
      "{\"name\":\"a\",\"step\":0,\"value\":1}\n"
      "garbage\n"
      "\n"
      "{\"name\":\"a\",\"step\":1,\"value\":2}\r\n"
      "{\"name\":\"a\",\"step\":2,";
  MetricsChunk c = ParseMetricsChunk(data, &cur);
  EXPECT_EQ(c.points.size(), 2u);
  EXPECT_EQ(c.malformed_count, 1);
  ASSERT_EQ(c.malformed.size(), 1u);
  EXPECT_EQ(c.malformed[0].line, 2);
  EXPECT_EQ(c.lines, 4);
  EXPECT_EQ(cur.line, 4);
  size_t partial = std::string("{\"name\":\"a\",\"step\":2,").size();
  EXPECT_EQ(cur.offset, static_cast<int64_t>(data.size() - partial));
  // The rest of the partial line arrives.
  MetricsChunk d = ParseMetricsChunk(data.substr(cur.offset) + "\"value\":3}\n", &cur);
  ASSERT_EQ(d.points.size(), 1u);
  EXPECT_EQ(d.points[0].step, 2);
  EXPECT_EQ(cur.line, 5);
}

TEST(MetricsChunk, OverlongLineIsSkippedToItsEnd) {
  MetricLimits limits;
  limits.max_line_bytes = 50;
  MetricsCursor cur;
  std::string long_part(80, 'x');
  MetricsChunk a = ParseMetricsChunk(long_part, &cur, limits);
  EXPECT_EQ(a.malformed_count, 1);
  EXPECT_EQ(a.malformed[0].line, 1);
  EXPECT_TRUE(cur.discarding);
  EXPECT_EQ(cur.offset, 80);
  MetricsChunk b =
      ParseMetricsChunk("yyy\n{\"name\":\"a\",\"step\":0,\"value\":1}\n", &cur, limits);
  EXPECT_EQ(b.malformed_count, 0);
  ASSERT_EQ(b.points.size(), 1u);
  EXPECT_EQ(cur.line, 2);
  EXPECT_FALSE(cur.discarding);
}

TEST(ReadMetrics, MissingTruncatedAndReplacedFiles) {
  TempDir dir;
  std::string path = dir / "m.jsonl";
  MetricsCursor cur;
  auto none = ReadMetrics(path, &cur);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->points.empty());
  Write(path, "{\"name\":\"a\",\"step\":0,\"value\":1}\n{\"name\":\"a\",\"step\":1,\"value\":1}\n");
  auto first = ReadMetrics(path, &cur);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->points.size(), 2u);
  // Opened with "w" again by a retried attempt: shorter than the cursor.
  Write(path, "{\"name\":\"a\",\"step\":5,\"value\":1}\n");
  auto second = ReadMetrics(path, &cur);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->restarted);
  ASSERT_EQ(second->points.size(), 1u);
  EXPECT_EQ(second->points[0].step, 5);
  // Replaced by another file (new inode) that is longer.
  std::string other = dir / "other";
  Write(other, std::string(200, ' ') + "\n{\"name\":\"b\",\"step\":9,\"value\":1}\n");
  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);
  auto third = ReadMetrics(path, &cur);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->restarted);
  ASSERT_EQ(third->points.size(), 1u);
  EXPECT_EQ(third->points[0].name, "b");
}

TEST(MetricHistory, RetriedAttemptDoesNotDoubleAndSummaries) {
  MetricHistory h;
  for (int s = 0; s < 100; ++s) h.Add({"loss", "train", s, 100.0 - s, "", {}, 1});
  // Attempt 2 resumes from the checkpoint at step 50 and emits 50..149 again.
  for (int s = 50; s < 150; ++s) h.Add({"loss", "train", s, 1000.0 + s, "nats", {}, 2});
  EXPECT_EQ(h.size(), 150u);
  EXPECT_EQ(h.replaced(), 50);
  auto series = h.Series("loss", "train");
  ASSERT_EQ(series.size(), 150u);
  EXPECT_EQ(series[49].attempt, 1);
  EXPECT_EQ(series[50].attempt, 2);
  EXPECT_EQ(series[50].value, 1050.0);
  // A late point of an earlier attempt does not replace a later attempt's.
  EXPECT_FALSE(h.Add({"loss", "train", 60, -1, "", {}, 1}));
  EXPECT_EQ(h.Series("loss", "train")[60].value, 1060.0);

  h.Add({"loss", "val", 0, std::nan(""), "", {}, 1});
  h.Add({"loss", "val", 1, HUGE_VAL, "", {}, 1});
  h.Add({"loss", "val", 2, 5, "", {}, 1});
  h.Add({"loss", "val", 3, std::nan(""), "", {}, 1});
  auto sums = h.Summaries();
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0].split, "train");
  EXPECT_EQ(sums[0].count, 150);
  EXPECT_EQ(sums[0].first_step, 0);
  EXPECT_EQ(sums[0].last_step, 149);
  EXPECT_EQ(*sums[0].min, 51.0);
  EXPECT_EQ(*sums[0].max, 1149.0);
  EXPECT_EQ(sums[0].latest, 1149.0);
  EXPECT_EQ(sums[0].latest_attempt, 2);
  EXPECT_EQ(sums[0].unit, "nats");
  EXPECT_EQ(sums[1].nan_count, 2);
  EXPECT_EQ(sums[1].inf_count, 1);
  EXPECT_EQ(*sums[1].min, 5.0);
  EXPECT_TRUE(std::isnan(sums[1].latest));

  // ToJsonl reads back to the same history.
  MetricHistory back;
  int64_t bad = 0;
  back.AddJsonl(h.ToJsonl(), &bad);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(back.size(), h.size());
  EXPECT_EQ(back.ToJsonl(), h.ToJsonl());
}

TEST(MetricHistory, Limits) {
  MetricLimits limits;
  limits.max_points = 3;
  limits.max_series = 2;
  MetricHistory h(limits);
  EXPECT_TRUE(h.Add({"a", "", 0, 1, "", {}, 1}));
  EXPECT_TRUE(h.Add({"b", "", 0, 1, "", {}, 1}));
  EXPECT_FALSE(h.Add({"c", "", 0, 1, "", {}, 1}));
  EXPECT_TRUE(h.Add({"a", "", 1, 1, "", {}, 1}));
  EXPECT_FALSE(h.Add({"a", "", 2, 1, "", {}, 1}));
  EXPECT_TRUE(h.Add({"a", "", 1, 2, "", {}, 1}));  // a replacement needs no room
  EXPECT_EQ(h.dropped(), 2);
  EXPECT_EQ(h.size(), 3u);
}

TEST(HistoryLine, EachNumericKeyIsAPointAtStep) {
  auto row = ParseHistoryLine(
      R"({"_step": 7, "_timestamp": 1733300000.5, "_runtime": 3, "loss": 0.25, "train/acc": 1,)"
      R"( "grad": NaN, "lr": "Infinity", "phase": "warmup", "done": false, "none": null,)"
      R"( "cfg": {"a": 1}, "hist": [1, 2]})");
  ASSERT_TRUE(row.ok()) << row.status().ToString();
  ASSERT_EQ(row->points.size(), 4u);
  std::map<std::string, double> got;
  for (const MetricPoint& p : row->points) {
    EXPECT_EQ(p.step, 7);
    EXPECT_EQ(p.split, "");
    got[p.name] = p.value;
  }
  EXPECT_EQ(got.at("loss"), 0.25);
  EXPECT_EQ(got.at("train/acc"), 1.0);
  EXPECT_TRUE(std::isnan(got.at("grad")));
  EXPECT_TRUE(std::isinf(got.at("lr")));
  EXPECT_EQ(got.count("_timestamp"), 0u);  // the format's own keys are no series
  // "warmup", false, null, an object and an array: ignored and counted.
  EXPECT_EQ(row->ignored, 5);
  EXPECT_EQ(ParseHistoryLine(R"({"_step": 3.0, "x": 1})")->points.at(0).step, 3);
  EXPECT_TRUE(ParseHistoryLine(R"({"_step": 0})")->points.empty());
}

TEST(HistoryLine, BadLinesSayWhy) {
  auto message = [](std::string_view line) { return ParseHistoryLine(line).status().message(); };
  EXPECT_EQ(message(R"({"loss": 1, "_timestamp": 5})"), "missing \"_step\"");
  EXPECT_EQ(message(R"({"_step": -1, "loss": 1})"), "\"_step\" must be an integer >= 0");
  EXPECT_EQ(message(R"({"_step": 1.5, "loss": 1})"), "\"_step\" must be an integer >= 0");
  EXPECT_EQ(message(R"({"_step": "3", "loss": 1})"), "\"_step\" must be an integer >= 0");
  EXPECT_EQ(message("[1, 2]"), "not a JSON object");
  EXPECT_EQ(message("{\"_step\": 1, \"loss\": "), "not valid JSON");
  MetricLimits limits;
  limits.max_line_bytes = 20;
  EXPECT_EQ(ParseHistoryLine(R"({"_step": 1, "loss": 0.123456})", limits).status().message(),
            "line longer than 20 bytes");
}

TEST(HistoryLine, ChunksCountBadLinesAndKeepAPartialLastLine) {
  MetricLimits limits;
  limits.format = MetricsFormat::kHistory;
  MetricsCursor cur;
  std::string data =
      "{\"_step\": 0, \"loss\": 2.0, \"acc\": 0.1, \"tag\": \"x\"}\n"
      "not json\n"
      "{\"loss\": 1.5}\n"
      "{\"_step\": 1, \"loss\": 1.0, \"acc\": 0.2}\n"
      "{\"_step\": 2, \"lo";
  MetricsChunk c = ParseMetricsChunk(data, &cur, limits);
  EXPECT_EQ(c.points.size(), 4u);
  EXPECT_EQ(c.point_count, 4);
  EXPECT_EQ(c.ignored_values, 1);
  EXPECT_EQ(c.malformed_count, 2);
  ASSERT_EQ(c.malformed.size(), 2u);
  EXPECT_EQ(c.malformed[0].line, 2);
  EXPECT_EQ(c.malformed[1].line, 3);
  EXPECT_EQ(c.malformed[1].error, "missing \"_step\"");
  EXPECT_EQ(cur.line, 4);
  MetricsChunk d = ParseMetricsChunk(data.substr(cur.offset) + "ss\": 0.5}\n", &cur, limits);
  ASSERT_EQ(d.points.size(), 1u);
  EXPECT_EQ(d.points[0].name, "loss");
  EXPECT_EQ(d.points[0].step, 2);
  // The same bytes in tau's own format are all malformed: the format is the source's.
  MetricsCursor own;
  EXPECT_EQ(ParseMetricsChunk("{\"_step\": 0, \"loss\": 2.0}\n", &own).malformed_count, 1);
}

// The distinct points of a collector's file, as compaction counts them.
int64_t Distinct(const std::string& evidence_dir) {
  auto report = CompactMetricsFile(evidence_dir + "/metrics.jsonl", "");
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  return report.ok() ? report->distinct : -1;
}

TEST(MetricsCollector, HistoryFileRewrittenByARetryIsNotDoubled) {
  TempDir dir;
  std::string source = dir / "run/output/history.jsonl";
  std::string ev = dir / "run/evidence";
  auto row = [](int step, double loss) {
    return fmt::format("{{\"_step\":{},\"_timestamp\":{},\"loss\":{},\"acc\":{}}}\n", step,
                       1733300000 + step, loss, step / 10.0);
  };
  std::string first;
  for (int s = 0; s < 6; ++s) first += row(s, 10 - s);
  Write(source, first + "{\"_step\":6,");  // a partial last line waits
  auto c = MetricsCollector::Open(ev);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto one = (*c)->Poll(source, 1, MetricsFormat::kHistory);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->point_count, 12);
  EXPECT_EQ(Distinct(ev), 12);
  // Attempt 2 resumes from step 3 and rewrites the file in place (open with "w": the same inode),
  // past the offset read so far: the bytes before the offset are not the ones read.
  std::string second;
  for (int s = 3; s < 12; ++s) second += row(s, 100 + s);
  ASSERT_GT(second.size(), first.size());
  std::ofstream(source, std::ios::binary | std::ios::trunc) << second;
  auto two = (*c)->Poll(source, 2, MetricsFormat::kHistory);
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(two->restarted);
  EXPECT_EQ(two->malformed_count, 0);
  EXPECT_EQ(two->point_count, 18);
  ASSERT_TRUE((*c)->Compact().ok());
  auto history = LoadMetricHistory(ev + "/metrics.jsonl");
  ASSERT_TRUE(history.ok());
  std::vector<MetricPoint> loss = history->Series("loss", "");
  ASSERT_EQ(loss.size(), 12u);  // steps 0..11 once each
  EXPECT_EQ(loss[2].value, 8);
  EXPECT_EQ(loss[2].attempt, 1);
  EXPECT_EQ(loss[3].value, 103);  // the later attempt's
  EXPECT_EQ(loss[3].attempt, 2);
  EXPECT_EQ(history->Series("acc", "").size(), 12u);
  EXPECT_EQ(history->SeriesKeys().size(), 2u);
}

TEST(MetricsCollector, SharedFileAcrossAttemptsAndRestart) {
  TempDir dir;
  std::string source = dir / "run/metrics.jsonl";
  std::string ev = dir / "run/evidence";
  Write(source, "");
  {
    auto c = MetricsCollector::Open(ev);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (int s = 0; s < 10; ++s)
      Append(source, fmt::format("{{\"name\":\"loss\",\"step\":{},\"value\":{}}}\n", s, s));
    Append(source, "bad line\n");
    ASSERT_TRUE((*c)->Poll(source, 1).ok());
    // Attempt 2 appends to the same file, resuming at step 5.
    for (int s = 5; s < 15; ++s)
      Append(source, fmt::format("{{\"name\":\"loss\",\"step\":{},\"value\":{}}}\n", s, 100 + s));
    Append(source, "{\"name\":\"loss\",\"step\":15,");  // partial
    auto chunk = (*c)->Poll(source, 2);
    ASSERT_TRUE(chunk.ok());
    EXPECT_EQ(chunk->point_count, 10);
    EXPECT_TRUE(chunk->points.empty());
    EXPECT_EQ((*c)->kept_points(), 20);
    EXPECT_EQ(Distinct(ev), 15);
    EXPECT_EQ((*c)->stats().malformed, 1);
    ASSERT_EQ((*c)->stats().first_malformed.size(), 1u);
    EXPECT_EQ((*c)->stats().first_malformed[0].second.line, 11);
  }
  // A restarted server: same history, and the cursor goes on where it was.
  {
    auto c = MetricsCollector::Open(ev);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ((*c)->kept_points(), 20);
    EXPECT_EQ(Distinct(ev), 15);
    EXPECT_EQ((*c)->stats().malformed, 1);
    Append(source, "\"value\":7}\n");
    auto chunk = (*c)->Poll(source, 2);
    ASSERT_TRUE(chunk.ok());
    EXPECT_EQ(chunk->point_count, 1);
    EXPECT_EQ(LoadMetricHistory(ev + "/metrics.jsonl")->Series("loss", "").back().step, 15);
    EXPECT_EQ(Distinct(ev), 16);
    auto again = (*c)->Poll(source, 2);  // nothing new
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->lines, 0);
    ASSERT_TRUE((*c)->Compact().ok());
    auto text = ReadFile(ev + "/metrics.jsonl");
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 16);
  }
  // A crash mid-append left a partial line: it is cut on open.
  Append(ev + "/metrics.jsonl", "{\"attempt\":2,\"name\":\"lo");
  auto c = MetricsCollector::Open(ev);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->kept_points(), 16);
  EXPECT_EQ(Distinct(ev), 16);
  auto h = LoadMetricHistory(ev + "/metrics.jsonl");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->Series("loss", "")[7].value, 107.0);
  EXPECT_EQ(h->Series("loss", "")[7].attempt, 2);
  EXPECT_EQ(h->Series("loss", "")[4].attempt, 1);
}

TEST(MetricsCollector, ARunWithoutMetricsGetsNoFiles) {
  TempDir dir;
  std::string source = dir / "run/metrics.jsonl";
  std::string ev = dir / "run/evidence";
  auto c = MetricsCollector::Open(ev);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(MakeDirs(dir / "run").ok());
  ASSERT_TRUE((*c)->Poll(source, 1).ok());  // the run never made its metrics file
  ASSERT_TRUE((*c)->Poll(source, 1).ok());
  ASSERT_TRUE((*c)->Compact().ok());
  EXPECT_FALSE(PathExists(ev));
  EXPECT_EQ(LoadMetricHistory(ev + "/metrics.jsonl")->size(), 0u);
  // The first point makes the directory and its files.
  Append(source, R"({"name":"loss","step":1,"value":0.5})"
                 "\n");
  ASSERT_TRUE((*c)->Poll(source, 1).ok());
  ASSERT_TRUE((*c)->Compact().ok());
  EXPECT_EQ(LoadMetricHistory(ev + "/metrics.jsonl")->size(), 1u);
  EXPECT_TRUE(PathExists(ev + "/metrics-state.json"));
}

TEST(MetricsCollector, HundredThousandPointsIngestQuickly) {
  TempDir dir;
  std::string source = dir / "metrics.jsonl";
  std::string text;
  for (int i = 0; i < 100000; ++i)
    text += fmt::format("{{\"name\":\"{}\",\"step\":{},\"value\":{},\"split\":\"train\"}}\n",
                        i % 4 == 0   ? "loss"
                        : i % 4 == 1 ? "lr"
                        : i % 4 == 2 ? "grad_norm"
                                     : "tokens_per_s",
                        i / 4, 0.001 * i);
  Write(source, text);
  CollectorOptions options;
  options.max_poll_bytes = 64u << 20;  // all of it in one read
  auto c = MetricsCollector::Open(dir / "evidence", options);
  ASSERT_TRUE(c.ok());
  auto start = std::chrono::steady_clock::now();
  auto chunk = (*c)->Poll(source, 1);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->point_count, 100000);
  EXPECT_EQ((*c)->kept_points(), 100000);
  // The target is well under a second (bench/evidence_bench measures it); this bound only
  // catches gross regressions on a loaded CI machine.
  EXPECT_LT(secs, 3.0);
}

// A job's line for `name` at `step`, with optional tags JSON.
std::string JobLine(const std::string& name, int64_t step, double value,
                    const std::string& extra = "") {
  return fmt::format("{{\"name\":\"{}\",\"step\":{},\"value\":{}{}}}\n", name, step, value, extra);
}

TEST(MetricsCollector, CapsRefuseAndCountPointsAndSeries) {
  TempDir dir;
  std::string source = dir / "run/metrics.jsonl";
  std::string ev = dir / "run/evidence";
  CollectorOptions options;
  options.max_points = 5;
  options.max_series = 2;
  {
    auto c = MetricsCollector::Open(ev, options);
    ASSERT_TRUE(c.ok());
    Write(source, JobLine("a", 0, 1) + JobLine("a", 1, 1) + JobLine("b", 0, 1) +
                      JobLine("c", 0, 1) +                              // a third series
                      JobLine("a", 2, 1, R"(,"tags":{"lr":"3e-4"})") +  // a, other tags: new
                      JobLine("a", 2, 1) + JobLine("b", 1, 1) +         // 5 kept
                      JobLine("a", 3, 1));                              // past max_points
    auto chunk = (*c)->Poll(source, 1);
    ASSERT_TRUE(chunk.ok());
    EXPECT_EQ(chunk->point_count, 8);
    EXPECT_EQ((*c)->kept_points(), 5);
    EXPECT_EQ((*c)->series_count(), 2u);
    EXPECT_EQ((*c)->stats().refused_series, 2);
    EXPECT_EQ((*c)->stats().refused_points, 1);
    EXPECT_EQ((*c)->stats().points, 8);
  }
  // The totals outlive a restart; the series kept are read back from the evidence file.
  auto stats = LoadMetricsStats(ev);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->refused_points, 1);
  EXPECT_EQ(stats->refused_series, 2);
  options.max_points = 100;
  auto c = MetricsCollector::Open(ev, options);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->kept_points(), 5);
  EXPECT_EQ((*c)->series_count(), 2u);
  Append(source, JobLine("c", 1, 1) + JobLine("b", 2, 1));
  ASSERT_TRUE((*c)->Poll(source, 1).ok());
  EXPECT_EQ((*c)->kept_points(), 6);
  EXPECT_EQ((*c)->stats().refused_series, 3);
  auto compacted = (*c)->Compact();
  ASSERT_TRUE(compacted.ok());
  MetricsInfo info = MetricsInfoFrom(*compacted, (*c)->stats());
  EXPECT_EQ(info.dropped, 4);
  RecordInput in;
  in.run.name = "capped";
  in.metrics = info;
  json record = BuildRecord(in);
  EXPECT_EQ(record["metrics"]["refused_points"], 1);
  EXPECT_EQ(record["metrics"]["refused_series"], 3);
  EXPECT_EQ(ParseRecord(record)->metrics.stats.refused_series, 3);
}

TEST(MetricsCollector, MasksSecretsInNamesSplitsUnitsAndTags) {
  TempDir dir;
  std::string source = dir / "run/metrics.jsonl";
  std::string ev = dir / "run/evidence";
  CollectorOptions options;
  options.secrets = {"hunter2-token", "ab"};  // "ab" is too short to mask
  auto c = MetricsCollector::Open(ev, options);
  ASSERT_TRUE(c.ok());
  Write(source, R"({"name":"loss-hunter2-token","split":"xhunter2-token","step":1,"value":0.5,)"
                R"("unit":"hunter2-token","tags":{"hunter2-token":"v=hunter2-token","lab":"ab"}})"
                "\n");
  ASSERT_TRUE((*c)->Poll(source, 1).ok());
  auto text = ReadFile(ev + "/metrics.jsonl");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->find("hunter2"), std::string::npos) << *text;
  auto compacted = (*c)->Compact();
  ASSERT_TRUE(compacted.ok());
  ASSERT_EQ(compacted->series.size(), 1u);
  EXPECT_EQ(compacted->series[0].name, "loss-***");
  EXPECT_EQ(compacted->series[0].split, "x***");
  EXPECT_EQ(compacted->series[0].unit, "***");
  auto h = LoadMetricHistory(ev + "/metrics.jsonl");
  ASSERT_TRUE(h.ok());
  auto points = h->Series("loss-***", "x***");
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].tags, (std::map<std::string, std::string>{{"***", "v=***"}, {"lab", "ab"}}));
  EXPECT_EQ(MaskSecrets("a secretsecret b", {"secret", "secretsecret"}), "a *** b");
}

TEST(MetricsCollector, ReadsInBoundedChunksWhateverTheFileSize) {
  TempDir dir;
  std::string source = dir / "metrics.jsonl";
  std::string text;
  const int kPoints = 200'000;
  for (int i = 0; i < kPoints; ++i)
    text += JobLine(i % 2 ? "loss" : "grad_norm", i / 2, 0.001 * i, R"(,"split":"train")");
  Write(source, text);
  ASSERT_GT(text.size(), 12u << 20);
  CollectorOptions options;
  options.max_poll_bytes = 1u << 20;
  auto c = MetricsCollector::Open(dir / "evidence", options);
  ASSERT_TRUE(c.ok());
  int polls = 0;
  bool more = true;
  while (more) {
    auto chunk = (*c)->Poll(source, 1);
    ASSERT_TRUE(chunk.ok());
    EXPECT_LE(chunk->lines, 20'000);  // 1 MiB of ~70-byte lines
    more = chunk->more;
    ++polls;
  }
  EXPECT_GE(polls, 12);
  EXPECT_EQ((*c)->kept_points(), kPoints);
  // The read block (1 MiB) and the append buffer (flushed at 1 MiB), not the file.
  EXPECT_LE((*c)->peak_buffer_bytes(), 2u << 20);
  EXPECT_LT((*c)->peak_buffer_bytes() * 5, text.size());
}

TEST(CompactMetricsFile, SpillsSortedRunsAndMergesThemAsTheHistoryWould) {
  TempDir dir;
  std::string in = dir / "metrics.jsonl";
  std::string text;
  MetricHistory history;
  // Three attempts, each re-emitting some steps of the one before; units that change; NaN and
  // Inf; tags; points written twice within an attempt (a crash re-read).
  for (int attempt = 1; attempt <= 3; ++attempt) {
    for (int i = 0; i < 3000; ++i) {
      MetricPoint p;
      p.name = i % 3 == 0 ? "loss" : i % 3 == 1 ? "lr" : "acc";
      p.split = i % 5 == 0 ? "eval" : "";
      p.step = (attempt - 1) * 700 + i / 3;
      p.value = i % 97 == 0 ? NAN : i % 89 == 0 ? INFINITY : attempt * 1000.0 + i * 0.5;
      p.attempt = attempt;
      if (i % 7 == 0) p.unit = attempt == 2 ? "nats" : "bits";
      if (i % 11 == 0) p.tags = {{"lr", std::to_string(attempt)}};
      for (int copy = 0; copy < (i % 13 == 0 ? 2 : 1); ++copy) {
        text += MetricPointJson(p) + "\n";
        history.Add(p);
      }
    }
  }
  text += "not a point\n";
  Write(in, text);
  CompactOptions small;
  small.sort_buffer_bytes = 64 * 1024;
  auto report = CompactMetricsFile(in, dir / "out.jsonl", small);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GT(report->spilled_runs, 10u);
  EXPECT_LE(report->peak_sort_bytes, small.sort_buffer_bytes + 1024);
  EXPECT_EQ(report->malformed, 1);
  EXPECT_EQ(report->distinct, static_cast<int64_t>(history.size()));
  EXPECT_EQ(report->replaced, history.replaced());
  EXPECT_EQ(*ReadFile(dir / "out.jsonl"), history.ToJsonl());
  EXPECT_EQ(internal::MetricSummariesJson(report->series),
            internal::MetricSummariesJson(history.Summaries()));
  // In memory, in place, and only summarising: the same.
  auto whole = CompactMetricsFile(in, "");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->spilled_runs, 0u);
  EXPECT_EQ(internal::MetricSummariesJson(whole->series),
            internal::MetricSummariesJson(history.Summaries()));
  ASSERT_TRUE(CompactMetricsFile(in, in, small).ok());
  EXPECT_EQ(*ReadFile(in), history.ToJsonl());
  // No temporary file is left behind; a missing input makes no output.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
  auto none = CompactMetricsFile(dir / "missing.jsonl", dir / "none.jsonl");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(PathExists(dir / "none.jsonl"));
}

// A compacted file's summaries kept beside it read back as they were (NaN and Inf included) while
// the file is unchanged, and not once it grows (a resumed run); the reader gives back every point.
TEST(MetricSummaries, KeptWithTheCompactedFileWhileItIsUnchanged) {
  TempDir dir;
  const std::string file = dir / "metrics.jsonl";
  MetricHistory history;
  std::string text;
  for (int i = 0; i < 500; ++i) {
    MetricPoint p;
    p.name = i % 2 ? "loss" : "acc";
    p.step = i / 2;
    p.value = i == 497 ? NAN : i == 498 ? -INFINITY : i * 0.25;
    p.attempt = 1;
    text += MetricPointJson(p) + "\n";
    history.Add(p);
  }
  Write(file, text);
  EXPECT_FALSE(LoadMetricSummaries(dir.path()).has_value());
  auto report = CompactMetricsFile(file, file);
  ASSERT_TRUE(report.ok());
  ASSERT_TRUE(SaveMetricSummaries(dir.path(), *report).ok());
  auto kept = LoadMetricSummaries(dir.path());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(internal::MetricSummariesJson(*kept),
            internal::MetricSummariesJson(history.Summaries()));
  auto reader = MetricPointReader::Open(file);
  ASSERT_TRUE(reader.ok());
  std::string back;
  MetricPoint p;
  while (true) {
    auto more = (*reader)->Next(&p);
    ASSERT_TRUE(more.ok());
    if (!*more) break;
    back += MetricPointJson(p) + "\n";
  }
  EXPECT_EQ(back, history.ToJsonl());
  Write(file, text + text);
  EXPECT_FALSE(LoadMetricSummaries(dir.path()).has_value());
}

// ---------------------------------------------------------------------------------------------
// The event chain, checked against the store's own hashing.

class StoreChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_ / "tau.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  std::vector<EventInfo> Events(const std::string& run) {
    auto events = store_->ListEvents(run);
    EXPECT_TRUE(events.ok());
    std::vector<EventInfo> out;
    for (const store::Event& e : *events)
      out.push_back({e.id, e.ts_ms, e.type, e.message, e.data, e.prev_hash, e.hash});
    return out;
  }
  TempDir dir_;
  std::unique_ptr<store::Store> store_;
};

TEST_F(StoreChainTest, RecomputesTheStoresChain) {
  store::RunRecord r;
  r.name = "demo-1";
  r.spec_name = "demo";
  r.spec_json = {{"name", "demo"}};
  r.config_hash = "abc";
  r.created_ms = r.updated_ms = 1;
  std::vector<store::Event> first = {
      {0, "demo-1", 1000, "Submitted", "submitted from tau.yaml", {{"files", 3}}, "", ""},
      {0, "demo-1", 1001, "Queued", "", {}, "", ""}};
  ASSERT_TRUE(store_->InsertRun(&r, first).ok());
  store::Batch batch;
  batch.events.push_back({0,
                          "demo-1",
                          2000,
                          "Running",
                          "attempt 1 started (1 process) — ünï",
                          {{"attempt", 1},
                           {"ratio", 0.1},
                           {"big", 1e300},
                           {"neg", -7},
                           {"nested", {{"a", {1, 2.5, "x"}}, {"b", nullptr}}}},
                          "",
                          ""});
  batch.events.push_back({0, "demo-1", 3000, "Failed", "exit 1", {{"exit_code", 1}}, "", ""});
  ASSERT_TRUE(store_->Commit(std::move(batch)).ok());
  std::vector<EventInfo> events = Events("demo-1");
  ASSERT_EQ(events.size(), 4u);
  EXPECT_TRUE(VerifyEventChain("demo-1", events).ok());
  EXPECT_TRUE(VerifyEventChain("demo-1", {}).ok());
  // Wrong run name: the first event no longer matches.
  Status wrong = VerifyEventChain("demo-2", events);
  EXPECT_NE(wrong.message().find("event 1 "), std::string::npos) << wrong.message();

  auto altered = events;
  altered[2].message = "attempt 1 started (2 processes)";
  Status s = VerifyEventChain("demo-1", altered);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("broken at event 3 (id"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("Running"), std::string::npos);
  altered = events;
  altered.erase(altered.begin() + 1);  // a deleted event
  s = VerifyEventChain("demo-1", altered);
  EXPECT_NE(s.message().find("broken at event 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("prev_hash"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The record

// A run of two attempts with logs, metrics, GPU samples and checkpoints on disk.
struct Fixture {
  TempDir dir;
  RecordInput record;
  BundleSources sources;

  Fixture() {
    std::string run = dir / "runs/demo-1";
    std::vector<EventInfo> events;
    std::string prev;
    int64_t ts = 1'700'000'000'000;
    for (const char* type :
         {"Submitted", "Queued", "Admitted", "Running", "Retrying", "Running", "Succeeded"}) {
      EventInfo e;
      e.id = static_cast<int64_t>(events.size()) + 1;
      e.ts_ms = ts + e.id * 1000;
      e.type = type;
      e.message = std::string(type) + " message";
      e.data = {{"n", e.id}};
      e.prev_hash = prev;
      e.hash = *EventHash("demo-1", e, prev);
      prev = e.hash;
      events.push_back(e);
    }
    record.run = {"demo-1",  "demo",    "Succeeded", "Succeeded",   "", 0,         std::nullopt,
                  "default", "default", 0,           {{"gpus", 1}}, ts, ts + 3000, ts + 4000,
                  ts + 7000};
    json spec = {{"name", "demo"}, {"shape", "manifest"}, {"compute", {{"gpus", 1}}}};
    json canonical = spec;
    canonical.erase("shape");
    record.config = {"tau.yaml",
                     "name: demo\n",
                     spec,
                     Sha256Hex(canonical.dump()),
                     {{"queue", "default"}},
                     {{"compute.gpus", "1", "spec"}}};
    record.snapshot.files = {{"train.py", 12, Sha256Hex("print('hi')\n"), 0644},
                             {"run.sh", 3, Sha256Hex("ls\n"), 0755}};
    record.snapshot.digest = SnapshotDigest(record.snapshot.files);
    record.runtime = {"",
                      "",
                      {"torch>=2.4"},
                      {"torch==2.4.1"},
                      "3.11.2",
                      "box",
                      "Debian 12",
                      "6.1",
                      "550.54",
                      "12.4",
                      {{0, "GPU-1234", "NVIDIA H100"}},
                      "0.1.0"};
    record.events = events;
    for (int n = 1; n <= 2; ++n) {
      AttemptInfo a;
      a.number = n;
      a.state = "Finished";
      a.gpus = {0};
      a.started_ms = ts + 4000 + (n - 1) * 1500;
      a.ended_ms = a.started_ms + 1000;
      a.exit_code = n == 1 ? 1 : 0;
      a.outcome = "Exited";
      a.failure_class = n == 1 ? "GPUError" : "Succeeded";
      a.diagnosis = {{"summary", n == 1 ? "Xid 79 (rank 0)" : ""}};
      std::string adir = fmt::format("{}/attempts/{}", run, n);
      for (int rank = 0; rank < 2; ++rank) {
        std::string path = fmt::format("{}/logs/rank-{}.log", adir, rank);
        std::string text;
        for (int i = 0; i < 200; ++i)
          text += fmt::format("attempt {} rank {} line {}\n", n, rank, i);
        Write(path, text);
        sources.logs.push_back({n, rank, path});
      }
      auto logs = IndexAttemptLogs(adir);
      EXPECT_TRUE(logs.ok());
      a.logs = *logs;
      record.attempts.push_back(a);
    }
    // Metrics: attempt 2 re-emits steps 5..9.
    auto c = MetricsCollector::Open(run + "/evidence");
    EXPECT_TRUE(c.ok());
    std::string m = run + "/metrics.jsonl";
    for (int s = 0; s < 10; ++s)
      Append(m, fmt::format("{{\"name\":\"loss\",\"split\":\"train\",\"step\":{},\"value\":{}}}\n",
                            s, 10 - s));
    Append(m, "{\"name\":\"acc\",\"step\":9,\"value\":NaN}\n");
    EXPECT_TRUE((*c)->Poll(m, 1).ok());
    for (int s = 5; s < 20; ++s)
      Append(m, fmt::format("{{\"name\":\"loss\",\"split\":\"train\",\"step\":{},\"value\":{}}}\n",
                            s, 1.0 / (s + 1)));
    EXPECT_TRUE((*c)->Poll(m, 2).ok());
    record.metrics =
        MetricsInfoFrom(*CompactMetricsFile(run + "/evidence/metrics.jsonl", ""), (*c)->stats());
    sources.metrics_path = run + "/evidence/metrics.jsonl";
    std::vector<GpuSample> samples;
    for (int i = 0; i < 5; ++i)
      samples.push_back({ts + 4000 + i * 100, 0, "GPU-1234", 1, 50.0 + i, 10.0, int64_t{1} << 30,
                         int64_t{80} << 30, 60.0 + i, 300.0});
    EXPECT_TRUE(AppendGpuSamples(run + "/evidence", samples).ok());
    auto loaded = LoadGpuSamples(run + "/evidence/gpu-samples.jsonl");
    EXPECT_TRUE(loaded.ok());
    record.gpu_samples = SummarizeGpuSamples(*loaded);
    sources.gpu_samples_path = run + "/evidence/gpu-samples.jsonl";
    Write(run + "/checkpoints/step-10.pt", "checkpoint bytes");
    Write(run + "/checkpoints/step-20.pt.tmp", "half");
    auto arts = ScanArtifacts(run + "/checkpoints", "checkpoint", {ts + 4000, ts + 5500});
    EXPECT_TRUE(arts.ok());
    record.artifacts = *arts;
    record.updated_ms = ts + 8000;
  }
};

TEST(Record, MatchesTheSchema) {
  Fixture f;
  f.record.lineage.push_back(
      {"train", "wf-1-train", "Succeeded", "/ck/step-3", std::string(64, 'a'), 2, 10, "/out"});
  f.record.lineage.push_back({"prep", "wf-1-prep", "Succeeded", "", "", 0, 0, "/out2"});
  json schema = LoadSchema();
  json record = BuildRecord(f.record);
  EXPECT_EQ(CheckSchema(schema, schema, record, "record"), "");
  EXPECT_EQ(record["chain_head"], f.record.events.back().hash);
  EXPECT_EQ(record["metrics"]["series"].size(), 2u);
  EXPECT_EQ(record["metrics"]["distinct_points"], 21);  // 20 loss + 1 acc, not 26
  EXPECT_EQ(record["metrics"]["series"][0]["latest"], "NaN");
  EXPECT_EQ(record["artifacts"].size(), 1u);
  EXPECT_EQ(record["artifacts"][0]["sha256"], Sha256Hex("checkpoint bytes"));
  EXPECT_EQ(record["attempts"][1]["logs"][1]["path"], "logs/attempt-2/rank-1.log");
  EXPECT_EQ(record["lineage"][0]["checkpoint_sha256"], std::string(64, 'a'));
  // The checker does catch what the schema forbids.
  json bad = record;
  bad["lineage"][0]["checkpoint_sha256"] = "abc";
  EXPECT_NE(CheckSchema(schema, schema, bad, "record"), "");
  bad = record;
  bad["run"]["exit_code"] = "zero";
  EXPECT_NE(CheckSchema(schema, schema, bad, "record"), "");
  bad = record;
  bad["extra"] = 1;
  EXPECT_NE(CheckSchema(schema, schema, bad, "record"), "");
  bad = record;
  bad["events"][0]["hash"] = "xyz";
  EXPECT_NE(CheckSchema(schema, schema, bad, "record"), "");
  // An empty record (a run just submitted) is valid too.
  RecordInput empty;
  empty.run.name = "x";
  EXPECT_EQ(CheckSchema(schema, schema, BuildRecord(empty), "record"), "");

  // Parsed back into its input, it builds the same JSON.
  auto parsed = ParseRecord(record);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(BuildRecord(*parsed), record);
  EXPECT_FALSE(ParseRecord(json::object()).ok());
  bad = record;
  bad["attempts"][0]["logs"][0]["size"] = "big";
  EXPECT_FALSE(ParseRecord(bad).ok());

  // Saved and loaded, with its events for the chain.
  ASSERT_TRUE(SaveRecord(f.dir / "ev", record).ok());
  auto loaded = LoadRecord(f.dir / "ev/record.json");
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(*loaded, record);
  auto events = RecordEvents(*loaded);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(VerifyEventChain("demo-1", *events).ok());
  std::string summary = FormatRecordSummary(*loaded);
  for (const char* want : {"demo-1", "Succeeded", "GPUError", "Xid 79", "logs/attempt-1/rank-0.log",
                           "loss [train]", "Chain head:", "NVIDIA H100"})
    EXPECT_NE(summary.find(want), std::string::npos) << want << "\n" << summary;
}

TEST(Record, SnapshotScanMatchesTheServersDigest) {
  TempDir dir;
  Write(dir / "snap/train.py", "print('hi')\n");
  Write(dir / "snap/run.sh", "ls\n");
  ASSERT_EQ(::chmod((dir / "snap/run.sh").c_str(), 0755), 0);
  Write(dir / "snap/pkg/mod.py", "x = 1\n");
  auto snap = ScanSnapshot(dir / "snap");
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  ASSERT_EQ(snap->files.size(), 3u);
  EXPECT_EQ(snap->files[0].path, "pkg/mod.py");
  EXPECT_EQ(snap->files[1].mode, 0755);
  // backend/snapshot.cc: sha256 over "path\0mode\0sha256\n", sorted by path.
  Sha256 tree;
  for (const auto& [path, mode, data] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"pkg/mod.py", "644", "x = 1\n"},
           {"run.sh", "755", "ls\n"},
           {"train.py", "644", "print('hi')\n"}})
    tree.Update(path + std::string(1, '\0') + mode + std::string(1, '\0') + Sha256Hex(data) + "\n");
  EXPECT_EQ(snap->digest, tree.HexDigest());
  ASSERT_EQ(::symlink("/etc/passwd", (dir / "snap/link").c_str()), 0);
  EXPECT_FALSE(ScanSnapshot(dir / "snap").ok());
}

TEST(Record, ListArtifactsIsBoundedAndReadsNoFile) {
  TempDir dir;
  std::string root = dir / "out";
  for (int i = 0; i < 30; ++i) Write(root + fmt::format("/many/f{:02}.txt", i), "x");
  Write(root + "/a.txt", "alpha");
  Write(root + "/.tmp-partial", "skipped");
  fs::create_symlink(dir / "elsewhere", root + "/link");
  bool truncated = true;
  auto all = ListArtifacts(root, "output", 100, nullptr, &truncated);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_FALSE(truncated);
  ASSERT_EQ(all->size(), 31u);  // the link and the temporary name are no artifacts
  EXPECT_EQ((*all)[0].path, "a.txt");
  EXPECT_EQ((*all)[0].size, 5);
  EXPECT_EQ((*all)[0].sha256, "");  // not read
  // A digest known for the same size and mtime is reused; a stale one is not.
  std::vector<Artifact> known = {(*all)[0], (*all)[1]};
  known[0].sha256 = "cached";
  known[1].sha256 = "stale";
  known[1].mtime_ms -= 1;
  auto again = ListArtifacts(root, "output", 100, &known, &truncated);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].sha256, "cached");
  EXPECT_EQ((*again)[1].sha256, "");
  auto few = ListArtifacts(root, "output", 10, nullptr, &truncated);
  ASSERT_TRUE(few.ok());
  EXPECT_TRUE(truncated);
  EXPECT_EQ(few->size(), 10u);
  EXPECT_TRUE(ListArtifacts(dir / "missing", "output", 10, nullptr, &truncated)->empty());
  EXPECT_FALSE(truncated);
}

TEST(Record, ArtifactsSkipTemporaryNamesAndLinksAndKnowTheirAttempt) {
  TempDir dir;
  Write(dir / "ck/a.pt", "a");
  Write(dir / "ck/b.pt", "bb");
  Write(dir / "ck/.hidden", "x");
  Write(dir / "ck/c.partial", "x");
  Write(dir / "ck/step-5/COMPLETE", "");
  Write(dir / "ck/step-6.incomplete/part", "x");
  ASSERT_EQ(::symlink("/etc/passwd", (dir / "ck/link").c_str()), 0);
  auto set_mtime = [&](const std::string& p, int64_t ms) {
    struct timespec ts[2];
    ts[0].tv_sec = ts[1].tv_sec = ms / 1000;
    ts[0].tv_nsec = ts[1].tv_nsec = 0;
    ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), ts, 0), 0);
  };
  set_mtime(dir / "ck/a.pt", 1'500'000);
  set_mtime(dir / "ck/b.pt", 2'500'000);
  set_mtime(dir / "ck/step-5/COMPLETE", 500'000);
  auto arts = ScanArtifacts(dir / "ck", "checkpoint", {1'000'000, 2'000'000});
  ASSERT_TRUE(arts.ok()) << arts.status().ToString();
  ASSERT_EQ(arts->size(), 3u);
  EXPECT_EQ((*arts)[0].path, "a.pt");
  EXPECT_EQ((*arts)[0].attempt, 1);
  EXPECT_EQ((*arts)[1].path, "b.pt");
  EXPECT_EQ((*arts)[1].attempt, 2);
  EXPECT_EQ((*arts)[1].size, 2);
  EXPECT_EQ((*arts)[2].path, "step-5/COMPLETE");
  EXPECT_EQ((*arts)[2].attempt, 0);
  // Unchanged files keep their recorded hash (not read again).
  std::vector<Artifact> previous = *arts;
  previous[0].sha256 = std::string(64, 'c');
  auto again = ScanArtifacts(dir / "ck", "checkpoint", {1'000'000, 2'000'000}, &previous);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].sha256, std::string(64, 'c'));
  EXPECT_EQ((*again)[1].sha256, (*arts)[1].sha256);
  auto none = ScanArtifacts(dir / "missing", "output", {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(Record, GpuSamplesRoundTripAndSummary) {
  GpuSample s{5, 1, "GPU-x", 2, 99.5, std::nullopt, 1000, 2000, 70.0, std::nullopt};
  auto back = ParseGpuSample(GpuSampleJson(s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->util_pct, 99.5);
  EXPECT_FALSE(back->memory_util_pct);
  EXPECT_EQ(back->memory_total_bytes, 2000);
  EXPECT_FALSE(ParseGpuSample("{").ok());
  auto sum = SummarizeGpuSamples({s, {9, 1, "GPU-x", 2, 0.5, 1.0, 3000, 2000, 60.0, 250.0}});
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_EQ(sum[0].count, 2);
  EXPECT_EQ(*sum[0].mean_util_pct, 50.0);
  EXPECT_EQ(*sum[0].max_memory_used_bytes, 3000);
  EXPECT_EQ(*sum[0].max_power_w, 250.0);
  EXPECT_EQ(sum[0].first_ms, 5);
  EXPECT_EQ(sum[0].last_ms, 9);
}

// ---------------------------------------------------------------------------------------------
// Bundles

struct Entry {
  std::string name;
  std::string data;
  char type = '0';
  std::string link;
};

std::vector<Entry> ReadAll(const std::string& path) {
  std::vector<Entry> out;
  Status s = internal::ReadTarGz(
      path,
      [&](const internal::TarEntry& e) {
        out.push_back({e.name, "", e.type, e.link});
        return Status::Ok();
      },
      [&](std::string_view d) {
        out.back().data.append(d);
        return Status::Ok();
      });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

void WriteAll(const std::string& path, const std::vector<Entry>& entries) {
  auto w = internal::TarGzWriter::Create(path);
  ASSERT_TRUE(w.ok());
  for (const Entry& e : entries) ASSERT_TRUE((*w)->Add(e.name, e.data, 0).ok());
  ASSERT_TRUE((*w)->Finish().ok());
}

// Recomputes the manifest's file list and digest as someone rewriting a bundle would.
void FixManifest(std::vector<Entry>* entries, const std::string& chain_head = "") {
  json files = json::array();
  Entry* manifest = nullptr;
  for (Entry& e : *entries) {
    if (e.name == "manifest.json") {
      manifest = &e;
      continue;
    }
    files.push_back({{"path", e.name}, {"size", e.data.size()}, {"sha256", Sha256Hex(e.data)}});
  }
  ASSERT_NE(manifest, nullptr);
  json m = json::parse(manifest->data);
  m["files"] = files;
  if (!chain_head.empty()) m["chain_head"] = chain_head;
  m.erase("digest");
  m["digest"] = Sha256Hex(m.dump());
  manifest->data = m.dump(2);
}

Entry* Find(std::vector<Entry>* entries, const std::string& name) {
  for (Entry& e : *entries)
    if (e.name == name) return &e;
  return nullptr;
}

std::string VerifyMessage(const std::string& path, const VerifyOptions& options = {}) {
  Status s = VerifyBundle(path, options);
  return s.ok() ? "OK" : s.message();
}

class BundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bundle_ = f_.dir / "demo-1.tar.gz";
    auto report = ExportBundle(f_.record, f_.sources, bundle_, 1'700'000'100'000);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->files, 8);  // 4 logs, metrics, samples, checkpoints, record
    EXPECT_EQ(report->chain_head, f_.record.events.back().hash);
    entries_ = ReadAll(bundle_);
  }
  // Writes `entries` as a new bundle and verifies it.
  std::string Check(const std::vector<Entry>& entries, const VerifyOptions& options = {}) {
    std::string path = f_.dir / fmt::format("variant-{}.tar.gz", variant_++);
    WriteAll(path, entries);
    return VerifyMessage(path, options);
  }
  Fixture f_;
  std::string bundle_;
  std::vector<Entry> entries_;
  int variant_ = 0;
};

TEST_F(BundleTest, IntactBundleVerifies) {
  VerifyReport report;
  Status s = VerifyBundle(bundle_, {f_.record.events.back().hash}, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(report.run, "demo-1");
  EXPECT_EQ(report.events, 7);
  EXPECT_EQ(report.files, 9);
  EXPECT_EQ(report.tau_version, "0.1.0");
  std::vector<std::string> names;
  for (const Entry& e : entries_) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "logs/attempt-1/rank-0.log", "logs/attempt-1/rank-1.log",
                       "logs/attempt-2/rank-0.log", "logs/attempt-2/rank-1.log", "metrics.jsonl",
                       "gpu-samples.jsonl", "checkpoints.json", "record.json", "manifest.json"}));
  // The bundled record matches the schema, and its metrics are not doubled by the retry.
  json schema = LoadSchema();
  json record = json::parse(Find(&entries_, "record.json")->data);
  EXPECT_EQ(CheckSchema(schema, schema, record, "record"), "");
  EXPECT_EQ(record["metrics"]["distinct_points"], 21);
  EXPECT_EQ(std::count(Find(&entries_, "metrics.jsonl")->data.begin(),
                       Find(&entries_, "metrics.jsonl")->data.end(), '\n'),
            21);
  auto text = ReadBundleFile(bundle_, "logs/attempt-2/rank-1.log");
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("attempt 2 rank 1 line 199"), std::string::npos);
  EXPECT_EQ(ReadBundleFile(bundle_, "nope").status().code(), StatusCode::kNotFound);
  // A re-packed copy with the same content verifies too (the check is of content, not bytes).
  EXPECT_EQ(Check(entries_), "OK");
  // GNU tar can read it, when it is installed.
  if (::system("tar --version >/dev/null 2>&1") == 0) {
    std::string cmd = fmt::format("tar -tzf '{}' >/dev/null 2>&1", bundle_);
    EXPECT_EQ(::system(cmd.c_str()), 0);
  }
}

TEST_F(BundleTest, OneAlteredByteInEachFileIsNamed) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    std::vector<Entry> copy = entries_;
    std::string& data = copy[i].data;
    ASSERT_FALSE(data.empty()) << copy[i].name;
    data[data.size() / 2] ^= 0x01;
    std::string msg = Check(copy);
    std::string want =
        copy[i].name == "manifest.json" ? "manifest.json altered" : copy[i].name + " altered";
    EXPECT_EQ(msg.rfind(want, 0), 0u) << copy[i].name << ": " << msg;
  }
}

TEST_F(BundleTest, MissingExtraAndUnsafeEntries) {
  for (const char* name : {"logs/attempt-1/rank-1.log", "record.json", "metrics.jsonl"}) {
    std::vector<Entry> copy = entries_;
    copy.erase(
        std::find_if(copy.begin(), copy.end(), [&](const Entry& e) { return e.name == name; }));
    EXPECT_EQ(Check(copy), std::string(name) + " missing");
  }
  std::vector<Entry> copy = entries_;
  copy.erase(copy.end() - 1);
  EXPECT_EQ(Check(copy), "manifest.json missing");

  copy = entries_;
  copy.insert(copy.begin() + 2, {"notes.txt", "hello", '0', ""});
  EXPECT_EQ(Check(copy), "unexpected file notes.txt (the manifest does not list it)");
  // Listed in a recomputed manifest, an extra log is still unknown to the record.
  copy = entries_;
  copy.insert(copy.begin(), {"logs/attempt-3/rank-0.log", "sneaky", '0', ""});
  FixManifest(&copy);
  EXPECT_EQ(Check(copy), "unexpected file logs/attempt-3/rank-0.log (the record does not list it)");

  // Entries our writer refuses to make: a hand-made tar with them.
  auto raw_entry = [](const std::string& name, char type, const std::string& data,
                      const std::string& link) {
    std::string h(512, '\0');
    std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
    std::memcpy(h.data() + 100, "0000644", 7);
    std::memcpy(h.data() + 108, "0000000", 7);
    std::memcpy(h.data() + 116, "0000000", 7);
    std::string size = fmt::format("{:011o}", data.size());
    std::memcpy(h.data() + 124, size.data(), 11);
    std::memcpy(h.data() + 136, "00000000000", 11);
    h[156] = type;
    std::memcpy(h.data() + 157, link.data(), link.size());
    std::memcpy(h.data() + 257, "ustar", 6);
    std::memcpy(h.data() + 263, "00", 2);
    int64_t sum = 0;
    for (size_t i = 0; i < 512; ++i)
      sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
    std::string cs = fmt::format("{:06o}", sum);
    std::memcpy(h.data() + 148, cs.data(), 6);
    h[155] = ' ';
    std::string body = data + std::string((512 - data.size() % 512) % 512, '\0');
    return h + body;
  };
  auto gzip = [](const std::string& raw) {
    z_stream s{};
    deflateInit2(&s, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY);
    std::string out(raw.size() + 1024, '\0');
    s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
    s.avail_in = static_cast<uInt>(raw.size());
    s.next_out = reinterpret_cast<Bytef*>(out.data());
    s.avail_out = static_cast<uInt>(out.size());
    deflate(&s, Z_FINISH);
    out.resize(s.total_out);
    deflateEnd(&s);
    return out;
  };
  struct Case {
    std::string entry;
    std::string want;
  } cases[] = {
      {raw_entry("../evil", '0', "x", ""), "unsafe entry '../evil'"},
      {raw_entry("/etc/evil", '0', "x", ""), "unsafe entry '/etc/evil'"},
      {raw_entry("logs/./x", '0', "x", ""), "unsafe entry 'logs/./x'"},
      {raw_entry("link", '2', "", "/etc/passwd"), "entry 'link' in the bundle is a link"},
      {raw_entry("hard", '1', "", "record.json"), "entry 'hard' in the bundle is a link"},
      {raw_entry("dir", '5', "", ""), "entry 'dir' in the bundle is a directory"},
  };
  for (const Case& c : cases) {
    std::string path = f_.dir / "raw.tar.gz";
    Write(path, gzip(c.entry + std::string(1024, '\0')));
    std::string msg = VerifyMessage(path);
    EXPECT_EQ(msg.rfind(c.want, 0), 0u) << msg;
  }
  std::string dup =
      raw_entry("a", '0', "1", "") + raw_entry("a", '0', "2", "") + std::string(1024, '\0');
  Write(f_.dir / "dup.tar.gz", gzip(dup));
  EXPECT_EQ(VerifyMessage(f_.dir / "dup.tar.gz"), "entry 'a' appears twice");
}

TEST_F(BundleTest, CorruptArchive) {
  auto bytes = ReadFile(bundle_);
  ASSERT_TRUE(bytes.ok());
  // A flipped bit may fall where inflate does not look (deflate has such bits): the same content,
  // no tampering. Flip the first byte from the middle on whose change inflate does see.
  std::string damaged;
  for (size_t at = bytes->size() / 2; at < bytes->size() / 2 + 64; ++at) {
    damaged = *bytes;
    damaged[at] ^= 0x40;
    Write(f_.dir / "damaged.tar.gz", damaged);
    Status read = internal::ReadTarGz(
        f_.dir / "damaged.tar.gz", [](const internal::TarEntry&) { return Status::Ok(); },
        [](std::string_view) { return Status::Ok(); });
    if (!read.ok()) break;
  }
  EXPECT_EQ(VerifyMessage(f_.dir / "damaged.tar.gz").rfind("the archive is corrupt", 0), 0u)
      << VerifyMessage(f_.dir / "damaged.tar.gz");
  Write(f_.dir / "short.tar.gz", bytes->substr(0, bytes->size() - 100));
  EXPECT_EQ(VerifyMessage(f_.dir / "short.tar.gz").rfind("the archive is corrupt", 0), 0u);
  Write(f_.dir / "long.tar.gz", *bytes + "x");
  EXPECT_EQ(VerifyMessage(f_.dir / "long.tar.gz"),
            "the archive is corrupt: data after the end of the gzip stream");
  Write(f_.dir / "text.tar.gz", "hello");
  EXPECT_EQ(VerifyMessage(f_.dir / "text.tar.gz").rfind("the archive is corrupt", 0), 0u);
  EXPECT_EQ(VerifyBundle(f_.dir / "absent.tar.gz").code(), StatusCode::kNotFound);
}

TEST_F(BundleTest, ConsistentRewritesAreCaughtInside) {
  // The record's event altered and the manifest recomputed: the chain breaks.
  std::vector<Entry> copy = entries_;
  json record = json::parse(Find(&copy, "record.json")->data);
  record["events"][3]["message"] = "nothing to see";
  Find(&copy, "record.json")->data = record.dump(2);
  FixManifest(&copy);
  std::string msg = Check(copy);
  EXPECT_NE(msg.find("event chain broken at event 4 (id 4, Running)"), std::string::npos) << msg;

  // The manifest's chain head changed (digest recomputed).
  copy = entries_;
  FixManifest(&copy, std::string(64, 'a'));
  EXPECT_EQ(Check(copy).rfind("chain head mismatch", 0), 0u);

  // A log changed and the manifest recomputed: the record's hash of it differs.
  copy = entries_;
  Find(&copy, "logs/attempt-1/rank-0.log")->data += "one more line\n";
  FixManifest(&copy);
  EXPECT_EQ(Check(copy), "logs/attempt-1/rank-0.log does not match the record's sha256 for it");

  copy = entries_;
  json ck = json::parse(Find(&copy, "checkpoints.json")->data);
  ck["artifacts"][0]["size"] = 99;
  Find(&copy, "checkpoints.json")->data = ck.dump();
  FixManifest(&copy);
  EXPECT_EQ(Check(copy), "checkpoints.json does not match the record's artifact index");

  copy = entries_;
  std::string& metrics = Find(&copy, "metrics.jsonl")->data;
  metrics.replace(metrics.find("\"step\":19,\"value\":"), 18, "\"step\":19,\"value\":7,\"x\":");
  FixManifest(&copy);
  EXPECT_EQ(Check(copy),
            "metrics.jsonl does not match the record's summary of metric 'loss/train'");

  copy = entries_;
  record = json::parse(Find(&copy, "record.json")->data);
  record["config"]["spec"]["compute"]["gpus"] = 8;
  Find(&copy, "record.json")->data = record.dump(2);
  FixManifest(&copy);
  EXPECT_EQ(Check(copy), "record.json: the config hash does not match the canonical spec");

  copy = entries_;
  record = json::parse(Find(&copy, "record.json")->data);
  record["snapshot"]["files"][0]["sha256"] = std::string(64, '0');
  Find(&copy, "record.json")->data = record.dump(2);
  FixManifest(&copy);
  EXPECT_EQ(Check(copy), "record.json: the snapshot digest does not match its file list");
}

TEST_F(BundleTest, AFullyRecomputedBundleIsCaughtOnlyByTheServersChainHead) {
  std::vector<Entry> copy = entries_;
  json record = json::parse(Find(&copy, "record.json")->data);
  std::string prev;
  auto events = *RecordEvents(record);
  events[6].message = "Succeeded, honestly";
  for (size_t i = 0; i < events.size(); ++i) {
    events[i].prev_hash = prev;
    events[i].hash = *EventHash("demo-1", events[i], prev);
    prev = events[i].hash;
    record["events"][i]["message"] = events[i].message;
    record["events"][i]["prev_hash"] = events[i].prev_hash;
    record["events"][i]["hash"] = events[i].hash;
  }
  record["chain_head"] = prev;
  Find(&copy, "record.json")->data = record.dump(2);
  FixManifest(&copy, prev);
  EXPECT_EQ(Check(copy), "OK");
  std::string msg = Check(copy, {f_.record.events.back().hash});
  EXPECT_NE(msg.find("is not the server's"), std::string::npos) << msg;
}

TEST_F(BundleTest, ExportNoticesChangedAndLostLogs) {
  // Changed after IndexAttemptLogs recorded it.
  Append(f_.sources.logs[0].path, "appended later\n");
  auto refused = ExportBundle(f_.record, f_.sources, f_.dir / "x.tar.gz", 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("changed after it was recorded"), std::string::npos);
  EXPECT_FALSE(PathExists(f_.dir / "x.tar.gz"));
  // A log given no source (pruned or gone): the record keeps its hash, the bundle lacks it.
  RecordInput rec = f_.record;
  rec.attempts[0].logs[0].state = LogState::kPruned;
  BundleSources src = f_.sources;
  src.logs.erase(src.logs.begin(), src.logs.begin() + 2);  // attempt 1's logs
  auto ok = ExportBundle(rec, src, f_.dir / "y.tar.gz", 1);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(VerifyMessage(f_.dir / "y.tar.gz"), "OK");
  json record = json::parse(*ReadBundleFile(f_.dir / "y.tar.gz", "record.json"));
  EXPECT_EQ(record["attempts"][0]["logs"][0]["state"], "pruned");
  EXPECT_EQ(record["attempts"][0]["logs"][1]["state"], "lost");
  EXPECT_EQ(record["attempts"][0]["logs"][0]["sha256"], f_.record.attempts[0].logs[0].sha256);
}

TEST(TarGz, LongNamesAndLargeNumbers) {
  TempDir dir;
  std::string name = std::string(120, 'd') + "/" + std::string(90, 'f');
  auto w = internal::TarGzWriter::Create(dir / "t.tar.gz");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Add(name, "content", 0).ok());
  EXPECT_FALSE((*w)->Add(std::string(300, 'x'), "", 0).ok());
  EXPECT_FALSE((*w)->Add("../x", "", 0).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto entries = ReadAll(dir / "t.tar.gz");
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].name, name);
  EXPECT_EQ(entries[0].data, "content");
  EXPECT_TRUE(internal::SafeEntryName("a/b.log"));
  for (const char* bad : {"", "/a", "a/", "a//b", "a/../b", "..", ".", "a\\b"})
    EXPECT_FALSE(internal::SafeEntryName(bad)) << bad;
}

// ---------------------------------------------------------------------------------------------
// Rendering and retention

TEST(Render, Sparkline) {
  EXPECT_EQ(Sparkline({}), "");
  EXPECT_EQ(Sparkline({0, 1, 2, 3, 4, 5, 6, 7}), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(Sparkline({5, 5, 5}), "▄▄▄");
  EXPECT_EQ(Sparkline({0, std::nan(""), 1}), "▁ █");
  std::vector<double> many;
  for (int i = 0; i < 1000; ++i) many.push_back(i);
  std::string line = Sparkline(many, 10);
  EXPECT_EQ(line.size(), 10u * std::string("▁").size());
  EXPECT_EQ(line.substr(0, 3), "▁");
  EXPECT_EQ(line.substr(line.size() - 3), "█");
}

TEST(Render, Tables) {
  std::string t = FormatMetricTable(
      {{"loss", "", 1, 0.5, "", {}, 1}, {"loss", "", 100, std::nan(""), "", {}, 2}});
  EXPECT_EQ(t,
            "STEP  VALUE  ATTEMPT\n"
            "   1    0.5        1\n"
            " 100    NaN        2\n");
  MetricHistory h;
  for (int s = 0; s < 20; ++s) h.Add({"loss", "train", s, 20.0 - s, "", {}, 1});
  std::string sum = FormatSummaryTable(h.Summaries(), &h, 10);
  EXPECT_NE(sum.find("METRIC"), std::string::npos);
  EXPECT_NE(sum.find("loss [train]"), std::string::npos);
  EXPECT_NE(sum.find("0..19"), std::string::npos);
  EXPECT_NE(sum.find("█"), std::string::npos);
  EXPECT_EQ(FormatValue(1.0 / 3), "0.333333");
  EXPECT_EQ(FormatValue(-HUGE_VAL), "-Inf");
}

TEST(Retention, Policy) {
  auto p = ParseRetentionPolicy("logs=30d,samples=7d");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->keep_logs_ms, int64_t{30} * 86'400'000);
  EXPECT_EQ(p->keep_samples_ms, int64_t{7} * 86'400'000);
  EXPECT_EQ(ParseRetentionPolicy("logs=forever")->keep_logs_ms, 0);
  EXPECT_FALSE(ParseRetentionPolicy("logs").ok());
  EXPECT_FALSE(ParseRetentionPolicy("metrics=1d").ok());
  EXPECT_FALSE(ParseRetentionPolicy("logs=soon").ok());
}

}  // namespace
}  // namespace tau::evidence

namespace tau::evidence {
namespace {

TEST_F(BundleTest, ArtifactsNamedAfterASecretAreMaskedInTheRecordAndTheBundle) {
  std::string run = f_.dir / "runs/demo-1";
  Write(run + "/checkpoints/ckpt-hunter2-token.pt", "secret-named checkpoint");
  auto arts = ScanArtifacts(run + "/checkpoints", "checkpoint", {});
  ASSERT_TRUE(arts.ok());
  MaskArtifactPaths(&*arts, {"hunter2-token"});
  RecordInput record = f_.record;
  record.artifacts = *arts;
  std::string out = f_.dir / "masked.tar.gz";
  ASSERT_TRUE(ExportBundle(record, f_.sources, out, 1'700'000'100'000).ok());
  ASSERT_TRUE(VerifyBundle(out).ok());
  for (const char* name : {"record.json", "checkpoints.json"}) {
    auto text = ReadBundleFile(out, name);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(text->find("hunter2"), std::string::npos) << name;
    EXPECT_NE(text->find("ckpt-***.pt"), std::string::npos) << name;
  }
  EXPECT_EQ(BuildRecord(record).dump().find("hunter2"), std::string::npos);
}

}  // namespace
}  // namespace tau::evidence

namespace tau::evidence {
namespace {

// A checkpoint's digest is sha256sum's view of it: a file's own sha256, or for a directory the
// sha256 of its files' "SHA256  PATH" lines sorted by path, whatever order the scan gave.
TEST(CheckpointDigest, IsAFilesSha256OrADirectorysSha256sumLines) {
  std::vector<Artifact> files = {{"checkpoint", "step-3/model.bin", 5, Sha256Hex("model"), 1, 0},
                                 {"checkpoint", "step-3/COMPLETE", 0, Sha256Hex(""), 1, 0},
                                 {"checkpoint", "step-30/model.bin", 3, Sha256Hex("new"), 1, 0},
                                 {"checkpoint", "last.pt", 4, Sha256Hex("last"), 1, 0}};
  CheckpointSum dir = CheckpointDigest(files, "step-3");
  const std::string lines = Sha256Hex("") + "  COMPLETE\n" + Sha256Hex("model") + "  model.bin\n";
  EXPECT_EQ(dir.sha256, Sha256Hex(lines));
  EXPECT_EQ(dir.files, 2);
  EXPECT_EQ(dir.bytes, 5);
  std::swap(files[0], files[1]);
  EXPECT_EQ(CheckpointDigest(files, "step-3").sha256, dir.sha256);
  CheckpointSum file = CheckpointDigest(files, "last.pt");
  EXPECT_EQ(file.sha256, Sha256Hex("last"));
  EXPECT_EQ(file.files, 1);
  EXPECT_EQ(CheckpointDigest(files, "step-4").sha256, "");
}

}  // namespace
}  // namespace tau::evidence
