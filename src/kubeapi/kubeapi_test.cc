#include "kubeapi/kubeapi.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "kubeapi/internal.h"
#include "testing/fake_apiserver.h"
#include "testing/test_certs.h"

namespace tau::kubeapi {
namespace {

using testutil::FakeApiServer;

using nlohmann::json;

std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/kubeapi_test.XXXXXX";
  char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

void Write(const std::string& path, const std::string& text, int mode = 0644) {
  ASSERT_TRUE(WriteFileAtomic(path, text, mode, Durability::kProcessCrash).ok()) << path;
}

bool WaitFor(const std::function<bool()>& done, int timeout_ms = 3000) {
  for (int waited = 0; waited < timeout_ms; waited += 5) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// Stops and joins a background thread however the test ends (a failed ASSERT returns early).
struct StopAndJoin {
  std::atomic<bool>& stop;
  std::thread& thread;
  ~StopAndJoin() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

json ConfigMap(const std::string& ns, const std::string& name, const std::string& app,
               const std::string& value = "1") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", app}}}}},
          {"data", {{"value", value}}}};
}

json Pod(const std::string& ns, const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec", {{"containers", json::array({{{"name", "main"}, {"image", "busybox"}}})}}}};
}

// ---- resource paths and kubeconfig ----

TEST(ResourcePathTest, MapsKindsToRestPaths) {
  EXPECT_EQ(*ResourcePath("batch/v1", "Job", "ns", "j"), "/apis/batch/v1/namespaces/ns/jobs/j");
  EXPECT_EQ(*ResourcePath("v1", "Pod", "ns", "p", "log"), "/api/v1/namespaces/ns/pods/p/log");
  EXPECT_EQ(*ResourcePath("v1", "Node", "ignored", "n1", "status"), "/api/v1/nodes/n1/status");
  EXPECT_EQ(*ResourcePath("v1", "Namespace", "", "team"), "/api/v1/namespaces/team");
  EXPECT_EQ(*ResourcePath("kueue.x-k8s.io/v1alpha1", "Cohort", "", ""),
            "/apis/kueue.x-k8s.io/v1alpha1/cohorts");
  EXPECT_EQ(*ResourcePath("ray.io/v1", "RayJob", "ns", ""),
            "/apis/ray.io/v1/namespaces/ns/rayjobs");
  EXPECT_EQ(*ResourcePath("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", "b"),
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/b");
  EXPECT_EQ(*ResourcePath("apps/v1", "Deployment", "ns", "d"),
            "/apis/apps/v1/namespaces/ns/deployments/d");
  EXPECT_EQ(*ResourcePath("ray.io/v1", "RayService", "ns", "s", "status"),
            "/apis/ray.io/v1/namespaces/ns/rayservices/s/status");
  Result<std::string> unknown = ResourcePath("apps/v1", "StatefulSet", "ns", "d");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
}

constexpr const char* kKubeconfig = R"(apiVersion: v1
kind: Config
current-context: dev
contexts:
- name: dev
  context: {cluster: c1, user: token-user, namespace: team-a}
- name: prod
  context: {cluster: c2, user: file-user}
- name: certs
  context: {cluster: c2, user: cert-user}
- name: broken
  context: {cluster: missing, user: token-user}
clusters:
- name: c1
  cluster: {server: "https://c1.example:6443/", insecure-skip-tls-verify: true}
- name: c2
  cluster:
    server: https://c2.example:6443
    certificate-authority-data: Q0EtUEVN
users:
- name: token-user
  user: {token: abc123}
- name: file-user
  user: {tokenFile: tokens/prod.token, client-certificate: certs/c.pem, client-key: /abs/k.pem}
- name: cert-user
  user:
    client-certificate-data: Q0VSVC1QRU0=
    client-key-data: S0VZLVBFTQ==
)";

TEST(KubeconfigTest, CurrentContextWithToken) {
  Result<ClusterConfig> config = ParseKubeconfig(kKubeconfig, "", "/home/u/.kube");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->context, "dev");
  EXPECT_EQ(config->server, "https://c1.example:6443");
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->token, "abc123");
  EXPECT_EQ(config->namespace_name, "team-a");
}

TEST(KubeconfigTest, ContextOverrideTokenFileAndCaData) {
  Result<ClusterConfig> config = ParseKubeconfig(kKubeconfig, "prod", "/home/u/.kube");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->server, "https://c2.example:6443");
  EXPECT_EQ(config->ca_data, "CA-PEM");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->token_file, "/home/u/.kube/tokens/prod.token");  // relative to the file
  EXPECT_EQ(config->client_cert_file, "/home/u/.kube/certs/c.pem");
  EXPECT_EQ(config->client_key_file, "/abs/k.pem");
  EXPECT_EQ(config->namespace_name, "default");
}

TEST(KubeconfigTest, ClientCertificateData) {
  Result<ClusterConfig> config = ParseKubeconfig(kKubeconfig, "certs", "");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->client_cert_data, "CERT-PEM");
  EXPECT_EQ(config->client_key_data, "KEY-PEM");
}

