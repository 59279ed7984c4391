// `tau explain`, `tau plan FILE [--backend local|kubernetes]`, `tau platform render FILE` and
// `tau cluster render`: what a run, a platform or the cluster install becomes, printed without
// submitting anything. Only explain and plan may ask a server: whom it signs a token in as, or (for
// a server that is not this machine's own) the resolution itself.
#include <fnmatch.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/code.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/files.h"
#include "common/layout.h"
#include "common/strings.h"
#include "engines/engines.h"
#include "health/health.h"
#include "kube/kube.h"
#include "kube/service.h"
#include "policy/policy.h"
#include "runtime/runtime.h"
#include "spec/spec.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

struct PlanOptions {
  std::string file = "tau.yaml";
  std::vector<std::string> set;  // --set PATH=VALUE, as typed
  std::string backend;           // a registered engine; "" : the first
  std::string platform;          // platform.yaml; "" : this machine's default platform
  std::string user;              // "" : the current user
  std::string namespace_name;    // kubernetes: "" : the workspace's namespace
  std::string image;             // kubernetes: image for specs without runtime.image
};

struct ClusterRenderOptions {
  std::string values_file;     // the Helm chart's values (YAML); "" : the chart's defaults
  std::string platform_file;   // platform.yaml; "" : the values' `platform`, if any
  std::string namespace_name;  // "" : the values' (tau-system)
  std::string image;           // REPOSITORY[:TAG]; "" : the values' image
};

// The spec's directory as code files for inlining: the walk `tau run` uses, stopped once far past
// the inline limit (nearer it, the renderer measures the archive and reports).
Result<std::vector<CodeFile>> CollectInlineCode(const std::string& root,
                                                const std::vector<std::string>& excludes) {
  auto walk = CollectCode(root, 4 * kube::kMaxInlineCodeBytes, excludes);
  if (!walk.ok()) {
    if (walk.status().code() != StatusCode::kResourceExhausted) return walk.status();
    return ResourceExhausted(fmt::format(
        "the code directory {} holds more than {} KiB; a Kubernetes run carries its code inside "
        "its own object (at most {} KiB): list data sets, checkpoints and other large files in "
        ".tauignore and read them from a storage volume, or build them into the image",
        root, 4 * kube::kMaxInlineCodeBytes / 1024, kube::kMaxInlineCodeBytes / 1024));
  }
  for (const std::string& w : walk->warnings) std::fprintf(stderr, "tau: warning: %s\n", w.c_str());
  return std::move(walk->files);
}

Result<policy::Platform> ParsePlatformFile(const std::string& file) {
  TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
  policy::PlatformOutcome parsed = policy::ParsePlatform(text, file);
  if (!parsed.ok()) return InvalidArgument(parsed.ErrorText());
  return std::move(*parsed.platform);
}

// The platform and user a spec is resolved with, as `tau run` would have them. The platform:
// --platform FILE, else the one applied to this machine's server (`tau platform apply` keeps it
// under TAU_HOME), else the machine's default platform. The user: --user, else whom the server
// signs the caller in as when it is signed in to with a token (`tau login`, TAU_TOKEN), else the
// Unix user, as the local socket does.
struct ResolveInputs {
  policy::Platform platform;
  policy::Caller caller;
};

Result<ResolveInputs> LoadResolveInputs(const Global& g, std::string platform_file,
                                        const std::string& user) {
  ResolveInputs in;
  if (platform_file.empty() && PathExists(layout::PlatformFile(TauHome())))
    platform_file = layout::PlatformFile(TauHome());
  if (platform_file.empty()) {
    health::GpuInventory gpus = health::DiscoverGpus();
    int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
    in.platform = policy::DefaultPlatform(static_cast<int>(gpus.devices.size()),
                                          ::sysconf(_SC_NPROCESSORS_ONLN) * 1000, memory);
  } else {
    TAU_ASSIGN_OR_RETURN(in.platform, ParsePlatformFile(platform_file));
  }
  in.caller.user = user;
  if (in.caller.user.empty() && SignsInWithAToken(g.server)) {
    auto conn = ConnectToServer(g.server, /*start_local=*/false);
    if (!conn.ok())
      return Unavailable(
          fmt::format("cannot ask the server who you are ({}); name the user with --user",
                      conn.status().message()));
    auto me = client::TauApi(conn->get()).Whoami();
    if (!me.ok())
      return Unavailable(
          fmt::format("cannot ask the server who you are ({}); name the user with --user",
                      me.status().message()));
    in.caller = {me->user, me->groups};
  }
  if (in.caller.user.empty()) {
    if (const struct passwd* pw = ::getpwuid(::getuid())) in.caller.user = pw->pw_name;
  }
  return in;
}

