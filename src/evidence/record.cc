// The record: assembling record.json, the event chain, snapshot and artifact indexes, log hashes
// and GPU samples.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/event_chain.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/json_text.h"
#include "evidence/evidence.h"
#include "evidence/internal.h"

namespace tau::evidence {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxArtifacts = 100'000;

// Non-finite doubles as the strings the metrics format uses (JSON has no NaN).
json Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}
template <typename T>
json Opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}
json OptNumber(const std::optional<double>& v) { return v ? Number(*v) : json(nullptr); }

const char* LogStateName(LogState s) {
  switch (s) {
    case LogState::kKept:
      return "kept";
    case LogState::kPruned:
      return "pruned";
    case LogState::kLost:
      return "lost";
  }
  return "kept";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Event chain

Result<std::string> EventHash(const std::string& run, const EventInfo& e,
                              const std::string& prev_hash) {
  // The store's own formula (common/event_chain.h).
  try {
    return ::tau::EventHash(run, e.ts_ms, e.type, e.message, e.data, prev_hash);
  } catch (const std::exception& ex) {
    return InvalidArgument(fmt::format("event {} cannot be hashed: {}", e.id, ex.what()));
  }
}

Status VerifyEventChain(const std::string& run, const std::vector<EventInfo>& events) {
  std::string prev;
  for (size_t i = 0; i < events.size(); ++i) {
    const EventInfo& e = events[i];
    auto where = [&] { return fmt::format("event {} (id {}, {})", i + 1, e.id, e.type); };
    if (e.prev_hash != prev)
      return InvalidArgument(fmt::format(
          "event chain broken at {}: its prev_hash does not match the previous event's hash",
          where()));
    TAU_ASSIGN_OR_RETURN(std::string h, EventHash(run, e, prev));
    if (h != e.hash)
      return InvalidArgument(
          fmt::format("event chain broken at {}: its content does not match its hash", where()));
    prev = e.hash;
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Snapshot, logs, artifacts

std::string SnapshotDigest(std::vector<SnapshotFile> files) {
  std::sort(files.begin(), files.end(),
            [](const SnapshotFile& a, const SnapshotFile& b) { return a.path < b.path; });
  Sha256 tree;
  for (const SnapshotFile& f : files) {
    // Mirrors backend/snapshot.cc: NUL separates the fields, it cannot occur in a path.
    tree.Update(f.path + std::string(1, '\0') + fmt::format("{:o}", f.mode) + std::string(1, '\0') +
                f.sha256 + "\n");
  }
  return tree.HexDigest();
}

namespace {

// Walks `root` without following symlinks; `visit(relative, absolute, stat)` for regular files.
// Directories for which `skip_dir(name)` is true are not entered.
// The regular files below `root`, in a stable order, with their status. Through descriptors
// (WalkTree): the trees read here are a run's, which its processes (another user) may change while
// tau reads them as root, so no path below `root` is resolved twice and no link is followed.
Status Walk(const std::string& root, bool refuse_links,
            const std::function<bool(const std::string&)>& skip,
            const std::function<Status(const TreeEntry&)>& visit) {
  return WalkTree(root, [&](const TreeEntry& e) -> Result<bool> {
    if (skip(e.name)) return false;
    if (S_ISLNK(e.st.st_mode)) {
      if (refuse_links) return InvalidArgument("unexpected symbolic link " + root + "/" + e.rel);
      return false;
    }
    if (S_ISDIR(e.st.st_mode)) return true;
    if (S_ISREG(e.st.st_mode)) TAU_RETURN_IF_ERROR(visit(e));
    return false;
  });
}

// The SHA-256 and size of a file Walk found, read through its directory's descriptor.
Status HashEntry(const std::string& root, const TreeEntry& e, Sha256* h, int64_t* size) {
  TAU_ASSIGN_OR_RETURN(int fd, OpenRegularAt(e.dir_fd, e.name, root + "/" + e.rel));
  return ReadChunksAndClose(fd, root + "/" + e.rel, [&](std::string_view c) {
    h->Update(c);
    *size += static_cast<int64_t>(c.size());
  });
}

}  // namespace

Result<SnapshotInfo> ScanSnapshot(const std::string& dir) {
  SnapshotInfo info;
  TAU_RETURN_IF_ERROR(Walk(
      dir, true, [](const std::string&) { return false; },
      [&](const TreeEntry& e) -> Status {
        Sha256 h;
        int64_t size = 0;
        TAU_RETURN_IF_ERROR(HashEntry(dir, e, &h, &size));
        info.files.push_back({e.rel, size, h.HexDigest(), (e.st.st_mode & 0111) ? 0755 : 0644});
        return Status::Ok();
      }));
  std::sort(info.files.begin(), info.files.end(),
            [](const SnapshotFile& a, const SnapshotFile& b) { return a.path < b.path; });
  info.digest = SnapshotDigest(info.files);
  return info;
}

Result<LogInfo> IndexLog(const std::string& path, int rank) {
  LogInfo info;
  info.rank = rank;
  Sha256 h;
  TAU_RETURN_IF_ERROR(internal::ReadRunFileChunks(path, [&](std::string_view c) {
    h.Update(c);
    info.size += static_cast<int64_t>(c.size());
  }));
  info.sha256 = h.HexDigest();
  return info;
}

Result<std::vector<LogInfo>> IndexAttemptLogs(const std::string& attempt_dir) {
  std::vector<LogInfo> out;
  std::error_code ec;
  std::string dir = attempt_dir + "/logs";
  // The run's processes can reach this directory; a link put in place of it, or of a log, must not
  // make tau hash (or bundle) a file elsewhere.
  if (fs::symlink_status(dir, ec).type() != fs::file_type::directory) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    int rank = -1;
    size_t used = 0;
    if (name.size() > 9 && name.rfind("rank-", 0) == 0 && name.substr(name.size() - 4) == ".log") {
      std::string digits = name.substr(5, name.size() - 9);
      if (!digits.empty() && digits.size() < 7 &&
          digits.find_first_not_of("0123456789") == std::string::npos)
        rank = std::stoi(digits, &used);
    }
    if (rank < 0 || it->symlink_status(ec).type() != fs::file_type::regular) continue;
    TAU_ASSIGN_OR_RETURN(LogInfo info, IndexLog(it->path().string(), rank));
    out.push_back(std::move(info));
  }
  if (ec) return IoError("cannot list " + dir, ec.value());
  std::sort(out.begin(), out.end(),
            [](const LogInfo& a, const LogInfo& b) { return a.rank < b.rank; });
  return out;
}

// The artifacts of `kind` a former scan found, by path (their digests are reused while the file's
// size and time are unchanged).
static std::map<std::string, const Artifact*> ByPath(const std::vector<Artifact>* previous,
                                                     const std::string& kind) {
  std::map<std::string, const Artifact*> known;
  if (previous)
    for (const Artifact& a : *previous)
      if (a.kind == kind) known[a.path] = &a;
  return known;
}

Result<std::vector<Artifact>> ScanArtifacts(const std::string& root, const std::string& kind,
                                            const std::vector<int64_t>& attempt_starts,
                                            const std::vector<Artifact>* previous) {
  const std::map<std::string, const Artifact*> known = ByPath(previous, kind);
  std::vector<Artifact> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  TAU_RETURN_IF_ERROR(Walk(
      root, false, [](const std::string& name) { return internal::IsTemporaryName(name); },
      [&](const TreeEntry& e) -> Status {
        const std::string& rel = e.rel;
        const struct stat& st = e.st;
        if (out.size() >= kMaxArtifacts)
          return ResourceExhausted(
              fmt::format("{} holds more than {} files; not indexed", root, kMaxArtifacts));
        Artifact a;
        a.kind = kind;
        a.path = rel;
        a.mtime_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
        auto it = known.find(rel);
        if (it != known.end() && it->second->size == static_cast<int64_t>(st.st_size) &&
            it->second->mtime_ms == a.mtime_ms && !it->second->sha256.empty()) {
          a.size = it->second->size;
          a.sha256 = it->second->sha256;
        } else {
          Sha256 h;
          // Walk() saw a regular file; one removed since, or swapped for a link or FIFO, is left
          // out like a file that was never there (never followed or waited on).
          Status read = HashEntry(root, e, &h, &a.size);
          if (read.code() == StatusCode::kNotFound || read.code() == StatusCode::kInvalidArgument)
            return Status::Ok();
          TAU_RETURN_IF_ERROR(read);
          a.sha256 = h.HexDigest();
        }
        for (size_t i = 0; i < attempt_starts.size(); ++i)
          if (attempt_starts[i] <= a.mtime_ms) a.attempt = static_cast<int>(i + 1);
        out.push_back(std::move(a));
        return Status::Ok();
      }));
  std::sort(out.begin(), out.end(),
            [](const Artifact& a, const Artifact& b) { return a.path < b.path; });
  return out;
}

Result<std::vector<Artifact>> ListArtifacts(const std::string& root, const std::string& kind,
                                            size_t max_files, const std::vector<Artifact>* previous,
                                            bool* truncated) {
  *truncated = false;
  const std::map<std::string, const Artifact*> known = ByPath(previous, kind);
  std::vector<Artifact> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  // No directory is read whole (one of ten million files would be held and sorted): the walk
  // stops at a bound on the entries read (links, directories and temporary names count too), not
  // only on the files kept. Through descriptors, as Walk: the tree is the run's to change.
  const size_t max_entries = max_files * 4 + 1024;
  bool cut = false;
  Status walked = WalkTree(
      root,
      [&](const TreeEntry& e) -> Result<bool> {
        if (out.size() >= max_files) {
          *truncated = true;
          return false;
        }
        if (internal::IsTemporaryName(e.name)) return false;
        if (S_ISDIR(e.st.st_mode)) return true;
        if (!S_ISREG(e.st.st_mode)) return false;  // links, FIFOs, devices: not artifacts
        Artifact a;
        a.kind = kind;
        a.path = e.rel;
        a.size = static_cast<int64_t>(e.st.st_size);
        a.mtime_ms =
            static_cast<int64_t>(e.st.st_mtim.tv_sec) * 1000 + e.st.st_mtim.tv_nsec / 1000000;
        auto k = known.find(e.rel);
        if (k != known.end() && k->second->size == a.size && k->second->mtime_ms == a.mtime_ms)
          a.sha256 = k->second->sha256;
        out.push_back(std::move(a));
        return false;
      },
      max_entries, &cut);
  if (!walked.ok()) return walked;
  if (cut) *truncated = true;
  std::sort(out.begin(), out.end(),
            [](const Artifact& a, const Artifact& b) { return a.path < b.path; });
  return out;
}

// ---------------------------------------------------------------------------------------------
// GPU samples

std::string GpuSampleJson(const GpuSample& s) {
  json j = {{"at_ms", s.at_ms}, {"gpu", s.gpu}, {"uuid", s.uuid}, {"attempt", s.attempt}};
  if (s.util_pct) j["util_pct"] = Number(*s.util_pct);
  if (s.memory_util_pct) j["memory_util_pct"] = Number(*s.memory_util_pct);
  if (s.memory_used_bytes) j["memory_used_bytes"] = *s.memory_used_bytes;
  if (s.memory_total_bytes) j["memory_total_bytes"] = *s.memory_total_bytes;
  if (s.temperature_c) j["temperature_c"] = Number(*s.temperature_c);
  if (s.power_w) j["power_w"] = Number(*s.power_w);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<GpuSample> ParseGpuSample(std::string_view line) {
  json j = json::parse(line.begin(), line.end(), nullptr, false);
  if (!j.is_object()) return InvalidArgument("a GPU sample must be a JSON object");
  GpuSample s;
  try {
    s.at_ms = j.at("at_ms").get<int64_t>();
    s.gpu = j.at("gpu").get<int>();
    s.uuid = j.value("uuid", "");
    s.attempt = j.value("attempt", 0);
    auto num = [&](const char* k, std::optional<double>* out) {
      if (!j.contains(k)) return;
      const json& v = j[k];
      double d;
      if (v.is_number())
        *out = v.get<double>();
      else if (v.is_string() && internal::ParseNonFiniteWord(v.get<std::string>(), &d))
        *out = d;
    };
    num("util_pct", &s.util_pct);
    num("memory_util_pct", &s.memory_util_pct);
    num("temperature_c", &s.temperature_c);
    num("power_w", &s.power_w);
    if (j.contains("memory_used_bytes"))
      s.memory_used_bytes = j["memory_used_bytes"].get<int64_t>();
    if (j.contains("memory_total_bytes"))
      s.memory_total_bytes = j["memory_total_bytes"].get<int64_t>();
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("bad GPU sample: ") + e.what());
  }
  return s;
}

Status AppendGpuSamples(const std::string& evidence_dir, const std::vector<GpuSample>& samples) {
  if (samples.empty()) return Status::Ok();
  TAU_RETURN_IF_ERROR(MakeDirs(evidence_dir));
  std::string text;
  for (const GpuSample& s : samples) text += GpuSampleJson(s) + "\n";
  std::string path = evidence_dir + "/gpu-samples.jsonl";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot open " + path, errno);
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return IoError("cannot append to " + path, err);
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

Result<std::vector<GpuSample>> LoadGpuSamples(const std::string& path, int64_t* malformed) {
  std::vector<GpuSample> out;
  auto text = ReadFile(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return out;
    return text.status();
  }
  size_t pos = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    std::string_view line(text->data() + pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    auto s = ParseGpuSample(line);
    if (s.ok())
      out.push_back(std::move(*s));
    else if (malformed)
      ++*malformed;
  }
  return out;
}

std::vector<GpuSampleSummary> SummarizeGpuSamples(const std::vector<GpuSample>& samples) {
  std::map<int, GpuSampleSummary> by_gpu;
  std::map<int, std::pair<double, int64_t>> util_sum;
  auto max_of = [](std::optional<double>* m, const std::optional<double>& v) {
    if (v && std::isfinite(*v) && (!*m || *v > **m)) *m = *v;
  };
  for (const GpuSample& s : samples) {
    GpuSampleSummary& g = by_gpu[s.gpu];
    if (g.count == 0) {
      g.gpu = s.gpu;
      g.first_ms = g.last_ms = s.at_ms;
    }
    if (!s.uuid.empty()) g.uuid = s.uuid;
    ++g.count;
    g.first_ms = std::min(g.first_ms, s.at_ms);
    g.last_ms = std::max(g.last_ms, s.at_ms);
    max_of(&g.max_util_pct, s.util_pct);
    max_of(&g.max_temperature_c, s.temperature_c);
    max_of(&g.max_power_w, s.power_w);
    if (s.memory_used_bytes &&
        (!g.max_memory_used_bytes || *s.memory_used_bytes > *g.max_memory_used_bytes))
      g.max_memory_used_bytes = s.memory_used_bytes;
    if (s.util_pct && std::isfinite(*s.util_pct)) {
      util_sum[s.gpu].first += *s.util_pct;
      ++util_sum[s.gpu].second;
    }
  }
  std::vector<GpuSampleSummary> out;
  for (auto& [gpu, g] : by_gpu) {
    auto it = util_sum.find(gpu);
    if (it != util_sum.end() && it->second.second > 0)
      g.mean_util_pct = it->second.first / static_cast<double>(it->second.second);
    out.push_back(g);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Record

namespace {

json SummaryJson(const MetricSummary& m) {
  return {{"name", m.name},
          {"split", m.split},
          {"unit", m.unit},
          {"count", m.count},
          {"first_step", m.first_step},
          {"last_step", m.last_step},
          {"min", OptNumber(m.min)},
          {"max", OptNumber(m.max)},
          {"latest", Number(m.latest)},
          {"latest_attempt", m.latest_attempt},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count}};
}

}  // namespace

namespace internal {

std::string LogPath(int attempt, int rank) {
  return fmt::format("logs/attempt-{}/rank-{}.log", attempt, rank);
}

json ArtifactJson(const Artifact& a) {
  return {{"kind", a.kind},     {"path", a.path},       {"size", a.size},
          {"sha256", a.sha256}, {"attempt", a.attempt}, {"mtime_ms", a.mtime_ms}};
}

json MetricSummariesJson(const std::vector<MetricSummary>& series) {
  json out = json::array();
  for (const MetricSummary& m : series) out.push_back(SummaryJson(m));
  return out;
}

}  // namespace internal

using internal::ArtifactJson;
using internal::LogPath;
using internal::MetricSummariesJson;

json BuildRecord(const RecordInput& in) {
  const RunInfo& r = in.run;
  json run = {{"name", r.name},
              {"spec_name", r.spec_name},
              {"state", r.state},
              {"reason", r.reason},
              {"message", r.message},
              {"exit_code", Opt(r.exit_code)},
              {"signal", Opt(r.signal)},
              {"workspace", r.workspace},
              {"queue", r.queue},
              {"priority", r.priority},
              {"resources", r.resources.is_object() ? r.resources : json::object()},
              {"created_ms", r.created_ms},
              {"admitted_ms", Opt(r.admitted_ms)},
              {"started_ms", Opt(r.started_ms)},
              {"finished_ms", Opt(r.finished_ms)}};

  json provenance = json::array();
  for (const ProvenanceEntry& p : in.config.provenance)
    provenance.push_back({{"field", p.field}, {"value", p.value}, {"source", p.source}});
  json config = {{"spec_file", in.config.spec_file},
                 {"spec_yaml", in.config.spec_yaml},
                 {"spec", in.config.spec_json.is_object() ? in.config.spec_json : json::object()},
                 {"config_hash", in.config.config_hash},
                 {"resolved", in.config.resolved.is_object() ? in.config.resolved : json::object()},
                 {"provenance", provenance}};

  json files = json::array();
  int64_t bytes = 0;
  for (const SnapshotFile& f : in.snapshot.files) {
    files.push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}, {"mode", f.mode}});
    bytes += f.size;
  }
  json snapshot = {{"digest", in.snapshot.digest},
                   {"file_count", static_cast<int64_t>(in.snapshot.files.size())},
                   {"bytes", bytes},
                   {"files", files}};

  const RuntimeInfo& rt = in.runtime;
  json gpus = json::array();
  for (const GpuDevice& g : rt.gpus)
    gpus.push_back({{"index", g.index}, {"uuid", g.uuid}, {"name", g.name}});
  json runtime = {{"image", rt.image},
                  {"image_digest", rt.image_digest},
                  {"pip", rt.pip},
                  {"packages", rt.packages},
                  {"python_version", rt.python_version},
                  {"host", rt.host},
                  {"os", rt.os},
                  {"kernel", rt.kernel},
                  {"driver_version", rt.driver_version},
                  {"cuda_version", rt.cuda_version},
                  {"gpus", gpus},
                  {"tau_version", rt.tau_version}};

  json events = json::array();
  for (const EventInfo& e : in.events)
    events.push_back({{"id", e.id},
                      {"ts_ms", e.ts_ms},
                      {"time", FormatRfc3339(e.ts_ms)},
                      {"type", e.type},
                      {"message", e.message},
                      {"data", e.data},
                      {"prev_hash", e.prev_hash},
                      {"hash", e.hash}});

  json attempts = json::array();
  for (const AttemptInfo& a : in.attempts) {
    json logs = json::array();
    for (const LogInfo& l : a.logs)
      logs.push_back({{"rank", l.rank},
                      {"path", LogPath(a.number, l.rank)},
                      {"size", l.size},
                      {"sha256", l.sha256},
                      {"state", LogStateName(l.state)}});
    attempts.push_back({{"number", a.number},
                        {"state", a.state},
                        {"gpus", a.gpus},
                        {"started_ms", a.started_ms},
                        {"ended_ms", Opt(a.ended_ms)},
                        {"exit_code", Opt(a.exit_code)},
                        {"signal", Opt(a.signal)},
                        {"outcome", a.outcome},
                        {"failure_class", a.failure_class},
                        {"message", a.message},
                        {"diagnosis", a.diagnosis.is_object() ? a.diagnosis : json::object()},
                        {"logs", logs}});
  }

  const MetricsInfo& mi = in.metrics;
  json first_malformed = json::array();
  for (const auto& [source, m] : mi.stats.first_malformed)
    first_malformed.push_back({{"source", source}, {"line", m.line}, {"error", m.error}});
  json metrics = {{"lines", mi.stats.lines},
                  {"points_read", mi.stats.points},
                  {"distinct_points", mi.distinct_points},
                  {"replaced", mi.replaced},
                  {"dropped", mi.dropped},
                  {"refused_points", mi.stats.refused_points},
                  {"refused_series", mi.stats.refused_series},
                  {"malformed", mi.stats.malformed},
                  {"restarts", mi.stats.restarts},
                  {"first_malformed", first_malformed},
                  {"series", MetricSummariesJson(mi.series)}};

  json samples = json::array();
  for (const GpuSampleSummary& g : in.gpu_samples)
    samples.push_back({{"gpu", g.gpu},
                       {"uuid", g.uuid},
                       {"count", g.count},
                       {"first_ms", g.first_ms},
                       {"last_ms", g.last_ms},
                       {"mean_util_pct", OptNumber(g.mean_util_pct)},
                       {"max_util_pct", OptNumber(g.max_util_pct)},
                       {"max_temperature_c", OptNumber(g.max_temperature_c)},
                       {"max_power_w", OptNumber(g.max_power_w)},
                       {"max_memory_used_bytes", Opt(g.max_memory_used_bytes)}});

  json artifacts = json::array();
  for (const Artifact& a : in.artifacts) artifacts.push_back(ArtifactJson(a));
  json lineage = json::array();
  for (const LineageEntry& l : in.lineage)
    lineage.push_back({{"stage", l.stage},
                       {"run", l.run},
                       {"state", l.state},
                       {"checkpoint", l.checkpoint},
                       {"checkpoint_sha256", l.checkpoint_sha256},
                       {"checkpoint_files", l.checkpoint_files},
                       {"checkpoint_bytes", l.checkpoint_bytes},
                       {"output_dir", l.output_dir}});

  return {{"format", kRecordFormat},
          {"kind", "tau.run-record"},
          {"updated_ms", in.updated_ms},
          {"run", run},
          {"config", config},
          {"snapshot", snapshot},
          {"runtime", runtime},
          {"events", events},
          {"chain_head", in.events.empty() ? std::string() : in.events.back().hash},
          {"attempts", attempts},
          {"metrics", metrics},
          {"gpu_samples", samples},
          {"artifacts", artifacts},
          {"lineage", lineage},
          {"retention",
           {{"logs_pruned_ms", Opt(in.retention.logs_pruned_ms)},
            {"samples_pruned_ms", Opt(in.retention.samples_pruned_ms)}}}};
}

CheckpointSum CheckpointDigest(const std::vector<Artifact>& artifacts, const std::string& path) {
  CheckpointSum out;
  std::vector<std::string> lines;
  const std::string prefix = path + "/";
  for (const Artifact& a : artifacts) {
    if (a.path == path) {
      out.sha256 = a.sha256;
      out.files = 1;
      out.bytes = a.size;
      return out;
    }
    if (a.path.compare(0, prefix.size(), prefix) != 0) continue;
    lines.push_back(a.sha256 + "  " + a.path.substr(prefix.size()) + "\n");
    out.files += 1;
    out.bytes += a.size;
  }
  if (lines.empty()) return out;
  std::sort(lines.begin(), lines.end(), [](const std::string& a, const std::string& b) {
    return a.compare(66, std::string::npos, b, 66, std::string::npos) < 0;  // by path
  });
  std::string all;
  for (const std::string& l : lines) all += l;
  out.sha256 = Sha256Hex(all);
  return out;
}

Status SaveRecord(const std::string& evidence_dir, const json& record, Durability durability) {
  TAU_RETURN_IF_ERROR(MakeDirs(evidence_dir));
  std::string text;
  try {
    text = JsonText(record, 2) + "\n";
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("the record cannot be written as JSON: ") + e.what());
  }
  return WriteFileAtomic(evidence_dir + "/record.json", text, 0644, durability);
}

