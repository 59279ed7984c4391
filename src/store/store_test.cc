#include "store/store.h"

#include <sqlite3.h>

#include <atomic>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/files.h"
#include "common/hash.h"

namespace tau::store {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tau_store_test_" + std::to_string(::getpid());
    ASSERT_TRUE(RemoveTree(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    auto s = Store::Open(dir_ + "/tau.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    (void)RemoveTree(dir_);
  }
  RunRecord MakeRun(const std::string& name) {
    RunRecord r;
    r.name = name;
    r.spec_name = "demo";
    r.spec_file = "tau.yaml";
    r.spec_yaml = "name: demo\n";
    r.spec_json = {{"name", "demo"}};
    r.config_hash = "abc";
    r.queue = "default";
    r.workspace = "default";
    r.created_ms = 1;
    r.updated_ms = 1;
    return r;
  }
  // Ends run `name` (inserted before) in `state` at `finished_ms`.
  void End(const std::string& name, RunState state, int64_t finished_ms) {
    RunRecord r = *store_->GetRun(name);
    r.state = state;
    r.finished_ms = finished_ms;
    Batch b;
    b.runs.push_back(r);
    ASSERT_TRUE(store_->Commit(b).ok());
  }
  std::vector<std::string> Due(PruneKind kind, int64_t cutoff_ms,
                               std::optional<RetentionDue> after = std::nullopt,
                               int64_t limit = 0) {
    auto due = store_->ListRetentionDue(kind, cutoff_ms, after, limit);
    EXPECT_TRUE(due.ok()) << due.status().ToString();
    std::vector<std::string> names;
    if (due.ok())
      for (const RetentionDue& d : *due) names.push_back(d.name);
    return names;
  }
  std::string dir_;
  std::unique_ptr<Store> store_;
};

using Names = std::vector<std::string>;

TEST_F(StoreTest, InsertGetAndDuplicate) {
  RunRecord r = MakeRun("demo-1");
  ASSERT_TRUE(store_->InsertRun(&r, {Event{0, "demo-1", 1, "Submitted", "", {}, "", ""}}).ok());
  EXPECT_EQ(r.seq, 1);
  RunRecord r2 = MakeRun("demo-2");
  ASSERT_TRUE(store_->InsertRun(&r2, {}).ok());
  EXPECT_EQ(r2.seq, 2);
  RunRecord dup = MakeRun("demo-1");
  EXPECT_EQ(store_->InsertRun(&dup, {}).code(), StatusCode::kAlreadyExists);
  auto got = store_->GetRun("demo-1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->spec_json["name"], "demo");
  EXPECT_EQ(got->state, RunState::kQueued);
  EXPECT_EQ(store_->GetRun("nope").status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, SubmissionKeysFindTheirRunAndAreUniquePerOwner) {
  RunRecord a = MakeRun("a-1");
  a.owner = "alice";
  a.submit_key = "k1";
  ASSERT_TRUE(store_->InsertRun(&a, {}).ok());
  RunRecord unkeyed = MakeRun("a-2");
  unkeyed.owner = "alice";
  ASSERT_TRUE(store_->InsertRun(&unkeyed, {}).ok());
  RunRecord b = MakeRun("b-1");
  b.owner = "bob";
  b.submit_key = "k1";  // another owner's key of the same text is another key
  ASSERT_TRUE(store_->InsertRun(&b, {}).ok());

  auto found = store_->FindRunBySubmitKey("alice", "k1");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->name, "a-1");
  EXPECT_EQ(found->submit_key, "k1");
  EXPECT_EQ(store_->FindRunBySubmitKey("bob", "k1")->name, "b-1");
  EXPECT_EQ(store_->FindRunBySubmitKey("alice", "k2").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->FindRunBySubmitKey("alice", "").status().code(), StatusCode::kNotFound)
      << "runs without a key are never found by the empty key";

  RunRecord again = MakeRun("a-3");
  again.owner = "alice";
  again.submit_key = "k1";
  EXPECT_FALSE(store_->InsertRun(&again, {}).ok()) << "a key is unique per owner";
  EXPECT_EQ(store_->GetRun("a-3").status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, BatchCommitAndFilters) {
  for (int i = 0; i < 5; ++i) {
    RunRecord r = MakeRun("r" + std::to_string(i));
    ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  }
  RunRecord r = *store_->GetRun("r2");
  const std::string owner = r.owner;
  const nlohmann::json resolved = r.resolved;
  r.state = RunState::kSucceeded;
  r.exit_code = 0;
  r.gpus = {1, 3};
  // What a run was submitted with is written once: a commit carries only its progress.
  r.owner = "mallory";
  r.resolved = {{"queue", "elsewhere"}};
  r.flavors = {{"main", {{"nvidia.com/gpu", "h100"}}}};
  r.preemptions = 2;
  AttemptRecord a;
  a.run = "r2";
  a.number = 1;
  a.state = AttemptState::kFinished;
  a.shim_pid = 42;
  a.exit_code = 0;
  Batch b;
  b.runs.push_back(r);
  b.attempts.push_back(a);
  b.events.push_back(Event{0, "r2", 5, "Succeeded", "done", {{"exit_code", 0}}, "", ""});
  ASSERT_TRUE(store_->Commit(b).ok());
  auto got = *store_->GetRun("r2");
  EXPECT_EQ(got.state, RunState::kSucceeded);
  EXPECT_EQ(got.gpus, (std::vector<int>{1, 3}));
  EXPECT_EQ(*got.exit_code, 0);
  EXPECT_EQ(got.owner, owner);
  EXPECT_EQ(got.resolved, resolved);
  EXPECT_EQ(got.flavors["main"]["nvidia.com/gpu"], "h100");
  EXPECT_EQ(got.preemptions, 2);
  EXPECT_EQ(store_->ListAttempts("r2")->at(0).shim_pid, 42);
  RunFilter active;
  active.active_only = true;
  EXPECT_EQ(*store_->CountRuns(active), 4);
  RunFilter page;
  page.limit = 2;
  page.offset = 1;
  auto runs = *store_->ListRuns(page);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "r3");  // newest first
  RunFilter done;
  done.state = RunState::kSucceeded;
  EXPECT_EQ(store_->ListRuns(done)->size(), 1u);
  RunFilter in_queue;
  in_queue.queue = r.queue;
  EXPECT_EQ(*store_->CountRuns(in_queue), 5);
  in_queue.queue = "elsewhere";
  EXPECT_EQ(*store_->CountRuns(in_queue), 0);
}

TEST_F(StoreTest, CommitOfAnUnknownRunWritesNothing) {
  RunRecord known = MakeRun("known");
  ASSERT_TRUE(store_->InsertRun(&known, {}).ok());
  known.state = RunState::kRunning;
  RunRecord ghost = MakeRun("ghost");
  Batch b;
  b.runs.push_back(known);
  b.runs.push_back(ghost);
  b.events.push_back(Event{0, "known", 5, "Running", "", {}, "", ""});
  Status s = store_->Commit(b);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("ghost"), std::string::npos) << s.message();
  // All or nothing: the known run's change and the event were rolled back too.
  EXPECT_EQ(store_->GetRun("known")->state, RunState::kQueued);
  EXPECT_TRUE(store_->ListEvents("known")->empty());
  EXPECT_EQ(store_->GetRun("ghost").status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, StatementsAreReusedWithFreshBindings) {
  // The same statements run again and again (prepared once): each use sees only its own values.
  for (int i = 0; i < 20; ++i) {
    RunRecord r = MakeRun("loop-" + std::to_string(i));
    ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
    r.state = i % 2 ? RunState::kSucceeded : RunState::kFailed;
    r.exit_code = i % 3 ? std::optional<int>(i) : std::nullopt;
    Batch b;
    b.runs.push_back(r);
    ASSERT_TRUE(store_->Commit(b).ok());
  }
  for (int i = 0; i < 20; ++i) {
    auto got = store_->GetRun("loop-" + std::to_string(i));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->state, i % 2 ? RunState::kSucceeded : RunState::kFailed);
    EXPECT_EQ(got->exit_code, i % 3 ? std::optional<int>(i) : std::nullopt) << i;
  }
  RunFilter page;
  page.limit = 3;
  page.offset = 2;
  auto runs = store_->ListRuns(page);
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ((*runs)[0].name, "loop-17");
  page.limit = 0;  // no limit, with the same statement
  page.offset = 18;
  EXPECT_EQ(store_->ListRuns(page)->size(), 2u);
}

TEST_F(StoreTest, ConcurrentInsertsEachGetTheirOwnOutcome) {
  // Eight submitters at once, every fifth name taken already: the inserts share transactions, but
  // each is refused or stored on its own, with a sequence number of its own and its events chained.
  for (int i = 0; i < 40; i += 5) {
    RunRecord r = MakeRun("c-" + std::to_string(i));
    ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  }
  std::vector<std::thread> threads;
  std::atomic<int> inserted{0}, refused{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 40; i += 8) {
        RunRecord r = MakeRun("c-" + std::to_string(i));
        Status s = store_->InsertRun(&r, {Event{0, r.name, 1, "Submitted", "", {}, "", ""},
                                          Event{0, r.name, 2, "Queued", "", {{"i", i}}, "", ""}});
        if (s.ok()) {
          ++inserted;
        } else {
          EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
          EXPECT_EQ(i % 5, 0) << r.name;
          ++refused;
        }
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(inserted, 32);
  EXPECT_EQ(refused, 8);
  RunFilter all;
  auto runs = store_->ListRuns(all);
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 40u);
  std::set<int64_t> seqs;
  for (const RunRecord& r : *runs) seqs.insert(r.seq);
  EXPECT_EQ(seqs.size(), 40u);
  EXPECT_EQ(*seqs.begin(), 1);
  EXPECT_EQ(*seqs.rbegin(), 40);
  for (int i = 0; i < 40; ++i) {
    auto events = store_->ListEvents("c-" + std::to_string(i));
    ASSERT_TRUE(events.ok());
    if (i % 5 == 0) {
      EXPECT_TRUE(events->empty());  // the refused insert left nothing
      continue;
    }
    ASSERT_EQ(events->size(), 2u);
    EXPECT_EQ((*events)[0].prev_hash, "");
    EXPECT_EQ((*events)[1].prev_hash, (*events)[0].hash);
    EXPECT_EQ((*events)[1].data["i"], i);
  }
}

TEST_F(StoreTest, InsertRunsIsOneTransactionAndAllOrNothing) {
  std::vector<RunRecord> runs;
  std::vector<std::vector<Event>> events;
  for (int i = 0; i < 100; ++i) {
    runs.push_back(MakeRun("arr-" + std::to_string(i)));
    runs.back().array = {{"name", "arr"}, {"index", i}, {"first", 0}, {"last", 99}, {"step", 1}};
    events.push_back({Event{0, runs.back().name, 1, "Submitted", "", {{"i", i}}, "", ""},
                      Event{0, runs.back().name, 1, "Queued", "", {}, "", ""}});
  }
  const int64_t before = store_->TransactionsCommitted();
  ASSERT_TRUE(store_->InsertRuns(&runs, events).ok());
  EXPECT_EQ(store_->TransactionsCommitted(), before + 1);  // one fsync for the hundred
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(runs[i].seq, i + 1);
    auto got = store_->GetRun("arr-" + std::to_string(i));
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->array["index"], i);
    auto chain = store_->ListEvents(got->name);
    ASSERT_TRUE(chain.ok());
    ASSERT_EQ(chain->size(), 2u);
    EXPECT_EQ((*chain)[1].prev_hash, (*chain)[0].hash);
  }
  EXPECT_TRUE(store_->GetRun("demo-x").status().code() == StatusCode::kNotFound);
  // The third name is taken: none of the three is written, nor any of their events.
  std::vector<RunRecord> clash = {MakeRun("new-1"), MakeRun("new-2"), MakeRun("arr-7")};
  std::vector<std::vector<Event>> clash_events(3);
  for (int i = 0; i < 3; ++i)
    clash_events[i] = {Event{0, clash[i].name, 1, "Submitted", "", {}, "", ""}};
  Status s = store_->InsertRuns(&clash, clash_events);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  EXPECT_NE(s.message().find("arr-7"), std::string::npos) << s.message();
  for (const char* name : {"new-1", "new-2"}) {
    EXPECT_EQ(store_->GetRun(name).status().code(), StatusCode::kNotFound) << name;
    EXPECT_TRUE(store_->ListEvents(name)->empty()) << name;
  }
  EXPECT_EQ(store_->ListEvents("arr-7")->size(), 2u);  // the run that held the name is untouched
  RunFilter all;
  EXPECT_EQ(store_->ListRuns(all)->size(), 100u);
  // A run of its own has no array.
  RunRecord single = MakeRun("single");
  ASSERT_TRUE(store_->InsertRun(&single, {}).ok());
  EXPECT_TRUE(store_->GetRun("single")->array.is_null());
  // Two lists that do not match are refused, writing nothing.
  std::vector<RunRecord> odd = {MakeRun("odd-1")};
  EXPECT_EQ(store_->InsertRuns(&odd, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetRun("odd-1").status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, EventsAreHashChained) {
  RunRecord r = MakeRun("c");
  ASSERT_TRUE(store_
                  ->InsertRun(&r, {Event{0, "c", 1, "Submitted", "", {}, "", ""},
                                   Event{0, "c", 2, "Queued", "", {}, "", ""}})
                  .ok());
  Batch b;
  b.events.push_back(Event{0, "c", 3, "Admitted", "", {{"gpus", 0}}, "", ""});
  ASSERT_TRUE(store_->Commit(b).ok());
  auto events = *store_->ListEvents("c");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].prev_hash, "");
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].prev_hash, events[i - 1].hash);
  nlohmann::json body = {
      {"run", "c"}, {"ts_ms", 3}, {"type", "Admitted"}, {"message", ""}, {"data", {{"gpus", 0}}}};
  EXPECT_EQ(events[2].hash, Sha256Hex(events[1].hash + "\n" + body.dump()));
}

