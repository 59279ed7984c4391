// The evidence routes of the API (docs/evidence.md):
//   GET /api/v1/runs/NAME/evidence          the record (JSON)
//   GET /api/v1/runs/NAME/evidence/bundle   the bundle (.tar.gz), built on demand
//   GET /api/v1/runs/NAME/metrics           metric history and summaries (?name=, ?split=)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/layout.h"
#include "common/strings.h"
#include "evidence/evidence.h"
#include "http/reply.h"
#include "server/api.h"

namespace tau::server {
namespace {

using nlohmann::json;

// A series read for display holds at most this many points unless the request says (max_points).
constexpr int64_t kDefaultMaxPoints = 2000;
constexpr int64_t kMostMaxPoints = 100'000;

json PointJson(const evidence::MetricPoint& p) {
  json j = {{"step", p.step}, {"attempt", p.attempt}};
  if (std::isfinite(p.value))
    j["value"] = p.value;
  else
    j["value"] = evidence::FormatValue(p.value);
  if (!p.unit.empty()) j["unit"] = p.unit;
  if (!p.tags.empty()) j["tags"] = p.tags;
  return j;
}

json SummaryJson(const evidence::MetricSummary& s) {
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(evidence::FormatValue(v)); };
  return {{"name", s.name},
          {"split", s.split},
          {"unit", s.unit},
          {"count", s.count},
          {"first_step", s.first_step},
          {"last_step", s.last_step},
          {"min", s.min ? num(*s.min) : json(nullptr)},
          {"max", s.max ? num(*s.max) : json(nullptr)},
          {"latest", num(s.latest)},
          {"latest_attempt", s.latest_attempt},
          {"nan_count", s.nan_count},
          {"inf_count", s.inf_count}};
}

// A series read for display: at most `max_points` of it whatever it holds. Its points, in step
// order, fall into max_points / 4 buckets of consecutive points; each bucket keeps its first,
// last, lowest and highest (so spikes, the start and the end survive), in step order.
class Downsampler {
 public:
  Downsampler(int64_t count, int64_t max_points)
      : count_(count), buckets_(count > max_points ? std::max<int64_t>(1, max_points / 4) : 0) {}
  void Add(evidence::MetricPoint p) {
    if (buckets_ == 0) {
      out_.push_back(std::move(p));
      return;
    }
    const int64_t bucket =
        std::min(buckets_ - 1, seen_++ * buckets_ / std::max<int64_t>(1, count_));
    if (bucket != bucket_) Flush();
    bucket_ = bucket;
    if (!first_) first_ = p;
    if (std::isfinite(p.value)) {
      if (!low_ || p.value < low_->value) low_ = p;
      if (!high_ || p.value > high_->value) high_ = p;
    }
    last_ = std::move(p);
  }
  std::vector<evidence::MetricPoint> Finish() {
    Flush();
    return std::move(out_);
  }
  bool downsampled() const { return buckets_ > 0; }

 private:
  void Flush() {
    std::vector<evidence::MetricPoint*> keep;
    for (auto* o : {&first_, &low_, &high_, &last_})
      if (*o && std::none_of(keep.begin(), keep.end(),
                             [&](const evidence::MetricPoint* k) { return k->step == (*o)->step; }))
        keep.push_back(&**o);
    std::sort(keep.begin(), keep.end(),
              [](const evidence::MetricPoint* a, const evidence::MetricPoint* b) {
                return a->step < b->step;
              });
    for (evidence::MetricPoint* k : keep) out_.push_back(*k);
    first_.reset();
    low_.reset();
    high_.reset();
    last_.reset();
  }
  int64_t count_, buckets_, seen_ = 0, bucket_ = -1;
  std::optional<evidence::MetricPoint> first_, low_, high_, last_;
  std::vector<evidence::MetricPoint> out_;
};

// A run's points sorted by (name, split, step) and deduplicated, open for reading a point at a
// time, with every series' summary. Once the run ended its metrics file is that (compacted, with
// its summaries kept); otherwise it is compacted into `scratch` (through a bounded sort), which is
// unlinked as soon as it is open. Memory stays bounded either way.
struct SortedMetrics {
  std::unique_ptr<evidence::MetricPointReader> reader;  // null: the run has no points
  std::vector<evidence::MetricSummary> series;
};
Result<SortedMetrics> OpenSortedMetrics(const std::string& evidence_dir,
                                        const std::string& scratch) {
  SortedMetrics out;
  const std::string path = layout::MetricsFile(evidence_dir);
  if (auto kept = evidence::LoadMetricSummaries(evidence_dir)) {
    TAU_ASSIGN_OR_RETURN(out.reader, evidence::MetricPointReader::Open(path));
    out.series = std::move(*kept);
    return out;
  }
  auto compacted = evidence::CompactMetricsFile(path, scratch);
  if (!compacted.ok()) {
    ::unlink(scratch.c_str());
    return compacted.status();
  }
  out.series = std::move(compacted->series);
  if (!PathExists(scratch)) return out;  // no points
  auto reader = evidence::MetricPointReader::Open(scratch);
  ::unlink(scratch.c_str());
  TAU_RETURN_IF_ERROR(reader.status());
  out.reader = std::move(*reader);
  return out;
}

}  // namespace

