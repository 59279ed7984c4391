// The stand-in API server's behaviours that a lenient fake would hide: garbage collection and
// DELETE propagation, ttlSecondsAfterFinished, namespace existence, dryRun, field selectors and
// server-side apply's field ownership. Raw HTTP, so that each test says exactly what is sent.
#include "testing/fake_apiserver.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "client/client.h"
#include "common/clock.h"
#include "common/strings.h"

namespace tau::testutil {
namespace {

using nlohmann::json;

struct Answer {
  int status = 0;
  json body;
  std::map<std::string, std::string> headers;
};

// (type, name, resourceVersion) of a watch event.
using WatchEvent = std::tuple<std::string, std::string, int64_t>;

bool WaitFor(const std::function<bool()>& done, int timeout_ms = 8000) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

json Meta(const std::string& name, const std::string& ns = "default") {
  json meta = {{"name", name}};
  if (!ns.empty()) meta["namespace"] = ns;
  return meta;
}

json OwnerRef(const json& owner) {
  return {{"apiVersion", owner["apiVersion"]},
          {"kind", owner["kind"]},
          {"name", owner["metadata"]["name"]},
          {"uid", owner["metadata"]["uid"]},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

json Job(const std::string& name) {
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata", Meta(name)},
          {"spec",
           {{"template",
             {{"spec",
               {{"restartPolicy", "Never"},
                {"containers", json::array({{{"name", "main"}, {"image", "busybox"}}})}}}}}}}};
}

json Pod(const std::string& name, const json& owners = json::array()) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", Meta(name)},
              {"spec", {{"containers", json::array({{{"name", "main"}, {"image", "busybox"}}})}}}};
  if (!owners.empty()) pod["metadata"]["ownerReferences"] = owners;
  return pod;
}

json ConfigMap(const std::string& name, const json& data, const std::string& ns = "default") {
  return {
      {"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", Meta(name, ns)}, {"data", data}};
}

constexpr char kJobs[] = "/apis/batch/v1/namespaces/default/jobs";
constexpr char kPods[] = "/api/v1/namespaces/default/pods";
constexpr char kConfigMaps[] = "/api/v1/namespaces/default/configmaps";
constexpr char kApply[] = "application/apply-patch+yaml";
constexpr char kMerge[] = "application/merge-patch+json";

class FakeApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.Start().ok());
    Result<client::Endpoint> endpoint = client::ParseEndpoint(fake_.url());
    ASSERT_TRUE(endpoint.ok());
    Result<std::unique_ptr<client::Connection>> conn = client::Connection::Open(*endpoint);
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    conn_ = std::move(*conn);
  }

  Answer Call(const std::string& method, const std::string& path, const json& body = nullptr,
              const std::string& content_type = "application/json") {
    Result<client::Response> r =
        conn_->Call(method, path, body.is_null() ? "" : body.dump(), content_type);
    EXPECT_TRUE(r.ok()) << method << " " << path << ": " << r.status().ToString();
    if (!r.ok()) return {};
    return Answer{r->status, json::parse(r->body, nullptr, false), r->headers};
  }

  json Create(const std::string& collection_path, const json& object) {
    Answer a = Call("POST", collection_path, object);
    EXPECT_EQ(a.status, 201) << a.body.dump();
    return a.body;
  }

  // The events of a watch from `from` until it ends (timeoutSeconds=1).
  std::vector<WatchEvent> Watch(const std::string& collection_path, int64_t from,
                                const std::string& query = "") {
    std::vector<WatchEvent> out;
    Result<client::Response> r =
        conn_->Call("GET", fmt::format("{}?watch=true&resourceVersion={}&timeoutSeconds=1{}",
                                       collection_path, from, query));
    EXPECT_TRUE(r.ok() && r->status == 200) << collection_path;
    if (!r.ok()) return out;
    for (const std::string& line : Split(r->body, '\n')) {
      if (line.empty()) continue;
      json e = json::parse(line);
      out.emplace_back(e["type"], e["object"]["metadata"].value("name", ""),
                       std::stoll(e["object"]["metadata"].value("resourceVersion", "0")));
    }
    return out;
  }

  bool Exists(const std::string& collection, const std::string& name,
              const std::string& ns = "default") {
    return !fake_.Object(collection, ns, name).is_null();
  }

  FakeApiServer fake_;
  std::unique_ptr<client::Connection> conn_;
};

