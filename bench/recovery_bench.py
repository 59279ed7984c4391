#!/usr/bin/env python3
"""Recovery latency of the local backend: from a failed attempt's exit to the next attempt's start, minus the
configured backoff. Prints JSON; not a test.

Each run's first attempt records $EPOCHREALTIME and exits 1; the retry (retry_on: [UserError]) records its
start. Runs are submitted in waves of --parallel.

Usage: bench/recovery_bench.py [--tau build/bin/tau] [--runs 60] [--backoff-ms 200] [--parallel 4]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPT = """#!/bin/bash
if [ "$TAU_ATTEMPT" = "1" ]; then echo "fail $EPOCHREALTIME" >> "$TAU_OUTPUT_DIR/ledger"; exit 1; fi
echo "start $EPOCHREALTIME" >> "$TAU_OUTPUT_DIR/ledger"
"""


def pct(values, p):
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tau", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "tau"))
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--backoff-ms", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()
    tau = os.path.abspath(args.tau)
    home = tempfile.mkdtemp(prefix="tau-rbench-", dir="/tmp")
    env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent")
    env.pop("TAU_SERVER", None)
    proj = os.path.join(home, "proj")
    os.makedirs(proj)
    with open(os.path.join(proj, "run.sh"), "w") as f:
        f.write(SCRIPT)
    os.chmod(os.path.join(proj, "run.sh"), 0o755)
    with open(os.path.join(proj, "tau.yaml"), "w") as f:
        f.write("schema_version: 1\nname: rbench\nrun:\n  entrypoint: run.sh\n  workload_kind: job\n"
                f"resilience:\n  max_retries: 1\n  retry_on: [UserError]\n"
                f"  backoff_initial: {args.backoff_ms}ms\n  backoff_max: {args.backoff_ms}ms\n")
    server = subprocess.Popen([tau, "server", "--home", home, "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(500):
        if os.path.exists(os.path.join(home, "tau.sock")):
            break
        time.sleep(0.01)
    latencies = []
    try:
        for wave in range(0, args.runs, args.parallel):
            names = [subprocess.run([tau, "run", "-d", os.path.join(proj, "tau.yaml")], env=env,
                                    capture_output=True, text=True, check=True).stdout.strip()
                     for _ in range(min(args.parallel, args.runs - wave))]
            for name in names:
                ledger = os.path.join(home, "runs", name, "output", "ledger")
                deadline = time.time() + 60
                while time.time() < deadline:
                    try:
                        lines = open(ledger).read().split("\n")
                    except FileNotFoundError:
                        lines = []
                    entries = dict(l.split() for l in lines if l.strip())
                    if "fail" in entries and "start" in entries:
                        gap_ms = (float(entries["start"]) - float(entries["fail"])) * 1000
                        latencies.append(gap_ms - args.backoff_ms)
                        break
                    time.sleep(0.01)
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["pkill", "-9", "-f", home], check=False)
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps({
        "recovery_latency_minus_backoff": {
            "n": len(latencies), "backoff_ms": args.backoff_ms, "parallel": args.parallel,
            "p50_ms": round(pct(latencies, 50), 2), "p90_ms": round(pct(latencies, 90), 2),
            "p99_ms": round(pct(latencies, 99), 2), "min_ms": round(min(latencies), 2),
            "max_ms": round(max(latencies), 2), "mean_ms": round(statistics.mean(latencies), 2)},
        "machine": {"cpus": os.cpu_count()}}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
