// The evidence routes of the API (docs/evidence.md):
//   GET /api/v1/runs/NAME/evidence          the record (JSON)
//   GET /api/v1/runs/NAME/evidence/bundle   the bundle (.tar.gz), built on demand
//   GET /api/v1/runs/NAME/metrics           metric history and summaries (?name=, ?split=)
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <memory>

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

  api->Route("GET", R"(/api/v1/runs/([a-z0-9-]+)/metrics)", Access::kRunRead,
             [controller, store](const http::HttpRequest& req, http::HttpResponse& res) {
               std::string name = req.matches[1];
               auto run = store->GetRun(name);
               if (!run.ok()) return http::ReplyError(res, run.status());
               const std::string path = layout::MetricsFile(controller->EvidenceDir(name));
               std::string only = req.has_param("name") ? req.get_param_value("name") : "";
               bool by_split = req.has_param("split");
               std::string split = by_split ? req.get_param_value("split") : "";
               bool jsonl = req.get_param_value("format") == "jsonl";
               json stats = json::object();
               if (auto s = controller->MetricsStats(name); s.ok())
                 stats = {{"points_read", s->points},
                          {"refused_points", s->refused_points},
                          {"refused_series", s->refused_series},
                          {"malformed", s->malformed}};
               if (only.empty() && !jsonl) {
                 // Every series' summary, streamed through a bounded sort: a run may hold millions
                 // of points.
                 auto summary = evidence::CompactMetricsFile(path, "");
                 if (!summary.ok()) return http::ReplyError(res, summary.status());
                 json summaries = json::array();
                 for (const auto& s : summary->series)
                   if (!by_split || s.split == split) summaries.push_back(SummaryJson(s));
                 return http::Reply(res, 200,
                                    {{"run", name},
                                     {"state", store::RunStateName(run->state)},
                                     {"summaries", summaries},
                                     {"series", json::array()},
                                     {"stats", stats}});
               }
               // One metric's points (only its points are held), or all of them as JSONL.
               auto history = evidence::LoadMetricHistory(path, nullptr, only);
               if (!history.ok()) return http::ReplyError(res, history.status());
               if (jsonl) {
                 // tau's form of each point, for `tau metrics` to render or pass on.
                 std::string out;
                 for (const auto& [n, s] : history->SeriesKeys()) {
                   if ((!only.empty() && n != only) || (by_split && s != split)) continue;
                   for (const auto& p : history->Series(n, s))
                     out += evidence::MetricPointJson(p) + "\n";
                 }
                 return res.set_content(std::move(out), "application/x-ndjson");
               }
               json summaries = json::array(), series = json::array();
               for (const auto& s : history->Summaries()) {
                 if ((!only.empty() && s.name != only) || (by_split && s.split != split)) continue;
                 summaries.push_back(SummaryJson(s));
                 if (only.empty()) continue;
                 json points = json::array();
                 for (const auto& p : history->Series(s.name, s.split))
                   points.push_back(PointJson(p));
                 series.push_back({{"name", s.name}, {"split", s.split}, {"points", points}});
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