TEST(KubeconfigTest, Errors) {
  Result<ClusterConfig> missing = ParseKubeconfig(kKubeconfig, "nope", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
  Result<ClusterConfig> broken = ParseKubeconfig(kKubeconfig, "broken", "");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("cluster named 'missing'"), std::string::npos);
  Result<ClusterConfig> bad_yaml = ParseKubeconfig("clusters: [", "", "");
  EXPECT_EQ(bad_yaml.status().code(), StatusCode::kInvalidArgument);
  std::string bad_base64 = kKubeconfig;
  bad_base64.replace(bad_base64.find("Q0EtUEVN"), 8, "%%%%");
  EXPECT_EQ(ParseKubeconfig(bad_base64, "prod", "").status().code(), StatusCode::kInvalidArgument);
}

TEST(KubeconfigTest, KubeconfigEnvFirstFile) {
  std::string dir = MakeTempDir();
  Write(dir + "/one", kKubeconfig);
  std::string saved = std::getenv("KUBECONFIG") ? std::getenv("KUBECONFIG") : "";
  ::setenv("KUBECONFIG", (dir + "/one:" + dir + "/two").c_str(), 1);
  Result<ClusterConfig> config = LoadDefaultConfig("prod");
  if (saved.empty())
    ::unsetenv("KUBECONFIG");
  else
    ::setenv("KUBECONFIG", saved.c_str(), 1);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->token_file, dir + "/tokens/prod.token");
  ASSERT_TRUE(RemoveTree(dir).ok());
}

TEST(KubeconfigTest, InCluster) {
  std::string dir = MakeTempDir();
  Write(dir + "/token", "sa-token\n");
  Write(dir + "/ca.crt", "CA");
  Write(dir + "/namespace", "team-b\n");
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(LoadInClusterConfig(dir).status().code(), StatusCode::kFailedPrecondition);
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  Result<ClusterConfig> config = LoadInClusterConfig(dir);
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->token_file, dir + "/token");
  EXPECT_EQ(config->ca_file, dir + "/ca.crt");
  EXPECT_EQ(config->namespace_name, "team-b");

  // The service account token is what the client sends (over https: the only way it is sent).
  ASSERT_TRUE(testutil::MakeCa(dir, "ca"));
  ASSERT_TRUE(testutil::MakeCert(dir, "ca", "server", "IP:127.0.0.1,DNS:localhost"));
  http::TlsServerConfig tls{dir + "/server.pem", dir + "/server.key"};
  FakeApiServer fake;
  ASSERT_TRUE(fake.Start(&tls).ok());
  fake.RequireToken("sa-token");
  config->server = fake.url();
  config->ca_file = dir + "/ca.pem";
  auto client = Client::Create(*config);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->List("v1", "Pod", "team-b").ok());
  ASSERT_TRUE(RemoveTree(dir).ok());
}

// ---- against the fake API server, over real HTTP ----

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(StartFake().ok());
    client_ = NewClient(ClusterConfig());
    ASSERT_NE(client_, nullptr);
    // The namespaces the tests write in, made first as on a real cluster (the API server refuses
    // objects in a namespace that does not exist); the tests count their own requests only.
    for (const char* ns : {"bm", "elsewhere", "free", "held", "ns", "ns1", "ns2", "other", "team-a",
                           "team-k", "w"}) {
      Result<json> made = client_->Create(
          {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
      ASSERT_TRUE(made.ok()) << made.status().ToString();
    }
    fake_.ClearRequests();
  }
  virtual Status StartFake() { return fake_.Start(); }
  std::unique_ptr<Client> NewClient(ClusterConfig config, int max_attempts = 5,
                                    int max_backoff_ms = 50) {
    config.server = fake_.url();
    if (!ca_file_.empty()) config.ca_file = ca_file_;
    ClientOptions options;
    options.max_attempts = max_attempts;
    options.initial_backoff_ms = 5;
    options.max_backoff_ms = max_backoff_ms;
    auto client = Client::Create(std::move(config), options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }
  FakeApiServer::RequestRecord LastRequest() {
    std::vector<FakeApiServer::RequestRecord> log = fake_.Requests();
    EXPECT_FALSE(log.empty());
    return log.empty() ? FakeApiServer::RequestRecord() : log.back();
  }

  FakeApiServer fake_;
  std::unique_ptr<Client> client_;
  std::string ca_file_;  // the CA a TLS fake's certificate is signed by
};

// The same over https, for what carries a token: clients send credentials over TLS only.
class FakeTlsServerTest : public FakeServerTest {
 protected:
  Status StartFake() override {
    dir_ = MakeTempDir();
    if (!testutil::MakeCa(dir_, "ca") ||
        !testutil::MakeCert(dir_, "ca", "server", "IP:127.0.0.1,DNS:localhost"))
      return Internal("openssl could not make the test certificates");
    tls_ = {dir_ + "/server.pem", dir_ + "/server.key"};
    ca_file_ = dir_ + "/ca.pem";
    return fake_.Start(&tls_);
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::string dir_;
  http::TlsServerConfig tls_;
};

TEST_F(FakeTlsServerTest, RequestsReuseOneConnectionAndItsTlsSession) {
  ClusterConfig config;
  config.server = fake_.url();
  config.ca_file = ca_file_;
  auto client = Client::Create(config);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ((*client)->Get("v1", "Pod", "ns", "p").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*client)->connections_opened(), 1) << "one TCP connection and TLS handshake";
  // Concurrent requests each need a connection of their own; they are kept for later ones.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) (void)(*client)->Get("v1", "Pod", "ns", "p");
    });
  for (std::thread& t : threads) t.join();
  EXPECT_LE((*client)->connections_opened(), 5);
}