// Whether the server resolves the spec: when it is not this machine's own server, or is signed in
// to with a token, and neither --platform nor --user says otherwise. It knows its platform and whom
// the caller is; this machine may know neither.
bool ServerResolves(const Global& g, const std::string& platform_file, const std::string& user) {
  return platform_file.empty() && user.empty() && SignsInWithAToken(g.server);
}

// The spec resolved by the server for the caller, as `tau run` would have it (POST
// /api/v1/resolve), with the --set overrides it was parsed with. A refusal keeps its code and
// message ("FIELD: text" lines).
Result<policy::ResolvedRun> ResolveOnServer(const Global& g, const std::string& text,
                                            const std::string& file,
                                            const std::vector<spec::Override>& overrides) {
  auto conn = ConnectToServer(g.server, /*start_local=*/false);
  if (!conn.ok())
    return Unavailable(
        fmt::format("cannot reach the server to resolve the spec as it would ({}); "
                    "resolve here with --platform FILE --user NAME",
                    conn.status().message()));
  std::vector<std::string> set;
  for (const spec::Override& o : overrides) set.push_back(o.Text());
  TAU_ASSIGN_OR_RETURN(nlohmann::json reply, client::TauApi(conn->get()).Resolve(text, file, set));
  if (!reply.is_object() || !reply.contains("resolved"))
    return Internal("the server's answer to POST /api/v1/resolve has no 'resolved'");
  // A server older than --set resolves the file without it, and does not say it took any.
  if (!set.empty() && !reply.contains("set"))
    return FailedPrecondition(
        "the server resolves specs without --set (it is older than this tau); resolve here with "
        "--platform FILE --user NAME");
  return policy::ResolvedRunFromJson(reply["resolved"]);
}

