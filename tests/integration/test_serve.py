"""Services (issue #24) with a real server, real replica processes and real HTTP requests through
the server's endpoint /serve/NAME/: the example serves a trained quickstart run and answers with
its weights; a replica killed mid-traffic is restarted while requests keep succeeding; scale
2 -> 3 -> 1; a rolling update with a client loop that sees no failed request; a replica that
fails its liveness probe is restarted as LivenessFailed; a replica on a GPU that turns unhealthy
moves to another; a server SIGKILL and restart re-adopts the live replicas and the endpoint comes
back; bad service specs are refused at file:line:col; an update without --from keeps the model;
a crash-looping rollout halts with the exit code and last line, and `tau serve rollback` brings
the old revision back; a replica cannot be rerun or resumed."""
import json
import os
import shutil
import signal
import threading
import time
import unittest

from harness import ServerTestCase, UnixHTTPConnection, wait_for

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# A replica that says who it is: its run, pid, GPUs and VERSION; /healthz fails while the file
# $MARKS/sick-<run> exists (to fail its liveness probe).
APP = r'''import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUN = os.environ.get("TAU_RUN_NAME", "")
SICK = os.path.join(os.environ.get("MARKS", "/nonexistent"), "sick-" + RUN)

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/healthz":
            return self.reply(500 if os.path.exists(SICK) else 200, {"ok": True})
        self.reply(200, {"run": RUN, "pid": os.getpid(), "path": self.path,
                         "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                         "version": os.environ.get("VERSION", ""),
                         "model": os.environ.get("TAU_SERVE_MODEL", ""),
                         "model_exists": os.path.exists(os.environ.get("TAU_SERVE_MODEL", "-"))})
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.reply(201, {"run": RUN, "echo": self.rfile.read(n).decode()})
    def log_message(self, *args):
        pass

print("replica", RUN, "on port", os.environ["PORT"], flush=True)
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
'''

SERVICE = """schema_version: 1
kind: service
name: {name}
run:
  entrypoint: app.py
  workload_kind: job
compute:
  gpus: {gpus}
  cpus: 100m
  memory: 64Mi
runtime:
  env:
    VERSION: "{version}"
    MARKS: "{marks}"
serve:
  replicas: {replicas}
  readiness:
    http_path: /healthz
    period: 200ms
  liveness:
    http_path: /healthz
    period: 300ms
    failure_threshold: 2
  restart_backoff_initial: 200ms
  restart_backoff_max: 2s
"""


class ServeTestCase(ServerTestCase):
    def setUp(self):
        super().setUp()
        self.marks = os.path.join(self.work, "marks")
        os.makedirs(self.marks, exist_ok=True)
        os.chmod(self.marks, 0o777)
        os.chmod(self.work, 0o755)

    def service_spec(self, name="svc", replicas=2, version="1", gpus=0):
        return self.project(SERVICE.format(name=name, replicas=replicas, version=version,
                                           gpus=gpus, marks=self.marks), {"app.py": APP})

    def call(self, path, method="GET", body=None, timeout=30):
        conn = UnixHTTPConnection(os.path.join(self.server.home, "tau.sock"), timeout=timeout)
        try:
            conn.request(method, path, body=body)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def status(self, name):
        return json.loads(self.server.tau("serve", "status", name, "-o", "json", check=0).stdout)

    def wait_ready(self, name, ready, revision=None, timeout=60):
        def done():
            s = self.status(name)
            reps = [r for r in s["replica_list"] if not r["draining"]]
            if revision is not None and any(r["revision"] != revision for r in reps):
                return None
            ok = len(reps) == ready and sum(r["ready"] for r in reps) == ready
            return s if ok else None
        return wait_for(done, timeout=timeout, what=f"{ready} ready replicas of {name}")

    def who(self, name):
        status, body = self.call(f"/serve/{name}/who")
        self.assertEqual(status, 200, body)
        return json.loads(body)


