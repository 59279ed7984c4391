// What the harnesses share: an invariant check that the fuzzer sees as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

// A broken invariant aborts with the condition, so libFuzzer records the input as a crash and the
// report says which property failed.
#define TAU_FUZZ_CHECK(cond)                                                            \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
