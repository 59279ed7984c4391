#include "runtime/log_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"

namespace tau::runtime::internal {

using json = nlohmann::json;

namespace {

// Below this a cap would keep too little to read; a gang of many ranks under a small limit gets
// at least this much each.
constexpr int64_t kMinRankCap = 4096;
// How long a log the disk refused waits before it is tried again.
constexpr int64_t kRetryMs = 1000;

std::string ErrnoName(int err) {
  const char* name = ::strerrorname_np(err);
  return name ? name : std::to_string(err);
}

}  // namespace

// ---- NoticeWriter ----

void NoticeWriter::Add(const std::string& type, const std::string& message, json data) {
  json line = {{"type", type}, {"message", message}, {"data", std::move(data)}};
  pending_ += line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  Flush();
}

bool NoticeWriter::Flush() {
  if (pending_.empty()) return true;
  if (!fd_.valid()) {
    fd_ = UniqueFd(
        ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd_.valid()) return false;
  }
  // One write for all that is pending: a reader sees whole lines, or a line whose end is still to
  // come (which it leaves for later).
  while (!pending_.empty()) {
    ssize_t n = ::write(fd_.get(), pending_.data(), pending_.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pending_.erase(0, static_cast<size_t>(n));
  }
  return true;
}

// ---- LogFile ----

LogFile::LogFile(int rank, std::string path, UniqueFd fd, int64_t cap_bytes, int64_t attempt_cap,
                 size_t workers, const std::vector<std::string>& secrets, NoticeWriter* notices)
    : rank_(rank),
      path_(std::move(path)),
      fd_(std::move(fd)),
      cap_(cap_bytes > 0 ? std::max(cap_bytes, kMinRankCap) : 0),
      attempt_cap_(attempt_cap),
      workers_(workers),
      redactor_(secrets),
      notices_(notices) {
  struct stat st;
  if (::fstat(fd_.get(), &st) == 0 && S_ISREG(st.st_mode)) size_ = st.st_size;
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
    ssize_t n = ::write(fd_.get(), data.data(), data.size());
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
    ssize_t n = ::pread(fd_.get(), buf, sizeof buf, from - 1);
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
  UniqueFd out(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!out.valid()) return false;
  auto fail = [&] {
    int err = errno;
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
    ssize_t n = ::copy_file_range(out.get(), &at, fd_.get(), nullptr,
                                  static_cast<size_t>(old_size - at), 0);
    if (n > 0) {
      size_ += n;
      continue;
    }
    if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
                  errno == EBADF)) {
      char buf[65536];
      ssize_t got = ::pread(out.get(), buf, std::min<int64_t>(sizeof buf, old_size - at), at);
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

// ---- LogPump ----

Result<std::unique_ptr<LogPump>> LogPump::Create(const std::string& dir, size_t workers,
                                                 int64_t max_bytes,
                                                 const std::vector<std::string>& secrets) {
  auto notices = std::make_unique<NoticeWriter>(dir + "/" + kNoticesFile);
  const int64_t share = max_bytes > 0 ? max_bytes / static_cast<int64_t>(workers) : 0;
  std::vector<std::unique_ptr<LogFile>> files;
  for (size_t rank = 0; rank < workers; ++rank) {
    std::string path = dir + "/logs/rank-" + std::to_string(rank) + ".log";
    // Read and write: a cut at the cap copies the newest part out of it.
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd.valid()) return IoError("cannot open " + path, errno);
    files.push_back(std::make_unique<LogFile>(static_cast<int>(rank), std::move(path),
                                              std::move(fd), share, max_bytes, workers, secrets,
                                              notices.get()));
  }
  return ForFiles(std::move(files), std::move(notices));
}

Result<std::unique_ptr<LogPump>> LogPump::ForFiles(std::vector<std::unique_ptr<LogFile>> files,
                                                   std::unique_ptr<NoticeWriter> notices) {
  std::unique_ptr<LogPump> pump(new LogPump());
  pump->files_ = std::move(files);
  pump->notices_ = std::move(notices);
  for (size_t rank = 0; rank < pump->files_.size(); ++rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return IoError("pipe", errno);
    Pipe p;
    p.read = UniqueFd(fds[0]);
    p.write = UniqueFd(fds[1]);
    // The pump never blocks on one pipe while another has output.
    ::fcntl(p.read.get(), F_SETFL, O_NONBLOCK);
    // Room for bursts while the pump writes (best effort: the system may cap it).
    ::fcntl(p.read.get(), F_SETPIPE_SZ, 1 << 20);
    pump->pipes_.push_back(std::move(p));
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return IoError("pipe", errno);
  pump->wake_read_ = UniqueFd(wake[0]);
  pump->wake_write_ = UniqueFd(wake[1]);
  return pump;
}

LogPump::~LogPump() { Finish(0); }

void LogPump::Start() { thread_ = std::thread(&LogPump::Run, this); }

void LogPump::Run() {
  std::vector<char> buf(1 << 16);
  std::vector<pollfd> fds;
  std::vector<size_t> ranks;
  for (;;) {
    fds.clear();
    ranks.clear();
    bool retrying = notices_->pending();
    for (size_t i = 0; i < pipes_.size(); ++i) {
      if (files_[i]->dropping()) retrying = true;
      if (!pipes_[i].open) continue;
      fds.push_back({pipes_[i].read.get(), POLLIN, 0});
      ranks.push_back(i);
    }
    if (ranks.empty()) return;
    fds.push_back({wake_read_.get(), POLLIN, 0});
    int64_t timeout = retrying ? kRetryMs : -1;
    if (int64_t stop = stop_at_ms_.load(); stop >= 0) {
      const int64_t left = stop - MonotonicMillis();
      if (left <= 0) return;
      timeout = timeout < 0 ? left : std::min(timeout, left);
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout)) < 0 && errno != EINTR) return;
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Pipe& p = pipes_[ranks[k]];
      // A few reads at most, so that one chatty rank does not starve the others.
      for (int reads = 0; reads < 16; ++reads) {
        ssize_t n = ::read(p.read.get(), buf.data(), buf.size());
        if (n > 0) {
          files_[ranks[k]]->Write(std::string_view(buf.data(), static_cast<size_t>(n)));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) p.open = false;
        break;
      }
    }
    if (fds.back().revents != 0) {
      char drain[64];
      while (::read(wake_read_.get(), drain, sizeof drain) > 0) {
      }
    }
    if (notices_->pending()) notices_->Flush();
  }
}

void LogPump::Finish(int64_t timeout_ms) {
  if (finished_) return;
  finished_ = true;
  for (Pipe& p : pipes_) p.write.Reset();
  stop_at_ms_ = MonotonicMillis() + std::max<int64_t>(timeout_ms, 0);
  if (thread_.joinable()) {
    [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), "x", 1);
    thread_.join();
  } else if (timeout_ms > 0) {
    Run();  // never started: read what is there now
  }
  for (auto& f : files_) f->Finish();
  notices_->Flush();
}

}  // namespace tau::runtime::internal
