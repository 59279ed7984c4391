"""`tau server stop` stops the server of TAU_HOME gracefully and returns once it has, for an admin
only (a user signed in with a token of their own is refused and the server keeps serving);
`tau whoami` says which server answered and its version."""
import os
import re
import subprocess
import unittest

from harness import TAU, ServerTestCase


class ServerStopTest(ServerTestCase):
    def test_whoami_names_the_server_that_answered(self):
        p = self.server.tau("whoami", check=0)
        sock = os.path.join(self.server.home, "tau.sock")
        version = self.server.tau("version", check=0).stdout.split()[-1]
        self.assertIn(f"server:   unix://{sock} (tau {version})", p.stdout)

    def test_a_user_is_refused_and_an_admin_stops_it(self):
        token = self.server.tau("admin", "token", "create", "--user", "mallory",
                                check=0).stdout.strip()
        as_mallory = dict(self.server.env, TAU_TOKEN=token)
        p = subprocess.run([TAU, "server", "stop"], env=as_mallory, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 125, p.stdout + p.stderr)
        self.assertIn("admin", p.stderr)
        self.assertIsNone(self.server.proc.poll())
        self.server.tau("list", check=0)

        p = self.server.tau("server", "stop", check=0, timeout=150)
        self.assertRegex(p.stdout, r"server at unix://\S+ stopped")
        # Stopped when the command returns: the process has exited, by SIGTERM's graceful path.
        self.assertEqual(self.server.proc.wait(timeout=5), 0)
        self.assertIn("shutting down", self.server.server_log())
        self.assertFalse(os.path.exists(os.path.join(self.server.home, "server.pid")))
        # With nothing to stop it says so and starts none.
        p = self.server.tau("server", "stop", check=0)
        self.assertIn("nothing to stop", p.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.server.home, "server.pid")))


if __name__ == "__main__":
    unittest.main()
