#!/usr/bin/env bash
# Configures and builds tau into ./build (tests included unless TAU_BUILD_TESTS=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAU_BUILD_TESTS="${TAU_BUILD_TESTS:-ON}" -DTAU_BUILD_BENCH="${TAU_BUILD_BENCH:-ON}" >/dev/null
cmake --build build -j "$(nproc)"