void RegisterEvidenceApi(SecureRouter* api, Controller* controller, store::Store* store) {
  api->Route("GET", R"(/api/v1/runs/([a-z0-9-]+)/evidence)", Access::kRunRead,
             [controller](const http::HttpRequest& req, http::HttpResponse& res) {
               auto record = controller->EvidenceRecord(req.matches[1]);
               if (!record.ok()) return http::ReplyError(res, record.status());
               http::Reply(res, 200, *record);
             });

  api->Route("GET", R"(/api/v1/runs/([a-z0-9-]+)/evidence/bundle)", Access::kRunRead,
             [controller](const http::HttpRequest& req, http::HttpResponse& res) {
               std::string name = req.matches[1];
               evidence::RecordInput input;
               evidence::BundleSources sources;
               if (Status s = controller->EvidenceSources(name, &input, &sources); !s.ok())
                 return http::ReplyError(res, s);
               // Built to a file under the run's directory, opened, and unlinked at once: the
               // stream reads it, and nothing is left behind however the client goes away.
               std::string tmp =
                   fmt::format("{}/bundle-{}.tar.gz", controller->RunDir(name), RandomHex(8));
               auto report = evidence::ExportBundle(std::move(input), sources, tmp, NowMillis());
               if (!report.ok()) {
                 ::unlink(tmp.c_str());
                 return http::ReplyError(res, report.status());
               }
               int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
               ::unlink(tmp.c_str());
               if (fd < 0)
                 return http::ReplyError(res, IoError("cannot open the bundle " + tmp, errno));
               auto shared_fd = std::shared_ptr<int>(new int(fd), [](int* p) {
                 ::close(*p);
                 delete p;
               });
               res.content_type = "application/gzip";
               res.stream = [shared_fd](http::ChunkSink& sink) {
                 char buf[65536];
                 ssize_t n = ::read(*shared_fd, buf, sizeof buf);
                 if (n <= 0) return false;
                 return sink.Write(std::string_view(buf, static_cast<size_t>(n)));
               };
             });

  api->Route(
      "GET", R"(/api/v1/runs/([a-z0-9-]+)/metrics)", Access::kRunRead,
      [controller, store](const http::HttpRequest& req, http::HttpResponse& res) {
        std::string name = req.matches[1];
        auto run = store->GetRun(name);
        if (!run.ok()) return http::ReplyError(res, run.status());
        const std::string dir = controller->EvidenceDir(name);
        const std::string path = layout::MetricsFile(dir);
        std::string only = req.has_param("name") ? req.get_param_value("name") : "";
        bool by_split = req.has_param("split");
        std::string split = by_split ? req.get_param_value("split") : "";
        bool jsonl = req.get_param_value("format") == "jsonl";
        int64_t max_points = kDefaultMaxPoints;
        if (req.has_param("max_points")) {
          const std::string text = req.get_param_value("max_points");
          char* end = nullptr;
          max_points = std::strtoll(text.c_str(), &end, 10);
          if (text.empty() || *end != '\0' || max_points < 4 || max_points > kMostMaxPoints)
            return http::ReplyError(
                res, InvalidArgument(
                         fmt::format("max_points: a whole number from 4 to {}", kMostMaxPoints)));
        }
        json stats = json::object();
        if (auto s = controller->MetricsStats(name); s.ok())
          stats = {{"points_read", s->points},
                   {"refused_points", s->refused_points},
                   {"refused_series", s->refused_series},
                   {"malformed", s->malformed}};
        // By value: a stream calls it after the handler returned.
        auto wanted = [only, by_split, split](const std::string& n, const std::string& s) {
          return (only.empty() || n == only) && (!by_split || s == split);
        };
        if (only.empty() && !jsonl) {
          // Every series' summary: kept with an ended run's compacted file, else computed through
          // a bounded sort (a run may hold millions of points).
          std::vector<evidence::MetricSummary> series;
          if (auto kept = evidence::LoadMetricSummaries(dir)) {
            series = std::move(*kept);
          } else {
            auto summary = evidence::CompactMetricsFile(path, "");
            if (!summary.ok()) return http::ReplyError(res, summary.status());
            series = std::move(summary->series);
          }
          json summaries = json::array();
          for (const auto& s : series)
            if (wanted(s.name, s.split)) summaries.push_back(SummaryJson(s));
          return http::Reply(res, 200,
                             {{"run", name},
                              {"state", store::RunStateName(run->state)},
                              {"summaries", summaries},
                              {"series", json::array()},
                              {"stats", stats}});
        }
        auto sorted = OpenSortedMetrics(dir, fmt::format("{}/.metrics-read-{}", dir, RandomHex(8)));
        if (!sorted.ok()) return http::ReplyError(res, sorted.status());
        if (jsonl) {
          // tau's form of each point, for `tau metrics` to render or pass on: streamed from the
          // sorted file, a block at a time, never held whole.
          auto reader = std::shared_ptr<evidence::MetricPointReader>(std::move(sorted->reader));
          res.content_type = "application/x-ndjson";
          res.stream = [reader, wanted](http::ChunkSink& sink) {
            if (!reader) return false;
            std::string out;
            evidence::MetricPoint p;
            while (out.size() < 64 * 1024) {
              auto more = reader->Next(&p);
              if (!more.ok() || !*more) break;
              if (wanted(p.name, p.split)) out += evidence::MetricPointJson(p) + "\n";
            }
            return !out.empty() && sink.Write(out);
          };
          return;
        }
        // One metric's series, each downsampled to at most max_points for display.
        json summaries = json::array(), series = json::array();
        std::map<std::pair<std::string, std::string>, size_t> index;  // into `series`
        std::vector<Downsampler> samplers;
        for (const auto& s : sorted->series) {
          if (!wanted(s.name, s.split)) continue;
          summaries.push_back(SummaryJson(s));
          index[{s.name, s.split}] = samplers.size();
          samplers.emplace_back(s.count, max_points);
        }
        if (sorted->reader && !samplers.empty()) {
          evidence::MetricPoint p;
          while (true) {
            auto more = sorted->reader->Next(&p);
            if (!more.ok()) return http::ReplyError(res, more.status());
            if (!*more) break;
            auto it = index.find({p.name, p.split});
            if (it != index.end()) samplers[it->second].Add(std::move(p));
          }
        }
        for (const auto& s : sorted->series) {
          auto it = index.find({s.name, s.split});
          if (it == index.end()) continue;
          Downsampler& d = samplers[it->second];
          json points = json::array();
          for (const auto& p : d.Finish()) points.push_back(PointJson(p));
          json one = {{"name", s.name}, {"split", s.split}, {"points", points}};
          // Said only when points were left out: a series that fits reads as it always did.
          if (d.downsampled())
            one["downsampled"] = {{"points", s.count}, {"max_points", max_points}};
          series.push_back(std::move(one));
        }
        http::Reply(res, 200,
                    {{"run", name},
                     {"state", store::RunStateName(run->state)},
                     {"summaries", summaries},
                     {"series", series},
                     {"stats", stats}});
      });
}

}  // namespace tau::server
