"""A shared machine with real Unix users: one user's runs are closed to every other user.

A root server with a shared socket, two local users (A and B, each in a workspace of their own) and
two token users of different workspaces. What A's run keeps on disk (its code, checkpoints,
outputs, metrics, logs and evidence) is out of B's reach through the file system and the API;
the token users' runs run as two different system users of their workspaces' pools and cannot
touch each other's files; a root server's default home works for token users, and one whose home
sits in a private directory refuses their runs at submission, naming the directory and its mode.

The accounts are made by the test (useradd) and removed after it; without root the test is
skipped: only root can make accounts and switch to them.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from harness import TAU, SystemUsers, TauServer, as_user, free_port, wait_for

PLATFORM = """schema_version: 1
queues:
  - name: main
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: default
            resources:
              - {{name: cpu, nominal: 64}}
              - {{name: memory, nominal: 256Gi}}
flavors:
  - name: default
workspaces:
  - name: wa
    members: [{a}, tok-a]
    default_queue: main
    run_users: [{pool_a}]
  - name: wb
    members: [{b}, tok-b]
    default_queue: main
    run_users: [{pool_b}]
"""

# A run that leaves something in every place a run keeps files, prints where they are, and waits
# until the test lets it go (or 120 s), so the test looks at a live run.
HOLDER = r"""import json, os, sys, time
ck = os.environ["TAU_CHECKPOINT_DIR"]
out = os.environ["TAU_OUTPUT_DIR"]
with open(os.path.join(ck, "step-1.pt"), "w") as f:
    f.write("weights")
with open(os.path.join(out, "result.txt"), "w") as f:
    f.write("result")
with open(os.environ["TAU_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"name": "loss", "value": 0.5, "step": 1}) + "\n")
print("PLACES " + json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "checkpoints": ck,
                              "output": out, "metrics": os.environ["TAU_METRICS_FILE"]}),
      flush=True)
release = os.environ.get("RELEASE_FILE", "")
deadline = time.time() + 120
while time.time() < deadline and not (release and os.path.exists(release)):
    time.sleep(0.1)
"""

# A run that tries to read, list and write another run's checkpoints, and reports each outcome.
PROBER = r"""import json, os
target = os.environ["TARGET_DIR"]
results = {"uid": os.getuid()}
for what, act in [("list", lambda: os.listdir(target)),
                  ("read", lambda: open(os.path.join(target, "step-1.pt")).read()),
                  ("write", lambda: open(os.path.join(target, "planted.pt"), "w").write("x"))]:
    try:
        act()
        results[what] = "allowed"
    except OSError as e:
        results[what] = e.strerror
print("PROBE " + json.dumps(results), flush=True)
"""

# Run as user B: every way to reach user A's run on disk, each outcome reported.
SNOOP = r"""import json, os, sys
places = json.loads(sys.argv[1])
results = {}
def attempt(name, act):
    try:
        act()
        results[name] = "allowed"
    except OSError as e:
        results[name] = e.strerror
for name, path in places.items():
    if os.path.isdir(path) or name.endswith("_dir"):
        attempt("list " + name, lambda p=path: os.listdir(p))
        attempt("write " + name, lambda p=path: open(os.path.join(p, "planted"), "w").write("x"))
    else:
        attempt("read " + name, lambda p=path: open(p, "rb").read(1))
        attempt("append " + name, lambda p=path: open(p, "ab").write(b"x"))
print(json.dumps(results))
"""


# Reports what it found of its code, then tries to change it in every way a worker could.
TAMPER = r"""import json, os
report = {"main": open("main.py").read(), "extra": os.path.exists("extra.py")}
def attempt(what):
    try:
        what()
        return "ok"
    except OSError as e:
        return type(e).__name__
report["write"] = attempt(lambda: open("main.py", "a").write("# changed"))
report["chmod"] = attempt(lambda: os.chmod("main.py", 0o644))
def replace():
    with open("main.py.new", "w") as f:
        f.write("# replaced")
    os.replace("main.py.new", "main.py")
