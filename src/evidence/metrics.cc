// Metrics: parsing the job's JSONL points, the deduplicated history, and the collector that keeps
// them in the run's evidence directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/hash.h"
#include "common/layout.h"
#include "common/redact.h"
#include "evidence/evidence.h"
#include "evidence/internal.h"

namespace tau::evidence {

using nlohmann::json;

namespace {

constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxSplitBytes = 64;
constexpr size_t kMaxUnitBytes = 32;
constexpr size_t kMaxTags = 32;
constexpr size_t kMaxTagKeyBytes = 64;
constexpr size_t kMaxTagValueBytes = 256;
constexpr size_t kMalformedKeptPerChunk = 100;
constexpr size_t kMalformedKeptPerRun = 20;

// A SAX handler that reads one point without building a DOM (several times faster than parsing into
// a json value, which matters at 100,000 points). Only the top-level object's known keys are kept;
// anything else is skipped, whatever its shape.
class PointSax {
 public:
  MetricPoint point;
  std::string error;  // the first semantic error; the parse goes on to check the syntax
  bool has_name = false, has_step = false, has_value = false;

  bool null() { return Scalar(Kind::kNull, 0, 0, 0, nullptr); }
  bool boolean(bool v) { return Scalar(Kind::kBool, 0, 0, 0, v ? &kTrue : &kFalse); }
  bool number_integer(json::number_integer_t v) { return Scalar(Kind::kInt, v, 0, 0, nullptr); }
  bool number_unsigned(json::number_unsigned_t v) {
    return Scalar(Kind::kUnsigned, 0, v, 0, nullptr);
  }
  bool number_float(json::number_float_t v, const std::string& text) {
    return Scalar(Kind::kFloat, 0, 0, v, &text);
  }
  bool string(std::string& v) { return Scalar(Kind::kString, 0, 0, 0, &v); }
  bool binary(json::binary_t&) { return true; }
  bool start_object(size_t) {
    ++depth_;
    if (depth_ == 2 && key_ == "tags")
      in_tags_ = true;
    else if (depth_ == 2)
      Skipped();
    else if (depth_ == 3 && in_tags_)
      Fail("\"tags\" values must be strings, numbers or booleans");
    return true;
  }
  bool end_object() {
    if (depth_ == 2) in_tags_ = false;
    --depth_;
    return true;
  }
  bool start_array(size_t) {
    if (depth_ == 0) Fail("not a JSON object");
    ++depth_;
    if (depth_ == 2 && key_ == "tags")
      Fail("\"tags\" must be an object");
    else if (depth_ == 2)
      Skipped();
    else if (depth_ == 3 && in_tags_)
      Fail("\"tags\" values must be strings, numbers or booleans");
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1)
      key_ = k;
    else if (depth_ == 2 && in_tags_)
      tag_key_ = k;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) {
    syntax_error_ = true;
    return false;
  }
  bool syntax_error() const { return syntax_error_; }

 private:
  enum class Kind { kNull, kBool, kInt, kUnsigned, kFloat, kString };
  static inline const std::string kTrue = "true", kFalse = "false";

