"""Code upload: `tau run` sends a manifest, uploads only the blobs the server lacks, and the run's
work directory is made from the stored snapshot without letting the run change it."""
import hashlib
import json
import os
import re
import socket
import time
import unittest

from harness import ServerTestCase, SystemUsers, TauServer, wait_for

LISTING = r'''import hashlib, os, sys
out = {}
for root, dirs, files in os.walk("."):
    for f in files:
        p = os.path.relpath(os.path.join(root, f), ".")
        out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
# A worker that writes into a code file: refused (a read-only link) or its own copy.
try:
    with open("data.txt", "a") as f:
        f.write("changed by the run\n")
    wrote = "yes"
except OSError as e:
    wrote = type(e).__name__
with open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "listing.json"), "w") as f:
    import json
    json.dump({"files": out, "wrote": wrote}, f)
'''

DIGEST_SETTLED_S = 2  # DigestCache::kSettledSeconds

SPEC = """schema_version: 1
name: {name}
run:
  entrypoint: main.py
  workload_kind: job
compute:
  gpus: 0
"""


def request(home, method, path, body=b"", content_type="application/json"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(home, "tau.sock"))
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: tau\r\nConnection: close\r\n"
              f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    raw = b""
    while chunk := s.recv(65536):
        raw += chunk
    s.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b"\r\n")[0].split()[1]), json.loads(payload)


