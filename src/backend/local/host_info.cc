#include "backend/local/host_info.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/mutex.h"
#include "common/strings.h"

extern char** environ;

namespace tau::server {

namespace {

std::string Hostname() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

std::string ReadOsName() {
  std::ifstream in("/etc/os-release");
  std::string line;
  while (std::getline(in, line)) {
    if (!StartsWith(line, "PRETTY_NAME=")) continue;
    std::string v = line.substr(12);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    return v;
  }
  struct utsname u {};
  return ::uname(&u) == 0 ? u.sysname : "";
}

// Read once: every record wants it, and it changes only with an upgrade (which restarts the
// server).
const std::string& OsName() {
  static const std::string name = ReadOsName();
  return name;
}

std::string Kernel() {
  struct utsname u {};
  return ::uname(&u) == 0 ? fmt::format("{} {}", u.release, u.machine) : "";
}

// The standard output of a program (argv, found on PATH; no shell), "" when it fails. Only for
// the evidence worker: it may take a second (pip freeze).
std::string Capture(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  std::string text;
  if (rc == 0) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  if (rc != 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    return "";
  return text;
}

// `python3 --version`, asked at most once a minute: every run's record wants it, and on a machine
// with pyenv shims it costs tens of milliseconds of CPU.
std::string SystemPythonVersion() {
  static Mutex mu;
  static std::string version TAU_GUARDED_BY(mu);
  static int64_t asked_ms TAU_GUARDED_BY(mu) = -1;
  MutexLock lock(&mu);
  int64_t now = MonotonicMillis();
  if (asked_ms < 0 || now - asked_ms > 60'000) {
    version = Capture({"python3", "--version"});
    asked_ms = now;
  }
  return version;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& l : Split(text, '\n'))
    if (!Trim(l).empty()) out.emplace_back(Trim(l));
  return out;
}

// The interpreter's version, and the packages installed in the run's virtualenv when its spec asks
// for pip requirements: the shim keys its venv cache by the sorted requirements and `python3
// --version` (runtime/shim.cc, EnsureVenv), so the same key finds the venv the run used.
void FillPython(const std::string& venv_cache, const std::vector<std::string>& pip,
                evidence::RuntimeInfo* rt) {
  std::string version = SystemPythonVersion();
  rt->python_version = std::string(Trim(version));
  if (StartsWith(rt->python_version, "Python ")) rt->python_version = rt->python_version.substr(7);
  if (pip.empty() || version.empty()) return;
  std::vector<std::string> sorted = pip;
  std::sort(sorted.begin(), sorted.end());
  std::string key = Sha256Hex(Join(sorted, "\n") + "\n--\n" + version).substr(0, 32);
  char target[4096];
  ssize_t len = ::readlink((venv_cache + "/" + key).c_str(), target, sizeof target - 1);
  if (len <= 0) return;
  std::string dir = venv_cache + "/" + std::string(target, static_cast<size_t>(len));
  rt->packages = Lines(Capture({dir + "/bin/python", "-m", "pip", "freeze"}));
}

}  // namespace

void DescribeThisMachine(const health::GpuInventory& gpus,
                         const std::function<std::string()>& venv_cache,
                         const std::vector<std::string>& pip, bool final_save,
                         const evidence::RecordInput* prev, evidence::RuntimeInfo* rt) {
  rt->host = Hostname();
  rt->os = OsName();
  rt->kernel = Kernel();
  rt->driver_version = gpus.driver_version;
  rt->cuda_version = gpus.cuda_driver_version;
  if (prev) {
    rt->python_version = prev->runtime.python_version;
    rt->packages = prev->runtime.packages;
  }
  // Only a run with pip requirements has a virtualenv to look for.
  if (final_save || rt->python_version.empty()) FillPython(venv_cache(), pip, rt);
}

}  // namespace tau::server
