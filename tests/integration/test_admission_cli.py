"""`tau admission simulate` against the golden files in tests/data/admission (the same goldens the engine's
unit tests use, here through the real CLI)."""
import glob
import json
import os
import subprocess
import unittest

from harness import TAU

DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "data", "admission"))


class AdmissionSimulateCliTest(unittest.TestCase):
    def test_goldens(self):
        files = sorted(glob.glob(os.path.join(DATA, "*.yaml")))
        self.assertGreater(len(files), 5)
        for path in files:
            with self.subTest(path=os.path.basename(path)):
                first = open(path).readline()
                cycles = first.split(":")[1].strip() if first.startswith("# cycles:") else "1"
                p = subprocess.run([TAU, "admission", "simulate", path, "--cycles", cycles],
                                   capture_output=True, text=True)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(path[:-5] + ".json") as f:
                    want = json.load(f)
                self.assertEqual(json.loads(p.stdout), want)

    def test_bad_input_reports_positions(self):
        path = "/tmp/tau-it-sim-bad.yaml"
        with open(path, "w") as f:
            f.write("flavors: [{name: default}]\nqueues:\n  - name: q\n    resource_groups:\n"
                    "      - covered_resources: [cpu]\n        flavors:\n          - name: default\n"
                    "            resources: [{name: cpu, nominl: 1}]\n")
        p = subprocess.run([TAU, "admission", "simulate", path], capture_output=True, text=True)
        os.unlink(path)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, r"tau-it-sim-bad\.yaml:8:\d+: error: .*nominl.*did you mean 'nominal'")


if __name__ == "__main__":
    unittest.main()
