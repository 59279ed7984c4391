#!/usr/bin/env bash
# tau against a real NVIDIA GPU: the driver's NVML, the CUDA driver's active probe, the GPU
# quickstart end to end (placement, CUDA_VISIBLE_DEVICES, metrics, evidence), the refusal of a run
# that asks for more GPUs than the machine has, and the dcgm-exporter lines of /metrics.
#
#   scripts/device-check.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR holds `tau` (and, optionally, `health_bench`); default build/bin. Each step prints a
# `=== step` header and `rc=N`; the script goes on after a failed step and exits 1 if any failed.
# Needs: an NVIDIA driver, python3 with torch (for the quickstart), curl. Takes about two minutes.
set -u
cd "$(dirname "$0")/.."
BIN=$(cd "${1:-build/bin}" && pwd)
OUT=${2:-/tmp/tau-device-check}
mkdir -p "$OUT"
export PATH="$BIN:$PATH"
TAU_HOME=$(mktemp -d /tmp/tau-device-home.XXXXXX)
export TAU_HOME
failed=0
step() { echo; echo "=== $*"; }
check() {  # check NAME CMD...: run, print rc, remember failures
  local name=$1
  shift
  "$@"
  local rc=$?
  echo "rc=$rc ($name)"
  [ "$rc" -eq 0 ] || failed=1
}

step machine
nvidia-smi --query-gpu=index,name,driver_version,memory.total,ecc.mode.current --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
uname -r

step tau version
check version tau version

step "health check (NVML)"
check health tau health check
tau health check -o json >"$OUT/health.json"

step "health check --active (CUDA driver probe)"
check health-active tau health check --active -o json
tau health check --active -o json >"$OUT/health-active.json" 2>&1

if [ -x "$BIN/health_bench" ]; then
  step "health_bench --real (polling cost on the driver's NVML)"
  check health-bench "$BIN/health_bench" 500 --real
fi

step "NVML entry points: cost of each call of the polling pass"
check nvml-call-costs python3 scripts/nvml-call-costs.py 10

step "gpu-quickstart: tau run (starts the local server)"
(cd examples/gpu-quickstart && timeout 600 tau run tau.yaml)
echo "rc=$? (gpu-quickstart)"
run=$(tau list --all -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["name"])')
echo "run: $run"
check describe tau describe "$run"
tau describe "$run" -o json >"$OUT/describe.json"
check succeeded python3 - "$OUT/describe.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
run = d.get("run", d)
state = run.get("state") or run.get("phase")
print("state:", state)
sys.exit(0 if state == "Succeeded" else 1)
EOF
check logs-name-gpu sh -c "tau logs '$run' | grep -E 'GPU: .*H|GPU: .*NVIDIA'"
check metrics tau metrics "$run"
check evidence tau evidence "$run" -o json
tau evidence "$run" -o json >"$OUT/evidence.json"
check gpus tau gpus

step "a run asking for more GPUs than the machine has is refused"
spec=$(mktemp -d)
cp examples/gpu-quickstart/train.py "$spec/"
sed 's/gpus: 1/gpus: 64/' examples/gpu-quickstart/tau.yaml >"$spec/tau.yaml"
(cd "$spec" && timeout 60 tau run --detach tau.yaml) >"$OUT/too-many.txt" 2>&1
rc=$?
cat "$OUT/too-many.txt"
echo "rc=$rc (too-many: a refusal is a non-zero exit)"
[ "$rc" -ne 0 ] || failed=1

step "/metrics: GPU lines in dcgm-exporter's names"
curl -s --unix-socket "$TAU_HOME/tau.sock" http://localhost/metrics >"$OUT/metrics.txt"
check dcgm-lines grep -E '^DCGM_FI_DEV_(GPU_TEMP|POWER_USAGE|FB_USED)' "$OUT/metrics.txt"

pkill -f -- "--home=$TAU_HOME" || true
echo
echo "device-check: $([ $failed -eq 0 ] && echo PASSED || echo FAILED)"
exit $failed
