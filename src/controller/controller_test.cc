// The controller on its own: a fake clock and a fake backend over a real store on a temporary file,
// one pass of the decision loop at a time (RunOnce), never sleeping. What is tested is what the
// controller keeps the same on every backend: records and events, retries and their backoff,
// cancels, preemption, recovery after a restart, and the hand-off of ended runs.
#include "controller/controller.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/files.h"
#include "common/layout.h"
#include "evidence/evidence.h"
#include "recovery/failure_class.h"
#include "testing/controller_test_util.h"
#include "testing/fake_clock.h"

namespace tau::server {
namespace {

using recovery::FailureClass;
using store::AttemptRecord;
using store::AttemptState;
using store::RunState;

// A backend that admits every queued run past its backoff, starts its attempt when asked and
// ends it when the test says so. Where a real backend would learn that an attempt ended (a
// supervisor's exit, a Job's condition), the test calls End; the news reaches the controller
// through its inbox like a real backend's.
class FakeBackend final : public Backend {
 public:
  struct Ending {
    FailureClass failure_class = FailureClass::kSucceeded;
    int exit_code = 0;
  };

  const char* Name() const override { return "fake"; }
  Capabilities Caps() const override { return {}; }
  Status Start(RunHost* host, const policy::Platform*) override {
    host_ = host;
    ++starts;
    return Status::Ok();
  }
  void Stop() override {}
  Status CheckFits(const Resources& need) override {
    if (need.gpus > 0) return FailedPrecondition("the fake backend has no GPUs");
    return Status::Ok();
  }
  Status Check(const SubmissionCheck& c) override {
    checked_names.push_back(c.run_name);
    return Status::Ok();
  }
  std::vector<std::string> checked_names;  // SubmissionCheck::run_name, in order
  Status ApplyPlatform(const policy::Platform&) override { return Status::Ok(); }
  void Recover(ActiveRun& run, store::Batch* batch) override {
    store::RunRecord& r = run.record;
    if (r.state == RunState::kQueued) return;
    auto attempts = host_->store()->ListAttempts(r.name);
    if (!attempts.ok() || attempts->empty()) return;
    AttemptRecord last = attempts->back();
    if (alive.count(r.name)) {
      live_[r.name] = last.number;  // re-adopted
      ++readopted;
      return;
    }
    host_->AttemptVanished(run, last, "the fake attempt vanished while the server was down", batch);
  }
  void HandleExit(const std::string& name, store::Batch* batch) override {
    auto it = host_->active().find(name);
    auto ending = endings_.find(name);
    if (it == host_->active().end() || ending == endings_.end() || !live_.count(name)) return;
    ActiveRun& run = it->second;
    auto attempts = host_->store()->ListAttempts(name);
    ASSERT_TRUE(attempts.ok() && !attempts->empty());
    // A fact, as every backend reports one: what follows is the controller's to decide.
    run::AttemptEnd end;
    end.failure_class = ending->second.failure_class;
    end.exit_code = ending->second.exit_code;
    end.message = end.failure_class == FailureClass::kSucceeded   ? "done"
                  : end.failure_class == FailureClass::kCancelled ? "cancelled by request"
                  : end.failure_class == FailureClass::kPreempted ? "preempted by the fake"
                                                                  : "the fake attempt failed";
    live_.erase(name);
    alive.erase(name);
    endings_.erase(ending);
    host_->AttemptEnded(run, attempts->back(), end, batch);
  }
  void HandleNews(const AttemptNews&, store::Batch*) override {}
  void HandleGpuNews(const GpuNews&, store::Batch*) override {}
  void Cancel(ActiveRun& run, store::Batch* batch) override {
    const std::string& name = run.record.name;
    if (!live_.count(name)) {
      host_->RunCancelled(run, "cancelled before it started", batch);
      return;
    }
    batch->runs.push_back(run.record);
    stop_requested.insert(name);  // it ends when the test says so (End with kCancelled)
  }
  void StopAttempt(ActiveRun& run, recovery::FailureClass, const std::string&,
                   store::Batch*) override {
    stop_requested.insert(run.record.name);
  }
  void Schedule(store::Batch* batch) override {
    const int64_t now = host_->Now();
    for (auto& [name, run] : host_->active()) {
      store::RunRecord& r = run.record;
      if (r.state != RunState::kQueued || r.cancel_requested || live_.count(name)) continue;
      if (r.not_before_ms && *r.not_before_ms > now) continue;
      if (hold.count(name) || HeldBack(run)) continue;
      r.admitted_ms = now;
      r.flavors = {{"main", {{"cpu", "f"}}}};  // as a backend records the engine's assignment
      host_->RunAdmitted(run, "admitted by the fake", nlohmann::json::object(), batch);
      to_launch_.push_back(name);
    }
  }
  void Committed() override { ++commits_seen; }
  void Launch(store::Batch* batch) override {
    for (const std::string& name : std::exchange(to_launch_, {})) {
      ActiveRun& run = host_->active().at(name);
      store::RunRecord& r = run.record;
      AttemptRecord a;
      a.run = name;
      a.number = r.attempts + 1;
      a.dir = host_->AttemptDir(name, a.number);
      a.started_ms = host_->Now();
      live_[name] = a.number;
      host_->AttemptRunning(run, a, fmt::format("attempt {} started", a.number),
                            {{"attempt", a.number}}, batch);
      alive.insert(name);
      ++launches[name];
    }
  }
  void Launched() override {}
  void Release(ActiveRun&) override {}
  void Forget(const std::string& run) override { forgotten.push_back(run); }
  nlohmann::json PendingReason(const ActiveRun&, int64_t) override { return nullptr; }
  std::string RequeueNote(const ActiveRun&) override { return ""; }
  int64_t NextWakeMillis(int64_t, int64_t limit) const override { return limit; }
  std::vector<RunningAttempt> RunningAttempts() const override {
    std::vector<RunningAttempt> out;
    for (const auto& [name, attempt] : live_) out.push_back({name, attempt, {}});
    return out;
  }
  // A run's output as the test sets it; a run without an entry cannot be measured.
  std::optional<int64_t> OutputBytes(const ActiveRun& run) override {
    auto it = output.find(run.record.name);
    return it == output.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  std::optional<int> DumpStacks(const ActiveRun& run) override {
    ++dumps[run.record.name];
    return 1;
  }
  void DescribeRuntime(const store::RunRecord&, bool, const evidence::RecordInput*,
                       evidence::RuntimeInfo* rt) const override {
    rt->host = "fake";
  }
  void FillCapacity(MachineCapacity*) const override {}

  // The test's side: the attempt of `name` ends as `ending` (news posted to the controller).
  void End(const std::string& name, Ending ending) {
    endings_[name] = ending;
    host_->Post(AttemptExited{name});
  }
  bool Live(const std::string& name) const { return live_.count(name) > 0; }
  // What another thread of a backend tells the controller (as the shim's notices do).
  void Post(RunNotice notice) { host_->Post(std::move(notice)); }

  std::set<std::string> hold;             // runs Schedule leaves queued
  std::set<std::string> alive;            // attempts that outlive a controller (re-adopted)
  std::set<std::string> stop_requested;   // runs whose attempt the controller asked to stop
  std::map<std::string, int64_t> output;  // OutputBytes
  std::map<std::string, int> dumps;       // DumpStacks calls
  std::map<std::string, int> launches;
  std::vector<std::string> forgotten;  // runs the controller said had ended
  int starts = 0, readopted = 0, commits_seen = 0;

 private:
  RunHost* host_ = nullptr;
  std::map<std::string, int> live_;  // run -> its live attempt
  std::map<std::string, Ending> endings_;
  std::vector<std::string> to_launch_;
};

class ControllerTest : public testutil::ControllerFixture {
 protected:
  void SetUp() override {
    ControllerFixture::SetUp();
    StartController();
  }
  void StartController() {
    server::ControllerOptions options = Options();
    options.cpu_capacity_milli = 4000;
    options.memory_capacity_bytes = int64_t{8} << 30;
    options.clock = &clock_;
    options.backend = &backend_;
    options.loop_thread = false;
    ControllerFixture::StartController(options);
  }