TEST_F(StoreTest, SurvivesReopen) {
  RunRecord r = MakeRun("persist");
  ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  store_.reset();
  auto s = Store::Open(dir_ + "/tau.db");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE((*s)->GetRun("persist").ok());
}

}  // namespace
TEST_F(StoreTest, RunUsersAreGivenOncePerUserAndNeverShared) {
  const std::vector<std::string> pool = {"tau-a1", "tau-a2"};
  auto alice = store_->AssignRunUser("a", "alice", {}, pool, 1);
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  EXPECT_EQ(*alice, "tau-a1");
  EXPECT_EQ(*store_->AssignRunUser("a", "alice", {}, pool, 2), "tau-a1") << "kept";
  EXPECT_EQ(*store_->AssignRunUser("a", "bob", {}, pool, 3), "tau-a2");
  auto carol = store_->AssignRunUser("a", "carol", {}, pool, 4);
  ASSERT_FALSE(carol.ok());
  EXPECT_EQ(carol.status().code(), StatusCode::kResourceExhausted);
  // A system user moved to another workspace's pool is still alice's: never shared.
  auto other = store_->AssignRunUser("b", "dave", {}, {"tau-a1", "tau-b1"}, 5);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, "tau-b1");
  // Taken out of alice's pool but still on the machine (the caller keeps it), hers stays hers:
  // a second one would be hers for good too, and lock someone else out.
  EXPECT_EQ(*store_->AssignRunUser("a", "alice", {"tau-a1"}, {"tau-a2", "tau-a3"}, 6), "tau-a1");
  // Gone from the machine as well, she needs a free one, when there is one.
  EXPECT_FALSE(store_->AssignRunUser("a", "alice", {}, {"tau-a2"}, 7).ok());
  EXPECT_EQ(*store_->AssignRunUser("a", "alice", {}, {"tau-a2", "tau-a3"}, 8), "tau-a3");
  // With both back, she runs as the newest, every time: one uid from then on.
  for (int64_t t : {9, 10, 11})
    EXPECT_EQ(*store_->AssignRunUser("a", "alice", {}, {"tau-a1", "tau-a2", "tau-a3"}, t),
              "tau-a3");
  auto hers = store_->RunUsersOf("a", "alice");
  ASSERT_TRUE(hers.ok());
  ASSERT_EQ(hers->size(), 2u);
  EXPECT_EQ((*hers)[0].system_user, "tau-a3") << "newest first";
  auto all = store_->ListRunUsers();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[0].system_user, "tau-a1");
  EXPECT_EQ((*all)[0].user, "alice");
}

