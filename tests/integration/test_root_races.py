"""A run's user against the root server's file operations on their run's directories.

A root server hands each attempt's directories (its code, checkpoints, outputs) to the run's user
and reads them back for evidence, while that user can change them. These tests are that user,
attacking as the review did: a local user's own process swaps a directory of their run for a
symbolic link to a directory of root's, over and over, while the run's attempts fail and are
retried (each start hands the trees over again). Nothing outside the run may change owner.
Then what a run leaves in /tmp and /dev/shm: private to its attempt, and its files are its
user's alone (umask 077). Then the loopback ports tau hands a run (a gang's rendezvous port, a
service replica's port): another user's connect is refused, the run's user and tau get through.

Real accounts made by the test (as root; skipped otherwise), a real server, real processes; the
race runs for TAU_RACE_SECONDS (30 by default).
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from harness import TAU, SystemUsers, TauServer, as_user, wait_for

RACE_SECONDS = float(os.environ.get("TAU_RACE_SECONDS", "30"))

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
    members: [{a}]
    default_queue: main
  - name: wb
    members: [{b}]
    default_queue: main
"""

# Says where its directories are, then fails, to be retried.
FAILER = r"""import json, os, sys
print("PLACES " + json.dumps({"cwd": os.getcwd(), "checkpoints": os.environ["TAU_CHECKPOINT_DIR"],
                              "output": os.environ["TAU_OUTPUT_DIR"]}), flush=True)
sys.exit(3)
"""

# Run by the run's user outside tau: in each directory, a subdirectory of files whose names the
# victim directory also has, swapped for a link to the victim and back, as fast as it can.
RACER = r"""import os, sys, time
victim, seconds, dirs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
names = sorted(os.listdir(victim))
for d in dirs:
    real = os.path.join(d, "race")
    os.makedirs(real, exist_ok=True)
    for n in names:
        open(os.path.join(real, n), "w").close()
swaps = 0
end = time.time() + seconds
while time.time() < end:
    for d in dirs:
        real, hold = os.path.join(d, "race"), os.path.join(d, "race.hold")
        try:
            os.rename(real, hold)
            os.symlink(victim, real)
            for _ in range(50):
                pass
            os.unlink(real)
            os.rename(hold, real)
            swaps += 1
        except OSError:
            # tau may have removed or moved something; put the directory back.
            if os.path.islink(real):
                os.unlink(real)
            if os.path.isdir(hold) and not os.path.exists(real):
                os.rename(hold, real)
print(swaps)
"""

# Leaves a file in /tmp and /dev/shm, says what it sees, waits to be let go.
LEAVER = r"""import json, os, sys, time
probe = os.environ["PROBE_NAME"]
with open("/tmp/" + probe, "w") as f:
    f.write("secret")
with open("/dev/shm/" + probe, "w") as f:
    f.write("secret")
u = os.umask(0)
os.umask(u)
print("SEEN " + json.dumps({
    "umask": u,
    "tmp_file_mode": os.stat("/tmp/" + probe).st_mode & 0o777,
    "shm_file_mode": os.stat("/dev/shm/" + probe).st_mode & 0o777,
    "tmp_owner": os.stat("/tmp").st_uid, "tmp_mode": os.stat("/tmp").st_mode & 0o7777,
    "shm_owner": os.stat("/dev/shm").st_uid, "uid": os.getuid()}), flush=True)
release = os.environ["RELEASE_FILE"]
deadline = time.time() + 120
while time.time() < deadline and not os.path.exists(release):
    time.sleep(0.1)
"""

# Two ranks of one attempt: rank 0 leaves a file in /dev/shm and /tmp, rank 1 must see both.
GANG = r"""import os, sys, time
rank = int(os.environ["RANK"])
name = os.environ["PROBE_NAME"]
if rank == 0:
    for d in ("/tmp/", "/dev/shm/"):
        with open(d + name, "w") as f:
            f.write("shared")
    time.sleep(3)
else:
    deadline = time.time() + 20
    while time.time() < deadline:
        if all(os.path.exists(d + name) for d in ("/tmp/", "/dev/shm/")):
            print("RANK1 SAW BOTH", flush=True)
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(1)
"""


# A gang whose rank 0 listens on the rendezvous port, as torch.distributed's store does; rank 1
# connects to it. Both wait to be let go.
RENDEZVOUS = r"""import os, socket, time
rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen(16)
    print("LISTENING " + str(port), flush=True)
else:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5)
            print("RANK1 CONNECTED", flush=True)
            break
        except OSError:
            time.sleep(0.05)
release = os.environ["RELEASE_FILE"]
deadline = time.time() + 120
while time.time() < deadline and not os.path.exists(release):
    time.sleep(0.1)
"""