// A LoadResolveInputs failure: 1 for a platform file that is not valid, else 125.
int FailInputs(const Status& s) {
  std::fprintf(stderr, "%s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? kExitInvalid : kExitTauError;
}

// The spec resolved as `tau run` would have it: by the server when `server_may` and ServerResolves,
// else here, against LoadResolveInputs (whose platform is left in `platform`). nullopt when it
// cannot be: the error is printed, at the spec's fields it names, and `*rc` is the exit status.
std::optional<policy::ResolvedRun> ResolveSpec(const Global& g, const std::string& file,
                                               const std::string& text,
                                               const spec::ParseOutcome& parsed,
                                               const std::string& platform_file,
                                               const std::string& user, bool server_may,
                                               policy::Platform* platform, int* rc) {
  Result<policy::ResolvedRun> resolved = InvalidArgument("");
  if (server_may && ServerResolves(g, platform_file, user)) {
    resolved = ResolveOnServer(g, text, file, parsed.spec->overrides);
  } else {
    auto in = LoadResolveInputs(g, platform_file, user);
    if (!in.ok()) {
      *rc = FailInputs(in.status());
      return std::nullopt;
    }
    resolved = policy::Resolve(*parsed.spec, in->platform, in->caller);
    *platform = std::move(in->platform);
  }
  if (resolved.ok()) return std::move(*resolved);
  const StatusCode code = resolved.status().code();
  if (code != StatusCode::kInvalidArgument && code != StatusCode::kPermissionDenied) {
    *rc = Fail(resolved.status().message());  // the server could not be asked
  } else {
    std::fprintf(stderr, "%s\n", LocatedErrors(file, parsed, resolved.status().message()).c_str());
    *rc = kExitInvalid;
  }
  return std::nullopt;
}

int CmdExplain(const Global& g, const std::string& spec_file, const std::vector<std::string>& set,
               const std::string& platform_file, const std::string& user, Format format) {
  std::string text;
  int rc = 0;
  auto overrides = ParseSetOption(set, &rc);
  if (!overrides) return rc;
  std::optional<spec::ParseOutcome> spec = ReadSpecFile(spec_file, &text, &rc, *overrides);
  if (!spec) return rc;
  policy::Platform platform;
  std::optional<policy::ResolvedRun> resolved = ResolveSpec(
      g, spec_file, text, *spec, platform_file, user, /*server_may=*/true, &platform, &rc);
  if (!resolved) return rc;
  if (format == Format::kTable) {
    std::fputs(policy::ExplainText(*resolved).c_str(), stdout);
    return 0;
  }
  nlohmann::json prov = nlohmann::json::array();
  for (const auto& p : resolved->provenance)
    prov.push_back({{"field", p.field}, {"value", p.value}, {"source", p.source}});
  // The provenance, and the whole resolution (pod sizes, totals, mounts) as the server records it.
  nlohmann::json out = {{"provenance", prov}, {"resolved", policy::ToJson(*resolved)}};
  return PrintData(out, format);
}

int PrintLocalPlan(spec::RunSpec spec, const policy::ResolvedRun& run, const std::string& code_dir,
                   Format format) {
  // The launch follows the resolved shape (a compute profile may give the GPUs).
  spec.compute.gpus = run.gpus_per_worker;
  spec.compute.workers = run.workers;
  if (!IsData(format)) std::fputs(policy::ExplainText(run).c_str(), stdout);
  runtime::LaunchContext ctx;
  ctx.run_name = spec.name;
  ctx.work_dir = code_dir;
  ctx.checkpoint_dir = "$RUN/checkpoints";
  ctx.output_dir = "$RUN/output";
  ctx.metrics_file = "$RUN/metrics.jsonl";
  ctx.master_port = 29500;
  for (int i = 0; i < spec.compute.gpus * spec.compute.workers; ++i) ctx.gpus.push_back(i);
  auto plan = runtime::PlanLaunch(spec, ctx);
  if (!plan.ok()) return Fail(plan.status().message());
  if (IsData(format)) {
    nlohmann::json launch = nlohmann::json::array();
    for (const runtime::WorkerLaunch& w : *plan) {
      nlohmann::json env = nlohmann::json::object();
      for (const auto& [k, v] : w.env) env[k] = v;
      launch.push_back({{"argv", w.argv}, {"env", env}});
    }
    return PrintData(
        {{"resolved", policy::ToJson(run)}, {"launch", launch}, {"pip", spec.runtime.pip}}, format);
  }
  std::printf("\nlaunch (%zu process%s; GPU indices as the server would hand them out):\n",
              plan->size(), plan->size() == 1 ? "" : "es");
  for (size_t i = 0; i < plan->size(); ++i) {
    std::vector<std::string> words;
    for (const std::string& a : (*plan)[i].argv) words.push_back(ShellQuote(a));
    std::string gpus;
    for (const auto& [k, v] : (*plan)[i].env) {
      if (k == "CUDA_VISIBLE_DEVICES") gpus = v;
    }
    std::printf("  [%zu] CUDA_VISIBLE_DEVICES=%s %s\n", i, ShellQuote(gpus).c_str(),
                Join(words, " ").c_str());
  }
  if (!spec.runtime.pip.empty()) {
    std::printf("  in a virtualenv with: %s\n", Join(spec.runtime.pip, " ").c_str());
  }
  return 0;
}

// local: the resolved run and the launch plan (one line per worker); kubernetes: the Job or RayJob
// (and a gang's Service) as YAML, the code directory shipped inline.
int CmdPlan(const Global& g, const PlanOptions& o, Format format) {
  auto engine = engines::Find(o.backend);
  if (!engine.ok()) return Fail(engine.status().message());
  // An engine whose runs are processes here prints their launch plan; one whose runs are
  // Kubernetes objects prints them.
  const server::Capabilities caps = (*engine)->caps;
  const bool launch_plan = caps.processes_here;
  if (!launch_plan && !caps.kube_objects)
    return Fail(fmt::format("tau plan cannot show a run of the {} backend", (*engine)->name));
  std::string text;
  int rc = 0;
  auto overrides = ParseSetOption(o.set, &rc);
  if (!overrides) return rc;
  std::optional<spec::ParseOutcome> read = ReadSpecFile(o.file, &text, &rc, *overrides);
  if (!read) return rc;
  const spec::ParseOutcome& parsed = *read;
  // The local plan of a server that resolves (ServerResolves) is its resolution; a Kubernetes plan
  // renders with a platform file, so it resolves here.
  policy::Platform platform_here;
  std::optional<policy::ResolvedRun> run =
      ResolveSpec(g, o.file, text, parsed, o.platform, o.user,
                  /*server_may=*/launch_plan, &platform_here, &rc);
  if (!run) return rc;
  auto root = FindCodeRoot(o.file, *parsed.spec);
  if (!root.ok()) return Fail(root.status().message());
  run->code_subdir = root->subdir;
  const std::string start_dir =
      (fs::absolute(root->root) / root->subdir).lexically_normal().string();
  if (launch_plan) {
    if (auto cannot = CannotStartWarning(o.file, parsed, run->gpus_per_worker))
      std::fprintf(stderr, "%s\n", cannot->ToString().c_str());
    return PrintLocalPlan(*parsed.spec, *run, start_dir, format);
  }

  auto code = CollectInlineCode(root->root, parsed.spec->code_excludes);
  if (!code.ok()) return Fail(code.status().message());
  Result<std::vector<nlohmann::json>> objects = std::vector<nlohmann::json>{};
  if (parsed.spec->serve) {
    // A service: its Deployment and Service, or its RayService (kube/service.h).
    kube::ServiceRenderOptions so;
    so.namespace_name = o.namespace_name;
    so.default_image = o.image;
    so.code = std::move(*code);
    objects = kube::RenderService(*parsed.spec, *run, platform_here, so);
  } else {
    kube::RenderOptions ro;
    ro.namespace_name = o.namespace_name;
    ro.default_image = o.image;
    ro.code = std::move(*code);
    objects = kube::RenderRun(*parsed.spec, *run, platform_here, ro);
  }
  if (!objects.ok()) {
    std::fprintf(stderr, "%s\n", LocatedErrors(o.file, parsed, objects.status().message()).c_str());
    return kExitInvalid;
  }
  // A table is what `kubectl apply -f -` takes; JSON and YAML are a v1 List, as kubectl prints.
  if (IsData(format))
    return PrintData({{"apiVersion", "v1"}, {"kind", "List"}, {"items", *objects}}, format);
  std::fputs(kube::ToYaml(*objects).c_str(), stdout);
  return 0;
}

// Fair sharing and admission fair sharing are settings of Kueue's own Configuration, not objects:
// what to merge into it, as YAML comments.
void PrintKueueConfigurationNote(const policy::Platform& platform) {
  const nlohmann::json config = kube::KueueConfiguration(platform);
  if (config.empty()) return;
  std::fputs(
      "# Merge into Kueue's Configuration (kueue-manager-config; deploy/kueue/values.yaml):\n",
      stdout);
  for (const std::string& line : Split(kube::ToYaml(config), '\n'))
    if (!line.empty()) std::printf("#   %s\n", line.c_str());
}

// The platform's Kueue objects, namespaces and RBAC as YAML.
int CmdPlatformRender(const std::string& file) {
  auto platform = ParsePlatformFile(file);
  if (!platform.ok()) return FailInputs(platform.status());
  auto objects = kube::RenderPlatform(*platform);
  if (!objects.ok()) return Fail(objects.status().message());
  PrintKueueConfigurationNote(*platform);
  std::fputs(kube::ToYaml(*objects).c_str(), stdout);
  return 0;
}

// The objects the Helm chart deploy/helm/taugrid installs (and, with a platform, the platform's
// objects) as YAML, for clusters installed without Helm.
int CmdClusterRender(const ClusterRenderOptions& o) {
  kube::ClusterValues values;
  if (!o.values_file.empty()) {
    auto text = ReadFile(o.values_file);
    if (!text.ok()) return Fail(text.status().message());
    auto parsed = kube::ParseClusterValues(*text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s: error: %s\n", o.values_file.c_str(),
                   parsed.status().message().c_str());
      return kExitInvalid;
    }
    values = std::move(*parsed);
  }
  if (!o.namespace_name.empty()) values.namespace_name = o.namespace_name;
  if (!o.image.empty()) {
    // REPOSITORY[:TAG]; a ':' before the last '/' is a registry's port, not a tag.
    if (o.image.find('@') != std::string::npos) {
      return Fail("--image " + o.image + ": give a tag, not a digest");
    }
    size_t colon = o.image.rfind(':');
    size_t slash = o.image.rfind('/');
    bool tagged = colon != std::string::npos && (slash == std::string::npos || colon > slash);
    values.image_repository = tagged ? o.image.substr(0, colon) : o.image;
    values.image_tag = tagged ? o.image.substr(colon + 1) : "";
  }
  // The platform's text travels in the chart's ConfigMap; parsing it here refuses a platform the
  // server would refuse at start, and gives its objects.
  std::string platform_name = o.values_file + ": platform";
  if (!o.platform_file.empty()) {
    auto text = ReadFile(o.platform_file);
    if (!text.ok()) return Fail(text.status().message());
    values.platform = std::move(*text);
    platform_name = o.platform_file;
  }
  std::optional<policy::Platform> platform;
  if (!values.platform.empty()) {
    policy::PlatformOutcome parsed = policy::ParsePlatform(values.platform, platform_name);
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
      return kExitInvalid;
    }
    platform = std::move(*parsed.platform);
  }
  auto objects = kube::RenderCluster(values, platform ? &*platform : nullptr);
  if (!objects.ok()) {
    std::fprintf(stderr, "error: %s\n", objects.status().message().c_str());
    return kExitInvalid;
  }
  if (platform) PrintKueueConfigurationNote(*platform);
  std::fputs(kube::ToYaml(*objects).c_str(), stdout);
  return 0;
}

}  // namespace

