// The `tau` command line. Every command except validate, schema, version and server is a thin
// client of the server's REST API; when no server answers on the default socket, the CLI starts one
// in the background so that the first `tau run` on a new machine just works.
#pragma once

namespace tau::cli {

// Exit codes of tau's own failures, apart from a run's own exit status (which `tau run` passes
// through).
inline constexpr int kExitInvalid = 1;  // validation failed, run failed without an exit code
inline constexpr int kExitTauError =
    125;  // tau itself could not do what was asked (like `docker run`)

int Main(int argc, char** argv);

}  // namespace tau::cli