TEST_F(StoreTest, RunAsIsKeptAndUnsetForOlderRuns) {
  RunRecord a = MakeRun("a");
  a.run_as = "tau-a1";
  ASSERT_TRUE(store_->InsertRun(&a, {}).ok());
  RunRecord b = MakeRun("b");
  b.run_as = "";
  ASSERT_TRUE(store_->InsertRun(&b, {}).ok());
  RunRecord c = MakeRun("c");
  ASSERT_TRUE(store_->InsertRun(&c, {}).ok());
  EXPECT_EQ(store_->GetRun("a")->run_as, std::optional<std::string>("tau-a1"));
  EXPECT_EQ(store_->GetRun("b")->run_as, std::optional<std::string>(""));
  EXPECT_FALSE(store_->GetRun("c")->run_as.has_value());
}

TEST_F(StoreTest, RetentionDueListsEndedRunsNotPrunedOldestFirst) {
  for (const char* name : {"a", "b", "c", "d", "e", "live"}) {
    RunRecord r = MakeRun(name);
    ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  }
  End("a", RunState::kSucceeded, 300);
  End("b", RunState::kFailed, 100);
  End("c", RunState::kCancelled, 200);
  End("d", RunState::kSucceeded, 200);  // same time as c: seq orders them
  End("e", RunState::kSucceeded, 900);  // not due yet
  // "live" is still queued: never due, however old.
  EXPECT_EQ(Due(PruneKind::kLogs, 500), (Names{"b", "c", "d", "a"}));
  EXPECT_EQ(Due(PruneKind::kLogs, 200), (Names{"b", "c", "d"}));
  EXPECT_EQ(Due(PruneKind::kLogs, 99), Names{});

  // Pages: each starts after the last run of the one before.
  auto first = store_->ListRetentionDue(PruneKind::kLogs, 500, std::nullopt, 2);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ(first->back().name, "c");
  EXPECT_EQ(first->back().finished_ms, 200);
  EXPECT_EQ(Due(PruneKind::kLogs, 500, first->back(), 2), (Names{"d", "a"}));
  EXPECT_EQ(Due(PruneKind::kLogs, 500, RetentionDue{"a", 300, 1}), Names{});

  // Marked runs leave that kind's list (and only that kind's); a second mark keeps the first time.
  ASSERT_TRUE(store_->MarkPruned(PruneKind::kLogs, {"b", "d"}, 1000).ok());
  EXPECT_EQ(Due(PruneKind::kLogs, 500), (Names{"c", "a"}));
  EXPECT_EQ(Due(PruneKind::kGpuSamples, 500), (Names{"b", "c", "d", "a"}));
  ASSERT_TRUE(store_->MarkPruned(PruneKind::kLogs, {"b"}, 2000).ok());
  EXPECT_EQ(store_->GetRun("b")->logs_pruned_ms, std::optional<int64_t>(1000));
  EXPECT_FALSE(store_->GetRun("b")->samples_pruned_ms.has_value());
  ASSERT_TRUE(store_->MarkPruned(PruneKind::kGpuSamples, {"a"}, 1500).ok());
  EXPECT_EQ(Due(PruneKind::kGpuSamples, 500), (Names{"b", "c", "d"}));
  EXPECT_EQ(store_->GetRun("a")->samples_pruned_ms, std::optional<int64_t>(1500));

  // A commit (progress) never clears a mark.
  RunRecord b = *store_->GetRun("b");
  b.logs_pruned_ms.reset();
  b.message = "touched";
  Batch batch;
  batch.runs.push_back(b);
  ASSERT_TRUE(store_->Commit(batch).ok());
  EXPECT_EQ(store_->GetRun("b")->logs_pruned_ms, std::optional<int64_t>(1000));
  EXPECT_EQ(Due(PruneKind::kLogs, 500), (Names{"c", "a"}));
}

