// ThreadSanitizer's own test (tests/CMakeLists.txt, only in the TAU_TSAN build that scripts/tsan.sh
// makes): two threads add to one counter under tau::Mutex, so this program must exit 0 with no
// report; with TAU_BREAK_LOCKING defined they add without the mutex, and TSan must report a data
// race (scripts/tsan.sh checks that it does, and that the report fails the run). So a TSan step
// that stopped seeing races (a flag dropped, a report that no longer fails anything) fails CI.
#include <thread>

#include "common/mutex.h"

namespace {

tau::Mutex mu;
int counter TAU_GUARDED_BY(mu) = 0;

void AddMany() {
  for (int i = 0; i < 1000; ++i) {
#ifdef TAU_BREAK_LOCKING
    ++counter;  // the deliberate race
#else
    tau::MutexLock lock(&mu);
    ++counter;
#endif
  }
}

}  // namespace

int main() {
  std::thread other(AddMany);
  AddMany();
  other.join();
  tau::MutexLock lock(&mu);
  return counter == 2000 ? 0 : 1;
}