int64_t Rv(const WatchEvent& event) { return std::get<2>(event); }

// ---- owner references, garbage collection, propagation ----

TEST_F(FakeApiServerTest, BackgroundDeletesTheOwnerThenItsDependentsRecursively) {
  json job = Create(kJobs, Job("train"));
  json pod = Create(kPods, Pod("train-0", json::array({OwnerRef(job)})));
  // A dependent of the dependent goes too.
  json cm = ConfigMap("train-0-env", {{"k", "v"}});
  cm["metadata"]["ownerReferences"] = json::array({OwnerRef(pod)});
  Create(kConfigMaps, cm);
  int64_t before = fake_.resource_version();
  Answer a = Call("DELETE", std::string(kJobs) + "/train?propagationPolicy=Background");
  EXPECT_EQ(a.status, 200) << a.body.dump();
  EXPECT_FALSE(Exists("batch/v1/jobs", "train"));
  EXPECT_FALSE(Exists("v1/pods", "train-0"));
  EXPECT_FALSE(Exists("v1/configmaps", "train-0-env"));
  std::vector<WatchEvent> jobs = Watch(kJobs, before);
  std::vector<WatchEvent> pods = Watch(kPods, before);
  std::vector<WatchEvent> cms = Watch(kConfigMaps, before);
  ASSERT_EQ(jobs.size(), 1u);
  ASSERT_EQ(pods.size(), 1u);
  ASSERT_EQ(cms.size(), 1u);
  EXPECT_EQ(std::get<0>(jobs[0]), "DELETED");
  EXPECT_EQ(std::get<0>(pods[0]), "DELETED");
  EXPECT_EQ(std::get<0>(cms[0]), "DELETED");
  // The owner first, then its dependent, then the dependent's.
  EXPECT_LT(Rv(jobs[0]), Rv(pods[0]));
  EXPECT_LT(Rv(pods[0]), Rv(cms[0]));
}

TEST_F(FakeApiServerTest, ForegroundMarksTheOwnerDeletesDependentsThenTheOwner) {
  json job = Create(kJobs, Job("train"));
  Create(kPods, Pod("train-0", json::array({OwnerRef(job)})));
  int64_t before = fake_.resource_version();
  Answer a = Call("DELETE", std::string(kJobs) + "/train?propagationPolicy=Foreground");
  EXPECT_EQ(a.status, 200);
  // The answer is the owner as marked: it waits for its dependents.
  EXPECT_FALSE(a.body["metadata"].value("deletionTimestamp", "").empty());
  EXPECT_EQ(a.body["metadata"]["finalizers"], json::array({"foregroundDeletion"}));
  EXPECT_FALSE(Exists("batch/v1/jobs", "train"));
  EXPECT_FALSE(Exists("v1/pods", "train-0"));
  std::vector<WatchEvent> jobs = Watch(kJobs, before);
  std::vector<WatchEvent> pods = Watch(kPods, before);
  ASSERT_EQ(jobs.size(), 2u);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(std::get<0>(jobs[0]), "MODIFIED");
  EXPECT_EQ(std::get<0>(pods[0]), "DELETED");
  EXPECT_EQ(std::get<0>(jobs[1]), "DELETED");
  EXPECT_LT(Rv(jobs[0]), Rv(pods[0]));
  EXPECT_LT(Rv(pods[0]), Rv(jobs[1]));
}

