#include "cli/commands.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include <fmt/format.h>

#include "admission/simulate.h"
#include "cli/cli.h"
#include "cli/connect.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/layout.h"
#include "common/strings.h"
#include "health/health.h"
#include "policy/policy.h"
#include "server/server.h"
#include "spec/spec.h"

namespace tau::cli {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tau: error: %s\n", message.c_str());
  return kExitTauError;
}

bool IsRunName(const std::string& name) { return IsDns1123Label(name, 253); }

int NoSuchRun(const std::string& name) {
  return Fail(
      fmt::format("no run named '{}' (run names are lowercase letters, digits and '-'; "
                  "`tau list --all` lists them)",
                  Printable(name)));
}

int CmdVersion(const Global& g, bool with_server) {
  std::printf("tau %s\n", server::Version());
  if (!with_server) return 0;
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto v = CallJson(**conn, "GET", "/api/v1/version");
  if (!v.ok()) return Fail(v.status().message());
  std::printf("server %s (api %s, backend %s)\n", v->value("version", "?").c_str(),
              v->value("api", "?").c_str(), v->value("backend", "?").c_str());
  return 0;
}

// Checks each file with `check`, which returns the errors (one per line) or "" and fills `summary`.
static int ValidateFiles(
    const std::vector<std::string>& files, bool quiet, size_t max_bytes, const char* what,
    const std::function<std::string(const std::string& text, const std::string& file,
                                    std::string* summary)>& check) {
  int rc = 0;
  for (const std::string& file : files) {
    auto text = ReadFileAtMost(file, max_bytes, what);
    std::string summary;
    std::string errors;
    if (text.ok()) {
      errors = check(*text, file, &summary);
    } else {
      // "FILE: error: the file is over ..." rather than naming the file twice.
      const std::string& m = text.status().message();
      errors = file + ": error: " +
               (m.rfind(file + " ", 0) == 0 ? "the file " + m.substr(file.size() + 1) : m);
    }
    if (!errors.empty()) {
      std::fprintf(stderr, "%s\n", errors.c_str());
      rc = kExitInvalid;
    } else if (!quiet) {
      std::printf("%s: ok (%s)\n", file.c_str(), summary.c_str());
    }
  }
  return rc;
}

int CmdValidate(const std::vector<std::string>& files, bool quiet) {
  return ValidateFiles(files, quiet, spec::kMaxSpecBytes, "a spec",
                       [](const std::string& text, const std::string& file, std::string* summary) {
                         spec::ParseOutcome parsed = spec::ParseSpec(text, file);
                         if (!parsed.ok()) return parsed.ErrorText();
                         *summary = fmt::format(
                             "{} shape, {} '{}'", spec::ShapeName(parsed.spec->shape),
                             spec::WorkloadKindName(parsed.spec->kind), parsed.spec->name);
                         return std::string();
                       });
}

int CmdSchema(Format format) {
  if (format == Format::kYaml)
    PrintYaml(spec::JsonSchema());
  else
    PrintJson(spec::JsonSchema());
  return 0;
}

static void PrintRuns(const nlohmann::json& runs) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : runs) {
    std::string state = r.value("state", "");
    if (state == "Failed" || state == "Cancelled") {
      std::string reason = r.value("reason", "");
      if (!reason.empty() && reason != state) state += " (" + reason + ")";
    }
    rows.push_back({r.value("name", ""), state, Cell(r["exit_code"]),
                    std::to_string(r.value("attempts", 0)), r.value("queue", ""),
                    std::to_string(r["resources"].value("gpus", 0)), Age(r["created"])});
  }
  PrintTable({"NAME", "STATE", "EXIT", "ATTEMPTS", "QUEUE", "GPUS", "CREATED"}, rows);
}

int CmdList(const Global& g, const std::string& state, bool all, int limit, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  std::string path = fmt::format("/api/v1/runs?limit={}", limit);
  if (!state.empty())
    path += "&state=" + state;
  else if (!all)
    path += "&active=1";
  auto list = CallJson(**conn, "GET", path);
  if (!list.ok()) return Fail(list.status().message());
  if (format == Format::kJson)
    PrintJson(*list);
  else if (format == Format::kYaml)
    PrintYaml(*list);
  else {
    PrintRuns((*list)["runs"]);
    int64_t total = list->value("total", 0);
    int64_t shown = static_cast<int64_t>((*list)["runs"].size());
    if (total > shown)
      std::fprintf(stderr, "(%lld of %lld shown; use --limit)\n", static_cast<long long>(shown),
                   static_cast<long long>(total));
    if (total == 0 && !all && state.empty())
      std::fprintf(stderr, "no active runs (tau list --all shows finished ones)\n");
  }
  return 0;
}

