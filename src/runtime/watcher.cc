// ProcessWatcher: one thread waiting in epoll on a pidfd per watched process. pidfds work for
// processes that are not our children (shims re-adopted after a server restart), which waitpid
// cannot watch.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

using internal::UniqueFd;

class PidfdWatcher final : public ProcessWatcher {
 public:
  PidfdWatcher(Callback on_exit, UniqueFd epoll, UniqueFd wake)
      : on_exit_(std::move(on_exit)), epoll_(std::move(epoll)), wake_(std::move(wake)) {}

  ~PidfdWatcher() override {
    Stop();
    if (thread_.joinable()) thread_.detach();  // only when Stop() ran on the watcher thread itself
    for (auto& [fd, entry] : watched_) ::close(fd);
  }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }

  Status Watch(const std::string& key, const ProcessId& process) override {
    {
      MutexLock lock(&mu_);
      if (stopping_) return FailedPrecondition("the process watcher is stopped");
    }
    UniqueFd pidfd(internal::PidfdOpen(process.pid));
    if (!pidfd.valid()) {
      if (errno == ESRCH) return NotifySoon(key);
      return IoError("pidfd_open(" + std::to_string(process.pid) + ")", errno);
    }
    // Checked after pidfd_open: the pidfd pins the process, so a match now means the pidfd is for
    // the process the caller meant, not for a later one that reused the pid.
    std::optional<internal::ProcStat> st = internal::ReadProcStat(process.pid);
    if (!st || st->start_time != process.start_time) return NotifySoon(key);

    MutexLock lock(&mu_);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = pidfd.get();
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pidfd.get(), &ev) != 0) {
      return IoError("epoll_ctl", errno);
    }
    // epoll_wait in the watcher thread sees the new fd without being woken.
    watched_[pidfd.get()] = Entry{key, process.pid};
    pidfd.Release();
    return Status::Ok();
  }

  void Stop() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    Wake();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  struct Entry {
    std::string key;
    int pid = 0;
  };

  // For processes that are already gone: the callback still comes from the watcher thread, as for
  // others.
  Status NotifySoon(const std::string& key) {
    {
      MutexLock lock(&mu_);
      pending_.push_back(key);
    }
    Wake();
    return Status::Ok();
  }

  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

  void Loop() {
    epoll_event events[32];
    while (true) {
      int n = ::epoll_wait(epoll_.get(), events, 32, -1);
      if (n < 0 && errno != EINTR) return;
      std::vector<std::string> fired;
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == wake_.get()) {
          uint64_t count;
          [[maybe_unused]] ssize_t r = ::read(wake_.get(), &count, sizeof count);
          continue;
        }
        if (std::optional<std::string> key = Reap(events[i].data.fd)) fired.push_back(*key);
      }
      {
        MutexLock lock(&mu_);
        if (stopping_) return;
        fired.insert(fired.end(), pending_.begin(), pending_.end());
        pending_.clear();
      }
      // Outside the lock: the callback may call Watch().
      for (const std::string& key : fired) on_exit_(key);
    }
  }

  // The process behind `pidfd` exited: reap it if it is our child, forget it, return its key.
  std::optional<std::string> Reap(int pidfd) {
    Entry entry;
    {
      MutexLock lock(&mu_);
      auto it = watched_.find(pidfd);
      if (it == watched_.end()) return std::nullopt;
      entry = std::move(it->second);
      watched_.erase(it);
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, pidfd, nullptr);
    }
    // P_PIDFD waits for exactly this process; waitpid(pid) could reap an unrelated child that got
    // the pid. ECHILD (not our child) is expected for re-adopted shims, which their own parent
    // reaps.
    siginfo_t info{};
    ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
    ::close(pidfd);
    return entry.key;
  }

  const Callback on_exit_;
  const UniqueFd epoll_;
  const UniqueFd wake_;  // eventfd: Stop() and NotifySoon() wake the thread through it
  std::thread thread_;

  Mutex mu_;
  std::map<int, Entry> watched_ TAU_GUARDED_BY(mu_);      // pidfd -> what it watches
  std::vector<std::string> pending_ TAU_GUARDED_BY(mu_);  // keys of processes found already gone
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
};

}  // namespace

Result<std::unique_ptr<ProcessWatcher>> ProcessWatcher::Create(Callback on_exit) {
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return IoError("epoll_create1", errno);
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return IoError("eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake.get();
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0)
    return IoError("epoll_ctl", errno);
  auto watcher =
      std::make_unique<PidfdWatcher>(std::move(on_exit), std::move(epoll), std::move(wake));
  watcher->Start();
  return std::unique_ptr<ProcessWatcher>(std::move(watcher));
}

}  // namespace tau::runtime