TEST_F(FakeApiServerTest, OrphanKeepsDependentsWithoutTheOwnerReference) {
  json job = Create(kJobs, Job("train"));
  Create(kPods, Pod("train-0", json::array({OwnerRef(job)})));
  int64_t before = fake_.resource_version();
  EXPECT_EQ(Call("DELETE", std::string(kJobs) + "/train?propagationPolicy=Orphan").status, 200);
  EXPECT_FALSE(Exists("batch/v1/jobs", "train"));
  json pod = fake_.Object("v1/pods", "default", "train-0");
  ASSERT_FALSE(pod.is_null());
  EXPECT_FALSE(pod["metadata"].contains("ownerReferences")) << pod.dump();
  std::vector<WatchEvent> jobs = Watch(kJobs, before);
  std::vector<WatchEvent> pods = Watch(kPods, before);
  ASSERT_EQ(jobs.size(), 2u);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(std::get<0>(pods[0]), "MODIFIED");
  EXPECT_LT(Rv(jobs[0]), Rv(pods[0]));
  EXPECT_LT(Rv(pods[0]), Rv(jobs[1]));
}

TEST_F(FakeApiServerTest, JobsOrphanTheirPodsByDefaultOthersDeleteInTheBackground) {
  json job = Create(kJobs, Job("train"));
  Create(kPods, Pod("train-0", json::array({OwnerRef(job)})));
  Answer a = Call("DELETE", std::string(kJobs) + "/train");
  EXPECT_EQ(a.status, 200);
  // batch/v1 kept its old default, and the API server warns about it.
  EXPECT_NE(a.headers["warning"].find("child pods are preserved by default"), std::string::npos);
  EXPECT_FALSE(Exists("batch/v1/jobs", "train"));
  ASSERT_TRUE(Exists("v1/pods", "train-0"));
  EXPECT_FALSE(
      fake_.Object("v1/pods", "default", "train-0")["metadata"].contains("ownerReferences"));

  json owner = Create(kConfigMaps, ConfigMap("owner", {{"k", "v"}}));
  Create(kPods, Pod("owned", json::array({OwnerRef(owner)})));
  a = Call("DELETE", std::string(kConfigMaps) + "/owner");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.headers.count("warning"), 0u);
  EXPECT_FALSE(Exists("v1/pods", "owned"));
}

