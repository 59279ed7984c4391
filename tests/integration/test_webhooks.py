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
from datetime import datetime
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


# Two workspaces, each with its own receiver (state events).
TWO_PLATFORM = PLATFORM.replace("""defaults:""", """  - name: audio
    members: ["{USER}"]
    default_queue: main
    webhooks:
      - url: http://127.0.0.1:{audio_port}/hooks/audio
        secret: hook-key
        events: [state]
defaults:""".replace("{USER}", USER))

LIFE = ["Submitted", "Queued", "Admitted", "Running", "Succeeded"]
HUGE = 256 << 20  # the body a hostile receiver answers with


class HostileReceiver:
    """A receiver that answers each try by `answer(handler, try)` (the raw bytes of its answer
    written to handler.wfile; `try` a dict it may add to). Every try is in `tries`: the delivery's
    id and event type, when it began and ended, what was answered and how many bytes went out."""

    def __init__(self, port, answer):
        self.tries = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                event = json.loads(body)
                got = {"id": self.headers["X-Tau-Delivery"], "type": event["type"],
                       "time": event["time"], "wall": time.time(), "begin": time.monotonic(),
                       "end": None, "sent": 0}
                with receiver.lock:
                    receiver.tries.append(got)
                try:
                    answer(receiver, self, got)
                except OSError:  # the server went away: what the test measures
                    pass
                got["end"] = time.monotonic()

            def send(self, got, data):
                self.wfile.write(data)
                got["sent"] += len(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self):
        with self.lock:
            return [dict(t) for t in self.tries]

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def answer_huge(receiver, handler, got):
    """503 for the first try of all, 200 for the rest, each with a HUGE body streamed until the
    server stops reading it."""
    with receiver.lock:
        got["status"] = 503 if len(receiver.tries) == 1 else 200
    handler.send(got, f"HTTP/1.1 {got['status']} X\r\nContent-Length: {HUGE}\r\n\r\n".encode())
    mib = bytes(1 << 20)
    while got["sent"] < HUGE and not receiver.stop.is_set():
        handler.send(got, mib)


def answer_trickle(receiver, handler, got):
    """A status line, then a header one byte a second for up to a minute: every byte comes well
    within a read timeout, the answer never ends."""
    handler.send(got, b"HTTP/1.1 200 OK\r\nX-Slow: ")
    for _ in range(60):
        if receiver.stop.wait(1):
            return
        handler.send(got, b"z")


def answer_ok(receiver, handler, got):
    got["status"] = 204
    handler.send(got, b"HTTP/1.1 204 No Content\r\n\r\n")


