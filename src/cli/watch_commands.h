// Live views over the server's event stream (GET /api/v1/events): `tau status RUN --watch` and
// `tau top`.
#pragma once

#include <string>

#include "cli/commands.h"

namespace tau::cli {

// Prints the run's status, then again on each change, until it reaches a terminal state.
int CmdStatusWatch(const Global& g, const std::string& run, Format format);
// A live terminal view of queues, runs and GPUs; q or Ctrl-C quits. `once`: one frame, no ANSI.
int CmdTop(const Global& g, bool once);

}  // namespace tau::cli
