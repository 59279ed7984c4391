#include "engines/engines.h"

#include <set>

#include <gtest/gtest.h>

namespace tau::engines {
namespace {

TEST(Engines, NamesAreTheRegisteredOnesOnceEach) {
  const std::vector<std::string> names = Names();
  EXPECT_EQ(names, (std::vector<std::string>{"local", "kubernetes"}));
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  for (const server::Engine& e : Registered()) {
    EXPECT_FALSE(e.description.empty()) << e.name;
    EXPECT_TRUE(e.make) << e.name;
  }
}

TEST(Engines, NoNameIsTheFirstRegistered) {
  auto found = Find("");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)->name, Registered().front().name);
}

TEST(Engines, UnknownNameListsTheRegisteredEngines) {
  auto found = Find("nosuch");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kNotFound);
  const std::string& message = found.status().message();
  EXPECT_NE(message.find("unknown backend 'nosuch'"), std::string::npos) << message;
  for (const server::Engine& e : Registered())
    EXPECT_NE(message.find(e.name + " (" + e.description + ")"), std::string::npos) << message;
}

TEST(Engines, LocalFactoryMakesABackendOfItsNameAndCapabilities) {
  auto local = Find("local");
  ASSERT_TRUE(local.ok());
  server::EngineInputs in;
  in.home = ::testing::TempDir();
  in.cpu_milli = 1000;
  in.memory_bytes = int64_t{1} << 30;
  auto made = (*local)->make(in);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_NE(made->backend, nullptr);
  EXPECT_EQ(std::string(made->backend->Name()), "local");
  EXPECT_TRUE(made->backend->Caps().files_on_server);
  EXPECT_TRUE(made->backend->Caps().processes_here);
  EXPECT_EQ(made->backend->services(), nullptr);  // replicas are runs
  EXPECT_FALSE(made->default_platform_size.has_value());
}

TEST(Engines, KubernetesFactoryNamesItsEngineInItsErrors) {
  auto kube = Find("kubernetes");
  ASSERT_TRUE(kube.ok());
  EXPECT_TRUE((*kube)->caps.own_secrets);
  EXPECT_FALSE((*kube)->caps.files_on_server);
  // Its options are what `tau server` offers for it.
  std::set<std::string> options;
  for (const server::EngineOption& o : (*kube)->options) options.insert(o.name);
  EXPECT_EQ(options, (std::set<std::string>{"kubeconfig", "context", "default-image",
                                            "kube-check-access", "kube-installation"}));
  server::EngineInputs in;
  in.home = ::testing::TempDir();
  in.options["kubeconfig"] = ::testing::TempDir() + "/no-such-kubeconfig";
  auto made = (*kube)->make(in);
  EXPECT_FALSE(made.ok());
  // A bad installation name is refused by the option's check.
  for (const server::EngineOption& o : (*kube)->options)
    if (o.name == "kube-installation") {
      ASSERT_TRUE(o.check);
      EXPECT_EQ(o.check("tau-prod"), "");
      EXPECT_NE(o.check("not a label!"), "");
    }
}

}  // namespace
}  // namespace tau::engines
