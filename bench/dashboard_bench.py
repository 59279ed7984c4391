#!/usr/bin/env python3
"""Dashboard responsiveness with many runs in the store (issue #8): prints one JSON object.

  bench/dashboard_bench.py [--runs 10000] [--tau build/bin/tau]

Fills a fresh TAU_HOME's store with N runs (one real run, copied N-1 times in SQLite while the
server is stopped: submitting 10,000 runs would measure the runtime, not the dashboard), starts a
server with a TCP listener, and measures what the dashboard asks for: the paged runs list at
offsets across the store (with and without a state filter), one run's detail, the page and its
scripts, and the time to the first event of GET /api/v1/events. Standard library only.
"""
import argparse
import glob
import http.client
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    raise SystemExit("timed out")


def start_server(tau, home, env, port):
    log = open(os.path.join(home, "bench-server.log"), "ab")
    proc = subprocess.Popen([tau, "server", "--home", home, "--listen", f"127.0.0.1:{port}",
                             "--insecure-listen"],
                            env=env, stdout=log, stderr=log, start_new_session=True)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False
    wait_for(up)
    return proc


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def fill(home, n):
    """Copies the one run in the store n-1 times (every 10th copy Failed, for the state filter)."""
    db_path = [p for p in glob.glob(os.path.join(home, "**", "*.db"), recursive=True)][0]
    db = sqlite3.connect(db_path)
    cols = [r[1] for r in db.execute("PRAGMA table_info(runs)")]
    (template,) = db.execute("SELECT name FROM runs LIMIT 1").fetchone()
    (seq,) = db.execute("SELECT MAX(seq) FROM runs").fetchone()
    select = ", ".join("?" if c in ("name", "seq") else
                       "CASE WHEN ? THEN 'Failed' ELSE state END" if c == "state" else c
                       for c in cols)
    sql = f"INSERT INTO runs ({', '.join(cols)}) SELECT {select} FROM runs WHERE name = ?"
    rows = []
    for i in range(1, n):
        params = []
        for c in cols:
            if c == "name":
                params.append(f"bench-{i:06d}")
            elif c == "seq":
                params.append(seq + i)
            elif c == "state":
                params.append(1 if i % 10 == 0 else 0)
        rows.append((*params, template))
    with db:
        db.executemany(sql, rows)
    (count,) = db.execute("SELECT COUNT(*) FROM runs").fetchone()
    db.close()
    return count


def timed(conn, path, repeat):
    out = []
    for _ in range(repeat):
        p = path() if callable(path) else path
        t = time.perf_counter()
        conn.request("GET", p)
        r = conn.getresponse()
        body = r.read()
        out.append((time.perf_counter() - t) * 1000)
        assert r.status == 200, (p, r.status, body[:200])
    return out


def summary(ms):
    ms = sorted(ms)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 2), "max_ms": round(ms[-1], 2)}


def first_event_ms(port):
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: b\r\n\r\n")
    data = b""
    while b"event: " not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    ms = (time.perf_counter() - t) * 1000
    s.close()
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--tau", default=os.path.join(os.environ.get("TAU_BINARY_DIR", os.path.join(ROOT, "build")), "bin", "tau"))
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tau-dash-bench-", dir="/tmp")
    env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent/libnvidia-ml.so.1")
    env.pop("TAU_SERVER", None)
    port = free_port()
    proc = None
    try:
        proc = start_server(args.tau, home, env, port)
        code = os.path.join(home, "code")
        os.makedirs(code)
        with open(os.path.join(code, "tau.yaml"), "w") as f:
            f.write("schema_version: 1\nname: bench\nrun:\n  entrypoint: run.sh\n  workload_kind: job\n"
                    "compute:\n  gpus: 0\n  cpus: 1\n  memory: 64Mi\n")
        with open(os.path.join(code, "run.sh"), "w") as f:
            f.write("#!/bin/sh\necho hello\n")
        os.chmod(os.path.join(code, "run.sh"), 0o755)
        name = subprocess.run([args.tau, "run", "--detach", os.path.join(code, "tau.yaml")], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

        def done():
            out = subprocess.run([args.tau, "status", name, "-o", "json"], env=env,
                                 capture_output=True, text=True).stdout
            return json.loads(out or "{}").get("state") in ("Succeeded", "Failed")
        wait_for(done)
        stop_server(proc)
        t = time.perf_counter()
        count = fill(home, args.runs)
        fill_s = time.perf_counter() - t
        proc = start_server(args.tau, home, env, port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        pages = max(1, count // 50)
        rnd = random.Random(1)
        result = {
            "runs_in_store": count,
            "fill_seconds": round(fill_s, 2),
            "runs_page_first": summary(timed(conn, "/api/v1/runs?limit=50&offset=0", 100)),
            "runs_page_random_offset": summary(timed(
                conn, lambda: f"/api/v1/runs?limit=50&offset={rnd.randrange(pages) * 50}", 200)),
            "runs_page_last": summary(timed(conn, f"/api/v1/runs?limit=50&offset={(pages - 1) * 50}", 50)),
            "runs_page_state_filter": summary(timed(
                conn, lambda: f"/api/v1/runs?limit=50&state=Failed&offset={rnd.randrange(pages // 10 or 1) * 50}", 100)),
            "run_detail": summary(timed(conn, f"/api/v1/runs/{name}", 100)),
            "queues": summary(timed(conn, "/api/v1/queues", 100)),
            "page_index_html": summary(timed(conn, "/", 100)),
            "page_app_js": summary(timed(conn, "/ui/app.js", 100)),
            "page_uplot_js": summary(timed(conn, "/ui/vendor/uPlot.iife.min.js", 100)),
            "sse_first_event": summary([first_event_ms(port) for _ in range(20)]),
        }
        conn.close()
        print(json.dumps(result, indent=1))
    finally:
        if proc and proc.poll() is None:
            stop_server(proc)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