void RegisterPlanCommands(CLI::App* app, Context* ctx) {
  struct Args {
    std::string explain_file = "tau.yaml", explain_platform, explain_user, render_file;
    std::vector<std::string> explain_set;
    PlanOptions plan;
    ClusterRenderOptions cluster;
  };
  auto a = std::make_shared<Args>();
  auto* explain =
      app->add_subcommand("explain", "Print each resolved setting of a run and where it came from");
  explain->add_option("file", a->explain_file, "The spec (default ./tau.yaml)");
  explain->add_option(
      "--platform", a->explain_platform,
      "platform.yaml to resolve against (default: the one applied to this machine's server, "
      "else the machine's default platform)");
  explain->add_option("--user", a->explain_user,
                      "Resolve as this user (default: the signed-in user, else the current user)");
  AddSetOption(explain, &a->explain_set);
  auto format = AddOutput(explain, ctx);
  explain->callback([=] {
    if (auto f = format())
      ctx->rc = CmdExplain(ctx->g, a->explain_file, a->explain_set, a->explain_platform,
                           a->explain_user, *f);
  });

  auto* plan = app->add_subcommand(
      "plan", "Print what a run would become: its launch plan, or its Kubernetes objects");
  PlanOptions& p = a->plan;
  plan->add_option("file", p.file, "The spec (default ./tau.yaml)");
  plan->add_option("--backend", p.backend, BackendHelp())->check(BackendCheck());
  plan->add_option(
      "--platform", p.platform,
      "platform.yaml to resolve against (default: the one applied to this machine's server, "
      "else the machine's default platform)");
  plan->add_option("--user", p.user,
                   "Resolve as this user (default: the signed-in user, else the current user)");
  plan->add_option("--namespace", p.namespace_name,
                   "kubernetes: namespace (default: the run's workspace namespace)");
  plan->add_option("--image", p.image, "kubernetes: image for a spec without runtime.image");
  AddSetOption(plan, &p.set);
  auto plan_format = AddOutput(plan, ctx);
  plan->callback([=] {
    if (auto f = plan_format()) ctx->rc = CmdPlan(ctx->g, a->plan, *f);
  });
  // Under the `platform` of RegisterQueueCommands, which comes first.
  auto* prender =
      app->get_subcommand("platform")
          ->add_subcommand(
              "render",
              "Print a platform's Kubernetes objects (Kueue queues, namespaces, RBAC) as YAML");
  prender->add_option("file", a->render_file, "platform.yaml")->required();
  prender->callback([=] { ctx->rc = CmdPlatformRender(a->render_file); });

  // The Helm chart's objects without Helm.
  auto* cluster = app->add_subcommand("cluster", "tau's own install on a Kubernetes cluster");
  cluster->require_subcommand(1);
  auto* crender = cluster->add_subcommand(
      "render",
      "Print what the Helm chart deploy/helm/taugrid installs (server, RBAC, GPU health agent) as "
      "YAML");
  ClusterRenderOptions& c = a->cluster;
  crender->add_option("--values", c.values_file,
                      "The chart's values file (default: the chart's defaults)");
  crender->add_option("--platform", c.platform_file,
                      "platform.yaml: put in the server's ConfigMap, its objects printed too");
  crender->add_option("--namespace", c.namespace_name,
                      "Namespace of the server and agent (default tau-system)");
  crender->add_option("--image", c.image, "tau's image, REPOSITORY[:TAG]");
  crender->callback([=] { ctx->rc = CmdClusterRender(a->cluster); });
}

}  // namespace tau::cli
