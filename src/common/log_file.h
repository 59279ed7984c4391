// One rank's log file as a run's output is written into it: the run's secrets masked (redact.h),
// kept under a cap by dropping the oldest output (the newest is what one reads after a failure),
// and what a full disk made it drop counted. Written by one thread. The shim's log pump writes its
// workers' logs with it (runtime/log_pump.h), the Kubernetes backend its pods' logs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/redact.h"

namespace tau {

// Where a log says what the server should record as events of the run (LogTruncated,
// OutputDropped): a file the server reads (the shim's), or the server's inbox (Kubernetes).
class LogNotices {
 public:
  virtual ~LogNotices() = default;
  virtual void Add(const std::string& type, const std::string& message, nlohmann::json data) = 0;
};

class LogFile {
 public:
  // Below this a cap would keep too little to read: a gang of many ranks under a small limit gets
  // at least this much each.
  static constexpr int64_t kMinRankCap = 4096;

  // `fd`: the log open at `path` for reading and appending; the LogFile closes it. `cap_bytes` 0:
  // no cap. `workers` and `attempt_cap` are for the marker's and the notice's words.
  LogFile(int rank, std::string path, int fd, int64_t cap_bytes, int64_t attempt_cap,
          size_t workers, const std::vector<std::string>& secrets, LogNotices* notices);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  void Write(std::string_view data);
  // The end of the output: releases what the redactor held back and says what was dropped.
  void Finish();
  // Whether output is being dropped because the log cannot be written (a full disk).
  bool dropping() const { return drop_errno_ != 0; }
  int64_t size() const { return size_; }
  // Bytes written to Write that are neither in the file nor dropped yet: the redactor holds them
  // back (they may begin a secret) until more output or Finish.
  size_t held() const { return redactor_.held(); }

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
  int fd_;
  const int64_t cap_;
  const int64_t attempt_cap_;
  const size_t workers_;
  Redactor redactor_;
  LogNotices* const notices_;
  int64_t size_ = 0;             // bytes in the file
  int64_t header_ = 0;           // of which the marker line at its start
  int64_t truncated_ = 0;        // bytes of output dropped to keep under the cap, in all
  bool told_truncated_ = false;  // the LogTruncated notice is said once
  int drop_errno_ = 0;           // set while the disk refuses our writes
  int64_t dropped_now_ = 0;      // bytes dropped in the current episode
  int64_t retry_at_ms_ = 0;      // when to try writing again
};

}  // namespace tau
