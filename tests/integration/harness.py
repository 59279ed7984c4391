"""Test harness: a real `tau server` in a temporary TAU_HOME, driven through the real `tau` CLI."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import warnings

# Tests read small files with open().read(); the warnings about it only hide real failures.
warnings.simplefilter("ignore", ResourceWarning)

BINARY_DIR = os.environ.get("TAU_BINARY_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
TAU = os.path.abspath(os.path.join(BINARY_DIR, "bin", "tau"))
FAKE_NVML = os.path.abspath(os.path.join(BINARY_DIR, "tests", "libnvidia-ml-fake.so"))
# The browser tests' scripts (Node.js with playwright-core, driving the system Chromium).
E2E = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium")


def require_browser(test):
    """Skips `test` unless Chromium and Node.js are here; installs tests/e2e's packages with
    `npm ci` when they are not yet."""
    if not CHROMIUM or not shutil.which("node"):
        test.skipTest("needs chromium and node (scripts/install-deps.sh)")
    if not os.path.isdir(os.path.join(E2E, "node_modules", "playwright-core")):
        p = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefix", E2E],
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            test.skipTest(f"npm ci --prefix tests/e2e failed: {p.stderr[-500:]}")


def wait_for(predicate, timeout=20.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over the server's Unix socket."""

    def __init__(self, path, timeout=60):
        super().__init__("tau", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def read_http_message(sock):
    """One whole HTTP/1.1 message from `sock`: its head, then as much body as Content-Length says
    (a server may write the two apart; a message cut short reads as a broken connection). What
    came before the connection closed, when it closes early."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next((l.split(b":")[1] for l in head.split(b"\r\n")
                       if l.lower().startswith(b"content-length:")), b"0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class UnixProxy:
    """A Unix-socket proxy in front of a server's socket `upstream`: each client connection is
    handed to `_serve` on a thread of its own. Use it as a context manager; `path` is its socket."""

    def __init__(self, path, upstream):
        self.path, self.upstream = path, upstream
        self._held = []  # the proxy's sockets, closed when it stops
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(8)

    def _dial(self):
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(self.upstream)
        self._held.append(upstream)
        return upstream

    def _serve(self, client):
        raise NotImplementedError

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def __enter__(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._listener.close()
        for s in self._held:
            s.close()


class AnswerLosingProxy(UnixProxy):
    """A proxy that loses answers: each request goes to the server, which answers it; when
    lose(route) says so, the answer is kept from the client, whose connection stays open and
    silent, as when a network drops a reply. answers[route] lists what the server answered, lost or
    not."""

    def __init__(self, path, upstream, lose):
        super().__init__(path, upstream)
        self.lose = lose
        self.answers = {}

    def _serve(self, client):
        upstream = self._dial()
        while True:
            request = read_http_message(client)
            if not request:
                return
            upstream.sendall(request)
            answer = read_http_message(upstream)  # the server has answered
            route = request.partition(b"\r\n")[0].split(b" ")[1].split(b"?")[0].decode()
            self.answers.setdefault(route, []).append(answer)
            if self.lose(route):
                return  # lost: the connection stays open and silent
            client.sendall(answer)


class RequestHoldingProxy(UnixProxy):
    """A proxy that holds requests back: before a connection's first request goes on,
    hold(request_line) is called, and may block (until the server has changed, say); then bytes
    flow both ways untouched, streams included."""

    def __init__(self, path, upstream, hold):
        super().__init__(path, upstream)
        self.hold = hold

    @staticmethod
    def _copy(src, dst):
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _serve(self, client):
        request = read_http_message(client)
        if not request:
            return
        self.hold(request.partition(b"\r\n")[0].decode())
        upstream = self._dial()
        upstream.sendall(request)
        threading.Thread(target=self._copy, args=(client, upstream), daemon=True).start()
        self._copy(upstream, client)


def free_port():
    """A TCP port on the loopback interface that nothing listens on right now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def processes_holding(directory):
    """The pids of processes with a file under `directory` open, or their working directory there."""
    prefix = directory.rstrip("/") + "/"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        links = []
        try:
            links.append(os.readlink(f"/proc/{entry}/cwd"))
            for fd in os.listdir(f"/proc/{entry}/fd"):
                links.append(os.readlink(f"/proc/{entry}/fd/{fd}"))
        except OSError:
            pass  # gone, or not ours to look at
        if any((link + "/").startswith(prefix) for link in links):
            found.append(int(entry))
    return found


class SystemUsers:
    """Unix accounts a test makes (as root) and removes after it: `system` ones for a workspace's
    run_users pool (no login, uid below 1000), or regular ones as people have. Names carry the
    test's pid, so tests running at once never share an account."""

    def __init__(self, *tags, system=True):
        self.names = {tag: f"tit{os.getpid()}{tag}" for tag in tags}
        for name in self.names.values():
            flags = ["--system"] if system else []
            self._retry(["useradd", *flags, "--no-create-home", "--user-group", "--shell",
                         "/usr/sbin/nologin", name])

    def __getitem__(self, tag):
        return self.names[tag]

    def uid(self, tag):
        import pwd
        return pwd.getpwnam(self.names[tag]).pw_uid

    def remove(self):
        for name in self.names.values():
            self._retry(["userdel", name], missing_ok=True)

    @staticmethod
    def _retry(argv, missing_ok=False):
        # useradd and userdel lock /etc/passwd: another test's may hold it for a moment.
        for _ in range(50):
            p = subprocess.run(argv, capture_output=True, text=True)
            if p.returncode == 0 or (missing_ok and p.returncode == 6):
                return
            if "lock" not in p.stderr:
                raise AssertionError(f"{' '.join(argv)}: {p.stderr}")
            time.sleep(0.1)
        raise AssertionError(f"{' '.join(argv)}: /etc/passwd stayed locked")


def as_user(user, argv, env=None, timeout=60, input=None):
    """Runs argv as a local user (runuser), with a minimal environment."""
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    base.update(env or {})
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return subprocess.run([runuser, "-u", user, "--", *argv], env=base, capture_output=True,
                          text=True, timeout=timeout, input=input)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class TauServer:
    """A tau server in its own TAU_HOME (short path: Unix socket paths are limited to 107 bytes)."""

    def __init__(self, gpus=None, extra_env=None, stop_grace_ms=1000, gpu_poll_ms=200,
                 extra_args=(), home=None):
        self.home = home or tempfile.mkdtemp(prefix="tau-it-", dir="/tmp")
        self.env = dict(os.environ)
        self.env["TAU_HOME"] = self.home
        self.env["XDG_CACHE_HOME"] = self.home + "-cache"  # the CLI's digest cache
        self.env.pop("TAU_SERVER", None)
        self.env["PIP_NO_INDEX"] = "1"
        self.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        if gpus is None:
            self.env["TAU_NVML_LIBRARY"] = "/nonexistent/libnvidia-ml.so.1"
        else:
            self.env["TAU_NVML_LIBRARY"] = FAKE_NVML
            self.env["TAU_FAKE_NVML_GPUS"] = str(gpus)
        self.env.update(extra_env or {})
        self.stop_grace_ms = stop_grace_ms
        self.gpu_poll_ms = gpu_poll_ms
        self.proc = None
        self.extra_args = list(extra_args)

    def start(self):
        with open(os.path.join(self.home, "server-test.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [TAU, "server", "--home", self.home, "--stop-grace", str(self.stop_grace_ms),
                 "--gpu-poll", str(self.gpu_poll_ms), *self.extra_args],
                env=self.env, stdout=log, stderr=log, start_new_session=True)
        sock = os.path.join(self.home, "tau.sock")
        wait_for(lambda: self._connectable(sock), what="the server socket")
        return self

    @staticmethod
    def _connectable(path):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    # Whether stop() exports and verifies the evidence bundles of the runs this server ended (a
    # test that breaks evidence on purpose turns it off).
    check_evidence = True
    EVIDENCE_CHECKED_RUNS = 12  # at most: a bound on what it adds to a test

    def verify_evidence(self):
        """`tau evidence export` + `tau evidence verify` of (up to 12 of) the finished runs; returns
        what failed, as text ("" when all verified)."""
        if not self.check_evidence or not self.proc or self.proc.poll() is not None:
            return ""
        listed = self.tau("list", "--all", "--limit", "1000", "-o", "json", check=None)
        if listed.returncode != 0:
            return ""
        runs = json.loads(listed.stdout or "[]")
        runs = [r for r in (runs.get("runs", runs) if isinstance(runs, dict) else runs)
                if r.get("state") in ("Succeeded", "Failed", "Cancelled")]
        failed = []
        with tempfile.TemporaryDirectory(prefix="tau-it-evidence-") as d:
            for run in runs[:self.EVIDENCE_CHECKED_RUNS]:
                bundle = os.path.join(d, run["name"] + ".tar.gz")
                steps = (("evidence", "export", run["name"], "-f", bundle),
                         ("evidence", "verify", bundle))
                for argv in steps:
                    p = self.tau(*argv, check=None, timeout=120)
                    if p.returncode != 0:
                        failed.append(f"tau {' '.join(argv[:2])} {run['name']} exited "
                                      f"{p.returncode}: {(p.stdout + p.stderr).strip()[-600:]}")
                        break
        return "\n".join(failed)

    def stop(self):
        evidence = self.verify_evidence()
        self.kill(signal.SIGTERM)
        # Stop anything left running by a test (a server started by the CLI, attempts).
        pid_file = os.path.join(self.home, "server.pid")
        if os.path.exists(pid_file):
            try:
                with open(pid_file) as f:
                    os.kill(int(f.read().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass
        subprocess.run(["pkill", "-9", "-f", self.home], check=False)
        # Shims forked by the zygote carry no path in their command line: find them, and anything
        # else of this home's, by the files they hold open there.
        for pid in processes_holding(self.home):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.home + "-cache", ignore_errors=True)
        if evidence:
            raise AssertionError("evidence of runs this server ended does not verify:\n" + evidence)

    def tau(self, *args, check=None, timeout=60, input=None):
        p = subprocess.run([TAU, *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout, input=input)
        if check is not None and p.returncode != check:
            raise AssertionError(
                f"tau {' '.join(args)} exited {p.returncode}, expected {check}\n"
                f"stdout: {p.stdout}\nstderr: {p.stderr}")
        return p

    def tau_http(self, path, status=200):
        """GET a path of the server over its Unix socket; returns the body as text. The answer's
        status must be `status`."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(self.home, "tau.sock"))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: tau\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        assert f" {status} ".encode() in head.split(b"\r\n")[0], head
        return body.decode()

    def run_json(self, name):
        return json.loads(self.tau("describe", name, "-o", "json", check=0).stdout)

    def wait_state(self, name, states, timeout=30):
        if isinstance(states, str):
            states = [states]
        def done():
            d = self.run_json(name)
            return d if d["run"]["state"] in states else None
        return wait_for(done, timeout=timeout, what=f"run {name} to reach {states}")

    def server_log(self):
        try:
            return open(os.path.join(self.home, "server-test.log")).read()
        except FileNotFoundError:
            return ""


class ServerTestCase(unittest.TestCase):
    gpus = None
    extra_env = None

    def setUp(self):
        self.server = TauServer(gpus=self.gpus, extra_env=self.extra_env).start()
        self.work = tempfile.mkdtemp(prefix="tau-it-code-")

    def tearDown(self):
        self.server.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def project(self, spec, files):
        """Writes a code directory with a tau.yaml; returns the spec path."""
        d = tempfile.mkdtemp(dir=self.work)
        for name, content in files.items():
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(content)
            if content.startswith("#!"):
                os.chmod(path, 0o755)
        with open(os.path.join(d, "tau.yaml"), "w") as f:
            f.write(spec)
        return os.path.join(d, "tau.yaml")

    def submit(self, spec, files):
        p = self.server.tau("run", "--detach", self.project(spec, files), check=0)
        return p.stdout.strip()

    def apply_platform(self, text):
        """`tau platform apply` of `text` (written to a file in the test's work folder); the
        completed process, whatever its exit status."""
        fd, path = tempfile.mkstemp(prefix="tau-it-platform-", suffix=".yaml", dir=self.work)
        os.write(fd, text.encode())
        os.close(fd)
        return self.server.tau("platform", "apply", path, check=None)
