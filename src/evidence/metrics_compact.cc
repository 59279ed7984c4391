// Compaction of a run's metric points in bounded memory: an external merge sort. The points are
// read in file order into a buffer of at most CompactOptions::sort_buffer_bytes, which is sorted
// (stably, by name, split, step and attempt) and spilled to a temporary file when full; the sorted
// runs are then merged, keeping the last point of each (name, split, step). A run's points are
// spilled in file order, so among equal keys the merge takes runs in order, and "last" is the
// latest attempt, then the last line, as MetricHistory::Add decides. Summaries are computed on the
// way out, a series at a time.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <queue>
#include <tuple>

#include <fmt/format.h>

#include "common/files.h"
#include "common/json_text.h"
#include "common/layout.h"
#include "common/strings.h"
#include "evidence/evidence.h"
#include "evidence/internal.h"

namespace tau::evidence {
namespace {

constexpr size_t kOwnLineBytes = 1u << 20;  // tau's own lines are far shorter
constexpr size_t kIoBlock = 1u << 20;

bool KeyLess(const MetricPoint& a, const MetricPoint& b) {
  return std::tie(a.name, a.split, a.step, a.attempt) <
         std::tie(b.name, b.split, b.step, b.attempt);
}

bool SameKey(const MetricPoint& a, const MetricPoint& b) {
  return a.step == b.step && a.name == b.name && a.split == b.split;
}

// What a point costs held in memory, roughly: the struct, its strings, a map node per tag.
size_t PointBytes(const MetricPoint& p) {
  size_t n = sizeof(MetricPoint) + p.name.size() + p.split.size() + p.unit.size();
  for (const auto& [k, v] : p.tags) n += 96 + k.size() + v.size();
  return n;
}

// Appends to a file through a buffer of about kIoBlock.
class BufferedWriter {
 public:
  ~BufferedWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return IoError("cannot create " + path, errno);
    return Status::Ok();
  }
  Status Line(const std::string& text) {
    buf_ += text;
    buf_ += '\n';
    return buf_.size() >= kIoBlock ? Flush() : Status::Ok();
  }
  Status Close(bool sync) {
    TAU_RETURN_IF_ERROR(Flush());
    if (sync && ::fsync(fd_) != 0) return IoError("cannot fsync " + path_, errno);
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return IoError("cannot close " + path_, errno);
    return Status::Ok();
  }

 private:
  Status Flush() {
    size_t off = 0;
    while (off < buf_.size()) {
      ssize_t n = ::write(fd_, buf_.data() + off, buf_.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot write " + path_, errno);
      }
      off += static_cast<size_t>(n);
    }
    buf_.clear();
    return Status::Ok();
  }
  std::string path_;
  int fd_ = -1;
  std::string buf_;
};

// The merge's output: takes points in sorted order, keeps the last of each key, writes it with
// its series' unit and summarises each series.
class Merger {
 public:
  Merger(BufferedWriter* out,
         const std::map<std::pair<std::string, std::string>, std::string>* units,
         CompactReport* report)
      : out_(out), units_(units), report_(report) {}
  Status Add(MetricPoint&& p) {
    if (held_ && SameKey(*held_, p)) {
      ++report_->replaced;
    } else if (held_) {
      TAU_RETURN_IF_ERROR(Emit(std::move(*held_)));
    }
    held_ = std::move(p);
    return Status::Ok();
  }
  Status Finish() {
    if (held_) TAU_RETURN_IF_ERROR(Emit(std::move(*held_)));
    held_.reset();
    if (open_) report_->series.push_back(std::move(current_));
    open_ = false;
    return Status::Ok();
  }

 private:
  Status Emit(MetricPoint p) {
    if (!open_ || current_.name != p.name || current_.split != p.split) {
      if (open_) report_->series.push_back(std::move(current_));
      current_ = MetricSummary{};
      current_.name = p.name;
      current_.split = p.split;
      auto u = units_->find({p.name, p.split});
      current_.unit = u == units_->end() ? "" : u->second;
      current_.first_step = p.step;
      open_ = true;
    }
    MetricSummary& m = current_;
    ++m.count;
    m.last_step = p.step;
    m.latest = p.value;
    m.latest_attempt = p.attempt;
    if (std::isnan(p.value)) {
      ++m.nan_count;
    } else if (std::isinf(p.value)) {
      ++m.inf_count;
    } else {
      if (!m.min || p.value < *m.min) m.min = p.value;
      if (!m.max || p.value > *m.max) m.max = p.value;
    }
    ++report_->distinct;
    if (out_ == nullptr) return Status::Ok();
    p.unit = m.unit;
    return out_->Line(MetricPointJson(p));
  }

