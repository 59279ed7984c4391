#!/usr/bin/env bash
# Installs dependencies, builds everything and runs the whole test suite, then the tests again under
# ThreadSanitizer and a short fuzzing pass.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-helm.sh || echo "helm not fetched: tests/integration/test_helm_chart.py will be skipped"
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
# Clang's thread-safety analysis over src/ (docs/architecture.md, "Locking"), as an error.
python3 scripts/check_thread_safety.py --build build
# The unit and integration tests again, built with ThreadSanitizer (scripts/tsan.sh,
# docs/architecture.md, "Locking"); TAU_TSAN=0 skips it.
if [ "${TAU_TSAN:-1}" != 0 ]; then
  scripts/tsan.sh
fi
# A short fuzzing pass over every parser (docs/fuzzing.md); TAU_FUZZ_SECONDS=0 skips it.
if [ "${TAU_FUZZ_SECONDS:-20}" -gt 0 ]; then
  scripts/fuzz.sh "${TAU_FUZZ_SECONDS:-20}"
fi
