"""A run's checkpoints and outputs through the API and the CLI (issue #23, docs/api.md "Artifacts"):
`tau artifacts` lists them with their sizes and digests, `tau get` fetches them byte for byte, a path
that leaves the run's directories is refused, and so is a user who may not read the run."""
import getpass
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import TAU, TauServer, wait_for

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
workspaces:
  - name: vision
    members: [alice, {me}]
    default_queue: main
    default_priority: normal
  - name: speech
    members: [bob]
    default_queue: main
    default_priority: normal
defaults:
  workspace: vision
"""

SPEC = """name: writer
engine: job
entrypoint: main.py
policy:
  workspace: vision
"""

# 300 KiB of output (several of the server's 64 KiB reads), a checkpoint in a subdirectory, a link
# that points out of the output directory, and a file outside it for the link to reach.
MAIN = """import os
out, ckpt = os.environ['TAU_OUTPUT_DIR'], os.environ['TAU_CHECKPOINT_DIR']
data = bytes((i * 7 + i // 251) % 256 for i in range(300 * 1024))
with open(os.path.join(out, 'result.bin'), 'wb') as f:
    f.write(data)
os.makedirs(os.path.join(ckpt, 'step-10'), exist_ok=True)
with open(os.path.join(ckpt, 'step-10', 'model.pt'), 'wb') as f:
    f.write(b'weights' * 1000)
with open(os.path.join(out, '..', 'outside.txt'), 'w') as f:
    f.write('not an artifact')
os.symlink(os.path.abspath(os.path.join(out, '..', 'outside.txt')), os.path.join(out, 'escape'))
os.symlink('/etc/passwd', os.path.join(out, 'passwd'))
print('wrote')
"""

RESULT = bytes((i * 7 + i // 251) % 256 for i in range(300 * 1024))
MODEL = b"weights" * 1000


class ArtifactsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = TauServer().start()
        cls.work = tempfile.mkdtemp(prefix="tau-it-art-")
        platform = os.path.join(cls.work, "platform.yaml")
        with open(platform, "w") as f:
            f.write(PLATFORM.replace("{me}", getpass.getuser()))
        cls.server.tau("platform", "apply", platform, check=0)
        cls.tokens = {}
        for user in ("alice", "bob"):
            p = cls.server.tau("admin", "token", "create", "--user", user, check=0)
            cls.tokens[user] = p.stdout.strip()
        code = os.path.join(cls.work, "code")
        os.makedirs(code)
        with open(os.path.join(code, "main.py"), "w") as f:
            f.write(MAIN)
        with open(os.path.join(code, "tau.yaml"), "w") as f:
            f.write(SPEC)
        # Submitted by the server's own user (a member of vision, as alice is); bob may not read it.
        cls.run_name = cls.server.tau("run", "--detach", os.path.join(code, "tau.yaml"),
                                      check=0).stdout.strip()
        done = cls.server.wait_state(cls.run_name, ["Succeeded", "Failed"], timeout=60)
        assert done["run"]["state"] == "Succeeded", (
            cls.server.tau("logs", cls.run_name).stdout + cls.server.server_log()[-2000:])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.work, ignore_errors=True)

    def tau_as(self, user, *args, cwd=None):
        env = dict(self.server.env)
        if user:
            env["TAU_TOKEN"] = self.tokens[user]
        return subprocess.run([TAU, *args], env=env, capture_output=True, timeout=60, cwd=cwd)

    def test_listed_with_sizes_and_digests(self):
        listing = json.loads(self.server.tau("artifacts", self.run_name, "-o", "json",
                                             check=0).stdout)
        files = {a["path"]: a for a in listing["artifacts"]}
        # The links are not artifacts: only regular files inside the directories are listed.
        self.assertEqual(sorted(files), ["checkpoint/step-10/model.pt", "output/result.bin"])
        self.assertEqual(files["output/result.bin"]["size"], len(RESULT))
        self.assertEqual(files["output/result.bin"]["sha256"], hashlib.sha256(RESULT).hexdigest())
        self.assertEqual(files["checkpoint/step-10/model.pt"]["kind"], "checkpoint")
        self.assertEqual(files["checkpoint/step-10/model.pt"]["size"], len(MODEL))
        self.assertEqual(files["checkpoint/step-10/model.pt"]["sha256"],
                         hashlib.sha256(MODEL).hexdigest())
        self.assertEqual((listing["total"], listing["truncated"], listing["undigested"]),
                         (2, False, 0))
        table = self.server.tau("artifacts", self.run_name, check=0).stdout
        self.assertIn("output/result.bin", table)
        self.assertIn(hashlib.sha256(RESULT).hexdigest(), table)
        self.assertIn(str(len(RESULT)), table)
        # Pages: one file at a time, and the rest said.
        page = self.server.tau("artifacts", self.run_name, "--limit", "1", "--offset", "1")
        self.assertEqual(page.returncode, 0, page.stderr)
        self.assertIn("output/result.bin", page.stdout)
        self.assertNotIn("model.pt", page.stdout)
        self.assertIn("files 2 to 2 of 2", page.stderr)

    def test_get_is_byte_identical(self):
        out = os.path.join(self.work, "fetched.bin")
        p = self.server.tau("get", self.run_name, "output/result.bin", "-f", out, check=0)
        self.assertIn(f"wrote {out} ({len(RESULT)} bytes)", p.stdout)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), RESULT)
        # The default name is the file's own, in the current directory.
        here = tempfile.mkdtemp(dir=self.work)
        p = self.tau_as(None, "get", self.run_name, "checkpoint/step-10/model.pt", cwd=here)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(here, "model.pt"), "rb") as f:
            self.assertEqual(f.read(), MODEL)
        # -f -: the bytes on stdout, nothing else.
        p = self.tau_as(None, "get", self.run_name, "output/result.bin", "-f", "-")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, RESULT)
        # A file that is there stays, unless --force says otherwise.
        with open(out, "wb") as f:
            f.write(b"mine")
        p = self.server.tau("get", self.run_name, "output/result.bin", "-f", out)
        self.assertEqual(p.returncode, 125)
        self.assertIn(f"{out} exists: give --force", p.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"mine")
        self.server.tau("get", self.run_name, "output/result.bin", "-f", out, "--force", check=0)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), RESULT)
        # -o is a format in tau: a file given to it is refused, naming -f, and nothing is written.
        p = self.server.tau("get", self.run_name, "output/result.bin", "-o", "json")
        self.assertEqual(p.returncode, 125)
        self.assertIn("-f json", p.stderr)
        self.assertFalse(os.path.exists("json"))

    def test_get_a_directory_fetches_every_file_under_it_and_overwrites_nothing(self):
        here = tempfile.mkdtemp(dir=self.work)
        # The default: a local directory named as the remote one, the same paths under it.
        p = self.tau_as(None, "get", self.run_name, "checkpoint", cwd=here)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(here, "checkpoint", "step-10", "model.pt"), "rb") as f:
            self.assertEqual(f.read(), MODEL)
        self.assertIn(b"1 file(s) of checkpoint", p.stdout)
        # -f DIR names the local directory; a trailing / is the same directory.
        into = os.path.join(here, "all-out")
        self.server.tau("get", self.run_name, "output/", "-f", into, check=0)
        with open(os.path.join(into, "result.bin"), "rb") as f:
            self.assertEqual(f.read(), RESULT)
        self.assertEqual(os.listdir(into), ["result.bin"])  # links are not artifacts
        # A file that is there stays, named, and nothing is written; --force replaces it.
        with open(os.path.join(into, "result.bin"), "wb") as f:
            f.write(b"mine")
        p = self.server.tau("get", self.run_name, "output", "-f", into)
        self.assertEqual(p.returncode, 125)
        self.assertIn(os.path.join(into, "result.bin") + " exists: give --force", p.stderr)
        with open(os.path.join(into, "result.bin"), "rb") as f:
            self.assertEqual(f.read(), b"mine")
        self.server.tau("get", self.run_name, "output", "-f", into, "--force", check=0)
        with open(os.path.join(into, "result.bin"), "rb") as f:
            self.assertEqual(f.read(), RESULT)
        # A directory is not one stream.
        p = self.server.tau("get", self.run_name, "checkpoint/step-10", "-f", "-")
        self.assertEqual(p.returncode, 125)
        self.assertIn("is a directory", p.stderr)

    def test_paths_that_leave_the_run_are_refused(self):
        here = tempfile.mkdtemp(dir=self.work)
        cases = [
            ("output/../outside.txt", "the path leaves its directory ('..')"),
            ("output/../../../../etc/passwd", "the path leaves its directory ('..')"),
            ("/etc/passwd", "start it with checkpoint/ or output/"),
            ("output//etc/passwd", "the path is absolute"),
            ("output/a/./b", "empty or '.' component"),
            ("logs/rank-0.log", "start it with checkpoint/ or output/"),
            ("output/escape", "leaves its directory through a symbolic link"),
            ("output/passwd", "leaves its directory through a symbolic link"),
            ("output/missing.txt", "no such file"),
        ]
        for path, message in cases:
            p = self.tau_as(None, "get", self.run_name, path, "-f", os.path.join(here, "x"))
            stderr = p.stderr.decode()
            self.assertNotEqual(p.returncode, 0, path)
            # Without openat2 (old kernels, some sandboxes) no link is followed at all.
            if "symbolic link" in message and "which is not followed here" in stderr:
                continue
            self.assertIn(message, stderr, path)
            self.assertEqual(os.listdir(here), [], f"{path}: a file was left behind")

    def test_another_user_is_refused_as_for_logs(self):
        allowed = self.tau_as("alice", "artifacts", self.run_name, "-o", "json")
        self.assertEqual(allowed.returncode, 0, allowed.stderr)
        self.assertEqual(len(json.loads(allowed.stdout)["artifacts"]), 2)
        logs = self.tau_as("bob", "logs", self.run_name)
        self.assertNotEqual(logs.returncode, 0)
        refusal = logs.stderr.decode().strip()
        self.assertIn("bob", refusal)
        for args in (("artifacts", self.run_name), ("get", self.run_name, "output/result.bin",
                                                     "-f", os.path.join(self.work, "bob.bin"))):
            p = self.tau_as("bob", *args)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertEqual(p.stderr.decode().strip(), refusal, args)
        self.assertFalse(os.path.exists(os.path.join(self.work, "bob.bin")))
        # The API answers both with 403, as it does the logs.
        for path in (f"/api/v1/runs/{self.run_name}/artifacts",
                     f"/api/v1/runs/{self.run_name}/artifacts/file?path=output/result.bin"):
            body = self.http_as("bob", path)
            self.assertEqual(body[0], 403, body)

    def http_as(self, user, path):
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(self.server.home, "tau.sock"))
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: tau\r\nConnection: close\r\n"
                   f"Authorization: Bearer {self.tokens[user]}\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ")[1]), body.decode(errors="replace")


if __name__ == "__main__":
    unittest.main()
