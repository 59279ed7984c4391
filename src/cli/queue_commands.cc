// `tau platform apply|show`, `tau queues`, `tau queue show`: platform policy on the server and
// the queues it gives, as the admission engine sees them after its last pass.
#include <cstdio>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/strings.h"
#include "policy/policy.h"

namespace tau::cli {
namespace {

int Print(const nlohmann::json& value, Format format) {
  if (format == Format::kYaml)
    PrintYaml(value);
  else
    PrintJson(value);
  return 0;
}

// "nvidia.com/gpu 2/8 on h100" for each flavor and resource with quota or usage.
std::string UsageText(const nlohmann::json& usage) {
  std::vector<std::string> parts;
  for (const auto& u : usage) {
    std::string used = u.value("usage", "0"), nominal = u.value("nominal", "0");
    if (used == "0" && nominal == "0") continue;
    std::string borrowed = u.value("borrowed", "0");
    parts.push_back(fmt::format("{} {}/{} on {}{}", u.value("resource", ""), used, nominal,
                                u.value("flavor", ""),
                                borrowed == "0" ? "" : fmt::format(" (borrowing {})", borrowed)));
  }
  return parts.empty() ? "-" : Join(parts, ", ");
}

void PrintPending(const nlohmann::json& pending) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : pending)
    rows.push_back({p.contains("position") && p["position"].is_number()
                        ? std::to_string(p["position"].get<int>())
                        : "-",
                    p.value("name", ""), std::to_string(p.value("priority", 0)),
                    p.value("code", ""), p.value("reason", "")});
  PrintTable({"POS", "RUN", "PRIORITY", "STATE", "WHY"}, rows);
}

}  // namespace

int CmdPlatformApply(const Global& g, const std::string& file) {
  auto text = ReadFile(file);
  if (!text.ok()) return Fail(text.status().message());
  // Checked here first, so mistakes come back with file:line:col without a server round trip.
  policy::PlatformOutcome parsed = policy::ParsePlatform(*text, file);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
    return kExitInvalid;
  }
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  nlohmann::json body = {{"yaml", *text}, {"file", file}};
  auto applied = CallJson(**conn, "PUT", "/api/v1/platform", JsonText(body));
  if (!applied.ok()) return Fail(applied.status().message());
  const policy::Platform& p = *parsed.platform;
  std::printf("applied %s: %zu queue(s), %zu workspace(s), %zu priority class(es)\n", file.c_str(),
              p.admission.queues.size(), p.workspaces.size(), p.priorities.size());
  return 0;
}

int CmdPlatformShow(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = CallJson(**conn, "GET", "/api/v1/platform");
  if (!got.ok()) return Fail(got.status().message());
  if (format != Format::kTable) return Print(*got, format);
  std::printf("# platform in force: %s (applied %s)\n", got->value("source", "").c_str(),
              got->value("applied", "").c_str());
  PrintYaml((*got)["platform"]);
  return 0;
}

int CmdQueues(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = CallJson(**conn, "GET", "/api/v1/queues");
  if (!got.ok()) return Fail(got.status().message());
  if (format != Format::kTable) return Print(*got, format);
  std::vector<std::vector<std::string>> rows;
  for (const auto& q : (*got)["queues"])
    rows.push_back({q.value("name", ""),
                    q.value("cohort", "").empty() ? "-" : q.value("cohort", ""),
                    std::to_string(q.value("admitted", 0)), std::to_string(q.value("pending", 0)),
                    UsageText(q["usage"])});
  PrintTable({"QUEUE", "COHORT", "ADMITTED", "PENDING", "USAGE/QUOTA"}, rows);
  for (const auto& o : got->value("unqueued_runs", nlohmann::json::array()))
    std::printf("run %s has no queue: %s\n", o.value("name", "").c_str(),
                o.value("why", "").c_str());
  return 0;
}

int CmdQueueShow(const Global& g, const std::string& name, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = CallJson(**conn, "GET", "/api/v1/queues/" + name);
  if (!got.ok()) return Fail(got.status().message());
  const nlohmann::json& q = (*got)["queue"];
  if (format != Format::kTable) return Print(q, format);
  std::printf("queue %s (%s%s)\n\n", name.c_str(), q.value("queueing_strategy", "").c_str(),
              q.value("cohort", "").empty() ? "" : (", cohort " + q.value("cohort", "")).c_str());
  std::vector<std::vector<std::string>> usage;
  for (const auto& u : q["usage"])
    usage.push_back({u.value("flavor", ""), u.value("resource", ""), u.value("usage", ""),
                     u.value("nominal", ""), u.value("borrowed", "")});
  PrintTable({"FLAVOR", "RESOURCE", "USED", "NOMINAL", "BORROWED"}, usage);
  std::printf("\nadmitted (%d):\n", q.value("admitted", 0));
  std::vector<std::vector<std::string>> admitted;
  for (const auto& a : q["admitted_runs"])
    admitted.push_back(
        {a.value("name", ""), a.value("state", ""), std::to_string(a.value("priority", 0))});
  if (!admitted.empty()) PrintTable({"RUN", "STATE", "PRIORITY"}, admitted);
  std::printf("\npending (%d):\n", q.value("pending", 0));
  if (!q["pending_runs"].empty()) PrintPending(q["pending_runs"]);
  return 0;
}

}  // namespace tau::cli
