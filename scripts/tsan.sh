#!/usr/bin/env bash
# Builds tau with ThreadSanitizer (./build-tsan: clang-14, -DTAU_TSAN=ON, tests, no benchmarks) and
# runs the tests under it: the C++ unit tests and the Python integration suites, which drive the
# real `tau` server, its zygote and supervisors, the CLI and the fake API server, all built with
# TSan. Fails on any TSan report from any of those processes: every one writes its reports to
# build-tsan/tsan-logs/tsan.PID (TSAN_OPTIONS log_path), because a server started by the
# integration harness logs into a TAU_HOME the test deletes and its exit status is read by nobody;
# a report also stops the process at once with status 66. docs/architecture.md ("Locking") says
# more.
#
#   scripts/tsan.sh [CTEST_REGEX]    only the CTest tests matching CTEST_REGEX (default: see below)
set -euo pipefail
cd "$(dirname "$0")/.."

# The tests run, as a CTest regular expression: every unit test and every integration suite. What
# is left out, and why, is in `excluded` below.
tests="${1:-.}"
# Not run under TSan: the layering and thread-safety-analysis checks (Python and clang
# -fsyntax-only, nothing of ours runs; the normal ctest runs them), and TSan's own tests, which the
# script runs first, apart.
excluded='^(layering|layering_check_test|thread_safety_.*|tsan_.*)$'

# clang-14's TSan maps its shadow memory at fixed addresses that a kernel with more address-space
# randomisation than 28 bits (vm.mmap_rnd_bits, 32 on recent distribution kernels) can collide
# with ("FATAL: ThreadSanitizer: unexpected memory mapping"). Without randomisation it always fits;
# children inherit the setting. Checked first, so that the script starts over with nothing done.
if [ -z "${TAU_TSAN_NO_ASLR:-}" ] && [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)" -gt 28 ]; then
  echo "tsan: vm.mmap_rnd_bits > 28, running without address-space randomisation (setarch -R)"
  TAU_TSAN_NO_ASLR=1 exec setarch "$(uname -m)" -R "$0" "$@"
fi

# ccache as in scripts/build.sh: a second TSan build of unchanged files is a copy.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
cmake -S . -B build-tsan -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="${TAU_TSAN_CC:-clang-14}" -DCMAKE_CXX_COMPILER="${TAU_TSAN_CXX:-clang++-14}" \
  -DTAU_TSAN=ON -DTAU_WERROR=ON -DTAU_BUILD_TESTS=ON -DTAU_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j "${TAU_TSAN_JOBS:-$(nproc)}"

logs="$PWD/build-tsan/tsan-logs"
rm -rf "$logs"
mkdir -p "$logs"
# halt_on_error: the first report ends the process (status 66: exitcode), so a unit test fails at
# once and a server under an integration test dies. second_deadlock_stack: both stacks of a lock
# order inversion. log_path: each process's reports in a file of its own, which the checks below
# look for (TSan creates it only when it has something to say).
tsan_options() {
  echo "halt_on_error=1:second_deadlock_stack=1:exitcode=66:log_path=$1/tsan:suppressions=$PWD/scripts/tsan.supp${TAU_TSAN_EXTRA_OPTIONS:+:$TAU_TSAN_EXTRA_OPTIONS}"
}

# Prints the reports TSan wrote under $1 and returns 1, or returns 0 when there are none.
check_reports() {
  local found=("$1"/tsan.*)
  [ -e "${found[0]}" ] || return 0
  for f in "${found[@]}"; do
    echo "== $f"
    cat "$f"
  done
  return 1
}

# First TSan's own test (tests/thread_safety/race.cc): the race-free program must pass with no
# report, and its copy with the deliberate race must stop with status 66 and leave a data-race
# report where the checks below look. Otherwise the step could pass without seeing anything.
self="$(mktemp -d)"
trap 'rm -rf "$self"' EXIT
rc=0
TSAN_OPTIONS="$(tsan_options "$self")" build-tsan/tests/tau_tsan_race_free || rc=$?
if [ "$rc" -ne 0 ] || ! check_reports "$self"; then
  echo "!! tsan: the race-free test program failed (status $rc)" >&2
  exit 1
fi
rc=0
TSAN_OPTIONS="$(tsan_options "$self")" build-tsan/tests/tau_tsan_racy || rc=$?
if [ "$rc" -ne 66 ] || ! grep -q "WARNING: ThreadSanitizer: data race" "$self"/tsan.* 2>/dev/null; then
  echo "!! tsan: the deliberate race in tests/thread_safety/race.cc went unreported (status $rc)" >&2
  exit 1
fi
echo "tsan: the deliberate race is reported (status 66, a report in the log directory)"

TSAN_OPTIONS="$(tsan_options "$logs")"
export TSAN_OPTIONS
rc=0
ctest --test-dir build-tsan --output-on-failure -j "${TAU_TSAN_JOBS:-$(nproc)}" --timeout 1500 \
  -R "$tests" -E "$excluded" || rc=$?
if ! check_reports "$logs"; then
  echo "!! tsan: ThreadSanitizer reported the problems above" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "!! tsan: tests failed under ThreadSanitizer (and left no report)" >&2
  exit 1
fi
echo "tsan: no reports"