TEST(ClientTest, TlsServerNameIsWhatTheCertificateIsCheckedAgainst) {
  // The server's certificate names api.internal.example only, and it is reached by IP.
  std::string dir = MakeTempDir();
  ASSERT_TRUE(testutil::MakeCa(dir, "ca") &&
              testutil::MakeCert(dir, "ca", "server", "DNS:api.internal.example"));
  http::TlsServerConfig tls{dir + "/server.pem", dir + "/server.key"};
  FakeApiServer fake;
  ASSERT_TRUE(fake.Start(&tls).ok());
  ClusterConfig config;
  config.server = fake.url();
  config.ca_file = dir + "/ca.pem";
  auto by_ip = Client::Create(config);
  ASSERT_TRUE(by_ip.ok());
  Status refused = (*by_ip)->Get("v1", "Pod", "ns", "p").status();
  EXPECT_NE(refused.code(), StatusCode::kNotFound) << "the name does not match: no answer";
  config.tls_server_name = "api.internal.example";
  auto named = Client::Create(config);
  ASSERT_TRUE(named.ok());
  Status answered = (*named)->Get("v1", "Pod", "ns", "p").status();
  EXPECT_EQ(answered.code(), StatusCode::kNotFound) << answered.ToString();
  // Read from a kubeconfig, as kubectl does.
  auto parsed = ParseKubeconfig(
      "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
      "contexts: [{name: c, context: {cluster: k}}]\n"
      "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443', tls-server-name: "
      "api.internal.example}}]\n",
      "", "/");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->tls_server_name, "api.internal.example");
  ASSERT_TRUE(RemoveTree(dir).ok());
}

TEST(ClientTest, ATokenIsNeverSentOverPlainHttp) {
  for (int which = 0; which < 3; ++which) {
    ClusterConfig config;
    config.server = "http://127.0.0.1:1";
    if (which == 0) config.token = "secret";
    if (which == 1) config.token_file = "/var/run/secrets/token";
    if (which == 2) config.exec.command = "/bin/true";
    auto client = Client::Create(config);
    ASSERT_FALSE(client.ok()) << which;
    EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(client.status().message().find("credentials over https only"), std::string::npos)
        << client.status().message();
  }
  ClusterConfig anonymous;
  anonymous.server = "http://127.0.0.1:1";
  EXPECT_TRUE(Client::Create(anonymous).ok()) << "no credentials: plain http is allowed";
}

TEST_F(FakeServerTest, ApplyCreatesThenUpdates) {
  json job = {{"apiVersion", "batch/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", "train"}, {"namespace", "team-a"}}},
              {"spec", {{"parallelism", 1}, {"suspend", true}}}};
  Result<json> created = client_->Apply(job);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  FakeApiServer::RequestRecord request = LastRequest();
  EXPECT_EQ(request.method, "PATCH");
  EXPECT_EQ(request.path, "/apis/batch/v1/namespaces/team-a/jobs/train");
  EXPECT_EQ(request.content_type, "application/apply-patch+yaml");
  EXPECT_EQ(request.params["fieldManager"], "tau");
  EXPECT_EQ(request.params["force"], "true");
  EXPECT_EQ((*created)["metadata"]["generation"], 1);
  std::string uid = (*created)["metadata"]["uid"];

  job["spec"]["parallelism"] = 4;
  Result<json> updated = client_->Apply(job);
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  json stored = fake_.Object("batch/v1/jobs", "team-a", "train");
  EXPECT_EQ(stored["spec"]["parallelism"], 4);
  EXPECT_EQ(stored["spec"]["suspend"], true);
  EXPECT_EQ(stored["metadata"]["uid"], uid);
  EXPECT_EQ(stored["metadata"]["generation"], 2);
  EXPECT_EQ(stored["metadata"]["managedFields"][0]["manager"], "tau");
  EXPECT_GT(std::stoll(stored["metadata"]["resourceVersion"].get<std::string>()),
            std::stoll((*created)["metadata"]["resourceVersion"].get<std::string>()));

  // Status through the subresource leaves the spec and generation alone.
  Result<json> patched = client_->MergePatch("batch/v1", "Job", "team-a", "train",
                                             {{"status", {{"active", 4}}}}, "status");
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ(LastRequest().content_type, "application/merge-patch+json");
  EXPECT_EQ((*patched)["status"]["active"], 4);
  EXPECT_EQ((*patched)["metadata"]["generation"], 2);
  json with_status = *patched;
  with_status["status"]["succeeded"] = 1;
  Result<json> status_updated = client_->UpdateStatus(with_status);
  ASSERT_TRUE(status_updated.ok()) << status_updated.status().ToString();
  EXPECT_EQ(LastRequest().path, "/apis/batch/v1/namespaces/team-a/jobs/train/status");
  EXPECT_EQ((*status_updated)["status"]["succeeded"], 1);
}

