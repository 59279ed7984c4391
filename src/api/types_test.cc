// The reply types: what is read is written back the same (members unknown to them included), and
// a reply of the wrong shape is refused with the member's path.
#include "api/types.h"

#include <gtest/gtest.h>

namespace tau::api {
namespace {

using nlohmann::json;

json QueuedRun() {
  return json::parse(R"({
    "name": "train-abc12", "spec_name": "train", "spec_file": "/w/tau.yaml", "state": "Queued",
    "reason": "", "message": "", "exit_code": null, "signal": null, "attempts": 0,
    "workspace": "team", "user": "ada", "queue": "main", "priority": 10, "gpus": [],
    "resources": {"cpu_milli": 1000, "gpus": 0, "memory_bytes": 268435456, "workers": 2},
    "config_hash": "c0", "snapshot_digest": "d1", "cancel_requested": false,
    "created": "2026-12-02T07:56:44.754Z", "admitted": null, "started": null, "finished": null,
    "kind": "job", "project": "vision", "group": "lr", "backend": "local",
    "pending": {"position": 1, "queue": "main", "code": "WaitingForQuota",
                "reason": "needs 1 cpu", "detail": "insufficient unused quota"}})");
}

json FinishedRun() {
  json j = QueuedRun();
  j.erase("pending");
  j["state"] = "Failed";
  j["reason"] = "UserError";
  j["exit_code"] = 3;
  j["attempts"] = 2;
  j["gpus"] = {0, 1};
  j["admitted"] = j["started"] = j["finished"] = "2026-12-02T07:56:45.000Z";
  return j;
}

json Detail() {
  json attempt = json::parse(R"({
    "number": 1, "state": "Finished", "gpus": [], "started": "2026-12-02T07:56:44.754Z",
    "ended": "2026-12-02T07:56:45.754Z", "exit_code": 3, "signal": null, "outcome": "Failed",
    "reason": "UserError", "message": "worker 0 exited with code 3", "supervisor_pid": 4242,
    "diagnosis": {"phase": "Running", "summary": "out of memory",
                  "evidence": [{"signature": "cuda-oom", "rank": 0, "line": "CUDA out of memory"}]}
  })");
  json second = attempt;
  second["number"] = 2;
  second["diagnosis"] = json::object();
  second["ended"] = nullptr;
  second["exit_code"] = nullptr;
  second["signal"] = 15;
  json event = {{"time", "2026-12-02T07:56:44.754Z"},
                {"type", "Submitted"},
                {"message", "submitted"},
                {"data", {{"files", 2}}},
                {"hash", "ab"}};
  json run = FinishedRun();
  run["spec"] = {{"name", "train"}, {"compute", {{"gpus", 0}}}};
  return {{"run", run}, {"attempts", {attempt, second}}, {"events", {event}}};
}

json QueuesReply() {
  return json::parse(R"({
    "queues": [{
      "name": "main", "cohort": "lab", "queueing_strategy": "BestEffortFIFO",
      "usage": [{"flavor": "f", "resource": "cpu", "nominal": "1", "usage": "1", "borrowed": "0"}],
      "admitted": 2, "pending": 2,
      "admitted_runs": [
        {"name": "a-1", "workspace": "team", "state": "Running", "priority": 10,
         "flavors": {"main": {"cpu": "f"}}},
        {"hidden": true, "priority": 5, "state": "Admitted"}],
      "pending_runs": [
        {"name": "b-1", "workspace": "team", "priority": 10, "position": 1, "queue": "main",
         "code": "WaitingForQuota", "reason": "needs 1 cpu"},
        {"hidden": true, "position": 2, "priority": 0}]}],
    "cohorts": [{"name": "lab", "usage": [{"flavor": "f", "resource": "cpu", "nominal": "0",
                                           "usage": "0"}]}],
    "unqueued_runs": [{"name": "c-1", "why": "queue 'gone' is not in the platform"}]})");
}

// Read and written back: the same JSON, and the same text on the wire.
template <typename T>
void ExpectRoundTrip(const json& j) {
  Result<T> got = T::FromJson(j);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->ToJson(), j);
  EXPECT_EQ(got->ToJson().dump(), j.dump());
}

