"""Identity and authorization: API tokens, roles per workspace, and every endpoint checked.

A platform with two workspaces (vision, speech), a vision viewer, a platform-wide viewer and an
admin. Tokens are created by the server's own user (an admin on the Unix socket) with
`tau admin token create`; each test then calls the real API with those tokens, over the Unix
socket and over a loopback TCP listener, and checks the status every role gets on every route:
200-class where the role allows it, 403 where it does not (audited), 401 for a missing or unknown
token. Secrets set for a workspace reach the run's environment and never come back in any answer.
"""
import json
import os
import socket
import unittest

from harness import SystemUsers, TauServer, free_port, wait_for

PLATFORM = """schema_version: 1
queues:
  - name: main
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: default
            resources:
              - {name: cpu, nominal: 64}
              - {name: memory, nominal: 256Gi}
flavors:
  - name: default
priorities:
  - {name: normal, value: 0}
access:
  admins: [ops]
  viewers: [prometheus]
users:
  - name: carol
    groups: [vision-team]
workspaces:
  - name: vision
    members: [alice, "group:vision-team"]
    viewers: [dave]
    default_queue: main
    default_priority: normal
  - name: speech
    members: [bob]
    default_queue: main
    default_priority: normal
defaults:
  workspace: vision
"""

SECRET_VALUE = "s3cr3t-value-4711"
SYSTEM_PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin:" + os.environ.get("PATH", "")}

SPEC = """name: {name}
engine: job
entrypoint: main.py
policy:
  workspace: {workspace}
runtime:
  env:
    API_KEY: SECRET:api-key
"""

MAIN = """import os
print("key is", os.environ.get("API_KEY"))
print("argv-safe")
"""

PLAIN_SPEC = """name: {name}
engine: job
entrypoint: main.py
policy:
  workspace: {workspace}
"""


