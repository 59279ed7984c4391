// `tau_test_shim __shim DIR`: the shim entry point alone, used as the tau binary by runtime_test.
#include <cstdio>
#include <cstring>

#include "runtime/runtime.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "__shim") == 0) return tau::runtime::ShimMain(argv[2]);
  std::fprintf(stderr, "usage: %s __shim ATTEMPT_DIR\n", argv[0]);
  return 2;
}
