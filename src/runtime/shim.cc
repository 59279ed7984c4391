#include "runtime/runtime.h"