TEST_F(FakeApiServerTest, DeleteOptionsInTheBodyAreRead) {
  json job = Create(kJobs, Job("train"));
  Create(kPods, Pod("train-0", json::array({OwnerRef(job)})));
  Answer a =
      Call("DELETE", std::string(kJobs) + "/train",
           {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", "Background"}});
  EXPECT_EQ(a.status, 200);
  EXPECT_FALSE(Exists("v1/pods", "train-0"));  // not orphaned, as the default would
  // orphanDependents (deprecated) still works; with propagationPolicy too it is refused.
  json other = Create(kJobs, Job("other"));
  Create(kPods, Pod("other-0", json::array({OwnerRef(other)})));
  a = Call("DELETE", std::string(kJobs) + "/other",
           {{"orphanDependents", false}, {"propagationPolicy", "Orphan"}});
  EXPECT_EQ(a.status, 422);
  a = Call("DELETE", std::string(kJobs) + "/other", {{"orphanDependents", false}});
  EXPECT_EQ(a.status, 200);
  EXPECT_FALSE(Exists("v1/pods", "other-0"));
  // A precondition that does not hold.
  Create(kJobs, Job("third"));
  a = Call("DELETE", std::string(kJobs) + "/third", {{"preconditions", {{"uid", "nope"}}}});
  EXPECT_EQ(a.status, 409);
  EXPECT_TRUE(Exists("batch/v1/jobs", "third"));
}

TEST_F(FakeApiServerTest, ADependentWithAnotherOwnerStaysAndLosesTheGoneOne) {
  json a_owner = Create(kConfigMaps, ConfigMap("a", {{"k", "v"}}));
  json b_owner = Create(kConfigMaps, ConfigMap("b", {{"k", "v"}}));
  json ref_b = OwnerRef(b_owner);
  ref_b["controller"] = false;
  Create(kPods, Pod("shared", json::array({OwnerRef(a_owner), ref_b})));
  EXPECT_EQ(Call("DELETE", std::string(kConfigMaps) + "/a").status, 200);
  json pod = fake_.Object("v1/pods", "default", "shared");
  ASSERT_FALSE(pod.is_null());
  ASSERT_EQ(pod["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["name"], "b");
  EXPECT_EQ(Call("DELETE", std::string(kConfigMaps) + "/b").status, 200);
  EXPECT_FALSE(Exists("v1/pods", "shared"));
}

// ---- ttlSecondsAfterFinished ----

TEST_F(FakeApiServerTest, FinishedJobsGoAfterTheirTtlWithTheirPods) {
  json job = Job("done");
  job["spec"]["ttlSecondsAfterFinished"] = 0;
  job = Create(kJobs, job);
  Create(kPods, Pod("done-0", json::array({OwnerRef(job)})));
  json keep = Job("kept");  // finished, but an hour to go
  keep["spec"]["ttlSecondsAfterFinished"] = 3600;
  keep = Create(kJobs, keep);
  json running = Job("running");  // TTL 0 but not finished
  running["spec"]["ttlSecondsAfterFinished"] = 0;
  Create(kJobs, running);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(Exists("batch/v1/jobs", "running"));
  EXPECT_TRUE(Exists("batch/v1/jobs", "done"));

  json complete = {
      {"type", "Complete"}, {"status", "True"}, {"lastTransitionTime", FormatRfc3339(NowMillis())}};
  job["status"] = {{"conditions", json::array({complete})}};
  EXPECT_EQ(Call("PUT", std::string(kJobs) + "/done/status", job).status, 200);
  // Failed, without a lastTransitionTime: counted from the write.
  EXPECT_EQ(
      Call("PATCH", std::string(kJobs) + "/kept/status",
           {{"status", {{"conditions", json::array({{{"type", "Failed"}, {"status", "True"}}})}}}},
           kMerge)
          .status,
      200);
  EXPECT_TRUE(WaitFor([&] { return !Exists("batch/v1/jobs", "done"); }));
  EXPECT_FALSE(Exists("v1/pods", "done-0"));
  EXPECT_TRUE(Exists("batch/v1/jobs", "kept"));
  EXPECT_TRUE(Exists("batch/v1/jobs", "running"));
}

TEST_F(FakeApiServerTest, AJobFinishedWithoutATransitionTimeGoesAfterItsTtlFromTheWrite) {
  json job = Job("short");
  job["spec"]["ttlSecondsAfterFinished"] = 1;
  Create(kJobs, job);
  EXPECT_EQ(Call("PATCH", std::string(kJobs) + "/short/status",
                 {{"status",
                   {{"conditions", json::array({{{"type", "Complete"}, {"status", "True"}}})}}}},
                 kMerge)
                .status,
            200);
  EXPECT_TRUE(WaitFor([&] { return !Exists("batch/v1/jobs", "short"); }));
}

// ---- namespaces ----

TEST_F(FakeApiServerTest, ObjectsNeedTheirNamespace) {
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"})
    EXPECT_EQ(Call("GET", std::string("/api/v1/namespaces/") + ns).status, 200) << ns;
  Answer a = Call("POST", "/api/v1/namespaces/team/configmaps", ConfigMap("c", {}, "team"));
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(a.body["reason"], "NotFound");
  EXPECT_EQ(a.body["message"], "namespaces \"team\" not found");
  EXPECT_EQ(a.body["details"], json({{"name", "team"}, {"kind", "namespaces"}}));
  a = Call("PATCH", "/api/v1/namespaces/team/configmaps/c?fieldManager=tau",
           ConfigMap("c", {}, "team"), kApply);
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(a.body["message"], "namespaces \"team\" not found");

  json ns = Create("/api/v1/namespaces",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team"}}}});
  EXPECT_EQ(ns["status"]["phase"], "Active");
  EXPECT_FALSE(ns["metadata"].contains("namespace"));
  Create("/api/v1/namespaces/team/configmaps", ConfigMap("c", {}, "team"));
  Create("/api/v1/namespaces/team/pods", Pod("p"));
  // Deleting the namespace deletes what is in it.
  EXPECT_EQ(Call("DELETE", "/api/v1/namespaces/team").status, 200);
  EXPECT_TRUE(fake_.Object("v1/namespaces", "", "team").is_null());
  EXPECT_TRUE(fake_.Object("v1/configmaps", "team", "c").is_null());
  EXPECT_TRUE(fake_.Object("v1/pods", "team", "p").is_null());
  EXPECT_EQ(Call("POST", "/api/v1/namespaces/team/configmaps", ConfigMap("c", {}, "team")).status,
            404);
}

TEST_F(FakeApiServerTest, ANamespaceMayComeAsProtobufAsKubectlSendsIt) {
  // "k8s\0", runtime.Unknown{typeMeta{v1, Namespace}, raw: Namespace{metadata{name: proto}}}.
  std::string type_meta = std::string("\x0a\x02v1\x12\x09Namespace", 15);
  std::string raw = std::string("\x0a\x07\x0a\x05proto", 9);
  std::string body = std::string("k8s\0", 4) + "\x0a" + static_cast<char>(type_meta.size()) +
                     type_meta + "\x12" + static_cast<char>(raw.size()) + raw;
  Result<client::Response> r =
      conn_->Call("POST", "/api/v1/namespaces", body, "application/vnd.kubernetes.protobuf");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 201) << r->body;
  EXPECT_FALSE(fake_.Object("v1/namespaces", "", "proto").is_null());
  r = conn_->Call("POST", kConfigMaps, body, "application/vnd.kubernetes.protobuf");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 415);
}

// ---- dryRun ----

TEST_F(FakeApiServerTest, DryRunAnswersAsIfDoneAndStoresNothing) {
  Create(kConfigMaps, ConfigMap("c", {{"k", "v"}}));
  int64_t rv = fake_.resource_version();
  Answer a = Call("POST", std::string(kConfigMaps) + "?dryRun=All", ConfigMap("d", {{"k", "v"}}));
  EXPECT_EQ(a.status, 201);
  EXPECT_EQ(a.body["metadata"]["name"], "d");
  EXPECT_FALSE(Exists("v1/configmaps", "d"));
  a = Call("PUT", std::string(kConfigMaps) + "/c?dryRun=All", ConfigMap("c", {{"k", "put"}}));
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body["data"]["k"], "put");
  a = Call("PATCH", std::string(kConfigMaps) + "/c?dryRun=All", {{"data", {{"k", "merged"}}}},
           kMerge);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body["data"]["k"], "merged");
  a = Call("PATCH", std::string(kConfigMaps) + "/c?fieldManager=m&force=true&dryRun=All",
           ConfigMap("c", {{"k", "applied"}}), kApply);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body["data"]["k"], "applied");
  a = Call("DELETE", std::string(kConfigMaps) + "/c?dryRun=All");
  EXPECT_EQ(a.status, 200);
  a = Call("DELETE", std::string(kConfigMaps) + "/c", {{"dryRun", json::array({"All"})}});
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(fake_.Object("v1/configmaps", "default", "c")["data"]["k"], "v");
  EXPECT_EQ(fake_.resource_version(), rv);  // no version spent, so no watch event either
  EXPECT_TRUE(Watch(kConfigMaps, rv).empty());
  // Any other value is refused, as the options' validation refuses it.
  a = Call("POST", std::string(kConfigMaps) + "?dryRun=true", ConfigMap("e", {}));
  EXPECT_EQ(a.status, 422);
  EXPECT_NE(a.body.value("message", "").find("dryRun: Unsupported value"), std::string::npos);
  EXPECT_FALSE(Exists("v1/configmaps", "e"));
}

