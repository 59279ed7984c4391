// Bundles: exporting a run's evidence as a self-contained .tar.gz, and verifying one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/json_text.h"
#include "common/strings.h"
#include "evidence/evidence.h"
#include "evidence/internal.h"

namespace tau::evidence {

using internal::LogPath;
using nlohmann::json;

namespace {

constexpr size_t kMaxEntries = 1'000'000;
constexpr size_t kMaxKeptBytes = 1u << 30;  // files verify reads whole (record, metrics, ...)
constexpr char kManifest[] = "manifest.json";
constexpr char kRecord[] = "record.json";
constexpr char kMetrics[] = "metrics.jsonl";
constexpr char kSamples[] = "gpu-samples.jsonl";
constexpr char kCheckpoints[] = "checkpoints.json";

// The manifest's digest covers the manifest without its "digest" member, dumped compactly (keys
// sorted): a changed byte anywhere in it is then named as "manifest.json altered" rather than as a
// file that the altered manifest now describes wrongly.
Result<std::string> ManifestDigest(json manifest) {
  manifest.erase("digest");
  try {
    return Sha256Hex(JsonText(manifest));
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("manifest.json cannot be hashed: ") + e.what());
  }
}

// Streams exactly the bytes a file has now into the archive, hashing them.
Status StreamFile(internal::TarGzWriter* w, const std::string& name, const std::string& path,
                  int64_t mtime_s, int64_t* size, std::string* sha) {
  // Logs are files a run's processes can reach: never follow a link or wait on a FIFO there.
  TAU_ASSIGN_OR_RETURN(int fd, internal::OpenRunFile(path));
  internal::ClosesFd closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + path, errno);
  // A log still being written grows while we read: the entry holds the bytes up to this size.
  int64_t want = st.st_size;
  TAU_RETURN_IF_ERROR(w->Begin(name, want, mtime_s));
  Sha256 h;
  std::string buf(256 * 1024, '\0');
  int64_t done = 0;
  while (done < want) {
    ssize_t n =
        ::read(fd, buf.data(), static_cast<size_t>(std::min<int64_t>(want - done, buf.size())));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot read " + path, errno);
    }
    if (n == 0) return FailedPrecondition(path + " shrank while it was being exported");
    std::string_view chunk(buf.data(), static_cast<size_t>(n));
    h.Update(chunk);
    TAU_RETURN_IF_ERROR(w->Write(chunk));
    done += n;
  }
  TAU_RETURN_IF_ERROR(w->End());
  *size = want;
  *sha = h.HexDigest();
  return Status::Ok();
}

}  // namespace