TEST_F(StoreTest, SummaryRowsLeaveTheHeavyColumnsAndKeepWhatAPageShows) {
  RunRecord r = MakeRun("big");
  r.spec_json = {{"name", "demo"}, {"kind", "rayjob"}};
  r.resolved = {{"queue", "default"}, {"provenance", nlohmann::json::array()}};
  r.resources = {{"gpus", 2}, {"workers", 1}};
  r.owner = "alice";
  r.priority = 7;
  ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  RunRecord ended = *store_->GetRun("big");
  ended.state = RunState::kFailed;
  ended.reason = "UserError";
  ended.exit_code = 3;
  ended.gpus = {0, 1};
  ended.flavors = {{"main", {{"nvidia.com/gpu", "h100"}}}};
  ended.finished_ms = 50;
  Batch b;
  b.runs.push_back(ended);
  ASSERT_TRUE(store_->Commit(b).ok());

  RunFilter filter;
  filter.summary = true;
  auto rows = store_->ListRuns(filter);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  const RunRecord& s = rows->front();
  RunRecord full = *store_->GetRun("big");
  EXPECT_EQ(full.kind, "rayjob");
  EXPECT_EQ(full.spec_json["kind"], "rayjob");
  // Left empty.
  EXPECT_EQ(s.spec_yaml, "");
  EXPECT_TRUE(s.spec_json.is_null() || s.spec_json.empty());
  EXPECT_TRUE(s.resolved.empty());
  EXPECT_TRUE(s.flavors.empty());
  // Filled as the full row has them.
  EXPECT_EQ(s.name, full.name);
  EXPECT_EQ(s.seq, full.seq);
  EXPECT_EQ(s.kind, "rayjob");
  EXPECT_EQ(s.spec_name, full.spec_name);
  EXPECT_EQ(s.spec_file, full.spec_file);
  EXPECT_EQ(s.state, RunState::kFailed);
  EXPECT_EQ(s.reason, "UserError");
  EXPECT_EQ(s.exit_code, std::optional<int>(3));
  EXPECT_EQ(s.gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.resources, full.resources);
  EXPECT_EQ(s.owner, "alice");
  EXPECT_EQ(s.priority, 7);
  EXPECT_EQ(s.config_hash, full.config_hash);
  EXPECT_EQ(s.finished_ms, std::optional<int64_t>(50));
  EXPECT_EQ(s.created_ms, full.created_ms);
}