report["replace"] = attempt(replace)
report["create"] = attempt(lambda: open("extra.py", "w").write("x = 1"))
print(json.dumps(report), flush=True)
"""


def write_project(directory, spec, main):
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o755)
    with open(os.path.join(directory, "tau.yaml"), "w") as f:
        f.write(spec)
    with open(os.path.join(directory, "main.py"), "w") as f:
        f.write(main)
    for name in ("tau.yaml", "main.py"):
        os.chmod(os.path.join(directory, name), 0o644)
    return os.path.join(directory, "tau.yaml")


def spec(name, workspace, env=None):
    text = f"name: {name}\nengine: job\nentrypoint: main.py\npolicy:\n  workspace: {workspace}\n"
    if env:
        text += "runtime:\n  env:\n" + "".join(f"    {k}: {v}\n" for k, v in env.items())
    return text


def places_of(log):
    for line in log.splitlines():
        if line.startswith("PLACES "):
            return json.loads(line[len("PLACES "):])
    return None


@unittest.skipUnless(os.geteuid() == 0, "needs root: only root makes accounts and runs as them")
class SharedMachineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.people = SystemUsers("a", "b", system=False)
        cls.addClassCleanup(cls.people.remove)
        cls.pool = SystemUsers("pa", "pb")
        cls.addClassCleanup(cls.pool.remove)
        cls.port = free_port()
        cls.server = TauServer(extra_args=[
            "--shared-socket", "--listen", f"127.0.0.1:{cls.port}", "--insecure-listen"]).start()
        cls.addClassCleanup(cls.server.stop)
        cls.sock = os.path.join(cls.server.home, "tau.sock")
        cls.scratch = tempfile.mkdtemp(prefix="tau-it-shared-")
        os.chmod(cls.scratch, 0o755)
        cls.addClassCleanup(shutil.rmtree, cls.scratch, True)
        platform = os.path.join(cls.scratch, "platform.yaml")
        with open(platform, "w") as f:
            f.write(PLATFORM.format(a=cls.people["a"], b=cls.people["b"], pool_a=cls.pool["pa"],
                                    pool_b=cls.pool["pb"]))
        cls.server.tau("platform", "apply", platform, check=0)
        cls.tokens = {}
        for user in ("tok-a", "tok-b"):
            p = cls.server.tau("admin", "token", "create", "--user", user, check=0)
            cls.tokens[user] = p.stdout.strip()

    def tau_as(self, user, *args):
        return as_user(user, [TAU, *args], env={"TAU_SERVER": f"unix://{self.sock}"})

    def tau_with_token(self, token, *args):
        env = dict(self.server.env)
        env["TAU_SERVER"] = f"http://127.0.0.1:{self.port}"
        env["TAU_TOKEN"] = token
        return subprocess.run([TAU, *args], env=env, capture_output=True, text=True, timeout=60)

    def wait_for_places(self, run):
        def seen():
            log = self.server.tau("logs", run, check=0).stdout
            return places_of(log)
        return wait_for(seen, timeout=60, what=f"{run} to say where its files are")

    def release(self, release_file):
        with open(release_file, "w"):
            pass
        os.chmod(release_file, 0o644)

    def test_another_user_reaches_nothing_of_a_run(self):
        a, b = self.people["a"], self.people["b"]
        release = os.path.join(self.scratch, "release-a")
        project = write_project(os.path.join(self.scratch, "holder"),
                                spec("holder", "wa", {"RELEASE_FILE": release}), HOLDER)
        p = self.tau_as(a, "run", "--detach", project)
        self.assertEqual(p.returncode, 0, p.stderr)
        run = p.stdout.strip()
        self.addCleanup(self.release, release)
        places = self.wait_for_places(run)
        self.assertEqual(places["uid"], self.people.uid("a"), "A's run runs as A")
        run_dir = os.path.join(self.server.home, "runs", run)
        # Everything the run keeps, and the server's own state around it.
        targets = {
            "run_dir": run_dir,
            "work_dir": places["cwd"],
            "checkpoints_dir": places["checkpoints"],
            "output_dir": places["output"],
            "attempts_dir": os.path.join(run_dir, "attempts"),
            "logs_dir": os.path.join(run_dir, "attempts", "1", "logs"),
            "evidence_dir": os.path.join(run_dir, "evidence"),
            "runs_dir": os.path.join(self.server.home, "runs"),
            "snapshots_dir": os.path.join(self.server.home, "snapshots"),
            "home_dir": self.server.home,
            "metrics": places["metrics"],
            "checkpoint": os.path.join(places["checkpoints"], "step-1.pt"),
            "code": os.path.join(places["cwd"], "main.py"),
            "log": os.path.join(run_dir, "attempts", "1", "logs", "rank-0.log"),
            "store": os.path.join(self.server.home, "tau.db"),
        }
        for name in ("metrics", "checkpoint", "code", "log", "store"):
            self.assertTrue(os.path.exists(targets[name]), f"{name}: {targets[name]}")
        p = as_user(b, ["python3", "-c", SNOOP, json.dumps(targets)])
        self.assertEqual(p.returncode, 0, p.stderr)
        outcomes = json.loads(p.stdout)
        allowed = {k: v for k, v in outcomes.items() if v == "allowed"}
        self.assertEqual(allowed, {}, f"B reached A's run: {allowed}")
        self.assertGreaterEqual(len(outcomes), 25)
        # Through the API B, of another workspace, sees nothing of it either.
        for args in (("describe", run), ("logs", run), ("metrics", run), ("cancel", run)):
            p = self.tau_as(b, *args)
            self.assertNotEqual(p.returncode, 0, f"tau {' '.join(args)} as B: {p.stdout}")
        p = self.tau_as(b, "list", "-o", "json")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn(run, p.stdout)
        # A still reads it all.
        p = self.tau_as(a, "logs", run)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("PLACES", p.stdout)
        self.release(release)
        done = self.server.wait_state(run, ["Succeeded", "Failed"], timeout=60)
        self.assertEqual(done["run"]["state"], "Succeeded")
        # Ended, its evidence is as closed as its live files were.
        evidence = os.path.join(run_dir, "evidence")
        wait_for(lambda: os.path.exists(os.path.join(evidence, "record.json")), timeout=30,
                 what="the final record")
        p = as_user(b, ["python3", "-c", SNOOP, json.dumps({
            "evidence_dir": evidence, "record": os.path.join(evidence, "record.json")})])
        self.assertNotIn("allowed", json.loads(p.stdout).values(), p.stdout)

    def test_a_run_cannot_change_the_code_another_users_run_of_it_gets(self):
        # The same code from two users is one snapshot; A's work directory links its read-only
        # files. A's run tries every way to change them: the next run, B's, must not see it.
        a, b = self.people["a"], self.people["b"]
        project = os.path.join(self.scratch, "same-code")
        write_project(project, spec("tamper", "wa"), TAMPER)
        os.chmod(project, 0o755)
        p = self.tau_as(a, "run", "--detach", os.path.join(project, "tau.yaml"))
        self.assertEqual(p.returncode, 0, p.stderr)
        first = p.stdout.strip()
        self.assertEqual(self.server.wait_state(first, ["Succeeded", "Failed"], timeout=60)["run"]["state"],
                         "Succeeded")
        tried = json.loads([line for line in self.server.tau("logs", first, check=0).stdout.splitlines()
                            if line.startswith("{")][0])
        self.assertEqual(tried["write"], "PermissionError", tried)
        self.assertEqual(tried["chmod"], "PermissionError", tried)
        # Its directories are its own: replacing a file and adding one work.
        self.assertEqual((tried["replace"], tried["create"]), ("ok", "ok"), tried)
        with open(os.path.join(project, "tau.yaml"), "w") as f:
            f.write(spec("tamper", "wb"))
        os.chmod(os.path.join(project, "tau.yaml"), 0o644)
        p = self.tau_as(b, "run", "--detach", os.path.join(project, "tau.yaml"))
        self.assertEqual(p.returncode, 0, p.stderr)
        second = p.stdout.strip()
        self.server.wait_state(second, ["Succeeded", "Failed"], timeout=60)
        seen = json.loads([line for line in self.server.tau("logs", second, check=0).stdout.splitlines()
                           if line.startswith("{")][0])
        with open(os.path.join(project, "main.py")) as f:
            self.assertEqual(seen["main"], f.read(), "B's run got code A's run changed")
        self.assertFalse(seen["extra"], "a file A's run made is in B's code")

    def test_token_users_of_two_workspaces_run_as_different_users(self):
        release = os.path.join(self.scratch, "release-tok")
        holder = write_project(os.path.join(self.scratch, "tok-holder"),
                               spec("tok-holder", "wa", {"RELEASE_FILE": release}), HOLDER)
        p = self.tau_with_token(self.tokens["tok-a"], "run", "--detach", holder)
        self.assertEqual(p.returncode, 0, p.stderr)
        run_a = p.stdout.strip()
        self.addCleanup(self.release, release)
        places = self.wait_for_places(run_a)
        self.assertEqual(places["uid"], self.pool.uid("pa"), "tok-a runs as wa's pool user")
        prober = write_project(os.path.join(self.scratch, "tok-prober"),
                               spec("tok-prober", "wb", {"TARGET_DIR": places["checkpoints"]}),
                               PROBER)
        p = self.tau_with_token(self.tokens["tok-b"], "run", "--detach", prober)
        self.assertEqual(p.returncode, 0, p.stderr)
        run_b = p.stdout.strip()
        done = self.server.wait_state(run_b, ["Succeeded", "Failed"], timeout=60)
        log = self.server.tau("logs", run_b, check=0).stdout
        self.assertEqual(done["run"]["state"], "Succeeded", log)
        probe = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
        self.assertEqual(probe["uid"], self.pool.uid("pb"))
        self.assertNotEqual(probe["uid"], places["uid"])
        self.assertEqual({k: probe[k] for k in ("list", "read", "write")},
                         {"list": "Permission denied", "read": "Permission denied",
                          "write": "Permission denied"})
        self.assertFalse(os.path.exists(os.path.join(places["checkpoints"], "planted.pt")))
        # A token user of a workspace whose pool is all taken is refused, saying what to do.
        p = self.server.tau("admin", "token", "create", "--user", "tok-late", check=0)
        late = p.stdout.strip()
        with open(os.path.join(self.scratch, "platform.yaml")) as f:
            text = f.read()
        text = text.replace("members: [" + self.people["a"] + ", tok-a]",
                            "members: [" + self.people["a"] + ", tok-a, tok-late]")
        platform = os.path.join(self.scratch, "platform-late.yaml")
        with open(platform, "w") as f:
            f.write(text)
        self.server.tau("platform", "apply", platform, check=0)
        p = self.tau_with_token(late, "run", "--detach", holder)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("workspaces[wa].run_users", p.stderr)
        self.assertIn("already runs another user's runs", p.stderr)
        self.release(release)
        self.server.wait_state(run_a, ["Succeeded", "Failed"], timeout=60)


@unittest.skipUnless(os.geteuid() == 0, "needs root: only root makes accounts and runs as them")
class RootHomeTest(unittest.TestCase):
    """Where a root server keeps its state decides whether token users' runs can reach it."""

    def setUp(self):
        self.pool = SystemUsers("ph")
        self.addCleanup(self.pool.remove)
        self.scratch = tempfile.mkdtemp(prefix="tau-it-home-")
        os.chmod(self.scratch, 0o755)
        self.addCleanup(shutil.rmtree, self.scratch, True)
        self.project = write_project(os.path.join(self.scratch, "p"), spec("hello", "default"),
                                     "import os\nprint('uid', os.getuid())\n")

    def platform(self):
        path = os.path.join(self.scratch, "platform.yaml")
        with open(path, "w") as f:
            f.write(PLATFORM.format(a="nobody", b="nobody", pool_a=self.pool["ph"],
                                    pool_b="tit-unused").replace("name: wa", "name: default")
                    + "defaults:\n  workspace: default\n")
        return path

    def submit_with_token(self, server):
        server.tau("platform", "apply", self.platform(), check=0)
        token = server.tau("admin", "token", "create", "--user", "tok-a", check=0).stdout.strip()
        env = dict(server.env)
        env["TAU_TOKEN"] = token
        return subprocess.run([TAU, "run", "--detach", self.project], env=env,
                              capture_output=True, text=True, timeout=60)

    def test_a_home_in_a_private_directory_is_refused_at_submission(self):
        private = os.path.join(self.scratch, "root-like")
        os.makedirs(private)
        os.chmod(private, 0o700)
        os.makedirs(os.path.join(private, ".tau"))
        server = TauServer(home=os.path.join(private, ".tau")).start()
        self.addCleanup(server.stop)
        p = self.submit_with_token(server)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn(f"cannot reach {private}: {private} is mode 0700, owned by root:root",
                      p.stderr)
        self.assertIn("tau server --home /var/lib/tau", p.stderr)

    def test_a_root_servers_default_home_works_for_token_users(self):
        machine_home = "/var/lib/tau"
        if os.path.exists(machine_home):
            self.skipTest(f"{machine_home} exists already: this machine has a tau server of its own")
        fake_root_home = os.path.join(self.scratch, "root")
        os.makedirs(fake_root_home)
        os.chmod(fake_root_home, 0o700)
        env = {k: v for k, v in os.environ.items() if k not in ("TAU_HOME", "TAU_SERVER")}
        env.update({"HOME": fake_root_home, "TAU_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"})
        log = open(os.path.join(self.scratch, "server.log"), "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen([TAU, "server", "--stop-grace", "1000"], env=env, stdout=log,
                                stderr=log, start_new_session=True)

        def stop():
            proc.terminate()
            proc.wait(timeout=20)
            shutil.rmtree(machine_home, ignore_errors=True)
        self.addCleanup(stop)
        sock = os.path.join(machine_home, "tau.sock")
        wait_for(lambda: os.path.exists(sock) and TauServer._connectable(sock), timeout=30,
                 what="the server on its default home")
        server = TauServer(home=machine_home)  # a handle only: its CLI calls go to that home
        p = self.submit_with_token(server)
        self.assertEqual(p.returncode, 0, p.stderr)
        run = p.stdout.strip()
        done = server.wait_state(run, ["Succeeded", "Failed"], timeout=60)
        logs = server.tau("logs", run, check=0).stdout
        self.assertEqual(done["run"]["state"], "Succeeded", logs)
        self.assertIn(f"uid {self.pool.uid('ph')}", logs)