class ServeTest(ServeTestCase):
    def test_the_example_serves_a_trained_quickstart_run(self):
        example = os.path.join(self.work, "example")
        shutil.copytree(os.path.join(REPO_ROOT, "examples"), example)
        train = self.server.tau("run", os.path.join(example, "quickstart", "tau.yaml"),
                                "--set", "run.args=[--steps, 10, --sleep, 0]", check=0,
                                timeout=120)
        run = train.stderr.split("tau: run ")[1].split()[0]
        deploy = self.server.tau("serve", "deploy", os.path.join(example, "serve", "tau.yaml"),
                                 "--from", run, check=0)
        self.assertIn("service linear deployed", deploy.stdout)
        s = self.wait_ready("linear", 2)
        model = s["model"]
        self.assertEqual(model["run"], run)
        self.assertTrue(model["path"].endswith("ckpt-000010.json"), model)
        self.assertRegex(model["sha256"], "^[0-9a-f]{64}$")
        with open(model["path"]) as f:
            weights = json.load(f)
        status, body = self.call("/serve/linear/predict?x=2")
        self.assertEqual(status, 200, body)
        self.assertAlmostEqual(json.loads(body)["y"], weights["w"] * 2 + weights["b"], places=9)
        status, body = self.call("/serve/linear/predict", "POST", json.dumps({"x": [0, 1, -1.5]}))
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["y"],
                         [weights["b"], weights["w"] + weights["b"], -1.5 * weights["w"] + weights["b"]])
        # Requests are spread over both replicas.
        served = {json.loads(self.call("/serve/linear/model")[1])["replica"] for _ in range(6)}
        self.assertEqual(served, {r["run"] for r in s["replica_list"]})
        # Each replica's evidence names the checkpoint it serves, with its digest.
        replica = s["replica_list"][0]["run"]
        record = json.loads(self.server.tau("evidence", replica, "-o", "json", check=0).stdout)
        [lineage] = record["lineage"]
        self.assertEqual(lineage["run"], run)
        self.assertEqual(lineage["checkpoint"], model["path"])
        self.assertEqual(lineage["checkpoint_sha256"], model["sha256"])
        # The endpoint counts requests in /metrics, with their latency.
        metrics = self.server.tau_http("/metrics")
        self.assertRegex(metrics, r'tau_serve_requests_total\{service="linear",code="2xx"\} \d+')
        self.assertIn('tau_serve_request_duration_seconds_count{service="linear"}', metrics)
        listed = self.server.tau("serve", "list", check=0).stdout
        self.assertRegex(listed, r"linear\s+default\s+Active\s+2/2")

    def test_a_killed_replica_restarts_while_requests_keep_succeeding(self):
        self.server.tau("serve", "deploy", self.service_spec(), check=0)
        s = self.wait_ready("svc", 2)
        victim = s["replica_list"][0]["run"]
        pids = {}
        wait_for(lambda: pids.update({w["run"]: w["pid"] for w in [self.who("svc")]}) or len(pids) == 2,
                 what="both replicas answering")
        failures, done = [], threading.Event()
        count = [0]

        def client():
            while not done.is_set():
                status, body = self.call("/serve/svc/who")
                count[0] += 1
                if status != 200:
                    failures.append((status, body))
        t = threading.Thread(target=client)
        t.start()
        try:
            time.sleep(0.3)
            os.kill(pids[victim], signal.SIGKILL)
            wait_for(lambda: next(r for r in self.status("svc")["replica_list"]
                                  if r["run"] == victim)["restarts"] >= 1,
                     what="the replica's restart")
            self.wait_ready("svc", 2)
            time.sleep(0.3)
        finally:
            done.set()
            t.join()
        self.assertEqual(failures, [])
        self.assertGreater(count[0], 10)
        s = self.status("svc")
        self.assertGreaterEqual(s["restarts"], 1)
        self.assertIn("ReplicaRestarted", [h["type"] for h in s["history"]])
        d = self.server.run_json(victim)
        self.assertEqual(d["attempts"][0]["reason"], "UserError")
        self.assertNotEqual(self.who_pid_of(victim), pids[victim])

    def who_pid_of(self, run):
        return wait_for(lambda: next((w["pid"] for w in [self.who("svc")] if w["run"] == run), None),
                        what=f"an answer from {run}")

    def test_scale_up_and_down(self):
        self.server.tau("serve", "deploy", self.service_spec(), check=0)
        first = {r["run"] for r in self.wait_ready("svc", 2)["replica_list"]}
        self.server.tau("serve", "scale", "svc", "3", check=0)
        grown = {r["run"] for r in self.wait_ready("svc", 3)["replica_list"]}
        self.assertTrue(first < grown)
        self.server.tau("serve", "scale", "svc", "1", check=0)
        s = self.wait_ready("svc", 1)
        [left] = [r["run"] for r in s["replica_list"] if not r["draining"]]
        wait_for(lambda: len(self.status("svc")["replica_list"]) == 1, what="drained replicas gone")
        for run in grown - {left}:
            self.assertEqual(self.server.run_json(run)["run"]["state"], "Cancelled")
        self.assertEqual(self.who("svc")["run"], left)
        p = self.server.tau("serve", "scale", "svc", "65")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("replicas: 65 is not 0 to 64", p.stderr)

    def test_rolling_update_fails_no_request(self):
        self.server.tau("serve", "deploy", self.service_spec(version="1"), check=0)
        old = {r["run"] for r in self.wait_ready("svc", 2)["replica_list"]}
        failures, versions, done = [], set(), threading.Event()

        def client():
            while not done.is_set():
                status, body = self.call("/serve/svc/who")
                if status != 200:
                    failures.append((status, body))
                else:
                    versions.add(json.loads(body)["version"])
        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            p = self.server.tau("serve", "update", "svc", self.service_spec(version="2"), check=0)
            self.assertIn("revision 2", p.stdout)
            s = self.wait_ready("svc", 2, revision=2, timeout=90)
            wait_for(lambda: all(r["revision"] == 2 for r in self.status("svc")["replica_list"]),
                     what="the old replicas gone")
            time.sleep(0.3)
        finally:
            done.set()
            for t in threads:
                t.join()
        self.assertEqual(failures, [])
        self.assertEqual(versions, {"1", "2"})
        new = {r["run"] for r in s["replica_list"] if r["revision"] == 2}
        self.assertEqual(len(new), 2)
        self.assertFalse(old & new)
        self.assertEqual(self.who("svc")["version"], "2")
        # One at a time: each old replica left only after a new one was ready.
        types = [h["type"] for h in self.status("svc")["history"]]
        first_drain = types.index("ReplicaDraining", types.index("Updated"))
        self.assertIn("ReplicaReady", types[types.index("Updated"):first_drain])

    def test_liveness_failure_restarts_the_replica(self):
        self.server.tau("serve", "deploy", self.service_spec(replicas=1), check=0)
        [rep] = self.wait_ready("svc", 1)["replica_list"]
        open(os.path.join(self.marks, "sick-" + rep["run"]), "w").close()
        wait_for(lambda: any(a["reason"] == "LivenessFailed"
                             for a in self.server.run_json(rep["run"])["attempts"]),
                 timeout=30, what="the LivenessFailed attempt")
        os.remove(os.path.join(self.marks, "sick-" + rep["run"]))
        s = self.wait_ready("svc", 1)
        self.assertEqual(s["replica_list"][0]["run"], rep["run"])  # the same replica, restarted
        self.assertGreaterEqual(s["replica_list"][0]["restarts"], 1)
        self.assertIn("LivenessFailed", [h["type"] for h in s["history"]])

    def test_server_sigkill_readopts_live_replicas(self):
        self.server.tau("serve", "deploy", self.service_spec(), check=0)
        before = {r["run"]: r["port"] for r in self.wait_ready("svc", 2)["replica_list"]}
        pids = {}
        wait_for(lambda: pids.update({w["run"]: w["pid"] for w in [self.who("svc")]}) or len(pids) == 2,
                 what="both replicas answering")
        self.server.kill(signal.SIGKILL)
        self.server.start()
        s = self.wait_ready("svc", 2)
        self.assertEqual({r["run"]: r["port"] for r in s["replica_list"]}, before)
        seen = {}
        wait_for(lambda: seen.update({w["run"]: w["pid"] for w in [self.who("svc")]}) or len(seen) == 2,
                 what="both replicas answering again")
        self.assertEqual(seen, pids)  # the same processes: re-adopted, not restarted
        self.assertEqual(s["restarts"], 0)

    def test_a_replica_that_never_answers_holds_up_no_other_service(self):
        # Accepts connections and never answers: each readiness probe of `hung` waits out its
        # 30 s timeout.
        hung = self.project(SERVICE.format(name="hung", replicas=1, version="1", gpus=0,
                                           marks=self.marks).replace(
                                               "period: 200ms", "period: 200ms\n    timeout: 30s"),
                            {"app.py": "import os, socket, time\n"
                                       "s = socket.socket()\n"
                                       "s.bind(('127.0.0.1', int(os.environ['PORT'])))\n"
                                       "s.listen(16)\n"
                                       "print('listening', flush=True)\n"
                                       "time.sleep(3600)\n"})
        self.server.tau("serve", "deploy", hung, check=0)
        wait_for(lambda: any(r["state"] == "Running"
                             for r in self.status("hung")["replica_list"]),
                 what="the hung replica running")
        time.sleep(1)  # its first probe is out
        started = time.monotonic()
        self.server.tau("serve", "deploy", self.service_spec(replicas=1), check=0)
        # Probes of one replica wait for no other's: ready within a third of the hung probe's
        # timeout (it takes about a second here).
        self.wait_ready("svc", 1, timeout=10)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(self.status("hung")["ready"], 0)

    def test_delete_drains_and_stops_every_replica(self):
        self.server.tau("serve", "deploy", self.service_spec(), check=0)
        runs = [r["run"] for r in self.wait_ready("svc", 2)["replica_list"]]
        self.server.tau("serve", "delete", "svc", check=0)
        wait_for(lambda: self.server.tau("serve", "status", "svc").returncode != 0,
                 what="the service gone")
        for run in runs:
            self.assertEqual(self.server.run_json(run)["run"]["state"], "Cancelled")
        status, body = self.call("/serve/svc/who")
        self.assertEqual(status, 404, body)

    def test_bad_specs_are_refused_at_their_fields(self):
        spec = self.project("schema_version: 1\nname: x\nrun:\n  entrypoint: app.py\n"
                            "serve:\n  replicas: 2\n", {"app.py": APP})
        p = self.server.tau("serve", "deploy", spec)
        self.assertEqual(p.returncode, 1)
        self.assertIn("tau.yaml:5:1: error: serve: only a service has a serve section", p.stderr)
        spec = self.project("schema_version: 1\nkind: service\nname: x\nrun:\n  entrypoint: app.py\n"
                            "compute:\n  workers: 2\nserve:\n  replica: 2\n", {"app.py": APP})
        p = self.server.tau("serve", "deploy", spec)
        self.assertIn("tau.yaml:7:3: error: compute.workers: a service's replica is one process",
                      p.stderr)
        self.assertIn("tau.yaml:9:3: error: unknown field 'replica' in 'serve' (did you mean "
                      "'replicas'?)", p.stderr)
        # A service is not a run, and a run is not a service.
        p = self.server.tau("run", self.service_spec())
        self.assertIn("is a service (kind: service): deploy it with `tau serve deploy", p.stderr)
        run_spec = self.project("schema_version: 1\nname: x\nrun:\n  entrypoint: app.py\n",
                                {"app.py": APP})
        p = self.server.tau("serve", "deploy", run_spec)
        self.assertIn("is a run spec, not a service", p.stderr)
        # A model from a run that does not exist.
        p = self.server.tau("serve", "deploy", self.service_spec(), "--from", "nope-12345678")
        # Named at the flag that gave it, not at the file's serve: key.
        self.assertIn("--from nope-12345678: error: no run is named 'nope-12345678'", p.stderr)
        self.assertNotIn("tau.yaml:", p.stderr)
        self.assertEqual(json.loads(self.server.tau("serve", "list", "-o", "json").stdout),
                         {"services": []})