Result<ExportReport> ExportBundle(RecordInput record, const BundleSources& sources,
                                  const std::string& out_path, int64_t now_ms) {
  std::string tmp = out_path + ".tmp." + RandomHex(8);
  TAU_ASSIGN_OR_RETURN(auto writer, internal::TarGzWriter::Create(tmp));
  struct Cleanup {
    std::string path;
    bool keep = false;
    ~Cleanup() {
      if (!keep) ::unlink(path.c_str());
    }
  } cleanup{tmp};

  int64_t mtime_s = now_ms / 1000;
  ExportReport report;
  json files = json::array();
  auto listed = [&](const std::string& name, int64_t size, const std::string& sha) {
    files.push_back({{"path", name}, {"size", size}, {"sha256", sha}});
    ++report.files;
    report.bytes_in += size;
  };
  auto add = [&](const std::string& name, const std::string& data) -> Status {
    TAU_RETURN_IF_ERROR(writer->Add(name, data, mtime_s));
    listed(name, static_cast<int64_t>(data.size()), Sha256Hex(data));
    return Status::Ok();
  };

  // Logs, streamed. The record's entries are filled from what the bundle holds.
  std::vector<LogSource> logs = sources.logs;
  std::sort(logs.begin(), logs.end(), [](const LogSource& a, const LogSource& b) {
    return std::tie(a.attempt, a.rank) < std::tie(b.attempt, b.rank);
  });
  std::set<std::pair<int, int>> bundled;
  for (const LogSource& src : logs) {
    auto attempt = std::find_if(record.attempts.begin(), record.attempts.end(),
                                [&](const AttemptInfo& a) { return a.number == src.attempt; });
    if (attempt == record.attempts.end())
      return InvalidArgument(
          fmt::format("a log of attempt {}, which the record does not have", src.attempt));
    if (!bundled.insert({src.attempt, src.rank}).second)
      return InvalidArgument(fmt::format("two logs for attempt {} rank {}", src.attempt, src.rank));
    std::string name = LogPath(src.attempt, src.rank);
    LogInfo info;
    info.rank = src.rank;
    TAU_RETURN_IF_ERROR(
        StreamFile(writer.get(), name, src.path, mtime_s, &info.size, &info.sha256));
    listed(name, info.size, info.sha256);
    auto known = std::find_if(attempt->logs.begin(), attempt->logs.end(),
                              [&](const LogInfo& l) { return l.rank == src.rank; });
    if (known == attempt->logs.end()) {
      attempt->logs.push_back(info);
    } else {
      if (!known->sha256.empty() && known->state == LogState::kKept &&
          (known->sha256 != info.sha256 || known->size != info.size))
        return FailedPrecondition(fmt::format(
            "{} changed after it was recorded (sha256 {} recorded, {} now): refusing to export it",
            src.path, known->sha256, info.sha256));
      *known = info;
    }
  }
  for (AttemptInfo& a : record.attempts) {
    for (LogInfo& l : a.logs)
      if (l.state == LogState::kKept && !bundled.count({a.number, l.rank}))
        l.state = LogState::kLost;
    std::sort(a.logs.begin(), a.logs.end(),
              [](const LogInfo& x, const LogInfo& y) { return x.rank < y.rank; });
  }

  // Metrics: the deduplicated history, and summaries recomputed from exactly that. Compacted into
  // a file beside the bundle and streamed from there: a run's points may be far more than memory
  // should hold.
  CompactReport compacted;
  if (!sources.metrics_path.empty() && PathExists(sources.metrics_path)) {
    std::string points = tmp + ".metrics";
    struct Unlink {
      std::string path;
      ~Unlink() { ::unlink(path.c_str()); }
    } unlink_points{points};
    TAU_ASSIGN_OR_RETURN(compacted, CompactMetricsFile(sources.metrics_path, points));
    int64_t size = 0;
    std::string sha;
    if (PathExists(points)) {
      TAU_RETURN_IF_ERROR(StreamFile(writer.get(), kMetrics, points, mtime_s, &size, &sha));
      listed(kMetrics, size, sha);
    } else {
      TAU_RETURN_IF_ERROR(add(kMetrics, ""));
    }
  } else {
    TAU_RETURN_IF_ERROR(add(kMetrics, ""));
  }
  record.metrics.series = compacted.series;
  record.metrics.distinct_points = compacted.distinct;

  if (!sources.gpu_samples_path.empty() && PathExists(sources.gpu_samples_path)) {
    int64_t size = 0;
    std::string sha;
    TAU_RETURN_IF_ERROR(
        StreamFile(writer.get(), kSamples, sources.gpu_samples_path, mtime_s, &size, &sha));
    listed(kSamples, size, sha);
  }

  json artifacts = json::array();
  for (const Artifact& a : record.artifacts) artifacts.push_back(internal::ArtifactJson(a));
  json checkpoints = {{"format", kBundleFormat}, {"artifacts", artifacts}};
  TAU_RETURN_IF_ERROR(add(kCheckpoints, JsonText(checkpoints, 2) + "\n"));

  json rec = BuildRecord(record);
  std::string rec_text;
  try {
    rec_text = JsonText(rec, 2) + "\n";
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("the record cannot be written as JSON: ") + e.what());
  }
  TAU_RETURN_IF_ERROR(add(kRecord, rec_text));
  report.chain_head = rec["chain_head"].get<std::string>();

  json manifest = {{"format", kBundleFormat},
                   {"kind", "tau.evidence-bundle"},
                   {"run", record.run.name},
                   {"tau_version", record.runtime.tau_version},
                   {"created_ms", now_ms},
                   {"created", FormatRfc3339(now_ms)},
                   {"chain_head", report.chain_head},
                   {"files", files}};
  TAU_ASSIGN_OR_RETURN(std::string digest, ManifestDigest(manifest));
  manifest["digest"] = digest;
  TAU_RETURN_IF_ERROR(writer->Add(kManifest, JsonText(manifest, 2) + "\n", mtime_s));
  TAU_RETURN_IF_ERROR(writer->Finish());
  report.bytes_out = writer->bytes_out();
  if (::rename(tmp.c_str(), out_path.c_str()) != 0)
    return IoError("cannot rename the bundle to " + out_path, errno);
  cleanup.keep = true;
  return report;
}

// ---------------------------------------------------------------------------------------------
// Verify

namespace {

struct Seen {
  int64_t size = 0;
  std::string sha256;
};

Status Bad(std::string message) { return InvalidArgument(std::move(message)); }

}  // namespace

