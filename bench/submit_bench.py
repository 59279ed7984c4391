#!/usr/bin/env python3
"""Submission benchmark (issue #26, item 4; #23's arrays). Prints one JSON object; not a test.

  batch_api        POST /api/v1/runs/batch of N trivial runs sharing one code, N in --batch-sizes,
                   --repeats times each, a fresh server (and home) for each: the durable runs/s of
                   each request (the answer comes once every run is committed and fsynced), their
                   median
  array_cli        `tau run --array 0-(M-1) --detach` (M = --array-size), the whole process from
                   start to exit, --repeats times on fresh servers: its wall time, the median
  serial_loop      a shell loop of --loop-runs `tau run --detach` one after another against a running
                   server, and the same loop of task-spooler's `tsp true`, in alternating pairs
                   (--pairs of them) in the same sitting: submissions/s and ms per submission of
                   each, their medians. tsp is Debian's task-spooler (apt-get install task-spooler);
                   without it this part says so and is skipped. The same pairs also time a loop of
                   `true` and of `tau version` (a process that starts and exits and does nothing
                   else): the floor a one-process-per-submission client stands on.

Usage: bench/submit_bench.py [--tau build/bin/tau] [--batch-sizes 1000,5000] [--repeats 3]
                             [--array-size 1000] [--loop-runs 200] [--pairs 3]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_bench import UnixConnection  # noqa: E402  (the API over its Unix socket)

SPEC = ("schema_version: 1\nname: sub\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n")
SCRIPT = "#!/bin/sh\nexit 0\n"


class Server:
    def __init__(self, tau):
        self.home = tempfile.mkdtemp(prefix="tau-sub-", dir="/tmp")
        self.env = dict(os.environ, TAU_HOME=self.home, TAU_NVML_LIBRARY="/nonexistent",
                        XDG_CACHE_HOME=self.home + "-cache")
        self.env.pop("TAU_SERVER", None)
        self.proc = subprocess.Popen([tau, "server", "--home", self.home, "--quiet"],
                                     env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.sock = os.path.join(self.home, "tau.sock")
        for _ in range(2000):
            if os.path.exists(self.sock):
                break
            time.sleep(0.01)
        self.project = os.path.join(self.home + "-code")
        os.makedirs(self.project)
        with open(os.path.join(self.project, "tau.yaml"), "w") as f:
            f.write(SPEC)
        with open(os.path.join(self.project, "main.sh"), "w") as f:
            f.write(SCRIPT)
        os.chmod(os.path.join(self.project, "main.sh"), 0o755)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for d in (self.home, self.home + "-cache", self.project):
            shutil.rmtree(d, ignore_errors=True)


def batch_rate(tau, n):
    server = Server(tau)
    try:
        code = {"files": [{"path": "main.sh", "mode": 0o755, "data": "IyEvYmluL3NoCmV4aXQgMAo="}]}
        spec = {"file": "tau.yaml", "yaml": SPEC}
        body = json.dumps({"codes": [code],
                           "runs": [{"spec": spec, "code": 0} for _ in range(n)]})
        conn = UnixConnection(server.sock)
        t = time.perf_counter()
        conn.request("POST", "/api/v1/runs/batch", body, {"Content-Type": "application/json"})
        res = conn.getresponse()
        reply = res.read()
        elapsed = time.perf_counter() - t
        if res.status != 201:
            raise RuntimeError(f"batch: HTTP {res.status}: {reply[:300]}")
        if len(json.loads(reply)["runs"]) != n:
            raise RuntimeError("batch: the reply lacks runs")
        return n / elapsed
    finally:
        server.stop()


def array_wall(tau, m):
    server = Server(tau)
    try:
        t = time.perf_counter()
        p = subprocess.run([tau, "run", "--array", f"0-{m - 1}", "--detach",
                            os.path.join(server.project, "tau.yaml")],
                           env=server.env, capture_output=True, text=True)
        elapsed = time.perf_counter() - t
        if p.returncode != 0 or len(p.stdout.split()) != m:
            raise RuntimeError(f"tau run --array: {p.returncode}: {p.stderr[:300]}")
        return elapsed
    finally:
        server.stop()


def shell_loop(command, n, env):
    """Seconds for a shell loop running `command` n times, one after another."""
    script = f'i=0; while [ $i -lt {n} ]; do {command} >/dev/null || exit 1; i=$((i+1)); done'
    t = time.perf_counter()
    subprocess.run(["sh", "-c", script], env=env, check=True)
    return time.perf_counter() - t


def serial_loops(tau, n, pairs):
    tsp = shutil.which("tsp")
    if tsp is None:
        return {"skipped": "task-spooler's tsp is not installed (apt-get install task-spooler)"}
    server = Server(tau)
    tsp_dir = tempfile.mkdtemp(prefix="tau-tsp-")
    tsp_env = dict(os.environ, TS_SOCKET=os.path.join(tsp_dir, "socket"), TS_MAXFINISHED="100000",
                   TMPDIR=tsp_dir)
    spec = os.path.join(server.project, "tau.yaml")
    tau_s, tsp_s, true_s, version_s = [], [], [], []
    true = shutil.which("true")
    try:
        subprocess.run([tau, "run", "--detach", spec], env=server.env, check=True,
                       capture_output=True)  # the digest cache is warm, as in a loop
        for _ in range(pairs):
            tau_s.append(shell_loop(f"{tau} run --detach {spec}", n, server.env))
            tsp_s.append(shell_loop(f"{tsp} true", n, tsp_env))
            true_s.append(shell_loop(true, n, tsp_env))
            version_s.append(shell_loop(f"{tau} version", n, server.env))
    finally:
        subprocess.run([tsp, "-K"], env=tsp_env, capture_output=True)
        shutil.rmtree(tsp_dir, ignore_errors=True)
        server.stop()

    def summary(seconds):
        return {"per_s": [round(n / s, 1) for s in seconds],
                "ms_per_submission": [round(1000 * s / n, 2) for s in seconds],
                "median_per_s": round(n / statistics.median(seconds), 1),
                "median_ms": round(1000 * statistics.median(seconds) / n, 2)}

    return {"runs_per_loop": n, "pairs": pairs, "tau_run_detach": summary(tau_s),
            "tsp": summary(tsp_s),
            "tau_faster_in_pairs": sum(1 for a, b in zip(tau_s, tsp_s) if a < b),
            "floor": {"true": summary(true_s), "tau_version": summary(version_s)}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tau", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin",
                                                  "tau"))
    ap.add_argument("--batch-sizes", default="1000,5000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--array-size", type=int, default=1000)
    ap.add_argument("--loop-runs", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: batch,array,loop")
    args = ap.parse_args()
    tau = os.path.abspath(args.tau)
    skip = set(filter(None, args.skip.split(",")))
    out = {"cpus": os.cpu_count()}
    if "batch" not in skip:
        out["batch_api"] = {}
        for n in [int(x) for x in args.batch_sizes.split(",")]:
            rates = [batch_rate(tau, n) for _ in range(args.repeats)]
            out["batch_api"][str(n)] = {"runs_per_s": [round(r) for r in rates],
                                        "median_runs_per_s": round(statistics.median(rates))}
    if "array" not in skip:
        walls = [array_wall(tau, args.array_size) for _ in range(args.repeats)]
        out["array_cli"] = {"runs": args.array_size, "wall_s": [round(w, 3) for w in walls],
                            "median_wall_s": round(statistics.median(walls), 3)}
    if "loop" not in skip:
        out["serial_loop"] = serial_loops(tau, args.loop_runs, args.pairs)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
