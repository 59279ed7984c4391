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

// How long a log the disk refused waits before it is tried again.
constexpr int64_t kRetryMs = 1000;

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
    files.push_back(std::make_unique<LogFile>(static_cast<int>(rank), std::move(path), fd.Release(),
                                              share, max_bytes, workers, secrets, notices.get()));
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
