#!/usr/bin/env bash
# Builds the libFuzzer harnesses (./build-fuzz, clang-14 with ASan and UBSan) and runs each for
# SECONDS (default 30) on a copy of its committed seed corpus, so runs never change fuzz/corpus/.
# Fails when any harness finds a crash, hang, leak, out-of-memory or broken invariant; the inputs
# that did are kept in build-fuzz/artifacts/. docs/fuzzing.md says more.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]     HARNESS: spec platform quantity api_json simulate http
#                                             workflow sweep
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(spec platform quantity api_json simulate http workflow sweep)

# ccache as in scripts/build.sh: a second fuzz build of unchanged files is a copy.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
cmake -S . -B build-fuzz -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="${TAU_FUZZ_CC:-clang-14}" -DCMAKE_CXX_COMPILER="${TAU_FUZZ_CXX:-clang++-14}" \
  -DTAU_FUZZ=ON -DTAU_WERROR=ON -DTAU_BUILD_TESTS=OFF -DTAU_BUILD_BENCH=OFF >/dev/null
targets=()
for h in "${harnesses[@]}"; do targets+=("${h}_fuzz"); done
cmake --build build-fuzz -j "${TAU_FUZZ_JOBS:-$(nproc)}" --target "${targets[@]}"

artifacts="$PWD/build-fuzz/artifacts"
mkdir -p "$artifacts"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A stack trace for UB (the build already aborts on the first report).
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

failed=()
for h in "${harnesses[@]}"; do
  cp -r "fuzz/corpus/$h" "$work/$h"
  dict=()
  [ -f "fuzz/$h.dict" ] && dict=(-dict="fuzz/$h.dict")
  log="$work/$h.log"
  echo "== ${h}_fuzz for ${seconds}s"
  # -timeout: a single input that takes 10 s is a hang (the slowest seed takes well under 1 s).
  # -rss_limit_mb: libFuzzer's default; said here because a blow-up is a finding.
  if build-fuzz/fuzz/"${h}_fuzz" "$work/$h" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/$h-" >"$log" 2>&1; then
    # The last status line (execs, coverage, corpus) and the totals.
    grep -E '^#[0-9]+' "$log" | tail -1 || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
  else
    tail -60 "$log"
    echo "!! ${h}_fuzz failed; the input is in $artifacts/" >&2
    failed+=("$h")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzzing: no findings in ${harnesses[*]} (${seconds}s each)"
