#include "common/version.h"

namespace tau {

const char* Version() { return TAU_VERSION; }

}  // namespace tau
