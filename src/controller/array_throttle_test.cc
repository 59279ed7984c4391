#include "controller/array_throttle.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace tau::server {
namespace {

class Host final : public PassHost {
 public:
  std::map<std::string, ActiveRun>& active() override { return runs; }
  int64_t Now() override { return now; }
  void EngineChanged(const std::string& run) override { changed.insert(run); }
  store::Store* store() override { return nullptr; }
  std::string StorageDir(const store::RunRecord&, const std::string&) const override { return ""; }
  void EndRun(ActiveRun&, store::RunState, const std::string&, const std::string&,
              store::Batch*) override {}

  // A queued run of array `array` (max_parallel `max`), submitted `seq`-th.
  ActiveRun& Add(const std::string& name, int64_t seq, const std::string& array = "a",
                 int64_t max = 2) {
    ActiveRun& run = runs[name];
    run.record.name = name;
    run.record.seq = seq;
    run.record.queue = "default";
    run.record.state = store::RunState::kQueued;
    run.record.array = {{"name", array}, {"index", seq}, {"max_parallel", max}};
    return run;
  }
  void End(const std::string& name, RunPass& pass) {
    runs[name].record.state = store::RunState::kSucceeded;
    pass.RunEnded(runs[name].record);
  }

  std::map<std::string, ActiveRun> runs;
  int64_t now = 1000;
  std::set<std::string> changed;
};

TEST(ArrayThrottleTest, AtMostMaxParallelRunsAreInPlayAndTheRestEnterBySubmissionOrder) {
  Host host;
  ArrayThrottle throttle(&host);
  // Added out of order: the waiting ones still enter by seq.
  for (auto [name, seq] : {std::pair{"r1", 1}, {"r2", 2}, {"r4", 4}, {"r3", 3}})
    throttle.RunAdded(host.Add(name, seq), false);
  EXPECT_FALSE(host.runs["r1"].throttled);
  EXPECT_FALSE(host.runs["r2"].throttled);
  EXPECT_TRUE(host.runs["r3"].throttled);
  EXPECT_TRUE(host.runs["r4"].throttled);

  nlohmann::json why = throttle.Pending(host.runs["r4"]);
  EXPECT_EQ(why["code"], "ArrayMaxParallel");
  EXPECT_NE(why["reason"].get<std::string>().find("2 of array a's runs are in play (max_parallel "
                                                  "2); 1 of its runs wait ahead of this one"),
            std::string::npos)
      << why.dump();
  EXPECT_TRUE(throttle.Pending(host.runs["r1"]).is_null()) << "in play: not held";

  host.now = 5000;
  host.End("r2", throttle);
  EXPECT_FALSE(host.runs["r3"].throttled) << "the earliest waiting run takes the free place";
  EXPECT_EQ(host.runs["r3"].queued_since_ms, 5000) << "it waits for quota from now";
  EXPECT_TRUE(host.runs["r4"].throttled);
  EXPECT_EQ(host.changed, std::set<std::string>{"r3"}) << "the engine is told to look at it";
}

TEST(ArrayThrottleTest, ARunThatHoldsQuotaOrRunsTakesAPlaceWhateverTheCount) {
  // After a restart: what runs or holds quota is in play, even past max_parallel (a platform or
  // a resume may have made it so); queued runs then wait for places.
  Host host;
  ArrayThrottle throttle(&host);
  ActiveRun& running = host.Add("r1", 1, "a", 1);
  running.record.state = store::RunState::kRunning;
  throttle.RunAdded(running, false);
  ActiveRun& holds = host.Add("r2", 2, "a", 1);
  holds.record.flavors = {{"main", {{"cpu", "default"}}}};
  throttle.RunAdded(holds, false);
  throttle.RunAdded(host.Add("r3", 3, "a", 1), false);
  EXPECT_FALSE(host.runs["r1"].throttled);
  EXPECT_FALSE(host.runs["r2"].throttled);
  EXPECT_TRUE(host.runs["r3"].throttled);
  host.End("r1", throttle);
  EXPECT_TRUE(host.runs["r3"].throttled) << "r2 is still in play: 1 of 1";
  host.End("r2", throttle);
  EXPECT_FALSE(host.runs["r3"].throttled);
}

TEST(ArrayThrottleTest, ArraysAreCountedApartAndRunsOfNoArrayAreLeftAlone) {
  Host host;
  ArrayThrottle throttle(&host);
  throttle.RunAdded(host.Add("a1", 1, "a", 1), false);
  throttle.RunAdded(host.Add("b1", 2, "b", 1), false);
  throttle.RunAdded(host.Add("a2", 3, "a", 1), false);
  ActiveRun& plain = host.runs["plain"];
  plain.record.name = "plain";
  plain.record.state = store::RunState::kQueued;
  throttle.RunAdded(plain, false);
  EXPECT_FALSE(host.runs["b1"].throttled);
  EXPECT_TRUE(host.runs["a2"].throttled);
  EXPECT_FALSE(plain.throttled);
  host.End("b1", throttle);
  EXPECT_TRUE(host.runs["a2"].throttled) << "b's place is not a's";
  // A waiting run that ends (cancelled) leaves the line; the next place goes past it.
  throttle.RunAdded(host.Add("a3", 4, "a", 1), false);
  host.End("a2", throttle);
  host.End("a1", throttle);
  EXPECT_FALSE(host.runs["a3"].throttled);
}

}  // namespace
}  // namespace tau::server
