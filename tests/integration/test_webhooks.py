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


# The workspace's own receiver on /team (state events), and runs may post to this machine only.
RUN_PLATFORM = PLATFORM.replace("/hooks/tau\n", "/team\n").replace(
    "        events: [state]\n",
    "        events: [state]\n    allowed_webhooks: [\"http://127.0.0.1:*\"]\n")


def run_spec(name, hooks=""):
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.py\n"
            "  workload_kind: job\ncompute:\n  gpus: 0\n  cpus: 100m\n  memory: 64Mi\n"
            + (f"policy:\n  webhooks:\n{hooks}" if hooks else ""))


class RunWebhookTest(ServerTestCase):
    """A spec's own policy.webhooks: its run's events go to its receiver too (signed under a
    secret of its workspace), no other run's do, a receiver both name gets each event once, and a
    run whose receiver is not allowed or whose secret is not set is refused at submission."""

    def test_a_run_names_its_own_receiver(self):
        team_port, own_port = free_port(), free_port()
        team, own = Receiver(team_port), Receiver(own_port)
        self.addCleanup(team.close)
        self.addCleanup(own.close)
        team.mode = own.mode = "ok"
        p = self.apply_platform(RUN_PLATFORM.replace("{port}", str(team_port)))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.server.tau("secret", "set", "vision", "hook-key", input=SECRET, check=0)

        own_hook = (f"    - url: http://127.0.0.1:{own_port}/mine\n      secret: run-key\n"
                    "      events: [state]\n")
        files = {"main.py": "print('ok', flush=True)\n"}
        # Its secret is not set: refused now, rather than every delivery failing later.
        p = self.server.tau("run", "--detach", self.project(run_spec("own", own_hook), files),
                            check=None)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("policy.webhooks[0].secret", p.stderr)
        self.assertIn("tau secret set vision run-key", p.stderr)
        # A receiver outside the workspace's allowed_webhooks is refused where the spec names it.
        elsewhere = "    - url: http://localhost:9/x\n      secret: hook-key\n"
        p = self.server.tau("run", "--detach", self.project(run_spec("far", elsewhere), files),
                            check=None)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("policy.webhooks[0].url: 'http://localhost:9/x' is not allowed in "
                      "workspace 'vision'", p.stderr)
        self.assertIn("tau.yaml:", p.stderr)

        self.server.tau("secret", "set", "vision", "run-key", input="run-secret", check=0)
        mine = self.submit(run_spec("own", own_hook), files)
        other = self.submit(run_spec("plain"), files)
        # The team's own URL named again by a run: one delivery per event, not two.
        twice = self.submit(run_spec("twice", f"    - url: http://127.0.0.1:{team_port}/team\n"
                                              "      secret: run-key\n"), files)
        for name in (mine, other, twice):
            self.server.wait_state(name, "Succeeded", timeout=30)

        life = ["Submitted", "Queued", "Admitted", "Running", "Succeeded"]

        def types(receiver, run):
            with receiver.lock:
                return [json.loads(b)["type"] for _, b in receiver.taken
                        if json.loads(b)["run"]["name"] == run]
        wait_for(lambda: types(own, mine) == life, timeout=30,
                 what=f"the run's life at its own receiver (got {types(own, mine)})")
        for run in (mine, other, twice):
            wait_for(lambda: types(team, run) == life, timeout=30,
                     what=f"{run}'s life at the team's receiver (got {types(team, run)})")
        time.sleep(1)  # a few more polls: nothing else arrives
        self.assertEqual(types(team, twice), life)  # once each, though two name the URL
        with own.lock:
            self.assertEqual({json.loads(b)["run"]["name"] for _, b in own.taken}, {mine})
            for headers, body in own.taken:
                stamp, _, mac = headers["X-Tau-Signature"].partition(",v1=")
                want = hmac.new(b"run-secret", stamp.removeprefix("t=").encode() + b"." + body,
                                hashlib.sha256)
                self.assertTrue(hmac.compare_digest(mac, want.hexdigest()), headers)
        # The run's canonical spec keeps its receiver (describe shows it).
        spec = self.server.run_json(mine)["run"]["spec"]
        self.assertEqual(spec["policy"]["webhooks"],
                         [{"url": f"http://127.0.0.1:{own_port}/mine", "secret": "run-key",
                           "events": ["state"]}])


if __name__ == "__main__":
    unittest.main()
