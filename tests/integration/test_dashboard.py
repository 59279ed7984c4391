"""The web dashboard end to end: a server with a TCP listener, runs submitted with the CLI, and the
dashboard driven in headless Chromium by tests/e2e/dashboard.test.mjs (playwright-core with the
system browser). Also the live event stream (GET /api/v1/events), `tau status --watch` and
`tau top --once`, which need no browser.

Skipped when Chromium or Node.js is missing; installs tests/e2e/node_modules with `npm ci` when
it is missing. TAU_SCREENSHOT_DIR=docs/img keeps the screenshots (the docs show them)."""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

from harness import CHROMIUM, E2E, TauServer, free_port, require_browser, wait_for

# Writes a falling loss curve to TAU_METRICS_FILE over a few seconds (so that a page opened early
# sees the run change state live), and a validation loss every fifth step, then succeeds. Its
# argument, the rate the loss falls at, tells two runs' curves apart in the compare view.
TRAIN = """import json, os, sys, time
rate = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
with open(os.environ['TAU_METRICS_FILE'], 'a') as f:
    for step in range(40):
        print('step', step, flush=True)
        f.write(json.dumps({'name': 'loss', 'step': step, 'value': 2.0 / (1 + rate * step), 'split': 'train'}) + '\\n')
        if step % 5 == 4:
            f.write(json.dumps({'name': 'loss', 'step': step, 'value': 2.5 / (1 + rate * step), 'split': 'val'}) + '\\n')
        f.flush()
        time.sleep(0.1)
with open(os.path.join(os.environ['TAU_OUTPUT_DIR'], 'summary.txt'), 'w') as f:
    f.write('final loss 0.05\\n')
# A checkpoint (written, then renamed: complete once it has its name) for the service to serve.
ckpt = os.path.join(os.environ['TAU_CHECKPOINT_DIR'], 'ckpt-39.json')
with open(ckpt + '.tmp', 'w') as f:
    json.dump({'step': 39, 'loss': 2.0 / (1 + rate * 39)}, f)
os.rename(ckpt + '.tmp', ckpt)
time.sleep(3)
"""
HOLD = """import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""

# A service's replica: Python's http.server on $PORT, answering with the checkpoint it serves.
SERVE_APP = """import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = os.environ.get("TAU_SERVE_MODEL", "")

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        data = json.dumps({"model": MODEL, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""
SERVICE = """schema_version: 1
kind: service
name: predict
run:
  entrypoint: app.py
  workload_kind: job
compute:
  gpus: 0
  cpus: 100m
  memory: 64Mi
serve:
  replicas: 1
  model: checkpoint
  readiness:
    http_path: /healthz
    period: 200ms
  restart_backoff_initial: 200ms
"""


def spec(name, gpus, args=(), cpus="1"):
    arglist = "\n  args:" + "".join(f"\n    - {a}" for a in args) if args else ""
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: run.sh\n  workload_kind: job\n"
            f"{arglist}\ncompute:\n  gpus: {gpus}\n  cpus: {cpus}\n  memory: 256Mi\n")


def sse_events(url, token, timeout=20):
    """Yields the events (type, data) of a text/event-stream as they come."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers["Content-Type"]
        kind, data = None, ""
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data += line[6:]
            elif line == "" and data:
                yield kind, json.loads(data)
                kind, data = None, ""


class DashboardTest(unittest.TestCase):
    def setUp(self):
        self.port = free_port()
        # One fake GPU: a run holding it makes a second GPU run wait, with a reason.
        self.server = TauServer(gpus=1, extra_args=["--listen", f"127.0.0.1:{self.port}", "--insecure-listen"]).start()
        self.url = f"http://127.0.0.1:{self.port}"
        # Over TCP the API needs a token; the page signs in with it (the server's own user's).
        self.token = self.server.tau("admin", "token", "create", "--description", "dashboard",
                                     check=0).stdout.strip()
        self.work = tempfile.mkdtemp(prefix="tau-it-dash-")
        self.release = os.path.join(self.work, "release")

    def tearDown(self):
        open(self.release, "w").close()
        self.server.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def submit(self, spec_text, main):
        d = tempfile.mkdtemp(dir=self.work)
        for name, content in {"main.py": main,
                              "run.sh": '#!/bin/sh\nexec python3 main.py "$@"\n',
                              "tau.yaml": spec_text}.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(content)
        os.chmod(os.path.join(d, "run.sh"), 0o755)
        return self.server.tau("run", "--detach", os.path.join(d, "tau.yaml"), check=0).stdout.strip()

    def deploy_and_call(self, train, stop):
        """Once `train` has succeeded, deploys the service `predict` from it and calls it through
        /serve/predict/ (over TCP, with the token) until `stop` is set, at a rate that changes
        every few seconds."""
        self.server.wait_state(train, "Succeeded", timeout=90)
        d = tempfile.mkdtemp(dir=self.work)
        for name, content in {"app.py": SERVE_APP, "tau.yaml": SERVICE}.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(content)
        self.server.tau("serve", "deploy", os.path.join(d, "tau.yaml"), "--from", train, check=0)
        wait_for(lambda: json.loads(self.server.tau("serve", "status", "predict", "-o", "json",
                                                    check=0).stdout)["ready"] >= 1,
                 timeout=90, interval=0.2, what="the service's replica to be ready")
        i = 0
        while not stop.is_set():
            try:
                self.get(f"/serve/predict/predict?x={i}")
            except OSError:
                pass  # counted as failed by the service; the page shows it
            i += 1
            stop.wait(0.05 if (i // 40) % 2 else 0.2)

    def get(self, path):
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    def test_assets_are_served_from_the_binary(self):
        status, ctype, body = self.get("/")
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith("text/html"), ctype)
        self.assertIn(b"/ui/app.js", body)
        for path, kind in [("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css"),
                           ("/ui/vendor/uPlot.iife.min.js", "text/javascript")]:
            status, ctype, body = self.get(path)
            self.assertEqual(status, 200, path)
            self.assertTrue(ctype.startswith(kind), (path, ctype))
            self.assertGreater(len(body), 100, path)
        with self.assertRaises(urllib.error.HTTPError) as e:
            self.get("/ui/nope.js")
        self.assertEqual(e.exception.code, 404)

    def test_event_stream_and_cli_watch(self):
        # The stream opens with hello and the queue view, then reports changes as they happen.
        stream = sse_events(self.url + "/api/v1/events", self.token)
        first = [next(stream), next(stream)]
        self.assertEqual([k for k, _ in first], ["hello", "queues"])
        self.assertIn("queues", first[1][1])
        hold = self.submit(spec("holder", 1, [self.release]), HOLD)
        seen = set()
        for kind, data in stream:
            if kind == "run" and data["name"] == hold:
                seen.add(data["state"])
                if data["state"] == "Running":
                    open(self.release, "w").close()
                if data["state"] == "Succeeded":
                    break
        self.assertIn("Running", seen)
        stream.close()
        # `tau status --watch` prints on each change until the run ends.
        name = self.submit(spec("watched", 0), "import time; time.sleep(1)\n")
        p = self.server.tau("status", name, "--watch", timeout=60, check=0)
        self.assertRegex(p.stdout, rf"{name}\s+Succeeded")  # it ran until the run ended
        self.assertGreaterEqual(p.stdout.count(name), 2, p.stdout)  # printed again on a change
        top = self.server.tau("top", "--once", check=0).stdout
        for text in ("QUEUES", "default", "RECENT RUNS", name, "GPUS"):
            self.assertIn(text, top)

    def test_dashboard_in_chromium(self):
        require_browser(self)
        # Two training runs (half a CPU each, so that the hog still fits beside them on two cores)
        # for the compare view; the second's loss falls slower.
        train = self.submit(spec("train", 0, cpus="500m"), TRAIN)
        tune = self.submit(spec("tune", 0, ["0.3"], cpus="500m"), TRAIN)
        self.submit(spec("hog", 1, [self.release]), HOLD)
        self.server.wait_state(train, ["Running", "Succeeded"])
        waiter = self.submit(spec("waiter", 1, [self.release]), HOLD)
        wait_for(lambda: (self.server.run_json(waiter)["run"].get("pending") or {}).get("reason"),
                 what="the waiting run's reason")
        # Cancelled, then resumed: running again, with nothing of the cancel left in its state.
        # Half a CPU too: the service's replica needs room beside it and the hog (two CPUs in all).
        resumed = self.submit(spec("resumed", 0, [self.release], cpus="500m"), HOLD)
        self.server.wait_state(resumed, "Running")
        self.server.tau("cancel", resumed, check=0)
        self.server.wait_state(resumed, "Cancelled")
        self.server.tau("resume", resumed, check=0)
        self.server.wait_state(resumed, "Running")
        # A service deployed from the training run once it has ended (while the browser already
        # looks at the run), and called until the test is over.
        stop = threading.Event()
        caller = threading.Thread(target=self.deploy_and_call, args=(train, stop), daemon=True)
        caller.start()
        shots = os.environ.get("TAU_SCREENSHOT_DIR") or os.path.join(self.work, "shots")
        try:
            p = subprocess.run(["node", os.path.join(E2E, "dashboard.test.mjs"), "--url", self.url,
                                "--train", train, "--pending", waiter, "--screenshots", shots,
                                "--token", self.token, "--resumed", resumed, "--compare", tune,
                                "--service", "predict"],
                               capture_output=True, text=True, timeout=240,
                               env=dict(os.environ, CHROMIUM=CHROMIUM))
        finally:
            stop.set()
            caller.join(timeout=30)
        print(p.stdout, p.stderr)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + self.server.server_log()[-2000:])
        self.assertIn("run reached Succeeded on the page", p.stdout)
        self.assertIn("compare view: loss chart with 4 curves", p.stdout)
        self.assertIn("attempt boundaries: one per run and attempt", p.stdout)
        self.assertRegex(p.stdout, r"services list: predict (\d+)/\1 ready")
        self.assertIn("service page: 1 replica rows, all ready", p.stdout)
        self.assertIn("request rate chart:", p.stdout)
        self.assertRegex(p.stdout, r"usage page: [a-z0-9-]+.*; a chart of [1-9]\d* series")
        self.assertIn("usage page by run lists the training run", p.stdout)
        for name in ("dashboard-run.png", "dashboard-queues.png", "dashboard-runs.png",
                     "dashboard-compare.png", "dashboard-services.png", "dashboard-usage.png"):
            self.assertTrue(os.path.getsize(os.path.join(shots, name)) > 1000, name)


if __name__ == "__main__":
    unittest.main()