def peak_rss_kib(pid):
    """The process's peak resident set (VmHWM): what a big answer read and freed again leaves."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def metric(server, workspace, result):
    for line in server.tau_http("/metrics").splitlines():
        if (line.startswith("tau_webhook_deliveries_total{") and f'workspace="{workspace}"' in line
                and f'result="{result}"' in line):
            return float(line.split()[-1])
    return 0.0


class HostileReceiverTest(ServerTestCase):
    """Receivers are not trusted (issue #47): one that answers with hundreds of MiB costs the
    server a few KiB of reading, and one that trickles its answer holds up neither the other
    workspaces' receivers nor its own sender past the try's 5 s."""

    def setUp(self):
        super().setUp()
        self.vision_port, self.audio_port = free_port(), free_port()
        p = self.apply_platform(TWO_PLATFORM.replace("{port}", str(self.vision_port))
                                .replace("{audio_port}", str(self.audio_port)))
        self.assertEqual(p.returncode, 0, p.stderr)
        for workspace in ("vision", "audio"):
            self.server.tau("secret", "set", workspace, "hook-key", input=SECRET, check=0)

    def receiver(self, port, answer):
        r = HostileReceiver(port, answer)
        self.addCleanup(r.close)
        return r

    def test_a_huge_answer_costs_the_server_nothing_and_its_status_still_counts(self):
        files = {"main.py": "print('ok', flush=True)\n"}
        # A first run's life to an ordinary receiver: the server's peak with deliveries made.
        audio = self.receiver(self.audio_port, answer_ok)
        name = self.submit(run_spec("warm") + "policy:\n  workspace: audio\n", files)
        self.server.wait_state(name, "Succeeded", timeout=30)
        wait_for(lambda: [t["type"] for t in audio.snapshot()] == LIFE, timeout=30,
                 what=f"the first run's life (got {audio.snapshot()})")
        before = peak_rss_kib(self.server.proc.pid)

        huge = self.receiver(self.vision_port, answer_huge)
        name = self.submit(run_spec("flooded"), files)
        self.server.wait_state(name, "Succeeded", timeout=30)

        def taken():
            return [t["type"] for t in huge.snapshot() if t.get("status") == 200]
        wait_for(lambda: taken() == LIFE, timeout=60, what=f"the run's life (got {taken()})")
        time.sleep(1.5)  # past the 1 s backoff: a delivery taken is not tried again
        tries = huge.snapshot()
        grown = peak_rss_kib(self.server.proc.pid) - before
        print(f"\n{len(tries)} answers of {HUGE >> 20} MiB; the server's peak RSS grew "
              f"{grown} KiB; the receiver got out at most {max(t['sent'] for t in tries)} bytes "
              "of one")
        # The 503 was a failed try (tried again), each 200 took its delivery (tried no more).
        self.assertEqual(tries[0]["status"], 503)
        self.assertEqual([t["type"] for t in tries], [tries[0]["type"]] + LIFE)
        self.assertEqual(tries[1]["id"], tries[0]["id"])
        # Each answer was cut short: the server stopped reading it (what the kernel's buffers
        # took is all the receiver got out), and held none of it.
        self.assertLess(grown, 8 << 10)
        for t in tries:
            self.assertLess(t["sent"], 64 << 20, t)
        self.assertEqual(metric(self.server, "vision", "failed"), 1)
        self.assertEqual(metric(self.server, "vision", "delivered"), 5)

    def test_a_trickling_receiver_holds_up_only_its_own_queue_and_only_for_the_deadline(self):
        files = {"main.py": "print('ok', flush=True)\n"}
        slow = self.receiver(self.vision_port, answer_trickle)
        audio = self.receiver(self.audio_port, answer_ok)
        self.submit(run_spec("trickled"), files)
        wait_for(lambda: slow.snapshot(), timeout=30, what="a first try at the slow receiver")

        # Another workspace's events, while the slow receiver trickles: each reaches its
        # receiver within moments of the event (the poll is 250 ms), none waits behind it.
        name = self.submit(run_spec("other") + "policy:\n  workspace: audio\n", files)
        self.server.wait_state(name, "Succeeded", timeout=30)
        wait_for(lambda: [t["type"] for t in audio.snapshot()] == LIFE, timeout=20,
                 what=f"the other workspace's life (got {audio.snapshot()})")
        for t in audio.snapshot():
            lag = t["wall"] - datetime.fromisoformat(t["time"].replace("Z", "+00:00")).timestamp()
            self.assertLess(lag, 3.0, t)

        # The slow receiver's try ended at the 5 s deadline though bytes kept coming, and was
        # a failed try, tried again.
        wait_for(lambda: len([t for t in slow.snapshot() if t["end"]]) >= 1, timeout=20,
                 what="the server to give up on the slow receiver's first try")
        first = slow.snapshot()[0]
        took = first["end"] - first["begin"]
        print(f"\nthe trickling try was cut after {took:.2f} s ({first['sent']} bytes)")
        self.assertGreater(took, 4.0)
        self.assertLess(took, 10.0)  # it would trickle for 60 s
        wait_for(lambda: len(slow.snapshot()) >= 2, timeout=20, what="a second try")
        self.assertEqual(slow.snapshot()[1]["id"], first["id"])
        self.assertGreaterEqual(metric(self.server, "vision", "failed"), 1)
        self.assertEqual(metric(self.server, "vision", "delivered"), 0)


if __name__ == "__main__":
    unittest.main()