  std::string Submit(const std::string& name, const std::string& extra = "") {
    return SubmitYaml(fmt::format(
        "schema_version: 1\nname: {}\nrun:\n  entrypoint: train.py\n  workload_kind: job\n{}", name,
        extra));
  }

  testutil::FakeClock clock_;
  FakeBackend backend_;
};

constexpr char kRetries[] =
    "resilience:\n  max_retries: 2\n  retry_on: [UserError]\n  backoff_initial: 30s\n";
constexpr char kRetriesNodeLost[] =
    "resilience:\n  max_retries: 1\n  retry_on: [NodeLost]\n  backoff_initial: 30s\n";

TEST_F(ControllerTest, SubmissionIsDurableAndQueuedBeforeThePass) {
  const std::string name = Submit("train");
  // Recorded before the loop has seen it, and the API can already say why it waits.
  EXPECT_EQ(Run(name).state, RunState::kQueued);
  EXPECT_EQ(Run(name).created_ms, clock_.NowMillis());
  EXPECT_EQ(EventTypes(name), (std::vector<std::string>{"Submitted", "Queued"}));
  EXPECT_EQ(controller_->PendingInfo(name).value("reason", ""), "waiting for the scheduler");
  EXPECT_EQ(controller_->BackendName(), std::string("fake"));
}

TEST_F(ControllerTest, AdmittedRunStartsAfterTheAdmissionIsCommittedAndSucceeds) {
  const std::string name = Submit("train");
  controller_->RunOnce();
  EXPECT_EQ(backend_.launches[name], 1);
  EXPECT_TRUE(backend_.forgotten.empty());
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kRunning);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_TRUE(controller_->PendingInfo(name).is_null()) << "a running run is not pending";
  EXPECT_EQ(EventTypes(name),
            (std::vector<std::string>{"Submitted", "Queued", "Admitted", "Running"}));