  void Fail(std::string message) {
    if (error.empty()) error = std::move(message);
  }
  // A nested value under a known key is the wrong type.
  void Skipped() {
    if (key_ == "name" || key_ == "step" || key_ == "value" || key_ == "split" || key_ == "unit" ||
        key_ == "attempt")
      Fail(fmt::format("\"{}\" must not be an object or array", key_));
  }
  bool Scalar(Kind kind, int64_t i, uint64_t u, double d, const std::string* s) {
    if (depth_ == 0) {
      Fail("not a JSON object");
      return true;
    }
    if (depth_ == 2 && in_tags_) return Tag(kind, i, u, d, s);
    if (depth_ == 2) {
      if (key_ == "tags") Fail("\"tags\" values must be strings, numbers or booleans");
      return true;
    }
    if (depth_ != 1) return true;
    if (key_ == "name") {
      if (kind != Kind::kString) return Fail("\"name\" must be a string"), true;
      if (s->empty() || s->size() > kMaxNameBytes)
        return Fail(fmt::format("\"name\" must be 1 to {} bytes", kMaxNameBytes)), true;
      point.name = *s;
      has_name = true;
    } else if (key_ == "step") {
      if (kind == Kind::kInt && i >= 0) {
        point.step = i;
      } else if (kind == Kind::kUnsigned && u <= static_cast<uint64_t>(INT64_MAX)) {
        point.step = static_cast<int64_t>(u);
      } else if (kind == Kind::kFloat && d >= 0 && d < 9.2e18 && std::floor(d) == d) {
        point.step = static_cast<int64_t>(d);  // 100.0: an integer written as a float
      } else {
        return Fail("\"step\" must be an integer >= 0"), true;
      }
      has_step = true;
    } else if (key_ == "value") {
      if (kind == Kind::kInt)
        point.value = static_cast<double>(i);
      else if (kind == Kind::kUnsigned)
        point.value = static_cast<double>(u);
      else if (kind == Kind::kFloat)
        point.value = d;
      else if (kind == Kind::kString && internal::ParseNonFiniteWord(*s, &point.value)) {
      } else {
        return Fail("\"value\" must be a number, \"NaN\", \"Infinity\" or \"-Infinity\""), true;
      }
      has_value = true;
    } else if (key_ == "split") {
      if (kind == Kind::kNull) return true;
      if (kind != Kind::kString || s->size() > kMaxSplitBytes)
        return Fail(fmt::format("\"split\" must be a string of at most {} bytes", kMaxSplitBytes)),
               true;
      point.split = *s;
    } else if (key_ == "unit") {
      if (kind == Kind::kNull) return true;
      if (kind != Kind::kString || s->size() > kMaxUnitBytes)
        return Fail(fmt::format("\"unit\" must be a string of at most {} bytes", kMaxUnitBytes)),
               true;
      point.unit = *s;
    } else if (key_ == "attempt") {
      if (kind == Kind::kInt && i >= 0 && i <= INT32_MAX)
        point.attempt = static_cast<int>(i);
      else if (kind == Kind::kUnsigned && u <= INT32_MAX)
        point.attempt = static_cast<int>(u);
    } else if (key_ == "tags") {
      if (kind != Kind::kNull) Fail("\"tags\" must be an object");
    }
    return true;
  }
  bool Tag(Kind kind, int64_t i, uint64_t u, double d, const std::string* s) {
    if (point.tags.size() >= kMaxTags)
      return Fail(fmt::format("\"tags\" has more than {} entries", kMaxTags)), true;
    if (tag_key_.size() > kMaxTagKeyBytes)
      return Fail(fmt::format("a tag name is longer than {} bytes", kMaxTagKeyBytes)), true;
    std::string text;
    switch (kind) {
      case Kind::kString:
        text = *s;
        break;
      case Kind::kBool:
        text = *s;
        break;
      case Kind::kInt:
        text = std::to_string(i);
        break;
      case Kind::kUnsigned:
        text = std::to_string(u);
        break;
      case Kind::kFloat:
        text = *s;
        break;  // as written
      case Kind::kNull:
        return Fail("\"tags\" values must be strings, numbers or booleans"), true;
    }
    if (text.size() > kMaxTagValueBytes)
      return Fail(fmt::format("a tag value is longer than {} bytes", kMaxTagValueBytes)), true;
    point.tags[tag_key_] = std::move(text);
    (void)d;
    return true;
  }

  int depth_ = 0;
  std::string key_, tag_key_;
  bool in_tags_ = false;
  bool syntax_error_ = false;
};

// Python's json.dumps writes float('nan') as a bare NaN (and Infinity, -Infinity), which is not
// JSON. Quotes those tokens where they stand outside strings; false when there were none.
bool QuoteBareNonFinite(std::string_view line, std::string* out) {
  bool changed = false, in_string = false;
  out->clear();
  out->reserve(line.size() + 8);
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (in_string) {
      out->push_back(c);
      if (c == '\\' && i + 1 < line.size())
        out->push_back(line[++i]);
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out->push_back(c);
      continue;
    }
    for (std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (line.substr(i, word.size()) == word) {
        out->push_back('"');
        out->append(word);
        out->push_back('"');
        i += word.size() - 1;
        changed = true;
        goto next;
      }
    }
    out->push_back(c);
  next:;
  }
  return changed;
}

bool RunSax(std::string_view text, PointSax* sax) {
  try {
    return json::sax_parse(text.begin(), text.end(), sax);
  } catch (const std::exception&) {
    return false;  // the SAX parser reports through parse_error; this is belt and braces
  }
}

}  // namespace