// ---- field selectors ----

TEST_F(FakeApiServerTest, FieldSelectorsOnListsAndWatches) {
  json a = Pod("a");
  a["spec"]["nodeName"] = "n1";
  a["status"] = {{"phase", "Running"}};
  Create(kPods, a);
  json b = Pod("b");
  b["spec"]["nodeName"] = "n2";
  Create(kPods, b);  // no phase given: Pending
  auto names = [&](const std::string& path, const std::string& selector) {
    Answer r = Call("GET", path + "?fieldSelector=" + selector);
    EXPECT_EQ(r.status, 200) << selector << ": " << r.body.dump();
    std::vector<std::string> out;
    for (const json& item : r.body.value("items", json::array()))
      out.push_back(item["metadata"]["name"]);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(kPods, "status.phase=Running"), V{"a"});
  EXPECT_EQ(names(kPods, "status.phase==Pending"), V{"b"});
  EXPECT_EQ(names(kPods, "spec.nodeName!=n1"), V{"b"});
  EXPECT_EQ(names(kPods, "metadata.name=a,spec.nodeName=n2"), V{});
  EXPECT_EQ(names("/api/v1/pods", "metadata.namespace=default,spec.restartPolicy=Always"),
            (V{"a", "b"}));
  Create(kJobs, Job("j"));
  EXPECT_EQ(names(kJobs, "metadata.name=j"), V{"j"});
  Answer bad = Call("GET", std::string(kJobs) + "?fieldSelector=spec.parallelism=1");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["message"], "field label not supported: spec.parallelism");
  bad = Call("GET", std::string(kConfigMaps) + "?fieldSelector=data.k=v");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["message"],
            "\"data.k\" is not a known field selector: only \"metadata.name\", "
            "\"metadata.namespace\"");
  // Events, by the object they are about.
  json event = {{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", Meta("e1")},
                {"involvedObject", {{"kind", "Pod"}, {"name", "a"}, {"namespace", "default"}}},
                {"reason", "Scheduled"},
                {"type", "Normal"}};
  Create("/api/v1/namespaces/default/events", event);
  EXPECT_EQ(names("/api/v1/namespaces/default/events",
                  "involvedObject.kind=Pod,involvedObject.name=a,reason=Scheduled,type=Normal"),
            V{"e1"});
  EXPECT_EQ(names("/api/v1/namespaces/default/events", "involvedObject.name=b"), V{});

  // A watch sees a pod enter the selection as ADDED and leave it as DELETED.
  int64_t from = fake_.resource_version();
  Call("PATCH", std::string(kPods) + "/b/status", {{"status", {{"phase", "Running"}}}}, kMerge);
  Call("PATCH", std::string(kPods) + "/b/status", {{"status", {{"phase", "Succeeded"}}}}, kMerge);
  std::vector<WatchEvent> events = Watch(kPods, from, "&fieldSelector=status.phase%3DRunning");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(std::get<0>(events[0]), "ADDED");
  EXPECT_EQ(std::get<0>(events[1]), "DELETED");
  EXPECT_EQ(std::get<1>(events[1]), "b");
}