int CmdStatus(const Global& g, const std::string& name, Format format) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = CallJson(**conn, "GET", "/api/v1/runs/" + name);
  if (!got.ok()) return Fail(got.status().message());
  nlohmann::json run = (*got)["run"];
  run.erase("spec");
  if (format == Format::kJson)
    PrintJson(run);
  else if (format == Format::kYaml)
    PrintYaml(run);
  else {
    PrintRuns(nlohmann::json::array({run}));
    if (run.contains("pending") && run["pending"].is_object()) {
      const auto& p = run["pending"];
      std::printf("\npending: %s%s\n",
                  p.contains("position") && p["position"].is_number()
                      ? fmt::format("position {} in queue {}; ", p["position"].get<int>(),
                                    run.value("queue", ""))
                            .c_str()
                      : "",
                  p.value("reason", "").c_str());
    } else if (!run.value("message", "").empty()) {
      std::printf("\n%s\n", run.value("message", "").c_str());
    }
  }
  return 0;
}

int CmdDescribe(const Global& g, const std::string& name, Format format) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = CallJson(**conn, "GET", "/api/v1/runs/" + name);
  if (!got.ok()) return Fail(got.status().message());
  if (format == Format::kJson) {
    PrintJson(*got);
    return 0;
  }
  if (format == Format::kYaml) {
    PrintYaml(*got);
    return 0;
  }
  const auto& run = (*got)["run"];
  std::printf("Name:        %s\n", run.value("name", "").c_str());
  std::printf("State:       %s\n", run.value("state", "").c_str());
  if (!run.value("reason", "").empty())
    std::printf("Reason:      %s\n", run.value("reason", "").c_str());
  if (!run.value("message", "").empty())
    std::printf("Message:     %s\n", run.value("message", "").c_str());
  if (run["exit_code"].is_number()) std::printf("Exit code:   %d\n", run["exit_code"].get<int>());
  if (run["signal"].is_number()) std::printf("Signal:      %d\n", run["signal"].get<int>());
  std::printf("Spec:        %s (%s)\n", run.value("spec_file", "").c_str(),
              run.value("spec_name", "").c_str());
  std::printf("Kind:        %s\n", run["spec"].value("kind", "").c_str());
  std::printf("Queue:       %s (workspace %s)\n", run.value("queue", "").c_str(),
              run.value("workspace", "").c_str());
  std::printf("Resources:   %s\n", JsonText(run["resources"]).c_str());
  std::printf("Config hash: %s\n", run.value("config_hash", "").c_str());
  std::printf("Code:        sha256 %s\n", run.value("snapshot_digest", "").c_str());
  const auto& spec = run["spec"];
  if (spec.contains("runtime") && spec["runtime"].value("image", "") != "")
    std::printf("Image:       %s%s\n", spec["runtime"].value("image", "").c_str(),
                run.value("backend", "local") == "local"
                    ? " (recorded; not used by the local backend)"
                    : "");
  if (run.contains("pending") && run["pending"].is_object())
    std::printf("Pending:     %s\n", run["pending"].value("reason", "").c_str());
  std::printf("\nLifecycle:\n");
  for (const auto& e : (*got)["events"])
    std::printf("  %-24s  %-16s %s\n", e.value("time", "").c_str(), e.value("type", "").c_str(),
                e.value("message", "").c_str());
  if (!(*got)["attempts"].empty()) {
    std::printf("\nAttempts:\n");
    std::vector<std::vector<std::string>> rows;
    for (const auto& a : (*got)["attempts"])
      rows.push_back({"  " + std::to_string(a.value("number", 0)), a.value("state", ""),
                      Cell(a["reason"]), Cell(a["exit_code"]), Cell(a["signal"]), Cell(a["gpus"]),
                      a.value("started", ""), Cell(a["message"])});
    PrintTable({"  #", "STATE", "CLASS", "EXIT", "SIGNAL", "GPUS", "STARTED", "MESSAGE"}, rows);
    for (const auto& a : (*got)["attempts"]) {
      const auto& d = a["diagnosis"];
      if (!d.is_object() || d.empty()) continue;
      std::printf("\nDiagnosis of attempt %d: %s\n", a.value("number", 0),
                  d.value("phase", "").c_str());
      if (!d.value("summary", "").empty()) std::printf("  %s\n", d.value("summary", "").c_str());
      for (const auto& e : d["evidence"])
        std::printf("  rank %d  %-16s %s\n", e.value("rank", 0), e.value("signature", "").c_str(),
                    e.value("line", "").c_str());
    }
  }
  return 0;
}

