#include "common/log_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/clock.h"

namespace tau {

using json = nlohmann::json;

namespace {

// How long a log the disk refused waits before it is tried again.
constexpr int64_t kRetryMs = 1000;

std::string ErrnoName(int err) {
  const char* name = ::strerrorname_np(err);
  return name ? name : std::to_string(err);
}

}  // namespace

LogFile::LogFile(int rank, std::string path, int fd, int64_t cap_bytes, int64_t attempt_cap,
                 size_t workers, const std::vector<std::string>& secrets, LogNotices* notices)
    : rank_(rank),
      path_(std::move(path)),
      fd_(fd),
      cap_(cap_bytes > 0 ? std::max(cap_bytes, kMinRankCap) : 0),
      attempt_cap_(attempt_cap),
      workers_(workers),
      redactor_(secrets),
      notices_(notices) {
  struct stat st;
  if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) size_ = st.st_size;
}

LogFile::~LogFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LogFile::Write(std::string_view data) {
  if (redactor_.empty()) return Append(data);
  Append(redactor_.Feed(data, /*flush=*/false));
}

void LogFile::Finish() {
  if (!redactor_.empty()) Append(redactor_.Feed("", /*flush=*/true));
  if (drop_errno_ != 0 && !EndDropEpisode()) {
    notices_->Add("OutputDropped",
                  std::to_string(dropped_now_) + " bytes of rank " + std::to_string(rank_) +
                      "'s output were dropped: its log could not be written until the attempt "
                      "ended (" +
                      std::strerror(drop_errno_) + ")",
                  {{"rank", rank_},
                   {"bytes", dropped_now_},
                   {"errno", ErrnoName(drop_errno_)},
                   {"ended", true}});
  }
}

void LogFile::Append(std::string_view data) {
  if (data.empty()) return;
  if (drop_errno_ != 0) {
    if (MonotonicMillis() < retry_at_ms_ || !EndDropEpisode()) return Drop(data.size(), errno);
  }
  if (cap_ > 0) {
    const int64_t keep = cap_ / 2;
    bool rotate = size_ + static_cast<int64_t>(data.size()) > cap_;
    if (static_cast<int64_t>(data.size()) > keep) {
      // More than a log keeps arrived at once: only its end survives.
      truncated_ += static_cast<int64_t>(data.size()) - keep;
      data.remove_prefix(data.size() - static_cast<size_t>(keep));
      rotate = true;
    }
    if (rotate && !Rotate(data.size())) return Drop(data.size(), errno);
  }
  const int64_t before = size_;
  if (!WriteOut(data)) Drop(data.size() - static_cast<size_t>(size_ - before), errno);
}

bool LogFile::WriteOut(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {
      errno = EIO;
      return false;
    }
    size_ += n;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// The new file is written beside the old one and renamed over it, so a reader of rank-R.log sees
// one whole file or the other, never a half-copied one; a reader following the old file by its
// descriptor reads it to its end and then finds the new one (the marker says where it starts).
bool LogFile::Rotate(size_t incoming) {
  const int64_t keep_old = std::max<int64_t>(0, cap_ / 2 - static_cast<int64_t>(incoming));
  int64_t from = std::max(header_, size_ - keep_old);
  // Start the kept part at a line's start when one is near.
  if (from > header_ && from < size_) {
    char buf[4096];
    ssize_t n = ::pread(fd_, buf, sizeof buf, from - 1);
    if (n > 0)
      if (const void* nl = std::memchr(buf, '\n', static_cast<size_t>(n)))
        from += static_cast<const char*>(nl) - buf;
  }
  const int64_t truncated_before = truncated_;
  truncated_ += from - header_;
  const std::string marker =
      "[tau] " + std::to_string(truncated_) +
      " bytes of earlier output dropped: the log reached its cap of " + std::to_string(cap_) +
      " bytes (limits.max_log_bytes " + std::to_string(attempt_cap_) + " for the attempt's " +
      std::to_string(workers_) + " worker(s)); raise limits.max_log_bytes to keep more\n";
  const std::string tmp = path_ + ".cut";
  // Read and write: the next cut copies from it.
  int out = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (out < 0) return false;
  auto fail = [&] {
    int err = errno;
    ::close(out);
    ::unlink(tmp.c_str());
    errno = err;
    return false;
  };
  std::swap(out, fd_);
  const int64_t old_size = std::exchange(size_, 0);
  const int64_t old_header = header_;
  bool ok = WriteOut(marker);
  header_ = size_;
  // The kept part, copied in the kernel where it can.
  for (off_t at = from; ok && at < old_size;) {
    ssize_t n = ::copy_file_range(out, &at, fd_, nullptr, static_cast<size_t>(old_size - at), 0);
    if (n > 0) {
      size_ += n;
      continue;
    }
    if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
                  errno == EBADF)) {
      char buf[65536];
      ssize_t got = ::pread(out, buf, std::min<int64_t>(sizeof buf, old_size - at), at);
      if (got > 0 && WriteOut(std::string_view(buf, static_cast<size_t>(got)))) {
        at += got;
        continue;
      }
    }
    if (n == 0) errno = EIO;
    ok = false;
  }
  if (!ok || ::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::swap(out, fd_);
    size_ = old_size;
    header_ = old_header;
    truncated_ = truncated_before;
    return fail();
  }
  ::close(out);  // the old file
  if (!told_truncated_) {
    told_truncated_ = true;
    notices_->Add(
        "LogTruncated",
        "rank " + std::to_string(rank_) + "'s log reached its cap of " + std::to_string(cap_) +
            " bytes: its oldest output is dropped to keep the newest (limits."
            "max_log_bytes is " +
            std::to_string(attempt_cap_) + " for the attempt's " + std::to_string(workers_) +
            " worker(s))",
        {{"rank", rank_}, {"bytes", truncated_}, {"limit", cap_}, {"max_log_bytes", attempt_cap_}});
  }
  return true;
}

void LogFile::Drop(size_t bytes, int err) {
  if (drop_errno_ == 0) {
    drop_errno_ = err == 0 ? EIO : err;
    dropped_now_ = 0;
    notices_->Add("OutputDropped",
                  "rank " + std::to_string(rank_) +
                      "'s output is being dropped: its log cannot be written (" +
                      std::strerror(drop_errno_) + ")",
                  {{"rank", rank_},
                   {"bytes", static_cast<int64_t>(bytes)},
                   {"errno", ErrnoName(drop_errno_)},
                   {"ended", false}});
  }
  dropped_now_ += static_cast<int64_t>(bytes);
  retry_at_ms_ = MonotonicMillis() + kRetryMs;
}

// The disk takes writes again: the log says what it lost, then goes on.
bool LogFile::EndDropEpisode() {
  const std::string marker = "[tau] " + std::to_string(dropped_now_) +
                             " bytes of output dropped: the log could not be written (" +
                             std::strerror(drop_errno_) + ")\n";
  if (!WriteOut(marker)) {
    retry_at_ms_ = MonotonicMillis() + kRetryMs;
    return false;
  }
  notices_->Add("OutputDropped",
                std::to_string(dropped_now_) + " bytes of rank " + std::to_string(rank_) +
                    "'s output were dropped while its log could not be written (" +
                    std::strerror(drop_errno_) + ")",
                {{"rank", rank_},
                 {"bytes", dropped_now_},
                 {"errno", ErrnoName(drop_errno_)},
                 {"ended", true}});
  drop_errno_ = 0;
  dropped_now_ = 0;
  return true;
}

}  // namespace tau
