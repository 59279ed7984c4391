// An array's max_parallel (`tau run --array 0-99%4`, a sweep's max_parallel), as a pass: at most
// that many of its runs are in play (queued for quota, admitted, running); the others wait out of
// their queue (ActiveRun::throttled), holding no quota, and enter it in submission order as runs
// of the array end. Derived from the runs' records, so a restarted server holds the same ones back.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "controller/pass.h"

namespace tau::server {

class ArrayThrottle final : public RunPass {
 public:
  explicit ArrayThrottle(PassHost* host) : host_(host) {}
  const char* Name() const override { return "array-throttle"; }
  // Takes a place in play if its array has one free (or it holds quota already), else waits.
  void RunAdded(ActiveRun& run, bool recovered) override;
  // Frees its place for the next waiting run of its array, by submission order.
  void RunEnded(const store::RunRecord& r) override;
  nlohmann::json Pending(const ActiveRun& run) override;

 private:
  using Waiting = std::deque<std::pair<int64_t, std::string>>;  // (seq, run), sorted
  struct Array {
    int64_t max = 0;
    std::set<std::string> in_play;
    // By seq: a run's place is a binary search (Pending runs for every held run).
    Waiting waiting;
  };
  PassHost* const host_;
  std::map<std::string, Array> arrays_;
};

}  // namespace tau::server