// ---- server-side apply: field ownership ----

TEST_F(FakeApiServerTest, ApplyConflictsSharesForcesAndRemovesFields) {
  const std::string path = std::string(kConfigMaps) + "/c?fieldManager=";
  Answer r = Call("PATCH", path + "alice", ConfigMap("c", {{"k", "v"}, {"mine", "x"}}), kApply);
  ASSERT_EQ(r.status, 201) << r.body.dump();
  // Another manager changing alice's field: a conflict naming her and the field.
  r = Call("PATCH", path + "bob", ConfigMap("c", {{"k", "w"}}), kApply);
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body["reason"], "Conflict");
  EXPECT_EQ(r.body["message"],
            "Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.k");
  ASSERT_EQ(r.body["details"]["causes"].size(), 1u);
  EXPECT_EQ(r.body["details"]["causes"][0]["type"], "FieldManagerConflict");
  EXPECT_EQ(r.body["details"]["causes"][0]["field"], ".data.k");
  EXPECT_EQ(fake_.Object("v1/configmaps", "default", "c")["data"]["k"], "v");
  // The same value: shared, no conflict.
  r = Call("PATCH", path + "bob", ConfigMap("c", {{"k", "v"}}), kApply);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  // alice stops applying `mine`, which she alone owned: it goes; `k` stays, bob shares it.
  r = Call("PATCH", path + "alice", ConfigMap("c", {{"other", "y"}}), kApply);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  json stored = fake_.Object("v1/configmaps", "default", "c");
  EXPECT_EQ(stored["data"], json({{"k", "v"}, {"other", "y"}}));
  // Forced, the field moves to bob.
  r = Call("PATCH", path + "carol", ConfigMap("c", {{"other", "z"}}), kApply);
  EXPECT_EQ(r.status, 409);
  r = Call("PATCH", path + "carol&force=true", ConfigMap("c", {{"other", "z"}}), kApply);
  EXPECT_EQ(r.status, 200) << r.body.dump();
  stored = fake_.Object("v1/configmaps", "default", "c");
  EXPECT_EQ(stored["data"]["other"], "z");
  for (const json& entry : stored["metadata"]["managedFields"]) {
    EXPECT_EQ(entry["operation"], "Apply");
    if (entry["manager"] == "alice") ADD_FAILURE() << "alice owns nothing now: " << entry.dump();
    if (entry["manager"] == "carol") {
      EXPECT_EQ(entry["fieldsV1"], json({{"f:data", {{"f:other", json::object()}}}}));
    }
  }
}

