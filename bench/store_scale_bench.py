#!/usr/bin/env python3
"""The server's costs against the number of ended runs in its home (issue #26: a store that stays flat).
Prints JSON; not a test.

For each size, a home is filled with that many ended runs (bench/store_fill: each with an attempt, five
events and its final evidence record, logs and samples pruned as retention left them), and a real
`tau server` is started over it with --retain-logs/--retain-samples of one second (a retention pass
every second). Then, per size:
  start_s               from starting the server to its first answer (median of --starts starts; a
                        restart over the same home); start_no_retention_s the same without
                        --retain-* (no retention pass as it starts)
  rss_start_mb          the server's resident memory a second after it answers
  list_ms               GET /api/v1/runs pages (limit 100, what `tau list --all --limit 100` asks) at
                        the head, the middle and the tail of the runs: p50 and p95 of --pages each
  cli_list_ms           `tau list --all` (the whole command: process, connection, table) p50
  retention             --due more runs end 3 s after the server starts, with their logs and samples,
                        twice. First alone: pass_s and pass_cpu_s (the server's CPU from just before the
                        first prune to the last) time the pass that prunes them; idle_cpu_s_per_s is the
                        server's CPU per second over the 5 s after it (a pass a second, nothing due).
                        Then while a client polls GET /api/v1/runs?limit=20 back to back: worst_api_ms
                        is the slowest call from 1 s before the first prune to the last;
                        worst_api_ms_whole_poll from the server's start to the last prune
  rss_after_pass_mb     resident memory after all that

--tau names the binary; --before-tau another one (an older tau, schema 7), measured over the same
homes after this one: the home is taken back to schema 7 first (the columns and indexes of versions 8 and 9
dropped; the runs' prune times are then only in their records, as that tau kept them).

Usage: bench/store_scale_bench.py [--tau build/bin/tau] [--fill build/bench/store_fill]
       [--sizes 1000,10000,100000] [--due 512] [--before-tau PATH] [--keep]
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TICKS = os.sysconf("SC_CLK_TCK")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def get(conn, url):
    conn.request("GET", url)
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"GET {url}: {r.status} {body[:200]!r}")
    return body


def pct(values, p):
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


class Server:
    def __init__(self, tau, home, env):
        self.tau, self.home, self.env = tau, home, env
        self.sock = os.path.join(home, "tau.sock")

    def start(self, retention=True):
        t0 = time.monotonic()
        keep = ["--retain-logs", "1s", "--retain-samples", "1s"] if retention else []
        self.proc = subprocess.Popen(
            [self.tau, "server", "--home", self.home, "--quiet", *keep], env=self.env, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.home, "bench-server.log"), "ab"), start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}); see "
                                   f"{self.home}/bench-server.log")
            try:
                get(UnixConnection(self.sock), "/api/v1/runs?limit=1")
                return time.monotonic() - t0
            except (OSError, RuntimeError, http.client.HTTPException):
                time.sleep(0.002)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def fill(fill_bin, home, runs, due=0, due_at_ms=None):
    args = [fill_bin, home, str(runs), str(due)]
    if due_at_ms is not None:
        args.append(str(due_at_ms))
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def due_files(home, since_ms):
    """The log directory and samples file of each run store_fill made due at `since_ms`."""
    runs = os.path.join(home, "runs")
    out = []
    for name in sorted(os.listdir(runs)):
        if name.startswith(f"due{since_ms:x}-"):
            out.append((os.path.join(runs, name, "attempts", "1", "logs"),
                        os.path.join(runs, name, "evidence", "gpu-samples.jsonl")))
    return out


def downgrade_to_7(home):
    db = sqlite3.connect(os.path.join(home, "tau.db"))
    db.executescript("""
