"""`tau cancel` with selectors instead of names: --array, --state, --all pick the caller's own runs
that have not ended, print what they cancelled, and say so (exit 0) when nothing matches; a bare
`tau cancel` is refused, and so are names mixed with selectors."""
import getpass
import json
import subprocess
import unittest

from harness import TAU, ServerTestCase

SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 16Mi\n")
SCRIPT = "#!/bin/sh\nsleep 120\n"


class CancelSelectorTest(ServerTestCase):
    def states(self):
        p = self.server.tau("list", "--all", "--limit", "1000", "-o", "json", check=0)
        return {r["name"]: r["state"] for r in json.loads(p.stdout)["runs"]}

    def test_selectors_cancel_only_what_they_name(self):
        spec = self.project(SPEC.format(name="sel"), {"main.sh": SCRIPT})
        lone = self.server.tau("run", "--detach", spec, check=0).stdout.strip()
        arr = self.server.tau("run", "--array", "0-2", "--detach", spec, check=0).stdout.split()
        self.assertEqual(len(arr), 3)
        array_name = arr[0].rsplit("-", 1)[0]

        # Neither a run nor a selector: refused, saying what to give.
        p = self.server.tau("cancel", check=125)
        self.assertIn("--all", p.stderr)
        p = self.server.tau("cancel", lone, "--all", check=125)
        self.assertIn("not both", p.stderr)
        # A state no run can be cancelled in is refused; --user and --all-users together too.
        p = self.server.tau("cancel", "--state", "succeeded", check=125)
        self.assertIn("Queued or Running", p.stderr)
        self.server.tau("cancel", "--user", "x", "--all-users", check=125)

        # --array cancels the array's runs and nothing else.
        p = self.server.tau("cancel", "--array", array_name, check=0)
        self.assertEqual(sorted(p.stdout.split()), sorted(["cancelling"] * 3 + arr))
        for name in arr:
            self.server.wait_state(name, "Cancelled")
        self.assertIn(self.states()[lone], ("Queued", "Running"))

        # An array with no run left, or another user's runs (none here): nothing, said, exit 0.
        p = self.server.tau("cancel", "--array", array_name, check=0)
        self.assertIn("nothing cancelled", p.stdout)
        p = self.server.tau("cancel", "--all-users", "--workflow", "none", check=0)
        self.assertIn("nothing cancelled", p.stdout)

        # Another user (signed in with a token of their own, not an admin): their --all is their
        # own runs (none), and others' runs are refused to them.
        token = self.server.tau("admin", "token", "create", "--user", "mallory",
                                check=0).stdout.strip()
        as_mallory = dict(self.server.env, TAU_TOKEN=token)
        def mallory(*args):
            return subprocess.run([TAU, "cancel", *args], env=as_mallory, capture_output=True,
                                  text=True, timeout=60)
        p = mallory("--all")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("nothing cancelled", p.stdout)
        for args in (("--all-users",), ("--user", getpass.getuser(), "--all")):
            p = mallory(*args)
            self.assertEqual(p.returncode, 125, p.stdout)
            self.assertIn("only platform admins", p.stderr)
        self.assertIn(self.states()[lone], ("Queued", "Running"))

        # --all takes the rest.
        p = self.server.tau("cancel", "--all", check=0)
        self.assertEqual(p.stdout.split(), ["cancelling", lone])
        self.server.wait_state(lone, "Cancelled")
        p = self.server.tau("cancel", "--all", check=0)
        self.assertIn("nothing cancelled", p.stdout)

    def test_state_picks_only_runs_in_that_state(self):
        spec = self.project(SPEC.format(name="st"), {"main.sh": SCRIPT})
        run = self.server.tau("run", "--detach", spec, check=0).stdout.strip()
        self.server.wait_state(run, "Running")
        p = self.server.tau("cancel", "--state", "queued", check=0)
        self.assertIn("nothing cancelled", p.stdout)
        self.assertEqual(self.states()[run], "Running")
        p = self.server.tau("cancel", "--state", "running", check=0)
        self.assertEqual(p.stdout.split(), ["cancelling", run])
        self.server.wait_state(run, "Cancelled")


if __name__ == "__main__":
    unittest.main()
