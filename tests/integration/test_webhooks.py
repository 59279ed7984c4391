"""Webhooks (issue #25, docs/webhooks.md) with a real server, real processes and a real HTTP
receiver: a workspace's webhook gets every state event of a run's life, each signed with
HMAC-SHA256 (checked here with Python's own hmac), in order and each once per delivery id, though
the receiver first hangs (the run goes on all the same), the server is SIGKILLed and restarted,
and the receiver then refuses once. Events of a kind the webhook does not take are not sent."""
import getpass
import hashlib
import hmac
import json
import os
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import ServerTestCase, free_port, wait_for

USER = getpass.getuser()
SECRET = "s3cret-hook-key"

PLATFORM = f"""schema_version: 1
flavors:
  - name: cpu
queues:
  - name: main
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: cpu
            resources:
              - {{name: cpu, nominal: 8}}
              - {{name: memory, nominal: 16Gi}}
workspaces:
  - name: vision
    members: ["{USER}"]
    default_queue: main
    webhooks:
      - url: http://127.0.0.1:{{port}}/hooks/tau
        secret: hook-key
        events: [state]
defaults:
  workspace: vision
"""

SPEC = ("schema_version: 1\nname: hooked\nrun:\n  entrypoint: main.py\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  cpus: 100m\n  memory: 64Mi\n")


class Receiver:
    """A webhook receiver: `mode` says how it answers ("hang": never in time; "refuse": 503 once,
    then "ok"; "ok": 204). What it took (2xx) is in `taken`, as (headers, body)."""

    def __init__(self, port):
        self.mode = "hang"
        self.taken = []
        self.tries = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.tries += 1
                    mode = receiver.mode
                    if mode == "refuse":
                        receiver.mode = "ok"
                if mode == "hang":
                    time.sleep(7)  # past the server's 5 s
                    return
                if mode == "refuse":
                    self.send_response(503)
                    self.end_headers()
                    return
                with receiver.lock:
                    receiver.taken.append((dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class WebhookTest(ServerTestCase):
    def test_a_runs_life_reaches_the_receiver_signed_through_an_outage_and_a_restart(self):
        port = free_port()
        receiver = Receiver(port)
        self.addCleanup(receiver.close)
        fd, path = tempfile.mkstemp(prefix="tau-it-platform-", suffix=".yaml", dir=self.work)
        os.write(fd, PLATFORM.replace("{port}", str(port)).encode())
        os.close(fd)
        p = self.server.tau("platform", "apply", path, check=None)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.server.tau("secret", "set", "vision", "hook-key", input=SECRET, check=None)
        self.assertEqual(p.returncode, 0, p.stderr)

        # A receiver that hangs holds up no decision: the run ends as it would without it.
        began = time.monotonic()
        name = self.submit(SPEC, {"main.py": "print('trained', flush=True)\n"})
        self.server.wait_state(name, "Succeeded", timeout=30)
        self.assertLess(time.monotonic() - began, 20)
        wait_for(lambda: receiver.tries >= 1, timeout=30, what="a first try")
        self.assertEqual(receiver.taken, [])

        # Nothing is lost through a SIGKILL: the outbox is in the store.
        self.server.kill()
        self.server.start()
        with receiver.lock:
            receiver.mode = "refuse"

        def delivered():
            with receiver.lock:
                seen = {}
                for headers, body in receiver.taken:
                    seen.setdefault(headers["X-Tau-Delivery"], (headers, body))
            return [json.loads(b)["type"] for _, b in seen.values()]
        wait_for(lambda: delivered() == ["Submitted", "Queued", "Admitted", "Running", "Succeeded"],
                 timeout=90, what=f"the run's life at the receiver (got {delivered()})")

        with receiver.lock:
            taken = list(receiver.taken)
            self.assertGreaterEqual(receiver.tries, len(taken) + 2)  # the hung try, the refused one
        ids = []
        for headers, body in taken:
            stamp, _, mac = headers["X-Tau-Signature"].partition(",v1=")
            seconds = stamp.removeprefix("t=")
            want = hmac.new(SECRET.encode(), seconds.encode() + b"." + body, hashlib.sha256)
            self.assertTrue(hmac.compare_digest(mac, want.hexdigest()), headers)
            self.assertLess(abs(time.time() - int(seconds)), 600)
            event = json.loads(body)
            self.assertEqual(event["run"], {"name": name, "workspace": "vision", "owner": USER})
            self.assertEqual(event["kind"], "state")
            self.assertEqual(headers["X-Tau-Event"], event["type"])
            self.assertEqual(headers["X-Tau-Delivery"], event["id"])
            self.assertEqual(headers["Host"], f"127.0.0.1:{port}")
            ids.append(int(event["id"]))
        self.assertEqual(ids, sorted(ids))  # in order
        # The Metered event (not a state) was not sent; the metric counts what was.
        self.assertNotIn("Metered", [json.loads(b)["type"] for _, b in taken])
        metrics = self.server.tau_http("/metrics")
        delivered_line = next(l for l in metrics.splitlines()
                              if l.startswith("tau_webhook_deliveries_total{")
                              and 'result="delivered"' in l)
        self.assertGreaterEqual(float(delivered_line.split()[-1]), 5)


if __name__ == "__main__":
    unittest.main()