TEST(ApiTypes, RunsRoundTrip) {
  ExpectRoundTrip<api::Run>(QueuedRun());
  ExpectRoundTrip<api::Run>(FinishedRun());
  json not_seen_yet = QueuedRun();
  not_seen_yet["pending"] = nullptr;
  ExpectRoundTrip<api::Run>(not_seen_yet);
  ExpectRoundTrip<RunDetail>(Detail());
  ExpectRoundTrip<RunList>(
      {{"runs", {QueuedRun(), FinishedRun()}}, {"total", 7}, {"limit", 2}, {"offset", 1}});
  ExpectRoundTrip<Submitted>({{"run", QueuedRun()}});
  ExpectRoundTrip<Submitted>({{"run", QueuedRun()}, {"warning", "the code changed"}});
  ExpectRoundTrip<RunEvent>({{"name", "a-1"},
                             {"state", "Running"},
                             {"reason", ""},
                             {"message", ""},
                             {"queue", "main"},
                             {"workspace", "team"},
                             {"attempts", 1},
                             {"updated", "2026-12-02T07:56:44.754Z"}});
}

TEST(ApiTypes, ABatchsRunsCarryTheirArray) {
  json run = QueuedRun();
  run["array"] = {{"name", "a-1f2e3d4c"}, {"index", 6}, {"first", 0}, {"last", 8}, {"step", 2}};
  ExpectRoundTrip<api::Run>(run);
  ExpectRoundTrip<SubmittedBatch>({{"runs", {run, QueuedRun()}}});
  Result<SubmittedBatch> b = SubmittedBatch::FromJson({{"runs", {run, QueuedRun()}}});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->runs[0].array.has_value());
  EXPECT_EQ(b->runs[0].array->index, 6);
  EXPECT_EQ(b->runs[0].array->Range(), "0-8:2");
  EXPECT_FALSE(b->runs[1].array.has_value());
  run["array"]["index"] = "six";
  Result<api::Run> wrong = api::Run::FromJson(run);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("array.index"), std::string::npos)
      << wrong.status().message();
}

TEST(ApiTypes, RunMembersAreTyped) {
  Result<RunDetail> d = RunDetail::FromJson(Detail());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->run.exit_code, 3);
  EXPECT_FALSE(d->run.has_pending);
  EXPECT_TRUE(d->run.IsTerminal());
  EXPECT_EQ(d->run.Workers(), 2);
  EXPECT_EQ(d->run.gpus, (std::vector<int>{0, 1}));
  ASSERT_TRUE(d->run.spec.has_value());
  ASSERT_EQ(d->attempts.size(), 2u);
  ASSERT_TRUE(d->attempts[0].diagnosis.has_value());
  EXPECT_EQ(d->attempts[0].diagnosis->evidence.at(0).signature, "cuda-oom");
  EXPECT_FALSE(d->attempts[1].diagnosis.has_value());  // {} on the wire
  EXPECT_EQ(d->attempts[1].signal, 15);
  EXPECT_EQ(d->attempts[0].supervisor_pid, 4242);

  Result<api::Run> q = api::Run::FromJson(QueuedRun());
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(q->pending.has_value());
  EXPECT_EQ(q->pending->position, 1);
  EXPECT_EQ(q->pending->detail, "insufficient unused quota");
  EXPECT_FALSE(q->IsTerminal());
}

TEST(ApiTypes, QueuesRoundTripWithHiddenRuns) {
  ExpectRoundTrip<Queues>(QueuesReply());
  ExpectRoundTrip<QueueReply>({{"queue", QueuesReply()["queues"][0]}});
  Result<Queues> q = Queues::FromJson(QueuesReply());
  ASSERT_TRUE(q.ok());
  const Queue& main = q->queues.at(0);
  EXPECT_EQ(main.usage.at(0).borrowed, "0");
  EXPECT_FALSE(q->cohorts.at(0).usage.at(0).borrowed.has_value());
  EXPECT_TRUE(main.admitted_runs.at(1).hidden);
  EXPECT_EQ(main.admitted_runs.at(1).name, "");
  EXPECT_TRUE(main.pending_runs.at(1).hidden);
  EXPECT_EQ(main.pending_runs.at(1).pending.position, 2);
  EXPECT_EQ(main.pending_runs.at(0).pending.code, "WaitingForQuota");
  EXPECT_FALSE(main.pending_runs.at(0).pending.detail.has_value());
}

TEST(ApiTypes, AQueueSummaryHasItsCountsWithoutItsRuns) {
  nlohmann::json summary = QueuesReply();
  for (nlohmann::json& q : summary["queues"]) {
    q.erase("admitted_runs");
    q.erase("pending_runs");
  }
  Result<Queues> q = Queues::FromJson(summary);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->queues.at(0).pending, QueuesReply()["queues"][0]["pending"].get<int64_t>());
  EXPECT_TRUE(q->queues.at(0).pending_runs.empty());
}

