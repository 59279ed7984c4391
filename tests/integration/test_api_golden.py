"""The wire format of the API, pinned: a real server goes through a fixed scenario (runs that
succeed, fail and retry, are cancelled running and queued, wait for quota) and every JSON reply
of /api/v1, and the CLI's -o json output, is compared with a golden file in tests/data/api_golden/
after what legitimately varies (times, run-name suffixes, pids, hashes, machine sizes, paths under
the temporary directories) is replaced. Keys, their order and the types of values are kept, so a
renamed or retyped field fails.

TAU_UPDATE_GOLDENS=1 rewrites the golden files (review the diff)."""
import base64
import getpass
import hashlib
import json
import os
import re
import socket
import unittest

from harness import ServerTestCase, wait_for

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN_DIR = os.path.join(REPO, "tests", "data", "api_golden")
UPDATE = bool(os.environ.get("TAU_UPDATE_GOLDENS"))
USER = getpass.getuser()

# Quotas fixed here rather than sized to the machine: one CPU in queue `main`, so a second run
# waits for quota whatever the machine has.
PLATFORM = f"""schema_version: 1
flavors:
  - name: cpu-only
cohorts:
  - name: lab
queues:
  - name: main
    cohort: lab
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: cpu-only
            resources:
              - {{name: cpu, nominal: 1, lending_limit: 0}}
              - {{name: memory, nominal: 1Gi, lending_limit: 0}}
  - name: spare
    cohort: lab
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: cpu-only
            resources:
              - {{name: cpu, nominal: 1, lending_limit: 0}}
              - {{name: memory, nominal: 1Gi, lending_limit: 0}}
priorities:
  - {{name: normal, value: 10}}
workspaces:
  - name: team
    members: ["{USER}"]
    default_queue: main
    default_priority: normal
defaults:
  workspace: team
"""

# Waits until its release file exists (or is killed).
WAITER = """import os, sys, time
print('waiting', flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""

METRICS = """import json, os
with open(os.environ['TAU_METRICS_FILE'], 'a') as f:
    for step in range(3):
        f.write(json.dumps({'step': step, 'name': 'loss', 'value': 1.0 / (step + 1)}) + '\\n')
print('done', flush=True)
"""

FAILS = "import sys\nprint('bye', flush=True)\nsys.exit(3)\n"


def spec(name, entry, args=(), extra=""):
    argv = "".join(f"\n    - {a}" for a in args)
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: {entry}\n"
            f"  workload_kind: job\n" + (f"  args:{argv}\n" if args else "") +
            f"compute:\n  gpus: 0\n  cpus: 1\n  memory: 256Mi\n{extra}")


TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
HEX64 = re.compile(r"\b[0-9a-f]{64}\b")
PID = re.compile(r"\bpid \d+")
PROJECT = re.compile(r"<work>/tmp[^/\s]*")  # each project's own temporary directory
# Values that differ from machine to machine or run to run, by key: replaced by their type.
VARYING_KEYS = {
    "supervisor_pid", "shim_pid", "cpu_milli_total", "cpu_milli_free", "memory_bytes_total",
    "memory_bytes_free", "version",
}

# Keys whose value is the test's user name.
USER_KEYS = {"user", "created_by", "updated_by"}


def type_mark(value):
    """A stand-in that keeps the value's JSON type."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "<bool>"
    if isinstance(value, int):
        return "<int>"
    if isinstance(value, float):
        return "<float>"
    if isinstance(value, str):
        return "<string>"
    raise AssertionError(f"type_mark of {type(value)}")