// A store made by the tau before version 9, with runs in it, opens migrated: the kind comes from
// each run's spec, its ended runs are due for retention (none marked pruned), the rest is kept.
TEST_F(StoreTest, MigratesAVersion7StoreWithItsRuns) {
  store_.reset();
  const std::string path = dir_ + "/old.db";
  ASSERT_TRUE(Store::CreateSchemaForTest(path, 7).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* rows = R"sql(
INSERT INTO runs (name, seq, spec_name, spec_file, spec_yaml, spec_json, config_hash,
  snapshot_digest, snapshot_dir, workspace, queue, priority, resources, state, reason, message,
  attempts, gpus, cancel_requested, created_ms, updated_ms, finished_ms, owner, resolved)
VALUES
  ('old-1', 1, 'old', 'tau.yaml', 'name: old', '{"kind":"job","name":"old"}', 'h1', 'd', '/s',
   'default', 'default', 0, '{"gpus":1}', 'Succeeded', 'Succeeded', '', 1, '[]', 0, 1, 2, 10,
   'alice', '{}'),
  ('old-2', 2, 'old', 'tau.yaml', 'name: old', '{"kind":"rayjob","name":"old"}', 'h2', 'd', '/s',
   'default', 'default', 0, '{}', 'Queued', '', '', 0, '[]', 0, 3, 3, NULL, 'bob', '{}'),
  ('old-3', 3, 'old', 'tau.yaml', 'name: old', 'not json', 'h3', 'd', '/s',
   'default', 'default', 0, '{}', 'Failed', 'UserError', '', 1, '[]', 0, 4, 5, 20, 'bob', '{}');
INSERT INTO events (run, ts_ms, type, message, data, prev_hash, hash)
  VALUES ('old-1', 1, 'Submitted', '', '{}', '', 'x');
)sql";
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, rows, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_close(db);

  auto opened = Store::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  store_ = std::move(*opened);
  auto one = store_->GetRun("old-1");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->kind, "job");
  EXPECT_EQ(one->owner, "alice");
  EXPECT_EQ(one->resources["gpus"], 1);
  EXPECT_FALSE(one->logs_pruned_ms.has_value());
  EXPECT_EQ(store_->GetRun("old-2")->kind, "rayjob");
  EXPECT_EQ(store_->GetRun("old-3")->kind, "") << "a spec that is not JSON has no kind";
  EXPECT_EQ(store_->ListEvents("old-1")->size(), 1u);
  EXPECT_EQ(Due(PruneKind::kLogs, 100), (Names{"old-1", "old-3"}));
  EXPECT_EQ(Due(PruneKind::kGpuSamples, 15), Names{"old-1"});
  RunFilter active;
  active.active_only = true;
  auto live = store_->ListRuns(active);
  ASSERT_TRUE(live.ok());
  ASSERT_EQ(live->size(), 1u);
  EXPECT_EQ(live->front().name, "old-2");
  // New runs go on after the old ones.
  RunRecord r = MakeRun("new-1");
  ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  EXPECT_EQ(r.seq, 4);
  // Opened again, nothing is migrated twice.
  store_.reset();
  opened = Store::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  store_ = std::move(*opened);
  EXPECT_EQ(store_->GetRun("old-1")->kind, "job");
}

// `tau list --project P --group G`: the columns come from the spec's experiment fields, and a page
// filters on them (summary rows included, which read no spec).
TEST_F(StoreTest, ListsFilterByTheSpecsExperimentProjectAndGroup) {
  auto add = [&](const std::string& name, const std::string& project, const std::string& group) {
    RunRecord r = MakeRun(name);
    r.spec_json["experiment"] = {{"project", project}, {"name", ""}, {"group", group}};
    ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  };
  add("a1", "vision", "lr");
  add("a2", "vision", "bs");
  add("b1", "speech", "lr");
  RunRecord plain = MakeRun("c1");  // no experiment section
  ASSERT_TRUE(store_->InsertRun(&plain, {}).ok());
  auto names = [&](const std::string& project, const std::string& group) {
    RunFilter f;
    f.summary = true;
    f.newest_first = false;
    f.project = project;
    f.group = group;
    Names out;
    auto rows = store_->ListRuns(f);
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    if (rows.ok())
      for (const RunRecord& r : *rows) out.push_back(r.name);
    EXPECT_EQ(*store_->CountRuns(f), static_cast<int64_t>(out.size()));
    return out;
  };
  EXPECT_EQ(names("vision", ""), (Names{"a1", "a2"}));
  EXPECT_EQ(names("vision", "lr"), Names{"a1"});
  EXPECT_EQ(names("", "lr"), (Names{"a1", "b1"}));
  EXPECT_EQ(names("nope", ""), Names{});
  EXPECT_EQ(names("", ""), (Names{"a1", "a2", "b1", "c1"}));
  EXPECT_EQ(store_->GetRun("a2")->project, "vision");
  EXPECT_EQ(store_->GetRun("a2")->group, "bs");
  EXPECT_EQ(store_->GetRun("c1")->project, "");
}

