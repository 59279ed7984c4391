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

#include "common/log_file.h"
#include "common/status.h"
#include "runtime/proc.h"

namespace tau::runtime::internal {

// DIR/notices.jsonl: one JSON object a line, appended. Created on the first notice (an attempt
// without any leaves no file). What the disk refuses is kept and written by a later Flush, so a
// line is never lost nor left half-written.
class NoticeWriter final : public LogNotices {
 public:
  explicit NoticeWriter(std::string path) : path_(std::move(path)) {}
  void Add(const std::string& type, const std::string& message, nlohmann::json data) override;
  // Writes what is pending; true when nothing is left.
  bool Flush();
  bool pending() const { return !pending_.empty(); }

 private:
  const std::string path_;
  UniqueFd fd_;
  std::string pending_;
};

// A rank's log (its masking, cap and drops) is common/log_file.h's, shared with the Kubernetes
// backend.
using ::tau::LogFile;

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