Result<MetricPoint> ParseMetricLine(std::string_view line, const MetricLimits& limits) {
  if (line.size() > limits.max_line_bytes)
    return InvalidArgument(fmt::format("line longer than {} bytes", limits.max_line_bytes));
  PointSax sax;
  if (!RunSax(line, &sax)) {
    std::string quoted;
    bool ok = false;
    if (QuoteBareNonFinite(line, &quoted)) {
      sax = PointSax();
      ok = RunSax(quoted, &sax);
    }
    if (!ok) return InvalidArgument("not valid JSON");
  }
  if (!sax.error.empty()) return InvalidArgument(sax.error);
  if (!sax.has_name) return InvalidArgument("missing \"name\"");
  if (!sax.has_step) return InvalidArgument("missing \"step\"");
  if (!sax.has_value) return InvalidArgument("missing \"value\"");
  return std::move(sax.point);
}

Result<HistoryLine> ParseHistoryLine(std::string_view line, const MetricLimits& limits) {
  if (line.size() > limits.max_line_bytes)
    return InvalidArgument(fmt::format("line longer than {} bytes", limits.max_line_bytes));
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    std::string quoted;
    if (QuoteBareNonFinite(line, &quoted)) j = json::parse(quoted, nullptr, false);
    if (j.is_discarded()) return InvalidArgument("not valid JSON");
  }
  if (!j.is_object()) return InvalidArgument("not a JSON object");
  auto step = j.find("_step");
  if (step == j.end()) return InvalidArgument("missing \"_step\"");
  int64_t at = 0;
  if (step->is_number_unsigned() && step->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
    at = static_cast<int64_t>(step->get<uint64_t>());
  } else if (step->is_number_integer() && step->get<int64_t>() >= 0) {
    at = step->get<int64_t>();
  } else if (step->is_number_float() && step->get<double>() >= 0 && step->get<double>() < 9.2e18 &&
             std::floor(step->get<double>()) == step->get<double>()) {
    at = static_cast<int64_t>(step->get<double>());  // 100.0: an integer written as a float
  } else {
    return InvalidArgument("\"_step\" must be an integer >= 0");
  }
  HistoryLine out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (!key.empty() && key[0] == '_') continue;  // the format's own: _step, _timestamp, _runtime
    double value = 0;
    const json& v = it.value();
    bool numeric = false;
    if (v.is_number()) {
      value = v.get<double>();
      numeric = true;
    } else if (v.is_string()) {
      numeric = internal::ParseNonFiniteWord(v.get_ref<const std::string&>(), &value);
    }
    if (!numeric || key.empty() || key.size() > kMaxNameBytes) {
      ++out.ignored;
      continue;
    }
    MetricPoint p;
    p.name = key;
    p.step = at;
    p.value = value;
    out.points.push_back(std::move(p));
  }
  return out;
}

std::string MetricPointJson(const MetricPoint& p) {
  std::string out;
  out.reserve(64 + p.name.size());
  out += "{\"attempt\":";
  out += std::to_string(p.attempt);
  out += ",\"name\":";
  internal::AppendJsonString(&out, p.name);
  if (!p.split.empty()) {
    out += ",\"split\":";
    internal::AppendJsonString(&out, p.split);
  }
  out += ",\"step\":";
  out += std::to_string(p.step);
  out += ",\"value\":";
  internal::AppendJsonDouble(&out, p.value);
  if (!p.unit.empty()) {
    out += ",\"unit\":";
    internal::AppendJsonString(&out, p.unit);
  }
  if (!p.tags.empty()) {
    out += ",\"tags\":{";
    bool first = true;
    for (const auto& [k, v] : p.tags) {
      if (!first) out += ',';
      first = false;
      internal::AppendJsonString(&out, k);
      out += ':';
      internal::AppendJsonString(&out, v);
    }
    out += '}';
  }
  out += '}';
  return out;
}