  clock_.Advance(5'000);
  backend_.End(name, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  r = Run(name);
  EXPECT_EQ(r.state, RunState::kSucceeded);
  EXPECT_EQ(r.reason, "Succeeded");
  ASSERT_TRUE(r.finished_ms.has_value());
  EXPECT_EQ(*r.finished_ms - *r.started_ms, 5'000);
  ASSERT_EQ(Attempts(name).size(), 1u);
  EXPECT_EQ(Attempts(name)[0].state, AttemptState::kFinished);
  // Once it has ended, the backend may drop what it keeps of the run (and only then).
  EXPECT_EQ(backend_.forgotten, std::vector<std::string>{name});
}

TEST_F(ControllerTest, ANoticeFromAnotherThreadIsAnEventOfAnActiveRunOnly) {
  const std::string name = Submit("train");
  controller_->RunOnce();
  backend_.Post(RunNotice{name, "LogTruncated", "rank 0's log reached its cap", {{"rank", 0}}});
  backend_.Post(RunNotice{"no-such-run", "LogTruncated", "ignored", {}});
  controller_->RunOnce();
  std::vector<store::Event> events = Events(name);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, "LogTruncated");
  EXPECT_EQ(events.back().message, "rank 0's log reached its cap");
  EXPECT_EQ(events.back().data.value("rank", -1), 0);
  EXPECT_TRUE(Events("no-such-run").empty());

  // Posted just before its attempt's exit, in the same pass: still the run's.
  backend_.Post(RunNotice{name, "OutputDropped", "the disk is full", {}});
  backend_.End(name, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  std::vector<std::string> types = EventTypes(name);
  EXPECT_NE(std::find(types.begin(), types.end(), "OutputDropped"), types.end());
  size_t ended = Events(name).size();
  backend_.Post(RunNotice{name, "LogTruncated", "too late", {}});
  controller_->RunOnce();
  EXPECT_EQ(Events(name).size(), ended) << "an ended run's events are final";
}

TEST_F(ControllerTest, FailureIsRetriedOnlyAfterItsBackoff) {
  const std::string name = Submit("flaky", kRetries);
  controller_->RunOnce();
  const int64_t failed_at = clock_.NowMillis();
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();

  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kQueued);
  EXPECT_EQ(r.reason, "UserError");
  ASSERT_TRUE(r.not_before_ms.has_value());
  EXPECT_EQ(*r.not_before_ms, failed_at + 30'000);
  EXPECT_EQ(EventTypes(name).back(), "Retrying");
  nlohmann::json pending = controller_->PendingInfo(name);
  EXPECT_EQ(pending.value("code", ""), "BackingOff");
  EXPECT_NE(pending.value("reason", "").find("waits 30.0s more"), std::string::npos) << pending;

  // Passes inside the backoff start nothing; the reason counts down with the clock.
  clock_.Advance(10'000);
  controller_->RunOnce();
  pending = controller_->PendingInfo(name);
  EXPECT_NE(pending.value("reason", "").find("waits 20.0s more"), std::string::npos) << pending;
  clock_.Advance(19'999);
  controller_->RunOnce();
  EXPECT_EQ(backend_.launches[name], 1);
  EXPECT_EQ(Run(name).state, RunState::kQueued);
  clock_.Advance(1);
  controller_->RunOnce();
  EXPECT_EQ(backend_.launches[name], 2);
  r = Run(name);
  EXPECT_EQ(r.state, RunState::kRunning);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_FALSE(r.not_before_ms.has_value());

  // The backoff doubles; after max_retries the run fails for good.
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  EXPECT_EQ(*Run(name).not_before_ms, clock_.NowMillis() + 60'000);
  clock_.Advance(60'000);
  controller_->RunOnce();
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  r = Run(name);
  EXPECT_EQ(r.state, RunState::kFailed);
  EXPECT_EQ(r.reason, "UserError");
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(backend_.launches[name], 3);
}

TEST_F(ControllerTest, FailureOutsideRetryOnEndsTheRun) {
  const std::string name = Submit("oom", kRetries);
  controller_->RunOnce();
  backend_.End(name, {FailureClass::kOOMKilled, 137});
  controller_->RunOnce();
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kFailed);
  EXPECT_EQ(r.reason, "OOMKilled");
  ASSERT_TRUE(r.exit_code.has_value());
  EXPECT_EQ(*r.exit_code, 137);
  EXPECT_EQ(backend_.launches[name], 1);
}

TEST_F(ControllerTest, CancelDuringBackoffEndsTheRunWithoutAnotherAttempt) {
  const std::string name = Submit("flaky", kRetries);
  controller_->RunOnce();
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  ASSERT_EQ(Run(name).state, RunState::kQueued);

  clock_.Advance(10'000);
  ASSERT_TRUE(controller_->Cancel(name).ok());
  controller_->RunOnce();
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kCancelled);
  EXPECT_TRUE(r.cancel_requested);
  // Past the backoff nothing starts it again, and a second cancel is refused.
  clock_.Advance(60'000);
  controller_->RunOnce();
  EXPECT_EQ(backend_.launches[name], 1);
  EXPECT_EQ(controller_->Cancel(name).code(), StatusCode::kFailedPrecondition);
}

TEST_F(ControllerTest, CancelOfARunningAttemptWaitsForItsEnd) {
  const std::string name = Submit("long");
  controller_->RunOnce();
  ASSERT_TRUE(controller_->Cancel(name).ok());
  controller_->RunOnce();
  EXPECT_TRUE(backend_.stop_requested.count(name));
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kRunning) << "running until its processes are gone";
  EXPECT_TRUE(r.cancel_requested) << "the request is durable before the stop";
  backend_.End(name, {FailureClass::kCancelled, 143});
  controller_->RunOnce();
  EXPECT_EQ(Run(name).state, RunState::kCancelled);
}

TEST_F(ControllerTest, PreemptedRunGoesBackToItsQueueAndRunsAgain) {
  const std::string name =
      Submit("victim", "resilience:\n  max_retries: 2\n  retry_on: [UserError, Preempted]\n");
  controller_->RunOnce();
  backend_.End(name, {FailureClass::kPreempted, 143});
  backend_.hold.insert(name);
  controller_->RunOnce();
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kQueued);
  EXPECT_EQ(r.reason, "Preempted");
  EXPECT_EQ(r.preemptions, 1);
  EXPECT_FALSE(r.not_before_ms.has_value()) << "a preempted run waits for quota, not a backoff";
  EXPECT_EQ(EventTypes(name).back(), "Requeued");
  EXPECT_EQ(controller_->PendingInfo(name).value("queue", ""), "default");

  backend_.hold.erase(name);
  controller_->RunOnce();
  EXPECT_EQ(backend_.launches[name], 2);
  EXPECT_EQ(Run(name).state, RunState::kRunning);
}

// The backend reports the fact (preempted); the controller applies the spec's rule: a retry_on
// that leaves Preempted out asks the run to fail instead of going back to its queue.
TEST_F(ControllerTest, APreemptionTheSpecDoesNotRetryEndsTheRun) {
  const std::string name = Submit("not-requeued", kRetries);  // retry_on: [UserError]
  controller_->RunOnce();
  backend_.End(name, {FailureClass::kPreempted, 143});
  controller_->RunOnce();
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kFailed);
  EXPECT_EQ(r.reason, "Preempted");
  EXPECT_EQ(r.preemptions, 0) << "not requeued";
  EXPECT_EQ(backend_.launches[name], 1);
}

TEST_F(ControllerTest, PreemptedAttemptsUseNoRetry) {
  const std::string name = Submit("preempted-twice",
                                  "resilience:\n  max_retries: 1\n  retry_on: [UserError, "
                                  "Preempted]\n  backoff_initial: 30s\n");
  for (int attempt = 1; attempt <= 2; ++attempt) {
    controller_->RunOnce();
    ASSERT_EQ(backend_.launches[name], attempt);
    backend_.End(name, {FailureClass::kPreempted, 143});
  }
  controller_->RunOnce();  // requeued after the second preemption, and started again
  ASSERT_EQ(backend_.launches[name], 3);
  // The third attempt is the first to fail: the one retry is still there.
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  store::RunRecord r = Run(name);
  EXPECT_EQ(r.state, RunState::kQueued);
  EXPECT_EQ(EventTypes(name).back(), "Retrying");
  auto events = Events(name);
  EXPECT_EQ(events.back().message,
            "attempt 3 failed (UserError, exit 1); retrying in 30.0s (retry 1 of 1)");
  // Queued again for its retry: the failed attempt's exit code is the attempt's, not the run's.
  EXPECT_FALSE(r.exit_code.has_value());
  EXPECT_EQ(r.reason, "UserError");
  clock_.Advance(30'000);
  controller_->RunOnce();
  ASSERT_EQ(backend_.launches[name], 4);
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  r = Run(name);
  EXPECT_EQ(r.state, RunState::kFailed);
  EXPECT_NE(r.message.find("resilience.max_retries (1) is used up"), std::string::npos)
      << r.message;
}

TEST_F(ControllerTest, ASubmissionRepeatedWithItsIdempotencyKeyIsTheSameRun) {
  auto submit = [&](const std::string& user, const std::string& key, const std::string& code) {
    SubmitRequest request;
    request.spec_file = "tau.yaml";
    request.spec_yaml = "schema_version: 1\nname: keyed\nrun:\n  entrypoint: train.py\n";
    request.code.push_back({"train.py", 0644, code});
    request.caller.user = user;
    request.idempotency_key = key;
    SubmitError error;
    return controller_->Submit(std::move(request), &error);
  };
  auto first = submit("alice", "key-1", "print(1)\n");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->replayed);
  controller_->RunOnce();  // it starts; a retried submission still finds it
  auto again = submit("alice", "key-1", "print(1)\n");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->run.name, first->run.name);
  EXPECT_EQ(again->run.state, RunState::kRunning) << "the run as it is now";
  EXPECT_EQ(EventTypes(first->run.name),
            (std::vector<std::string>{"Submitted", "Queued", "Admitted", "Running"}));

  // The same key with other code is refused, and makes nothing.
  auto other = submit("alice", "key-1", "print(2)\n");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(other.status().message().find(first->run.name), std::string::npos)
      << other.status().ToString();
  // Another user's key of the same text, and no key at all, are new runs.
  auto bobs = submit("bob", "key-1", "print(1)\n");
  ASSERT_TRUE(bobs.ok()) << bobs.status().ToString();
  EXPECT_FALSE(bobs->replayed);
  EXPECT_NE(bobs->run.name, first->run.name);
  auto plain1 = submit("alice", "", "print(1)\n"), plain2 = submit("alice", "", "print(1)\n");
  ASSERT_TRUE(plain1.ok() && plain2.ok());
  EXPECT_NE(plain1->run.name, plain2->run.name);
  auto runs = store_->ListRuns(store::RunFilter{});
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(runs->size(), 4u);

  // After a restart the key still finds its run.
  StopController();
  StartController();
  auto later = submit("alice", "key-1", "print(1)\n");
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_TRUE(later->replayed);
  EXPECT_EQ(later->run.name, first->run.name);
}

// A batch of `n` runs of one spec sharing one code; an array of first..last when `array`.
BatchRequest MakeBatch(size_t n, std::optional<BatchArray> array = std::nullopt) {
  BatchRequest b;
  BatchCode code;
  code.files.push_back({"train.py", 0644, "print('hi')\n"});
  b.codes.push_back(std::move(code));
  for (size_t i = 0; i < n; ++i) {
    BatchItem item;
    item.spec_file = "tau.yaml";
    item.spec_yaml = "schema_version: 1\nname: many\nrun:\n  entrypoint: train.py\n";
    if (array) item.array_index = array->first + static_cast<int64_t>(i) * array->step;
    b.items.push_back(std::move(item));
  }
  b.array = array;
  b.caller.user = "alice";
  return b;
}

TEST_F(ControllerTest, ABatchIsInsertedInOneTransactionAndEveryRunIsQueued) {
  const int64_t before = store_->TransactionsCommitted();
  BatchError error;
  auto made = controller_->SubmitBatch(MakeBatch(50), &error);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(store_->TransactionsCommitted(), before + 1);
  ASSERT_EQ(made->runs.size(), 50u);
  std::set<std::string> names;
  for (const store::RunRecord& r : made->runs) {
    names.insert(r.name);
    EXPECT_TRUE(r.array.is_null());
    EXPECT_EQ(EventTypes(r.name), (std::vector<std::string>{"Submitted", "Queued"}));
    EXPECT_EQ(r.snapshot_digest, made->runs[0].snapshot_digest);  // one code, one snapshot
  }
  EXPECT_EQ(names.size(), 50u);
  // The loop took them all: those the quota (4 CPUs) lets in start, the others wait in line.
  controller_->RunOnce();
  size_t running = 0;
  for (const std::string& name : names) {
    const RunState state = Run(name).state;
    EXPECT_TRUE(state == RunState::kQueued || state == RunState::kRunning) << name;
    running += state == RunState::kRunning;
    if (state == RunState::kQueued) {
      EXPECT_FALSE(controller_->PendingInfo(name).is_null()) << name;
    }
  }
  EXPECT_GE(running, 1u);
  EXPECT_EQ(backend_.launches.size(), running);
}

// A backend checks names it derives (Kubernetes object names) before the insert draws the
// run's: the name it is shown is never shorter than the one a run then gets.
TEST_F(ControllerTest, TheNameABackendChecksIsAsLongAsTheRunsOwn) {
  const std::string single =
      SubmitYaml("schema_version: 1\nname: one\nrun:\n  entrypoint: train.py\n");
  ASSERT_EQ(backend_.checked_names.size(), 1u);
  EXPECT_EQ(backend_.checked_names[0].size(), single.size()) << backend_.checked_names[0];
  EXPECT_EQ(backend_.checked_names[0].rfind("one-", 0), 0u);
  BatchError error;
  auto made = controller_->SubmitBatch(MakeBatch(3, BatchArray{99998, 100002, 2, {}}), &error);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_EQ(backend_.checked_names.size(), 2u) << "the array's runs alike are checked once";
  size_t longest = 0;
  for (const store::RunRecord& r : made->runs) longest = std::max(longest, r.name.size());
  EXPECT_EQ(backend_.checked_names[1].size(), longest) << backend_.checked_names[1];
}

TEST_F(ControllerTest, AnArrayNamesItsRunsByIndexAndRecordsThePlace) {
  BatchError error;
  auto made = controller_->SubmitBatch(MakeBatch(4, BatchArray{10, 16, 2, {}}), &error);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_EQ(made->runs.size(), 4u);
  const std::string array = made->runs[0].array["name"].get<std::string>();
  EXPECT_EQ(array.rfind("many-", 0), 0u) << array;
  for (size_t i = 0; i < 4; ++i) {
    const int64_t index = 10 + 2 * static_cast<int64_t>(i);
    store::RunRecord r = Run(made->runs[i].name);
    EXPECT_EQ(r.name, fmt::format("{}-{}", array, index));
    EXPECT_EQ(r.array,
              (nlohmann::json{
                  {"name", array}, {"index", index}, {"first", 10}, {"last", 16}, {"step", 2}}));
  }
  // After a restart the loop's view is read from the store: the place is kept.
  StopController();
  StartController();
  EXPECT_EQ(Run(made->runs[3].name).array["index"], 16);
}

TEST_F(ControllerTest, OneBadItemRefusesTheBatchAndLeavesNothing) {
  BatchRequest b = MakeBatch(5);
  b.items[3].spec_yaml = "schema_version: 1\nname: many\nrun:\n  entrypointt: train.py\n";
  const int64_t before = store_->TransactionsCommitted();
  BatchError error;
  auto made = controller_->SubmitBatch(std::move(b), &error);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(error.index.has_value());
  EXPECT_EQ(*error.index, 3u);
  EXPECT_EQ(made.status().message().rfind("runs[3]: ", 0), 0u) << made.status().message();
  EXPECT_FALSE(error.diagnostics.empty());
  EXPECT_EQ(store_->TransactionsCommitted(), before);
  EXPECT_TRUE(store_->ListRuns(store::RunFilter{})->empty());

  // An array's indices must be the range's, in order; an index outside an array is refused.
  BatchRequest wrong = MakeBatch(3, BatchArray{0, 2, 1, {}});
  wrong.items[1].array_index = 5;
  auto refused = controller_->SubmitBatch(std::move(wrong), &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(*error.index, 1u);
  BatchRequest stray = MakeBatch(2);
  stray.items[1].array_index = 1;
  EXPECT_FALSE(controller_->SubmitBatch(std::move(stray), &error).ok());
  EXPECT_EQ(*error.index, 1u);
  BatchRequest short_array = MakeBatch(2, BatchArray{0, 2, 1, {}});
  EXPECT_FALSE(controller_->SubmitBatch(std::move(short_array), &error).ok());
  EXPECT_FALSE(error.index.has_value());
  EXPECT_FALSE(controller_->SubmitBatch(MakeBatch(kMaxBatchRuns + 1), &error).ok());
  EXPECT_EQ(error.status.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_->ListRuns(store::RunFilter{})->empty());
}

TEST_F(ControllerTest, ABatchSentAgainWithItsKeyGetsTheSameRuns) {
  auto send = [&](BatchRequest b, const std::string& key) {
    b.idempotency_key = key;
    BatchError error;
    return controller_->SubmitBatch(std::move(b), &error);
  };
  auto first = send(MakeBatch(3, BatchArray{0, 2, 1, {}}), "batch-key");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->replayed);
  auto again = send(MakeBatch(3, BatchArray{0, 2, 1, {}}), "batch-key");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->replayed);
  ASSERT_EQ(again->runs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again->runs[i].name, first->runs[i].name);
  EXPECT_EQ(store_->ListRuns(store::RunFilter{})->size(), 3u);
  // The same key for a batch of another size, or of other code, is refused and makes nothing.
  auto shorter = send(MakeBatch(2, BatchArray{0, 1, 1, {}}), "batch-key");
  EXPECT_EQ(shorter.status().code(), StatusCode::kAlreadyExists) << shorter.status().ToString();
  BatchRequest other = MakeBatch(3, BatchArray{0, 2, 1, {}});
  other.codes[0].files[0].data = "print('other')\n";
  EXPECT_EQ(send(std::move(other), "batch-key").status().code(), StatusCode::kAlreadyExists);
  // A single submission with the same key is another thing.
  SubmitRequest single;
  single.spec_file = "tau.yaml";
  single.spec_yaml = "schema_version: 1\nname: many\nrun:\n  entrypoint: train.py\n";
  single.code.push_back({"train.py", 0644, "print('hi')\n"});
  single.caller.user = "alice";
  single.idempotency_key = "batch-key";
  SubmitError error;
  auto one = controller_->Submit(std::move(single), &error);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_FALSE(one->replayed);
  EXPECT_EQ(store_->ListRuns(store::RunFilter{})->size(), 4u);
}

TEST_F(ControllerTest, RestartReadoptsALiveAttemptAndLosesAVanishedOne) {
  const std::string kept = Submit("kept");
  const std::string lost = Submit("lost", kRetriesNodeLost);
  const std::string queued = Submit("queued");
  backend_.hold.insert(queued);
  controller_->RunOnce();
  ASSERT_EQ(Run(kept).state, RunState::kRunning);
  ASSERT_EQ(Run(lost).state, RunState::kRunning);
  StopController();

  // While the server is away, one attempt keeps running and the other's processes vanish.
  backend_.alive.erase(lost);
  clock_.Advance(1'000);
  StartController();
  EXPECT_EQ(backend_.starts, 2);
  EXPECT_EQ(backend_.readopted, 1);
  store::RunRecord r = Run(kept);
  EXPECT_EQ(r.state, RunState::kRunning);
  EXPECT_EQ(r.attempts, 1);
  r = Run(lost);
  EXPECT_EQ(r.state, RunState::kQueued) << "NodeLost is retried";
  EXPECT_EQ(r.reason, "NodeLost");
  EXPECT_EQ(Attempts(lost).back().reason, "NodeLost");
  EXPECT_EQ(Run(queued).state, RunState::kQueued);
  EXPECT_EQ(controller_->PendingInfo(queued).value("queue", ""), "default");

  // The re-adopted attempt's end is handled by the new controller like any other.
  backend_.End(kept, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  EXPECT_EQ(Run(kept).state, RunState::kSucceeded);
  EXPECT_EQ(backend_.launches[kept], 1) << "re-adopted, not started again";
}

TEST_F(ControllerTest, RefusalsComeFromTheBackendBeforeAnythingIsRecorded) {
  SubmitRequest request;
  request.spec_file = "tau.yaml";
  request.spec_yaml =
      "schema_version: 1\nname: big\nrun:\n  entrypoint: train.py\n  workload_kind: job\n"
      "compute:\n  gpus: 1\n";
  request.code.push_back({"train.py", 0644, "print('hi')\n"});
  request.caller.user = "alice";
  SubmitError error;
  auto r = controller_->Submit(std::move(request), &error);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("no GPUs"), std::string::npos) << r.status().ToString();
  store::RunFilter all;
  auto runs = store_->ListRuns(all);
  ASSERT_TRUE(runs.ok());
  EXPECT_TRUE(runs->empty());
}

TEST_F(ControllerTest, EndedRunsGetTheirFinalEvidenceRecord) {
  const std::string name = Submit("train");
  controller_->RunOnce();
  backend_.End(name, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  StopController();  // the evidence worker saves what was handed off before it stops
  EXPECT_TRUE(std::filesystem::exists(layout::EvidenceDir(home_, name) + "/record.json"));
  StartController();
  auto record = controller_->EvidenceRecord(name);
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ((*record)["run"].value("state", ""), "Succeeded");
}

// Retention reads the store's queue of what is due, a page (kRetentionBatch runs) at a time: every
// due run is pruned however many pages they fill, a run with no final record yet is skipped
// without stopping the pass, a run the store says is pruned is never read again, and one an older
// tau pruned (its record says so, the store does not) is marked with its record's time.
TEST_F(ControllerTest, RetentionPrunesWhatIsDueAPageAtATimeAndReadsNothingElse) {
  const int64_t now = 100'000'000;
  const int64_t keep = 1000;
  auto log_of = [&](const std::string& name) {
    return layout::AttemptDir(home_, name, 1) + "/logs/rank-0.log";
  };
  auto samples_of = [&](const std::string& name) {
    return layout::EvidenceDir(home_, name) + "/gpu-samples.jsonl";
  };
  auto save_record = [&](const std::string& name, int64_t finished_ms,
                         std::optional<int64_t> logs_pruned_ms) {
    evidence::RecordInput in;
    in.run.name = name;
    in.run.state = "Succeeded";
    in.run.finished_ms = finished_ms;
    evidence::AttemptInfo a;
    a.number = 1;
    a.state = "Finished";
    a.ended_ms = finished_ms;
    a.logs.push_back({0, 6, std::string(64, 'a'),
                      logs_pruned_ms ? evidence::LogState::kPruned : evidence::LogState::kKept});
    in.attempts.push_back(a);
    in.retention.logs_pruned_ms = logs_pruned_ms;
    ASSERT_TRUE(
        evidence::SaveRecord(layout::EvidenceDir(home_, name), evidence::BuildRecord(in)).ok());
  };
  // An ended run with its logs, its samples and (unless told) its final record.
  auto make = [&](const std::string& name, int64_t finished_ms, bool record = true,
                  std::optional<int64_t> logs_pruned_in_record = std::nullopt) {
    store::RunRecord r;
    r.name = name;
    r.spec_name = "old";
    r.created_ms = r.updated_ms = finished_ms - 10;
    ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
    r.state = RunState::kSucceeded;
    r.finished_ms = finished_ms;
    store::Batch b;
    b.runs.push_back(r);
    ASSERT_TRUE(store_->Commit(b).ok());
    ASSERT_TRUE(MakeDirs(layout::AttemptDir(home_, name, 1) + "/logs").ok());
    ASSERT_TRUE(MakeDirs(layout::EvidenceDir(home_, name)).ok());
    ASSERT_TRUE(WriteFileAtomic(log_of(name), "hello\n").ok());
    ASSERT_TRUE(WriteFileAtomic(samples_of(name), "{}\n").ok());
    if (record) save_record(name, finished_ms, logs_pruned_in_record);
  };
  const int kDue = static_cast<int>(EvidenceWorker::kRetentionBatch) + 7;  // more than a page
  for (int i = 0; i < kDue; ++i) make(fmt::format("due-{}", i), now - keep - kDue + i);
  make("no-record", now - keep - kDue - 1, /*record=*/false);  // first in the queue
  make("pruned-before", now - keep - 5, true, /*logs_pruned_in_record=*/now - 500'000);
  make("recent", now - keep + 1);
  // The store says it is pruned; its files say otherwise. A pass that read it would prune it.
  make("marked", now - keep - 3);
  ASSERT_TRUE(store_->MarkPruned(store::PruneKind::kLogs, {"marked"}, now - 2000).ok());
  ASSERT_TRUE(store_->MarkPruned(store::PruneKind::kGpuSamples, {"marked"}, now - 2000).ok());

  evidence::RetentionPolicy policy;
  policy.keep_logs_ms = keep;
  policy.keep_samples_ms = keep;
  ASSERT_TRUE(controller_->ApplyRetention(policy, now).ok());

  for (int i = 0; i < kDue; ++i) {
    const std::string name = fmt::format("due-{}", i);
    SCOPED_TRACE(name);
    EXPECT_FALSE(std::filesystem::exists(log_of(name)));
    EXPECT_FALSE(std::filesystem::exists(samples_of(name)));
    store::RunRecord r = Run(name);
    EXPECT_EQ(r.logs_pruned_ms, std::optional<int64_t>(now));
    EXPECT_EQ(r.samples_pruned_ms, std::optional<int64_t>(now));
    auto saved = evidence::LoadRecord(layout::EvidenceDir(home_, name) + "/record.json");
    ASSERT_TRUE(saved.ok());
    auto in = evidence::ParseRecord(*saved);
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(in->retention.logs_pruned_ms, std::optional<int64_t>(now));
    EXPECT_EQ(in->retention.samples_pruned_ms, std::optional<int64_t>(now));
    ASSERT_EQ(in->attempts.size(), 1u);
    ASSERT_EQ(in->attempts[0].logs.size(), 1u);
    EXPECT_EQ(in->attempts[0].logs[0].state, evidence::LogState::kPruned);
    EXPECT_EQ(in->attempts[0].logs[0].sha256, std::string(64, 'a')) << "the hash stays";
  }
  for (const char* kept : {"recent", "marked", "no-record"}) {
    SCOPED_TRACE(kept);
    EXPECT_TRUE(std::filesystem::exists(log_of(kept)));
    EXPECT_TRUE(std::filesystem::exists(samples_of(kept)));
  }
  EXPECT_FALSE(Run("recent").logs_pruned_ms.has_value());
  EXPECT_FALSE(Run("no-record").logs_pruned_ms.has_value());
  EXPECT_EQ(Run("pruned-before").logs_pruned_ms, std::optional<int64_t>(now - 500'000));
  EXPECT_EQ(Run("pruned-before").samples_pruned_ms, std::optional<int64_t>(now));

  // Nothing is due any more but the run without a record; once it has one, it goes too.
  auto due = store_->ListRetentionDue(store::PruneKind::kLogs, now - keep, std::nullopt, 0);
  ASSERT_TRUE(due.ok());
  ASSERT_EQ(due->size(), 1u);
  EXPECT_EQ(due->front().name, "no-record");
  save_record("no-record", now - keep - kDue - 1, std::nullopt);
  ASSERT_TRUE(controller_->ApplyRetention(policy, now).ok());
  EXPECT_FALSE(std::filesystem::exists(log_of("no-record")));
  EXPECT_EQ(Run("no-record").logs_pruned_ms, std::optional<int64_t>(now));
  EXPECT_TRUE(std::filesystem::exists(log_of("recent")));
}

// A workflow of three stages, prep -> train -> eval, as one batch; `eval_after` is eval's
// dependency on train.
BatchRequest MakeWorkflow(spec::Condition eval_after = spec::Condition::kSucceeded) {
  BatchRequest b = MakeBatch(3);
  b.workflow = "pipe";
  const char* stages[] = {"prep", "train", "eval"};
  for (size_t i = 0; i < 3; ++i) b.items[i].stage = stages[i];
  b.items[1].after = {{"prep", spec::Condition::kSucceeded, 0, 0}};
  b.items[2].after = {{"train", eval_after, 0, 0}};
  return b;
}

// The runs of MakeWorkflow(eval_after), submitted: prep, train and eval.
std::vector<store::RunRecord> SubmitWorkflow(
    Controller* controller, spec::Condition eval_after = spec::Condition::kSucceeded) {
  BatchError error;
  auto made = controller->SubmitBatch(MakeWorkflow(eval_after), &error);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made.ok() ? made->runs : std::vector<store::RunRecord>(3);
}

// The data of a run's last event of `type` (null when it has none).
nlohmann::json LastEventData(const std::vector<store::Event>& events, const std::string& type) {
  for (auto it = events.rbegin(); it != events.rend(); ++it)
    if (it->type == type) return it->data;
  return nullptr;
}

TEST_F(ControllerTest, AWorkflowsStagesWaitForTheStagesBeforeThemAndGetTheirCheckpoints) {
  const std::vector<store::RunRecord> made = SubmitWorkflow(controller_.get());
  const std::string prep = made[0].name, train = made[1].name, eval = made[2].name;
  const std::string workflow = made[0].workflow["name"];
  EXPECT_EQ(workflow.rfind("pipe-", 0), 0u) << workflow;
  EXPECT_EQ(train, workflow + "-train");
  EXPECT_EQ(Run(eval).workflow["after"][0]["run"], train);
  // Before any pass, a held stage already says what it waits for; the first stage waits for the
  // scheduler.
  EXPECT_EQ(controller_->PendingInfo(eval).value("code", ""), "WaitingForUpstream");
  EXPECT_EQ(controller_->PendingInfo(prep).value("reason", ""), "waiting for the scheduler");
  controller_->RunOnce();
  EXPECT_EQ(Run(prep).state, RunState::kRunning);
  EXPECT_EQ(Run(train).state, RunState::kQueued) << "it waits for prep";
  EXPECT_EQ(backend_.launches.count(train), 0u);
  nlohmann::json pending = controller_->PendingInfo(train);
  EXPECT_EQ(pending.value("code", ""), "WaitingForUpstream");
  EXPECT_NE(pending.value("reason", "").find("stage 'prep' (run " + prep + ", Running)"),
            std::string::npos)
      << pending;
  // prep leaves a checkpoint (and a half-written one, which is never handed on).
  const std::string ckpts = controller_->StorageDir(Run(prep), "checkpoint");
  ASSERT_TRUE(MakeDirs(ckpts + "/step-10").ok());
  ASSERT_TRUE(WriteFileAtomic(ckpts + "/step-10/model.pt", "weights").ok());
  ASSERT_TRUE(WriteFileAtomic(ckpts + "/step-10/COMPLETE", "").ok());
  ASSERT_TRUE(WriteFileAtomic(ckpts + "/step-20.tmp", "half").ok());
  backend_.End(prep, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  EXPECT_EQ(Run(prep).state, RunState::kSucceeded);
  EXPECT_EQ(Run(train).state, RunState::kRunning) << "released in the pass prep ended in";
  EXPECT_EQ(Run(eval).state, RunState::kQueued);
  const nlohmann::json ready = LastEventData(Events(train), "UpstreamReady");
  ASSERT_TRUE(ready.is_object());
  const nlohmann::json& up = ready["upstreams"][0];
  EXPECT_EQ(up["stage"], "prep");
  EXPECT_EQ(up["run"], prep);
  EXPECT_EQ(up["state"], "Succeeded");
  EXPECT_EQ(up["checkpoint"], ckpts + "/step-10");
  EXPECT_EQ(up["output_dir"], controller_->StorageDir(Run(prep), "output"));
  backend_.End(train, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  EXPECT_EQ(Run(eval).state, RunState::kRunning);
  const nlohmann::json eval_ready = LastEventData(Events(eval), "UpstreamReady");
  ASSERT_TRUE(eval_ready.is_object());
  EXPECT_EQ(eval_ready["upstreams"][0]["checkpoint"], "") << "train left no checkpoint";
}

TEST_F(ControllerTest, AFailedStageStopsTheStagesAfterItUnlessTheyOnlyNeedItFinished) {
  const std::vector<store::RunRecord> made = SubmitWorkflow(controller_.get());
  const std::string prep = made[0].name, train = made[1].name, eval = made[2].name;
  controller_->RunOnce();
  backend_.End(prep, {FailureClass::kUserError, 3});
  controller_->RunOnce();
  EXPECT_EQ(Run(prep).state, RunState::kFailed);
  // Both after it stop in the same pass: train because prep failed, eval because train stopped.
  for (const std::string& name : {train, eval}) {
    store::RunRecord r = Run(name);
    EXPECT_EQ(r.state, RunState::kCancelled) << name;
    EXPECT_EQ(r.reason, "UpstreamFailed") << name;
    EXPECT_EQ(r.attempts, 0) << name;
  }
  EXPECT_NE(Run(train).message.find("stage 'prep' (run " + prep + ") ended Failed (UserError)"),
            std::string::npos)
      << Run(train).message;
  EXPECT_NE(Run(eval).message.find("stage 'train'"), std::string::npos) << Run(eval).message;

  // eval that needs train only finished runs after a failed train.
  const std::vector<store::RunRecord> second =
      SubmitWorkflow(controller_.get(), spec::Condition::kFinished);
  controller_->RunOnce();
  backend_.End(second[0].name, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  backend_.End(second[1].name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  EXPECT_EQ(Run(second[1].name).state, RunState::kFailed);
  EXPECT_EQ(Run(second[2].name).state, RunState::kRunning);
}

TEST_F(ControllerTest, RetryStageRunsTheStageAndThoseItStoppedAgain) {
  const std::vector<store::RunRecord> made = SubmitWorkflow(controller_.get());
  const std::string workflow = made[0].workflow["name"];
  const std::string prep = made[0].name, train = made[1].name;
  controller_->RunOnce();
  EXPECT_EQ(controller_->RetryStage(workflow, "prep").status().code(),
            StatusCode::kFailedPrecondition)
      << "prep is still running";
  backend_.End(prep, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  backend_.End(train, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  ASSERT_EQ(Run(made[2].name).reason, "UpstreamFailed");
  EXPECT_EQ(controller_->RetryStage(workflow, "prep").status().code(),
            StatusCode::kFailedPrecondition)
      << "prep succeeded";
  EXPECT_EQ(controller_->RetryStage(workflow, "trian").status().code(), StatusCode::kNotFound);
  auto again = controller_->RetryStage(workflow, "train");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->size(), 2u);
  EXPECT_EQ((*again)[0].name, workflow + "-train-r2");
  EXPECT_EQ((*again)[0].workflow["after"][0]["run"], prep) << "prep's run, which succeeded";
  EXPECT_EQ((*again)[1].name, workflow + "-eval-r2");
  EXPECT_EQ((*again)[1].workflow["after"][0]["run"], workflow + "-train-r2");
  controller_->RunOnce();
  EXPECT_EQ(Run(workflow + "-train-r2").state, RunState::kRunning);
  EXPECT_EQ(Run(workflow + "-eval-r2").state, RunState::kQueued);
  backend_.End(workflow + "-train-r2", {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  EXPECT_EQ(Run(workflow + "-eval-r2").state, RunState::kRunning);
  store::RunFilter filter;
  filter.workflow = workflow;
  EXPECT_EQ(store_->ListRuns(filter)->size(), 5u);
}

// The server goes down in the middle of a workflow: nothing runs twice, a stage released before
// keeps what it was given, and the stages still waiting are released when their turn comes.
TEST_F(ControllerTest, AWorkflowCarriesOnAfterARestartWithNoStageRunTwice) {
  const std::vector<store::RunRecord> made = SubmitWorkflow(controller_.get());
  const std::string prep = made[0].name, train = made[1].name, eval = made[2].name;
  controller_->RunOnce();
  backend_.End(prep, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  ASSERT_EQ(Run(train).state, RunState::kRunning);
  backend_.alive.insert(train);  // its attempt outlives the server
  StopController();
  StartController();
  controller_->RunOnce();
  EXPECT_EQ(backend_.readopted, 1);
  EXPECT_EQ(backend_.launches[prep], 1);
  EXPECT_EQ(backend_.launches[train], 1);
  EXPECT_EQ(Run(eval).state, RunState::kQueued);
  backend_.End(train, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  EXPECT_EQ(Run(eval).state, RunState::kRunning);
  EXPECT_EQ(backend_.launches[eval], 1);
  auto types = EventTypes(train);
  EXPECT_EQ(std::count(types.begin(), types.end(), "UpstreamReady"), 1)
      << "the restart read it back rather than say it again";
}

TEST_F(ControllerTest, AWorkflowWhoseStagesFormACycleOrNameNoStageIsRefused) {
  BatchError error;
  BatchRequest cycle = MakeWorkflow();
  cycle.items[0].after = {{"eval", spec::Condition::kSucceeded, 0, 0}};
  auto refused = controller_->SubmitBatch(std::move(cycle), &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("in a cycle (prep <- eval <- train <- prep)"),
            std::string::npos)
      << refused.status().message();
  BatchRequest unknown = MakeWorkflow();
  unknown.items[2].after[0].stage = "trian";
  refused = controller_->SubmitBatch(std::move(unknown), &error);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(error.index, 2u);
  EXPECT_EQ(refused.status().message().rfind("runs[2].after[0]: no stage is named 'trian'", 0), 0u)
      << refused.status().message();
  BatchRequest stray = MakeBatch(2);
  stray.items[1].stage = "train";
  EXPECT_FALSE(controller_->SubmitBatch(std::move(stray), &error).ok());
  EXPECT_EQ(error.index, 1u);
  BatchRequest both = MakeWorkflow();
  both.array = BatchArray{0, 2, 1, {}};
  EXPECT_FALSE(controller_->SubmitBatch(std::move(both), &error).ok());
  EXPECT_TRUE(store_->ListRuns(store::RunFilter{})->empty());
}

TEST_F(ControllerTest, AnArraysMaxParallelHoldsTheRestOutOfTheQueueInIndexOrder) {
  BatchArray range{0, 4, 1, 2};
  BatchError error;
  auto made = controller_->SubmitBatch(MakeBatch(5, range), &error);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::vector<std::string> names;
  for (const store::RunRecord& r : made->runs) names.push_back(r.name);
  EXPECT_EQ(Run(names[4]).array["max_parallel"], 2);
  auto states = [&] {
    std::vector<RunState> out;
    for (const std::string& n : names) out.push_back(Run(n).state);
    return out;
  };
  controller_->RunOnce();
  EXPECT_EQ(states(),
            (std::vector<RunState>{RunState::kRunning, RunState::kRunning, RunState::kQueued,
                                   RunState::kQueued, RunState::kQueued}));
  nlohmann::json pending = controller_->PendingInfo(names[3]);
  EXPECT_EQ(pending.value("code", ""), "ArrayMaxParallel");
  EXPECT_NE(pending.value("reason", "").find("2 of array"), std::string::npos) << pending;
  EXPECT_NE(pending.value("reason", "").find("1 of its runs wait ahead"), std::string::npos)
      << pending;
  // A held run cancelled leaves its place to nobody; an ended one lets the next in.
  ASSERT_TRUE(controller_->Cancel(names[2]).ok());
  backend_.End(names[0], {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  EXPECT_EQ(states(),
            (std::vector<RunState>{RunState::kSucceeded, RunState::kRunning, RunState::kCancelled,
                                   RunState::kRunning, RunState::kQueued}));
  // A restarted server holds the same ones back.
  backend_.alive.insert(names[1]);
  backend_.alive.insert(names[3]);
  StopController();
  StartController();
  controller_->RunOnce();
  EXPECT_EQ(Run(names[4]).state, RunState::kQueued);
  EXPECT_EQ(controller_->PendingInfo(names[4]).value("code", ""), "ArrayMaxParallel");
  backend_.End(names[1], {FailureClass::kUserError, 1});
  controller_->RunOnce();
  EXPECT_EQ(Run(names[4]).state, RunState::kRunning);
  EXPECT_EQ(backend_.launches[names[4]], 1);

  BatchArray zero{0, 1, 1, 0};
  EXPECT_FALSE(controller_->SubmitBatch(MakeBatch(2, zero), &error).ok());
  EXPECT_NE(error.status.message().find("max_parallel 0 must be 1 to 10000"), std::string::npos)
      << error.status.message();
}

}  // namespace
TEST_F(ControllerTest, AServiceReplicaIsARunThatRestartsOnEveryFailureAndIsStoppedWhenNotLive) {
  constexpr char kService[] =
      "schema_version: 1\nkind: service\nname: svc\nrun:\n  entrypoint: train.py\n"
      "  workload_kind: job\nserve:\n  restart_backoff_initial: 1s\n  restart_backoff_max: 4s\n";
  // A service is not submitted as a run.
  server::SubmitRequest as_run;
  as_run.spec_file = "svc.yaml";
  as_run.spec_yaml = kService;
  as_run.code.push_back({"train.py", 0644, "pass\n"});
  as_run.caller.user = "alice";
  server::SubmitError refused;
  EXPECT_FALSE(controller_->Submit(as_run, &refused).ok());
  EXPECT_NE(refused.status.message().find("is a service"), std::string::npos);

  auto code = controller_->StoreCode({{"train.py", 0644, "pass\n"}}, std::nullopt, "alice", {});
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  server::ReplicaRequest request;
  request.service = "svc";
  request.revision = 3;
  request.port = 40123;
  request.spec_file = "svc.yaml";
  request.spec_yaml = kService;
  request.snapshot_digest = code->digest;
  request.caller.user = "alice";
  request.dry_run = true;
  server::SubmitError error;
  auto checked = controller_->SubmitReplica(request, &error);
  ASSERT_TRUE(checked.ok()) << error.status.ToString();
  EXPECT_TRUE(checked->name.empty()) << "a dry run records nothing";
  EXPECT_EQ(store_->CountRuns({}).value(), 0);

  request.dry_run = false;
  auto made = controller_->SubmitReplica(request, &error);
  ASSERT_TRUE(made.ok()) << error.status.ToString();
  const std::string name = made->name;
  EXPECT_EQ(name.rfind("svc-", 0), 0u);
  EXPECT_EQ(Run(name).service, (nlohmann::json{{"name", "svc"}, {"revision", 3}, {"port", 40123}}));
  controller_->RunOnce();
  EXPECT_EQ(Run(name).state, RunState::kRunning);

  // It exits (any failure class, even a clean exit's failure of a server): restarted after its
  // serve backoff, doubling, never giving up.
  for (int64_t backoff : {1'000, 2'000, 4'000, 4'000}) {
    backend_.End(name, {FailureClass::kUserError, 1});
    controller_->RunOnce();
    ASSERT_EQ(Run(name).state, RunState::kQueued);
    EXPECT_EQ(*Run(name).not_before_ms, clock_.NowMillis() + backoff);
    clock_.Advance(backoff);
    controller_->RunOnce();
    ASSERT_EQ(Run(name).state, RunState::kRunning);
  }
  EXPECT_EQ(Run(name).attempts, 5);
  // After ten minutes of serving, a crash is restarted after the first backoff again.
  clock_.Advance(10 * 60 * 1000);
  backend_.End(name, {FailureClass::kUserError, 1});
  controller_->RunOnce();
  EXPECT_EQ(*Run(name).not_before_ms, clock_.NowMillis() + 1'000);
  clock_.Advance(1'000);
  controller_->RunOnce();
  ASSERT_EQ(Run(name).state, RunState::kRunning);

  // A failed liveness probe stops the running attempt, through the backend.
  controller_->RestartReplica(name, "liveness probe failed 3 times in a row");
  controller_->RunOnce();
  EXPECT_TRUE(backend_.stop_requested.count(name));

  // A replica of a spec that is not a service is refused.
  request.spec_yaml =
      "schema_version: 1\nname: svc\nrun:\n  entrypoint: train.py\n  workload_kind: job\n";
  server::SubmitError not_service;
  EXPECT_FALSE(controller_->SubmitReplica(request, &not_service).ok());
  EXPECT_NE(not_service.status.message().find("not a service"), std::string::npos);
}

}  // namespace tau::server

namespace tau::server {
namespace {

// A day's budget of 0.001 CPU-hours (3.6 CPU-seconds) for workspace `default`.
constexpr char kBudgetPlatform[] = R"(flavors: [{name: f}]
queues:
  - name: default
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors: [{name: f, resources: [{name: cpu, nominal: 4}, {name: memory, nominal: 8Gi}]}]
workspaces:
  - name: default
    members: ["*"]
    default_queue: default
budgets:
  - workspace: default
    cpu_hours: 0.001
    period: day
)";

TEST_F(ControllerTest, ASpentBudgetHoldsRunsUntilItsPeriodEndsAndARestartMetersNothingTwice) {
  StopController();
  ASSERT_TRUE(WriteFileAtomic(home_ + "/platform.yaml", kBudgetPlatform, 0600).ok());
  clock_.Set(*ParseRfc3339("2026-12-06T23:58:00Z"));
  StartController();
  const std::string cpus = "compute:\n  cpus: 1\n";
  const std::string first = Submit("first", cpus);
  controller_->RunOnce();
  ASSERT_EQ(Run(first).state, RunState::kRunning);
  clock_.Advance(10'000);  // 10 CPU-seconds: more than the day's 3.6
  backend_.End(first, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  ASSERT_EQ(Run(first).state, RunState::kSucceeded);
  std::vector<store::Event> events = Events(first);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back().type, "Succeeded");
  const store::Event& metered = events[events.size() - 2];
  EXPECT_EQ(metered.type, "Metered");
  EXPECT_DOUBLE_EQ(metered.data.value("cpu_hours", 0.0), 10.0 / 3600);

  const std::string second = Submit("second", cpus);
  controller_->RunOnce();
  EXPECT_EQ(Run(second).state, RunState::kQueued);
  EXPECT_EQ(backend_.launches[second], 0);
  nlohmann::json pending = controller_->PendingInfo(second);
  EXPECT_EQ(pending.value("code", ""), "BudgetSpent");
  EXPECT_EQ(pending.value("reason", ""),
            "budget of workspace default spent: 0.0028 of 0.0010 CPU-h today; resets in 1m; "
            "it enters its queue once the budget has room");
  const nlohmann::json before = controller_->Budgets();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_TRUE(before[0].value("spent", false));

  // A restart reads what was held back from the store, once.
  StopController();
  StartController();
  controller_->RunOnce();
  EXPECT_EQ(controller_->Budgets()[0]["used"], before[0]["used"]);
  EXPECT_EQ(Run(second).state, RunState::kQueued);
  EXPECT_EQ(controller_->PendingInfo(second).value("code", ""), "BudgetSpent");

  // The next day the budget is whole again: the run goes.
  clock_.Set(*ParseRfc3339("2026-12-07T00:00:00Z"));
  controller_->RunOnce();
  EXPECT_EQ(Run(second).state, RunState::kRunning);
  std::vector<std::string> types = EventTypes(second);
  EXPECT_NE(std::find(types.begin(), types.end(), "BudgetHold"), types.end());
  EXPECT_NE(std::find(types.begin(), types.end(), "BudgetAvailable"), types.end());
  EXPECT_DOUBLE_EQ(controller_->Budgets()[0]["used"].value("cpu_hours", 1.0), 0.0);
}

// Stalls: limits.stall of workspace `default`.
constexpr char kStallPlatform[] = R"(flavors: [{name: f}]
queues:
  - name: default
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors: [{name: f, resources: [{name: cpu, nominal: 4}, {name: memory, nominal: 8Gi}]}]
workspaces:
  - name: default
    members: ["*"]
    default_queue: default
    limits:
      stall: {after: 1m, stop_after: 5m}
)";

TEST_F(ControllerTest, AQuietRunIsDumpedMarkedAndStoppedButOneWhoseOutputCannotBeMeasuredIsNot) {
  StopController();
  ASSERT_TRUE(WriteFileAtomic(home_ + "/platform.yaml", kStallPlatform, 0600).ok());
  StartController();
  const std::string cpus = "compute:\n  cpus: 1\n";
  const std::string quiet = Submit("quiet", cpus), unmeasured = Submit("unmeasured", cpus);
  controller_->RunOnce();
  ASSERT_EQ(Run(quiet).state, RunState::kRunning);
  ASSERT_EQ(Run(unmeasured).state, RunState::kRunning);
  backend_.output[quiet] = 100;
  auto pass_after = [&](int64_t ms) {
    clock_.Advance(ms);
    controller_->RunOnce();
  };
  pass_after(1'000);  // 100 bytes written since it started: progress
  pass_after(30'000);
  backend_.output[quiet] = 250;
  pass_after(1'000);  // more: quiet from here
  pass_after(59'000);
  EXPECT_EQ(backend_.dumps[quiet], 0);
  pass_after(1'000);  // a minute without output
  EXPECT_EQ(backend_.dumps[quiet], 1);
  std::vector<store::Event> events = Events(quiet);
  auto mark = std::find_if(events.begin(), events.end(),
                           [](const store::Event& e) { return e.type == "StallDetected"; });
  ASSERT_NE(mark, events.end());
  EXPECT_EQ(mark->message,
            "no log output and no metric points for 1m; 1 Python process asked to write their "
            "stacks to the log");
  EXPECT_EQ(mark->data.value("stack_dumps", 0), 1);
  EXPECT_FALSE(backend_.stop_requested.count(quiet));
  pass_after(4 * 60'000);  // five minutes quiet: stopped as Stalled
  EXPECT_TRUE(backend_.stop_requested.count(quiet));
  EXPECT_EQ(backend_.dumps[quiet], 1);  // once per quiet stretch
  // The run the backend cannot measure was never taken for stalled.
  EXPECT_EQ(backend_.dumps[unmeasured], 0);
  EXPECT_FALSE(backend_.stop_requested.count(unmeasured));
  std::vector<std::string> types = EventTypes(unmeasured);
  EXPECT_EQ(std::find(types.begin(), types.end(), "StallDetected"), types.end());
}

// Costs: an hour of the flavor's CPU costs 2.
constexpr char kCostPlatform[] = R"(flavors: [{name: f}]
queues:
  - name: default
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors: [{name: f, resources: [{name: cpu, nominal: 4}, {name: memory, nominal: 8Gi}]}]
workspaces:
  - name: default
    members: ["*"]
    default_queue: default
costs:
  currency: credits
  flavors: {f: {cpu_hour: 2}}
)";

TEST_F(ControllerTest, UsageIsPricedByFlavorAndSplitIntoDays) {
  StopController();
  ASSERT_TRUE(WriteFileAtomic(home_ + "/platform.yaml", kCostPlatform, 0600).ok());
  clock_.Set(*ParseRfc3339("2026-12-06T23:00:00Z"));
  StartController();
  const std::string run = Submit("priced", "compute:\n  cpus: 1\n");
  controller_->RunOnce();
  ASSERT_EQ(Run(run).state, RunState::kRunning);
  clock_.Advance(2 * 3'600'000);  // one CPU for two hours, over midnight
  backend_.End(run, {FailureClass::kSucceeded, 0});
  controller_->RunOnce();
  const int64_t day = *ParseRfc3339("2026-12-06T00:00:00Z");
  auto rows = controller_->Usage("flavor", day);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0]["key"], "f");
  EXPECT_DOUBLE_EQ((*rows)[0]["cpu_hours"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ((*rows)[0]["cost"].get<double>(), 4.0);
  EXPECT_TRUE((*rows)[0]["idle_share"].is_null());  // no GPU was sampled
  // From 23:30 on, half an hour of the first day counts.
  auto later = controller_->Usage("workspace", day + 23 * 3'600'000 + 1'800'000);
  ASSERT_TRUE(later.ok());
  EXPECT_DOUBLE_EQ((*later)[0]["cpu_hours"].get<double>(), 1.5);

  auto series = controller_->UsageSeries("workspace", day + 3'600'000, 86'400'000);
  ASSERT_TRUE(series.ok()) << series.status().ToString();
  EXPECT_EQ((*series)["buckets"],
            nlohmann::json::array({"2026-12-06T00:00:00.000Z", "2026-12-07T00:00:00.000Z"}));
  ASSERT_EQ((*series)["series"].size(), 1u);
  EXPECT_EQ((*series)["series"][0]["key"], "default");
  EXPECT_EQ((*series)["series"][0]["cpu_hours"], nlohmann::json::array({1.0, 1.0}));
  EXPECT_FALSE(controller_->Usage("gpu", day).ok());
  EXPECT_FALSE(controller_->UsageSeries("workspace", 0, 3'600'000).ok());  // too many buckets
}

}  // namespace
}  // namespace tau::server