class ServeRevisionTest(ServeTestCase):
    def train(self):
        """A finished quickstart run with a complete checkpoint (a model to serve)."""
        example = os.path.join(self.work, "example")
        shutil.copytree(os.path.join(REPO_ROOT, "examples"), example)
        train = self.server.tau("run", os.path.join(example, "quickstart", "tau.yaml"),
                                "--set", "run.args=[--steps, 10, --sleep, 0]", check=0,
                                timeout=180)
        return train.stderr.split("tau: run ")[1].split()[0]

    def test_an_update_without_from_keeps_the_model(self):
        run = self.train()
        self.server.tau("serve", "deploy", self.service_spec(replicas=1), "--from", run, check=0)
        model = self.wait_ready("svc", 1, timeout=120)["model"]
        self.assertEqual(model["run"], run)
        first = self.who("svc")
        self.assertEqual(first["model"], model["path"])
        self.assertTrue(first["model_exists"], first)
        # The documented flow: update with a new spec file and no --from.
        p = self.server.tau("serve", "update", "svc", self.service_spec(replicas=1, version="2"),
                            check=0)
        self.assertIn("revision 2", p.stdout)
        s = self.wait_ready("svc", 1, revision=2, timeout=120)
        self.assertEqual(s["state"], "Active")
        self.assertEqual(s["model"]["run"], run)
        self.assertEqual(s["model"]["path"], model["path"])
        wait_for(lambda: self.who("svc")["version"] == "2", what="revision 2 answering")
        second = self.who("svc")
        self.assertEqual(second["model"], model["path"])
        self.assertTrue(second["model_exists"], second)
        self.assertIn(f"revision 2 from {s['spec_file']} serving run {run}",
                      [h["message"].split(":")[0] for h in s["history"] if h["type"] == "Updated"])

    def test_a_crash_looping_update_halts_and_rolls_back(self):
        # --wait: the deploy returns once both replicas are ready, saying the count as it grows.
        p = self.server.tau("serve", "deploy", "--wait", self.service_spec(version="1"), check=0,
                            timeout=120)
        progress = [line for line in p.stderr.splitlines() if "revision 1: ready" in line]
        self.assertEqual(progress[0], "tau: service svc revision 1: ready 0/2", p.stderr)
        self.assertEqual(progress[-1], "tau: service svc revision 1: ready 2/2", p.stderr)
        self.assertIn("tau: service svc revision 1: rolled out, 2/2 ready", p.stderr)
        self.assertIn("service svc deployed", p.stdout)
        old = {r["run"] for r in self.wait_ready("svc", 2, timeout=120)["replica_list"]}
        crash = self.project(SERVICE.format(name="svc", replicas=2, version="2", gpus=0,
                                            marks=self.marks),
                             {"app.py": "import sys\nprint('loading the model', flush=True)\n"
                                        "print('fatal: no weights in /nowhere', flush=True)\n"
                                        "sys.exit(3)\n"})
        # --wait on an update that crash-loops: it ends when the server halts the rollout, failed
        # (1), with how the failing replica ended and its last log line.
        p = self.server.tau("serve", "update", "--wait", "svc", crash, check=1, timeout=200)
        self.assertIn("tau: service svc revision 2: ready 0/2", p.stderr)
        self.assertIn("tau: error: service svc: rollout halted: revision 2 replicas exited with "
                      "code 3: fatal: no weights in /nowhere", p.stderr)
        s = wait_for(lambda: (lambda s: s if s["state"] == "RolloutHalted" else None)(
            self.status("svc")), timeout=180, what="the rollout halted")
        rollout = s["rollout"]
        self.assertEqual(rollout["revision"], 2)
        self.assertEqual(rollout["exit_code"], 3)
        self.assertEqual(rollout["last_line"], "fatal: no weights in /nowhere")
        self.assertIn("rollout halted: revision 2 replicas exited with code 3: "
                      "fatal: no weights in /nowhere", rollout["message"])
        text = self.server.tau("serve", "status", "svc", check=0).stdout
        self.assertIn("(revision 2, RolloutHalted)", text)
        self.assertIn("exited with code 3: fatal: no weights in /nowhere", text)
        self.assertIn("tau serve rollback svc", text)
        # The old replicas kept serving throughout, and still do.
        self.assertEqual({r["run"] for r in s["replica_list"] if r["ready"]}, old)
        self.assertEqual(self.who("svc")["version"], "1")
        wait_for(lambda: all(r["revision"] == 1 for r in self.status("svc")["replica_list"]),
                 timeout=60, what="the new replicas gone")
        # Rolled back: revision 1 is current again, its replicas the same processes.
        p = self.server.tau("serve", "rollback", "svc", "--to", "9")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("service 'svc' keeps no revision 9 (it keeps 1, 2)", p.stderr)
        p = self.server.tau("serve", "rollback", "svc", "--to", "0")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--to: 0 is not a revision", p.stderr)
        p = self.server.tau("serve", "rollback", "svc", check=0)
        self.assertIn("revision 1 is current again", p.stdout)
        s = self.wait_ready("svc", 2, revision=1, timeout=60)
        self.assertEqual(s["state"], "Active")
        self.assertEqual(s["revision"], 1)
        self.assertNotIn("rollout", s)
        self.assertEqual({r["run"] for r in s["replica_list"]}, old)
        self.assertEqual(self.who("svc")["version"], "1")
        types = [h["type"] for h in s["history"]]
        self.assertLess(types.index("RolloutHalted"), types.index("RolledBack"))
        # The next update takes a new number: revision 2 stays the one that crashed.
        p = self.server.tau("serve", "update", "svc", self.service_spec(version="3"), check=0)
        self.assertIn("revision 3", p.stdout)
        self.wait_ready("svc", 2, revision=3, timeout=120)

    def test_a_crash_looping_deploy_says_so(self):
        crash = self.project(SERVICE.format(name="svc", replicas=1, version="1", gpus=0,
                                            marks=self.marks),
                             {"app.py": "import sys\nprint('fatal: no weights', flush=True)\n"
                                        "sys.exit(3)\n"})
        # Nothing older to fall back on: it keeps restarting, and the service says it is failing;
        # --wait ends there, failed, with the same account.
        p = self.server.tau("serve", "deploy", "--wait", crash, check=1, timeout=200)
        self.assertIn("tau: error: service svc: revision 1 replicas exited with code 3: "
                      "fatal: no weights", p.stderr)
        s = wait_for(lambda: (lambda s: s if s["state"] == "Failing" and "code 3" in
                              s["failing"]["message"] else None)(self.status("svc")),
                     timeout=180, what="the service failing")
        self.assertIn("revision 1 replicas exited with code 3: fatal: no weights",
                      s["failing"]["message"])
        text = self.server.tau("serve", "status", "svc", check=0).stdout
        self.assertIn("(revision 1, Failing)", text)
        self.assertIn("exited with code 3: fatal: no weights", text)
        self.assertNotIn("connection refused", text)

    def test_a_replica_cannot_be_rerun_or_resumed(self):
        self.server.tau("serve", "deploy", self.service_spec(replicas=1), check=0)
        [rep] = self.wait_ready("svc", 1, timeout=120)["replica_list"]
        run = rep["run"]
        for verb in ("rerun", "resume"):
            p = self.server.tau(verb, run)
            self.assertNotEqual(p.returncode, 0, p.stdout)
            self.assertIn(f"run '{run}' is a replica of service 'svc'", p.stderr)
            self.assertIn("tau serve update svc FILE", p.stderr)
            self.assertIn("tau serve scale svc N", p.stderr)
            # The server refuses it, not only the CLI.
            status, body = self.call(f"/api/v1/runs/{run}/{verb}", "POST", "{}")
            self.assertEqual(status, 412, body)
            self.assertIn(f"is a replica of service 'svc'", json.loads(body)["error"]["message"])
        # A drained replica (scaled away, Cancelled) is refused as well.
        self.server.tau("serve", "scale", "svc", "0", check=0)
        self.server.wait_state(run, "Cancelled", timeout=60)
        p = self.server.tau("resume", run)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn(f"run '{run}' is a replica of service 'svc'", p.stderr)
        time.sleep(1)
        self.assertEqual(self.server.run_json(run)["run"]["state"], "Cancelled")
        runs = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)
        names = [r["name"] for r in (runs["runs"] if isinstance(runs, dict) else runs)]
        self.assertEqual([n for n in names if n.startswith("svc-")], [run])