namespace {

using internal::PointSink;

// Parses the complete lines of `data` (the file's bytes from cursor->offset on), handing each
// point to `sink` rather than collecting them: a vector of 100,000 points is ~20 MB of page faults.
void ParseLines(std::string_view data, MetricsCursor* cursor, const MetricLimits& limits,
                MetricsChunk* chunk, const PointSink& sink) {
  auto malformed = [&](int64_t line, std::string error) {
    ++chunk->malformed_count;
    if (chunk->malformed.size() < kMalformedKeptPerChunk)
      chunk->malformed.push_back({line, std::move(error)});
  };
  size_t pos = 0;
  while (pos < data.size()) {
    const void* nl = std::memchr(data.data() + pos, '\n', data.size() - pos);
    if (nl == nullptr) {
      size_t rest = data.size() - pos;
      if (!cursor->discarding && rest > limits.max_line_bytes) {
        // It cannot become valid: count it now and skip its bytes as they come.
        malformed(cursor->line + 1,
                  fmt::format("line longer than {} bytes", limits.max_line_bytes));
        cursor->discarding = true;
      }
      if (cursor->discarding) cursor->offset += static_cast<int64_t>(rest);
      return;
    }
    size_t end = static_cast<const char*>(nl) - data.data();
    std::string_view line = data.substr(pos, end - pos);
    cursor->offset += static_cast<int64_t>(end + 1 - pos);
    pos = end + 1;
    ++cursor->line;
    ++chunk->lines;
    if (cursor->discarding) {
      cursor->discarding = false;  // the end of an over-long line, counted when it began
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    if (limits.format == MetricsFormat::kHistory) {
      auto row = ParseHistoryLine(line, limits);
      if (!row.ok()) {
        malformed(cursor->line, row.status().message());
        continue;
      }
      chunk->ignored_values += row->ignored;
      for (MetricPoint& p : row->points) {
        ++chunk->point_count;
        sink(std::move(p));
      }
      continue;
    }
    auto point = ParseMetricLine(line, limits);
    if (!point.ok()) {
      malformed(cursor->line, point.status().message());
      continue;
    }
    ++chunk->point_count;
    sink(std::move(*point));
  }
}

}  // namespace

// What was appended to `path` since the cursor, in blocks of at most 1 MiB (so memory stays
// small whatever the file's size), up to limits.max_read_bytes.
Result<MetricsChunk> internal::ReadPointLines(const std::string& path, MetricsCursor* cursor,
                                              const MetricLimits& limits, const PointSink& sink) {
  MetricsChunk chunk;
  // The run writes this file and could put a link (to a file outside its directory) or a FIFO
  // (which would block the controller's loop in open()) in its place: neither is read.
  auto opened = internal::OpenRunFile(path);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) return chunk;
    return Status(opened.status().code(), "metrics file: " + opened.status().message());
  }
  int fd = *opened;
  internal::ClosesFd closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("cannot stat metrics file " + path, errno);
  bool same_file = cursor->ino == 0 || (cursor->dev == static_cast<uint64_t>(st.st_dev) &&
                                        cursor->ino == static_cast<uint64_t>(st.st_ino));
  // The same file, grown past the offset: still the bytes read, or rewritten since?
  bool rewritten = false;
  if (same_file && st.st_size >= cursor->offset && !cursor->tail.empty() &&
      cursor->offset >= static_cast<int64_t>(cursor->tail.size())) {
    std::string now(cursor->tail.size(), '\0');
    ssize_t n =
        ::pread(fd, now.data(), now.size(), cursor->offset - static_cast<int64_t>(now.size()));
    rewritten = n != static_cast<ssize_t>(now.size()) || now != cursor->tail;
  }
  if (!same_file || st.st_size < cursor->offset || rewritten) {
    // Replaced, or truncated (a job that opens its file with "w" again): read it from the start.
    chunk.restarted = cursor->ino != 0 || cursor->offset > 0;
    *cursor = MetricsCursor{};
  }
  cursor->dev = st.st_dev;
  cursor->ino = st.st_ino;
  const int64_t window =
      static_cast<int64_t>(std::min<size_t>(limits.max_read_bytes, size_t{INT64_MAX}));
  int64_t end = cursor->offset + std::min<int64_t>(st.st_size - cursor->offset, window);
  constexpr size_t kBlock = 1u << 20;
  std::string buf;
  // Bytes from `cursor->offset` on are in buf; a partial last line stays there for the next block.
  int64_t read_at = cursor->offset;
  while (read_at < end) {
    size_t have = buf.size();
    size_t want = static_cast<size_t>(std::min<int64_t>(end - read_at, kBlock));
    buf.resize(have + want);
    ssize_t n = ::pread(fd, buf.data() + have, want, read_at);
    if (n < 0) {
      if (errno == EINTR) {
        buf.resize(have);
        continue;
      }
      return IoError("cannot read metrics file " + path, errno);
    }
    buf.resize(have + static_cast<size_t>(n));
    if (n == 0) break;
    read_at += n;
    int64_t before = cursor->offset;
    chunk.peak_buffer_bytes = std::max(chunk.peak_buffer_bytes, buf.capacity());
    ParseLines(buf, cursor, limits, &chunk, sink);
    buf.erase(0, static_cast<size_t>(cursor->offset - before));
  }
  chunk.more = end < st.st_size;
  if (cursor->offset > 0) {
    size_t keep = static_cast<size_t>(std::min<int64_t>(cursor->offset, 32));
    std::string tail(keep, '\0');
    ssize_t n = ::pread(fd, tail.data(), keep, cursor->offset - static_cast<int64_t>(keep));
    cursor->tail = n == static_cast<ssize_t>(keep) ? std::move(tail) : std::string();
  } else {
    cursor->tail.clear();
  }
  return chunk;
}

