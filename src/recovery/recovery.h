// Recovery helpers that are pure policy over files: the checkpoint protocol.
//
// Checkpoint protocol (what a job must do so that a retried attempt resumes from a complete
// checkpoint): write each checkpoint inside $TAU_CHECKPOINT_DIR under a temporary name (ending in
// .tmp, .partial or .incomplete, or starting with '.'), make it durable (fsync), then rename it to
// its final name. A rename is atomic, so anything under a final name is complete. A checkpoint that
// is a directory is complete once it holds a file named COMPLETE (write it last). The next attempt
// gets TAU_RESUME_FROM = the newest complete checkpoint (by modification time, then name); a
// half-written one is never offered.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tau::recovery {

// One line of a failed attempt's log that matches a known failure signature.
struct Evidence {
  std::string
      signature;     // "cuda-oom", "nccl", "xid", "killed", "segfault", "python-exception", ...
  std::string line;  // the log line, trimmed
  int rank = 0;
};

// What a failed attempt's logs say, in a few lines: the evidence that matches known signatures
// (CUDA out of memory, NCCL errors and timeouts, Xid lines, "Killed", segmentation faults, the
// exception line that ends a Python traceback, the innermost frame of each thread of a stack
// dump), at most a few lines per signature, in log order.
struct Diagnosis {
  std::vector<Evidence> evidence;
  std::string
      summary;  // one line for people: "CUDA out of memory (rank 0)", or "" when nothing matched
};

// Scans the tail of each rank's log (`logs[r]` is rank r's text).
Diagnosis Diagnose(const std::vector<std::string>& logs);

// The newest complete checkpoint in `dir` (absolute path), or "" when there is none.
std::string NewestCompleteCheckpoint(const std::string& dir);

// Why `path` (inside the checkpoint directory `dir`, both canonical) is not a complete checkpoint
// by the protocol above, or "" when it is: a part of it under a temporary name, or a checkpoint
// directory without COMPLETE. `tau resume --from` refuses what this names.
std::string IncompleteCheckpointReason(const std::string& dir, const std::string& path);

}  // namespace tau::recovery