Status VerifyBundle(const std::string& path, const VerifyOptions& options, VerifyReport* report) {
  static const std::set<std::string> kKept = {kManifest, kRecord, kCheckpoints, kMetrics};
  std::vector<std::string> order;
  std::map<std::string, Seen> seen;
  std::map<std::string, std::string> kept;
  std::string current;
  Sha256 hasher;
  bool keeping = false;
  auto finish_entry = [&] {
    if (current.empty()) return;
    seen[current].sha256 = hasher.HexDigest();
    current.clear();
  };
  TAU_RETURN_IF_ERROR(internal::ReadTarGz(
      path,
      [&](const internal::TarEntry& e) -> Status {
        finish_entry();
        if (order.size() >= kMaxEntries)
          return Bad(fmt::format("the bundle has more than {} entries", kMaxEntries));
        if (!internal::SafeEntryName(e.name))
          return Bad(fmt::format(
              "unsafe entry '{}' in the bundle (absolute, '..', or not a plain relative path)",
              e.name));
        if (e.type != '0') {
          std::string what = e.type == '1' || e.type == '2' ? "a link"
                             : e.type == '5'                ? "a directory"
                                                            : "not a regular file";
          return Bad(
              fmt::format("entry '{}' in the bundle is {} (type '{}')", e.name, what, e.type));
        }
        if (seen.count(e.name)) return Bad(fmt::format("entry '{}' appears twice", e.name));
        order.push_back(e.name);
        seen[e.name].size = e.size;
        current = e.name;
        hasher = Sha256();
        keeping = kKept.count(e.name) && static_cast<size_t>(e.size) <= kMaxKeptBytes;
        if (keeping) kept[e.name].reserve(static_cast<size_t>(e.size));
        return Status::Ok();
      },
      [&](std::string_view data) -> Status {
        hasher.Update(data);
        if (keeping) kept[current].append(data);
        return Status::Ok();
      }));
  finish_entry();

  // The manifest.
  if (!seen.count(kManifest)) return Bad("manifest.json missing");
  json manifest = json::parse(kept[kManifest], nullptr, false);
  if (!manifest.is_object()) return Bad("manifest.json altered (not a valid JSON object)");
  if (!manifest.contains("digest") || !manifest["digest"].is_string())
    return Bad("manifest.json altered (no digest)");
  TAU_ASSIGN_OR_RETURN(std::string digest, ManifestDigest(manifest));
  if (digest != manifest["digest"].get<std::string>())
    return Bad("manifest.json altered (its digest does not match its content)");
  if (!manifest.contains("format") || !manifest["format"].is_number_integer())
    return Bad("manifest.json altered (no format)");
  if (manifest["format"].get<int64_t>() != kBundleFormat)
    return Bad(fmt::format("manifest.json has bundle format {}; this tau reads format {}",
                           JsonText(manifest["format"]), kBundleFormat));
  if (!manifest.contains("files") || !manifest["files"].is_array() ||
      !manifest.contains("chain_head") || !manifest["chain_head"].is_string())
    return Bad("manifest.json altered (no file list or chain head)");

  // Every listed file, in the manifest's order; then anything it does not list.
  std::set<std::string> listed;
  for (const json& f : manifest["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("sha256") ||
        !f["sha256"].is_string() || !f.contains("size") || !f["size"].is_number_integer())
      return Bad("manifest.json altered (a malformed file entry)");
    std::string name = f["path"].get<std::string>();
    listed.insert(name);
    auto it = seen.find(name);
    if (it == seen.end()) return Bad(name + " missing");
    if (it->second.sha256 != f["sha256"].get<std::string>() ||
        it->second.size != f["size"].get<int64_t>())
      return Bad(fmt::format("{} altered (sha256 {}, the manifest says {})", name,
                             it->second.sha256, f["sha256"].get<std::string>()));
  }
  for (const std::string& name : order)
    if (name != kManifest && !listed.count(name))
      return Bad("unexpected file " + name + " (the manifest does not list it)");
  for (const char* required : {kRecord, kMetrics, kCheckpoints})
    if (!listed.count(required)) return Bad(std::string(required) + " missing");

  // The record and its chain. Past this point every file matches the manifest, so a failure means
  // the bundle was rewritten with a recomputed manifest (or built by something other than tau).
  json record = json::parse(kept[kRecord], nullptr, false);
  if (!record.is_object() || !record.contains("run") || !record["run"].is_object() ||
      !record["run"].contains("name") || !record["run"]["name"].is_string() ||
      !record.contains("chain_head") || !record["chain_head"].is_string())
    return Bad("record.json altered (not a record)");
  std::string run = record["run"]["name"].get<std::string>();
  auto events = RecordEvents(record);
  if (!events.ok()) return Bad("record.json altered (" + events.status().message() + ")");
  if (Status s = VerifyEventChain(run, *events); !s.ok()) return Bad("record.json: " + s.message());
  std::string head = events->empty() ? std::string() : events->back().hash;
  if (record["chain_head"].get<std::string>() != head)
    return Bad(fmt::format("record.json: its chain head {} is not its last event's hash {}",
                           record["chain_head"].get<std::string>(), head));
  if (manifest["chain_head"].get<std::string>() != head)
    return Bad(fmt::format("chain head mismatch: record.json's is {}, manifest.json's is {}", head,
                           manifest["chain_head"].get<std::string>()));
  if (!options.expected_chain_head.empty() && options.expected_chain_head != head)
    return Bad(fmt::format(
        "chain head {} is not the server's {} for run '{}': the bundle was rewritten or is "
        "of an older state of the run",
        head, options.expected_chain_head, run));

  try {
    // The snapshot digest must follow from the file list.
    const json& snap = record.at("snapshot");
    if (!snap.at("files").empty()) {
      std::vector<SnapshotFile> snap_files;
      for (const json& f : snap.at("files"))
        snap_files.push_back({f.at("path").get<std::string>(), f.at("size").get<int64_t>(),
                              f.at("sha256").get<std::string>(), f.at("mode").get<int>()});
      if (SnapshotDigest(snap_files) != snap.at("digest").get<std::string>())
        return Bad("record.json: the snapshot digest does not match its file list");
    }
    // The config hash must follow from the canonical spec, by the server's own definition.
    const json& config = record.at("config");
    std::string config_hash = config.at("config_hash").get<std::string>();
    const json& spec = config.at("spec");
    if (!config_hash.empty() && spec.is_object() && !spec.empty() &&
        ConfigHashOf(spec) != config_hash)
      return Bad("record.json: the config hash does not match the canonical spec");
    // Logs: what the record lists as kept is in the bundle with the same hash, and nothing else.
    std::set<std::string> record_logs;
    for (const json& a : record.at("attempts")) {
      for (const json& l : a.at("logs")) {
        std::string p = l.at("path").get<std::string>();
        if (l.at("state").get<std::string>() != "kept") continue;
        record_logs.insert(p);
        auto it = seen.find(p);
        if (it == seen.end()) return Bad(p + " missing (the record lists it as kept)");
        if (it->second.sha256 != l.at("sha256").get<std::string>() ||
            it->second.size != l.at("size").get<int64_t>())
          return Bad(p + " does not match the record's sha256 for it");
      }
    }
    for (const std::string& name : order)
      if (StartsWith(name, "logs/") && !record_logs.count(name))
        return Bad("unexpected file " + name + " (the record does not list it)");
    // The checkpoint index is the record's.
    json checkpoints = json::parse(kept[kCheckpoints], nullptr, false);
    if (!checkpoints.is_object() || !checkpoints.contains("artifacts") ||
        checkpoints["artifacts"] != record.at("artifacts"))
      return Bad("checkpoints.json does not match the record's artifact index");
    // The metric summaries follow from metrics.jsonl (when it was small enough to read whole).
    if (seen[kMetrics].size <= static_cast<int64_t>(kMaxKeptBytes)) {
      int64_t malformed = 0;
      MetricHistory history;
      history.AddJsonl(kept[kMetrics], &malformed);
      if (malformed > 0) return Bad(fmt::format("metrics.jsonl has {} malformed lines", malformed));
      json series = internal::MetricSummariesJson(history.Summaries());
      const json& recorded = record.at("metrics").at("series");
      if (series != recorded) {
        for (size_t i = 0; i < std::max(series.size(), recorded.size()); ++i) {
          if (i >= series.size() || i >= recorded.size() || series[i] != recorded[i]) {
            const json& which = i < recorded.size() ? recorded[i] : series[i];
            return Bad(fmt::format(
                "metrics.jsonl does not match the record's summary of metric '{}'",
                which.value("name", "?") +
                    (which.value("split", "").empty() ? "" : "/" + which.value("split", ""))));
          }
        }
      }
    }
    if (report) {
      report->run = run;
      report->chain_head = head;
      report->tau_version = manifest.value("tau_version", "");
      report->files = static_cast<int64_t>(order.size());
      report->events = static_cast<int64_t>(events->size());
    }
  } catch (const std::exception& e) {
    return Bad(std::string("record.json altered (malformed: ") + e.what() + ")");
  }
  return Status::Ok();
}

Result<std::string> ReadBundleFile(const std::string& bundle, const std::string& name,
                                   size_t max_bytes) {
  std::string out;
  bool found = false, in_it = false;
  TAU_RETURN_IF_ERROR(internal::ReadTarGz(
      bundle,
      [&](const internal::TarEntry& e) -> Status {
        in_it = e.type == '0' && e.name == name;
        if (in_it) {
          if (static_cast<size_t>(e.size) > max_bytes)
            return ResourceExhausted(
                fmt::format("{} in {} is larger than {} bytes", name, bundle, max_bytes));
          found = true;
          out.clear();
        }
        return Status::Ok();
      },
      [&](std::string_view data) -> Status {
        if (in_it) out.append(data);
        return Status::Ok();
      }));
  if (!found) return NotFound(fmt::format("{} has no {}", bundle, name));
  return out;
}

}  // namespace tau::evidence
