#include "cli/commands.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include <fmt/format.h>

#include "admission/simulate.h"
#include "cli/cli.h"
#include "cli/connect.h"
#include "client/tau_api.h"
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
  auto v = client::TauApi(conn->get()).Version();
  if (!v.ok()) return Fail(v.status().message());
  std::printf("server %s (api %s, backend %s)\n", v->version.c_str(), v->api.c_str(),
              v->backend.c_str());
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

static void PrintRuns(const std::vector<api::Run>& runs) {
  std::vector<std::vector<std::string>> rows;
  for (const api::Run& r : runs) {
    std::string state = r.state;
    if ((state == "Failed" || state == "Cancelled") && !r.reason.empty() && r.reason != state)
      state += " (" + r.reason + ")";
    rows.push_back({r.name, state, Cell(r.exit_code), std::to_string(r.attempts), r.queue,
                    std::to_string(r.Gpus()), Age(r.created)});
  }
  PrintTable({"NAME", "STATE", "EXIT", "ATTEMPTS", "QUEUE", "GPUS", "CREATED"}, rows);
}

int CmdList(const Global& g, const std::string& state, bool all, int limit, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::RunQuery query;
  query.limit = limit;
  query.state = state;
  query.active = !all;
  auto list = client::TauApi(conn->get()).ListRuns(query);
  if (!list.ok()) return Fail(list.status().message());
  if (format == Format::kJson)
    PrintJson(list->ToJson());
  else if (format == Format::kYaml)
    PrintYaml(list->ToJson());
  else {
    PrintRuns(list->runs);
    int64_t total = list->total;
    int64_t shown = static_cast<int64_t>(list->runs.size());
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
  auto got = client::TauApi(conn->get()).GetRun(name);
  if (!got.ok()) return Fail(got.status().message());
  api::Run run = std::move(got->run);
  run.spec.reset();
  if (format == Format::kJson)
    PrintJson(run.ToJson());
  else if (format == Format::kYaml)
    PrintYaml(run.ToJson());
  else {
    PrintRuns({run});
    if (run.pending) {
      const api::Pending& p = *run.pending;
      std::printf("\npending: %s%s\n",
                  p.position
                      ? fmt::format("position {} in queue {}; ", *p.position, run.queue).c_str()
                      : "",
                  p.reason.c_str());
    } else if (!run.message.empty()) {
      std::printf("\n%s\n", run.message.c_str());
    }
  }
  return 0;
}

int CmdDescribe(const Global& g, const std::string& name, Format format) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetRun(name);
  if (!got.ok()) return Fail(got.status().message());
  if (format == Format::kJson) {
    PrintJson(got->ToJson());
    return 0;
  }
  if (format == Format::kYaml) {
    PrintYaml(got->ToJson());
    return 0;
  }
  const api::Run& run = got->run;
  std::printf("Name:        %s\n", run.name.c_str());
  std::printf("State:       %s\n", run.state.c_str());
  if (!run.reason.empty()) std::printf("Reason:      %s\n", run.reason.c_str());
  if (!run.message.empty()) std::printf("Message:     %s\n", run.message.c_str());
  if (run.exit_code) std::printf("Exit code:   %d\n", *run.exit_code);
  if (run.signal) std::printf("Signal:      %d\n", *run.signal);
  std::printf("Spec:        %s (%s)\n", run.spec_file.c_str(), run.spec_name.c_str());
  std::printf("Kind:        %s\n", run.kind.c_str());
  std::printf("Queue:       %s (workspace %s)\n", run.queue.c_str(), run.workspace.c_str());
  std::printf("Resources:   %s\n", JsonText(run.resources).c_str());
  std::printf("Config hash: %s\n", run.config_hash.c_str());
  std::printf("Code:        sha256 %s\n", run.snapshot_digest.c_str());
  if (!run.Image().empty())
    std::printf("Image:       %s%s\n", run.Image().c_str(),
                run.backend == "local" ? " (recorded; not used by the local backend)" : "");
  if (run.pending) std::printf("Pending:     %s\n", run.pending->reason.c_str());
  std::printf("\nLifecycle:\n");
  for (const api::Event& e : got->events)
    std::printf("  %-24s  %-16s %s\n", e.time.c_str(), e.type.c_str(), e.message.c_str());
  if (!got->attempts.empty()) {
    std::printf("\nAttempts:\n");
    std::vector<std::vector<std::string>> rows;
    for (const api::Attempt& a : got->attempts)
      rows.push_back({"  " + std::to_string(a.number), a.state, Cell(a.reason), Cell(a.exit_code),
                      Cell(a.signal), Cell(nlohmann::json(a.gpus)), a.started, Cell(a.message)});
    PrintTable({"  #", "STATE", "CLASS", "EXIT", "SIGNAL", "GPUS", "STARTED", "MESSAGE"}, rows);
    for (const api::Attempt& a : got->attempts) {
      if (!a.diagnosis) continue;
      const api::Diagnosis& d = *a.diagnosis;
      std::printf("\nDiagnosis of attempt %d: %s\n", a.number, d.phase.c_str());
      if (!d.summary.empty()) std::printf("  %s\n", d.summary.c_str());
      for (const api::DiagnosisEvidence& e : d.evidence)
        std::printf("  rank %d  %-16s %s\n", e.rank, e.signature.c_str(), e.line.c_str());
    }
  }
  return 0;
}