MetricsChunk ParseMetricsChunk(std::string_view data, MetricsCursor* cursor,
                               const MetricLimits& limits) {
  MetricsChunk chunk;
  ParseLines(data, cursor, limits, &chunk,
             [&](MetricPoint&& p) { chunk.points.push_back(std::move(p)); });
  return chunk;
}

Result<MetricsChunk> ReadMetrics(const std::string& path, MetricsCursor* cursor,
                                 const MetricLimits& limits) {
  std::vector<MetricPoint> points;
  auto chunk = internal::ReadPointLines(path, cursor, limits,
                                        [&](MetricPoint&& p) { points.push_back(std::move(p)); });
  if (chunk.ok()) chunk->points = std::move(points);
  return chunk;
}

// ---------------------------------------------------------------------------------------------
// History

MetricHistory::MetricHistory(MetricLimits limits) : limits_(limits) {}

bool MetricHistory::Add(const MetricPoint& p) {
  auto key = std::make_pair(p.name, p.split);
  auto it = series_.find(key);
  if (it == series_.end()) {
    if (series_.size() >= limits_.max_series) {
      ++dropped_;
      return false;
    }
    it = series_.emplace(std::move(key), SeriesData{}).first;
  }
  SeriesData& s = it->second;
  auto [pit, inserted] = s.points.try_emplace(p.step);
  if (!inserted) {
    if (pit->second.attempt > p.attempt) return false;  // a retried attempt's point stays
    ++replaced_;
  } else if (points_ >= limits_.max_points) {
    s.points.erase(pit);
    ++dropped_;
    return false;
  } else {
    ++points_;
  }
  pit->second.value = p.value;
  pit->second.attempt = p.attempt;
  pit->second.tags = p.tags;
  if (!p.unit.empty()) s.unit = p.unit;
  return true;
}

std::vector<std::pair<std::string, std::string>> MetricHistory::SeriesKeys() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, s] : series_) out.push_back(key);
  return out;
}

std::vector<MetricPoint> MetricHistory::Series(const std::string& name,
                                               const std::string& split) const {
  std::vector<MetricPoint> out;
  auto it = series_.find({name, split});
  if (it == series_.end()) return out;
  out.reserve(it->second.points.size());
  for (const auto& [step, e] : it->second.points)
    out.push_back({name, split, step, e.value, it->second.unit, e.tags, e.attempt});
  return out;
}

