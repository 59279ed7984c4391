// Evidence: what tau keeps about a run so that someone else can check what ran and what it produced
// (issue #5). This module is the library half: pure functions and file formats, no server state.
// The server fills the plain structs below from its store and its run directory; docs/evidence.md
// describes the formats and docs/evidence-record.schema.json the record.
//
// A run's evidence directory (suggested: $TAU_HOME/runs/NAME/evidence) holds:
//   record.json        the record (BuildRecord), rewritten atomically as the run moves
//   metrics.jsonl      the run's deduplicated metric points (MetricsCollector)
//   metrics-state.json where the collector stands in the job's metrics file(s)
//   gpu-samples.jsonl  GPU samples taken while the run held GPUs (AppendGpuSamples)
//
// The pieces (the server calls them in src/controller/evidence_worker.cc and
// src/server/api_evidence.cc, the CLI in src/cli/evidence_commands.cc):
//   metrics    ParseMetricLine / ReadMetrics / MetricHistory / MetricsCollector /
//              CompactMetricsFile (sorting in bounded memory) / MaskSecrets
//   record     BuildRecord from RecordInput (ParseRecord back); ScanArtifacts, ScanSnapshot,
//              IndexAttemptLogs, GPU samples
//   chain      VerifyEventChain: recomputes the store's event hash chain
//   bundle     ExportBundle (.tar.gz with a manifest) and VerifyBundle
//   rendering  Sparkline, FormatMetricTable, FormatSummaryTable for `tau metrics`
//   retention  ParseRetentionPolicy (the store's due list says which runs to prune)
//
// Nothing here throws: nlohmann::json exceptions are caught inside and returned as Status.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/status.h"