class ServePlanTest(ServeTestCase):
    def test_a_service_renders_for_kubernetes(self):
        spec = self.service_spec(replicas=3)
        p = self.server.tau("plan", "--backend", "kubernetes", "--image", "python:3.12", spec,
                            "-o", "json", check=0)
        items = json.loads(p.stdout)["items"]
        self.assertEqual([o["kind"] for o in items], ["Service", "Deployment"])
        deployment = items[1]
        self.assertEqual(deployment["spec"]["replicas"], 3)
        self.assertEqual(deployment["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "default")
        [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                       if c["name"] == "worker"]
        self.assertEqual(container["readinessProbe"]["httpGet"]["path"], "/healthz")
        self.assertIn({"name": "PORT", "value": "8080"}, container["env"])


class ServeGpuTest(ServeTestCase):
    gpus = 2

    def setUp(self):
        import tempfile
        fd, self.scenario = tempfile.mkstemp(prefix="tau-it-scn-", suffix=".scn")
        # GPU 0 falls off the bus 8 s after the server's NVML init.
        os.write(fd, b"gpus 2\nat 8s gpu 0 xid 79\n")
        os.close(fd)
        self.extra_env = {"TAU_FAKE_NVML_SCENARIO": self.scenario}
        super().setUp()

    def tearDown(self):
        super().tearDown()
        os.unlink(self.scenario)

    def test_a_replica_on_a_gpu_that_turns_unhealthy_moves(self):
        self.server.tau("serve", "deploy", self.service_spec(replicas=1, gpus=1), check=0)
        [rep] = self.wait_ready("svc", 1)["replica_list"]
        self.assertEqual(self.who("svc")["gpus"], "0")
        wait_for(lambda: any(a["reason"] == "GPUError"
                             for a in self.server.run_json(rep["run"])["attempts"]),
                 timeout=30, what="the GPUError attempt")
        wait_for(lambda: (lambda r: r["restarts"] >= 1 and r["ready"])(
            self.status("svc")["replica_list"][0]), timeout=30, what="the replica ready again")
        self.assertEqual(wait_for(lambda: self.who("svc")["gpus"] == "1" and "1",
                                  what="the replica on GPU 1"), "1")


if __name__ == "__main__":
    unittest.main()
