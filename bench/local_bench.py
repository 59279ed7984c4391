#!/usr/bin/env python3
"""Benchmarks of the local backend. Prints one JSON object; not a test (no pass/fail).

  submit_to_start   `tau run --detach` of a trivial run, 100 times one after another: from just before the
                    CLI starts to the moment the run's entrypoint runs (a sh script that runs `date`).
  throughput        500 trivial runs submitted through the API by 4 client threads: runs finished per second,
                    from the first submission to the last run's Succeeded.
  cold_start        `tau version`, 200 times: wall time of the whole process.

Usage: bench/local_bench.py [--tau build/bin/tau] [--runs 100] [--throughput-runs 500]
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def percentile(values, p):
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summary(ms):
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 2), "p90_ms": round(percentile(ms, 90), 2),
            "p99_ms": round(percentile(ms, 99), 2), "min_ms": round(min(ms), 2), "max_ms": round(max(ms), 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tau", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "tau"))
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--throughput-runs", type=int, default=500)
    ap.add_argument("--cold-starts", type=int, default=200)
    args = ap.parse_args()
    tau = os.path.abspath(args.tau)
    home = tempfile.mkdtemp(prefix="tau-bench-", dir="/tmp")
    env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent")
    env.pop("TAU_SERVER", None)
    proj = os.path.join(home, "proj")
    os.makedirs(proj)
    with open(os.path.join(proj, "start.sh"), "w") as f:
        # sh and date, not bash's $EPOCHREALTIME: bash spends ~8 ms loading locales before the first line.
        f.write('#!/bin/sh\ndate +%s.%N > "$TAU_OUTPUT_DIR/start"\n')
    os.chmod(os.path.join(proj, "start.sh"), 0o755)
    spec = ("schema_version: 1\nname: bench\nrun:\n  entrypoint: start.sh\n  workload_kind: job\n"
            "compute:\n  gpus: 0\n")
    with open(os.path.join(proj, "tau.yaml"), "w") as f:
        f.write(spec)
    server = subprocess.Popen([tau, "server", "--home", home, "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = os.path.join(home, "tau.sock")
    for _ in range(500):
        if os.path.exists(sock):
            break
        time.sleep(0.01)
    result = {"machine": {"cpus": os.cpu_count()}}
    try:
        # Cold start of the CLI.
        ms = []
        for _ in range(args.cold_starts):
            t = time.perf_counter()
            subprocess.run([tau, "version"], stdout=subprocess.DEVNULL, check=True)
            ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        for _ in range(args.cold_starts):
            subprocess.run(["/bin/true"], check=True)
        true_ms = (time.perf_counter() - t) * 1000 / args.cold_starts
        result["cold_start_tau_version"] = summary(ms)
        result["cold_start_tau_version"]["bin_true_mean_ms"] = round(true_ms, 2)

        # Submit-to-start latency through the CLI, one run at a time.
        lat = []
        for _ in range(args.runs):
            t0 = time.time()
            name = subprocess.run([tau, "run", "--detach", os.path.join(proj, "tau.yaml")], env=env,
                                  capture_output=True, text=True, check=True).stdout.strip()
            start_file = os.path.join(home, "runs", name, "output", "start")
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    with open(start_file) as f:
                        content = f.read().strip()
                    if content:
                        lat.append((float(content) - t0) * 1000)
                        break
                except FileNotFoundError:
                    pass
                time.sleep(0.0005)
        result["submit_to_start_cli"] = summary(lat)

        # Throughput through the API.
        body = json.dumps({"spec": {"file": "tau.yaml", "yaml": spec},
                           "code": {"files": [{"path": "start.sh", "mode": 493,
                                               "data": "IyEvYmluL3NoCmV4aXQgMAo="}]}})
        names, lock = [], threading.Lock()
        per_thread = args.throughput_runs // 4

        def submitter():
            conn = UnixConnection(sock)
            for _ in range(per_thread):
                conn.request("POST", "/api/v1/runs", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = json.loads(resp.read())
                with lock:
                    names.append(data["run"]["name"])

        t0 = time.perf_counter()
        threads = [threading.Thread(target=submitter) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        submitted_s = time.perf_counter() - t0
        conn = UnixConnection(sock)
        while True:
            conn.request("GET", "/api/v1/runs?active=1&limit=1")
            active = json.loads(conn.getresponse().read())["total"]
            if active == 0:
                break
            time.sleep(0.005)
        total_s = time.perf_counter() - t0
        conn.request("GET", "/api/v1/runs?state=Succeeded&limit=1")
        succeeded = json.loads(conn.getresponse().read())["total"]
        result["throughput_api"] = {
            "runs": len(names), "succeeded_total": succeeded, "seconds": round(total_s, 3),
            "runs_per_s": round(len(names) / total_s, 1),
            "submissions_per_s": round(len(names) / submitted_s, 1)}
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["pkill", "-9", "-f", home], check=False)
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