class CodeUploadTest(ServerTestCase):
    def counter(self, name):
        metrics = self.server.tau_http("/metrics")
        m = re.search(rf"^{name}(?:\{{\}})? (\S+)$", metrics, re.M)
        return int(float(m.group(1))) if m else 0

    def blobs_uploaded(self):
        return self.counter("tau_code_blobs_uploaded_total")

    def run_listing(self, spec_path):
        p = self.server.tau("run", "--detach", spec_path, check=0)
        name = p.stdout.strip()
        self.server.wait_state(name, "Succeeded")
        with open(os.path.join(self.server.home, "runs", name, "output", "listing.json")) as f:
            return name, json.load(f)

    def expected(self, d):
        out = {}
        for root, _, files in os.walk(d):
            for f in files:
                p = os.path.join(root, f)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, d)] = hashlib.sha256(f.read()).hexdigest()
        return out

    def test_unchanged_code_uploads_nothing_and_a_changed_file_one_blob(self):
        spec = self.project(SPEC.format(name="upload"),
                            {"main.py": LISTING, "data.txt": "original\n",
                             "pkg/util.py": "x = 1\n", "pkg/same.py": "x = 1\n"})
        d = os.path.dirname(spec)
        before = self.blobs_uploaded()
        checks = self.counter("tau_code_missing_checks_total")
        _, first = self.run_listing(spec)
        # Five files, four distinct contents (two files share one).
        self.assertEqual(self.blobs_uploaded() - before, 4)
        # tau run submits first: the refusal named the missing blobs, so it never asked apart
        # (unchanged code below is one request).
        self.assertEqual(self.counter("tau_code_missing_checks_total"), checks)
        # The run sees exactly its code (what it wrote into data.txt came after the listing).
        self.assertEqual(first["files"], self.expected(d))

        _, second = self.run_listing(spec)
        self.assertEqual(self.blobs_uploaded() - before, 4, "unchanged code uploaded a blob")
        # What the first run did to its data.txt is not in the next run's code.
        self.assertEqual(second["files"], self.expected(d))

        with open(os.path.join(d, "pkg", "util.py"), "w") as f:
            f.write("x = 2\n")
        _, third = self.run_listing(spec)
        self.assertEqual(self.blobs_uploaded() - before, 5)
        self.assertEqual(self.counter("tau_code_missing_checks_total"), checks)
        self.assertEqual(third["files"], self.expected(d))
        self.assertNotEqual(third["files"]["pkg/util.py"], second["files"]["pkg/util.py"])
        # Every snapshot's data.txt is the user's, whatever the runs wrote.
        snapshots = os.path.join(self.server.home, "snapshots")
        for digest in os.listdir(snapshots):
            with open(os.path.join(snapshots, digest, "data.txt")) as f:
                self.assertEqual(f.read(), "original\n")
            self.assertEqual(os.stat(os.path.join(snapshots, digest, "data.txt")).st_mode & 0o777,
                             0o444)

    def test_the_cli_reads_only_files_changed_since_it_hashed_them(self):
        spec = self.project(SPEC.format(name="cache"),
                            {"main.py": LISTING, "data.txt": "original\n", "b.txt": "other!!!\n"})
        d = os.path.dirname(spec)
        # The digest cache keeps only files whose change time had settled when it hashed them.
        time.sleep(DIGEST_SETTLED_S + 0.5)
        _, first = self.run_listing(spec)
        self.assertEqual(first["files"], self.expected(d))
        caches = os.path.join(self.server.env["XDG_CACHE_HOME"], "tau", "code-digests")
        [cache_file] = os.listdir(caches)
        with open(os.path.join(caches, cache_file)) as f:
            cache = json.load(f)
        self.assertEqual(cache["root"], os.path.realpath(d))
        self.assertEqual(sorted(cache["files"]), ["b.txt", "data.txt", "main.py", "tau.yaml"])
        # A file known as it is is not read again: told that data.txt holds b.txt's content (a
        # blob the server has), the CLI believes it, which is how the test sees no read.
        cache["files"]["data.txt"][4] = cache["files"]["b.txt"][4]
        with open(os.path.join(caches, cache_file), "w") as f:
            json.dump(cache, f)
        _, second = self.run_listing(spec)
        self.assertEqual(second["files"]["data.txt"], first["files"]["b.txt"])
        # A change of the same size with the old mtime put back still moves the file's ctime:
        # read again, and the run gets the new content.
        path = os.path.join(d, "data.txt")
        st = os.stat(path)
        with open(path, "w") as f:
            f.write("ORIGINAL\n")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        _, third = self.run_listing(spec)
        self.assertEqual(third["files"], self.expected(d))
        self.assertEqual(third["files"]["data.txt"], hashlib.sha256(b"ORIGINAL\n").hexdigest())

    def test_a_blob_is_refused_unless_it_is_its_digests_content(self):
        home = self.server.home
        content = b"print('hello')\n"
        digest = hashlib.sha256(content).hexdigest()
        status, body = request(home, "PUT", f"/api/v1/blobs/{hashlib.sha256(b'x').hexdigest()}",
                               content, "application/octet-stream")
        self.assertEqual(status, 400, body)
        self.assertIn(digest, body["error"]["message"])
        # A name that is not a digest is refused (one with a '/' matches no route at all).
        for name in ("..%2F..%2Ftau.db", "..", "ABC", digest.upper()):
            status, body = request(home, "PUT", f"/api/v1/blobs/{name}", content)
            self.assertIn(status, (400, 404), (name, body))
        self.assertEqual(sorted(os.listdir(os.path.join(home, "blobs"))), [])
        manifest = json.dumps({"files": [{"path": "a.py", "size": len(content),
                                          "sha256": digest}]}).encode()
        status, body = request(home, "POST", "/api/v1/code/missing", manifest)
        self.assertEqual((status, body["missing"], body["stored"]), (200, [digest], False))
        # A submission naming a blob never uploaded is refused, and says what to do.
        submit = json.dumps({"spec": {"yaml": SPEC.replace("main.py", "a.py").format(name="m")},
                             "code": {"manifest": json.loads(manifest)["files"]}}).encode()
        status, body = request(home, "POST", "/api/v1/runs", submit)
        self.assertEqual(status, 412, body)
        self.assertIn("upload them", body["error"]["message"])
        self.assertEqual(body["error"]["missing"], [digest])
        status, _ = request(home, "PUT", f"/api/v1/blobs/{digest}", content)
        self.assertEqual(status, 201)
        status, body = request(home, "POST", "/api/v1/code/missing", manifest)
        self.assertEqual(body["missing"], [])
        status, body = request(home, "POST", "/api/v1/runs", submit)
        self.assertEqual(status, 201, body)
        # Both bodies at once is not a shape the server guesses at.
        both = json.loads(submit)
        both["code"]["files"] = []
        status, body = request(home, "POST", "/api/v1/runs", json.dumps(both).encode())
        self.assertEqual(status, 400, body)

    def test_an_oversized_directory_is_refused_before_any_file_is_read(self):
        d = os.path.dirname(self.project(SPEC.format(name="big"), {"main.py": "print(1)\n"}))
        # A real file first (in walk order), then a sparse one past the limit: the old walk read
        # the first before it met the second. Reading a file moves its atime where atime is
        # before mtime (relatime), which is how the test sees a read.
        first = os.path.join(d, "a_first.bin")
        with open(first, "wb") as f:
            f.write(b"x" * 4096)
        with open(os.path.join(d, "z_sparse.bin"), "wb") as f:
            f.truncate(200 << 20)
        st = os.stat(first)
        os.utime(first, ns=(st.st_mtime_ns - 10**10, st.st_mtime_ns))
        probe = os.path.join(self.work, "probe")
        with open(probe, "wb") as f:
            f.write(b"p")
        pst = os.stat(probe)
        os.utime(probe, ns=(pst.st_mtime_ns - 10**10, pst.st_mtime_ns))
        open(probe, "rb").read()
        if os.stat(probe).st_atime_ns == pst.st_mtime_ns - 10**10:
            self.skipTest("this file system does not record reads in atime")
        before = self.blobs_uploaded()
        p = self.server.tau("run", "--detach", os.path.join(d, "tau.yaml"))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("holds more than 64 MiB", p.stderr)
        self.assertIn(".tauignore", p.stderr)
        self.assertEqual(os.stat(first).st_atime_ns, st.st_mtime_ns - 10**10,
                         "tau run read a file of a directory it refused")
        self.assertEqual(self.blobs_uploaded(), before)