// A store of version 9 opens migrated: its runs' project and group come from their specs.
TEST_F(StoreTest, MigratesAVersion9StoreFillingProjectAndGroup) {
  store_.reset();
  const std::string path = dir_ + "/v9.db";
  ASSERT_TRUE(Store::CreateSchemaForTest(path, 9).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* rows = R"sql(
INSERT INTO runs (name, seq, spec_name, spec_file, spec_yaml, spec_json, config_hash,
  snapshot_digest, snapshot_dir, workspace, queue, priority, resources, state, reason, message,
  attempts, gpus, cancel_requested, created_ms, updated_ms, owner, resolved)
VALUES
  ('old-1', 1, 'old', 'tau.yaml', '', '{"experiment":{"project":"vision","group":"lr"}}', 'h1',
   'd', '/s', 'default', 'default', 0, '{}', 'Queued', '', '', 0, '[]', 0, 1, 1, 'alice', '{}'),
  ('old-2', 2, 'old', 'tau.yaml', '', '{"name":"old"}', 'h2', 'd', '/s', 'default', 'default',
   0, '{}', 'Queued', '', '', 0, '[]', 0, 2, 2, 'bob', '{}'),
  ('old-3', 3, 'old', 'tau.yaml', '', 'not json', 'h3', 'd', '/s', 'default', 'default', 0,
   '{}', 'Queued', '', '', 0, '[]', 0, 3, 3, 'bob', '{}');
)sql";
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, rows, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_close(db);
  auto opened = Store::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  store_ = std::move(*opened);
  EXPECT_EQ(store_->GetRun("old-1")->project, "vision");
  EXPECT_EQ(store_->GetRun("old-1")->group, "lr");
  EXPECT_EQ(store_->GetRun("old-2")->project, "");
  EXPECT_EQ(store_->GetRun("old-3")->project, "") << "a spec that is not JSON has no project";
  RunFilter f;
  f.project = "vision";
  auto got = store_->ListRuns(f);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ(got->front().name, "old-1");
}

// A workflow's runs keep their place (stage, upstream runs) and are listed by the workflow's name;
// a store of version 10 opens migrated, its runs in no workflow.
TEST_F(StoreTest, WorkflowPlacesAreKeptAndListedByWorkflow) {
  std::vector<RunRecord> runs = {MakeRun("wf-a-prep"), MakeRun("wf-a-train"), MakeRun("other")};
  runs[0].workflow = {{"name", "wf-a"}, {"stage", "prep"}, {"after", nlohmann::json::array()}};
  runs[1].workflow = {
      {"name", "wf-a"},
      {"stage", "train"},
      {"after", {{{"stage", "prep"}, {"run", "wf-a-prep"}, {"condition", "succeeded"}}}}};
  ASSERT_TRUE(store_->InsertRuns(&runs, std::vector<std::vector<Event>>(3)).ok());
  EXPECT_EQ(store_->GetRun("wf-a-train")->workflow, runs[1].workflow);
  EXPECT_TRUE(store_->GetRun("other")->workflow.is_null());
  RunFilter f;
  f.workflow = "wf-a";
  f.newest_first = false;
  auto got = store_->ListRuns(f);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].name, "wf-a-prep");
  EXPECT_EQ((*got)[1].workflow["after"][0]["run"], "wf-a-prep");
  f.summary = true;
  EXPECT_EQ(store_->ListRuns(f)->at(1).workflow["stage"], "train") << "list pages keep the place";
  EXPECT_EQ(*store_->CountRuns(f), 2);

  store_.reset();
  const std::string path = dir_ + "/v10.db";
  ASSERT_TRUE(Store::CreateSchemaForTest(path, 10).ok());
  auto opened = Store::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  store_ = std::move(*opened);
  RunRecord old = MakeRun("after-migration");
  ASSERT_TRUE(store_->InsertRun(&old, {}).ok());
  EXPECT_TRUE(store_->GetRun("after-migration")->workflow.is_null());
}

