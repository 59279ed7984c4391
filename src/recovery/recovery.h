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

namespace tau::recovery {

// The newest complete checkpoint in `dir` (absolute path), or "" when there is none.
std::string NewestCompleteCheckpoint(const std::string& dir);

}  // namespace tau::recovery