TEST_F(FakeServerTest, GetAndListWithPagination) {
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(client_->Create(ConfigMap("ns1", fmt::format("cm-{}", i), i < 3 ? "a" : "b")).ok());
  ASSERT_TRUE(client_->Create(ConfigMap("ns2", "other", "a")).ok());

  Result<json> got = client_->Get("v1", "ConfigMap", "ns1", "cm-2");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)["data"]["value"], "1");
  EXPECT_EQ(client_->Get("v1", "ConfigMap", "ns1", "nope").status().code(), StatusCode::kNotFound);

  std::vector<std::string> names;
  ListOptions options;
  options.limit = 2;
  int pages = 0;
  do {
    Result<ObjectList> page = client_->List("v1", "ConfigMap", "ns1", options);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->items.size(), 2u);
    for (const json& item : page->items) names.push_back(item["metadata"]["name"]);
    options.continue_token = page->continue_token;
    ++pages;
  } while (!options.continue_token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(names, (std::vector<std::string>{"cm-0", "cm-1", "cm-2", "cm-3", "cm-4"}));
  EXPECT_EQ(LastRequest().params["limit"], "2");

  ListOptions selected;
  selected.label_selector = "app=a";
  Result<ObjectList> a = client_->List("v1", "ConfigMap", "ns1", selected);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->items.size(), 3u);
  EXPECT_EQ(LastRequest().params["labelSelector"], "app=a");
  Result<ObjectList> everywhere = client_->List("v1", "ConfigMap", "", selected);
  ASSERT_TRUE(everywhere.ok());
  EXPECT_EQ(everywhere->items.size(), 4u);
  EXPECT_EQ(everywhere->resource_version, std::to_string(fake_.resource_version()));
  // The API server leaves apiVersion and kind out of a List's items; the client puts them back,
  // so that an item can be deleted or applied as it is.
  for (const json& item : everywhere->items) {
    EXPECT_EQ(item["apiVersion"], "v1");
    EXPECT_EQ(item["kind"], "ConfigMap");
  }
}

TEST_F(FakeServerTest, AWatchHeldOpenPastItsTimeoutIsGivenUp) {
  // The server (or a proxy) holds the watch open without a word, past its timeoutSeconds: a
  // client that waited on it would miss every later change.
  ClusterConfig config;
  config.server = fake_.url();
  ClientOptions options;
  options.watch_deadline_margin_ms = 300;
  options.max_attempts = 1;  // one watch, not a fresh one after it
  auto client = Client::Create(config, options);
  ASSERT_TRUE(client.ok());
  fake_.StallWatches(true);
  std::atomic<bool> stop{false};
  std::thread guard([&] {
    for (int i = 0; i < 1000 && !stop; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stop = true;  // a hung watch ends here, as Ok: the test then fails below
  });
  WatchOptions watch;
  watch.timeout_seconds = 1;
  int64_t start = MonotonicMillis();
  Status s = (*client)->Watch(
      "v1", "ConfigMap", "ns", watch, [](const WatchEvent&) { return true; }, &stop);
  int64_t took = MonotonicMillis() - start;
  stop = true;
  guard.join();
  fake_.StallWatches(false);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_GE(took, 1000);
  EXPECT_LT(took, 6000);
}

TEST_F(FakeServerTest, ACallBudgetCutsAHeldCallShort) {
  fake_.HoldWrites("held", true);
  int64_t start = MonotonicMillis();
  Status s;
  {
    CallBudget budget(300);
    s = client_->Create(ConfigMap("held", "cm", "a")).status();
  }
  int64_t took = MonotonicMillis() - start;
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("budget"), std::string::npos) << s.message();
  EXPECT_LT(took, 5000);
  // Other namespaces are not held; outside the budget, calls have their usual timeouts.
  EXPECT_TRUE(client_->Create(ConfigMap("free", "cm", "a")).ok());
  EXPECT_EQ(CallBudget::Deadline(), 0);
  fake_.HoldWrites("held", false);
}

TEST_F(FakeServerTest, CreateConflictAndStaleUpdate) {
  ASSERT_TRUE(client_->Create(ConfigMap("ns", "cm", "a")).ok());
  EXPECT_EQ(LastRequest().method, "POST");
  EXPECT_EQ(LastRequest().path, "/api/v1/namespaces/ns/configmaps");
  Status again = client_->Create(ConfigMap("ns", "cm", "a")).status();
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_NE(again.message().find("already exists"), std::string::npos) << again.message();
  EXPECT_FALSE(IsConflict(again));

  Result<json> read = client_->Get("v1", "ConfigMap", "ns", "cm");
  ASSERT_TRUE(read.ok());
  json first = *read;
  first["data"]["value"] = "2";
  ASSERT_TRUE(client_->Replace(first).ok());
  json stale = *read;  // still carries the old resourceVersion
  stale["data"]["value"] = "3";
  Status conflict = client_->Replace(stale).status();
  EXPECT_TRUE(IsConflict(conflict)) << conflict.ToString();
  EXPECT_NE(conflict.message().find("the object has been modified"), std::string::npos);
  EXPECT_EQ(fake_.Object("v1/configmaps", "ns", "cm")["data"]["value"], "2");

  // The API's Status message reaches the caller.
  json unnamed = ConfigMap("ns", "", "a");
  Status invalid = client_->Create(unnamed).status();
  EXPECT_EQ(invalid.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.message().find("metadata.name: Required value"), std::string::npos);
}