TEST_F(StoreTest, BlobsAreUsableByTheirUploadersAndTheReadersOfRunsThatUseThem) {
  const std::string a(64, 'a'), b(64, 'b');
  ASSERT_TRUE(store_->AddBlobOwner("ann", a, 100, 1).ok());
  ASSERT_TRUE(store_->AddBlobOwner("ann", b, 50, 1).ok());
  ASSERT_TRUE(store_->AddBlobOwner("ann", b, 50, 2).ok());  // a repeat changes nothing
  EXPECT_TRUE(*store_->OwnsBlob("ann", a));
  EXPECT_FALSE(*store_->OwnsBlob("ben", a));
  EXPECT_EQ(*store_->UnreferencedBlobBytes("ann"), 150);
  const std::vector<std::string> both = {a, b};
  EXPECT_EQ(*store_->UsableBlobs("ann", std::vector<std::string>(), both),
            (std::set<std::string>{a, b}));
  EXPECT_TRUE(store_->UsableBlobs("ben", std::nullopt, both)->empty());
  // A snapshot of `a` that a run of workspace "alpha" uses: readers of alpha may name `a`.
  ASSERT_TRUE(store_->AddSnapshotBlobs("snap", {a}).ok());
  ASSERT_TRUE(store_->AddSnapshotBlobs("snap", {a, b}).ok());  // recorded once: b is not in it
  EXPECT_EQ(*store_->UnreferencedBlobBytes("ann"), 150) << "no run uses the snapshot yet";
  RunRecord r = MakeRun("r1");
  r.workspace = "alpha";
  r.snapshot_digest = "snap";
  ASSERT_TRUE(store_->InsertRun(&r, {}).ok());
  EXPECT_EQ(*store_->UnreferencedBlobBytes("ann"), 50);
  EXPECT_EQ(*store_->UsableBlobs("ben", std::vector<std::string>{"alpha"}, both),
            (std::set<std::string>{a}));
  EXPECT_TRUE(store_->UsableBlobs("ben", std::vector<std::string>{"beta"}, both)->empty());
  EXPECT_EQ(*store_->UsableBlobs("ben", std::nullopt, both), (std::set<std::string>{a}));
  EXPECT_TRUE(*store_->SnapshotUsedIn("snap", std::vector<std::string>{"alpha"}));
  EXPECT_FALSE(*store_->SnapshotUsedIn("snap", std::vector<std::string>{"beta"}));
  EXPECT_TRUE(*store_->SnapshotUsedIn("snap", std::nullopt));
  // A blob the server removed is nobody's.
  ASSERT_TRUE(store_->ForgetBlobs({b}).ok());
  EXPECT_FALSE(*store_->OwnsBlob("ann", b));
  EXPECT_EQ(*store_->UnreferencedBlobBytes("ann"), 0);

  // A store from before: its runs' snapshots serve their readers whole; its blobs have no owner.
  store_.reset();
  const std::string path = dir_ + "/v14.db";
  ASSERT_TRUE(Store::CreateSchemaForTest(path, 14).ok());
  auto opened = Store::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  store_ = std::move(*opened);
  RunRecord before = MakeRun("before");
  before.snapshot_digest = "old";
  ASSERT_TRUE(store_->InsertRun(&before, {}).ok());
  EXPECT_TRUE(*store_->SnapshotUsedIn("old", std::vector<std::string>{"default"}));
  EXPECT_TRUE(store_->UsableBlobs("ann", std::nullopt, {a})->empty());
}

TEST_F(StoreTest, LiveTokensPerUserAreLimited) {
  auto token = [](const std::string& id, const std::string& user) {
    TokenRecord t;
    t.id = id;
    t.digest = Sha256Hex(id);
    t.user = user;
    t.created_ms = 1;
    return t;
  };
  ASSERT_TRUE(store_->InsertToken(token("t1", "ann"), 2, 10).ok());
  TokenRecord expiring = token("t2", "ann");
  expiring.expires_ms = 20;
  ASSERT_TRUE(store_->InsertToken(expiring, 2, 10).ok());
  EXPECT_EQ(store_->InsertToken(token("t3", "ann"), 2, 10).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_->InsertToken(token("t4", "ben"), 2, 10).ok());
  // Expired or revoked tokens do not count.
  EXPECT_EQ(*store_->CountLiveTokens("ann", 30), 1);
  ASSERT_TRUE(store_->InsertToken(token("t5", "ann"), 2, 30).ok());
  ASSERT_TRUE(store_->RevokeToken("t1", 31).ok());
  EXPECT_TRUE(store_->InsertToken(token("t6", "ann"), 2, 32).ok());
}