namespace tau::evidence {

// "format" of record.json and manifest.json; bump on incompatible changes.
inline constexpr int kRecordFormat = 1;
inline constexpr int kBundleFormat = 1;

// =============================================================================================
// Metrics
//
// The job appends JSON lines to $TAU_METRICS_FILE, one point per line:
//   {"name": "loss", "step": 100, "value": 0.25, "split": "train", "unit": "nats",
//    "tags": {"lr": "3e-4"}}
// name (string, 1..256 bytes) and step (integer >= 0) and value are required. value is a JSON
// number, or NaN/Infinity/-Infinity: as the strings "NaN", "Infinity", "-Infinity" (also "inf",
// "-inf", "nan", any case) or as the bare tokens Python's json.dumps writes for float('nan').
// split (<= 64 bytes), unit (<= 32 bytes) are optional strings; tags an optional object of at most
// 32 entries whose values are strings, numbers or booleans (kept as text). Unknown fields are
// ignored, so a job may add a timestamp. A bad line is counted with its line number and skipped.

struct MetricPoint {
  std::string name;
  std::string split;  // "" = none
  int64_t step = 0;
  double value = 0;  // NaN and +-Inf allowed
  std::string unit;  // "" = none
  std::map<std::string, std::string> tags;
  int attempt = 0;  // which attempt wrote it (set by the caller of the readers)
};

// How a metrics source's lines are written.
enum class MetricsFormat {
  kTau,      // one point per line, as above ($TAU_METRICS_FILE)
  kHistory,  // TauGrid's metrics.history: one object per line, many series (ParseHistoryLine)
};

struct MetricLimits {
  MetricsFormat format = MetricsFormat::kTau;  // of the lines read
  size_t max_line_bytes = 64 * 1024;  // a longer line is malformed (and skipped to its end)
  size_t max_read_bytes = 64u << 20;  // read per ReadMetrics call; the rest waits for the next
  size_t max_points = 10'000'000;     // distinct points per run; more are dropped and counted
  size_t max_series = 10'000;         // distinct (name, split) per run
};

// One line (without its '\n'); the error says what is wrong. `attempt` is read from an "attempt"
// field (tau's own lines have one), else 0; the collector sets it for the job's lines.
Result<MetricPoint> ParseMetricLine(std::string_view line, const MetricLimits& limits = {});

// One line of a TauGrid metrics.history file (the run's output directory, files matching the
// spec's globs): a JSON object such as {"_step": 100, "_timestamp": 1733300000.5, "loss": 0.25,
// "train/acc": 0.9}. "_step" (an integer >= 0) is required; each other key whose value is a number
// (or NaN/Infinity as ParseMetricLine reads them) becomes a point of the series of that name at
// that step. Keys that start with '_' are the format's own ("_timestamp", "_runtime") and are not
// series; a value of another type (string, boolean, null, object, array) or a key longer than 256
// bytes is ignored and counted in `ignored`. Points are keyed by step, so "_timestamp" is read but
// not kept.
struct HistoryLine {
  std::vector<MetricPoint> points;  // in key order
  int64_t ignored = 0;              // values that were not numbers
};
Result<HistoryLine> ParseHistoryLine(std::string_view line, const MetricLimits& limits = {});

// tau's own form of a point: one JSON object, no newline, with "attempt"; the value is a number or
// one of the strings "NaN", "Infinity", "-Infinity". ParseMetricLine reads it back.
std::string MetricPointJson(const MetricPoint& point);

struct MalformedLine {
  int64_t line = 0;  // 1-based line number in the source file
  std::string error;
};

// Where reading a metrics file stands; keep it between calls (MetricsCollector persists it).
struct MetricsCursor {
  int64_t offset = 0;         // bytes consumed: complete lines only
  int64_t line = 0;           // lines consumed
  bool discarding = false;    // inside an over-long line: skip to its end
  uint64_t dev = 0, ino = 0;  // the file read so far; another file (replaced) restarts at 0
  // The last bytes consumed (at most 32): a file truncated and written again past the offset (a
  // retried attempt that opens it with "w") no longer has them there, and is read from its start.
  std::string tail;
};

struct MetricsChunk {
  std::vector<MetricPoint> points;       // in file order; attempt as the line says (else 0)
  std::vector<MalformedLine> malformed;  // the first 100 of this chunk
  int64_t malformed_count = 0;
  int64_t point_count = 0;     // valid points parsed (MetricsCollector::Poll leaves `points` empty)
  int64_t ignored_values = 0;  // kHistory: values that were not numbers
  int64_t lines = 0;           // complete lines consumed (blank lines included)
  bool restarted = false;      // the file shrank or was replaced, so it was read from its start
  bool more = false;           // stopped at limits.max_read_bytes with more of the file there
  size_t peak_buffer_bytes = 0;  // the largest read buffer held
};

// Pure: parses the complete lines of `data`, the bytes of a file from cursor->offset on, and
// advances the cursor past them. A last line without '\n' is left for the next call.
MetricsChunk ParseMetricsChunk(std::string_view data, MetricsCursor* cursor,
                               const MetricLimits& limits = {});
// Reads what was appended to the file at `path` since `cursor` (at most limits.max_read_bytes). A
// missing file is not an error: nothing new.
Result<MetricsChunk> ReadMetrics(const std::string& path, MetricsCursor* cursor,
                                 const MetricLimits& limits = {});

// Summary of one series (name, split), over its deduplicated points.
struct MetricSummary {
  std::string name, split, unit;  // unit: the latest non-empty one
  int64_t count = 0;              // distinct steps, NaN/Inf included
  int64_t first_step = 0, last_step = 0;
  std::optional<double> min, max;  // over finite values; none when there is no finite value
  double latest = 0;               // the value at last_step (may be NaN or +-Inf)
  int latest_attempt = 0;
  int64_t nan_count = 0, inf_count = 0;
};

// A run's metric history. Points are keyed by (name, split, step): a point replaces the one with
// the same key unless that one came from a later attempt, so an attempt that resumes from a
// checkpoint and emits the steps since then again does not double them (and within one attempt the
// last write of a step wins).
class MetricHistory {
 public:
  explicit MetricHistory(MetricLimits limits = {});
  // false when the point was dropped (a limit was reached, or an older attempt's point).
  bool Add(const MetricPoint& point);
  size_t size() const { return points_; }
  int64_t replaced() const { return replaced_; }  // points that replaced an existing key
  int64_t dropped() const { return dropped_; }
  std::vector<std::pair<std::string, std::string>> SeriesKeys() const;  // sorted (name, split)
  // The points of one series in step order; empty when unknown.
  std::vector<MetricPoint> Series(const std::string& name, const std::string& split) const;
  std::vector<MetricSummary> Summaries() const;  // sorted by (name, split)
  // The history as MetricPointJson lines sorted by (name, split, step), each ending in '\n'.
  std::string ToJsonl() const;
  // Adds the lines of a ToJsonl()/MetricsCollector file (attempt from each line). Bad lines are
  // counted in *malformed (when given), not fatal.
  void AddJsonl(std::string_view text, int64_t* malformed = nullptr);