TEST_F(FakeServerTest, DeleteWithPropagation) {
  json job = {{"apiVersion", "batch/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", "j"}, {"namespace", "ns"}}},
              {"spec", json::object()}};
  ASSERT_TRUE(client_->Create(job).ok());
  DeleteOptions options;
  options.propagation = Propagation::kForeground;
  ASSERT_TRUE(client_->Delete("batch/v1", "Job", "ns", "j", options).ok());
  FakeApiServer::RequestRecord request = LastRequest();
  EXPECT_EQ(request.method, "DELETE");
  EXPECT_EQ(request.path, "/apis/batch/v1/namespaces/ns/jobs/j");
  EXPECT_EQ(request.params["propagationPolicy"], "Foreground");
  EXPECT_TRUE(fake_.Object("batch/v1/jobs", "ns", "j").is_null());
  EXPECT_TRUE(client_->Delete("batch/v1", "Job", "ns", "j").ok());  // already gone is fine
  EXPECT_EQ(LastRequest().params["propagationPolicy"], "Background");
  options.ignore_not_found = false;
  EXPECT_EQ(client_->Delete("batch/v1", "Job", "ns", "j", options).code(), StatusCode::kNotFound);
}

TEST_F(FakeServerTest, WatchDeliversEventsInOrder) {
  Result<ObjectList> listed = client_->List("v1", "ConfigMap", "w");
  ASSERT_TRUE(listed.ok());
  std::vector<WatchEvent> events;
  Status watched;
  std::thread watcher([&] {
    WatchOptions options;
    options.resource_version = listed->resource_version;
    options.allow_bookmarks = false;
    watched = client_->Watch("v1", "ConfigMap", "w", options, [&](const WatchEvent& event) {
      events.push_back(event);
      return events.size() < 3;
    });
  });
  ASSERT_TRUE(client_->Create(ConfigMap("w", "cm", "a")).ok());
  ASSERT_TRUE(client_->Create(ConfigMap("elsewhere", "cm", "a")).ok());  // another namespace
  ASSERT_TRUE(client_->MergePatch("v1", "ConfigMap", "w", "cm", {{"data", {{"value", "2"}}}}).ok());
  ASSERT_TRUE(client_->Delete("v1", "ConfigMap", "w", "cm").ok());
  watcher.join();
  EXPECT_TRUE(watched.ok()) << watched.ToString();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, "ADDED");
  EXPECT_EQ(events[1].type, "MODIFIED");
  EXPECT_EQ(events[1].object["data"]["value"], "2");
  EXPECT_EQ(events[2].type, "DELETED");
  int64_t previous = 0;
  for (const WatchEvent& event : events) {
    EXPECT_EQ(event.object["metadata"]["namespace"], "w");
    int64_t rv = std::stoll(event.object["metadata"]["resourceVersion"].get<std::string>());
    EXPECT_GT(rv, previous);
    previous = rv;
  }
  int watches = 0;
  for (FakeApiServer::RequestRecord& request : fake_.Requests()) {
    if (request.params["watch"] != "true") continue;
    ++watches;
    EXPECT_EQ(request.params["resourceVersion"], listed->resource_version);
  }
  EXPECT_EQ(watches, 1);
}

// Collects a WatchLoop's events and applies them, as a consumer would.
struct EventLog {
  std::mutex mu;
  std::vector<WatchEvent> events;
  std::map<std::string, std::string> state;  // name -> resourceVersion

  void Add(const WatchEvent& event) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(event);
    std::string name = event.object["metadata"]["name"];
    if (event.type == "DELETED")
      state.erase(name);
    else
      state[name] = event.object["metadata"]["resourceVersion"];
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return events.size();
  }
  std::map<std::string, std::string> State() {
    std::lock_guard<std::mutex> lock(mu);
    return state;
  }
};

std::map<std::string, std::string> ServerState(FakeApiServer& fake, const std::string& ns,
                                               const std::vector<std::string>& names) {
  std::map<std::string, std::string> state;
  for (const std::string& name : names) {
    json object = fake.Object("v1/configmaps", ns, name);
    if (!object.is_null()) state[name] = object["metadata"]["resourceVersion"];
  }
  return state;
}

