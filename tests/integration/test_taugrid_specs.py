"""TauGrid's run configs, as TauGrid documents them, through the real CLI: every file of
tests/data/taugrid/specs validates (with exactly the warnings it declares, each at file:line:col),
explains against a cluster labelled the TauGrid way (each `# check: POINTER = VALUE` line a fact of
the resolution), and renders for Kubernetes."""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

from harness import TAU, ServerTestCase

DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "data", "taugrid"))
PLATFORM = os.path.join(DATA, "platform.yaml")


def pointer(doc, ptr):
    for part in ptr.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def header(path):
    checks, warnings = [], []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            if m := re.match(r"# check: (\S+) = (.*)$", line.rstrip("\n")):
                checks.append((m.group(1), m.group(2)))
            elif m := re.match(r"# warning: (.*)$", line.rstrip("\n")):
                warnings.append(m.group(1))
    return checks, warnings


class TauGridSpecsTest(unittest.TestCase):
    files = sorted(glob.glob(os.path.join(DATA, "specs", "*.yaml")))

    @classmethod
    def setUpClass(cls):
        # A home of its own: two copies of the suite may run at once.
        cls.home = tempfile.mkdtemp(prefix="tau-it-taugrid-home-")
        cls.addClassCleanup(shutil.rmtree, cls.home, True)

    def run_tau(self, *args):
        return subprocess.run([TAU, *args], capture_output=True, text=True,
                              env={**os.environ, "TAU_HOME": self.home})

    def test_corpus_is_large(self):
        self.assertGreaterEqual(len(self.files), 20)

    def test_validate_with_declared_warnings(self):
        for path in self.files:
            with self.subTest(spec=os.path.basename(path)):
                _, warnings = header(path)
                p = self.run_tau("validate", path)
                self.assertEqual(p.returncode, 0, p.stderr)
                # The corpus is specs without their code: that the local backend would refuse a
                # missing entrypoint is said, and is not what these files test.
                got = [l for l in p.stderr.splitlines() if ": warning: " in l
                       and "tau run would refuse it on the local backend" not in l]
                self.assertEqual(len(got), len(warnings), p.stderr)
                for want in warnings:
                    self.assertTrue(any(want in l for l in got), (want, got))
                for line in got:
                    self.assertRegex(line, re.escape(path) + r":\d+:\d+: warning: ")

    def test_explain_resolves_each_fact(self):
        for path in self.files:
            with self.subTest(spec=os.path.basename(path)):
                checks, _ = header(path)
                p = self.run_tau("explain", path, "--platform", PLATFORM, "--user", "alice",
                                 "-o", "json")
                self.assertEqual(p.returncode, 0, p.stderr)
                resolved = json.loads(p.stdout)["resolved"]
                for ptr, want in checks:
                    self.assertEqual(str(pointer(resolved, ptr)), want, ptr)

    def test_renders_for_kubernetes(self):
        for path in self.files:
            with self.subTest(spec=os.path.basename(path)):
                p = self.run_tau("plan", path, "--backend", "kubernetes", "--platform", PLATFORM,
                                 "--user", "alice",
                                 "--image", "python:3.12-slim")
                self.assertEqual(p.returncode, 0, p.stderr)
                docs = [d for d in yaml.safe_load_all(p.stdout) if d]
                kinds = {d["kind"] for d in docs}
                self.assertTrue(kinds & {"Job", "RayJob"}, kinds)
                for d in docs:
                    if d["kind"] in ("Job", "RayJob"):
                        self.assertIn("kueue.x-k8s.io/queue-name", d["metadata"]["labels"])

    def test_gpu_class_uses_the_platforms_label_keys(self):
        p = self.run_tau("plan", os.path.join(DATA, "specs", "topology-nvlink.yaml"), "--backend",
                         "kubernetes", "--platform", PLATFORM, "--user", "alice")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("tau.azure.com/gpu-class: a100-80gb", p.stdout)
        self.assertNotIn("tau.dev/gpu-class", p.stdout)

    def test_resolution_errors_carry_positions(self):
        fd, path = tempfile.mkstemp(prefix="tau-it-taugrid-bad-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("name: bad-lane\nengine: job\nentrypoint: train.py\npolicy:\n  lane: trainnig\n")
        p = self.run_tau("explain", path, "--platform", PLATFORM, "--user", "alice")
        os.unlink(path)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"{path}:5:3: error: policy.lane: workspace 'research' has no lane 'trainnig'",
                      p.stderr)
        self.assertIn("did you mean 'training'?", p.stderr)


# TauGrid's layout: the run configs in tau/, the code beside it, an entrypoint that leaves the spec's
# folder, and working_dir_excludes keeping data out of the snapshot.
LAYOUT_SPEC = """name: layout-train
engine: job
run:
  entrypoint: ../train.py
  working_dir_excludes: ['data/', '*.ckpt']
compute:
  gpus: 0
"""
LAYOUT_TRAIN = """import os
print("cwd", os.path.relpath(os.getcwd(), os.path.dirname(os.path.dirname(os.getcwd()))))
print("util", open("../lib/util.txt").read().strip())
print("data shipped", os.path.exists("../data"))
print("ckpt shipped", os.path.exists("../old.ckpt"))
"""


class TauGridLayoutTest(ServerTestCase):
    def layout(self):
        root = tempfile.mkdtemp(prefix="layout-", dir=self.work)
        files = {"tau/train.yaml": LAYOUT_SPEC, "train.py": LAYOUT_TRAIN,
                 "lib/util.txt": "helpers\n", "data/big.bin": "x" * 1000, "old.ckpt": "weights"}
        for name, content in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w") as f:
                f.write(content)
        return root, os.path.join(root, "tau", "train.yaml")

    def test_entrypoint_outside_the_spec_folder_runs_from_the_project(self):
        root, spec = self.layout()
        p = self.server.tau("run", spec, check=0, timeout=120)
        lines = p.stdout.splitlines()
        base = os.path.basename(root)
        # The run starts in the spec's folder inside the shipped project, as on the user's machine.
        self.assertIn(f"cwd {os.path.join('work', 'tau')}", lines, p.stdout)
        self.assertIn("util helpers", lines)
        self.assertIn("data shipped False", lines)
        self.assertIn("ckpt shipped False", lines)
        self.assertNotIn(base, p.stdout)

    def test_the_spec_folders_code_alone_ships_without_a_parent_entrypoint(self):
        root, spec = self.layout()
        with open(spec, "w") as f:
            f.write(LAYOUT_SPEC.replace("../train.py", "train.py"))
        p = self.server.tau("run", spec, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("run.entrypoint: 'train.py' is not among the 1 file(s)", p.stderr)

    def test_renders_for_kubernetes_from_the_spec_folder(self):
        root, spec = self.layout()
        p = subprocess.run([TAU, "plan", spec, "--backend", "kubernetes", "--platform", PLATFORM,
                            "--user", "alice", "--image", "python:3.12-slim"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        job = next(d for d in yaml.safe_load_all(p.stdout) if d and d["kind"] == "Job")
        main = job["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(main["workingDir"], "/tau/code/tau")
        self.assertEqual(main["command"][-2:], ["python3", "../train.py"])


if __name__ == "__main__":
    unittest.main()