 private:
  struct Entry {
    double value;
    int attempt;
    std::map<std::string, std::string> tags;
  };
  struct SeriesData {
    std::string unit;
    std::map<int64_t, Entry> points;
  };
  MetricLimits limits_;
  std::map<std::pair<std::string, std::string>, SeriesData> series_;
  size_t points_ = 0;
  int64_t replaced_ = 0, dropped_ = 0;
};

// Totals of a run's metric ingestion (kept in metrics-state.json, shown in the record).
struct MetricsStats {
  int64_t lines = 0;           // lines read from the job's files
  int64_t points = 0;          // valid points read (before deduplication), refused ones included
  int64_t malformed = 0;       // bad lines
  int64_t ignored_values = 0;  // metrics.history values that were not numbers
  int64_t restarts = 0;        // times a source file shrank or was replaced
  int64_t refused_points = 0;  // past the run's max_points
  int64_t refused_series = 0;  // points of a new series past the run's max_series
  std::vector<std::pair<std::string, MalformedLine>> first_malformed;  // (source, line), <= 20
};

// Sorting and deduplicating a file of tau's points in bounded memory.
struct CompactOptions {
  // Points held at once (an estimate of their bytes): more are sorted into temporary files beside
  // the output (or the input) and merged.
  size_t sort_buffer_bytes = 32u << 20;
};
struct CompactReport {
  int64_t points_in = 0;              // valid lines read
  int64_t distinct = 0;               // points written (one per (name, split, step))
  int64_t replaced = 0;               // points a later one with the same key replaced
  int64_t malformed = 0;              // bad lines skipped
  std::vector<MetricSummary> series;  // sorted by (name, split), as MetricHistory::Summaries
  size_t spilled_runs = 0;     // sorted runs written to temporary files (0: sorted in memory)
  size_t peak_sort_bytes = 0;  // the most the sort held at once (estimate)
};
// Streams `in` (MetricPointJson lines; a missing file has none) into `out` ("" = only summarise),
// sorted by (name, split, step) and deduplicated as MetricHistory does (the point of the latest
// attempt wins, within one attempt the last line; each point carries its series' latest unit), in
// memory bounded by options.sort_buffer_bytes whatever the file's size. `out` is written through a
// temporary file and renamed; no file is made when `in` has no points.
Result<CompactReport> CompactMetricsFile(const std::string& in, const std::string& out,
                                         const CompactOptions& options = {});

// Reads a file of tau's points (MetricPointJson lines, such as a compaction's output) a point at a
// time through a 64 KiB buffer: a reply that streams a run's points holds one of them, whatever
// the file's size. Takes an open descriptor (closed with the reader), so a temporary file may be
// unlinked as soon as it is opened.
class MetricPointReader {
 public:
  MetricPointReader(int fd, std::string path);
  ~MetricPointReader();
  MetricPointReader(const MetricPointReader&) = delete;
  MetricPointReader& operator=(const MetricPointReader&) = delete;
  static Result<std::unique_ptr<MetricPointReader>> Open(const std::string& path);
  // false at the end; an error for a line that is not a point.
  Result<bool> Next(MetricPoint* point);

