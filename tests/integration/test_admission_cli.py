"""`tau admission simulate` against the golden files in tests/data/admission (the same goldens the engine's
unit tests use, here through the real CLI)."""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import TAU

DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "data", "admission"))


class AdmissionSimulateCliTest(unittest.TestCase):
    def test_goldens(self):
        files = sorted(glob.glob(os.path.join(DATA, "*.yaml")))
        self.assertGreater(len(files), 5)
        for path in files:
            with self.subTest(path=os.path.basename(path)):
                with open(path) as f:
                    first = f.readline()
                cycles = first.split(":")[1].strip() if first.startswith("# cycles:") else "1"
                p = subprocess.run([TAU, "admission", "simulate", path, "--cycles", cycles],
                                   capture_output=True, text=True)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(path[:-5] + ".json") as f:
                    want = json.load(f)
                self.assertEqual(json.loads(p.stdout), want)

    def test_bad_input_reports_positions(self):
        # A file of its own: two copies of the suite may run at once.
        fd, path = tempfile.mkstemp(prefix="tau-it-sim-bad-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("flavors: [{name: default}]\nqueues:\n  - name: q\n    resource_groups:\n"
                    "      - covered_resources: [cpu]\n        flavors:\n          - name: default\n"
                    "            resources: [{name: cpu, nominl: 1}]\n")
        p = subprocess.run([TAU, "admission", "simulate", path], capture_output=True, text=True)
        os.unlink(path)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, re.escape(path) + r":8:\d+: error: .*nominl.*did you mean 'nominal'")


if __name__ == "__main__":
    unittest.main()


class PlatformCliTest(unittest.TestCase):
    REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

    def test_platform_validate(self):
        ok = subprocess.run([TAU, "platform", "validate",
                             os.path.join(self.REPO, "examples/platform/platform.yaml")],
                            capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("2 workspace(s)", ok.stdout)
        invalid = sorted(glob.glob(os.path.join(self.REPO, "tests/data/policy/invalid/*.yaml")))
        self.assertGreater(len(invalid), 10)
        for path in invalid:
            with self.subTest(path=os.path.basename(path)):
                with open(path, errors="replace") as f:  # some cases are not UTF-8 on purpose
                    expect = f.readline().split("# expect:", 1)[1].strip()
                p = subprocess.run([TAU, "platform", "validate", path], capture_output=True, text=True)
                self.assertEqual(p.returncode, 1)
                self.assertIn(expect, p.stderr)

    def test_every_valid_platform_can_be_simulated_as_it_is(self):
        # docs/platform.md: a copy of a platform file plus workloads is a simulation; its policy
        # sections are accepted and named as not simulated, whichever the platform has.
        files = [os.path.join(self.REPO, "examples/platform/platform.yaml")] + sorted(
            glob.glob(os.path.join(self.REPO, "tests/data/policy/valid/*.yaml")))
        seen = set()
        for path in files:
            with self.subTest(path=os.path.basename(path)):
                with open(path) as f:
                    text = f.read()
                fd, copy = tempfile.mkstemp(suffix=".yaml")
                with os.fdopen(fd, "w") as f:
                    f.write(text + "\nworkloads: []\n")
                p = subprocess.run([TAU, "admission", "simulate", copy, "-o", "json"],
                                   capture_output=True, text=True)
                os.unlink(copy)
                self.assertEqual(p.returncode, 0, p.stderr)
                seen.update(json.loads(p.stdout).get("not_simulated", []))
        self.assertTrue({"budgets", "costs", "workspaces"} <= seen, seen)

    def test_explain_names_each_source(self):
        # A home of its own, with no server: `tau explain` without --platform asks the server it
        # finds, and for root that is the machine's (/var/lib/tau), which another suite may be
        # running with a platform of its own.
        home = tempfile.mkdtemp(prefix="tau-explain-")
        self.addCleanup(shutil.rmtree, home, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if k != "TAU_SERVER"}
        env["TAU_HOME"] = home
        spec = os.path.join(self.REPO, "examples/quickstart/tau.yaml")
        platform = os.path.join(self.REPO, "examples/platform/platform.yaml")
        p = subprocess.run([TAU, "explain", spec, "--platform", platform, "--user", "alice"],
                           env=env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"policy\.queue\s+research\s+workspace research default")
        self.assertRegex(p.stdout, r"compute\.cpus\s+1\s+spec")
        j = json.loads(subprocess.run([TAU, "explain", spec, "--platform", platform, "--user", "alice",
                                       "-o", "json"], env=env, capture_output=True, text=True).stdout)
        self.assertIn({"field": "compute.memory", "value": "512Mi", "source": "spec"}, j["provenance"])
        denied = subprocess.run([TAU, "explain", spec, "--platform", platform, "--user", "mallory"],
                                env=env, capture_output=True, text=True)
        self.assertEqual(denied.returncode, 1)
        self.assertIn("not a member of workspace 'research'", denied.stderr)
        default = subprocess.run([TAU, "explain", spec], env=env, capture_output=True, text=True)
        self.assertEqual(default.returncode, 0, default.stderr)
        self.assertIn("platform default", default.stdout)