int CmdLogs(const Global& g, const std::string& name, bool follow, int attempt, int rank) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  // Check the run first so a typo gets a clear answer rather than an empty stream.
  auto got = CallJson(**conn, "GET", "/api/v1/runs/" + name);
  if (!got.ok()) return Fail(got.status().message());
  const nlohmann::json& run = (*got)["run"];
  const int attempts = run.value("attempts", 0);
  if (attempt > 0 && attempt > std::max(attempts, 1))
    return Fail(fmt::format("run {} has {} attempt(s); --attempt takes 1 to {}", name, attempts,
                            std::max(attempts, 1)));
  int workers = 1;
  if (run.contains("resources") && run["resources"].is_object())
    workers = std::max(1, run["resources"].value("workers", 1));
  if (rank >= workers)
    return Fail(
        fmt::format("run {} has {} worker(s); --rank takes 0 to {}", name, workers, workers - 1));
  std::string path = fmt::format("/api/v1/runs/{}/logs?rank={}", name, rank);
  if (attempt > 0) path += fmt::format("&attempt={}", attempt);
  if (follow) path += "&follow=1";
  auto status = follow ? FollowLog(g.server, &*conn, name, path)
                       : (*conn)->Stream("GET", path, [&](std::string_view data) {
                           std::fwrite(data.data(), 1, data.size(), stdout);
                           std::fflush(stdout);
                           return true;
                         });
  if (!status.ok()) return Fail(status.status().message());
  if (*status != 200)
    return Fail(fmt::format("the server refused the log request (HTTP {})", *status));
  return 0;
}

int CmdCancel(const Global& g, const std::vector<std::string>& runs) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  int rc = 0;
  for (const std::string& name : runs) {
    if (!IsRunName(name)) {
      rc = NoSuchRun(name);
      continue;
    }
    auto r = CallJson(**conn, "POST", "/api/v1/runs/" + name + "/cancel");
    if (!r.ok()) {
      std::fprintf(stderr, "tau: error: %s\n", r.status().message().c_str());
      rc = kExitInvalid;
    } else {
      std::printf("cancelling %s\n", name.c_str());
    }
  }
  return rc;
}

int CmdRerun(const Global& g, const std::string& name) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto r = CallJson(**conn, "POST", "/api/v1/runs/" + name + "/rerun");
  if (!r.ok()) return Fail(r.status().message());
  if (r->contains("warning"))
    std::fprintf(stderr, "tau: warning: %s\n", (*r)["warning"].get<std::string>().c_str());
  std::puts((*r)["run"].value("name", "").c_str());
  return 0;
}

int CmdResume(const Global& g, const std::string& name, const std::string& from, bool force) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  nlohmann::json body = {{"force", force}};
  if (!from.empty()) body["from"] = from;
  auto r = CallJson(**conn, "POST", "/api/v1/runs/" + name + "/resume", JsonText(body));
  if (!r.ok()) return Fail(r.status().message());
  std::printf("resuming %s\n", name.c_str());
  return 0;
}

int CmdGpus(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto inv = CallJson(**conn, "GET", "/api/v1/gpus");
  if (!inv.ok()) return Fail(inv.status().message());
  if (format == Format::kJson)
    PrintJson(*inv);
  else if (format == Format::kYaml)
    PrintYaml(*inv);
  else if ((*inv)["devices"].empty())
    std::printf("no GPUs: %s\n", inv->value("note", "").c_str());
  else {
    std::vector<std::vector<std::string>> rows;
    for (const auto& d : (*inv)["devices"]) {
      std::string health = "-", why;
      if (d.contains("health") && d["health"].is_object()) {
        health = d["health"].value("verdict", "-");
        if (!d["health"]["reasons"].empty()) why = d["health"]["reasons"][0].value("message", "");
      }
      rows.push_back({std::to_string(d.value("index", 0)), d.value("name", ""), d.value("uuid", ""),
                      fmt::format("{} GiB", d.value("memory_total_bytes", uint64_t{0}) >> 30),
                      health, why});
    }
    PrintTable({"INDEX", "NAME", "UUID", "MEMORY", "HEALTH", "WHY"}, rows);
  }
  return 0;
}