 private:
  int fd_;
  std::string path_, buf_;
  size_t pos_ = 0;
};

// A run's metrics once it ended and its file was compacted (MetricsCollector::Compact): the
// series' summaries, kept in DIR/metrics-summary.json beside the file with the file's size and
// modification time, so that a read of an ended run's metrics neither sorts nor re-reads them.
Status SaveMetricSummaries(const std::string& evidence_dir, const CompactReport& compacted);
// The kept summaries while DIR/metrics.jsonl is still the file they describe (the same size and
// time: a resumed run appends to it); nullopt otherwise, or when none were kept.
std::optional<std::vector<MetricSummary>> LoadMetricSummaries(const std::string& evidence_dir);

// What a run may make the collector keep, and what it must never show.
struct CollectorOptions {
  MetricLimits limits;  // of each line
  // Points kept over all attempts (a re-emitted step counts again); more are refused and counted.
  int64_t max_points = 5'000'000;
  // Distinct series, a series being a metric's name, split and tags; a point of a new series past
  // this is refused and counted.
  int64_t max_series = 1'000;
  // Bytes read per Poll: a run that writes faster than it is read is read in turns with the others.
  size_t max_poll_bytes = 4u << 20;
  // Values masked as "***" (MaskSecrets) in names, splits, units and tags before anything is kept.
  std::vector<std::string> secrets;
};

// Each occurrence in `text` of a value of `secrets` at least kMinSecretBytes long becomes "***"
// (the longest first, so a secret inside another is masked whole).
inline constexpr size_t kMinSecretBytes = 3;
std::string MaskSecrets(std::string_view text, const std::vector<std::string>& secrets);

// Ingests a run's metrics into its evidence directory: appends each new point to
// DIR/metrics.jsonl (tau's form, with its attempt) and keeps the cursors in
// DIR/metrics-state.json, so a restarted server goes on where it stopped (points read twice after a
// crash are deduplicated by Compact). It holds no points: what it keeps in memory is its cursors,
// the run's series (at most max_series) and buffers of at most about 1 MiB each, however large the
// file. One per run; not thread-safe.
class MetricsCollector {
 public:
  static Result<std::unique_ptr<MetricsCollector>> Open(const std::string& evidence_dir,
                                                        CollectorOptions options = {});
  // Reads the new complete lines of `source` (the attempt's $TAU_METRICS_FILE) as points of
  // `attempt`, at most options.max_poll_bytes of them (chunk.more says whether more is there). Call
  // it every few seconds while the attempt runs and, after it ended, until nothing more is there,
  // before the next attempt starts (so a shared file's lines are attributed right). Cheap when
  // nothing changed: one stat. The result counts what was read; its `points` stay empty (they go
  // to the evidence file). A failed append leaves the cursor where it was.
  // `format`: how the source's lines are written (kHistory: a metrics.history file).
  Result<MetricsChunk> Poll(const std::string& source, int attempt,
                            MetricsFormat format = MetricsFormat::kTau);
  // Rewrites metrics.jsonl sorted and deduplicated (CompactMetricsFile, atomically). Call it when
  // the run ends. A run that wrote no metrics gets no file (and no evidence directory).
  Result<CompactReport> Compact();
  const MetricsStats& stats() const { return stats_; }
  const CollectorOptions& options() const { return options_; }
  int64_t kept_points() const { return kept_; }
  size_t series_count() const { return series_.size(); }
  // The largest read or write buffer a Poll has held, in bytes: bounded by about
  // 1 MiB + a line, whatever the file's size (tests check it).
  size_t peak_buffer_bytes() const { return peak_buffer_; }

