// `tau platform apply|show`, `tau queues`, `tau queue show`: platform policy on the server and
// the queues it gives, as the admission engine sees them after its last pass.
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "budget/budget.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/strings.h"
#include "policy/policy.h"

namespace tau::cli {
namespace {

// "nvidia.com/gpu 2/8 on h100" for each flavor and resource with quota or usage.
std::string UsageText(const std::vector<api::Usage>& usage) {
  std::vector<std::string> parts;
  for (const api::Usage& u : usage) {
    if (u.usage == "0" && u.nominal == "0") continue;
    std::string borrowed = u.borrowed.value_or("0");
    parts.push_back(fmt::format(
        "{} {}/{} on {}{}", u.resource, HumanQuantity(u.usage), HumanQuantity(u.nominal), u.flavor,
        borrowed == "0" ? "" : fmt::format(" (borrowing {})", HumanQuantity(borrowed))));
  }
  return parts.empty() ? "-" : Join(parts, ", ");
}

void PrintPending(const std::vector<api::PendingRun>& pending) {
  std::vector<std::vector<std::string>> rows;
  for (const api::PendingRun& p : pending)
    rows.push_back({p.pending.position ? std::to_string(*p.pending.position) : "-", p.name,
                    std::to_string(p.priority), p.pending.code.value_or(""), p.pending.reason});
  PrintTable({"POS", "RUN", "PRIORITY", "STATE", "WHY"}, rows);
}

}  // namespace

static int CmdPlatformApply(const Global& g, const std::string& file) {
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
  auto applied = client::TauApi(conn->get()).ApplyPlatform(*text, file);
  if (!applied.ok()) return Fail(applied.status().message());
  for (const std::string& warning : *applied) std::fprintf(stderr, "%s\n", warning.c_str());
  const policy::Platform& p = *parsed.platform;
  std::printf("applied %s: %zu queue(s), %zu workspace(s), %zu priority class(es)\n", file.c_str(),
              p.admission.queues.size(), p.workspaces.size(), p.priorities.size());
  return 0;
}

static int CmdPlatformShow(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetPlatform();
  if (!got.ok()) return Fail(got.status().message());
  if (IsData(format)) return PrintData(got->ToJson(), format);
  // The file as applied, which `tau platform validate -` and `apply` take back; others than admins
  // (and a server too old to send it) get the API object, which they do not.
  std::printf("# platform in force: %s (applied %s)\n", got->source.c_str(), got->applied.c_str());
  if (got->text.empty()) {
    std::printf("# (as the API describes it: the file itself is shown to admins)\n");
    PrintYaml(got->platform);
  } else {
    std::fputs(got->text.c_str(), stdout);
    if (got->text.back() != '\n') std::fputs("\n", stdout);
  }
  return 0;
}

// A rolling window as the platform file writes it: "7d", "36h".
static std::string WindowText(int64_t ms) {
  constexpr int64_t kDay = 86'400'000;
  return ms > 0 && ms % kDay == 0 ? fmt::format("{}d", ms / kDay) : FormatDuration(ms);
}

// The budgets' table (GET /api/v1/budgets): scope, what was used of what, and when it resets.
static void PrintBudgets(const nlohmann::json& budgets) {
  std::vector<std::vector<std::string>> rows;
  for (const nlohmann::json& b : budgets) {
    std::string used;
    for (const char* kind : {"gpu_hours", "cpu_hours"}) {
      if (!b[kind].is_number()) continue;
      if (!used.empty()) used += ", ";
      used += fmt::format("{} / {} {}", budget::Hours(b["used"].value(kind, 0.0)),
                          budget::Hours(b[kind].get<double>()),
                          std::string(kind) == "gpu_hours" ? "GPU-h" : "CPU-h");
    }
    if (b.contains("cost") && b["cost"].is_number()) {
      const std::string currency = b.value("currency", "");
      if (!used.empty()) used += ", ";
      used += fmt::format("{} / {}", budget::Money(b["used"].value("cost", 0.0), ""),
                          budget::Money(b["cost"].get<double>(), currency));
    }
    const std::string period = b.value("period", "");
    const int64_t window = b.value("window_ms", int64_t{0});
    // Its name (docs/budgets.md: how tau calls it), with its scope when the name is not that.
    const std::string scope = b.value("scope", ""), name = b.value("name", scope);
    rows.push_back({name == scope ? scope : fmt::format("{} ({})", name, scope), used,
                    period.empty() ? "last " + WindowText(window) : "this " + period,
                    b["resets"].is_string() ? b["resets"].get<std::string>() : "-",
                    b.value("spent", false) ? "spent" : (b.value("warn", false) ? "warn" : "ok")});
  }
  PrintTable({"BUDGET", "USED", "OVER", "RESETS", "STATE"}, rows);
}

// The budgets after a blank line, when the platform has any.
static void PrintBudgetsIfAny(client::Connection* conn) {
  auto budgets = conn->Call("GET", "/api/v1/budgets");
  if (!budgets.ok() || budgets->status != 200) return;
  nlohmann::json j = nlohmann::json::parse(budgets->body, nullptr, false);
  if (!j.is_object() || !j.contains("budgets") || j["budgets"].empty()) return;
  std::printf("\n");
  PrintBudgets(j["budgets"]);
}

// `tau usage`: what was held since a time, by workspace, user, queue or run (GET /api/v1/usage).
static int CmdUsage(const Global& g, const std::string& by, const std::string& since_text,
                    Format format, bool csv) {
  int64_t since = 0;
  const int64_t now = SystemClock()->NowMillis();
  if (since_text.empty() || since_text == "month") {
    policy::Budget month;
    month.period = "month";
    since = budget::WindowStart(month, now);
  } else if (auto t = ParseRfc3339(since_text); t.ok()) {
    since = *t;
  } else if (since_text.size() > 1 && since_text.back() == 'd' &&
             since_text.find_first_not_of("0123456789") == since_text.size() - 1) {
    since = now - std::stoll(since_text.substr(0, since_text.size() - 1)) * 86'400'000;
  } else if (auto d = ParseDurationMillis(since_text); d.ok()) {
    since = now - *d;
  } else {
    return Fail(
        fmt::format("--since '{}': a time (2026-12-01T00:00:00Z), a duration back from "
                    "now (7d, 12h) or `month`",
                    since_text));
  }
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = conn->get()->Call(
      "GET", fmt::format("/api/v1/usage?by={}&since={}", by, FormatRfc3339(since)));
  if (!got.ok()) return Fail(got.status().message());
  nlohmann::json j = nlohmann::json::parse(got->body, nullptr, false);
  if (got->status != 200 || !j.is_object())
    return Fail(j.is_object() && j.contains("error") ? j["error"].value("message", got->body)
                                                     : got->body);
  if (IsData(format)) return PrintData(j, format);
  const nlohmann::json& rows = j["rows"];
  // A platform with costs: the rows have them, in its currency.
  const nlohmann::json currency = j.value("currency", nlohmann::json());
  auto cost = [](const nlohmann::json& r, const char* format) {
    const nlohmann::json c = r.value("cost", nlohmann::json());
    return c.is_number() ? fmt::format(fmt::runtime(format), c.get<double>()) : std::string();
  };
  if (csv) {
    std::printf("%s,gpu_hours,cpu_hours,idle_gpu_hours,idle_share,cost,runs\n", by.c_str());
    for (const nlohmann::json& r : rows) {
      const nlohmann::json share = r.value("idle_share", nlohmann::json());
      std::printf("%s,%.6f,%.6f,%.6f,%s,%s,%lld\n", r.value("key", "").c_str(),
                  r.value("gpu_hours", 0.0), r.value("cpu_hours", 0.0),
                  r.value("idle_gpu_hours", 0.0),
                  share.is_number() ? fmt::format("{:.4f}", share.get<double>()).c_str() : "",
                  cost(r, "{:.4f}").c_str(), static_cast<long long>(r.value("runs", int64_t{0})));
    }
    return 0;
  }
  std::printf("since %s\n\n", FormatRfc3339(since).c_str());
  std::vector<std::vector<std::string>> table;
  double gpu = 0, cpu = 0, total_cost = 0;
  for (const nlohmann::json& r : rows) {
    gpu += r.value("gpu_hours", 0.0);
    cpu += r.value("cpu_hours", 0.0);
    if (r.value("cost", nlohmann::json()).is_number()) total_cost += r["cost"].get<double>();
    const nlohmann::json share = r.value("idle_share", nlohmann::json());
    std::vector<std::string> line = {
        r.value("key", ""), budget::Hours(r.value("gpu_hours", 0.0)),
        budget::Hours(r.value("cpu_hours", 0.0)),
        share.is_number() ? fmt::format("{:.0f}%", share.get<double>() * 100) : "-"};
    if (currency.is_string()) line.push_back(cost(r, "{:.2f}"));
    line.push_back(std::to_string(r.value("runs", int64_t{0})));
    table.push_back(std::move(line));
  }
  if (table.empty()) {
    std::puts("nothing was held");
  } else {
    std::vector<std::string> total = {"total", budget::Hours(gpu), budget::Hours(cpu), ""};
    std::string head = by;
    for (char& c : head) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::vector<std::string> heads = {head, "GPU-H", "CPU-H", "GPU IDLE"};
    if (currency.is_string()) {
      total.push_back(fmt::format("{:.2f}", total_cost));
      heads.push_back(fmt::format("COST ({})", currency.get<std::string>()));
    }
    total.push_back("");
    heads.push_back("RUNS");
    table.push_back(std::move(total));
    PrintTable(heads, table);
  }
  PrintBudgetsIfAny(conn->get());
  return 0;
}

// Admission fair sharing's number for a workspace: weighted decayed use over its weight.
static std::string FairUsageText(const std::optional<double>& usage) {
  return usage ? fmt::format("{:.3g}", *usage) : "last (weight 0)";
}

// {"nvidia.com/gpu": 2, "cpu": 16} as "nvidia.com/gpu 2, cpu 16"; "-" when empty.
static std::string ResourcesText(const nlohmann::json& resources) {
  std::vector<std::string> parts;
  for (const auto& [name, v] : resources.items())
    if (v.is_number()) parts.push_back(fmt::format("{} {:.3g}", name, v.get<double>()));
  return parts.empty() ? "-" : Join(parts, ", ");
}

static int CmdQueues(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  // The table and the names need the counts only: a deep queue's runs are most of the reply.
  auto got = client::TauApi(conn->get()).GetQueues(/*summary=*/!IsData(format));
  if (!got.ok()) return Fail(got.status().message());
  if (IsData(format)) return PrintData(got->ToJson(), format);
  if (format == Format::kName) {
    for (const api::Queue& q : got->queues) std::printf("%s\n", q.name.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const api::Queue& q : got->queues)
    rows.push_back({q.name, q.cohort.empty() ? "-" : q.cohort, std::to_string(q.admitted),
                    std::to_string(q.pending), UsageText(q.usage)});
  PrintTable({"QUEUE", "COHORT", "ADMITTED", "PENDING", "USAGE/QUOTA"}, rows);
  for (const api::Queue& q : got->queues) {
    if (q.fair_usage.empty()) continue;
    std::vector<std::string> order;
    for (const api::FairUsage& u : q.fair_usage)
      order.push_back(
          fmt::format("{} {}", u.workspace.empty() ? "-" : u.workspace, FairUsageText(u.usage)));
    std::printf("queue %s orders by usage (admission fair sharing), lowest first: %s\n",
                q.name.c_str(), Join(order, ", ").c_str());
  }
  for (const api::UnqueuedRun& o : got->unqueued_runs)
    std::printf("run %s has no queue: %s\n", o.name.c_str(), o.why.c_str());
  PrintBudgetsIfAny(conn->get());
  return 0;
}

// A page of the pending line: a deep queue's whole line is most of the reply and none of what a
// reader takes in.
struct QueuePage {
  int64_t offset = 0;
  int64_t limit = 50;
  bool all = false;
};

static int CmdQueueShow(const Global& g, const std::string& name, const QueuePage& page,
                        Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  auto got = client::TauApi(conn->get()).GetQueue(name, page.offset, page.all ? -1 : page.limit);
  if (!got.ok()) return Fail(got.status().message());
  const api::Queue& q = *got;
  if (IsData(format)) return PrintData(q.ToJson(), format);
  std::printf("queue %s (%s%s)\n\n", name.c_str(), q.queueing_strategy.c_str(),
              q.cohort.empty() ? "" : (", cohort " + q.cohort).c_str());
  std::vector<std::vector<std::string>> usage;
  for (const api::Usage& u : q.usage)
    usage.push_back({u.flavor, u.resource, HumanQuantity(u.usage), HumanQuantity(u.nominal),
                     HumanQuantity(u.borrowed.value_or(""))});
  PrintTable({"FLAVOR", "RESOURCE", "USED", "NOMINAL", "BORROWED"}, usage);
  if (!q.fair_usage.empty()) {
    // Admission fair sharing: the workspace with the lowest decayed usage goes first.
    std::printf("\nworkspaces by usage (admission fair sharing; the lowest goes first):\n");
    std::vector<std::vector<std::string>> rows;
    for (const api::FairUsage& u : q.fair_usage)
      rows.push_back({u.workspace.empty() ? "-" : u.workspace, FairUsageText(u.usage),
                      fmt::format("{:g}", u.weight), ResourcesText(u.consumed),
                      ResourcesText(u.held)});
    PrintTable({"WORKSPACE", "USAGE", "WEIGHT", "DECAYED USE", "HOLDS NOW"}, rows);
  }
  std::printf("\nadmitted (%lld):\n", static_cast<long long>(q.admitted));
  std::vector<std::vector<std::string>> admitted;
  for (const api::AdmittedRun& a : q.admitted_runs)
    admitted.push_back({a.name, a.state, std::to_string(a.priority)});
  if (!admitted.empty()) PrintTable({"RUN", "STATE", "PRIORITY"}, admitted);
  std::printf("\npending (%lld):\n", static_cast<long long>(q.pending));
  if (!q.pending_runs.empty()) PrintPending(q.pending_runs);
  const int64_t shown_to = page.offset + static_cast<int64_t>(q.pending_runs.size());
  if (q.pending > static_cast<int64_t>(q.pending_runs.size()))
    std::printf(
        "(positions %lld to %lld of %lld shown: --offset %lld for the next page, --all for "
        "every run)\n",
        static_cast<long long>(q.pending_runs.empty() ? 0 : page.offset + 1),
        static_cast<long long>(shown_to), static_cast<long long>(q.pending),
        static_cast<long long>(shown_to));
  return 0;
}

void RegisterQueueCommands(CLI::App* app, Context* ctx) {
  struct Args {
    std::vector<std::string> platform_files;
    std::string apply_file, queue_name;
    bool quiet = false;
    QueuePage page;
  };
  auto a = std::make_shared<Args>();
  const Global& g = ctx->g;
  auto* platform = app->add_subcommand("platform", "Platform policy (platform.yaml)");
  platform->require_subcommand(1);
  auto* pvalidate = platform->add_subcommand("validate", "Check platform files; exit 0 when valid");
  pvalidate->add_option("files", a->platform_files, "platform.yaml files")->required();
  pvalidate->add_flag("-q,--quiet", a->quiet, "Print errors only");
  auto pvalidate_format = AddOutput(pvalidate, ctx);
  pvalidate->callback([=] {
    if (auto f = pvalidate_format()) ctx->rc = CmdPlatformValidate(a->platform_files, a->quiet, *f);
  });
  auto* papply = platform->add_subcommand(
      "apply", "Make a platform file the server's policy (validated first; no restart)");
  papply->add_option("file", a->apply_file, "platform.yaml")->required();
  papply->callback([=, &g] { ctx->rc = CmdPlatformApply(g, a->apply_file); });
  auto* pshow = platform->add_subcommand("show", "Print the platform the server uses");
  auto show_format = AddOutput(pshow, ctx);
  pshow->callback([=, &g] {
    if (auto f = show_format()) ctx->rc = CmdPlatformShow(g, *f);
  });

  auto* queues = app->add_subcommand("queues", "Queues: usage against quota, admitted and pending");
  auto queues_format =
      AddOutput(queues, ctx, {Format::kTable, Format::kName, Format::kJson, Format::kYaml});
  queues->callback([=, &g] {
    if (auto f = queues_format()) ctx->rc = CmdQueues(g, *f);
  });
  auto* usage = app->add_subcommand(
      "usage", "What runs held (GPU-hours, CPU-hours) and the budgets (docs/budgets.md)");
  auto usage_args = std::make_shared<std::pair<std::string, std::string>>("workspace", "");
  auto csv = std::make_shared<bool>(false);
  usage->add_option("--by", usage_args->first, "workspace (default), user, queue, flavor or run")
      ->check(CLI::IsMember({"workspace", "user", "queue", "flavor", "run"}));
  usage->add_option("--since", usage_args->second,
                    "From when: a time (2026-12-01T00:00:00Z), a duration back (7d, 12h), or "
                    "month (the default: this calendar month, UTC)");
  usage->add_flag("--csv", *csv, "Comma-separated values");
  auto usage_format = AddOutput(usage, ctx, {Format::kTable, Format::kJson, Format::kYaml});
  usage->callback([=, &g] {
    if (auto f = usage_format())
      ctx->rc = CmdUsage(g, usage_args->first, usage_args->second, *f, *csv);
  });
  auto* queue = app->add_subcommand("queue", "One queue");
  queue->require_subcommand(1);
  auto* qshow = queue->add_subcommand("show", "A queue's usage, admitted runs and pending line");
  qshow->add_option("name", a->queue_name, "Queue name")->required();
  qshow->add_option("--limit", a->page.limit, "Show at most this many pending runs (default 50)")
      ->check(CLI::Range(int64_t{0}, int64_t{INT32_MAX}));
  qshow->add_option("--offset", a->page.offset, "Skip this many pending runs from the head")
      ->check(CLI::Range(int64_t{0}, int64_t{INT32_MAX}));
  qshow->add_flag("--all", a->page.all, "Show every pending run");
  auto qshow_format = AddOutput(qshow, ctx);
  qshow->callback([=, &g] {
    if (auto f = qshow_format()) ctx->rc = CmdQueueShow(g, a->queue_name, a->page, *f);
  });
}

}  // namespace tau::cli