# Two workspaces, each with its own members, and a user in none. Token users run as system users
# of their workspace's pool on a root server.
BLOB_PLATFORM = """schema_version: 1
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
workspaces:
  - name: alpha
    members: [ann, cora]
    default_queue: main
    default_priority: normal
  - name: beta
    members: [ben]
    default_queue: main
    default_priority: normal
"""

BLOB_SPEC = """name: {name}
engine: job
entrypoint: main.py
policy:
  workspace: {workspace}
"""

QUOTA_BYTES = 100_000  # --max-unreferenced-blob-bytes of the server below


class CodeBlobAccessTest(unittest.TestCase):
    """A blob's digest is no capability: a manifest names only blobs its caller uploaded or that a
    run they may read uses; only those who may submit upload, within a quota; tokens too have
    one."""

    @classmethod
    def setUpClass(cls):
        platform = BLOB_PLATFORM
        pool = SystemUsers("a1", "a2", "b1") if os.geteuid() == 0 else None
        if pool is not None:
            cls.addClassCleanup(pool.remove)  # after the server has stopped their runs
        # The system's python3 first: a pool user may not run one under /root.
        cls.server = TauServer(
            extra_env={"PATH": "/usr/local/bin:/usr/bin:/bin:" + os.environ.get("PATH", "")},
            extra_args=["--max-unreferenced-blob-bytes", str(QUOTA_BYTES)]).start()
        cls.addClassCleanup(cls.server.stop)
        if pool is not None:
            platform = platform.replace(
                "    members: [ann, cora]\n",
                f"    members: [ann, cora]\n    run_users: [{pool['a1']}, {pool['a2']}]\n").replace(
                "    members: [ben]\n", f"    members: [ben]\n    run_users: [{pool['b1']}]\n")
        path = os.path.join(cls.server.home, "platform.yaml.in")
        with open(path, "w") as f:
            f.write(platform)
        cls.server.tau("platform", "apply", path, check=0)
        cls.tokens = {}
        for user in ("ann", "ben", "cora", "eve"):
            p = cls.server.tau("admin", "token", "create", "--user", user, check=0)
            cls.tokens[user] = p.stdout.strip()

    def call(self, who, method, path, body=b"", content_type="application/json"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(os.path.join(self.server.home, "tau.sock"))
        auth = f"Authorization: Bearer {self.tokens[who]}\r\n" if who else ""
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: tau\r\nConnection: close\r\n{auth}"
                  f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                  + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
        s.close()
        head, _, payload = raw.partition(b"\r\n\r\n")
        return int(head.split(b"\r\n")[0].split()[1]), json.loads(payload)

    def put_blob(self, who, content):
        return self.call(who, "PUT", f"/api/v1/blobs/{hashlib.sha256(content).hexdigest()}",
                         content, "application/octet-stream")

    @staticmethod
    def manifest(files):
        return [{"path": p, "mode": 0o644, "size": len(c), "sha256": hashlib.sha256(c).hexdigest()}
                for p, c in files.items()]

    def missing(self, who, files):
        status, body = self.call(who, "POST", "/api/v1/code/missing",
                                 json.dumps({"files": self.manifest(files)}).encode())
        self.assertEqual(status, 200, body)
        return body["missing"], body["stored"]

    def submit(self, who, workspace, name, files):
        body = {"spec": {"yaml": BLOB_SPEC.format(name=name, workspace=workspace)},
                "code": {"manifest": self.manifest(files)}}
        return self.call(who, "POST", "/api/v1/runs", json.dumps(body).encode())

    def test_a_digest_from_another_workspace_is_missing_until_its_bytes_are_sent(self):
        secret = b"print('alpha only: ' + 'x' * 40)\n"
        digest = hashlib.sha256(secret).hexdigest()
        files = {"main.py": secret}
        # ann (alpha) uploads her file and runs it.
        self.assertEqual(self.missing("ann", files), ([digest], False))
        self.assertEqual(self.put_blob("ann", secret)[0], 201)
        status, made = self.submit("ann", "alpha", "mine", files)
        self.assertEqual(status, 201, made)
        # ben (beta) read the digest somewhere (evidence, a bundle): naming it gets him nothing.
        # The manifest is ann's exactly, so its snapshot is stored: still missing to him, and the
        # answer is the one for a blob nobody stored.
        self.assertEqual(self.missing("ben", files), ([digest], False))
        status, body = self.submit("ben", "beta", "theirs", files)
        self.assertEqual(status, 412, body)
        self.assertEqual(body["error"]["missing"], [digest])
        # The same through a batch.
        batch = {"codes": [{"manifest": self.manifest(files)}],
                 "runs": [{"spec": {"yaml": BLOB_SPEC.format(name="theirs", workspace="beta")},
                           "code": 0}]}
        status, body = self.call("ben", "POST", "/api/v1/runs/batch", json.dumps(batch).encode())
        self.assertEqual(status, 412, body)
        # cora, ann's colleague in alpha, may read ann's run: its code is hers to name.
        self.assertEqual(self.missing("cora", files), ([], True))
        # Sending the bytes proves ben has them; then they are his to use.
        status, body = self.put_blob("ben", secret)
        # 201 as for any blob new to him: the server having a copy is not his to learn.
        self.assertEqual(status, 201, body)
        self.assertEqual(self.missing("ben", files), ([], True))
        status, made = self.submit("ben", "beta", "theirs", files)
        self.assertEqual(status, 201, made)
        run = made["run"]["name"]
        wait_for(lambda: self.call("ben", "GET", f"/api/v1/runs/{run}")[1]["run"]["state"]
                 in ("Succeeded", "Failed"), timeout=60, what=f"{run} to end")
        self.assertEqual(self.call("ben", "GET", f"/api/v1/runs/{run}")[1]["run"]["state"],
                         "Succeeded")

    def test_only_those_who_may_submit_upload(self):
        content = b"eve's bytes\n"
        status, body = self.put_blob("eve", content)
        self.assertEqual(status, 403, body)
        self.assertIn("may submit to no workspace", body["error"]["message"])
        self.assertNotIn(hashlib.sha256(content).hexdigest(),
                         os.listdir(os.path.join(self.server.home, "blobs"))
                         if os.path.isdir(os.path.join(self.server.home, "blobs")) else [])
        # The server's own user is an admin: it may.
        self.assertEqual(self.put_blob(None, content)[0], 201)

    def test_bytes_no_run_uses_are_limited_per_identity_and_freed_by_a_run(self):
        first = b"#" + b"a" * 60_000 + b"\n"
        second = b"#" + b"b" * 60_000 + b"\n"
        self.assertEqual(self.put_blob("cora", first)[0], 201)
        # 60 kB that no run uses, and 60 kB more would pass the 100 kB limit: refused, saying why.
        status, body = self.put_blob("cora", second)
        self.assertEqual(status, 413, body)
        self.assertIn("--max-unreferenced-blob-bytes", body["error"]["message"])
        self.assertIn("no run uses", body["error"]["message"])
        # Sent again, what she uploaded already costs nothing more.
        self.assertEqual(self.put_blob("cora", first)[0], 200)
        # Another identity has a quota of its own.
        self.assertEqual(self.put_blob("ann", second)[0], 201)
        # Once a run uses her first upload, its bytes no longer count.
        status, made = self.submit("cora", "alpha", "uses-first", {"main.py": first})
        self.assertEqual(status, 201, made)
        status, body = self.put_blob("cora", second)
        self.assertEqual(status, 201, body)

    def test_a_user_holds_at_most_100_live_tokens(self):
        def create(user):
            status, body = self.call(None, "POST", "/api/v1/tokens",
                                     json.dumps({"user": user}).encode())
            return status, body

        made = []
        for _ in range(100):
            status, body = create("tina")
            self.assertEqual(status, 201, body)
            made.append(body["id"])
        # An admin minting for someone else counts against that user.
        status, body = create("tina")
        self.assertEqual(status, 429, body)
        self.assertIn("--max-tokens-per-user", body["error"]["message"])
        self.assertIn("revoke", body["error"]["message"])
        # Others are not held back by tina's tokens; a revoked one no longer counts.
        self.assertEqual(create("tom")[0], 201)
        self.assertEqual(self.call(None, "DELETE", f"/api/v1/tokens/{made[0]}")[0], 200)
        self.assertEqual(create("tina")[0], 201)
        self.assertEqual(create("tina")[0], 429)


if __name__ == "__main__":
    unittest.main()