TEST_F(FakeApiServerTest, UpdatesOwnWhatTheyChangeAndApplyConflictsWithThem) {
  Create(kConfigMaps + std::string("?fieldManager=creator"), ConfigMap("c", {{"k", "v"}}));
  Answer r = Call("PATCH", std::string(kConfigMaps) + "/c?fieldManager=editor",
                  {{"data", {{"k", "edited"}}}}, kMerge);
  ASSERT_EQ(r.status, 200);
  bool editor_owns = false;
  for (const json& entry : r.body["metadata"]["managedFields"])
    if (entry["manager"] == "editor") {
      EXPECT_EQ(entry["operation"], "Update");
      EXPECT_EQ(entry["fieldsV1"], json({{"f:data", {{"f:k", json::object()}}}}));
      editor_owns = true;
    } else {
      // The creator owned data.k alone; having lost it, its entry is dropped.
      ADD_FAILURE() << entry.dump();
    }
  EXPECT_TRUE(editor_owns);
  r = Call("PATCH", std::string(kConfigMaps) + "/c?fieldManager=tau",
           ConfigMap("c", {{"k", "mine"}}), kApply);
  EXPECT_EQ(r.status, 409);
  EXPECT_NE(r.body.value("message", "").find("conflict with \"editor\" using v1 at "),
            std::string::npos)
      << r.body.dump();
}

// ---- custom resources against their CRDs ----

TEST_F(FakeApiServerTest, CustomResourcesAreValidatedAgainstTheirCrds) {
  const char* src = std::getenv("TAU_SOURCE_DIR");
  ASSERT_TRUE(fake_
                  .LoadCrds(std::string(src != nullptr ? src : TAU_TEST_SOURCE_DIR) +
                            "/tests/data/kube/schemas")
                  .ok());
  const std::string path = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues";
  json cq = {{"apiVersion", "kueue.x-k8s.io/v1beta2"},
             {"kind", "ClusterQueue"},
             {"metadata", {{"name", "cq"}}},
             {"spec", {{"namespaceSelector", json::object()}, {"cohortName", 5}}}};
  Answer a = Call("POST", path, cq);
  EXPECT_EQ(a.status, 422) << a.body.dump();
  EXPECT_EQ(a.body["reason"], "Invalid");
  EXPECT_EQ(a.body["details"]["kind"], "ClusterQueue");
  EXPECT_EQ(a.body["details"]["group"], "kueue.x-k8s.io");
  ASSERT_FALSE(a.body["details"]["causes"].empty());
  EXPECT_EQ(a.body["details"]["causes"][0]["field"], "spec.cohortName") << a.body.dump();
  EXPECT_TRUE(fake_.Object("kueue.x-k8s.io/v1beta2/clusterqueues", "", "cq").is_null());
  // An apply is checked as the object it would make.
  a = Call("PATCH", path + "/cq?fieldManager=tau", cq, kApply);
  EXPECT_EQ(a.status, 422) << a.body.dump();
  cq["spec"]["cohortName"] = "team";
  a = Call("PATCH", path + "/cq?fieldManager=tau", cq, kApply);
  EXPECT_EQ(a.status, 201) << a.body.dump();
  a = Call("PATCH", path + "/cq", json{{"spec", {{"stopPolicy", "Sometimes"}}}}, kMerge);
  EXPECT_EQ(a.status, 422) << a.body.dump();
  // Built-in kinds are not the CRDs' business.
  EXPECT_EQ(Call("POST", kConfigMaps, ConfigMap("c", {{"k", "v"}})).status, 201);
}

}  // namespace
}  // namespace tau::testutil