class Normaliser:
    def __init__(self, names, dirs):
        self.names = names  # run name -> stand-in
        self.dirs = dirs    # temporary directory -> stand-in

    def text(self, s):
        for d, mark in self.dirs.items():
            s = s.replace(d, mark)
        s = PROJECT.sub("<work>/<project>", PID.sub("pid <int>", s))
        for name, mark in self.names.items():
            s = s.replace(name, mark)
        if TIME.match(s):
            return "<time>"
        return HEX64.sub("<sha256>", s)

    def __call__(self, value, key=None):
        if key in VARYING_KEYS and not isinstance(value, (dict, list)):
            return type_mark(value)
        if key in USER_KEYS and value == USER:
            return "<user>"
        if key == "members" and isinstance(value, list):
            return ["<user>" if v == USER else self(v) for v in value]
        if key == "groups" and isinstance(value, list):
            # The caller's groups: as many as the machine gives the test's user.
            return [type_mark(v) for v in value[:1]]
        if isinstance(value, dict):
            if value.get("type") == "Metered" and isinstance(value.get("data"), dict):
                # What a run held, and for how long ("held 0 GPU(s) and 0.1 CPU for 1.2s: ..."),
                # varies; what it held does not.
                data = {k: type_mark(v) if k in ("admitted_ms", "gpu_hours", "cpu_hours") else v
                        for k, v in value["data"].items()}
                value = dict(value, message="<metered>", data=data)
            return {self.text(k): self(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value


def http(home, method, path, body=None):
    """One request over the server's Unix socket; returns (status, parsed JSON body)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(home, "tau.sock"))
    data = (body or "").encode()
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: tau\r\nConnection: close\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
              + data)
    raw = b""
    while chunk := s.recv(65536):
        raw += chunk
    s.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b"\r\n")[0].split()[1])
    return status, json.loads(payload)


class EventStream:
    """GET /api/v1/events...: reads its server-sent events as they come. The stream's chunk
    framing is skipped over: each event is one `data:` line of JSON."""

    def __init__(self, home, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(os.path.join(home, "tau.sock"))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: tau\r\n\r\n".encode())
        self.raw, self.pos = b"", 0

    def next(self, wanted):
        """The data of the next event of type `wanted`."""
        pattern = re.compile(rb"event: (\w+)\r?\ndata: ([^\r\n]*)\n")
        while True:
            for m in pattern.finditer(self.raw, self.pos):
                self.pos = m.end()
                if m.group(1).decode() == wanted:
                    return json.loads(m.group(2))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"the event stream ended before a '{wanted}' event")
            self.raw += chunk

    def close(self):
        self.sock.close()


def shape(value):
    """The keys and types of a JSON value, without its values (lists: the shape of the first)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type_mark(value)


class ApiGoldenTest(ServerTestCase):
    def setUp(self):
        super().setUp()
        self.names = {}
        self.checked = []

    def get(self, path):
        return http(self.server.home, "GET", path)

    def submit(self, spec_text, files):
        name = super().submit(spec_text, files)
        spec_name = re.match(r"name: (\S+)", spec_text.split("\n")[1]).group(1)
        self.names[name] = f"<run:{spec_name}>"
        return name

    def normalise(self, value):
        dirs = {self.server.home: "<home>", self.work: "<work>"}
        # Longest first: a run name never hides inside another's stand-in.
        names = dict(sorted(self.names.items(), key=lambda kv: -len(kv[0])))
        return Normaliser(names, dirs)(value)

    def golden(self, label, value):
        """Compares `value` (normalised) with tests/data/api_golden/LABEL.json."""
        self.checked.append(label)
        text = json.dumps(self.normalise(value), indent=2, ensure_ascii=False) + "\n"
        path = os.path.join(GOLDEN_DIR, label + ".json")
        if UPDATE:
            os.makedirs(GOLDEN_DIR, exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            return
        self.assertTrue(os.path.exists(path),
                        f"{path} is missing; run with TAU_UPDATE_GOLDENS=1 to create it")
        with open(path) as f:
            want = f.read()
        self.maxDiff = None
        self.assertEqual(want, text, f"the reply for {label} differs from {path} (if the change "
                                     "is intended, rerun with TAU_UPDATE_GOLDENS=1 and review "
                                     "the diff)")

    def reply(self, label, path, status=200, method="GET", body=None):
        got_status, got = http(self.server.home, method, path, body)
        self.assertEqual(got_status, status, f"{method} {path}: {got}")
        self.golden(label, {"status": got_status, "body": got})
        return got

    def cli_json(self, label, *args):
        p = self.server.tau(*args, "-o", "json", check=0)
        self.golden(label, json.loads(p.stdout))

    def settled(self, reply):
        """A submission's reply, whose `pending` depends on whether a scheduling pass has seen
        the new run yet: null or an object, pinned as which."""
        run = dict(reply["run"])
        self.assertIn(type(run.get("pending")), (type(None), dict), run)
        run["pending"] = "<pending: null or object>"
        return {**reply, "run": run}

    def state(self, name):
        return self.get(f"/api/v1/runs/{name}")[1]["run"]["state"]

    def wait_state(self, name, state, timeout=60):
        wait_for(lambda: self.state(name) == state, timeout=timeout,
                 what=f"run {name} to be {state}")

    def test_every_reply_matches_its_golden(self):
        tau = self.server.tau
        # The default platform is sized to the machine; pin the reply's shape before replacing it.
        status, default = self.get("/api/v1/platform")
        self.assertEqual(status, 200)
        self.assertEqual(default["source"], "default")
        self.golden("platform_default_shape", shape(default))
        platform_file = os.path.join(self.work, "platform.yaml")
        with open(platform_file, "w") as f:
            f.write(PLATFORM)
        tau("platform", "apply", platform_file, check=0)

        self.reply("version", "/api/v1/version")
        self.reply("healthz", "/api/v1/healthz")
        self.reply("whoami", "/api/v1/whoami")
        self.reply("platform", "/api/v1/platform")
        self.reply("gpus_none", "/api/v1/gpus")

        # A run that succeeds and writes metrics, submitted as the CLI does, to see the reply.
        ok_spec = spec("golden-ok", "main.py")
        body = {"spec": {"file": "golden/tau.yaml", "yaml": ok_spec},
                "code": {"files": [{"path": "main.py", "mode": 0o644,
                                    "data": base64.b64encode(METRICS.encode()).decode()}]}}
        status, submitted = http(self.server.home, "POST", "/api/v1/runs", json.dumps(body))
        self.assertEqual(status, 201, submitted)
        ok = submitted["run"]["name"]
        self.names[ok] = "<run:golden-ok>"
        self.golden("submit", {"status": status, "body": self.settled(submitted)})
        # Code upload, as `tau run` does it: the manifest, the blob it lacks, the submission by
        # manifest (the same code: the stored snapshot serves it).
        content = METRICS.encode()
        digest = hashlib.sha256(content).hexdigest()
        manifest = [{"path": "main.py", "mode": 0o644, "size": len(content), "sha256": digest}]
        self.reply("code_missing_stored", "/api/v1/code/missing", method="POST",
                   body=json.dumps({"files": manifest}))
        other = b"print('other')\n"
        other_digest = hashlib.sha256(other).hexdigest()
        self.reply("code_missing", "/api/v1/code/missing", method="POST",
                   body=json.dumps({"files": [{"path": "other.py", "size": len(other),
                                               "sha256": other_digest}]}))
        self.reply("blob_put", f"/api/v1/blobs/{other_digest}", status=201, method="PUT",
                   body=other.decode())
        self.reply("blob_put_wrong_digest", f"/api/v1/blobs/{digest}", status=400, method="PUT",
                   body=other.decode())
        self.wait_state(ok, "Succeeded")

        # A run that fails, is retried once, and fails again.
        retry = ("resilience:\n  max_retries: 1\n  retry_on: [UserError]\n"
                 "  backoff_initial: 100ms\n  backoff_max: 100ms\n")
        fails = self.submit(spec("golden-fails", "main.py", extra=retry), {"main.py": FAILS})
        self.wait_state(fails, "Failed")

        # One run holds the queue's only CPU; the next waits for quota behind it.
        release = os.path.join(self.work, "release")
        holder = self.submit(spec("golden-holder", "wait.py", args=[release]),
                             {"wait.py": WAITER})
        self.wait_state(holder, "Running")
        waiting = self.submit(spec("golden-waiting", "wait.py", args=[release]),
                              {"wait.py": WAITER})

        def pending_reason():
            run = self.get(f"/api/v1/runs/{waiting}")[1]["run"]
            p = run.get("pending")
            return isinstance(p, dict) and p.get("code") == "WaitingForQuota"
        wait_for(pending_reason, what="the second run to wait for quota")
        # The queue view is made by the same pass as the run's pending info.
        wait_for(lambda: any(q["pending"] == 1 for q in self.get("/api/v1/queues")[1]["queues"]),
                 what="the queue view to show the pending run")

        self.reply("run_waiting", f"/api/v1/runs/{waiting}")
        self.reply("run_holder", f"/api/v1/runs/{holder}")
        self.reply("queues_busy", "/api/v1/queues")
        # What `tau queues` asks: the same queues without their runs, the counts kept.
        self.reply("queues_busy_summary", "/api/v1/queues?summary=1")
        self.reply("queue_main_busy", "/api/v1/queues/main")
        self.reply("capacity_busy", "/api/v1/capacity")
        self.reply("runs_active", "/api/v1/runs?active=1")
        self.cli_json("cli_status_waiting", "status", waiting)
        self.cli_json("cli_queues_busy", "queues")
        self.cli_json("cli_queue_show_busy", "queue", "show", "main")

        # The event stream starts with hello and the queue view.
        stream = EventStream(self.server.home, "/api/v1/events")
        self.golden("events_hello", stream.next("hello"))
        self.golden("events_queues_busy", stream.next("queues"))
        stream.close()
        # A stream of one run has no baseline event: its first run event is the next change.
        stream = EventStream(self.server.home, f"/api/v1/events?run={waiting}")
        stream.next("hello")

        # Cancelled while queued, then while running.
        self.reply("cancel", f"/api/v1/runs/{waiting}/cancel", status=202, method="POST")
        self.golden("events_run_cancelled", stream.next("run"))
        stream.close()
        self.wait_state(waiting, "Cancelled")
        tau("cancel", holder, check=0)
        self.wait_state(holder, "Cancelled")
        wait_for(lambda: self.get("/api/v1/capacity")[1]["active"] == 0,
                 what="the controller to let go of every run")

        self.reply("run_ok", f"/api/v1/runs/{ok}")
        self.reply("run_fails", f"/api/v1/runs/{fails}")
        self.reply("run_holder_cancelled", f"/api/v1/runs/{holder}")
        self.reply("run_waiting_cancelled", f"/api/v1/runs/{waiting}")
        self.reply("runs_all", "/api/v1/runs")
        self.reply("runs_failed", "/api/v1/runs?state=Failed")
        self.reply("runs_page", "/api/v1/runs?limit=2&offset=1")
        self.reply("queues_idle", "/api/v1/queues")
        self.reply("capacity_idle", "/api/v1/capacity")
        self.reply("metrics_ok", f"/api/v1/runs/{ok}/metrics")
        self.reply("metrics_ok_loss", f"/api/v1/runs/{ok}/metrics?name=loss")
        self.reply("artifacts_none", f"/api/v1/runs/{ok}/artifacts?digest=1")
        self.reply("error_artifact_traversal",
                   f"/api/v1/runs/{ok}/artifacts/file?path=output/../../etc/passwd", status=400)
        self.reply("validate_bad", "/api/v1/validate", method="POST",
                   body=json.dumps({"yaml": "schema_version: 1\nname: x\n", "file": "x.yaml"}))

        # The evidence record has a schema of its own (docs/evidence-record.schema.json): its
        # shape is pinned here, its values by the evidence tests.
        status, record = self.get(f"/api/v1/runs/{ok}/evidence")
        self.assertEqual(status, 200, record)
        self.golden("evidence_ok_shape", shape(record))

        # The CLI's machine-readable output is the reply (or a part of it).
        self.cli_json("cli_list_all", "list", "--all")
        self.cli_json("cli_describe_fails", "describe", fails)
        self.cli_json("cli_status_ok", "status", ok)
        self.cli_json("cli_queues_idle", "queues")
        self.cli_json("cli_whoami", "whoami")

        # Errors: the body and the status.
        self.reply("error_no_run", "/api/v1/runs/no-such-run", status=404)
        self.reply("error_no_queue", "/api/v1/queues/nosuch", status=404)
        self.reply("error_bad_state", "/api/v1/runs?state=Bogus", status=400)
        self.reply("error_bad_limit", "/api/v1/runs?limit=0", status=400)
        self.reply("error_cancel_unknown", "/api/v1/runs/no-such-run/cancel", status=404,
                   method="POST")
        self.reply("error_bad_submit", "/api/v1/runs", status=400, method="POST", body="{}")
        self.reply("error_bad_spec", "/api/v1/runs", status=400, method="POST",
                   body=json.dumps({"spec": {"yaml": "schema_version: 1\nname: x\n",
                                             "file": "x.yaml"}}))

        # A rerun is a new run of the same spec and code.
        status, rerun = http(self.server.home, "POST", f"/api/v1/runs/{fails}/rerun")
        self.assertEqual(status, 201, rerun)
        self.names[rerun["run"]["name"]] = "<run:golden-fails#rerun>"
        self.golden("rerun", {"status": status, "body": self.settled(rerun)})
        self.wait_state(rerun["run"]["name"], "Failed")

        # Identity: a token (its secret shown once), the caller's tokens, a workspace's secrets,
        # the audit trail (whose details name tokens and paths: its shape only).
        status, made = http(self.server.home, "POST", "/api/v1/tokens",
                            json.dumps({"description": "golden"}))
        self.assertEqual(status, 201, made)
        self.names[made["id"]] = "<token-id>"
        self.names[made["token"]] = "<token>"
        self.golden("token_create", {"status": status, "body": made})
        self.reply("tokens", "/api/v1/tokens")
        status, _ = http(self.server.home, "PUT", "/api/v1/workspaces/team/secrets/GOLDEN_KEY",
                         json.dumps({"value": "s3cret"}))
        self.assertEqual(status, 200)
        self.reply("secrets", "/api/v1/workspaces/team/secrets")
        status, audit = self.get("/api/v1/audit?limit=5")
        self.assertEqual(status, 200, audit)
        self.golden("audit_shape", shape(audit))
        # GPU health, on a machine without a driver.
        self.reply("health_check", "/api/v1/health/check", method="POST")
        self.cli_json("cli_secret_list", "secret", "list", "team")
        self.cli_json("cli_health_check", "health", "check")
        self.cli_json("cli_token_list", "admin", "token", "list")

        # A batch (POST /api/v1/runs/batch): an array of two runs sharing one code, made in one
        # transaction; then batches refused whole: a bad item (named by its index, with its
        # diagnostics) and one over the size limit.
        code = {"files": [{"path": "main.py", "mode": 0o644,
                           "data": base64.b64encode(METRICS.encode()).decode()}]}
        array_spec = {"file": "golden/tau.yaml", "yaml": spec("golden-array", "main.py")}
        batch = {"codes": [code],
                 "runs": [{"spec": array_spec, "code": 0, "array_index": i} for i in range(2)],
                 "array": {"first": 0, "last": 1}}
        status, made = http(self.server.home, "POST", "/api/v1/runs/batch", json.dumps(batch))
        self.assertEqual(status, 201, made)
        self.names[made["runs"][0]["array"]["name"]] = "<array:golden-array>"
        for i, run in enumerate(made["runs"]):
            self.names[run["name"]] = f"<run:golden-array-{i}>"
        self.golden("batch_array", {"status": status, "body": {
            "runs": [self.settled({"run": r})["run"] for r in made["runs"]]}})
        for run in made["runs"]:
            self.wait_state(run["name"], "Succeeded")
        self.reply("run_array", f"/api/v1/runs/{made['runs'][1]['name']}")
        bad = {"runs": [{"spec": array_spec, "code": code},
                        {"spec": {"file": "x.yaml", "yaml": "schema_version: 1\nname: x\n"}}]}
        self.reply("error_batch_bad_item", "/api/v1/runs/batch", status=400, method="POST",
                   body=json.dumps(bad))
        huge = {"runs": [{"spec": {"yaml": "x"}}] * 10001}
        self.reply("error_batch_too_large", "/api/v1/runs/batch", status=413, method="POST",
                   body=json.dumps(huge))

        if not UPDATE:
            # Every golden file is checked: one left behind by a removed check is stale.
            on_disk = sorted(f[:-5] for f in os.listdir(GOLDEN_DIR) if f.endswith(".json"))
            self.assertEqual(on_disk, sorted(self.checked))


if __name__ == "__main__":
    unittest.main()
