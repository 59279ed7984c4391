// The shim's log pump (internal to the runtime module): each worker writes its stdout and stderr
// into a pipe; a thread of the shim reads every pipe and writes logs/rank-R.log, masking the run's
// secrets, keeping each log under its share of the attempt's cap (the newest output is kept) and
// counting what a full disk made it drop. What the server should record as events goes to
// DIR/notices.jsonl (see runtime.h). The pipes are always read, so a worker never blocks on its
// output, whatever the disk does.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/redact.h"
#include "common/status.h"
#include "runtime/proc.h"

namespace tau::runtime::internal {

// DIR/notices.jsonl: one JSON object a line, appended. Created on the first notice (an attempt
// without any leaves no file). What the disk refuses is kept and written by a later Flush, so a
// line is never lost nor left half-written.
class NoticeWriter {
 public:
  explicit NoticeWriter(std::string path) : path_(std::move(path)) {}
  void Add(const std::string& type, const std::string& message, nlohmann::json data);
  // Writes what is pending; true when nothing is left.
  bool Flush();
  bool pending() const { return !pending_.empty(); }

 private:
  const std::string path_;
  UniqueFd fd_;
  std::string pending_;
};

// One rank's log file, written by one thread.
class LogFile {
 public:
  // `fd`: the open log at `path`. `cap_bytes` 0: no cap. `workers` and `attempt_cap` are for
  // the marker's and the notice's words.
  LogFile(int rank, std::string path, UniqueFd fd, int64_t cap_bytes, int64_t attempt_cap,
          size_t workers, const std::vector<std::string>& secrets, NoticeWriter* notices);
  void Write(std::string_view data);
  // The end of the output: releases what the redactor held back and says what was dropped.
  void Finish();
  // Whether output is being dropped because the log cannot be written (a full disk).
  bool dropping() const { return drop_errno_ != 0; }
  int64_t size() const { return size_; }

 private:
  void Append(std::string_view data);
  // Writes all of `data` at the end of the file (size_ counts what went); false (errno set) when
  // the disk refuses.
  bool WriteOut(std::string_view data);
  // Starts a new file holding the marker and the newest part of the old one.
  bool Rotate(size_t incoming);
  void Drop(size_t bytes, int err);
  bool EndDropEpisode();

  const int rank_;
  const std::string path_;
  UniqueFd fd_;
  const int64_t cap_;
  const int64_t attempt_cap_;
  const size_t workers_;
  Redactor redactor_;
  NoticeWriter* const notices_;
  int64_t size_ = 0;             // bytes in the file
  int64_t header_ = 0;           // of which the marker line at its start
  int64_t truncated_ = 0;        // bytes of output dropped to keep under the cap, in all
  bool told_truncated_ = false;  // the LogTruncated notice is written once
  int drop_errno_ = 0;           // set while the disk refuses our writes
  int64_t dropped_now_ = 0;      // bytes dropped in the current episode
  int64_t retry_at_ms_ = 0;      // when to try writing again
};

class LogPump {
 public:
  // Opens (appending) DIR/logs/rank-R.log for `workers` ranks and a pipe for each. `max_bytes`:
  // the attempt's cap for all its logs together (0: none), split evenly.
  static Result<std::unique_ptr<LogPump>> Create(const std::string& dir, size_t workers,
                                                 int64_t max_bytes,
                                                 const std::vector<std::string>& secrets);
  // A pump over files the caller opened (tests: a log on /dev/full).
  static Result<std::unique_ptr<LogPump>> ForFiles(std::vector<std::unique_ptr<LogFile>> files,
                                                   std::unique_ptr<NoticeWriter> notices);
  ~LogPump();

  // What rank R's process writes into (blocking, close-on-exec): its stdout and stderr. The shim
  // writes its own lines for rank 0 there too, so they stay in order with the output.
  int write_fd(size_t rank) const { return pipes_[rank].write.get(); }
  void Start();
  // Closes the write ends, reads what is left until every pipe is closed by every process that had
  // it (or `timeout_ms` passes), finishes the files and writes the notices. Idempotent.
  void Finish(int64_t timeout_ms);
  // Retries notices the disk refused; true when none is left.
  bool FlushNotices() { return notices_->Flush(); }

 private:
  LogPump() = default;
  void Run();
  struct Pipe {
    UniqueFd read, write;
    bool open = true;
  };
  std::vector<Pipe> pipes_;
  std::vector<std::unique_ptr<LogFile>> files_;
  std::unique_ptr<NoticeWriter> notices_;
  UniqueFd wake_read_, wake_write_;
  std::atomic<int64_t> stop_at_ms_{-1};  // monotonic; set by Finish
  std::thread thread_;
  bool finished_ = false;
};

}  // namespace tau::runtime::internal