DROP INDEX IF EXISTS runs_logs_due;
DROP INDEX IF EXISTS runs_samples_due;
DROP INDEX IF EXISTS runs_active;
ALTER TABLE runs DROP COLUMN kind;
ALTER TABLE runs DROP COLUMN logs_pruned_ms;
ALTER TABLE runs DROP COLUMN samples_pruned_ms;
ALTER TABLE runs DROP COLUMN array_place;
PRAGMA user_version = 7;
""")
    db.close()


def measure(tau, fill_bin, home, runs, args, env):
    out = {}
    server = Server(tau, home, env)
    starts = []
    for i in range(args.starts):
        starts.append(server.start())
        if i + 1 < args.starts:
            server.stop()
    out["start_s"] = round(statistics.median(starts), 4)
    out["start_all_s"] = [round(s, 4) for s in starts]
    server.stop()
    # Without retention: no pass at start, so what is left is the server's own start.
    plain = []
    for _ in range(args.starts):
        plain.append(server.start(retention=False))
        server.stop()
    out["start_no_retention_s"] = round(statistics.median(plain), 4)
    server.start()
    time.sleep(1)
    pid = server.proc.pid
    out["rss_start_mb"] = round(rss_mb(pid), 1)

    conn = UnixConnection(server.sock)
    total = json.loads(get(conn, "/api/v1/runs?limit=1"))["total"]
    pages = {"head": 0, "middle": max(0, total // 2), "tail": max(0, total - 100)}
    lists = {}
    for where, offset in pages.items():
        ms = []
        for _ in range(args.pages):
            t0 = time.perf_counter()
            get(conn, f"/api/v1/runs?limit=100&offset={offset}")
            ms.append((time.perf_counter() - t0) * 1000)
        lists[where] = {"offset": offset, "p50": round(pct(ms, 50), 2), "p95": round(pct(ms, 95), 2)}
    out["list_ms"] = lists
    cli = []
    for _ in range(10):
        t0 = time.perf_counter()
        subprocess.run([tau, "list", "--all", "--limit", "100"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli.append((time.perf_counter() - t0) * 1000)
    out["cli_list_ms"] = round(pct(cli, 50), 2)
    server.stop()

    # Twice: a pass alone (its CPU, then a quiet server's CPU per second), then a pass while a client
    # polls (the API's latency during it).
    quiet = retention_pass(server, fill_bin, home, args, poll=False)
    polled = retention_pass(server, fill_bin, home, args, poll=True)
    out["retention"] = {
        "due": args.due,
        "pass_s": quiet["pass_s"],
        "pass_cpu_s": quiet["pass_cpu_s"],
        "idle_cpu_s_per_s": quiet["idle_cpu_s_per_s"],
        "polled_pass_s": polled["pass_s"],
        "api_calls_in_pass": polled["api_calls_in_pass"],
        "worst_api_ms": polled["worst_api_ms"],
        "p50_api_ms": polled["p50_api_ms"],
        "worst_api_ms_whole_poll": polled["worst_api_ms_whole_poll"],
    }
    out["rss_after_pass_mb"] = quiet["rss_after_pass_mb"]
    return out


def retention_pass(server, fill_bin, home, args, poll):
    # The due runs end 3 s after now: with a second's retention, a pass finds them due a second later.
    due_at = int(time.time() * 1000) + 3000
    fill(fill_bin, home, 0, args.due, due_at)
    server.start()
    pid = server.proc.pid
    files = due_files(home, due_at)
    samples = []
    stop = threading.Event()

    def poller():
        c = UnixConnection(server.sock)
        while not stop.is_set():
            t0 = time.perf_counter()
            get(c, "/api/v1/runs?limit=20")
            samples.append((time.monotonic(), (time.perf_counter() - t0) * 1000))

    thread = threading.Thread(target=poller)
    if poll:
        thread.start()
    out = {}
    first = last = None
    cpu0 = cpu1 = None
    deadline = time.monotonic() + 600
    prev_cpu, prev_t = cpu_s(pid), time.monotonic()
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            c = cpu_s(pid)
            if first is None and any(not os.path.exists(l) for l, _ in files):
                first, cpu0 = prev_t, prev_cpu
            if first is not None and not any(os.path.exists(l) or os.path.exists(s)
                                             for l, s in files):
                last, cpu1 = now, c
                break
            prev_cpu, prev_t = c, now
            time.sleep(0.005)
        if last is None:
            raise RuntimeError("the retention pass did not prune the due runs in time")
    finally:
        stop.set()
        if poll:
            thread.join()
    out["pass_s"] = round(last - first, 3)
    out["pass_cpu_s"] = round(cpu1 - cpu0, 3)
    if poll:
        window = [ms for t, ms in samples if first - 1 <= t <= last]
        out["api_calls_in_pass"] = len(window)
        out["worst_api_ms"] = round(max(window), 2) if window else None
        out["p50_api_ms"] = round(pct(window, 50), 2) if window else None
        # From the server's start to the last prune: every pass an older tau made meanwhile (each
        # read every run), not only the one that pruned.
        out["worst_api_ms_whole_poll"] = round(max(ms for _, ms in samples), 2)
    else:
        idle0 = cpu_s(pid)
        time.sleep(5)
        out["idle_cpu_s_per_s"] = round((cpu_s(pid) - idle0) / 5, 4)
    out["rss_after_pass_mb"] = round(rss_mb(pid), 1)
    server.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tau", default=os.path.join(ROOT, "build", "bin", "tau"))
    ap.add_argument("--fill", default=os.path.join(ROOT, "build", "bench", "store_fill"))
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--due", type=int, default=512)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--pages", type=int, default=50)
    ap.add_argument("--before-tau", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the homes (their paths are printed)")
    args = ap.parse_args()
    tau = os.path.abspath(args.tau)
    results = {"sizes": {}}
    for size in [int(s) for s in args.sizes.split(",")]:
        home = tempfile.mkdtemp(prefix=f"tau-scale-{size}-", dir="/tmp")
        env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent")
        env.pop("TAU_SERVER", None)
        try:
            filled = fill(args.fill, home, size)
            entry = {"fill_s": round(filled["seconds"], 1)}
            entry["after"] = measure(tau, args.fill, home, size, args, env)
            if args.before_tau:
                # The due runs of this tau's measurement are pruned; the older tau gets its own.
                downgrade_to_7(home)
                entry["before"] = measure_before(os.path.abspath(args.before_tau), args.fill, home,
                                                 size, args, env)
            results["sizes"][str(size)] = entry
            print(json.dumps({str(size): entry}), file=sys.stderr)
        finally:
            if args.keep:
                print(f"kept {home}", file=sys.stderr)
            else:
                shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(results, indent=2))


def measure_before(tau, fill_bin, home, size, args, env):
    # store_fill writes through this tree's store (schema 8): the older tau's due runs are added
    # before its measurement starts them, and the home goes back to 7 again. measure() calls fill
    # itself, so it is given a fill that does that.
    wrapper = os.path.join(home, "fill-then-downgrade")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nset -e\n{fill_bin} \"$@\"\n{sys.executable} {os.path.abspath(__file__)} "
                f"--downgrade \"$1\" >/dev/null\n")
    os.chmod(wrapper, 0o755)
    return measure(tau, wrapper, home, size, args, env)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--downgrade":
        downgrade_to_7(sys.argv[2])
        print("{}")
        sys.exit(0)
    main()