TEST(ApiTypes, CapacityAndVersionRoundTrip) {
  ExpectRoundTrip<Capacity>({{"gpus_total", 8},
                             {"gpus_free", 6},
                             {"gpus_unplaceable", 1},
                             {"cpu_milli_total", 64000},
                             {"cpu_milli_free", 1000},
                             {"memory_bytes_total", int64_t{1} << 40},
                             {"memory_bytes_free", 0},
                             {"queued", 3},
                             {"active", 5}});
  ExpectRoundTrip<Version>({{"version", "0.9.0"}, {"api", "v1"}, {"backend", "kubernetes"}});
  // What a submission gets before the controller's next pass (Controller::Submit).
  ExpectRoundTrip<Pending>({{"position", nullptr}, {"reason", "waiting for the scheduler"}});
  ExpectRoundTrip<Submitted>(
      {{"run", [] {
          json run = QueuedRun();
          run["pending"] = {{"position", nullptr}, {"reason", "waiting for the scheduler"}};
          return run;
        }()}});
  ExpectRoundTrip<Pending>({{"position", nullptr},
                            {"queue", "main"},
                            {"code", "BackingOff"},
                            {"reason", "retrying after UserError"}});
}

TEST(ApiTypes, UnknownMembersAreKept) {
  json run = FinishedRun();
  run["added_later"] = {{"x", 1}};
  run["resources"]["nvidia.com/mig"] = 2;
  ExpectRoundTrip<api::Run>(run);
  json detail = Detail();
  detail["attempts"][0]["diagnosis"]["evidence"][0]["count"] = 3;
  detail["attempts"][0]["node"] = "n1";
  ExpectRoundTrip<RunDetail>(detail);
  json queues = QueuesReply();
  queues["queues"][0]["pending_runs"][0]["since"] = "yesterday";
  queues["queues"][0]["pending_runs"][1]["state"] = "Queued";
  ExpectRoundTrip<Queues>(queues);
}

json Reason() {
  return json::parse(R"({
    "check": "ecc_dbe", "status": "fail", "action": "reset", "clear": "after_reset",
    "message": "2 double-bit ECC errors", "threshold": "> 0", "source": "nvml",
    "first_seen": "2026-12-02T07:56:44.754Z", "last_seen": "2026-12-02T07:56:45.754Z",
    "count": 2})");
}

json Verdict(int gpu, const char* verdict, bool placeable) {
  return {
      {"gpu", gpu},
      {"verdict", verdict},
      {"placeable", placeable},
      {"since", placeable ? "" : "2026-12-02T07:56:44.754Z"},
      {"reasons", placeable ? json::array() : json::array({Reason()})},
      {"pending", json::array()},
      {"recent_application_xids",
       placeable ? json::array() : json::array({{{"xid", 79}, {"at", "2026-12-02T07:56:44Z"}}})}};
}

json Inventory() {
  json device = {{"index", 0},
                 {"uuid", "GPU-1"},
                 {"name", "NVIDIA H100"},
                 {"memory_total_bytes", int64_t{80} << 30},
                 {"pci_bus_id", "00000000:3B:00.0"},
                 {"minor_number", 0},
                 {"mig_enabled", false},
                 {"mig_pending", nullptr}};
  json second = device;
  second["index"] = 1;
  second.erase("minor_number");
  second["mig_enabled"] = nullptr;
  return {{"devices", {device, second}},
          {"driver_loaded", true},
          {"driver_version", "550.54"},
          {"cuda_driver_version", "12.4"},
          {"nvml_version", "12.550"},
          {"library", "libnvidia-ml.so.1"},
          {"note", ""}};
}

TEST(ApiTypes, ArtifactListRoundTrips) {
  json list = json::parse(R"({
    "run": "train-1a2b3c4d", "total": 2, "offset": 0, "limit": 1000, "truncated": false,
    "max_listed": 10000, "undigested": 1, "artifacts": [
      {"path": "checkpoint/step-10/model.pt", "kind": "checkpoint", "size": 7000,
       "sha256": null, "modified": "2026-12-04T21:00:00.000Z"},
      {"path": "output/result.bin", "kind": "output", "size": 3, "modified":
       "2026-12-04T21:00:01.000Z", "sha256": "ab12", "future": 1}]})");
  ExpectRoundTrip<ArtifactList>(list);
  auto typed = ArtifactList::FromJson(list);
  ASSERT_TRUE(typed.ok());
  EXPECT_FALSE(typed->artifacts[0].sha256.has_value());
  EXPECT_EQ(typed->artifacts[1].sha256.value_or(""), "ab12");
  list["artifacts"][0]["size"] = "7000";
  Status wrong = ArtifactList::FromJson(list).status();
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("member 'artifacts[0].size'"), std::string::npos)
      << wrong.message();
}

