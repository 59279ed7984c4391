#!/usr/bin/env python3
"""Deep-queue benchmark of the local backend. Prints one JSON object; not a test (no pass/fail).

N runs of `sleep S` (1 CPU each) are submitted through the API at once to a server whose default
platform is this machine (one slot per CPU), and drain. For each depth it reports:

  drain_s / ideal_s   from the first submission to the last run's end, against N * S / slots
  server_cpu_ms_per_run  the server process's CPU time (user + system, /proc) per run, over the drain
  queue_show_ms       GET /api/v1/queues/default?limit=50 (what `tau queue show` asks: the head of
                      the line and the counts) while the queue is deepest, median of 5
  queue_show_all_ms   GET /api/v1/queues/default (every pending run), the same way
  cli_queue_show_ms   `tau queue show default` (the process, its connection and the table), the
                      same way
  queues_ms           GET /api/v1/queues?summary=1 (what `tau queues` asks), the same way

Usage: bench/deep_queue_bench.py [--tau build/bin/tau] [--depths 300,3000] [--sleep 0.05]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from local_bench import UnixConnection  # the API over its Unix socket


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get_ms(sock, path):
    conn = UnixConnection(sock)
    t = time.perf_counter()
    conn.request("GET", path)
    body = conn.getresponse().read()
    return (time.perf_counter() - t) * 1000, len(body)


def one_depth(tau, depth, sleep_s):
    home = tempfile.mkdtemp(prefix="tau-deep-", dir="/tmp")
    env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent")
    env.pop("TAU_SERVER", None)
    server = subprocess.Popen([tau, "server", "--home", home, "--quiet"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = os.path.join(home, "tau.sock")
    try:
        for _ in range(1000):
            if os.path.exists(sock):
                break
            time.sleep(0.01)
        spec = ("schema_version: 1\nname: deep\nrun:\n  entrypoint: sleep\n  workload_kind: job\n"
                f"  args: ['{sleep_s}']\ncompute:\n  gpus: 0\n  cpus: 1\n")
        conn = UnixConnection(sock)
        conn.request("GET", "/api/v1/capacity")
        capacity = json.loads(conn.getresponse().read())
        slots = max(1, capacity.get("cpu_milli_total", 1000) // 1000)
        body = json.dumps({"spec": {"file": "tau.yaml", "yaml": spec}, "code": {"files": []}})
        cpu0 = cpu_seconds(server.pid)
        t0 = time.perf_counter()
        per_thread = [depth // 4 + (1 if i < depth % 4 else 0) for i in range(4)]

        def submitter(n):
            c = UnixConnection(sock)
            for _ in range(n):
                c.request("POST", "/api/v1/runs", body, {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                if r.status not in (200, 201):
                    raise RuntimeError(f"submit: HTTP {r.status}")

        threads = [threading.Thread(target=submitter, args=(n,)) for n in per_thread]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        submitted_s = time.perf_counter() - t0
        show = [get_ms(sock, "/api/v1/queues/default?limit=50") for _ in range(5)]
        show_all = [get_ms(sock, "/api/v1/queues/default") for _ in range(5)]
        cli = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([tau, "queue", "show", "default"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            cli.append((time.perf_counter() - t) * 1000)
        queues = [get_ms(sock, "/api/v1/queues?summary=1") for _ in range(5)]
        while True:
            conn = UnixConnection(sock)
            conn.request("GET", "/api/v1/runs?active=1&limit=1")
            if json.loads(conn.getresponse().read())["total"] == 0:
                break
            time.sleep(0.05)
        drain_s = time.perf_counter() - t0
        cpu = cpu_seconds(server.pid) - cpu0
        ideal = depth * sleep_s / slots
        return {"depth": depth, "slots": slots, "submitted_s": round(submitted_s, 2),
                "drain_s": round(drain_s, 2), "ideal_s": round(ideal, 2),
                "drain_over_ideal": round(drain_s / ideal, 3),
                "server_cpu_s": round(cpu, 2),
                "server_cpu_ms_per_run": round(cpu * 1000 / depth, 2),
                "queue_show_ms": round(statistics.median(ms for ms, _ in show), 2),
                "queue_show_bytes": show[0][1],
                "queue_show_all_ms": round(statistics.median(ms for ms, _ in show_all), 2),
                "queue_show_all_bytes": show_all[0][1],
                "cli_queue_show_ms": round(statistics.median(cli), 2),
                "queues_ms": round(statistics.median(ms for ms, _ in queues), 2),
                "queues_bytes": queues[0][1]}
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        subprocess.run(["pkill", "-9", "-f", home], check=False)
        shutil.rmtree(home, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tau", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "tau"))
    ap.add_argument("--depths", default="300,3000")
    ap.add_argument("--sleep", type=float, default=0.05)
    args = ap.parse_args()
    tau = os.path.abspath(args.tau)
    out = {"machine": {"cpus": os.cpu_count()}, "sleep_s": args.sleep,
           "depths": [one_depth(tau, int(d), args.sleep) for d in args.depths.split(",")]}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
