#!/usr/bin/env python3
"""Benchmark of code upload: what `tau run` costs for a large code directory. Prints one JSON object;
not a test (no pass/fail).

A real server in a temporary TAU_HOME; the code directory holds --files files of random content,
--mib MiB in all, and a start.sh that exits 0. Each figure is the median (and the
spread) of --repeats submissions with `tau run --detach`, one after another, each run left to finish
before the next:

  first_submit_ms      new content every time (every file rewritten): hashing, uploading, storing.
  unchanged_submit_ms  the same directory again: the whole CLI process, from exec to the run's name.
  one_changed_ms       one file rewritten before each submission.
  small_unchanged_ms   the same for a directory of start.sh and tau.yaml only: what a submission
                       costs without the code (unchanged_submit_ms less this is the CLI's walk and
                       hashing plus the server's work directory).

On the local backend a submission's reply waits for the decision pass that starts the run's first
attempt, so each figure includes making the run's work directory from the snapshot (linked or
copied).

The work directory is linked only when the run does not run as root (docs/architecture.md, "Code
snapshots"): run the benchmark as an unprivileged user to measure that path. "work_files" says what
the first run's work directory got.

Usage: bench/code_upload_bench.py [--tau build/bin/tau] [--files 2000] [--mib 60] [--repeats 7]
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

SPEC = ("schema_version: 1\nname: bench\nrun:\n  entrypoint: start.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n")


def stats(ms):
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1),
            "max_ms": round(max(ms), 1)}


def make_project(path, files, total_bytes):
    os.makedirs(path)
    with open(os.path.join(path, "start.sh"), "w") as f:
        f.write('#!/bin/sh\nexit 0\n')
    os.chmod(os.path.join(path, "start.sh"), 0o755)
    with open(os.path.join(path, "tau.yaml"), "w") as f:
        f.write(SPEC)
    per_file = total_bytes // max(files, 1)
    for i in range(files):
        d = os.path.join(path, f"pkg{i // 100:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"m{i:04d}.py"), "wb") as f:
            f.write(os.urandom(per_file))


def rewrite(path, only_one):
    for root, _, names in os.walk(path):
        for name in sorted(names):
            if name.endswith(".py"):
                with open(os.path.join(root, name), "r+b") as f:
                    f.write(os.urandom(16))
                if only_one:
                    return


def wait_done(tau, env, name):
    deadline = time.time() + 60
    while time.time() < deadline:
        out = subprocess.run([tau, "status", name, "-o", "json"], env=env, capture_output=True,
                             text=True).stdout
        if any(s in out for s in ('"Succeeded"', '"Failed"', '"Cancelled"')):
            return
        time.sleep(0.02)


def submit(tau, env, spec_file):
    t = time.perf_counter()
    proc = subprocess.run([tau, "run", "--detach", spec_file], env=env, capture_output=True, text=True)
    ms = (time.perf_counter() - t) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"tau run failed: {proc.stderr}")
    return ms, proc.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tau", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "tau"))
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--mib", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    tau = os.path.abspath(args.tau)
    home = tempfile.mkdtemp(prefix="tau-bench-", dir="/tmp")
    env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent")
    env.pop("TAU_SERVER", None)
    big = os.path.join(home, "big")
    small = os.path.join(home, "small")
    make_project(big, args.files, args.mib << 20)
    make_project(small, 0, 0)
    server = subprocess.Popen([tau, "server", "--home", home, "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = os.path.join(home, "tau.sock")
    for _ in range(1000):
        if os.path.exists(sock):
            break
        time.sleep(0.01)
    result = {"machine": {"cpus": os.cpu_count(), "uid": os.getuid()},
              "code": {"files": args.files, "mib": args.mib}}
    try:
        def series(prepare, spec_dir):
            ms = []
            for _ in range(args.repeats):
                prepare()
                m, name = submit(tau, env, os.path.join(spec_dir, "tau.yaml"))
                ms.append(m)
                wait_done(tau, env, name)
                if "work_files" not in result:
                    probe = os.path.join(home, "runs", name, "work", "pkg00", "m0000.py")
                    if os.path.exists(probe):
                        result["work_files"] = "links" if os.stat(probe).st_nlink > 1 else "copies"
            return ms

        first = series(lambda: rewrite(big, False), big)
        unchanged = series(lambda: None, big)
        one = series(lambda: rewrite(big, True), big)
        series(lambda: None, small)  # its first submission stores its snapshot
        small_unchanged = series(lambda: None, small)
        result["first_submit_ms"] = stats(first)
        result["unchanged_submit_ms"] = stats(unchanged)
        result["one_changed_ms"] = stats(one)
        result["small_unchanged_ms"] = stats(small_unchanged)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
