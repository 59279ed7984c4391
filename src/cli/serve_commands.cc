// `tau serve deploy|list|status|logs|scale|update|rollback|delete`: services (docs/serving.md), a
// spec with `kind: service` kept running as replicas behind the server's endpoint /serve/NAME/.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/json_text.h"
#include "common/strings.h"

namespace tau::cli {
namespace {

std::string ReadyText(const api::Service& s) { return fmt::format("{}/{}", s.ready, s.replicas); }

void PrintService(const api::Service& s) {
  std::printf("Service:    %s (revision %lld, %s)\n", s.name.c_str(),
              static_cast<long long>(s.revision), s.state.c_str());
  std::printf("Workspace:  %s   Owner: %s\n", s.workspace.c_str(), s.owner.c_str());
  std::printf("Ready:      %s replicas   Restarts: %lld\n", ReadyText(s).c_str(),
              static_cast<long long>(s.restarts));
  if (s.extra.contains("rollout") && s.extra["rollout"].is_object())
    std::printf(
        "Rollout:    %s\n            the old replicas keep serving: `tau serve rollback %s` "
        "makes revision %lld current again, `tau serve update %s FILE` tries a fixed spec\n",
        s.extra["rollout"].value("message", "").c_str(), s.name.c_str(),
        static_cast<long long>(s.extra.value("previous_revision", int64_t{0})), s.name.c_str());
  if (s.extra.contains("failing") && s.extra["failing"].is_object())
    std::printf("Failing:    %s\n", s.extra["failing"].value("message", "").c_str());
  const nlohmann::json* cluster = s.extra.contains("cluster") ? &s.extra.at("cluster") : nullptr;
  if (cluster) {
    std::printf("Endpoint:   %s (in the cluster)\n", s.endpoint.c_str());
    std::printf("Cluster:    %s %s/%s: %lld desired, %lld ready, %lld updated%s\n",
                cluster->value("kind", "").c_str(), cluster->value("namespace", "").c_str(),
                cluster->value("name", "").c_str(),
                static_cast<long long>(cluster->value("desired", int64_t{0})),
                static_cast<long long>(cluster->value("ready", int64_t{0})),
                static_cast<long long>(cluster->value("updated", int64_t{0})),
                cluster->value("found", false) ? "" : " (not on the cluster)");
    if (std::string e = cluster->value("error", ""); !e.empty())
      std::printf("Error:      %s\n", e.c_str());
    if (std::string m = cluster->value("message", ""); !m.empty())
      std::printf("Status:     %s\n", m.c_str());
  } else {
    std::printf("Endpoint:   %s (on the server's Unix socket and TCP listener)\n",
                s.endpoint.c_str());
    if (s.extra.contains("isolation") && s.extra["isolation"].is_object()) {
      const nlohmann::json& iso = s.extra["isolation"];
      if (iso.value("ports", "") == "owner-only")
        std::printf("Isolation:  replica ports reachable only by the replicas' user and tau\n");
      else
        std::printf("Isolation:  none: any local user can connect to a replica's port (%s)\n",
                    iso.value("why", "").c_str());
    }
  }
  std::printf("Spec:       %s (config %.12s, code %.12s)\n", s.spec_file.c_str(),
              s.config_hash.c_str(), s.snapshot_digest.c_str());
  if (s.model.is_object()) {
    const std::string path = s.model.value("path", "");
    const std::string sha = s.model.value("sha256", "");
    std::printf("Model:      %s of run %s%s%s\n", s.model.value("kind", "").c_str(),
                s.model.value("run", "").c_str(),
                path.empty() ? " (resolved when the run ends)" : (": " + path).c_str(),
                sha.empty() ? "" : (" sha256 " + sha.substr(0, 12)).c_str());
  }
  if (s.requests.is_object())
    std::printf("Requests:   %lld (%lld failed, %lld retried on another replica)\n",
                static_cast<long long>(s.requests.value("total", int64_t{0})),
                static_cast<long long>(s.requests.value("failed", int64_t{0})),
                static_cast<long long>(s.requests.value("retried", int64_t{0})));
  std::vector<std::vector<std::string>> rows;
  for (const api::ServiceReplica& r : s.replica_list) {
    // A replica whose attempts end before they are ready: how the last one ended says why.
    std::string why = !r.probe.empty() ? r.probe : (r.reason.empty() ? "-" : r.reason);
    if (r.extra.contains("exit") && r.extra["exit"].is_string())
      why = r.extra["exit"].get<std::string>();
    rows.push_back({r.run, std::to_string(r.revision), std::to_string(r.port), r.state,
                    r.draining ? "draining" : (r.ready ? "yes" : "no"), std::to_string(r.restarts),
                    why});
  }
  if (!rows.empty()) {
    std::printf("\n");
    PrintTable({cluster ? "POD" : "REPLICA", "REVISION", "PORT", "STATE", "READY", "RESTARTS",
                cluster ? "REASON" : "LAST PROBE"},
               rows);
  }
  if (s.history.is_array() && !s.history.empty()) {
    std::printf("\nHistory (newest last):\n");
    size_t from = s.history.size() > 10 ? s.history.size() - 10 : 0;
    for (size_t i = from; i < s.history.size(); ++i)
      std::printf("  %s  %-16s %s\n", s.history[i].value("time", "").c_str(),
                  s.history[i].value("type", "").c_str(),
                  s.history[i].value("message", "").c_str());
  }
}

int Show(const api::Service& s, Format format) {
  if (IsData(format)) return PrintData(s.ToJson(), format);
  PrintService(s);
  return 0;
}

// `--wait`: follows the service until every replica of its current revision is ready (0), or the
// server halts the rollout, or says the replicas crash-loop with none older to fall back on
// (kExitInvalid, with the server's account: how the failing replica ended and its last log line).
// A line on stderr each time the ready count changes.
int WaitForRollout(client::Connection* conn, const std::string& name, int64_t revision) {
  std::string said;
  while (true) {
    auto s = client::TauApi(conn).GetService(name);
    if (!s.ok()) return Fail(s.status().message());
    if (s->revision != revision)
      return Fail(fmt::format("service {}: revision {} was replaced by revision {} while waiting",
                              name, revision, s->revision));
    int64_t ready = 0;
    for (const api::ServiceReplica& r : s->replica_list)
      if (r.revision == revision && r.ready && !r.draining) ++ready;
    std::string line =
        fmt::format("tau: service {} revision {}: ready {}/{}", name, revision, ready, s->replicas);
    if (line != said) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
      said = std::move(line);
    }
    for (const char* key : {"rollout", "failing"})
      if ((s->state == "RolloutHalted" || s->state == "Failing") && s->extra.contains(key) &&
          s->extra[key].is_object()) {
        std::fprintf(stderr, "tau: error: service %s: %s\n", name.c_str(),
                     s->extra[key].value("message", s->state).c_str());
        return kExitInvalid;
      }
    if (ready >= s->replicas) {
      std::fprintf(stderr, "tau: service %s revision %lld: rolled out, %lld/%lld ready\n",
                   name.c_str(), static_cast<long long>(revision), static_cast<long long>(ready),
                   static_cast<long long>(s->replicas));
      return 0;
    }
    ::usleep(250'000);
  }
}

int CmdDeploy(const Global& g, const RunOptions& o, const std::string& name,
              const std::string& from, const std::string& update, bool wait) {
  // The check serve.from gets in a spec (spec/fields.cc), before anything is sent.
  if (!from.empty() && !IsDns1123Label(from))
    return Fail(fmt::format(
        "--from {}: not a run's name (lowercase letters, digits and '-', as tau list shows them)",
        from));
  std::unique_ptr<client::Connection> conn;
  int rc = 0;
  auto spec = SubmissionBody(g, o, &conn, &rc);
  if (!spec) return rc;
  if (!spec->parsed.spec->serve)
    return Fail(
        fmt::format("{} is a run spec, not a service: add 'kind: service' and a serve section "
                    "(docs/serving.md), or run it with `tau run {}`",
                    spec->file, spec->file));
  nlohmann::json service = nlohmann::json::object();
  if (!name.empty()) service["name"] = name;
  if (!from.empty()) service["from"] = from;
  spec->body["service"] = service;
  client::TauApi tau(conn.get());
  auto made = update.empty() ? tau.DeployService(JsonText(spec->body))
                             : tau.UpdateService(update, JsonText(spec->body));
  if (!made.ok()) {
    // The run to serve was the flag's, not the file's: the refusal names the flag.
    const std::string& message = made.status().message();
    if (!from.empty() && StartsWith(message, "serve.from: ")) {
      std::fprintf(stderr, "--from %s: error: %s\n", from.c_str(), message.substr(12).c_str());
      return kExitTauError;
    }
    // The file's serve.from, or a --set of it: named at its line, or at the --set.
    if (StartsWith(message, "serve.from: ")) {
      std::fprintf(stderr, "%s\n", LocatedErrors(spec->file, spec->parsed, message).c_str());
      return kExitTauError;
    }
    return SubmissionFailed(*spec, made.status());
  }
  if (update.empty())
    std::printf("service %s deployed: %lld replica(s) starting; its endpoint is %s\n",
                made->name.c_str(), static_cast<long long>(made->replicas), made->endpoint.c_str());
  else
    std::printf("service %s: revision %lld rolling out one replica at a time\n", made->name.c_str(),
                static_cast<long long>(made->revision));
  if (!wait) {
    std::printf("follow it: tau serve status %s\n", made->name.c_str());
    return 0;
  }
  std::fflush(stdout);
  return WaitForRollout(conn.get(), made->name, made->revision);
}

int CmdList(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto list = client::TauApi(conn->get()).ListServices();
  if (!list.ok()) return Fail(list.status().message());
  if (IsData(format)) return PrintData(list->ToJson(), format);
  if (list->services.empty()) {
    std::puts("no services (tau serve deploy FILE deploys one)");
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const api::Service& s : list->services)
    rows.push_back({s.name, s.workspace, s.state, ReadyText(s), std::to_string(s.revision),
                    std::to_string(s.restarts), s.endpoint});
  PrintTable({"NAME", "WORKSPACE", "STATE", "READY", "REVISION", "RESTARTS", "ENDPOINT"}, rows);
  return 0;
}

int CmdServiceStatus(const Global& g, const std::string& name, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetService(name);
  if (!got.ok()) return Fail(got.status().message());
  return Show(*got, format);
}

// A change of a service, said in one line.
template <typename Call>
int Act(const Global& g, Call call, const std::string& done) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi tau(conn->get());
  auto got = call(tau);
  if (!got.ok()) return Fail(got.status().message());
  std::printf("service %s: %s\n", got->name.c_str(), done.c_str());
  return 0;
}

// A replica pod's log as the server keeps it (a service on Kubernetes); -f asks for more every
// half second until the pod is no longer the service's.
int PodLog(client::Connection* conn, const std::string& service, const std::string& pod,
           bool follow) {
  int64_t offset = 0;
  while (true) {
    auto got = conn->Call(
        "GET", fmt::format("/api/v1/services/{}/logs?replica={}&offset={}", service, pod, offset));
    if (!got.ok()) return Fail(got.status().message());
    if (got->status != 200) {
      if (offset > 0 && got->status == 404) return 0;  // the pod is gone: its log has ended
      auto error = nlohmann::json::parse(got->body, nullptr, false);
      return Fail(error.is_object() && error.contains("error")
                      ? error["error"].value("message", got->body)
                      : fmt::format("HTTP {}: {}", got->status, got->body));
    }
    std::fwrite(got->body.data(), 1, got->body.size(), stdout);
    std::fflush(stdout);
    offset += static_cast<int64_t>(got->body.size());
    if (!follow) {
      auto size = got->headers.find("x-log-size");
      if (size == got->headers.end() || std::to_string(offset) == size->second) return 0;
      continue;  // more than one chunk
    }
    if (got->body.empty()) ::usleep(500'000);
  }
}

// The log of one replica: the one asked for, else the first ready one, else the first.
int CmdLogs(const Global& g, const std::string& name, const std::string& replica, bool follow) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto s = client::TauApi(conn->get()).GetService(name);
  if (!s.ok()) return Fail(s.status().message());
  std::string run = replica;
  if (run.empty()) {
    for (const api::ServiceReplica& r : s->replica_list)
      if (r.ready && run.empty()) run = r.run;
    if (run.empty() && !s->replica_list.empty()) run = s->replica_list.front().run;
  }
  if (run.empty()) return Fail(fmt::format("service {} has no replica now", name));
  bool known = false;
  for (const api::ServiceReplica& r : s->replica_list) known = known || r.run == run;
  if (!known)
    return Fail(fmt::format("{} is not a replica of service {} now (tau serve status {})", run,
                            name, name));
  std::fprintf(stderr, "tau: replica %s\n", run.c_str());
  if (s->extra.contains("cluster")) return PodLog(conn->get(), name, run, follow);
  client::LogQuery query;
  query.follow = follow;
  std::unique_ptr<client::Connection> owned = std::move(*conn);
  auto streamed = FollowLog(g.server, &owned, run, query);
  if (!streamed.ok()) return Fail(streamed.status().message());
  return 0;
}

}  // namespace