Result<json> LoadRecord(const std::string& path) {
  TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgument(path + " is not a JSON object");
  if (j.value("format", 0) != kRecordFormat)
    return InvalidArgument(fmt::format("{} has record format {}, this tau reads {}", path,
                                       j.value("format", 0), kRecordFormat));
  return j;
}

namespace {

template <typename T>
std::optional<T> GetOpt(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_null()) return std::nullopt;
  return v.get<T>();
}

double GetNumber(const json& v) {
  double d = 0;
  if (v.is_string() && internal::ParseNonFiniteWord(v.get<std::string>(), &d)) return d;
  return v.get<double>();
}

std::optional<double> GetOptNumber(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_null()) return std::nullopt;
  return GetNumber(v);
}

}  // namespace

Result<RecordInput> ParseRecord(const json& j) {
  RecordInput in;
  try {
    if (j.at("format").get<int>() != kRecordFormat)
      return InvalidArgument(
          fmt::format("record format {} is not {}", JsonText(j.at("format")), kRecordFormat));
    in.updated_ms = j.at("updated_ms").get<int64_t>();
    const json& r = j.at("run");
    in.run.name = r.at("name").get<std::string>();
    in.run.spec_name = r.at("spec_name").get<std::string>();
    in.run.state = r.at("state").get<std::string>();
    in.run.reason = r.at("reason").get<std::string>();
    in.run.message = r.at("message").get<std::string>();
    in.run.exit_code = GetOpt<int>(r, "exit_code");
    in.run.signal = GetOpt<int>(r, "signal");
    in.run.workspace = r.at("workspace").get<std::string>();
    in.run.queue = r.at("queue").get<std::string>();
    in.run.priority = r.at("priority").get<int>();
    in.run.resources = r.at("resources");
    in.run.created_ms = r.at("created_ms").get<int64_t>();
    in.run.admitted_ms = GetOpt<int64_t>(r, "admitted_ms");
    in.run.started_ms = GetOpt<int64_t>(r, "started_ms");
    in.run.finished_ms = GetOpt<int64_t>(r, "finished_ms");

    const json& c = j.at("config");
    in.config.spec_file = c.at("spec_file").get<std::string>();
    in.config.spec_yaml = c.at("spec_yaml").get<std::string>();
    in.config.spec_json = c.at("spec");
    in.config.config_hash = c.at("config_hash").get<std::string>();
    in.config.resolved = c.at("resolved");
    for (const json& p : c.at("provenance"))
      in.config.provenance.push_back({p.at("field").get<std::string>(),
                                      p.at("value").get<std::string>(),
                                      p.at("source").get<std::string>()});

    const json& sn = j.at("snapshot");
    in.snapshot.digest = sn.at("digest").get<std::string>();
    for (const json& f : sn.at("files"))
      in.snapshot.files.push_back({f.at("path").get<std::string>(), f.at("size").get<int64_t>(),
                                   f.at("sha256").get<std::string>(), f.at("mode").get<int>()});

    const json& rt = j.at("runtime");
    in.runtime.image = rt.at("image").get<std::string>();
    in.runtime.image_digest = rt.at("image_digest").get<std::string>();
    in.runtime.pip = rt.at("pip").get<std::vector<std::string>>();
    in.runtime.packages = rt.at("packages").get<std::vector<std::string>>();
    in.runtime.python_version = rt.at("python_version").get<std::string>();
    in.runtime.host = rt.at("host").get<std::string>();
    in.runtime.os = rt.at("os").get<std::string>();
    in.runtime.kernel = rt.at("kernel").get<std::string>();
    in.runtime.driver_version = rt.at("driver_version").get<std::string>();
    in.runtime.cuda_version = rt.at("cuda_version").get<std::string>();
    for (const json& g : rt.at("gpus"))
      in.runtime.gpus.push_back({g.at("index").get<int>(), g.at("uuid").get<std::string>(),
                                 g.at("name").get<std::string>()});
    in.runtime.tau_version = rt.at("tau_version").get<std::string>();

    TAU_ASSIGN_OR_RETURN(in.events, RecordEvents(j));

    for (const json& a : j.at("attempts")) {
      AttemptInfo ai;
      ai.number = a.at("number").get<int>();
      ai.state = a.at("state").get<std::string>();
      ai.gpus = a.at("gpus").get<std::vector<int>>();
      ai.started_ms = a.at("started_ms").get<int64_t>();
      ai.ended_ms = GetOpt<int64_t>(a, "ended_ms");
      ai.exit_code = GetOpt<int>(a, "exit_code");
      ai.signal = GetOpt<int>(a, "signal");
      ai.outcome = a.at("outcome").get<std::string>();
      ai.failure_class = a.at("failure_class").get<std::string>();
      ai.message = a.at("message").get<std::string>();
      ai.diagnosis = a.at("diagnosis");
      for (const json& l : a.at("logs")) {
        LogInfo li;
        li.rank = l.at("rank").get<int>();
        li.size = l.at("size").get<int64_t>();
        li.sha256 = l.at("sha256").get<std::string>();
        std::string state = l.at("state").get<std::string>();
        li.state = state == "pruned" ? LogState::kPruned
                   : state == "lost" ? LogState::kLost
                                     : LogState::kKept;
        ai.logs.push_back(std::move(li));
      }
      in.attempts.push_back(std::move(ai));
    }

    const json& m = j.at("metrics");
    in.metrics.stats.lines = m.at("lines").get<int64_t>();
    in.metrics.stats.points = m.at("points_read").get<int64_t>();
    in.metrics.distinct_points = m.at("distinct_points").get<int64_t>();
    in.metrics.replaced = m.at("replaced").get<int64_t>();
    in.metrics.dropped = m.at("dropped").get<int64_t>();
    in.metrics.stats.malformed = m.at("malformed").get<int64_t>();
    in.metrics.stats.restarts = m.at("restarts").get<int64_t>();
    // Absent from records saved before the caps existed.
    in.metrics.stats.refused_points = m.value("refused_points", int64_t{0});
    in.metrics.stats.refused_series = m.value("refused_series", int64_t{0});
    for (const json& f : m.at("first_malformed"))
      in.metrics.stats.first_malformed.push_back(
          {f.at("source").get<std::string>(),
           {f.at("line").get<int64_t>(), f.at("error").get<std::string>()}});
    for (const json& s : m.at("series")) {
      MetricSummary ms;
      ms.name = s.at("name").get<std::string>();
      ms.split = s.at("split").get<std::string>();
      ms.unit = s.at("unit").get<std::string>();
      ms.count = s.at("count").get<int64_t>();
      ms.first_step = s.at("first_step").get<int64_t>();
      ms.last_step = s.at("last_step").get<int64_t>();
      ms.min = GetOptNumber(s, "min");
      ms.max = GetOptNumber(s, "max");
      ms.latest = GetNumber(s.at("latest"));
      ms.latest_attempt = s.at("latest_attempt").get<int>();
      ms.nan_count = s.at("nan_count").get<int64_t>();
      ms.inf_count = s.at("inf_count").get<int64_t>();
      in.metrics.series.push_back(std::move(ms));
    }

    for (const json& g : j.at("gpu_samples")) {
      GpuSampleSummary gs;
      gs.gpu = g.at("gpu").get<int>();
      gs.uuid = g.at("uuid").get<std::string>();
      gs.count = g.at("count").get<int64_t>();
      gs.first_ms = g.at("first_ms").get<int64_t>();
      gs.last_ms = g.at("last_ms").get<int64_t>();
      gs.mean_util_pct = GetOptNumber(g, "mean_util_pct");
      gs.max_util_pct = GetOptNumber(g, "max_util_pct");
      gs.max_temperature_c = GetOptNumber(g, "max_temperature_c");
      gs.max_power_w = GetOptNumber(g, "max_power_w");
      gs.max_memory_used_bytes = GetOpt<int64_t>(g, "max_memory_used_bytes");
      in.gpu_samples.push_back(std::move(gs));
    }

    for (const json& a : j.at("artifacts"))
      in.artifacts.push_back({a.at("kind").get<std::string>(), a.at("path").get<std::string>(),
                              a.at("size").get<int64_t>(), a.at("sha256").get<std::string>(),
                              a.at("attempt").get<int>(), a.at("mtime_ms").get<int64_t>()});

    for (const json& l : j.value("lineage", json::array()))  // absent before workflows
      in.lineage.push_back(
          {l.at("stage").get<std::string>(), l.at("run").get<std::string>(),
           l.at("state").get<std::string>(), l.at("checkpoint").get<std::string>(),
           l.at("checkpoint_sha256").get<std::string>(), l.at("checkpoint_files").get<int64_t>(),
           l.at("checkpoint_bytes").get<int64_t>(), l.at("output_dir").get<std::string>()});

    const json& ret = j.at("retention");
    in.retention.logs_pruned_ms = GetOpt<int64_t>(ret, "logs_pruned_ms");
    in.retention.samples_pruned_ms = GetOpt<int64_t>(ret, "samples_pruned_ms");
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("the record is malformed: ") + e.what());
  }
  return in;
}

Result<std::vector<EventInfo>> RecordEvents(const json& record) {
  std::vector<EventInfo> out;
  try {
    const json& events = record.at("events");
    if (!events.is_array()) return InvalidArgument("the record's \"events\" is not an array");
    for (size_t i = 0; i < events.size(); ++i) {
      const json& j = events[i];
      EventInfo e;
      e.id = j.at("id").get<int64_t>();
      e.ts_ms = j.at("ts_ms").get<int64_t>();
      e.type = j.at("type").get<std::string>();
      e.message = j.at("message").get<std::string>();
      e.data = j.at("data");
      e.prev_hash = j.at("prev_hash").get<std::string>();
      e.hash = j.at("hash").get<std::string>();
      out.push_back(std::move(e));
    }
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("the record's events are malformed: ") + e.what());
  }
  return out;
}

}  // namespace tau::evidence