int CmdLogs(const Global& g, const std::string& name, bool follow, int attempt, int rank) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  // Check the run first so a typo gets a clear answer rather than an empty stream.
  auto got = client::TauApi(conn->get()).GetRun(name);
  if (!got.ok()) return Fail(got.status().message());
  const api::Run& run = got->run;
  const int attempts = run.attempts;
  if (attempt > 0 && attempt > std::max(attempts, 1))
    return Fail(fmt::format("run {} has {} attempt(s); --attempt takes 1 to {}", name, attempts,
                            std::max(attempts, 1)));
  int workers = std::max(1, run.Workers());
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
    Status r = client::TauApi(conn->get()).Cancel(name);
    if (!r.ok()) {
      std::fprintf(stderr, "tau: error: %s\n", r.message().c_str());
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
  auto r = client::TauApi(conn->get()).Rerun(name);
  if (!r.ok()) return Fail(r.status().message());
  if (r->warning) std::fprintf(stderr, "tau: warning: %s\n", r->warning->c_str());
  std::puts(r->run.name.c_str());
  return 0;
}

int CmdResume(const Global& g, const std::string& name, const std::string& from, bool force) {
  if (!IsRunName(name)) return NoSuchRun(name);
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  Status r = client::TauApi(conn->get()).Resume(name, from, force);
  if (!r.ok()) return Fail(r.message());
  std::printf("resuming %s\n", name.c_str());
  return 0;
}

int CmdGpus(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetGpus();
  if (!got.ok()) return Fail(got.status().message());
  const api::GpuInventory& inv = got->inventory;
  if (format == Format::kJson)
    PrintJson(got->ToJson());
  else if (format == Format::kYaml)
    PrintYaml(got->ToJson());
  else if (inv.devices.empty())
    std::printf("no GPUs: %s\n", inv.note.c_str());
  else {
    std::vector<std::vector<std::string>> rows;
    for (const api::GpuDevice& d : inv.devices) {
      std::string health = "-", why;
      if (d.health) {
        health = d.health->verdict;
        if (!d.health->reasons.empty()) why = d.health->reasons[0].message;
      }
      rows.push_back({std::to_string(d.index), d.name, d.uuid,
                      fmt::format("{} GiB", d.memory_total_bytes >> 30), health, why});
    }
    PrintTable({"INDEX", "NAME", "UUID", "MEMORY", "HEALTH", "WHY"}, rows);
  }
  return 0;
}

int CmdHealthCheck(const Global& g, bool active, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).CheckHealth(active);
  if (!got.ok()) return Fail(got.status().message());
  bool healthy = true;
  for (const api::GpuHealth& v : got->gpus) healthy = healthy && v.placeable;
  const std::optional<api::ActiveProbe>& probe = got->active;
  if (active && probe && probe->ran)
    for (const api::ProbeResult& p : probe->gpus) healthy = healthy && p.passed;
  if (format == Format::kJson) {
    PrintJson(got->ToJson());
  } else if (format == Format::kYaml) {
    PrintYaml(got->ToJson());
  } else {
    if (got->gpus.empty()) std::printf("no GPUs: %s\n", got->inventory.note.c_str());
    std::vector<std::vector<std::string>> rows;
    for (const api::GpuHealth& v : got->gpus) {
      std::string why;
      for (const api::HealthReason& r : v.reasons) why += (why.empty() ? "" : "; ") + r.message;
      rows.push_back({std::to_string(v.gpu), v.verdict, v.since, why.empty() ? "-" : why});
    }
    if (!rows.empty()) PrintTable({"GPU", "VERDICT", "SINCE", "REASONS"}, rows);
    if (active) {
      if (!probe || !probe->ran)
        std::printf("%s\n",
                    probe && probe->note ? probe->note->c_str() : "active probe did not run");
      if (probe)
        for (const api::ProbeResult& p : probe->gpus)
          std::printf("active probe, CUDA device %d (%s): %s in %.0f ms\n", p.cuda_ordinal,
                      p.name.value_or("").c_str(),
                      p.passed ? "passed" : p.error.value_or("failed").c_str(), p.ms);
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