@unittest.skipUnless(os.geteuid() == 0, "needs root: only root makes accounts and runs as them")
class PoolChangeTest(unittest.TestCase):
    """A platform change that drops a token user's pool account: the account stays theirs (it is
    never given to another), so they keep running as it rather than taking a second account of
    the pool for good and locking another user out; `tau platform apply` says so."""

    def setUp(self):
        self.pool = SystemUsers("q1", "q2")
        self.addCleanup(self.pool.remove)
        self.scratch = tempfile.mkdtemp(prefix="tau-it-pool-")
        os.chmod(self.scratch, 0o755)
        self.addCleanup(shutil.rmtree, self.scratch, True)
        self.project = write_project(os.path.join(self.scratch, "p"), spec("uid", "wa"),
                                     "import os\nprint('uid', os.getuid())\n")
        self.server = TauServer().start()
        self.addCleanup(self.server.stop)
        self.tokens = {user: self.server.tau("admin", "token", "create", "--user", user,
                                             check=0).stdout.strip()
                       for user in ("tok-a", "tok-b")}

    def apply(self, pool):
        path = os.path.join(self.scratch, "platform.yaml")
        with open(path, "w") as f:
            f.write(PLATFORM.format(a="tok-b", b="nobody", pool_b="tit-unused",
                                    pool_a=", ".join(self.pool[t] for t in pool)))
        return self.server.tau("platform", "apply", path, check=0)

    def uid_of_a_run_by(self, user):
        env = dict(self.server.env)
        env["TAU_TOKEN"] = self.tokens[user]
        p = subprocess.run([TAU, "run", "--detach", self.project], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        run = p.stdout.strip()
        done = self.server.wait_state(run, ["Succeeded", "Failed"], timeout=60)
        log = self.server.tau("logs", run, check=0).stdout
        self.assertEqual(done["run"]["state"], "Succeeded", log)
        return int(log.split("uid ", 1)[1].split()[0])

    def test_a_dropped_account_stays_its_users_and_locks_nobody_out(self):
        self.apply(["q1", "q2"])
        self.assertEqual(self.uid_of_a_run_by("tok-a"), self.pool.uid("q1"))
        p = self.apply(["q2"])
        self.assertIn(f"'{self.pool['q1']}' is no longer listed, but stays token user 'tok-a''s",
                      p.stderr)
        self.assertIn("delete the account to retire it", p.stderr)
        # tok-a goes on as q1, every time; q2 is left for tok-b, who is not locked out.
        self.assertEqual(self.uid_of_a_run_by("tok-a"), self.pool.uid("q1"))
        self.assertEqual(self.uid_of_a_run_by("tok-b"), self.pool.uid("q2"))
        self.assertEqual(self.uid_of_a_run_by("tok-a"), self.pool.uid("q1"))
        # Listing q1 again changes nothing, and applying says nothing more of it.
        p = self.apply(["q1", "q2"])
        self.assertNotIn("no longer listed", p.stderr)
        self.assertEqual(self.uid_of_a_run_by("tok-a"), self.pool.uid("q1"))


if __name__ == "__main__":
    unittest.main()
