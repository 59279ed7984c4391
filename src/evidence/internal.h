// Internals of the evidence module shared by its .cc files and its test: JSON text helpers and the
// streaming .tar.gz writer and reader behind bundles. Not part of the public API (evidence.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evidence/evidence.h"

namespace tau::evidence::internal {

// Closes a file descriptor when it goes out of scope (the evidence files opened by OpenRunFile and
// their like).
struct ClosesFd {
  explicit ClosesFd(int f) : fd(f) {}
  ~ClosesFd();
  ClosesFd(const ClosesFd&) = delete;
  ClosesFd& operator=(const ClosesFd&) = delete;
  int fd;
};

// Appends `s` as a JSON string literal (quotes included). `s` must be valid UTF-8 (it came from a
// JSON parser or from tau itself); control characters are escaped.
void AppendJsonString(std::string* out, std::string_view s);
// A double as JSON: the shortest text that reads back to the same value, or the strings "NaN",
// "Infinity", "-Infinity".
void AppendJsonDouble(std::string* out, double v);
// Reads "NaN"/"Infinity"/"-Infinity"/"inf"/"-inf"/"nan" (any case, optional '+').
bool ParseNonFiniteWord(std::string_view s, double* out);

// Reads the complete lines of `path` from cursor->offset on (at most limits.max_read_bytes, in
// blocks of 1 MiB), handing each valid point to `sink` as it is parsed: nothing is collected.
using PointSink = std::function<void(MetricPoint&&)>;
Result<MetricsChunk> ReadPointLines(const std::string& path, MetricsCursor* cursor,
                                    const MetricLimits& limits, const PointSink& sink);

// "logs/attempt-N/rank-R.log": a log's path inside a bundle (and in the record).
std::string LogPath(int attempt, int rank);
nlohmann::json ArtifactJson(const Artifact& a);
nlohmann::json MetricSummariesJson(const std::vector<MetricSummary>& series);

// Opens a file a run may have written (a log, a checkpoint, the metrics file) for reading, refusing
// anything but a regular file reached without a final symbolic link: a run must not make tau read
// (and hash, or copy into a bundle) a file outside its directories, nor block tau on a FIFO. ENOENT
// is NotFound; a link, FIFO, device or directory is InvalidArgument naming the path. The caller
// closes the descriptor.
Result<int> OpenRunFile(const std::string& path);
// ReadFileChunks over OpenRunFile.
Status ReadRunFileChunks(const std::string& path,
                         const std::function<void(std::string_view)>& chunk);

// The checkpoint protocol's temporary names: *.tmp, *.partial, *.incomplete, or a leading '.'.
bool IsTemporaryName(std::string_view name);

// Writes a ustar archive compressed with gzip, streaming. Entries are regular files only; names
// are relative, '/'-separated and at most 255 bytes (split into ustar's prefix and name).
class TarGzWriter {
 public:
  static Result<std::unique_ptr<TarGzWriter>> Create(const std::string& path);
  ~TarGzWriter();
  // Starts an entry of exactly `size` bytes; Write() must then give exactly that many.
  Status Begin(const std::string& name, int64_t size, int64_t mtime_s, int mode = 0644);
  Status Write(std::string_view data);
  Status End();
  Status Add(const std::string& name, std::string_view data, int64_t mtime_s);
  // Writes the end-of-archive blocks, flushes, fsyncs and closes.
  Status Finish();
  int64_t bytes_out() const { return bytes_out_; }

 private:
  TarGzWriter() = default;
  Status Deflate(std::string_view data, bool finish);
  struct Z;
  std::unique_ptr<Z> z_;
  int fd_ = -1;
  int64_t remaining_ = 0, written_in_entry_ = 0;
  int64_t bytes_out_ = 0;
  bool in_entry_ = false;
};

// One entry of an archive as the reader sees it.
struct TarEntry {
  std::string name;
  char type = '0';  // ustar typeflag
  int64_t size = 0;
  int mode = 0;
  std::string link;  // for links
};

// Reads a .tar.gz, streaming: `on_entry` is called for each header, then `on_data` with the
// entry's bytes in chunks (for every entry type; size 0 for most non-files). Either returning
// non-OK stops the walk with that status. Corrupt gzip or tar gives kInvalidArgument naming the
// offset. No entry is written to disk, so a hostile name cannot escape anywhere here; callers
// check names with SafeEntryName.
Status ReadTarGz(const std::string& path, const std::function<Status(const TarEntry&)>& on_entry,
                 const std::function<Status(std::string_view)>& on_data);
// A plain relative path: no '..' or '.' components, not absolute, no empty components, no '\\'.
bool SafeEntryName(std::string_view name);

}  // namespace tau::evidence::internal
