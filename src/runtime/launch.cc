// PlanLaunch: from a run spec and a placement to the exact argv and environment of every worker.
// Pure apart from one stat() (whether a non-Python entrypoint names a file shipped with the code).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/strings.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

// Sets `name` in `env`, replacing an earlier entry of the same name so the last writer wins.
void SetEnv(EnvList& env, const std::string& name, const std::string& value) {
  for (auto& [key, old] : env) {
    if (key == name) {
      old = value;
      return;
    }
  }
  env.emplace_back(name, value);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string GpuList(const std::vector<int>& gpus, size_t begin, size_t count) {
  std::vector<std::string> parts;
  for (size_t i = begin; i < begin + count && i < gpus.size(); ++i) {
    parts.push_back(std::to_string(gpus[i]));
  }
  return Join(parts, ",");
}

// The command that runs the entrypoint once, without a launcher in front.
std::vector<std::string> EntryCommand(const spec::RunSpec& spec, const LaunchContext& ctx) {
  const std::string& entry = spec.entrypoint;
  if (EndsWith(entry, ".py")) return {"python3", entry};
  // A file shipped with the code runs from the code directory; anything else is a command on PATH.
  // The path is absolute so that resolving argv[0] never depends on PATH or on the cwd of whoever
  // execs it.
  const std::string& shipped = ctx.shipped_dir.empty() ? ctx.work_dir : ctx.shipped_dir;
  if (!ctx.work_dir.empty() && entry[0] != '/' && IsRegularFile(shipped + "/" + entry)) {
    return {ctx.work_dir + "/" + entry};
  }
  return {entry};
}

void AppendArgs(std::vector<std::string>& argv, const std::vector<std::string>& args) {
  argv.insert(argv.end(), args.begin(), args.end());
}

// base_env, then the spec's literal env, then tau's variables; `launcher_env` (gang or Ray
// variables) goes just before CUDA_VISIBLE_DEVICES, and extra_env (recovery's) comes last so it can
// override anything.
Result<EnvList> WorkerEnv(const spec::RunSpec& spec, const LaunchContext& ctx,
                          const EnvList& launcher_env, const std::string& visible_gpus) {
  EnvList env;
  for (const auto& [name, value] : ctx.base_env) SetEnv(env, name, value);
  for (const spec::EnvVar& var : spec.runtime.env) {
    if (var.secret_ref) {
      return InvalidArgument("env " + var.name + " (SECRET:" + var.value +
                             "): secret references are not supported by the local backend yet");
    }
    SetEnv(env, var.name, var.value);
  }
  SetEnv(env, "TAU_RUN_NAME", ctx.run_name);
  SetEnv(env, "TAU_ATTEMPT", std::to_string(ctx.attempt));
  SetEnv(env, "TAU_CHECKPOINT_DIR", ctx.checkpoint_dir);
  SetEnv(env, "TAU_OUTPUT_DIR", ctx.output_dir);
  SetEnv(env, "TAU_METRICS_FILE", ctx.metrics_file);
  for (const auto& [name, value] : launcher_env) SetEnv(env, name, value);
  // Always set, even to "": an unset variable would let a CPU run see every GPU of a shared
  // machine.
  SetEnv(env, "CUDA_VISIBLE_DEVICES", visible_gpus);
  // The indices are NVML's, which count in PCI bus order; CUDA's default order (fastest first)
  // can name another GPU on a machine of mixed GPUs.
  SetEnv(env, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
  SetEnv(env, "PYTHONUNBUFFERED", "1");
  for (const auto& [name, value] : ctx.extra_env) SetEnv(env, name, value);
  return env;
}

Result<std::vector<WorkerLaunch>> PlanRayJob(const spec::RunSpec& spec, const LaunchContext& ctx) {
  // The driver runs once and drives Ray across the workers; locally it sees the whole GPU set.
  WorkerLaunch driver;
  driver.argv = EntryCommand(spec, ctx);
  AppendArgs(driver.argv, spec.args);
  EnvList ray_env = {{"TAU_RAY_WORKERS", std::to_string(spec.compute.workers)}};
  for (auto& kv : spec::LauncherEnv(spec)) ray_env.push_back(std::move(kv));
  TAU_ASSIGN_OR_RETURN(driver.env,
                       WorkerEnv(spec, ctx, ray_env, GpuList(ctx.gpus, 0, ctx.gpus.size())));
  return std::vector<WorkerLaunch>{std::move(driver)};
}

Result<std::vector<WorkerLaunch>> PlanJob(const spec::RunSpec& spec, const LaunchContext& ctx) {
  const int workers = spec.compute.workers;
  const int gpus = spec.compute.gpus;
  // torchrun only launches Python; a non-Python entrypoint is executed as is (it may be its own
  // launcher).
  const bool torchrun = spec::UsesTorchrun(spec);
  const std::string nproc = "--nproc_per_node=" + std::to_string(spec::ProcessesPerNode(spec));
  std::vector<WorkerLaunch> out;
  for (int rank = 0; rank < workers; ++rank) {
    WorkerLaunch w;
    EnvList gang_env;
    if (workers == 1 && torchrun && ctx.master_port > 0) {
      // torchrun's store on the port this machine's backend handed out (and guards for the run's
      // user), not one --standalone picks that anyone could reach.
      w.argv = {"torchrun",
                "--nnodes=1",
                nproc,
                "--master_addr=127.0.0.1",
                "--master_port=" + std::to_string(ctx.master_port),
                spec.entrypoint};
    } else if (workers == 1) {
      w.argv = torchrun
                   ? std::vector<std::string>{"torchrun", "--standalone", nproc, spec.entrypoint}
                   : EntryCommand(spec, ctx);
    } else {
      const std::string port = std::to_string(ctx.master_port);
      if (torchrun) {
        w.argv = {"torchrun",
                  "--nnodes=" + std::to_string(workers),
                  "--node_rank=" + std::to_string(rank),
                  nproc,
                  "--master_addr=127.0.0.1",
                  "--master_port=" + port,
                  spec.entrypoint};
      } else {
        w.argv = EntryCommand(spec, ctx);
      }
      // Every worker of a local gang is on this machine, so the local rank is the rank.
      gang_env = {{"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", port},
                  {"WORLD_SIZE", std::to_string(workers)},
                  {"RANK", std::to_string(rank)},
                  {"LOCAL_RANK", std::to_string(rank)}};
    }
    AppendArgs(w.argv, spec.args);
    const size_t per = static_cast<size_t>(gpus);
    TAU_ASSIGN_OR_RETURN(w.env, WorkerEnv(spec, ctx, gang_env,
                                          GpuList(ctx.gpus, static_cast<size_t>(rank) * per, per)));
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

Result<std::vector<WorkerLaunch>> PlanLaunch(const spec::RunSpec& spec, const LaunchContext& ctx) {
  const int workers = spec.compute.workers;
  const int gpus = spec.compute.gpus;
  if (spec.entrypoint.empty()) return InvalidArgument("the run has no entrypoint");
  if (workers < 1) return InvalidArgument("compute.workers must be at least 1");
  if (gpus < 0) return InvalidArgument("compute.gpus must not be negative");
  const size_t want = static_cast<size_t>(workers) * static_cast<size_t>(gpus);
  if (ctx.gpus.size() != want) {
    return InvalidArgument("placement gives " + std::to_string(ctx.gpus.size()) +
                           " GPUs but the run needs " + std::to_string(want) + " (" +
                           std::to_string(workers) + " workers x " + std::to_string(gpus) + ")");
  }
  if (spec.kind == spec::WorkloadKind::kRayJob) return PlanRayJob(spec, ctx);
  if (workers > 1 && (ctx.master_port <= 0 || ctx.master_port > 65535)) {
    return InvalidArgument("a gang of " + std::to_string(workers) +
                           " workers needs a master port; got " + std::to_string(ctx.master_port));
  }
  return PlanJob(spec, ctx);
}

namespace {

// Whether `command` is an executable file in one of the directories of `path_value`.
bool OnPath(const std::string& command, const std::string& path_value) {
  for (const std::string& dir : Split(path_value, ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + command;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return true;
  }
  return false;
}

}  // namespace

Status CheckStartable(const spec::RunSpec& spec, int gpus_per_worker,
                      const std::string& code_subdir, const std::vector<ShippedFile>& files,
                      const std::string& system_path) {
  const std::string& entrypoint = spec.entrypoint;
  if (entrypoint.empty()) return Status::Ok();
  const bool python = EndsWith(entrypoint, ".py");
  const bool as_path = entrypoint.find('/') != std::string::npos;
  // Relative to the spec's folder, which may sit below the snapshot's root (../train.py).
  const std::string wanted =
      (std::filesystem::path(code_subdir) / entrypoint).lexically_normal().string();
  const ShippedFile* shipped = nullptr;
  bool directory = false;
  for (const ShippedFile& f : files) {
    if (f.path == wanted) shipped = &f;
    if (StartsWith(f.path, wanted + "/")) directory = true;
  }
  if (entrypoint[0] != '/') {
    if (wanted == ".." || StartsWith(wanted, "../"))
      return InvalidArgument(fmt::format(
          "run.entrypoint: '{}' leaves the code directory sent with the run (it is relative to "
          "the spec's folder); move the script into the code directory",
          entrypoint));
    if (!shipped && directory)
      return InvalidArgument(fmt::format(
          "run.entrypoint: '{}' is a directory of the code; name the script in it", entrypoint));
    if (shipped && !python && (shipped->mode & 0111) == 0)
      return InvalidArgument(fmt::format(
          "run.entrypoint: '{}' is not executable (mode {:04o}); `chmod +x` it, or make its "
          "interpreter the entrypoint (bash) and the script run.args",
          entrypoint, shipped->mode));
    if (!shipped && (python || as_path))
      return InvalidArgument(fmt::format(
          "run.entrypoint: '{}' is not among the {} file(s) of the code directory sent with the "
          "run; check the path (relative to the directory of the spec) and .tauignore",
          entrypoint, files.size()));
  }
  if (!spec.runtime.pip.empty()) return Status::Ok();
  std::string path_value = system_path;
  for (const spec::EnvVar& var : spec.runtime.env)
    if (var.name == "PATH" && !var.secret_ref) path_value = var.value;
  spec::RunSpec shaped = spec;  // as launched: a compute profile may give the GPUs
  shaped.compute.gpus = gpus_per_worker;
  if (spec.kind == spec::WorkloadKind::kJob && spec::UsesTorchrun(shaped) &&
      !OnPath("torchrun", path_value))
    return InvalidArgument(fmt::format(
        "compute.gpus: {} GPUs per worker are launched with torchrun (one process per GPU), "
        "which is not on the run's PATH; install PyTorch there, list torch in runtime.pip, or ask "
        "for one GPU per worker",
        shaped.compute.gpus));
  if (!shipped && !as_path && !python && entrypoint[0] != '/' && !OnPath(entrypoint, path_value))
    return InvalidArgument(fmt::format(
        "run.entrypoint: '{}' is neither a file of the code nor a command on the run's PATH; "
        "check the name, ship the script with the code, or install the command",
        entrypoint));
  return Status::Ok();
}

}  // namespace tau::runtime
