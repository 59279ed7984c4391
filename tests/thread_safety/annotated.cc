// The thread-safety check's own test (tests/CMakeLists.txt): compiled by clang with
// -Wthread-safety -Werror=thread-safety, this file must pass as it is and fail with
// TAU_BREAK_LOCKING defined, which writes a guarded field without its mutex. So a check that
// stopped seeing annotations (a macro gone wrong, a flag dropped) fails CI.
#include "common/mutex.h"

namespace {

class Counter {
 public:
  void Add() {
    tau::MutexLock lock(&mu_);
    ++n_;
    changed_.SignalAll();
  }
  void WaitForOne() {
    tau::MutexLock lock(&mu_);
    changed_.Wait(&mu_, [&]() TAU_REQUIRES(mu_) { return n_ > 0; });
  }
#ifdef TAU_BREAK_LOCKING
  void Reset() { n_ = 0; }
#endif

 private:
  tau::Mutex mu_;
  tau::CondVar changed_;
  int n_ TAU_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add();
  c.WaitForOne();
  return 0;
}
