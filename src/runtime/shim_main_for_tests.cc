// `tau_test_shim __shim DIR` and `tau_test_shim __zygote`: the shim's entry points alone, used as
// the tau binary by runtime_test.
#include <cstdio>
#include <cstring>

#include "runtime/runtime.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "__shim") == 0) return tau::runtime::ShimMain(argv[2]);
  if (argc == 2 && std::strcmp(argv[1], "__zygote") == 0) return tau::runtime::ZygoteMain(argv[1]);
  std::fprintf(stderr, "usage: %s __shim ATTEMPT_DIR | __zygote\n", argv[0]);
  return 2;
}