TEST_F(FakeServerTest, WatchLoopRelistsAfterGoneWithoutLosingOrRepeatingEvents) {
  ASSERT_TRUE(client_->Create(ConfigMap("w", "a", "x")).ok());
  ASSERT_TRUE(client_->Create(ConfigMap("w", "b", "x")).ok());
  WatchLoop::Options options;
  options.error_backoff_ms = 10;
  options.list.limit = 1;  // relists page too
  WatchLoop loop(client_.get(), "v1", "ConfigMap", "w", options);
  EventLog log;
  std::atomic<bool> stop{false};
  Status ran;
  std::thread runner([&] { ran = loop.Run([&](const WatchEvent& e) { log.Add(e); }, stop); });
  StopAndJoin guard{stop, runner};
  ASSERT_TRUE(WaitFor([&] { return log.size() == 2; }));

  // Changes the watch does not deliver, then the history is compacted: the open watch gets a
  // 410 ERROR event and the loop must relist to learn of them.
  fake_.PauseWatches(true);
  ASSERT_TRUE(client_->Delete("v1", "ConfigMap", "w", "a").ok());
  ASSERT_TRUE(client_->MergePatch("v1", "ConfigMap", "w", "b", {{"data", {{"value", "2"}}}}).ok());
  ASSERT_TRUE(client_->Create(ConfigMap("w", "c", "x")).ok());
  fake_.ExpireWatches();
  fake_.PauseWatches(false);
  const std::vector<std::string> names = {"a", "b", "c", "d"};
  ASSERT_TRUE(WaitFor([&] { return log.State() == ServerState(fake_, "w", names); }));
  EXPECT_EQ(loop.relists(), 2);

  ASSERT_TRUE(client_->Create(ConfigMap("w", "d", "x")).ok());  // through the new watch
  ASSERT_TRUE(WaitFor([&] { return log.State() == ServerState(fake_, "w", names); }));
  stop = true;
  runner.join();
  EXPECT_TRUE(ran.ok()) << ran.ToString();

  std::vector<std::string> seen;
  std::set<std::string> unique;
  for (const WatchEvent& e : log.events) {
    std::string id =
        fmt::format("{} {} {}", e.type, e.object["metadata"]["name"].get<std::string>(),
                    e.object["metadata"]["resourceVersion"].get<std::string>());
    EXPECT_TRUE(unique.insert(id).second) << "delivered twice: " << id;
    seen.push_back(e.type + " " + e.object["metadata"]["name"].get<std::string>());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED a", "ADDED b", "DELETED a", "MODIFIED b",
                                            "ADDED c", "ADDED d"}));
  EXPECT_EQ(loop.Snapshot().size(), 3u);
  EXPECT_EQ(loop.relists(), 2);
}

TEST_F(FakeServerTest, BookmarksAdvanceTheResourceVersion) {
  fake_.set_bookmark_interval_ms(20);
  ASSERT_TRUE(client_->Create(Pod("bm", "p")).ok());
  WatchLoop loop(client_.get(), "v1", "Pod", "bm", WatchLoop::Options());
  EventLog log;
  std::atomic<bool> stop{false};
  std::thread runner([&] { (void)loop.Run([&](const WatchEvent& e) { log.Add(e); }, stop); });
  StopAndJoin guard{stop, runner};
  ASSERT_TRUE(WaitFor([&] { return log.size() == 1; }));
  // Changes elsewhere move the global resourceVersion; only bookmarks tell this watch.
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(client_->Create(ConfigMap("other", fmt::format("cm{}", i), "x")).ok());
  std::string now = std::to_string(fake_.resource_version());
  ASSERT_TRUE(WaitFor([&] { return loop.resource_version() == now; })) << loop.resource_version();
  // A new watch resumes from the bookmark's version.
  fake_.EndWatches();
  ASSERT_TRUE(WaitFor([&] {
    std::vector<FakeApiServer::RequestRecord> requests = fake_.Requests();
    for (auto& r : requests)
      if (r.params["watch"] == "true" && r.params["resourceVersion"] == now) return true;
    return false;
  }));
  stop = true;
  runner.join();
  EXPECT_EQ(log.size(), 1u);  // bookmarks are not delivered
  EXPECT_EQ(loop.relists(), 1);
  for (FakeApiServer::RequestRecord& r : fake_.Requests()) {
    if (r.params["watch"] == "true") {
      EXPECT_EQ(r.params["allowWatchBookmarks"], "true");
    }
  }
}

TEST_F(FakeServerTest, LogStreamingDeliversChunksAndStops) {
  ASSERT_TRUE(client_->Create(Pod("ns", "p")).ok());
  fake_.AppendLog("ns", "p", "line 1\n");
  std::mutex mu;
  std::string received;
  std::atomic<bool> stop{false};
  Status streamed;
  LogOptions options;
  options.container = "main";
  options.since_time = "2000-01-01T00:00:00Z";
  std::thread reader([&] {
    streamed = client_->StreamLogs(
        "ns", "p", options,
        [&](std::string_view chunk) {
          std::lock_guard<std::mutex> lock(mu);
          received.append(chunk);
          return true;
        },
        &stop);
  });
  StopAndJoin guard{stop, reader};
  auto text = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return received;
  };
  ASSERT_TRUE(WaitFor([&] { return text() == "line 1\n"; })) << text();
  fake_.AppendLog("ns", "p", "line 2\n");
  ASSERT_TRUE(WaitFor([&] { return text() == "line 1\nline 2\n"; })) << text();
  int64_t asked = MonotonicMillis();
  stop = true;
  reader.join();
  EXPECT_LT(MonotonicMillis() - asked, 1000);
  EXPECT_TRUE(streamed.ok()) << streamed.ToString();
  fake_.AppendLog("ns", "p", "line 3\n");
  EXPECT_EQ(text(), "line 1\nline 2\n");
  FakeApiServer::RequestRecord request = LastRequest();
  EXPECT_EQ(request.path, "/api/v1/namespaces/ns/pods/p/log");
  EXPECT_EQ(request.params["follow"], "true");
  EXPECT_EQ(request.params["container"], "main");
  EXPECT_EQ(request.params["sinceTime"], "2000-01-01T00:00:00Z");

  // A log that ends (the container exited) ends the stream.
  fake_.EndLog("ns", "p");
  std::string all;
  Status ended = client_->StreamLogs("ns", "p", LogOptions(), [&](std::string_view chunk) {
    all.append(chunk);
    return true;
  });
  EXPECT_TRUE(ended.ok()) << ended.ToString();
  EXPECT_EQ(all, "line 1\nline 2\nline 3\n");
  EXPECT_EQ(
      client_->StreamLogs("ns", "nope", LogOptions(), [](std::string_view) { return true; }).code(),
      StatusCode::kNotFound);
}

