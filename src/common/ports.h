// A free TCP port on the loopback interface, as the kernel hands one out for an ephemeral bind:
// free when asked, so a caller that hands it to another process may still lose it to a race.
#pragma once

namespace tau {

// 0 when no port could be had.
int FreeLoopbackPort();

}  // namespace tau