class Http:
    """Raw HTTP/1.1 over the server's Unix socket or TCP: the tests control every header."""

    def __init__(self, unix_path=None, port=None):
        self.unix_path, self.port = unix_path, port

    def call(self, method, path, token=None, body=None, head_only=False, cookie=None):
        if self.unix_path:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.unix_path)
        else:
            s = socket.create_connection(("127.0.0.1", self.port))
        s.settimeout(20)
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = [f"{method} {path} HTTP/1.1", "Host: tau", "Connection: close",
                   f"Content-Length: {len(data)}"]
        if body is not None:
            headers.append("Content-Type: application/json")
        if token:
            headers.append(f"Authorization: Bearer {token}")
        if cookie:
            headers.append(f"Cookie: {cookie}")
        s.sendall(("\r\n".join(headers) + "\r\n\r\n").encode() + data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            # Streams (logs with follow, events) never end on their own: the head is enough.
            if head_only and b"\r\n\r\n" in out:
                break
        s.close()
        head, _, rest = out.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.decode().partition(":")
            headers.setdefault(k.strip().lower(), []).append(v.strip())
        if "chunked" in ",".join(headers.get("transfer-encoding", [])) and not head_only:
            body_bytes, rest2 = b"", rest
            while rest2:
                size_line, _, rest2 = rest2.partition(b"\r\n")
                size = int(size_line.split(b";")[0] or b"0", 16)
                if size == 0:
                    break
                body_bytes += rest2[:size]
                rest2 = rest2[size + 2:]
            rest = body_bytes
        return status, headers, rest.decode(errors="replace")


class AuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        # Runs of token users without a system account run as `nobody` on a root server: the
        # system's python3 must come first (a per-user Python under /root is not theirs to run).
        cls.server = TauServer(extra_env=SYSTEM_PATH, extra_args=[
            "--listen", f"127.0.0.1:{cls.port}", "--insecure-listen"]).start()
        cls.unix = Http(unix_path=os.path.join(cls.server.home, "tau.sock"))
        cls.tcp = Http(port=cls.port)
        cls.work = cls.server.home + "/work"
        os.makedirs(cls.work)
        platform = os.path.join(cls.work, "platform.yaml")
        # On a root server token users without an account run as a system user of their
        # workspace's pool, each their own.
        cls.pool = SystemUsers("v1", "v2", "v3", "s1", "s2") if os.geteuid() == 0 else None
        if cls.pool is not None:
            cls.addClassCleanup(cls.pool.remove)
        with open(platform, "w") as f:
            f.write(PLATFORM if cls.pool is None else PLATFORM.replace(
                "    viewers: [dave]\n",
                f"    viewers: [dave]\n    run_users: [{cls.pool['v1']}, {cls.pool['v2']}, "
                f"{cls.pool['v3']}]\n").replace(
                "    members: [bob]\n",
                f"    members: [bob]\n    run_users: [{cls.pool['s1']}, {cls.pool['s2']}]\n"))
        cls.server.tau("platform", "apply", platform, check=0)
        cls.tokens = {}
        for user in ("alice", "bob", "dave", "prometheus", "ops", "carol", "eve"):
            p = cls.server.tau("admin", "token", "create", "--user", user, "--description",
                               f"test {user}", check=0)
            cls.tokens[user] = p.stdout.strip()
            assert cls.tokens[user].startswith("tau_"), p.stdout + p.stderr
        # A secret for vision (set by alice, a researcher there), then one run per workspace.
        status, _, body = cls.unix.call("PUT", "/api/v1/workspaces/vision/secrets/api-key",
                                        cls.tokens["alice"], {"value": SECRET_VALUE})
        assert status == 200, body
        cls.vision_run = cls.submit_as("alice", "seen", "vision", SPEC)
        cls.speech_run = cls.submit_as("bob", "heard", "speech", PLAIN_SPEC)
        for run in (cls.vision_run, cls.speech_run):
            wait_for(lambda: cls.state(run) in ("Succeeded", "Failed"), timeout=60,
                     what=f"{run} to finish")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    @classmethod
    def submit_as(cls, user, name, workspace, spec):
        d = os.path.join(cls.work, name)
        os.makedirs(d)
        with open(os.path.join(d, "main.py"), "w") as f:
            f.write(MAIN)
        with open(os.path.join(d, "tau.yaml"), "w") as f:
            f.write(spec.format(name=name, workspace=workspace))
        env = dict(cls.server.env, TAU_TOKEN=cls.tokens[user])
        import subprocess
        from harness import TAU
        p = subprocess.run([TAU, "run", "--detach", os.path.join(d, "tau.yaml")], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout.strip()

    @classmethod
    def state(cls, run):
        status, _, body = cls.unix.call("GET", f"/api/v1/runs/{run}")
        return json.loads(body)["run"]["state"] if status == 200 else None

    def call(self, who, method, path, body=None, via="unix", **kw):
        http = self.unix if via == "unix" else self.tcp
        token = {"anonymous": None, "bogus": "tau_" + "x" * 43}.get(who, self.tokens.get(who))
        if who == "local":  # the server's own user on the socket, no token
            token = None
        return http.call(method, path, token, body, **kw)

    # ---- the matrix ---------------------------------------------------------------------------

    def test_every_endpoint_with_every_role(self):
        v, s = self.vision_run, self.speech_run
        # (method, path, body, streaming, the callers allowed); everyone else must get 403, an
        # anonymous TCP caller or a bogus token 401, except on public routes.
        everyone = {"alice", "bob", "dave", "prometheus", "ops", "carol", "eve"}
        readers_v = {"alice", "dave", "prometheus", "ops", "carol"}
        writers_v = {"alice", "ops", "carol"}
        readers_s = {"bob", "prometheus", "ops"}
        writers_s = {"bob", "ops"}
        admins = {"ops"}
        platform_readers = {"prometheus", "ops"}
        routes = [
            ("GET", "/api/v1/version", None, False, everyone),
            ("GET", "/api/v1/whoami", None, False, everyone),
            ("GET", "/api/v1/gpus", None, False, everyone),
            ("GET", "/api/v1/capacity", None, False, everyone),
            ("GET", "/api/v1/queues", None, False, everyone),
            ("GET", "/api/v1/queues/main", None, False, everyone),
            ("GET", "/api/v1/platform", None, False, everyone),
            ("POST", "/api/v1/validate", {"yaml": "name: x\nengine: job\nentrypoint: a.py\n"}, False, everyone),
            # Anyone signed in may ask; the resolution itself refuses who is not a member of the
            # workspace (vision, the default), as a submission would.
            ("POST", "/api/v1/resolve", {"yaml": "name: x\nengine: job\nentrypoint: a.py\n"}, False,
             {"alice", "carol"}),
            ("GET", "/api/v1/runs", None, False, everyone),
            ("GET", "/api/v1/tokens", None, False, everyone),
            ("GET", "/metrics", None, False, platform_readers),
            ("GET", "/api/v1/audit", None, False, admins),
            ("POST", "/api/v1/health/check", None, False, admins),
            ("PUT", "/api/v1/platform", {"yaml": PLATFORM, "file": "platform.yaml"}, False, admins),
            ("GET", f"/api/v1/runs/{v}", None, False, readers_v),
            ("GET", f"/api/v1/runs/{v}/logs", None, False, readers_v),
            ("GET", f"/api/v1/runs/{v}/logs?follow=1", None, True, readers_v),
            ("GET", f"/api/v1/runs/{v}/evidence", None, False, readers_v),
            ("GET", f"/api/v1/runs/{v}/evidence/bundle", None, False, readers_v),
            ("GET", f"/api/v1/runs/{v}/metrics", None, False, readers_v),
            ("GET", f"/api/v1/runs/{v}/artifacts", None, False, readers_v),
            ("GET", f"/api/v1/runs/{v}/artifacts/file?path=output/none.txt", None, False,
             readers_v),
            ("GET", f"/api/v1/events?run={v}", None, True, readers_v),
            ("POST", f"/api/v1/runs/{v}/cancel", None, False, writers_v),
            ("POST", f"/api/v1/runs/{v}/resume", {}, False, writers_v),
            ("POST", f"/api/v1/runs/{v}/rerun", None, False, writers_v),
            ("GET", f"/api/v1/events", None, True, everyone),
            ("GET", f"/api/v1/runs/{s}", None, False, readers_s),
            ("GET", f"/api/v1/runs/{s}/logs", None, False, readers_s),
            ("GET", f"/api/v1/runs/{s}/artifacts", None, False, readers_s),
            ("POST", f"/api/v1/runs/{s}/cancel", None, False, writers_s),
            ("GET", "/api/v1/runs?workspace=speech", None, False, readers_s),
            ("GET", "/api/v1/workspaces/vision/secrets", None, False, readers_v),
            ("PUT", "/api/v1/workspaces/vision/secrets/other", {"value": "x"}, False, writers_v),
            ("PUT", "/api/v1/workspaces/speech/secrets/other", {"value": "x"}, False, writers_s),
            ("DELETE", "/api/v1/workspaces/speech/secrets/other", None, False, writers_s),
            ("GET", "/api/v1/workspaces/speech/secrets", None, False, readers_s),
        ]
        failures = []
        for method, path, body, stream, allowed in routes:
            for who in sorted(everyone) + ["anonymous", "bogus"]:
                via = "tcp" if who == "anonymous" else "unix"
                status, _, text = self.call(who, method, path, body, via=via, head_only=stream)
                if who in ("anonymous", "bogus"):
                    want = "401"
                    ok = status == 401
                elif who in allowed:
                    want = "not 401/403"
                    ok = status not in (401, 403) and status < 500
                else:
                    want = "403"
                    ok = status == 403
                if not ok:
                    failures.append(f"{who:10} {method} {path}: got {status}, want {want}: "
                                    f"{text[:200]}")
        self.assertEqual(failures, [], "\n".join(failures))

    def test_public_routes_and_tcp_callers(self):
        # Health probes and the dashboard's files need no token; everything else over TCP does.
        self.assertEqual(self.call("anonymous", "GET", "/api/v1/healthz", via="tcp")[0], 200)
        self.assertEqual(self.call("anonymous", "GET", "/", via="tcp")[0], 200)
        status, headers, body = self.call("anonymous", "GET", "/api/v1/runs", via="tcp")
        self.assertEqual(status, 401)
        self.assertIn("Bearer", ",".join(headers.get("www-authenticate", [])))
        self.assertIn("tau login", body)
        # A token works over TCP as over the socket; the socket's own user needs none.
        self.assertEqual(self.call("alice", "GET", "/api/v1/whoami", via="tcp")[0], 200)
        status, _, body = self.call("local", "GET", "/api/v1/whoami")
        self.assertEqual(status, 200)
        self.assertTrue(json.loads(body)["admin"])

    def test_lists_and_streams_show_only_visible_workspaces(self):
        def names(who):
            status, _, body = self.call(who, "GET", "/api/v1/runs?limit=100")
            self.assertEqual(status, 200, body)
            return {r["name"] for r in json.loads(body)["runs"]}
        self.assertIn(self.vision_run, names("alice"))
        self.assertNotIn(self.speech_run, names("alice"))
        self.assertEqual(names("bob") & {self.vision_run, self.speech_run}, {self.speech_run})
        self.assertNotIn(self.speech_run, names("dave"))
        self.assertTrue({self.vision_run, self.speech_run} <= names("prometheus"))
        self.assertEqual(names("eve") & {self.vision_run, self.speech_run}, set())

    def test_roles_from_groups_and_whoami(self):
        # carol is a researcher of vision through the group the platform gives her.
        status, _, body = self.call("carol", "GET", "/api/v1/whoami")
        me = json.loads(body)
        self.assertEqual(me["user"], "carol")
        self.assertIn("vision-team", me["groups"])
        self.assertIn({"name": "vision", "role": "researcher"}, me["workspaces"])
        me = json.loads(self.call("dave", "GET", "/api/v1/whoami")[2])
        self.assertEqual(me["workspaces"], [{"name": "vision", "role": "viewer"}])
        self.assertFalse(me["admin"])
        out = self.server.tau("whoami", check=0).stdout
        self.assertIn("admin", out)

    def test_explain_and_plan_resolve_as_the_signed_in_user(self):
        import subprocess
        from harness import TAU
        d = os.path.join(self.work, "explain-as")
        os.makedirs(d)
        with open(os.path.join(d, "main.py"), "w") as f:
            f.write(MAIN)
        spec = os.path.join(d, "tau.yaml")

        def resolve(user, workspace, *command):
            with open(spec, "w") as f:
                f.write(PLAIN_SPEC.format(name="explain-as", workspace=workspace))
            env = dict(self.server.env, TAU_TOKEN=self.tokens[user])
            return subprocess.run([TAU, *command, spec], env=env, capture_output=True, text=True,
                                  timeout=60)

        # With the applied platform and as the token's user, not the Unix account's.
        for command in (("explain",), ("plan",), ("explain", "-o", "json")):
            p = resolve("bob", "speech", *command)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("speech", p.stdout)
        # carol is a member of vision through her group only: the server's groups count too.
        self.assertEqual(resolve("carol", "vision", "plan").returncode, 0)
        p = resolve("eve", "speech", "explain")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("user 'eve' is not a member of workspace 'speech'", p.stderr)
        # Against the server over TCP, from a home with no platform of its own: the server resolves
        # with the platform in force (this machine's default has no workspace 'speech').
        import tempfile
        home = tempfile.mkdtemp(prefix="tau-it-elsewhere-")
        self.addCleanup(__import__("shutil").rmtree, home, True)
        remote = dict(self.server.env, TAU_TOKEN=self.tokens["bob"], TAU_HOME=home,
                      TAU_SERVER=f"http://127.0.0.1:{self.port}")
        for command in (("explain",), ("plan",), ("explain", "-o", "json")):
            p = subprocess.run([TAU, *command, spec], env=remote, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("speech", p.stdout)
        resolved = json.loads(subprocess.run([TAU, "explain", spec, "-o", "json"], env=remote,
                                             capture_output=True, text=True, timeout=60).stdout)
        self.assertEqual(resolved["resolved"]["workspace"], "speech")
        # --set travels with the spec: the server resolves it as set (carol is in vision, bob not).
        def remote_as(user, *command):
            return subprocess.run([TAU, *command, "--set", "policy.workspace=vision", spec],
                                  env=dict(remote, TAU_TOKEN=self.tokens[user]),
                                  capture_output=True, text=True, timeout=60)
        p = remote_as("carol", "explain", "-o", "json")
        self.assertEqual(p.returncode, 0, p.stderr)
        resolved = json.loads(p.stdout)
        self.assertEqual(resolved["resolved"]["workspace"], "vision")
        self.assertIn({"field": "policy.workspace", "value": "vision", "source": "command line"},
                      resolved["provenance"])
        p = remote_as("bob", "plan")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("user 'bob' is not a member of workspace 'vision'", p.stderr)
        # --platform resolves here instead, with that file.
        p = subprocess.run([TAU, "explain", spec, "--platform",
                            os.path.join(self.work, "platform.yaml")], env=remote,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_submission_needs_a_researcher_role(self):
        # dave only views vision; bob is not in vision at all: both refused, and both audited.
        for who in ("dave", "bob"):
            status, _, body = self.call(who, "POST", "/api/v1/runs",
                                        {"spec": {"yaml": PLAIN_SPEC.format(name="nope",
                                                                            workspace="vision"),
                                                  "file": "tau.yaml"}})
            self.assertEqual(status, 403, body)
            self.assertIn("vision", body)
        audit = json.loads(self.call("ops", "GET", "/api/v1/audit?limit=1000")[2])["audit"]
        denied = [a for a in audit if a["action"] == "denied" and a["path"] == "/api/v1/runs"
                  and a["method"] == "POST"]
        self.assertTrue({"dave", "bob"} <= {a["user"] for a in denied}, denied)

    def test_a_batch_needs_a_researcher_role_for_every_run(self):
        def batch(*workspaces):
            code = {"files": [{"path": "main.py", "data": "cHJpbnQoMSkK"}]}  # print(1)
            return {"codes": [code],
                    "runs": [{"spec": {"yaml": PLAIN_SPEC.format(name=f"batch{i}", workspace=w),
                                       "file": "tau.yaml"}, "code": 0}
                             for i, w in enumerate(workspaces)]}

        def run_count():
            return json.loads(self.call("ops", "GET", "/api/v1/runs?limit=1000")[2])["total"]

        before = run_count()
        # alice researches vision, not speech: the batch is refused whole, at its second run.
        status, _, body = self.call("alice", "POST", "/api/v1/runs/batch",
                                    batch("vision", "speech"))
        self.assertEqual(status, 403, body)
        err = json.loads(body)["error"]
        self.assertEqual(err["index"], 1, err)
        self.assertIn("speech", err["message"])
        # dave only views vision, bob is not in it: refused as a single submission is.
        for who in ("dave", "bob"):
            status, _, body = self.call(who, "POST", "/api/v1/runs/batch", batch("vision"))
            self.assertEqual(status, 403, body)
            self.assertIn("vision", body)
        status, _, body = self.call("anonymous", "POST", "/api/v1/runs/batch", batch("vision"),
                                    via="tcp")
        self.assertEqual(status, 401, body)
        self.assertEqual(run_count(), before)
        audit = json.loads(self.call("ops", "GET", "/api/v1/audit?limit=1000")[2])["audit"]
        denied = {a["user"] for a in audit if a["action"] == "denied" and
                  a["path"] == "/api/v1/runs/batch" and a["method"] == "POST"}
        self.assertTrue({"alice", "dave", "bob"} <= denied, denied)

    def test_denials_are_audited(self):
        self.call("bob", "POST", f"/api/v1/runs/{self.vision_run}/cancel")
        self.call("bogus", "GET", "/api/v1/runs")
        audit = json.loads(self.call("ops", "GET", "/api/v1/audit?limit=1000")[2])["audit"]
        self.assertTrue(any(a["user"] == "bob" and a["status"] == 403 and
                            a["path"] == f"/api/v1/runs/{self.vision_run}/cancel" and
                            "vision" in a["detail"] for a in audit), audit[:5])
        self.assertTrue(any(a["status"] == 401 and a["action"] == "unauthenticated" and
                            "unknown API token" in a["detail"] for a in audit))
        self.assertTrue(any(a["action"] == "token.create" for a in audit))
        self.assertTrue(any(a["action"] == "secret.set" and a["detail"] == "vision/api-key"
                            for a in audit))
        # The CLI shows the same trail.
        out = self.server.tau("admin", "audit", "--limit", "1000", check=0).stdout
        self.assertIn("denied", out)

    def test_tokens_revoked_expired_and_only_for_oneself(self):
        # Nobody but an admin makes a token for someone else, or with groups they lack.
        status, _, body = self.call("alice", "POST", "/api/v1/tokens", {"user": "bob"})
        self.assertEqual(status, 403, body)
        status, _, body = self.call("alice", "POST", "/api/v1/tokens", {"groups": ["admins"]})
        self.assertEqual(status, 403, body)
        status, _, body = self.call("alice", "POST", "/api/v1/tokens", {"description": "laptop"})
        self.assertEqual(status, 201, body)
        mine = json.loads(body)
        self.assertEqual(mine["user"], "alice")
        # Listed without the token; only digests are stored.
        listed = json.loads(self.call("alice", "GET", "/api/v1/tokens")[2])["tokens"]
        self.assertTrue(all(t["user"] == "alice" for t in listed))
        self.assertNotIn(mine["token"], json.dumps(listed))
        with open(os.path.join(self.server.home, "tau.db"), "rb") as f:
            self.assertNotIn(mine["token"].encode(), f.read())
        # Revoked: 401 from then on; alice cannot revoke someone else's.
        others = json.loads(self.call("ops", "GET", "/api/v1/tokens?user=bob")[2])["tokens"]
        self.assertEqual(self.call("alice", "DELETE", f"/api/v1/tokens/{others[0]['id']}")[0], 404)
        self.assertEqual(self.call("alice", "DELETE", f"/api/v1/tokens/{mine['id']}")[0], 200)
        status, _, body = Http(unix_path=self.unix.unix_path).call(
            "GET", "/api/v1/whoami", mine["token"])
        self.assertEqual(status, 401)
        self.assertIn("revoked", body)
        # A token's lifetime is checked on every call.
        status, _, body = self.call("ops", "POST", "/api/v1/tokens",
                                    {"user": "alice", "expires_in": "1s"})
        short = json.loads(body)["token"]
        wait_for(lambda: self.unix.call("GET", "/api/v1/whoami", short)[0] == 401, timeout=10,
                 what="the token to expire")
        self.assertIn("expired", self.unix.call("GET", "/api/v1/whoami", short)[2])

    def test_platform_declared_token(self):
        # Tokens can also be provisioned in platform.yaml as digests (no store, no CLI).
        token = "tau_" + "p" * 43
        digest = self.server.tau("admin", "token", "hash", input=token, check=0).stdout.strip()
        self.assertRegex(digest, "^[0-9a-f]{64}$")
        platform = PLATFORM.replace("users:\n", f"users:\n  - name: frank\n    token_sha256: [{digest}]\n")
        platform = platform.replace("members: [bob]", "members: [bob, frank]")
        status, _, body = self.call("ops", "PUT", "/api/v1/platform",
                                    {"yaml": platform, "file": "platform.yaml"})
        self.assertEqual(status, 200, body)
        try:
            me = json.loads(self.unix.call("GET", "/api/v1/whoami", token)[2])
            self.assertEqual(me["user"], "frank")
            self.assertIn({"name": "speech", "role": "researcher"}, me["workspaces"])
            shown = self.call("alice", "GET", "/api/v1/platform")[2]
            self.assertNotIn(digest, shown)  # digests are not shown to users
            self.assertEqual(json.loads(shown)["text"], "")
            # An admin gets the file as applied, which validates and applies back.
            self.assertEqual(json.loads(self.call("ops", "GET", "/api/v1/platform")[2])["text"],
                             platform)
        finally:
            self.call("ops", "PUT", "/api/v1/platform", {"yaml": PLATFORM, "file": "platform.yaml"})

    def test_dashboard_session_cookie(self):
        status, headers, _ = self.call("anonymous", "POST", "/api/v1/session",
                                       {"token": self.tokens["dave"]}, via="tcp")
        self.assertEqual(status, 200)
        cookie = headers["set-cookie"][0]
        self.assertIn("HttpOnly", cookie)
        self.assertIn("SameSite=Strict", cookie)
        pair = cookie.split(";")[0]
        status, _, body = self.tcp.call("GET", "/api/v1/whoami", cookie=pair)
        self.assertEqual(json.loads(body)["user"], "dave")
        # The cookie carries dave's role, no more.
        self.assertEqual(self.tcp.call("GET", f"/api/v1/runs/{self.speech_run}", cookie=pair)[0],
                         403)
        status, _, _ = self.call("anonymous", "POST", "/api/v1/session", {"token": "tau_nope"},
                                 via="tcp")
        self.assertEqual(status, 401)

    def test_secrets_reach_the_run_and_never_come_back(self):
        self.assertEqual(self.state(self.vision_run), "Succeeded")
        # The program printed its secret; tau serves the log masked.
        status, _, logs = self.call("alice", "GET", f"/api/v1/runs/{self.vision_run}/logs")
        self.assertEqual(status, 200)
        self.assertIn("key is ***", logs)
        self.assertIn("argv-safe", logs)
        out = self.server.tau("logs", self.vision_run, check=0).stdout
        self.assertIn("key is ***", out)
        self.assertNotIn(SECRET_VALUE, out)
        # Nowhere else either: run details, events, evidence, lists, the secret listing, the
        # server's log and its audit trail.
        answers = [self.call("ops", "GET", p)[2] for p in (
            f"/api/v1/runs/{self.vision_run}", f"/api/v1/runs/{self.vision_run}/evidence",
            "/api/v1/runs", "/api/v1/workspaces/vision/secrets", "/api/v1/audit?limit=1000",
            "/api/v1/queues", "/metrics")]
        answers.append(self.server.tau("describe", self.vision_run, "-o", "json", check=0).stdout)
        answers.append(self.server.tau("evidence", self.vision_run, check=0).stdout)
        answers.append(self.server.server_log())
        for text in answers:
            self.assertNotIn(SECRET_VALUE, text)
        # Stored logs were masked when the attempt ended, so the evidence bundle (hashed logs) and the
        # files on the server's disk hold no secret either.
        import glob
        import gzip
        logs_on_disk = glob.glob(os.path.join(self.server.home, "runs", self.vision_run, "**",
                                              "rank-0.log"), recursive=True)
        self.assertTrue(logs_on_disk)
        for path in logs_on_disk:
            text = open(path).read()
            self.assertIn("key is ***", text)
            self.assertNotIn(SECRET_VALUE, text)
        bundle = os.path.join(self.work, "bundle.tar.gz")
        self.server.tau("evidence", "export", self.vision_run, "-f", bundle, check=0)
        self.assertNotIn(SECRET_VALUE.encode(), gzip.open(bundle).read())
        self.server.tau("evidence", "verify", bundle, check=0)
        listed = json.loads(self.call("alice", "GET", "/api/v1/workspaces/vision/secrets")[2])
        by_key = {s["key"]: s for s in listed["secrets"]}
        self.assertEqual(by_key["api-key"]["size"], len(SECRET_VALUE))
        self.assertNotIn("value", by_key["api-key"])
        # The attempt's config file holds the env: only the server's user may read it.
        attempt_config = os.path.join(self.server.home, "runs", self.vision_run, "attempts", "1",
                                      "config.json")
        if os.path.exists(attempt_config):
            self.assertEqual(os.stat(attempt_config).st_mode & 0o077, 0)
        self.assertEqual(os.stat(os.path.join(self.server.home, "tau.db")).st_mode & 0o077, 0)

    def test_missing_secret_is_refused_at_submission(self):
        status, _, body = self.call("bob", "POST", "/api/v1/runs", {
            "spec": {"yaml": SPEC.format(name="nokey", workspace="speech"), "file": "tau.yaml"}})
        self.assertEqual(status, 412, body)
        self.assertIn("api-key", body)
        self.assertIn("tau secret set speech", body)

    def test_cli_login_uses_the_client_config(self):
        cfg = os.path.join(self.work, "client-config.json")
        env = dict(self.server.env, TAU_CONFIG=cfg)
        env.pop("TAU_TOKEN", None)
        import subprocess
        from harness import TAU
        url = f"http://127.0.0.1:{self.port}"
        p = subprocess.run([TAU, "login", url, "--token-stdin"], input=self.tokens["bob"],
                           env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("as bob", p.stdout)
        self.assertEqual(os.stat(cfg).st_mode & 0o777, 0o600)
        # Later commands find the server and the token in the config.
        p = subprocess.run([TAU, "list", "--all", "-o", "json"], env=env, capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(self.speech_run, p.stdout)
        self.assertNotIn(self.vision_run, p.stdout)
        p = subprocess.run([TAU, "logs", self.vision_run], env=env, capture_output=True,
                           text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("not a member", p.stderr)
        p = subprocess.run([TAU, "logout"], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = subprocess.run([TAU, "--server", url, "list"], env=env, capture_output=True,
                           text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("tau login", p.stderr)



RUN_AS_MAIN = """import os, pathlib
print("uid", os.getuid(), "gid", os.getgid())
pathlib.Path("written-in-cwd").write_text("ok")
pathlib.Path(os.environ["TAU_OUTPUT_DIR"], "out.txt").write_text("ok")
try:
    open(os.path.join(os.environ["HOME_PROBE"], "tau.db"), "rb")
    print("store readable")
except OSError:
    print("store not readable")
"""


@unittest.skipUnless(os.geteuid() == 0, "needs root: a multi-user machine's server runs as root")
class MultiUserMachineTest(unittest.TestCase):
    """A root server with a shared socket: each caller is known by the kernel, and each run's
    processes run as the user who submitted it, not as root."""

    def setUp(self):
        self.server = TauServer(extra_env=SYSTEM_PATH, extra_args=["--shared-socket"]).start()
        self.sock = os.path.join(self.server.home, "tau.sock")

    def tearDown(self):
        self.server.stop()

    def as_user(self, user, *args, cwd=None):
        import subprocess
        from harness import TAU
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp",
               "TAU_SERVER": f"unix://{self.sock}"}
        return subprocess.run(["runuser", "-u", user, "--", TAU, *args], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=60)

    def test_runs_run_as_their_submitter(self):
        self.assertEqual(os.stat(self.sock).st_mode & 0o777, 0o666)
        import tempfile
        d = tempfile.mkdtemp(prefix="tau-it-nobody-")
        os.chmod(d, 0o755)
        with open(os.path.join(d, "main.py"), "w") as f:
            f.write(RUN_AS_MAIN)
        with open(os.path.join(d, "tau.yaml"), "w") as f:
            f.write(f"name: mine\nengine: job\nentrypoint: main.py\nruntime:\n  env:\n"
                    f"    HOME_PROBE: {self.server.home}\n")
        for name in os.listdir(d):
            os.chmod(os.path.join(d, name), 0o644)
        p = self.as_user("nobody", "whoami", "-o", "json")
        self.assertEqual(p.returncode, 0, p.stderr)
        me = json.loads(p.stdout)
        self.assertEqual((me["user"], me["via"], me["admin"]), ("nobody", "unix", False))
        p = self.as_user("nobody", "run", "--detach", os.path.join(d, "tau.yaml"))
        self.assertEqual(p.returncode, 0, p.stderr)
        run = p.stdout.strip()
        done = self.server.wait_state(run, ["Succeeded", "Failed"], timeout=60)
        logs = self.server.tau("logs", run, check=0).stdout
        self.assertEqual(done["run"]["state"], "Succeeded", logs + self.server.server_log()[-2000:])
        self.assertIn("uid 65534", logs)
        self.assertIn("store not readable", logs)
        # nobody may not administer the server.
        p = self.as_user("nobody", "admin", "audit")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("only platform admins", p.stderr)


if __name__ == "__main__":
    unittest.main()
