#!/usr/bin/env bash
# Configures and builds tau into ./build (tests included unless TAU_BUILD_TESTS=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache, where it is installed, makes a rebuild of unchanged files a copy, in this checkout or
# another one (paths are taken relative to the checkout; debug info may then name the checkout
# that compiled the file first).
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
cmake -S . -B build -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAU_WERROR=ON -DTAU_BUILD_TESTS="${TAU_BUILD_TESTS:-ON}" -DTAU_BUILD_BENCH="${TAU_BUILD_BENCH:-ON}" >/dev/null
cmake --build build -j "$(nproc)"
