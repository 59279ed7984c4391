#!/usr/bin/env python3
"""A service's endpoint against calling its replica directly (issue #24): prints one JSON object.

  bench/serve_bench.py [--requests 2000] [--clients 4] [--tau build/bin/tau]

Starts a server in a fresh TAU_HOME, deploys a one-replica service (a Python standard-library HTTP
server answering a small JSON body), and times GET requests in alternating pairs: one straight to
the replica's port, one through the endpoint (/serve/NAME/... on the server's Unix socket), each on
a new connection with the same raw-socket client, so the difference is what the endpoint adds
(accepting, authorizing, routing, connecting to the replica, copying the answer). Then the
endpoint's throughput with --clients concurrent clients. Standard library only.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

APP = r'''import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        data = b'{"y": 8.0}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
'''

SPEC = """schema_version: 1
kind: service
name: bench
run:
  entrypoint: app.py
  workload_kind: job
compute:
  cpus: 100m
  memory: 64Mi
serve:
  replicas: 1
  readiness:
    http_path: /healthz
    period: 200ms
"""


def get(connect, path):
    s = connect()
    try:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    if b" 200 " not in data.split(b"\r\n", 1)[0]:
        raise SystemExit(f"unexpected answer: {data[:200]!r}")
    return data


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tau", default=os.path.join(ROOT, "build", "bin", "tau"))
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tau-serve-bench-", dir="/tmp")
    work = tempfile.mkdtemp(prefix="tau-serve-bench-code-")
    env = dict(os.environ, TAU_HOME=home, TAU_NVML_LIBRARY="/nonexistent/libnvidia-ml.so.1")
    log = open(os.path.join(home, "server.log"), "ab")
    server = subprocess.Popen([args.tau, "server", "--home", home], env=env, stdout=log,
                              stderr=log, start_new_session=True)
    sock_path = os.path.join(home, "tau.sock")
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(os.path.join(work, "app.py"), "w") as f:
            f.write(APP)
        with open(os.path.join(work, "tau.yaml"), "w") as f:
            f.write(SPEC)
        subprocess.run([args.tau, "serve", "deploy", os.path.join(work, "tau.yaml")], env=env,
                       check=True, capture_output=True)
        port = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and port is None:
            s = json.loads(subprocess.run([args.tau, "serve", "status", "bench", "-o", "json"],
                                          env=env, capture_output=True, text=True).stdout)
            ready = [r for r in s["replica_list"] if r["ready"]]
            port = ready[0]["port"] if ready else None
            time.sleep(0.1)
        if port is None:
            raise SystemExit("the replica never became ready")

        def direct():
            return socket.create_connection(("127.0.0.1", port))

        def endpoint():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock_path)
            return s

        for _ in range(100):  # warm both paths
            get(direct, "/predict?x=2")
            get(endpoint, "/serve/bench/predict?x=2")
        d_ms, e_ms, added = [], [], []
        for i in range(args.requests):
            timed = {}
            order = ["direct", "endpoint"] if i % 2 == 0 else ["endpoint", "direct"]
            for which in order:  # alternating which goes first
                t = time.perf_counter()
                if which == "direct":
                    get(direct, "/predict?x=2")
                else:
                    get(endpoint, "/serve/bench/predict?x=2")
                timed[which] = (time.perf_counter() - t) * 1000
            d_ms.append(timed["direct"])
            e_ms.append(timed["endpoint"])
            added.append(timed["endpoint"] - timed["direct"])

        count = [0]
        lock = threading.Lock()
        stop = time.monotonic() + 5

        def client():
            n = 0
            while time.monotonic() < stop:
                get(endpoint, "/serve/bench/predict?x=2")
                n += 1
            with lock:
                count[0] += n
        t0 = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        print(json.dumps({
            "benchmark": "serve_endpoint",
            "requests": args.requests,
            "direct_ms": {"p50": round(percentile(d_ms, 50), 3), "p99": round(percentile(d_ms, 99), 3)},
            "endpoint_ms": {"p50": round(percentile(e_ms, 50), 3), "p99": round(percentile(e_ms, 99), 3)},
            "added_ms": {"p50": round(statistics.median(added), 3),
                         "p99": round(percentile(added, 99), 3)},
            "target_added_p50_ms": 1.0,
            "endpoint_requests_per_s": round(count[0] / elapsed, 1),
            "clients": args.clients,
        }))
    finally:
        subprocess.run([args.tau, "serve", "delete", "bench"], env=env, capture_output=True)
        time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        subprocess.run(["pkill", "-9", "-f", home], check=False)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