  BufferedWriter* out_;
  const std::map<std::pair<std::string, std::string>, std::string>* units_;
  CompactReport* report_;
  std::optional<MetricPoint> held_;
  MetricSummary current_;
  bool open_ = false;
};

// Removes the temporary files it names when it goes.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string& p : paths) ::unlink(p.c_str());
  }
};

std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

MetricPointReader::MetricPointReader(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

MetricPointReader::~MetricPointReader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<MetricPointReader>> MetricPointReader::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open " + path, errno);
  return std::make_unique<MetricPointReader>(fd, path);
}

Result<bool> MetricPointReader::Next(MetricPoint* point) {
  MetricLimits limits;
  limits.max_line_bytes = kOwnLineBytes;
  while (true) {
    size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      std::string_view line(buf_.data() + pos_, nl - pos_);
      pos_ = nl + 1;
      auto p = ParseMetricLine(line, limits);
      if (!p.ok()) return Internal(path_ + ": " + p.status().message());
      *point = std::move(*p);
      return true;
    }
    buf_.erase(0, pos_);
    pos_ = 0;
    if (buf_.size() > kOwnLineBytes) return Internal(path_ + ": a line longer than tau writes");
    size_t have = buf_.size();
    buf_.resize(have + 64 * 1024);
    ssize_t n = ::read(fd_, buf_.data() + have, 64 * 1024);
    if (n < 0 && errno == EINTR) {
      buf_.resize(have);
      continue;
    }
    if (n < 0) return IoError("cannot read " + path_, errno);
    buf_.resize(have + static_cast<size_t>(n));
    if (n == 0) return false;
  }
}

Result<CompactReport> CompactMetricsFile(const std::string& in, const std::string& out,
                                         const CompactOptions& options) {
  CompactReport report;
  if (!PathExists(in)) return report;
  const std::string tmp_base =
      fmt::format("{}/.metrics-sort-{}", DirOf(out.empty() ? in : out), RandomHex(8));
  TempFiles temps;
  std::vector<MetricPoint> buffer;
  size_t buffer_bytes = 0;
  std::map<std::pair<std::string, std::string>, std::string> units;  // the latest non-empty
  Status spill_error;
  auto spill = [&]() -> Status {
    std::stable_sort(buffer.begin(), buffer.end(), KeyLess);
    std::string path = fmt::format("{}-{}", tmp_base, temps.paths.size());
    temps.paths.push_back(path);
    BufferedWriter w;
    TAU_RETURN_IF_ERROR(w.Open(path));
    for (const MetricPoint& p : buffer) TAU_RETURN_IF_ERROR(w.Line(MetricPointJson(p)));
    TAU_RETURN_IF_ERROR(w.Close(false));
    buffer.clear();
    buffer_bytes = 0;
    return Status::Ok();
  };

  MetricsCursor cursor;
  MetricLimits limits;
  limits.max_read_bytes = SIZE_MAX;
  limits.max_line_bytes = kOwnLineBytes;
  auto read = internal::ReadPointLines(in, &cursor, limits, [&](MetricPoint&& p) {
    if (!spill_error.ok()) return;
    ++report.points_in;
    if (!p.unit.empty()) units[{p.name, p.split}] = p.unit;
    buffer_bytes += PointBytes(p);
    buffer.push_back(std::move(p));
    report.peak_sort_bytes = std::max(report.peak_sort_bytes, buffer_bytes);
    if (buffer_bytes >= options.sort_buffer_bytes) spill_error = spill();
  });
  if (!read.ok()) return read.status();
  TAU_RETURN_IF_ERROR(spill_error);
  report.malformed = read->malformed_count;

  BufferedWriter writer;
  std::string tmp_out;
  if (!out.empty()) {
    tmp_out = tmp_base + "-out";
    temps.paths.push_back(tmp_out);
    TAU_RETURN_IF_ERROR(writer.Open(tmp_out));
  }
  Merger merger(out.empty() ? nullptr : &writer, &units, &report);
  if (temps.paths.size() <= (out.empty() ? 0u : 1u)) {
    // It all fit: sorted in memory.
    std::stable_sort(buffer.begin(), buffer.end(), KeyLess);
    for (MetricPoint& p : buffer) TAU_RETURN_IF_ERROR(merger.Add(std::move(p)));
  } else {
    if (!buffer.empty()) TAU_RETURN_IF_ERROR(spill());
    std::vector<std::string> runs;
    for (const std::string& p : temps.paths)
      if (p != tmp_out) runs.push_back(p);
    report.spilled_runs = runs.size();
    std::vector<std::unique_ptr<MetricPointReader>> readers(runs.size());
    std::vector<MetricPoint> heads(runs.size());
    // The smallest head first; among equal keys, the earlier run (earlier in the file).
    auto later = [&](size_t a, size_t b) {
      if (KeyLess(heads[a], heads[b])) return false;
      if (KeyLess(heads[b], heads[a])) return true;
      return a > b;
    };
    std::priority_queue<size_t, std::vector<size_t>, decltype(later)> heap(later);
    for (size_t i = 0; i < runs.size(); ++i) {
      TAU_ASSIGN_OR_RETURN(readers[i], MetricPointReader::Open(runs[i]));
      TAU_ASSIGN_OR_RETURN(bool any, readers[i]->Next(&heads[i]));
      if (any) heap.push(i);
    }
    while (!heap.empty()) {
      size_t i = heap.top();
      heap.pop();
      MetricPoint p = std::move(heads[i]);
      TAU_ASSIGN_OR_RETURN(bool any, readers[i]->Next(&heads[i]));
      if (any) heap.push(i);
      TAU_RETURN_IF_ERROR(merger.Add(std::move(p)));
    }
  }
  TAU_RETURN_IF_ERROR(merger.Finish());
  if (!out.empty()) {
    TAU_RETURN_IF_ERROR(writer.Close(true));
    if (::rename(tmp_out.c_str(), out.c_str()) != 0)
      return IoError("cannot rename " + tmp_out + " to " + out, errno);
  }
  return report;
}