TEST_F(FakeServerTest, RetriesThrottlingAndUnavailableWithBackoff) {
  ASSERT_TRUE(client_->Create(ConfigMap("ns", "cm", "a")).ok());
  // Retry-After (1 s, capped by max_backoff_ms = 150) sets the pace, not the 5 ms backoff.
  std::unique_ptr<Client> patient = NewClient(ClusterConfig(), 5, 150);
  fake_.ClearRequests();
  fake_.InjectFailures(2, 429, 1);
  int64_t start = MonotonicMillis();
  Result<json> got = patient->Get("v1", "ConfigMap", "ns", "cm");
  int64_t took = MonotonicMillis() - start;
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(fake_.Requests().size(), 3u);
  EXPECT_GE(took, 290);

  fake_.ClearRequests();
  fake_.InjectFailures(3, 503, 0);
  start = MonotonicMillis();
  ASSERT_TRUE(client_->Get("v1", "ConfigMap", "ns", "cm").ok());
  EXPECT_EQ(fake_.Requests().size(), 4u);
  EXPECT_LT(MonotonicMillis() - start, 1000);

  fake_.ClearRequests();
  fake_.InjectFailures(100, 500, 0);
  Result<json> failed = client_->Get("v1", "ConfigMap", "ns", "cm");
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("HTTP 500"), std::string::npos);
  EXPECT_NE(failed.status().message().find("injected failure 500"), std::string::npos);
  EXPECT_NE(failed.status().message().find("gave up after 5 attempts"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(fake_.Requests().size(), 5u);
  fake_.InjectFailures(0, 500, 0);
}

// A real client: kubectl reads, through discovery and a LIST, a Job that tau's client applied.
TEST_F(FakeServerTest, KubectlSeesWhatTauApplied) {
  if (std::system("kubectl version --client >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "kubectl is not installed";
  json job = {{"apiVersion", "batch/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", "seen-by-kubectl"}, {"namespace", "team-k"}}},
              {"spec", {{"suspend", true}}}};
  ASSERT_TRUE(client_->Apply(job).ok());
  std::string dir = MakeTempDir();
  std::string command = fmt::format(
      "timeout 30 kubectl --kubeconfig /dev/null --cache-dir {0}/cache --server {1} get jobs "
      "-n team-k -o json > {0}/out 2> {0}/err",
      dir, fake_.url());
  int rc = std::system(command.c_str());
  Result<std::string> out = ReadFile(dir + "/out");
  Result<std::string> err = ReadFile(dir + "/err");
  ASSERT_EQ(rc, 0) << (err.ok() ? *err : "");
  ASSERT_TRUE(out.ok());
  json list = json::parse(*out, nullptr, false);
  ASSERT_TRUE(list.is_object()) << *out;
  ASSERT_EQ(list["items"].size(), 1u) << *out;
  EXPECT_EQ(list["items"][0]["metadata"]["name"], "seen-by-kubectl");
  EXPECT_EQ(list["items"][0]["spec"]["suspend"], true);
  bool listed = false;
  for (const FakeApiServer::RequestRecord& r : fake_.Requests())
    listed = listed || (r.method == "GET" && r.path == "/apis/batch/v1/namespaces/team-k/jobs");
  EXPECT_TRUE(listed);
  ASSERT_TRUE(RemoveTree(dir).ok());
}

TEST(ClientTest, ConnectionErrorsAreRetriedThenReported) {
  std::string url;
  {
    FakeApiServer gone;
    ASSERT_TRUE(gone.Start().ok());
    url = gone.url();
  }
  ClusterConfig config;
  config.server = url;
  ClientOptions options;
  options.max_attempts = 3;
  options.initial_backoff_ms = 1;
  options.max_backoff_ms = 5;
  auto client = Client::Create(config, options);
  ASSERT_TRUE(client.ok());
  Status status = (*client)->Get("v1", "Pod", "ns", "p").status();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("gave up after 3 attempts"), std::string::npos)
      << status.message();
  EXPECT_EQ(Client::Create(ClusterConfig(), options).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(FakeTlsServerTest, UnauthorizedWithoutToken) {
  fake_.RequireToken("secret");
  Status refused = client_->Get("v1", "Pod", "ns", "p").status();
  EXPECT_EQ(refused.code(), StatusCode::kUnauthenticated) << refused.ToString();
  EXPECT_EQ(fake_.Requests().size(), 1u);  // not retried
  ClusterConfig config;
  config.token = "secret";
  std::unique_ptr<Client> authed = NewClient(config);
  EXPECT_EQ(authed->Get("v1", "Pod", "ns", "p").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LastRequest().authorization, "Bearer secret");
}

TEST_F(FakeServerTest, SubjectAccessReview) {
  fake_.Grant("alice", "create", "batch", "jobs", "team-a");
  Result<bool> alice = client_->CheckAccess("alice", {"devs"}, "create", "batch", "jobs", "team-a");
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  EXPECT_TRUE(*alice);
  EXPECT_EQ(LastRequest().path, "/apis/authorization.k8s.io/v1/subjectaccessreviews");
  Result<bool> bob = client_->CheckAccess("bob", {}, "create", "batch", "jobs", "team-a");
  ASSERT_TRUE(bob.ok());
  EXPECT_FALSE(*bob);
  Result<bool> elsewhere = client_->CheckAccess("alice", {}, "create", "batch", "jobs", "team-b");
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_FALSE(*elsewhere);
}

// An exec plugin that counts its runs and prints token "tok-N" expiring at $EXPIRY.
constexpr const char* kPlugin = R"(#!/bin/sh
[ -n "$KUBERNETES_EXEC_INFO" ] || exit 3
n=$(( $(cat "$1" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$1"
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-%s","expirationTimestamp":"%s"}}\n' "$n" "$EXPIRY"
)";

std::string PluginKubeconfig(const std::string& server, const std::string& count_file,
                             const std::string& expiry) {
  return fmt::format(R"(apiVersion: v1
kind: Config
current-context: c
contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
clusters: [{{name: k, cluster: {{server: "{}"}}}}]
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./plugin.sh
      args: ["{}"]
      env: [{{name: EXPIRY, value: "{}"}}]
)",
                     server, count_file, expiry);
}

int Count(const std::string& path) {
  Result<std::string> text = ReadFile(path);
  return text.ok() ? std::atoi(text->c_str()) : 0;
}

TEST_F(FakeTlsServerTest, ExecPluginIsCachedAndRerunOnUnauthorized) {
  std::string dir = MakeTempDir();
  Write(dir + "/plugin.sh", kPlugin, 0755);
  Write(dir + "/config", PluginKubeconfig(fake_.url(), dir + "/count", "2999-01-01T00:00:00Z"));
  Result<ClusterConfig> config = LoadKubeconfig(dir + "/config");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  config->ca_file = ca_file_;
  EXPECT_EQ(config->exec.command, dir + "/./plugin.sh");
  fake_.RequireToken("tok-1");
  auto client = Client::Create(*config);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->Get("v1", "Pod", "ns", "p").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*client)->Get("v1", "Pod", "ns", "p").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Count(dir + "/count"), 1);  // cached until it expires
  fake_.RequireToken("tok-2");          // the old token is revoked: 401, run again, retry
  EXPECT_EQ((*client)->Get("v1", "Pod", "ns", "p").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Count(dir + "/count"), 2);
  EXPECT_EQ(LastRequest().authorization, "Bearer tok-2");

  // An expired credential is not reused.
  fake_.RequireToken("");
  Write(dir + "/config", PluginKubeconfig(fake_.url(), dir + "/count", "2000-01-01T00:00:00Z"));
  Result<ClusterConfig> expiring = LoadKubeconfig(dir + "/config");
  ASSERT_TRUE(expiring.ok());
  auto short_lived = Client::Create(*expiring);
  ASSERT_TRUE(short_lived.ok());
  (void)(*short_lived)->Get("v1", "Pod", "ns", "p");
  (void)(*short_lived)->Get("v1", "Pod", "ns", "p");
  EXPECT_EQ(Count(dir + "/count"), 4);
  ASSERT_TRUE(RemoveTree(dir).ok());
}

TEST(ExecCredentialTest, TheKubeconfigsEnvReplacesInheritedVariables) {
  // The plugin sees the first TAU_TEST_PLUGIN_TOKEN of its environment, as Go's os.Getenv (and
  // most programs) read a duplicated variable: it must be the kubeconfig's.
  ASSERT_EQ(::setenv("TAU_TEST_PLUGIN_TOKEN", "inherited", 1), 0);
  ExecConfig exec;
  exec.command = "/bin/sh";
  exec.args = {"-c",
               "t=$(env | grep '^TAU_TEST_PLUGIN_TOKEN=' | head -n 1 | cut -d= -f2-); printf "
               "'{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":"
               "\"ExecCredential\",\"status\":{\"token\":\"%s\"}}' \"$t\""};
  exec.env = {{"TAU_TEST_PLUGIN_TOKEN", "from-kubeconfig"}};
  Result<ExecCredential> cred = RunExecPlugin(exec);
  ::unsetenv("TAU_TEST_PLUGIN_TOKEN");
  ASSERT_TRUE(cred.ok()) << cred.status().ToString();
  EXPECT_EQ(cred->token, "from-kubeconfig");
}

TEST(ExecCredentialTest, RejectsOutputWithoutCredentials) {
  ExecConfig exec;
  exec.command = "/bin/echo";
  exec.args = {"{\"kind\":\"ExecCredential\",\"status\":{}}"};
  ClusterConfig config;
  config.server = "https://127.0.0.1:1";
  config.exec = exec;
  auto client = Client::Create(config);
  ASSERT_TRUE(client.ok());
  Status status = (*client)->Get("v1", "Pod", "ns", "p").status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("neither status.token"), std::string::npos);
}

}  // namespace
}  // namespace tau::kubeapi
