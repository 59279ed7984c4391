"""A full disk under TAU_HOME: the server restarts and serves reads, and a state change it
acknowledges is durable (a SIGKILL right after the answer does not lose it), or its answer says it
is pending.

TAU_HOME is a small tmpfs the test mounts (as root; skipped otherwise) and fills with a file."""
import errno
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from harness import TauServer, wait_for

SIZE_MIB = 64

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"
HELLO = "print('hello from before the disk filled', flush=True)\n"


def spec(name):
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.py\n"
            "  workload_kind: job\n")


def fill(path):
    """Writes `path` until the file system has no block left; its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    written = 0
    try:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


@unittest.skipUnless(os.geteuid() == 0, "needs root to mount a small tmpfs for TAU_HOME")
class FullDiskTest(unittest.TestCase):
    def setUp(self):
        self.home = tempfile.mkdtemp(prefix="tau-it-disk-", dir="/tmp")
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0700", "tmpfs",
                            self.home], capture_output=True, text=True)
        if p.returncode != 0:
            os.rmdir(self.home)
            self.skipTest(f"cannot mount a tmpfs: {p.stderr.strip()}")
        self.filler = os.path.join(self.home, "filler")
        self.work = tempfile.mkdtemp(prefix="tau-it-code-")
        self.server = TauServer(home=self.home).start()

    def tearDown(self):
        self.server.stop()  # empties the home; the mount point itself stays
        subprocess.run(["umount", "-l", self.home], check=False)
        os.rmdir(self.home)
        subprocess.run(["rm", "-rf", self.work], check=False)

    def submit(self, name, main):
        d = tempfile.mkdtemp(dir=self.work)
        with open(os.path.join(d, "main.py"), "w") as f:
            f.write(main)
        with open(os.path.join(d, "tau.yaml"), "w") as f:
            f.write(spec(name))
        return self.server.tau("run", "--detach", os.path.join(d, "tau.yaml"), check=0).stdout.strip()

    def running(self, name):
        run = self.submit(name, SLEEPER)
        self.server.wait_state(run, "Running")
        # Its worker is up (it printed), so a cancel stops a live attempt.
        wait_for(lambda: "sleeping" in self.server.tau("logs", run).stdout, what="the worker")
        return run

    def post(self, path):
        """POST over the server's socket; (status, reply) as soon as the answer is read."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        s.connect(os.path.join(self.home, "tau.sock"))
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: tau\r\nContent-Length: 0\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)

    def restart(self):
        self.server.kill(signal.SIGKILL)
        self.server.start()

    def test_server_restarts_on_a_full_disk_and_serves_reads(self):
        done = self.submit("disk-done", HELLO)
        self.server.wait_state(done, "Succeeded")
        live = self.running("disk-live")
        self.assertGreater(fill(self.filler), 0)
        self.assertEqual(os.statvfs(self.home).f_bavail, 0)

        started = time.monotonic()
        self.restart()  # fails (the socket never answers) if the server cannot start
        print(f"\nrestart on a full disk: serving after {time.monotonic() - started:.2f}s")
        listed = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)
        states = {r["name"]: r["state"] for r in listed["runs"]}
        self.assertEqual(states, {done: "Succeeded", live: "Running"})
        self.assertEqual(self.server.run_json(done)["run"]["state"], "Succeeded")
        self.assertIn("hello from before the disk filled",
                      self.server.tau("logs", done, check=0).stdout)
        self.assertIn("sleeping", self.server.tau("logs", live, check=0).stdout)
        self.assertRegex(self.server.server_log(), r"the disk of \S+ is full \(\d+ KiB free\)")

        # Once there is space again, changes go through: the live run is cancelled.
        os.unlink(self.filler)
        self.server.tau("cancel", live, check=0)
        self.server.wait_state(live, "Cancelled")

    def test_a_cancel_answered_survives_a_sigkill(self):
        run = self.running("cancel-kill")
        status, reply = self.post(f"/api/v1/runs/{run}/cancel")
        self.server.kill(signal.SIGKILL)  # right after the answer: nothing the loop did since
        self.assertEqual((status, reply), (202, {"cancelling": run}))
        self.server.start()
        self.assertEqual(self.server.wait_state(run, ["Cancelled", "Failed", "Succeeded"])
                         ["run"]["state"], "Cancelled")

    def test_a_cancel_on_a_full_disk_says_it_is_pending(self):
        run = self.running("cancel-full")
        fill(self.filler)
        started = time.monotonic()
        p = self.server.tau("cancel", run, check=0)
        waited = time.monotonic() - started
        print(f"\ncancel on a full disk answered after {waited:.2f}s: {p.stderr.strip()}")
        self.assertIn(f"cancelling {run}", p.stdout)
        # The disk is full, so the cancel cannot be recorded: the answer must not pass for durable.
        self.assertIn(f"the cancel of {run} is not recorded yet", p.stderr)
        self.assertIn("disk is full", p.stderr)
        self.assertEqual(self.server.run_json(run)["run"]["state"], "Running")
        # With space again, the queued cancel is recorded and takes effect.
        os.unlink(self.filler)
        self.assertEqual(self.server.wait_state(run, ["Cancelled", "Failed", "Succeeded"])
                         ["run"]["state"], "Cancelled")

    def test_a_plain_answer_on_a_full_disk_was_durable(self):
        """The finding itself: a cancel answered on a full disk, the server killed at once and
        restarted once there is space. Either the answer said pending, or the run is cancelled."""
        run = self.running("cancel-lost")
        fill(self.filler)
        status, reply = self.post(f"/api/v1/runs/{run}/cancel")
        self.server.kill(signal.SIGKILL)
        self.assertEqual(status, 202)
        os.unlink(self.filler)
        self.server.start()
        if "pending" in reply:
            return  # said so: a cancel that was never recorded may be lost with the server
        self.assertEqual(self.server.wait_state(run, ["Cancelled", "Failed", "Succeeded"])
                         ["run"]["state"], "Cancelled", reply)


if __name__ == "__main__":
    unittest.main()
