// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis
// understands (libstdc++'s std::mutex carries no annotations). Thin wrappers over the standard
// ones: no cost beyond theirs.
//
//   Mutex mu_;
//   int n_ TAU_GUARDED_BY(mu_);
//   void Add() { MutexLock lock(&mu_); ++n_; }
//   void WaitForWork() { MutexLock lock(&mu_); cv_.Wait(&mu_, [&]() TAU_REQUIRES(mu_) { return n_ >
//   0; }); }
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace tau {

class TAU_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() TAU_ACQUIRE() { mu_.lock(); }
  void Unlock() TAU_RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds it (where it cannot see that itself); checks nothing.
  void AssertHeld() const TAU_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class TAU_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) TAU_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() TAU_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits release `mu` while they block and hold it again when they return. A predicate that reads
// guarded fields says so: `[&]() TAU_REQUIRES(mu_) { ... }`.
class CondVar {
 public:
  void Wait(Mutex* mu) TAU_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate done) TAU_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, done);
    lock.release();
  }
  // Returns false when the time ran out (a spurious wake-up may also return true).
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) TAU_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool woken = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // Returns done() as it was last evaluated: false when the time ran out first.
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Predicate done)
      TAU_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool result = cv_.wait_for(lock, timeout, done);
    lock.release();
    return result;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tau
