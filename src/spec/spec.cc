#include "spec/spec.h"