TEST(ApiTypes, IdentityRepliesRoundTrip) {
  ExpectRoundTrip<Whoami>(json::parse(R"({
    "admin": false, "groups": ["lab", "users"], "platform_viewer": true, "token_id": "0a1b2c3d4e5f",
    "user": "ada", "via": "token", "workspaces": [{"name": "team", "role": "researcher"}]})"));
  json token = json::parse(R"({
    "id": "0a1b2c3d4e5f", "user": "ada", "groups": ["lab"], "description": "ci",
    "created_by": "root", "created": "2026-12-02T07:56:44.754Z", "expires": null,
    "revoked": null})");
  ExpectRoundTrip<TokenList>({{"tokens", {token}}});
  token["token"] = "tau_secret";
  token["expires"] = "2026-12-03T07:56:44.754Z";
  ExpectRoundTrip<Token>(token);
  ExpectRoundTrip<AuditList>({{"audit",
                               {{{"time", "2026-12-02T07:56:44.754Z"},
                                 {"user", ""},
                                 {"via", "tcp"},
                                 {"method", "GET"},
                                 {"path", "/api/v1/runs"},
                                 {"status", 401},
                                 {"action", "unauthenticated"},
                                 {"detail", "no token"}}}}});
  ExpectRoundTrip<SecretList>({{"workspace", "team"},
                               {"secrets",
                                {{{"key", "WANDB_KEY"},
                                  {"size", 40},
                                  {"updated", "2026-12-02T07:56:44.754Z"},
                                  {"updated_by", "ada"}}}}});
  ExpectRoundTrip<PlatformView>({{"source", "/etc/tau/platform.yaml"},
                                 {"applied", "2026-12-02T07:56:44.754Z"},
                                 {"platform", {{"queues", json::array()}}},
                                 {"text", "schema_version: 1\nqueues: []\n"}});

  Result<Token> t = Token::FromJson(token);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->token, "tau_secret");
  EXPECT_FALSE(t->revoked.has_value());
  EXPECT_EQ(t->groups, (std::vector<std::string>{"lab"}));
}

TEST(ApiTypes, GpuRepliesRoundTrip) {
  json gpus = Inventory();
  gpus["devices"][0]["health"] = Verdict(0, "Unhealthy", false);
  gpus["snapshot"] = {{"passes", 3}, {"gpus", json::array()}};
  ExpectRoundTrip<Gpus>(gpus);
  Result<Gpus> g = Gpus::FromJson(gpus);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const GpuDevice& d = g->inventory.devices.at(0);
  EXPECT_EQ(d.memory_total_bytes, int64_t{80} << 30);
  EXPECT_EQ(d.minor_number, 0);
  EXPECT_EQ(d.mig_enabled, false);
  EXPECT_FALSE(d.mig_pending.has_value());
  ASSERT_TRUE(d.health.has_value());
  EXPECT_EQ(d.health->reasons.at(0).message, "2 double-bit ECC errors");
  EXPECT_EQ(d.health->recent_application_xids.at(0).xid, 79);
  EXPECT_FALSE(g->inventory.devices.at(1).minor_number.has_value());
  EXPECT_FALSE(g->inventory.devices.at(1).health.has_value());

  json check = {{"gpus", {Verdict(0, "Unhealthy", false), Verdict(1, "Healthy", true)}},
                {"inventory", Inventory()}};
  ExpectRoundTrip<HealthCheck>(check);
  check["active"] = json::parse(R"js({"ran": true, "gpus": [
      {"cuda_ordinal": 0, "passed": true, "name": "NVIDIA H100", "ms": 12.5},
      {"cuda_ordinal": 1, "passed": false, "error": "cuCtxCreate failed (CUDA error 2)",
       "ms": 0.25}]})js");
  ExpectRoundTrip<HealthCheck>(check);
  Result<HealthCheck> c = HealthCheck::FromJson(check);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->active.has_value());
  EXPECT_DOUBLE_EQ(c->active->gpus.at(0).ms, 12.5);
  EXPECT_FALSE(c->active->gpus.at(1).name.has_value());
  EXPECT_FALSE(c->gpus.at(0).placeable);
  // The probe process could not run: no `gpus` at all.
  check["active"] = {{"ran", false}, {"note", "cannot start the probe process"}};
  ExpectRoundTrip<HealthCheck>(check);
  c = HealthCheck::FromJson(check);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->active->has_gpus);
}

