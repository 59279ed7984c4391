#include <algorithm>
#include <map>

#include "common/strings.h"
#include "recovery/recovery.h"

namespace tau::recovery {
namespace {

constexpr int kMaxPerSignature = 3;

struct Signature {
  const char* name;
  const char* summary;
  std::vector<std::string_view> needles;  // any of them, case-sensitive
};

const std::vector<Signature>& Signatures() {
  static const std::vector<Signature> kSignatures = {
      {"cuda-oom",
       "CUDA out of memory",
       {"CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED"}},
      {"nccl",
       "NCCL error",
       {"NCCL error", "NCCL WARN", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError",
        "ncclRemoteError"}},
      {"nccl-timeout",
       "NCCL collective timed out",
       {"Watchdog caught collective operation timeout", "NCCL timeout", "ProcessGroupNCCL"}},
      {"xid", "GPU Xid error", {"NVRM: Xid", "Xid ("}},
      {"cuda-error", "CUDA error", {"CUDA error:", "cudaError", "CUDA_ERROR_"}},
      {"killed",
       "killed (possibly out of host memory)",
       {"Killed", "Out of memory: Killed process", "oom-kill"}},
      {"segfault", "segmentation fault", {"Segmentation fault", "SIGSEGV", "core dumped"}},
  };
  return kSignatures;
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  std::string out(s.substr(b, e - b + 1));
  if (out.size() > 300) out = out.substr(0, 300) + "...";
  return out;
}

// A Python traceback ends with the exception line: the first unindented line after the frames.
void FindPythonException(const std::vector<std::string>& lines, int rank,
                         std::vector<Evidence>* out) {
  std::string last;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!StartsWith(lines[i], "Traceback (most recent call last):")) continue;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      if (lines[j].empty() || lines[j][0] == ' ' || lines[j][0] == '\t') continue;
      last = Trim(lines[j]);
      i = j;
      break;
    }
  }
  if (!last.empty()) out->push_back({"python-exception", last, rank});
}

// A stack dump (Python's faulthandler, on the SIGUSR1 tau sends a stalled run's workers): each
// thread's header line, then its frames, the most recent first. The evidence is that frame.
void FindStackDumps(const std::vector<std::string>& lines, int rank, std::vector<Evidence>* out) {
  int found = 0;
  for (size_t i = 0; i + 1 < lines.size() && found < kMaxPerSignature; ++i) {
    if (lines[i].find("(most recent call first):") == std::string::npos) continue;
    if (!StartsWith(lines[i + 1], "  File \"")) continue;
    out->push_back({"stack-dump", Trim(lines[i + 1]), rank});
    ++found;
  }
}

}  // namespace

Diagnosis Diagnose(const std::vector<std::string>& logs) {
  Diagnosis d;
  std::map<std::string, int> counts;
  std::vector<std::string> summaries;
  for (size_t rank = 0; rank < logs.size(); ++rank) {
    std::vector<std::string> lines = Split(logs[rank], '\n');
    for (const std::string& line : lines) {
      for (const Signature& sig : Signatures()) {
        bool hit = std::any_of(sig.needles.begin(), sig.needles.end(), [&](std::string_view n) {
          return line.find(n) != std::string::npos;
        });
        if (!hit || counts[sig.name] >= kMaxPerSignature) continue;
        if (counts[sig.name]++ == 0)
          summaries.push_back(std::string(sig.summary) + " (rank " + std::to_string(rank) + ")");
        d.evidence.push_back({sig.name, Trim(line), static_cast<int>(rank)});
        break;  // one signature per line: the most specific comes first
      }
    }
    FindPythonException(lines, static_cast<int>(rank), &d.evidence);
    FindStackDumps(lines, static_cast<int>(rank), &d.evidence);
  }
  if (summaries.empty()) {
    for (const Evidence& e : d.evidence) {
      if (e.signature == "python-exception") {
        summaries.push_back(e.line + " (rank " + std::to_string(e.rank) + ")");
        break;
      }
    }
  }
  if (summaries.empty()) {
    for (const Evidence& e : d.evidence) {
      if (e.signature == "stack-dump") {
        summaries.push_back("stack dump, in " + e.line + " (rank " + std::to_string(e.rank) + ")");
        break;
      }
    }
  }
  d.summary = Join(summaries, "; ");
  return d;
}

}  // namespace tau::recovery