int CmdHealthCheck(const Global& g, bool active, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got =
      CallJson(**conn, "POST", std::string("/api/v1/health/check") + (active ? "?active=1" : ""));
  if (!got.ok()) return Fail(got.status().message());
  bool healthy = true;
  for (const auto& v : (*got)["gpus"]) healthy = healthy && v.value("placeable", false);
  if (active && (*got)["active"].value("ran", false))
    for (const auto& p : (*got)["active"]["gpus"]) healthy = healthy && p.value("passed", false);
  if (format == Format::kJson) {
    PrintJson(*got);
  } else if (format == Format::kYaml) {
    PrintYaml(*got);
  } else {
    if ((*got)["gpus"].empty())
      std::printf("no GPUs: %s\n", (*got)["inventory"].value("note", "").c_str());
    std::vector<std::vector<std::string>> rows;
    for (const auto& v : (*got)["gpus"]) {
      std::string why;
      for (const auto& r : v["reasons"]) why += (why.empty() ? "" : "; ") + r.value("message", "");
      rows.push_back({std::to_string(v.value("gpu", 0)), v.value("verdict", ""),
                      v.value("since", ""), why.empty() ? "-" : why});
    }
    if (!rows.empty()) PrintTable({"GPU", "VERDICT", "SINCE", "REASONS"}, rows);
    if (active) {
      const auto& a = (*got)["active"];
      if (!a.value("ran", false))
        std::printf("%s\n", a.value("note", "active probe did not run").c_str());
      for (const auto& p : a["gpus"])
        std::printf("active probe, CUDA device %d (%s): %s in %.0f ms\n",
                    p.value("cuda_ordinal", 0), p.value("name", "").c_str(),
                    p.value("passed", false) ? "passed" : p.value("error", "failed").c_str(),
                    p.value("ms", 0.0));
    }
  }
  return healthy ? 0 : kExitInvalid;
}

int CmdAdmissionSimulate(const std::string& file, int cycles, Format format) {
  auto text = ReadFile(file);
  if (!text.ok()) return Fail(text.status().message());
  std::vector<admission::Diagnostic> diagnostics;
  auto result = admission::Simulate(*text, file, cycles, &diagnostics);
  if (!result.ok()) {
    if (diagnostics.empty()) return Fail(result.status().message());
    for (const auto& d : diagnostics) std::fprintf(stderr, "%s\n", d.ToString().c_str());
    return kExitInvalid;
  }
  if (format == Format::kYaml)
    PrintYaml(*result);
  else
    PrintJson(*result);
  return 0;
}

int CmdPlatformValidate(const std::vector<std::string>& files, bool quiet) {
  return ValidateFiles(files, quiet, policy::kMaxPlatformBytes, "a platform file",
                       [](const std::string& text, const std::string& file, std::string* summary) {
                         policy::PlatformOutcome parsed = policy::ParsePlatform(text, file);
                         if (!parsed.ok()) return parsed.ErrorText();
                         *summary =
                             fmt::format("{} queue(s), {} workspace(s), {} priority class(es)",
                                         parsed.platform->admission.queues.size(),
                                         parsed.platform->workspaces.size(),
                                         parsed.platform->priorities.size());
                         return std::string();
                       });
}

int CmdExplain(const std::string& spec_file, std::string platform_file, const std::string& user,
               Format format) {
  auto text = ReadFileAtMost(spec_file, spec::kMaxSpecBytes, "a spec");
  if (!text.ok()) return Fail(text.status().message());
  spec::ParseOutcome spec = spec::ParseSpec(*text, spec_file);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.ErrorText().c_str());
    return kExitInvalid;
  }
  policy::Platform platform;
  std::string applied = layout::PlatformFile(TauHome());
  if (platform_file.empty() && PathExists(applied)) {
    // The platform the local server uses (`tau platform apply` wrote it there).
    platform_file = applied;
  }
  if (platform_file.empty()) {
    // Without a platform file: the default a local server uses, sized to this machine.
    health::GpuInventory gpus = health::DiscoverGpus();
    int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
    platform = policy::DefaultPlatform(static_cast<int>(gpus.devices.size()),
                                       ::sysconf(_SC_NPROCESSORS_ONLN) * 1000, memory);
  } else {
    auto ptext = ReadFile(platform_file);
    if (!ptext.ok()) return Fail(ptext.status().message());
    policy::PlatformOutcome parsed = policy::ParsePlatform(*ptext, platform_file);
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
      return kExitInvalid;
    }
    platform = std::move(*parsed.platform);
  }
  std::string who = user;
  if (who.empty()) {
    if (const struct passwd* pw = ::getpwuid(::getuid())) who = pw->pw_name;
  }
  auto resolved = policy::Resolve(*spec.spec, platform, who);
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", spec_file.c_str(), resolved.status().message().c_str());
    return kExitInvalid;
  }
  if (format == Format::kTable) {
    std::fputs(policy::ExplainText(*resolved).c_str(), stdout);
    return 0;
  }
  nlohmann::json prov = nlohmann::json::array();
  for (const auto& p : resolved->provenance)
    prov.push_back({{"field", p.field}, {"value", p.value}, {"source", p.source}});
  nlohmann::json out = {{"provenance", prov}};
  if (format == Format::kYaml)
    PrintYaml(out);
  else
    PrintJson(out);
  return 0;
}

}  // namespace tau::cli