TEST(ApiTypes, RunImageIsTheSpecs) {
  json detail = Detail();
  Result<RunDetail> d = RunDetail::FromJson(detail);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->run.Image(), "");
  detail["run"]["spec"]["runtime"] = {{"image", "pytorch:24.05"}};
  d = RunDetail::FromJson(detail);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->run.Image(), "pytorch:24.05");
}

// The refusal names the member and what it should have been.
void ExpectRefused(const Status& s, const std::string& text) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
}

TEST(ApiTypes, WrongTypesAreRefusedByName) {
  json detail = Detail();
  detail["attempts"][1]["exit_code"] = "3";
  ExpectRefused(RunDetail::FromJson(detail).status(),
                "member 'attempts[1].exit_code' is a string, expected an integer or null");

  detail = Detail();
  detail["run"]["attempts"] = 1.5;
  ExpectRefused(RunDetail::FromJson(detail).status(),
                "member 'run.attempts' is a number with a fraction, expected an integer");

  detail = Detail();
  detail["attempts"][0]["diagnosis"]["evidence"][0]["rank"] = nullptr;
  ExpectRefused(RunDetail::FromJson(detail).status(),
                "member 'attempts[0].diagnosis.evidence[0].rank' is null, expected an integer");

  json run = QueuedRun();
  run["pending"]["position"] = "first";
  ExpectRefused(api::Run::FromJson(run).status(), "member 'pending.position' is a string");

  run = QueuedRun();
  run["pending"].erase("reason");
  ExpectRefused(api::Run::FromJson(run).status(), "member 'pending.reason' is missing");

  run = QueuedRun();
  run["gpus"] = {0, "1"};
  ExpectRefused(api::Run::FromJson(run).status(),
                "member 'gpus[1]' is a string, expected an integer");

  run = QueuedRun();
  run.erase("queue");
  ExpectRefused(api::Run::FromJson(run).status(), "member 'queue' is missing");

  run = QueuedRun();
  run["cancel_requested"] = 0;
  ExpectRefused(api::Run::FromJson(run).status(), "member 'cancel_requested' is an integer");

  run = QueuedRun();
  run["attempts"] = int64_t{1} << 40;
  ExpectRefused(api::Run::FromJson(run).status(), "member 'attempts' is out of range");

  json queues = QueuesReply();
  queues["queues"][0]["usage"][0]["borrowed"] = 0;
  ExpectRefused(Queues::FromJson(queues).status(),
                "member 'queues[0].usage[0].borrowed' is an integer, expected a string");

  ExpectRefused(
      RunList::FromJson({{"runs", {1}}, {"total", 1}, {"limit", 1}, {"offset", 0}}).status(),
      "member 'runs[0]' is an integer, expected an object");
  ExpectRefused(Capacity::FromJson(nullptr).status(), "the reply is null, expected an object");
  ExpectRefused(Version::FromJson({{"version", "1"}, {"api", "v1"}}).status(),
                "member 'backend' is missing");

  ExpectRefused(Whoami::FromJson({{"user", "ada"}, {"groups", {"lab", 1}}}).status(),
                "member 'groups[1]' is an integer, expected a string");
  json gpus = Inventory();
  gpus["snapshot"] = json::object();
  gpus["devices"][1]["mig_pending"] = "no";
  ExpectRefused(Gpus::FromJson(gpus).status(),
                "member 'devices[1].mig_pending' is a string, expected a boolean or null");
  gpus = Inventory();
  gpus["snapshot"] = json::object();
  gpus["devices"][0]["health"] = Verdict(0, "Unhealthy", false);
  gpus["devices"][0]["health"]["reasons"][0].erase("count");
  ExpectRefused(Gpus::FromJson(gpus).status(),
                "member 'devices[0].health.reasons[0].count' is missing");
  json check = {
      {"gpus", json::array()},
      {"inventory", Inventory()},
      {"active",
       {{"ran", true}, {"gpus", {{{"cuda_ordinal", 0}, {"passed", true}, {"ms", "fast"}}}}}}};
  ExpectRefused(HealthCheck::FromJson(check).status(),
                "member 'active.gpus[0].ms' is a string, expected a number");
}

}  // namespace
}  // namespace tau::api