void RegisterServeCommands(CLI::App* app, Context* ctx) {
  struct Args {
    RunOptions run;
    std::string name, from, replica;
    int64_t replicas = 0, to = 0;
    bool follow = false, wait = false;
  };
  auto a = std::make_shared<Args>();
  const Global& g = ctx->g;
  static constexpr const char* kWaitHelp =
      "Wait until every replica of the new revision is ready (exit 0) or the rollout halts (exit "
      "1, saying how the failing replica ended); ready N/M lines on stderr";
  auto* serve = app->add_subcommand(
      "serve", "Services: a server kept running as replicas behind an endpoint (docs/serving.md)");
  serve->require_subcommand(1);

  auto* deploy = serve->add_subcommand(
      "deploy", "Deploy a service spec (kind: service): its replicas start as runs of its queue");
  deploy->add_option("file", a->run.target, "The service's spec (or TARGET: tau/NAME.yaml)")
      ->required();
  deploy->add_option("--name", a->name, "The service's name (default: the spec's name)");
  deploy->add_option("--from", a->from,
                     "A trained run whose model the replicas serve ($TAU_SERVE_MODEL, read-only)");
  deploy->add_option("--code-dir", a->run.code_dir, "The code directory (default: the spec's)");
  AddSetOption(deploy, &a->run.set);
  deploy->add_flag("--wait", a->wait, kWaitHelp);
  deploy->callback([=, &g] { ctx->rc = CmdDeploy(g, a->run, a->name, a->from, "", a->wait); });

  auto* update = serve->add_subcommand(
      "update", "A new revision from a spec: replicas replaced one at a time, never fewer ready");
  update->add_option("name", a->name, "The service")->required();
  update->add_option("file", a->run.target, "The new spec")->required();
  update->add_option("--from", a->from, "Serve this run's model from now on");
  update->add_option("--code-dir", a->run.code_dir, "The code directory (default: the spec's)");
  AddSetOption(update, &a->run.set);
  update->add_flag("--wait", a->wait, kWaitHelp);
  update->callback([=, &g] { ctx->rc = CmdDeploy(g, a->run, "", a->from, a->name, a->wait); });

  auto* list = serve->add_subcommand("list", "The services you may see");
  auto list_format = AddOutput(list, ctx);
  list->callback([=, &g] {
    if (auto f = list_format()) ctx->rc = CmdList(g, *f);
  });

  auto* status = serve->add_subcommand(
      "status", "A service: its replicas (ready, restarts, probes), its model and its history");
  status->add_option("name", a->name, "The service")->required();
  auto status_format = AddOutput(status, ctx);
  status->callback([=, &g] {
    if (auto f = status_format()) ctx->rc = CmdServiceStatus(g, a->name, *f);
  });

  auto* scale = serve->add_subcommand(
      "scale", "Set the number of replicas (0 to 64); extra ones are drained before they stop");
  scale->add_option("name", a->name, "The service")->required();
  scale->add_option("replicas", a->replicas, "How many")->required();
  scale->callback([=, &g] {
    ctx->rc = Act(
        g, [&](client::TauApi& t) { return t.ScaleService(a->name, a->replicas); },
        "scaled to " + std::to_string(a->replicas) + " replicas");
  });

  auto* rollback = serve->add_subcommand(
      "rollback", "Make the previous (or a kept) revision current again, rolled as an update is");
  rollback->add_option("name", a->name, "The service")->required();
  auto* to = rollback->add_option("--to", a->to,
                                  "The revision (tau serve status NAME -o json lists those kept)");
  rollback->callback([=, &g] {
    if (to->count() > 0 && a->to < 1) {
      ctx->rc = Fail(fmt::format(
          "--to: {} is not a revision; revisions are numbered from 1 (tau serve status {} -o "
          "json lists those kept)",
          a->to, a->name));
      return;
    }
    auto conn = ConnectToServer(g.server);
    if (!conn.ok()) {
      ctx->rc = Fail(conn.status().message());
      return;
    }
    auto got = client::TauApi(conn->get()).RollbackService(a->name, a->to);
    if (!got.ok()) {
      ctx->rc = Fail(got.status().message());
      return;
    }
    std::printf("service %s: revision %lld is current again, rolling out one replica at a time\n",
                got->name.c_str(), static_cast<long long>(got->revision));
    std::printf("follow it: tau serve status %s\n", got->name.c_str());
    ctx->rc = 0;
  });

  auto* del = serve->add_subcommand("delete", "Drain and stop every replica, then remove it");
  del->add_option("name", a->name, "The service")->required();
  del->callback([=, &g] {
    ctx->rc = Act(
        g, [&](client::TauApi& t) { return t.DeleteService(a->name); },
        "deleting: its replicas are drained, then stopped");
  });

  auto* logs = serve->add_subcommand("logs", "A replica's log (the first ready one by default)");
  logs->add_option("name", a->name, "The service")->required();
  logs->add_option("--replica", a->replica, "The replica's run (tau serve status lists them)");
  logs->add_flag("-f,--follow", a->follow, "Keep following it");
  logs->callback([=, &g] { ctx->rc = CmdLogs(g, a->name, a->replica, a->follow); });
}

}  // namespace tau::cli