std::vector<MetricSummary> MetricHistory::Summaries() const {
  std::vector<MetricSummary> out;
  for (const auto& [key, s] : series_) {
    if (s.points.empty()) continue;
    MetricSummary m;
    m.name = key.first;
    m.split = key.second;
    m.unit = s.unit;
    m.count = static_cast<int64_t>(s.points.size());
    m.first_step = s.points.begin()->first;
    m.last_step = s.points.rbegin()->first;
    m.latest = s.points.rbegin()->second.value;
    m.latest_attempt = s.points.rbegin()->second.attempt;
    for (const auto& [step, e] : s.points) {
      if (std::isnan(e.value)) {
        ++m.nan_count;
      } else if (std::isinf(e.value)) {
        ++m.inf_count;
      } else {
        if (!m.min || e.value < *m.min) m.min = e.value;
        if (!m.max || e.value > *m.max) m.max = e.value;
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string MetricHistory::ToJsonl() const {
  std::string out;
  out.reserve(points_ * 64);
  MetricPoint p;
  for (const auto& [key, s] : series_) {
    p.name = key.first;
    p.split = key.second;
    p.unit = s.unit;
    for (const auto& [step, e] : s.points) {
      p.step = step;
      p.value = e.value;
      p.attempt = e.attempt;
      p.tags = e.tags;
      out += MetricPointJson(p);
      out += '\n';
    }
  }
  return out;
}

void MetricHistory::AddJsonl(std::string_view text, int64_t* malformed) {
  MetricsCursor cursor;
  MetricLimits limits = limits_;
  limits.max_read_bytes = SIZE_MAX;
  // A file tau wrote ends in '\n'; a missing one (a crash mid-append) must not hide the last line.
  std::string owned;
  if (!text.empty() && text.back() != '\n') {
    owned.assign(text);
    owned.push_back('\n');
    text = owned;
  }
  MetricsChunk chunk;
  ParseLines(text, &cursor, limits, &chunk, [&](MetricPoint&& p) { Add(p); });
  if (malformed) *malformed += chunk.malformed_count;
}

Result<MetricHistory> LoadMetricHistory(const std::string& path, int64_t* malformed,
                                        const std::string& only_name) {
  MetricHistory history;
  MetricsCursor cursor;
  MetricLimits limits;
  limits.max_read_bytes = SIZE_MAX;
  auto chunk = internal::ReadPointLines(path, &cursor, limits, [&](MetricPoint&& p) {
    if (only_name.empty() || p.name == only_name) history.Add(p);
  });
  if (!chunk.ok()) return chunk.status();
  if (malformed) *malformed += chunk->malformed_count;
  return history;
}

// ---------------------------------------------------------------------------------------------
// Collector

// ---------------------------------------------------------------------------------------------
// Collector

std::string MaskSecrets(std::string_view text, const std::vector<std::string>& secrets) {
  if (secrets.empty()) return std::string(text);
  return Redactor(secrets).Feed(text, /*flush=*/true);
}

void MaskArtifactPaths(std::vector<Artifact>* artifacts, const std::vector<std::string>& secrets) {
  if (secrets.empty()) return;
  for (Artifact& a : *artifacts) a.path = MaskSecrets(a.path, secrets);
}

namespace {

// A series: name, split and tags, each length-prefixed so that no two series share a key.
std::string SeriesKey(const MetricPoint& p) {
  std::string key;
  auto add = [&](const std::string& s) {
    key += std::to_string(s.size());
    key += ':';
    key += s;
  };
  add(p.name);
  add(p.split);
  for (const auto& [k, v] : p.tags) {
    add(k);
    add(v);
  }
  return key;
}

// tau's own lines are never longer than this (a job's line is at most 64 KiB by default; tau's
// form of it adds its attempt and quotes).
constexpr size_t kMaxOwnLineBytes = 1u << 20;

// A crash in the middle of an append leaves a partial last line: cut it, so the next append does
// not glue a good line to it (its point is read again: the cursor was not saved yet). Reads the
// file's tail only.
Status CutPartialLastLine(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::Ok() : IoError("cannot open " + path, errno);
  internal::ClosesFd closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + path, errno);
  int64_t end = st.st_size;
  std::string block(64 * 1024, '\0');
  while (end > 0) {
    int64_t from = std::max<int64_t>(0, end - static_cast<int64_t>(block.size()));
    ssize_t n = ::pread(fd, block.data(), static_cast<size_t>(end - from), from);
    if (n < 0) return IoError("cannot read " + path, errno);
    std::string_view got(block.data(), static_cast<size_t>(n));
    size_t nl = got.rfind('\n');
    if (nl != std::string_view::npos) {
      end = from + static_cast<int64_t>(nl) + 1;
      break;
    }
    end = from;
  }
  if (end != st.st_size && ::ftruncate(fd, static_cast<off_t>(end)) != 0)
    return IoError("cannot truncate " + path, errno);
  return Status::Ok();
}

Status ParseState(const std::string& dir, std::map<std::string, MetricsCursor>* cursors,
                  MetricsStats* stats) {
  auto text = ReadFile(dir + "/metrics-state.json");
  if (!text.ok())
    return text.status().code() == StatusCode::kNotFound ? Status::Ok() : text.status();
  json state = json::parse(*text, nullptr, false);
  if (!state.is_object()) return InvalidArgument(dir + "/metrics-state.json is corrupt");
  try {
    for (const json& jc : state.value("cursors", json::array())) {
      MetricsCursor cur;
      cur.offset = jc.at("offset").get<int64_t>();
      cur.line = jc.at("line").get<int64_t>();
      cur.discarding = jc.value("discarding", false);
      cur.dev = jc.value("dev", uint64_t{0});
      cur.ino = jc.value("ino", uint64_t{0});
      if (auto tail = Base64Decode(jc.value("tail", "")); tail.ok()) cur.tail = std::move(*tail);
      if (cursors) (*cursors)[jc.at("source").get<std::string>()] = cur;
    }
    const json& js = state.value("stats", json::object());
    stats->lines = js.value("lines", int64_t{0});
    stats->points = js.value("points", int64_t{0});
    stats->malformed = js.value("malformed", int64_t{0});
    stats->ignored_values = js.value("ignored_values", int64_t{0});
    stats->restarts = js.value("restarts", int64_t{0});
    stats->refused_points = js.value("refused_points", int64_t{0});
    stats->refused_series = js.value("refused_series", int64_t{0});
    for (const json& jm : js.value("first_malformed", json::array()))
      stats->first_malformed.push_back(
          {jm.at("source").get<std::string>(),
           {jm.at("line").get<int64_t>(), jm.at("error").get<std::string>()}});
  } catch (const std::exception& e) {
    return InvalidArgument(dir + "/metrics-state.json is corrupt: " + e.what());
  }
  return Status::Ok();
}

}  // namespace

Result<MetricsStats> LoadMetricsStats(const std::string& evidence_dir) {
  MetricsStats stats;
  TAU_RETURN_IF_ERROR(ParseState(evidence_dir, nullptr, &stats));
  return stats;
}

MetricsCollector::MetricsCollector(std::string dir, CollectorOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {}

Result<std::unique_ptr<MetricsCollector>> MetricsCollector::Open(const std::string& evidence_dir,
                                                                 CollectorOptions options) {
  std::unique_ptr<MetricsCollector> c(new MetricsCollector(evidence_dir, std::move(options)));
  std::string points_path = layout::MetricsFile(evidence_dir);
  TAU_RETURN_IF_ERROR(CutPartialLastLine(points_path));
  // What the caps count, from the points kept so far, read in blocks (never the file at once).
  MetricsCursor cursor;
  MetricLimits limits;
  limits.max_read_bytes = SIZE_MAX;
  limits.max_line_bytes = kMaxOwnLineBytes;
  auto kept = internal::ReadPointLines(points_path, &cursor, limits, [&](MetricPoint&& p) {
    c->series_.insert(SeriesKey(p));
    ++c->kept_;
  });
  if (!kept.ok()) return kept.status();
  TAU_RETURN_IF_ERROR(ParseState(evidence_dir, &c->cursors_, &c->stats_));
  return c;
}

Status MetricsCollector::MakeDir() {
  if (dir_made_) return Status::Ok();
  TAU_RETURN_IF_ERROR(MakeDirs(dir_));
  dir_made_ = true;
  return Status::Ok();
}

Status MetricsCollector::SaveState() {
  TAU_RETURN_IF_ERROR(MakeDir());
  json cursors = json::array();
  for (const auto& [source, cur] : cursors_)
    cursors.push_back({{"source", source},
                       {"offset", cur.offset},
                       {"line", cur.line},
                       {"discarding", cur.discarding},
                       {"dev", cur.dev},
                       {"ino", cur.ino},
                       {"tail", Base64Encode(cur.tail)}});
  json first = json::array();
  for (const auto& [source, m] : stats_.first_malformed)
    first.push_back({{"source", source}, {"line", m.line}, {"error", m.error}});
  json state = {{"format", 1},
                {"cursors", cursors},
                {"stats",
                 {{"lines", stats_.lines},
                  {"points", stats_.points},
                  {"malformed", stats_.malformed},
                  {"ignored_values", stats_.ignored_values},
                  {"restarts", stats_.restarts},
                  {"refused_points", stats_.refused_points},
                  {"refused_series", stats_.refused_series},
                  {"first_malformed", first}}}};
  return WriteFileAtomic(dir_ + "/metrics-state.json",
                         state.dump(-1, ' ', false, json::error_handler_t::replace), 0644,
                         Durability::kProcessCrash);
}

bool MetricsCollector::Admit(MetricPoint* p) {
  const std::vector<std::string>& secrets = options_.secrets;
  if (!secrets.empty()) {
    // Before the key is made: a series named after a secret is kept (and counted) masked.
    p->name = MaskSecrets(p->name, secrets);
    p->split = MaskSecrets(p->split, secrets);
    p->unit = MaskSecrets(p->unit, secrets);
    std::map<std::string, std::string> tags;
    for (const auto& [k, v] : p->tags) tags[MaskSecrets(k, secrets)] = MaskSecrets(v, secrets);
    p->tags = std::move(tags);
  }
  if (kept_ >= options_.max_points) {
    ++stats_.refused_points;
    return false;
  }
  std::string key = SeriesKey(*p);
  if (!series_.count(key)) {
    if (static_cast<int64_t>(series_.size()) >= options_.max_series) {
      ++stats_.refused_series;
      return false;
    }
    series_.insert(std::move(key));
  }
  ++kept_;
  return true;
}

Result<MetricsChunk> MetricsCollector::Poll(const std::string& source, int attempt,
                                            MetricsFormat format) {
  MetricsCursor& cursor = cursors_[source];
  const MetricsCursor before = cursor;
  const MetricsStats stats_before = stats_;
  const int64_t kept_before = kept_;
  std::vector<std::string> series_added;
  // Points go to the evidence file as they are parsed; the file is written in blocks. Append
  // first, save the cursor after: a crash between the two reads the lines again and compaction
  // deduplicates them, where the other order would lose them.
  std::string path = layout::MetricsFile(dir_);
  int fd = -1;
  struct Closer {
    int* fd;
    ~Closer() {
      if (*fd >= 0) ::close(*fd);
    }
  } closer{&fd};
  std::string pending;
  Status write_error;
  auto flush = [&]() -> Status {
    if (pending.empty()) return Status::Ok();
    if (fd < 0) {
      TAU_RETURN_IF_ERROR(MakeDir());
      fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) return IoError("cannot open " + path, errno);
    }
    size_t off = 0;
    while (off < pending.size()) {
      ssize_t n = ::write(fd, pending.data() + off, pending.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot append to " + path, errno);
      }
      off += static_cast<size_t>(n);
    }
    pending.clear();
    return Status::Ok();
  };
  MetricLimits limits = options_.limits;
  limits.format = format;
  // A window smaller than a line would never hold it whole.
  limits.max_read_bytes = std::max(options_.max_poll_bytes, limits.max_line_bytes + 1);
  auto chunk = internal::ReadPointLines(source, &cursor, limits, [&](MetricPoint&& p) {
    p.attempt = attempt;
    size_t series = series_.size();
    if (!Admit(&p)) return;
    if (series_.size() != series) series_added.push_back(SeriesKey(p));
    pending += MetricPointJson(p);
    pending += '\n';
    peak_buffer_ = std::max(peak_buffer_, pending.capacity());
    if (pending.size() >= (1u << 20) && write_error.ok()) write_error = flush();
  });
  if (write_error.ok() && chunk.ok()) write_error = flush();
  if (!chunk.ok() || !write_error.ok()) {
    // Read these lines again next time (what was appended already is deduplicated later).
    cursor = before;
    stats_ = stats_before;
    kept_ = kept_before;
    for (const std::string& key : series_added) series_.erase(key);
    return chunk.ok() ? Result<MetricsChunk>(write_error) : chunk;
  }
  peak_buffer_ = std::max(peak_buffer_, chunk->peak_buffer_bytes);
  if (!chunk->restarted && cursor.offset == before.offset && cursor.line == before.line &&
      cursor.dev == before.dev && cursor.ino == before.ino &&
      cursor.discarding == before.discarding)
    return chunk;  // nothing new
  stats_.lines += chunk->lines;
  stats_.points += chunk->point_count;
  stats_.malformed += chunk->malformed_count;
  stats_.ignored_values += chunk->ignored_values;
  if (chunk->restarted) ++stats_.restarts;
  for (const MalformedLine& m : chunk->malformed)
    if (stats_.first_malformed.size() < kMalformedKeptPerRun)
      stats_.first_malformed.push_back({source, m});
  TAU_RETURN_IF_ERROR(SaveState());
  return chunk;
}

Result<CompactReport> MetricsCollector::Compact() {
  const std::string path = layout::MetricsFile(dir_);
  if (kept_ == 0 && !PathExists(path)) return CompactReport{};
  TAU_RETURN_IF_ERROR(MakeDir());
  return CompactMetricsFile(path, path);
}

MetricsInfo MetricsInfoFrom(const MetricHistory& history, const MetricsStats& stats) {
  MetricsInfo info;
  info.stats = stats;
  info.distinct_points = static_cast<int64_t>(history.size());
  info.replaced = history.replaced();
  info.dropped = history.dropped() + stats.refused_points + stats.refused_series;
  info.series = history.Summaries();
  return info;
}

MetricsInfo MetricsInfoFrom(const CompactReport& compacted, const MetricsStats& stats) {
  MetricsInfo info;
  info.stats = stats;
  info.distinct_points = compacted.distinct;
  info.replaced = compacted.replaced;
  info.dropped = stats.refused_points + stats.refused_series;
  info.series = compacted.series;
  return info;
}

}  // namespace tau::evidence