 private:
  MetricsCollector(std::string dir, CollectorOptions options);
  Status SaveState();
  // The evidence directory, made when the first file goes into it: most runs' collectors never
  // write (no metrics), and a directory made for nothing costs every run an inode.
  Status MakeDir();
  // Masks secrets, then applies the caps; false when the point is refused (and counted).
  bool Admit(MetricPoint* point);
  std::string dir_;
  bool dir_made_ = false;
  CollectorOptions options_;
  MetricsStats stats_;
  int64_t kept_ = 0;              // points in DIR/metrics.jsonl
  std::set<std::string> series_;  // keys of the series kept (SeriesKey)
  size_t peak_buffer_ = 0;
  std::map<std::string, MetricsCursor> cursors_;  // by source path
};

// The totals a collector kept in DIR/metrics-state.json (zero when there is none), without
// opening the collector.
Result<MetricsStats> LoadMetricsStats(const std::string& evidence_dir);

// Loads DIR/metrics.jsonl (or any file of MetricPointJson lines) into a history, reading it in
// blocks; a missing file gives an empty history. With `only_name`, only that metric's points are
// kept (one series of a large file, without holding the others).
Result<MetricHistory> LoadMetricHistory(const std::string& path, int64_t* malformed = nullptr,
                                        const std::string& only_name = "");

// =============================================================================================
// GPU samples

struct GpuSample {
  int64_t at_ms = 0;
  int gpu = 0;  // index on the machine
  std::string uuid;
  int attempt = 0;
  std::optional<double> util_pct, memory_util_pct;
  std::optional<int64_t> memory_used_bytes, memory_total_bytes;
  std::optional<double> temperature_c, power_w;
};

std::string GpuSampleJson(const GpuSample& sample);  // one line, no newline
Result<GpuSample> ParseGpuSample(std::string_view line);
// Appends samples to DIR/gpu-samples.jsonl (no fsync: samples are not worth a disk flush each).
Status AppendGpuSamples(const std::string& evidence_dir, const std::vector<GpuSample>& samples);
// Reads a gpu-samples.jsonl file; a missing file gives none; bad lines are skipped and counted.
Result<std::vector<GpuSample>> LoadGpuSamples(const std::string& path,
                                              int64_t* malformed = nullptr);

struct GpuSampleSummary {
  int gpu = 0;
  std::string uuid;
  int64_t count = 0;
  int64_t first_ms = 0, last_ms = 0;
  std::optional<double> mean_util_pct, max_util_pct, max_temperature_c, max_power_w;
  std::optional<int64_t> max_memory_used_bytes;
};
std::vector<GpuSampleSummary> SummarizeGpuSamples(const std::vector<GpuSample>& samples);

// =============================================================================================
// The record

struct RunInfo {
  std::string name, spec_name;
  std::string state;  // store::RunStateName
  std::string reason, message;
  std::optional<int> exit_code, signal;
  std::string workspace, queue;
  int priority = 0;
  nlohmann::json resources = nlohmann::json::object();
  int64_t created_ms = 0;
  std::optional<int64_t> admitted_ms, started_ms, finished_ms;
};

struct ProvenanceEntry {
  std::string field, value, source;
};

struct ConfigInfo {
  std::string spec_file;                                // as the user named it
  std::string spec_yaml;                                // the spec as written
  nlohmann::json spec_json = nlohmann::json::object();  // canonical (spec::ToJson)
  std::string config_hash;                              // spec::ConfigHash
  nlohmann::json resolved = nlohmann::json::object();   // the effective settings
  std::vector<ProvenanceEntry> provenance;              // where each resolved value came from
};

struct SnapshotFile {
  std::string path;
  int64_t size = 0;
  std::string sha256;
  int mode = 0644;
};
struct SnapshotInfo {
  std::string digest;  // as the server's StoreSnapshot computes it (SnapshotDigest)
  std::vector<SnapshotFile> files;
};
// The digest of a file list: sha256 over "path\0mode-in-octal\0sha256\n" for each file sorted by
// path, the same as the server's code snapshots.
std::string SnapshotDigest(std::vector<SnapshotFile> files);
// Lists and hashes a stored snapshot directory (regular files only; symlinks are refused).
Result<SnapshotInfo> ScanSnapshot(const std::string& dir);

struct GpuDevice {
  int index = 0;
  std::string uuid, name;
};
struct RuntimeInfo {
  std::string image, image_digest;    // "" on the local backend
  std::vector<std::string> pip;       // requirements as the spec gave them
  std::vector<std::string> packages;  // resolved ("name==version"), e.g. from `pip freeze`
  std::string python_version, host, os, kernel, driver_version, cuda_version;
  std::vector<GpuDevice> gpus;  // the GPUs the run used
  std::string tau_version;
};

// One row of the store's events table.
struct EventInfo {
  int64_t id = 0;
  int64_t ts_ms = 0;
  std::string type, message;
  nlohmann::json data = nlohmann::json::object();
  std::string prev_hash, hash;
};

// The store's chain hash of an event: sha256(prev_hash + "\n" + {run, ts_ms, type, message,
// data}.dump()). Throws nothing; invalid UTF-8 gives an error.
Result<std::string> EventHash(const std::string& run, const EventInfo& event,
                              const std::string& prev_hash);
// Recomputes the chain; the error names the first event (1-based position, id, type) whose
// prev_hash or hash does not match. OK for an empty list.
Status VerifyEventChain(const std::string& run, const std::vector<EventInfo>& events);

enum class LogState { kKept, kPruned, kLost };  // kLost: gone without a retention decision
struct LogInfo {
  int rank = 0;
  int64_t size = 0;
  std::string sha256;
  LogState state = LogState::kKept;
};
// Hashes one log file (streaming).
Result<LogInfo> IndexLog(const std::string& path, int rank);
// The logs of an attempt directory: DIR/logs/rank-R.log for each R found.
Result<std::vector<LogInfo>> IndexAttemptLogs(const std::string& attempt_dir);

struct AttemptInfo {
  int number = 1;
  std::string state;  // store::AttemptStateName
  std::vector<int> gpus;
  int64_t started_ms = 0;
  std::optional<int64_t> ended_ms;
  std::optional<int> exit_code, signal;
  std::string outcome;        // runtime outcome
  std::string failure_class;  // Succeeded, UserError, OOMKilled, ...
  std::string message;
  nlohmann::json diagnosis = nlohmann::json::object();
  std::vector<LogInfo> logs;  // indexed when the attempt ended (IndexAttemptLogs)
};

// A file found among a run's checkpoints or outputs.
struct Artifact {
  std::string kind;  // "checkpoint" or "output"
  std::string path;  // relative to its root
  int64_t size = 0;
  std::string sha256;
  int attempt = 0;  // the attempt running when it was written (by modification time); 0: unknown
  int64_t mtime_ms = 0;
};
// Lists and hashes the regular files under `root` (recursively; symlinks are skipped, not
// followed; files being written by the checkpoint protocol's temporary names are skipped). The
// attempt of each file is the last attempt that started at or before its modification time
// (`attempt_starts[i]` = start of attempt i+1, in ms). A file found in `previous` with the same
// path, size and mtime keeps its sha256 there without being read again (checkpoints are large).
Result<std::vector<Artifact>> ScanArtifacts(const std::string& root, const std::string& kind,
                                            const std::vector<int64_t>& attempt_starts,
                                            const std::vector<Artifact>* previous = nullptr);

// The files ScanArtifacts would find under `root`, without reading them: at most `max_files`
// (*truncated says whether more were there; which ones are listed then depends on the walk), sorted
// by path. sha256 is set only where `previous` has the file with the same path, size and mtime.
Result<std::vector<Artifact>> ListArtifacts(const std::string& root, const std::string& kind,
                                            size_t max_files, const std::vector<Artifact>* previous,
                                            bool* truncated);

// Masks secrets (MaskSecrets) in the artifacts' paths: a checkpoint named after a token is listed
// as "ckpt-***.pt" in the record, its summary and a bundle's checkpoints.json.
void MaskArtifactPaths(std::vector<Artifact>* artifacts, const std::vector<std::string>& secrets);

struct MetricsInfo {
  MetricsStats stats;
  int64_t distinct_points = 0;  // after deduplication
  int64_t replaced = 0;         // points replaced by a later one with the same key
  int64_t dropped = 0;
  std::vector<MetricSummary> series;
};
// From a loaded history, or from a compaction (CompactMetricsFile) of the collector's file.
MetricsInfo MetricsInfoFrom(const MetricHistory& history, const MetricsStats& stats);
MetricsInfo MetricsInfoFrom(const CompactReport& compacted, const MetricsStats& stats);

struct RetentionState {
  std::optional<int64_t> logs_pruned_ms, samples_pruned_ms;
};

// A workflow stage's upstream run, as the stage was given it: the run, how it ended, and the
// checkpoint it handed on with that checkpoint's digest (CheckpointDigest), so a record names
// exactly what its run consumed.
struct LineageEntry {
  std::string stage, run, state;
  std::string checkpoint;         // its path ("" when the upstream run left none)
  std::string checkpoint_sha256;  // CheckpointDigest ("" without a checkpoint, or if unreadable)
  int64_t checkpoint_files = 0, checkpoint_bytes = 0;
  std::string output_dir;
};

// The digest of one checkpoint among `artifacts` (the files of a checkpoint directory, paths
// relative to it), `path` relative to the same directory: a file's own sha256, or for a
// checkpoint that is a directory the sha256 of its files' "SHA256  PATH\n" lines (paths relative
// to it, sorted), as `sha256sum` prints them. "" when no file is under it.
struct CheckpointSum {
  std::string sha256;
  int64_t files = 0, bytes = 0;
};
CheckpointSum CheckpointDigest(const std::vector<Artifact>& artifacts, const std::string& path);

struct RecordInput {
  RunInfo run;
  ConfigInfo config;
  SnapshotInfo snapshot;
  RuntimeInfo runtime;
  std::vector<EventInfo> events;  // in id order
  std::vector<AttemptInfo> attempts;
  MetricsInfo metrics;
  std::vector<GpuSampleSummary> gpu_samples;
  std::vector<Artifact> artifacts;
  std::vector<LineageEntry> lineage;  // a workflow stage's upstream runs (empty otherwise)
  RetentionState retention;
  int64_t updated_ms = 0;  // when this record was assembled
};

// The record as JSON (docs/evidence-record.schema.json). Deterministic for the same input.
nlohmann::json BuildRecord(const RecordInput& in);
// Writes DIR/record.json atomically (the server keeps it after the run's processes are gone).
// kSynced where the record must outlive a crash of the machine: where it is the only copy of what
// it says (the hashes of pruned logs). A final record that the store and the run's files can make
// again (and the server does, when it finds none, or one older than the run's last event) needs
// only kProcessCrash.
Status SaveRecord(const std::string& evidence_dir, const nlohmann::json& record,
                  Durability durability = Durability::kSynced);
Result<nlohmann::json> LoadRecord(const std::string& path);
// The inverse of BuildRecord: a saved record back into its input, so that the server can carry
// forward what it computed once (snapshot files, runtime, each attempt's log hashes, artifacts,
// retention) and replace only what changed before building and saving it again.
// ParseRecord(BuildRecord(x)) builds the same JSON as x.
Result<RecordInput> ParseRecord(const nlohmann::json& record);
// The events of a record JSON (for VerifyEventChain); errors name the bad field.
Result<std::vector<EventInfo>> RecordEvents(const nlohmann::json& record);
// A readable summary of a record for `tau evidence RUN`.
std::string FormatRecordSummary(const nlohmann::json& record);

// =============================================================================================
// Bundles: a .tar.gz with
//   logs/attempt-N/rank-R.log   each kept log
//   metrics.jsonl               the deduplicated metric history
//   gpu-samples.jsonl           GPU samples (absent when there are none)
//   checkpoints.json            the artifact index (checkpoints and outputs)
//   record.json                 the record, its log entries filled from the logs in the bundle
//   manifest.json               last: sha256 and size of every other file, the chain head, and
//                               its own digest

struct LogSource {
  int attempt = 1;
  int rank = 0;
  std::string path;  // on disk
};

struct BundleSources {
  std::vector<LogSource> logs;
  std::string metrics_path;      // DIR/metrics.jsonl ("" or missing: no points)
  std::string gpu_samples_path;  // DIR/gpu-samples.jsonl ("" or missing: none)
};

struct ExportReport {
  std::string chain_head;
  int64_t files = 0;
  int64_t bytes_in = 0;   // uncompressed
  int64_t bytes_out = 0;  // the .tar.gz
};

// Writes the bundle to `out_path` (through a temporary file, renamed when complete). Logs are
// streamed, never held whole. A log whose recorded sha256 (from IndexAttemptLogs) differs from the
// file now is refused: it changed after it was recorded. A kept log without a source becomes kLost
// in the bundled record. Metric summaries in the bundled record are recomputed from the history.
Result<ExportReport> ExportBundle(RecordInput record, const BundleSources& sources,
                                  const std::string& out_path, int64_t now_ms);

struct VerifyOptions {
  // The chain head the server holds for the run (its last event's hash). A bundle rewritten
  // consistently (files, record, chain and manifest all recomputed) passes every check inside the
  // bundle; only this comparison catches it.
  std::string expected_chain_head;
};
struct VerifyReport {
  std::string run, chain_head, tau_version;
  int64_t files = 0, events = 0;
};
// OK when the bundle is intact. Otherwise an error (code kInvalidArgument, or kIo / kNotFound for a
// file that cannot be read) whose message names the first problem found, in this order:
// the archive (corrupt gzip or tar, unsafe or duplicate or non-regular entries), manifest.json
// (missing, unreadable, altered), each file in manifest order (missing, altered), files the
// manifest does not list (unexpected), the event chain (broken at event K), chain heads (record vs
// manifest vs expected), the snapshot digest and config hash, and the record's own cross-references
// (log hashes, checkpoint index, metric summaries).
Status VerifyBundle(const std::string& path, const VerifyOptions& options = {},
                    VerifyReport* report = nullptr);
// The content of one file of a bundle (for `tau evidence` on a bundle; tests). Limited to
// `max_bytes`.
Result<std::string> ReadBundleFile(const std::string& bundle, const std::string& name,
                                   size_t max_bytes = 256u << 20);

// =============================================================================================
// Rendering for `tau metrics`

// One character per column: ▁▂▃▄▅▆▇█ scaled between the finite min and max; at most `width`
// columns (values are averaged into buckets when there are more); NaN/Inf-only buckets are ' '.
std::string Sparkline(const std::vector<double>& values, size_t width = 60);
// "STEP  VALUE  ATTEMPT" rows of one series, aligned.
std::string FormatMetricTable(const std::vector<MetricPoint>& points);
// One row per series: NAME SPLIT COUNT STEPS MIN MAX LATEST NAN INF, and a sparkline column when
// `history` is given (width `spark_width`).
std::string FormatSummaryTable(const std::vector<MetricSummary>& summaries,
                               const MetricHistory* history = nullptr, size_t spark_width = 30);
// A value as people read it: up to 6 significant digits, "NaN", "Inf", "-Inf".
std::string FormatValue(double value);

// =============================================================================================
// Retention

struct RetentionPolicy {
  // How long after a run ends its logs and GPU samples are kept; 0 keeps them forever. The record
  // (with each log's size and sha256), metric history, checkpoint index and event chain stay.
  int64_t keep_logs_ms = 0;
  int64_t keep_samples_ms = 0;
};
// "logs=30d,samples=7d" (durations as in common/clock.h; "forever" or "0" keeps).
Result<RetentionPolicy> ParseRetentionPolicy(std::string_view text);

}  // namespace tau::evidence
