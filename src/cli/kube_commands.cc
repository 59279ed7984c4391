// `tau plan FILE [--backend local|kubernetes]`, `tau platform render FILE` and
// `tau cluster render`.
#include "cli/kube_commands.h"

#include <fnmatch.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/code.h"
#include "cli/commands.h"
#include "common/files.h"
#include "common/strings.h"
#include "health/health.h"
#include "kube/kube.h"
#include "policy/policy.h"
#include "runtime/runtime.h"
#include "spec/spec.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

// The spec's directory as code files for inlining: the walk `tau run` uses, stopped once far past
// the inline limit (nearer it, the renderer measures the archive and reports).
Result<std::vector<CodeFile>> CollectInlineCode(const std::string& root) {
  auto walk = CollectCode(root, 4 * kube::kMaxInlineCodeBytes);
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

Result<policy::Platform> LoadPlatform(const std::string& file) {
  if (file.empty()) {
    // Without a platform file: the default a local server uses, sized to this machine.
    health::GpuInventory gpus = health::DiscoverGpus();
    int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
    return policy::DefaultPlatform(static_cast<int>(gpus.devices.size()),
                                   ::sysconf(_SC_NPROCESSORS_ONLN) * 1000, memory);
  }
  TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
  policy::PlatformOutcome parsed = policy::ParsePlatform(text, file);
  if (!parsed.ok()) return InvalidArgument(parsed.ErrorText());
  return std::move(*parsed.platform);
}

std::string CurrentUser() {
  if (const struct passwd* pw = ::getpwuid(::getuid())) return pw->pw_name;
  return "";
}

int PrintLocalPlan(spec::RunSpec spec, const policy::ResolvedRun& run,
                   const std::string& code_dir) {
  // The launch follows the resolved shape (a compute profile may give the GPUs).
  spec.compute.gpus = run.gpus_per_worker;
  spec.compute.workers = run.workers;
  std::fputs(policy::ExplainText(run).c_str(), stdout);
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

}  // namespace

int CmdPlan(const PlanOptions& o) {
  if (o.backend != "local" && o.backend != "kubernetes") {
    return Fail("unknown backend '" + o.backend + "' (local or kubernetes)");
  }
  auto text = ReadFileAtMost(o.file, spec::kMaxSpecBytes, "a spec");
  if (!text.ok()) return Fail(text.status().message());
  spec::ParseOutcome parsed = spec::ParseSpec(*text, o.file);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.ErrorText().c_str());
    return kExitInvalid;
  }
  auto platform = LoadPlatform(o.platform);
  if (!platform.ok()) {
    std::fprintf(stderr, "%s\n", platform.status().message().c_str());
    return platform.status().code() == StatusCode::kInvalidArgument ? kExitInvalid : kExitTauError;
  }
  auto run = policy::Resolve(*parsed.spec, *platform, o.user.empty() ? CurrentUser() : o.user);
  if (!run.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", o.file.c_str(), run.status().message().c_str());
    return kExitInvalid;
  }
  std::string code_dir = fs::absolute(fs::path(o.file)).parent_path().string();
  if (o.backend == "local") return PrintLocalPlan(*parsed.spec, *run, code_dir);

  kube::RenderOptions ro;
  ro.namespace_name = o.namespace_name;
  ro.default_image = o.image;
  auto code = CollectInlineCode(code_dir);
  if (!code.ok()) return Fail(code.status().message());
  ro.code = std::move(*code);
  auto objects = kube::RenderRun(*parsed.spec, *run, *platform, ro);
  if (!objects.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", o.file.c_str(), objects.status().message().c_str());
    return kExitInvalid;
  }
  std::fputs(kube::ToYaml(*objects).c_str(), stdout);
  return 0;
}

int CmdPlatformRender(const std::string& file) {
  auto platform = LoadPlatform(file);
  if (!platform.ok()) {
    std::fprintf(stderr, "%s\n", platform.status().message().c_str());
    return platform.status().code() == StatusCode::kInvalidArgument ? kExitInvalid : kExitTauError;
  }
  auto objects = kube::RenderPlatform(*platform);
  if (!objects.ok()) return Fail(objects.status().message());
  if (platform->admission.fair_sharing) {
    // Fair sharing is a setting of Kueue's own Configuration, not an object.
    std::fputs(
        "# fair_sharing is on: set `fairSharing: {enable: true}` in Kueue's Configuration "
        "(kueue-manager-config).\n",
        stdout);
  }
  std::fputs(kube::ToYaml(*objects).c_str(), stdout);
  return 0;
}

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
  if (values.kueue_enabled || values.kuberay_enabled) {
    // Kueue and KubeRay are the chart's dependencies (their own charts), not tau's objects.
    std::fputs(
        "# kueue.enabled / kuberay.enabled: install Kueue and KubeRay from their own releases; "
        "these are tau's objects only.\n",
        stdout);
  }
  if (platform && platform->admission.fair_sharing) {
    std::fputs(
        "# fair_sharing is on: set `fairSharing: {enable: true}` in Kueue's Configuration "
        "(kueue-manager-config).\n",
        stdout);
  }
  std::fputs(kube::ToYaml(*objects).c_str(), stdout);
  return 0;
}

}  // namespace tau::cli
