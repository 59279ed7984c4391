// What the tests of the controller and of its backends share: a temporary TAU_HOME with a real
// store in it, a controller made from options the test fills in, submissions, and reads of what
// the store holds of a run. Header-only, for test binaries that link the controller.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/code_file.h"
#include "controller/controller.h"
#include "store/store.h"

namespace tau::testutil {

class ControllerFixture : public ::testing::Test {
 protected:
  // A fresh home and store; the subclass's SetUp then calls StartController.
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tau-controller-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    home_ = pattern;
    OpenStore();
  }
  void TearDown() override {
    StopController();
    store_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(home_, ignored);
  }

  void OpenStore() {
    auto store = store::Store::Open(home_ + "/tau.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  // Options for this home: the store's file, the platform file beside it. The test adds its
  // backend (required) and anything else.
  server::ControllerOptions Options() const {
    server::ControllerOptions options;
    options.home = home_;
    options.platform_file = home_ + "/platform.yaml";
    return options;
  }
  void StartController(const server::ControllerOptions& options) {
    controller_ =
        std::make_unique<server::Controller>(options, store_.get(), health::GpuInventory{});
    Status s = controller_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Stops the controller (its backend stops with it); the store stays open.
  virtual void StopController() {
    if (controller_) controller_->Stop();
    controller_.reset();
  }

  // Submits `spec_yaml` as alice with `code` (train.py printing "hi" when empty); "" when refused.
  std::string SubmitYaml(const std::string& spec_yaml, std::vector<CodeFile> code = {}) {
    if (code.empty()) code.push_back({"train.py", 0644, "print('hi')\n"});
    server::SubmitRequest request;
    request.spec_file = "tau.yaml";
    request.spec_yaml = spec_yaml;
    request.code = std::move(code);
    request.caller.user = "alice";
    server::SubmitError error;
    auto r = controller_->Submit(std::move(request), &error);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->run.name : "";
  }

  store::RunRecord Run(const std::string& name) {
    auto r = store_->GetRun(name);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : store::RunRecord{};
  }
  std::vector<store::Event> Events(const std::string& name) {
    auto events = store_->ListEvents(name);
    EXPECT_TRUE(events.ok());
    return events.ok() ? *events : std::vector<store::Event>{};
  }
  std::vector<std::string> EventTypes(const std::string& name) {
    std::vector<std::string> types;
    for (const store::Event& e : Events(name)) types.push_back(e.type);
    return types;
  }
  std::vector<store::AttemptRecord> Attempts(const std::string& name) {
    auto a = store_->ListAttempts(name);
    EXPECT_TRUE(a.ok());
    return a.ok() ? *a : std::vector<store::AttemptRecord>{};
  }

  std::string home_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<server::Controller> controller_;
};

}  // namespace tau::testutil
