// Stack dumps of a stalled attempt's Python workers (docs/budgets.md, "Idle and stalled runs").
#include <signal.h>

#include <string>
#include <string_view>

#include "common/files.h"
#include "common/strings.h"
#include "runtime/proc.h"
#include "runtime/runtime.h"

namespace tau::runtime {
namespace {

// Whether /proc/PID/status says the process catches `sig` (its SigCgt mask): sending it to one
// that does not would run the default action, which ends most processes.
bool Catches(int pid, int sig) {
  auto text = ReadFile("/proc/" + std::to_string(pid) + "/status");
  if (!text.ok()) return false;
  size_t at = text->find("\nSigCgt:");
  if (at == std::string::npos) return false;
  unsigned long long mask = std::strtoull(text->c_str() + at + 8, nullptr, 16);
  return (mask >> (sig - 1)) & 1;
}

// Whether the process runs a Python interpreter (argv[0] is python, python3, python3.11, ...; a
// script with a python shebang, torchrun's, has the interpreter as argv[0] too).
bool RunsPython(int pid) {
  auto text = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  if (!text.ok() || text->empty()) return false;
  std::string_view argv0(text->c_str());
  size_t slash = argv0.rfind('/');
  if (slash != std::string_view::npos) argv0.remove_prefix(slash + 1);
  return StartsWith(argv0, "python");
}

}  // namespace

int DumpPythonStacks(const std::string& attempt_dir) {
  const std::string marker = std::string(internal::kAttemptMarker) + "=" + attempt_dir;
  int asked = 0;
  for (int pid : internal::ListPids()) {
    if (!internal::EnvironHas(pid, marker) || !RunsPython(pid) || !Catches(pid, SIGUSR1)) continue;
    if (::kill(pid, SIGUSR1) == 0) ++asked;
  }
  return asked;
}

const std::string& PythonHookSource() {
  static const auto* source = new std::string(
      R"(# Written by tau (docs/budgets.md, "Idle and stalled runs"). On SIGUSR1 a worker writes every
# thread's stack to its standard error, its log: tau sends it to a run whose output stopped.
import faulthandler as _tau_faulthandler
import signal as _tau_signal

try:
    _tau_faulthandler.register(_tau_signal.SIGUSR1, all_threads=True, chain=False)
except (AttributeError, ValueError, RuntimeError, OSError):
    pass


def _tau_next_sitecustomize():
    # The sitecustomize this one hides (the distribution's, the user's) still runs.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _tau_next_sitecustomize()
except Exception as _tau_error:  # a broken one must not stop the run: Python would only warn
    import sys as _tau_sys

    print("tau: sitecustomize: %s" % (_tau_error,), file=_tau_sys.stderr)
)");
  return *source;
}

}  // namespace tau::runtime