TEST_F(StoreTest, WebhookDeliveriesQueueInOrderPerUrlAndAreBounded) {
  std::vector<RunRecord> runs = {MakeRun("r1")};
  runs[0].owner = "ana";
  std::vector<std::vector<Event>> events(1);
  events[0] = {{0, "r1", 1, "Submitted", "s", {}, "", ""}, {0, "r1", 2, "Queued", "q", {}, "", ""}};
  ASSERT_TRUE(store_->InsertRuns(&runs, events).ok());
  // The cursor started at the newest event when the store learnt webhooks (none then).
  EXPECT_EQ(*store_->DeliveryCursor(), 0);
  auto after = store_->ListEventsAfter(0, 10);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ((*after)[1].event.type, "Queued");
  EXPECT_EQ((*after)[1].workspace, "default");
  EXPECT_EQ((*after)[1].owner, "ana");
  EXPECT_EQ(store_->ListEventsAfter((*after)[0].event.id, 10)->size(), 1u);
  EXPECT_EQ((*after)[0].run_webhooks, nlohmann::json::array());  // its spec names none
  // A run whose canonical spec names its own receivers: each of its events carries them.
  std::vector<RunRecord> hooked = {MakeRun("r2")};
  const nlohmann::json hooks = nlohmann::json::parse(
      R"([{"url": "https://x.example/h", "secret": "k", "events": ["state"]}])");
  hooked[0].spec_json["policy"] = {{"queue", "q"}, {"webhooks", hooks}};
  std::vector<std::vector<Event>> hooked_events(1);
  hooked_events[0] = {{0, "r2", 3, "Submitted", "s", {}, "", ""}};
  ASSERT_TRUE(store_->InsertRuns(&hooked, hooked_events).ok());
  auto with_hooks = store_->ListEventsAfter((*after)[1].event.id, 10);
  ASSERT_TRUE(with_hooks.ok()) << with_hooks.status().ToString();
  ASSERT_EQ(with_hooks->size(), 1u);
  EXPECT_EQ((*with_hooks)[0].run_webhooks, hooks);

  auto delivery = [](const std::string& url, int64_t event) {
    Delivery d;
    d.workspace = "default";
    d.url = url;
    d.secret = "K";
    d.event_id = event;
    d.body = "{}";
    d.created_ms = d.next_ms = 10;
    return d;
  };
  int64_t dropped = -1;
  ASSERT_TRUE(store_
                  ->QueueDeliveries(
                      {delivery("http://a", 1), delivery("http://a", 2), delivery("http://b", 1)},
                      2, 10, &dropped)
                  .ok());
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(*store_->DeliveryCursor(), 2);
  // One head per URL: the second delivery to a waits for the first.
  auto due = store_->DueDeliveries(10);
  ASSERT_EQ(due->size(), 2u);
  EXPECT_EQ((*due)[0].url, "http://a");
  EXPECT_EQ((*due)[0].event_id, 1);
  EXPECT_EQ((*due)[1].url, "http://b");
  EXPECT_TRUE(store_->DueDeliveries(9)->empty());
  ASSERT_TRUE(store_->PostponeDelivery((*due)[0].id, 1, 50, "HTTP 503").ok());
  due = store_->DueDeliveries(20);
  ASSERT_EQ(due->size(), 1u);  // a's head is postponed, and its second one waits behind it
  EXPECT_EQ((*due)[0].url, "http://b");
  due = store_->DueDeliveries(50);
  ASSERT_EQ(due->size(), 2u);
  EXPECT_EQ((*due)[0].attempts, 1);
  EXPECT_EQ((*due)[0].last_error, "HTTP 503");
  ASSERT_TRUE(store_->DeleteDelivery((*due)[0].id).ok());
  EXPECT_EQ(store_->DueDeliveries(50)->at(0).event_id, 2);
  // Past the bound, a URL loses its oldest.
  std::vector<Delivery> more;
  for (int i = 3; i < 8; ++i) more.push_back(delivery("http://a", i));
  ASSERT_TRUE(store_->QueueDeliveries(more, 7, 3, &dropped).ok());
  EXPECT_EQ(dropped, 3);
  due = store_->DueDeliveries(50);
  ASSERT_EQ(due->size(), 2u);
  EXPECT_EQ((*due)[0].url, "http://b");  // by id: b's came first
  EXPECT_EQ((*due)[1].event_id, 5);
  EXPECT_EQ(*store_->CountDeliveries(), 4);  // 5, 6, 7 to a; 1 to b
}

TEST_F(StoreTest, ServicesAreWrittenWholeAndReplicasListedByService) {
  ServiceRecord svc;
  svc.name = "linear";
  svc.workspace = "vision";
  svc.owner = "ana";
  svc.state = "Active";
  svc.created_ms = svc.updated_ms = 5;
  svc.doc = {{"replicas", 2}, {"revision", 1}};
  ASSERT_TRUE(store_->PutService(svc, true).ok());
  EXPECT_EQ(store_->PutService(svc, true).code(), StatusCode::kAlreadyExists);
  svc.doc["replicas"] = 3;
  svc.state = "Deleting";
  ASSERT_TRUE(store_->PutService(svc, false).ok());
  auto got = store_->GetService("linear");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->doc["replicas"], 3);
  EXPECT_EQ(got->state, "Deleting");
  EXPECT_EQ(got->workspace, "vision");
  ServiceRecord other = svc;
  other.name = "absent";
  EXPECT_EQ(store_->PutService(other, false).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->ListServices()->size(), 1u);

  std::vector<RunRecord> runs = {MakeRun("linear-1"), MakeRun("linear-2"), MakeRun("plain")};
  runs[0].service = {{"name", "linear"}, {"revision", 1}, {"port", 40001}};
  runs[1].service = {{"name", "linear"}, {"revision", 2}, {"port", 40002}};
  ASSERT_TRUE(store_->InsertRuns(&runs, std::vector<std::vector<Event>>(3)).ok());
  RunFilter f;
  f.service = "linear";
  f.summary = true;
  f.newest_first = false;
  auto replicas = store_->ListRuns(f);
  ASSERT_TRUE(replicas.ok());
  ASSERT_EQ(replicas->size(), 2u);
  EXPECT_EQ((*replicas)[1].service["port"], 40002) << "list pages keep the place";
  EXPECT_TRUE(store_->GetRun("plain")->service.is_null());

  ASSERT_TRUE(store_->DeleteService("linear").ok());
  EXPECT_EQ(store_->GetService("linear").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->DeleteService("linear").code(), StatusCode::kNotFound);
  // Survives a reopen: services are durable rows.
  ASSERT_TRUE(store_->PutService(svc, true).ok());
  store_.reset();
  auto reopened = Store::Open(dir_ + "/tau.db");
  ASSERT_TRUE(reopened.ok());
  store_ = std::move(*reopened);
  EXPECT_EQ(store_->GetService("linear")->doc["replicas"], 3);
}

}  // namespace tau::store