APP = r"""import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        body = b"replica of " + os.environ.get("USER", "?").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""

SERVICE = """schema_version: 1
kind: service
name: {name}
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 100m
  memory: 64Mi
policy:
  workspace: wa
serve:
  replicas: 1
  readiness:
    http_path: /healthz
    period: 200ms
"""

# Connects to a port at each address that reaches it; prints what became of each.
CONNECT = r"""import errno, json, socket, sys
port, out = int(sys.argv[1]), {}
for address in ("127.0.0.1", "0.0.0.0", "::ffff:127.0.0.1"):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((address, port))
        out[address] = "connected"
    except OSError as e:
        out[address] = errno.errorcode.get(e.errno, str(e.errno))
    s.close()
print(json.dumps(out))
"""

# A GET through tau's endpoint on its Unix socket.
THROUGH_TAU = r"""import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(("GET /serve/" + sys.argv[2] + "/ HTTP/1.0\r\nHost: tau\r\n\r\n").encode())
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(data.decode(errors="replace").splitlines()[0])
"""


def write_project(directory, spec, main):
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o755)
    for name, text in (("tau.yaml", spec), ("main.py", main)):
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(directory, name), 0o644)
    return os.path.join(directory, "tau.yaml")


def line_after(log, prefix):
    for line in log.splitlines():
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    return None


def owners_below(root):
    """(path, uid) of root and everything below it, links themselves."""
    out = [(root, os.lstat(root).st_uid)]
    for base, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(base, n)
            out.append((p, os.lstat(p).st_uid))
    return out


@unittest.skipUnless(os.geteuid() == 0, "needs root: only root makes accounts and runs as them")
class RootRacesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.people = SystemUsers("a", "b", system=False)
        cls.addClassCleanup(cls.people.remove)
        # Outside /tmp, so that a run gets a /tmp of its own (a home under /tmp keeps it shared).
        home = tempfile.mkdtemp(prefix="tau-it-", dir="/var/tmp")
        cls.addClassCleanup(shutil.rmtree, home, True)
        cls.server = TauServer(home=home, extra_args=["--shared-socket"]).start()
        cls.addClassCleanup(cls.server.stop)
        cls.sock = os.path.join(cls.server.home, "tau.sock")
        cls.scratch = tempfile.mkdtemp(prefix="tau-it-races-", dir="/var/tmp")
        os.chmod(cls.scratch, 0o755)
        cls.addClassCleanup(shutil.rmtree, cls.scratch, True)
        platform = os.path.join(cls.scratch, "platform.yaml")
        with open(platform, "w") as f:
            f.write(PLATFORM.format(a=cls.people["a"], b=cls.people["b"]))
        cls.server.tau("platform", "apply", platform, check=0)

    def tau_as(self, user, *args):
        return as_user(user, [TAU, *args], env={"TAU_SERVER": f"unix://{self.sock}"})

    def submit(self, name, spec_extra, main, env=None):
        text = f"name: {name}\nengine: job\nentrypoint: main.py\npolicy:\n  workspace: wa\n"
        if env:
            text += "runtime:\n  env:\n" + "".join(f"    {k}: {v}\n" for k, v in env.items())
        text += spec_extra
        project = write_project(os.path.join(self.scratch, name), text, main)
        p = self.tau_as(self.people["a"], "run", "--detach", project)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.strip()

    def test_swapping_a_directory_for_a_link_gains_nothing_outside_the_run(self):
        # Root's directory, with the names the racer's directories hold, and a directory in it.
        victim = tempfile.mkdtemp(prefix="tau-it-victim-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, victim, True)
        os.chmod(victim, 0o755)
        for i in range(200):
            with open(os.path.join(victim, f"f{i:03d}"), "w") as f:
                f.write("root's")
        os.mkdir(os.path.join(victim, "d000"))
        before = owners_below(victim)
        self.assertTrue(all(uid == 0 for _, uid in before))
        # Attempts that fail at once, retried with a short backoff for about the race's length.
        retries = ("resilience:\n  max_retries: 100\n  retry_on: [UserError, SetupError]\n"
                   "  backoff_initial: 200ms\n  backoff_max: 200ms\n")
        run = self.submit("racer", retries, FAILER)
        self.addCleanup(self.server.tau, "cancel", run, check=None)
        places = wait_for(lambda: line_after(self.server.tau("logs", run, check=0).stdout,
                                             "PLACES "),
                          timeout=60, what="the run to say where its directories are")
        dirs = [places["checkpoints"], places["output"], places["cwd"]]
        p = as_user(self.people["a"], ["python3", "-c", RACER, victim, str(RACE_SECONDS), *dirs],
                    timeout=RACE_SECONDS + 60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreater(int(p.stdout.strip()), 100, "the racer swapped directories")
        d = self.server.run_json(run)
        self.assertGreaterEqual(len(d["attempts"]), 10, f"attempts were retried while it raced: {d}")
        gained = [(path, uid) for path, uid in owners_below(victim) if uid != 0]
        self.assertEqual(gained, [], "the run's user took files outside the run")
        self.assertEqual(sorted(p for p, _ in owners_below(victim)), sorted(p for p, _ in before),
                         "something outside the run was removed or added")
        # The run's own directories are still handed over as they should be.
        self.assertEqual(os.lstat(places["checkpoints"]).st_uid, self.people.uid("a"))

    def test_a_runs_tmp_and_shm_are_its_own(self):
        probe = f"tau-probe-{os.getpid()}"
        release = os.path.join(self.scratch, "release-leaver")
        self.addCleanup(lambda: open(release, "w").close())
        run = self.submit("leaver", "", LEAVER, {"PROBE_NAME": probe, "RELEASE_FILE": release})
        seen = wait_for(lambda: line_after(self.server.tau("logs", run, check=0).stdout, "SEEN "),
                        timeout=60, what="the run to say what it sees")
        uid_a = self.people.uid("a")
        self.assertEqual(seen["uid"], uid_a)
        self.assertEqual(seen["umask"], 0o077)
        self.assertEqual((seen["tmp_file_mode"], seen["shm_file_mode"]), (0o600, 0o600))
        self.assertEqual((seen["tmp_owner"], seen["tmp_mode"]), (uid_a, 0o700), seen)
        self.assertEqual(seen["shm_owner"], uid_a, seen)
        # Outside the attempt nobody sees the files: not root in the machine's namespace, not
        # another user.
        for d in ("/tmp/", "/dev/shm/"):
            self.assertFalse(os.path.exists(d + probe), d + probe)
        p = as_user(self.people["b"], ["python3", "-c",
                                       "import os,sys; print([d for d in ('/tmp/','/dev/shm/') "
                                       "if os.path.exists(d + sys.argv[1])])", probe])
        self.assertEqual(p.stdout.strip(), "[]", p.stderr)
        open(release, "w").close()
        done = self.server.wait_state(run, ["Succeeded", "Failed"], timeout=60)
        self.assertEqual(done["run"]["state"], "Succeeded")
        # The private /tmp went with the attempt.
        attempt_tmp = os.path.join(self.server.home, "runs", run, "attempts", "1", "tmp")
        wait_for(lambda: not os.path.exists(attempt_tmp), timeout=10, what="the attempt's /tmp gone")

    def test_the_ranks_of_an_attempt_share_their_tmp_and_shm(self):
        probe = f"tau-gang-{os.getpid()}"
        run = self.submit("gang", "compute:\n  workers: 2\n", GANG, {"PROBE_NAME": probe})
        done = self.server.wait_state(run, ["Succeeded", "Failed"], timeout=90)
        log = self.server.tau("logs", run, "--rank", "1", check=None).stdout
        self.assertEqual(done["run"]["state"], "Succeeded", log)
        self.assertIn("RANK1 SAW BOTH", log)
        for d in ("/tmp/", "/dev/shm/"):
            self.assertFalse(os.path.exists(d + probe), d + probe)


    def connect_as(self, user, port):
        argv = ["python3", "-c", CONNECT, str(port)]
        p = as_user(user, argv) if user else subprocess.run(argv, capture_output=True, text=True,
                                                               timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def test_a_gangs_rendezvous_port_is_its_users_alone(self):
        release = os.path.join(self.scratch, "release-rendezvous")
        self.addCleanup(lambda: open(release, "w").close())
        run = self.submit("rendezvous", "compute:\n  workers: 2\n", RENDEZVOUS,
                          {"RELEASE_FILE": release})
        def ready():
            log0 = self.server.tau("logs", run, "--rank", "0", check=None).stdout
            log1 = self.server.tau("logs", run, "--rank", "1", check=None).stdout
            if "RANK1 CONNECTED" not in log1:
                return None
            for line in log0.splitlines():
                if line.startswith("LISTENING "):
                    return int(line.split()[1])
            return None
        port = wait_for(ready, timeout=60, what="the gang to rendezvous")
        everywhere = {"127.0.0.1", "0.0.0.0", "::ffff:127.0.0.1"}
        stranger = self.connect_as(self.people["b"], port)
        self.assertEqual(stranger, {a: "EPERM" for a in everywhere}, "another user reached it")
        self.assertEqual(self.connect_as(self.people["a"], port),
                         {a: "connected" for a in everywhere})
        self.assertEqual(self.connect_as(None, port), {a: "connected" for a in everywhere})
        open(release, "w").close()
        self.assertEqual(self.server.wait_state(run, ["Succeeded", "Failed"], timeout=60)["run"]["state"],
                         "Succeeded")
        # Once the attempt is over the port is nobody's: the next listener there is not refused.
        wait_for(lambda: self.connect_as(self.people["b"], port)["127.0.0.1"] != "EPERM",
                 timeout=10, what="the port to be released")

    def test_a_replicas_port_is_reached_only_through_tau(self):
        name = "guarded"
        write_project(os.path.join(self.scratch, name), SERVICE.format(name=name), APP)
        p = self.tau_as(self.people["a"], "serve", "deploy",
                        os.path.join(self.scratch, name, "tau.yaml"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.addCleanup(self.server.tau, "serve", "delete", name, check=None)
        def ready():
            s = json.loads(self.server.tau("serve", "status", name, "-o", "json", check=0).stdout)
            return s if s.get("ready") == 1 else None
        status = wait_for(ready, timeout=60, what="the replica to be ready")
        port = status["replica_list"][0]["port"]
        everywhere = {"127.0.0.1", "0.0.0.0", "::ffff:127.0.0.1"}
        self.assertEqual(self.connect_as(self.people["b"], port),
                         {a: "EPERM" for a in everywhere}, "another user reached the replica")
        self.assertEqual(self.connect_as(self.people["a"], port)["127.0.0.1"], "connected")
        # Through tau's endpoint its owner gets an answer; the other user is refused by role.
        p = as_user(self.people["a"], ["python3", "-c", THROUGH_TAU, self.sock, name])
        self.assertIn(" 200 ", p.stdout, p.stderr)
        p = as_user(self.people["b"], ["python3", "-c", THROUGH_TAU, self.sock, name])
        self.assertNotIn(" 200 ", p.stdout, p.stderr)
        self.assertEqual(status["isolation"], {"ports": "owner-only"})
        text = self.server.tau("serve", "status", name, check=0).stdout
        self.assertIn("Isolation:  replica ports reachable only by the replicas' user and tau", text)


class CapDroppedServer(TauServer):
    """A root server without CAP_SYS_ADMIN and CAP_BPF, as in a container that grants neither."""

    def start(self):
        with open(os.path.join(self.home, "server-test.log"), "ab") as log:
            self.proc = subprocess.Popen(
                ["setpriv", "--bounding-set", "-sys_admin,-bpf", TAU, "server", "--home", self.home,
                 "--stop-grace", str(self.stop_grace_ms), "--gpu-poll", str(self.gpu_poll_ms),
                 *self.extra_args],
                env=self.env, stdout=log, stderr=log, start_new_session=True)
        sock = os.path.join(self.home, "tau.sock")
        wait_for(lambda: os.path.exists(sock) and self._connectable(sock), what="the server")
        return self


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"),
                     "needs root and setpriv: only root makes accounts and drops capabilities")
class WithoutMountNamespacesTest(unittest.TestCase):
    """Where root may make no mount namespace, a run as another user still runs, and says that its
    /tmp and /dev/shm are the machine's."""

    def test_a_run_still_runs_and_says_what_it_shares(self):
        people = SystemUsers("c", system=False)
        self.addCleanup(people.remove)
        home = tempfile.mkdtemp(prefix="tau-it-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, home, True)
        server = CapDroppedServer(home=home, extra_args=["--shared-socket"]).start()
        self.addCleanup(server.stop)
        scratch = tempfile.mkdtemp(prefix="tau-it-nocaps-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, scratch, True)
        os.chmod(scratch, 0o755)
        platform = os.path.join(scratch, "platform.yaml")
        with open(platform, "w") as f:
            f.write(PLATFORM.format(a=people["c"], b=people["c"]).replace(
                "  - name: wb\n    members: [" + people["c"] + "]\n    default_queue: main\n", ""))
        server.tau("platform", "apply", platform, check=0)
        main = ("import os\nu = os.umask(0)\nprint('UMASK', oct(u), 'TMP', oct(os.stat('/tmp').st_mode "
                "& 0o7777), flush=True)\n")
        project = write_project(os.path.join(scratch, "p"),
                                "name: nocaps\nengine: job\nentrypoint: main.py\npolicy:\n"
                                "  workspace: wa\n", main)
        p = as_user(people["c"], [TAU, "run", "--detach", project],
                    env={"TAU_SERVER": f"unix://{os.path.join(home, 'tau.sock')}"})
        self.assertEqual(p.returncode, 0, p.stderr)
        run = p.stdout.strip()
        done = server.wait_state(run, ["Succeeded", "Failed"], timeout=60)
        log = server.tau("logs", run, check=0).stdout
        self.assertEqual(done["run"]["state"], "Succeeded", log)
        self.assertIn("[tau] /tmp and /dev/shm are shared with the machine's other users", log)
        self.assertIn("UMASK 0o77 TMP 0o1777", log)


if __name__ == "__main__":
    unittest.main()