namespace {

constexpr const char* kSummaryFile = "/metrics-summary.json";

// A double as JSON, NaN and the infinities as strings (JSON has no such numbers).
nlohmann::json Real(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}
std::optional<double> RealOf(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  if (!j.is_string()) return std::nullopt;
  const std::string s = j.get<std::string>();
  if (s == "nan") return std::nan("");
  if (s == "inf") return HUGE_VAL;
  if (s == "-inf") return -HUGE_VAL;
  return std::nullopt;
}

// The metrics file's size and modification time: the kept summaries describe it while both hold.
std::optional<std::pair<int64_t, int64_t>> FileStamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(
      static_cast<int64_t>(st.st_size),
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec);
}

}  // namespace

Status SaveMetricSummaries(const std::string& evidence_dir, const CompactReport& compacted) {
  auto stamp = FileStamp(layout::MetricsFile(evidence_dir));
  if (!stamp) return Status::Ok();  // no points, no file: nothing to keep
  nlohmann::json series = nlohmann::json::array();
  for (const MetricSummary& m : compacted.series) {
    nlohmann::json j = {{"name", m.name},
                        {"split", m.split},
                        {"unit", m.unit},
                        {"count", m.count},
                        {"first_step", m.first_step},
                        {"last_step", m.last_step},
                        {"latest", Real(m.latest)},
                        {"latest_attempt", m.latest_attempt},
                        {"nan_count", m.nan_count},
                        {"inf_count", m.inf_count}};
    if (m.min) j["min"] = *m.min;
    if (m.max) j["max"] = *m.max;
    series.push_back(std::move(j));
  }
  nlohmann::json doc = {
      {"metrics_bytes", stamp->first}, {"metrics_mtime_ns", stamp->second}, {"series", series}};
  // Only a shortcut: a lost file is computed again, so it need not survive a machine's crash.
  return WriteFileAtomic(evidence_dir + kSummaryFile, JsonText(doc) + "\n", 0600,
                         Durability::kProcessCrash);
}

std::optional<std::vector<MetricSummary>> LoadMetricSummaries(const std::string& evidence_dir) {
  auto text = ReadFile(evidence_dir + kSummaryFile);
  if (!text.ok()) return std::nullopt;
  auto stamp = FileStamp(layout::MetricsFile(evidence_dir));
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  if (!stamp || !doc.is_object() || !doc.contains("series") || !doc["series"].is_array() ||
      doc.value("metrics_bytes", int64_t{-1}) != stamp->first ||
      doc.value("metrics_mtime_ns", int64_t{-1}) != stamp->second)
    return std::nullopt;
  std::vector<MetricSummary> out;
  for (const nlohmann::json& j : doc["series"]) {
    if (!j.is_object()) return std::nullopt;
    MetricSummary m;
    m.name = j.value("name", "");
    m.split = j.value("split", "");
    m.unit = j.value("unit", "");
    m.count = j.value("count", int64_t{0});
    m.first_step = j.value("first_step", int64_t{0});
    m.last_step = j.value("last_step", int64_t{0});
    auto latest = RealOf(j.value("latest", nlohmann::json()));
    if (!latest) return std::nullopt;
    m.latest = *latest;
    m.latest_attempt = j.value("latest_attempt", 0);
    m.nan_count = j.value("nan_count", int64_t{0});
    m.inf_count = j.value("inf_count", int64_t{0});
    if (j.contains("min")) m.min = RealOf(j["min"]);
    if (j.contains("max")) m.max = RealOf(j["max"]);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace tau::evidence
