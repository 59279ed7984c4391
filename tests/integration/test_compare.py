"""`tau compare` (issue #23) with a real server and real processes: two quickstart-like runs of one
spec, told apart by a --set learning rate, compared side by side (the config difference with its
provenance, the code, both runs' loss summaries), and the quickstart's loss curves drawn on a
terminal (--metric loss --plot)."""
import json
import os
import unittest

from harness import ServerTestCase, wait_for

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 16Mi\n"
        "runtime:\n  env:\n    LEARNING_RATE: '0.1'\n")
MAIN = "#!/bin/sh\nexec python3 train.py\n"
# The quickstart's metrics protocol: one JSON object per point, appended to TAU_METRICS_FILE. The
# loss falls faster with a larger learning rate, so the two runs' summaries differ.
TRAIN = """import json, os
lr = float(os.environ["LEARNING_RATE"])
with open(os.environ["TAU_METRICS_FILE"], "a") as f:
    loss = 1.0
    for step in range(4):
        f.write(json.dumps({"step": step, "name": "loss", "value": loss, "split": "train"}) + "\\n")
        loss = loss * (1 - lr)
"""


class CompareTest(ServerTestCase):
    def run_with(self, spec, lr):
        name = self.server.tau("run", "--detach", "--set", f"runtime.env.LEARNING_RATE={lr}",
                               spec, check=0).stdout.strip()
        state = self.server.wait_state(name, ["Succeeded", "Failed", "Cancelled"], timeout=60)
        self.assertEqual(state["run"]["state"], "Succeeded", name)
        return name

    def compared(self, a, b):
        # The record and the history are written as the run ends: wait until both runs' losses
        # are in.
        def ready():
            p = self.server.tau("compare", a, b, "-o", "json")
            if p.returncode != 0:
                return None
            out = json.loads(p.stdout)
            loss = [m for m in out["metrics"] if m["name"] == "loss"]
            return out if loss and all(r is not None for r in loss[0]["runs"]) else None
        return wait_for(ready, timeout=30, what=f"compare {a} {b}")

    def test_compare_shows_the_set_difference_and_both_losses(self):
        spec = self.project(SPEC.format(name="cmp"), {"main.sh": MAIN, "train.py": TRAIN})
        a = self.run_with(spec, "0.5")
        b = self.run_with(spec, "0.25")
        out = self.compared(a, b)
        self.assertEqual([r["name"] for r in out["runs"]], [a, b])
        fields = {d["field"]: d["values"] for d in out["config"]}
        self.assertEqual(fields["runtime.env.LEARNING_RATE"],
                         [{"value": "0.5", "source": "command line"},
                          {"value": "0.25", "source": "command line"}])
        # Nothing else of the configuration differs (the overrides list is in its fields).
        self.assertEqual(sorted(fields), ["runtime.env.LEARNING_RATE"])
        # The same code: one snapshot digest, no file differs.
        self.assertTrue(out["same_code"])
        self.assertEqual(out["files"], [])
        self.assertEqual(out["runs"][0]["file_count"], 3)  # the spec, main.sh, train.py
        loss = next(m for m in out["metrics"] if m["name"] == "loss")
        self.assertEqual(loss["split"], "train")
        ra, rb = loss["runs"]
        self.assertEqual((ra["count"], ra["last_step"], ra["max"], ra["max_step"]), (4, 3, 1.0, 0))
        self.assertAlmostEqual(ra["last"], 0.125)
        self.assertAlmostEqual(ra["min"], 0.125)
        self.assertEqual(ra["min_step"], 3)
        self.assertAlmostEqual(rb["last"], 0.75 ** 3)
        # The table says the same for people.
        table = self.server.tau("compare", a, b, check=0).stdout
        self.assertIn("runtime.env.LEARNING_RATE", table)
        self.assertIn("0.5 (command line)", table)
        self.assertIn("0.25 (command line)", table)
        self.assertIn("loss/train min", table)
        self.assertIn("0.125 @3", table)
        self.assertIn("0.421875 @3", table)

    def test_each_difference_is_shown_once_named_as_set_takes_it(self):
        spec = self.project(SPEC.format(name="cmp"), {"main.sh": MAIN, "train.py": TRAIN})
        a = self.run_with(spec, "0.5")
        b = self.server.tau("run", "--detach", "--set", "runtime.env.LEARNING_RATE=0.25",
                            "--set", "run.args=[--fast, '2']", spec, check=0).stdout.strip()
        self.server.wait_state(b, ["Succeeded", "Failed", "Cancelled"], timeout=60)
        out = self.compared(a, b)
        fields = {d["field"]: [v["value"] for v in d["values"]] for d in out["config"]}
        # run.args once, not also args[0] and args[1] of the canonical spec.
        self.assertEqual(sorted(fields), ["run.args", "runtime.env.LEARNING_RATE"], out["config"])
        self.assertEqual(fields["run.args"], [None, "[--fast, 2]"])
        self.assertEqual(fields["runtime.env.LEARNING_RATE"], ["0.5", "0.25"])
        # Each is copied into --set as it is shown, and the spec takes it.
        for field, values in fields.items():
            p = self.server.tau("validate", "--set", f"{field}={values[1]}", spec)
            self.assertEqual(p.returncode, 0, f"--set {field}={values[1]}: {p.stdout}{p.stderr}")
        table = self.server.tau("compare", a, b, check=0).stdout
        self.assertEqual(table.count("run.args"), 1, table)

    def test_compare_names_the_files_that_differ(self):
        a = self.run_with(
            self.project(SPEC.format(name="ca"), {"main.sh": MAIN, "train.py": TRAIN}), "0.5")
        b = self.run_with(self.project(SPEC.format(name="cb"),
                                       {"main.sh": MAIN, "train.py": TRAIN + "# changed\n",
                                        "notes.txt": "only here\n"}), "0.5")
        out = json.loads(self.server.tau("compare", a, b, "-o", "json", check=0).stdout)
        self.assertFalse(out["same_code"])
        files = {f["path"]: f["sha256"] for f in out["files"]}
        # main.sh is the same in both; the spec differs in its name.
        self.assertEqual(sorted(files), ["notes.txt", "tau.yaml", "train.py"])
        self.assertIsNone(files["notes.txt"][0])
        self.assertIsNotNone(files["notes.txt"][1])
        self.assertNotEqual(files["train.py"][0], files["train.py"][1])
        fields = {d["field"] for d in out["config"]}
        self.assertIn("name", fields)  # the spec's name differs; LEARNING_RATE does not
        self.assertNotIn("runtime.env.LEARNING_RATE", fields)
        table = self.server.tau("compare", a, b, check=0).stdout
        self.assertIn("(absent)", table)

    def test_list_filters_by_project_and_group(self):
        def spec(name, project, group):
            return self.project(SPEC.format(name=name) +
                                f"experiment:\n  project: {project}\n  name: {name}\n"
                                f"  group: {group}\n", {"main.sh": MAIN, "train.py": TRAIN})
        a = self.run_with(spec("va", "vision", "lr"), "0.5")
        b = self.run_with(spec("vb", "vision", "bs"), "0.5")
        c = self.run_with(spec("sa", "speech", "lr"), "0.5")
        # A --set of the group is filtered on like the file's.
        d = self.server.tau("run", "--detach", "--set", "experiment.group=lr",
                            spec("vd", "vision", "other"), check=0).stdout.strip()
        self.server.wait_state(d, ["Succeeded", "Failed", "Cancelled"], timeout=60)
        plain = self.run_with(self.project(SPEC.format(name="plain"),
                                           {"main.sh": MAIN, "train.py": TRAIN}), "0.5")

        def listed(*flags):
            out = json.loads(self.server.tau("list", "--all", "-o", "json", *flags,
                                             check=0).stdout)
            return sorted(r["name"] for r in out["runs"])
        self.assertEqual(listed("--project", "vision"), sorted([a, b, d]))
        self.assertEqual(listed("--project", "vision", "--group", "lr"), sorted([a, d]))
        self.assertEqual(listed("--group", "lr"), sorted([a, c, d]))
        self.assertEqual(listed("--project", "nope"), [])
        self.assertEqual(listed(), sorted([a, b, c, d, plain]))
        # Each run of a page says its project and group (the dashboard's columns), and so does
        # `tau list -o wide`.
        rows = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)["runs"]
        by_name = {r["name"]: (r["project"], r["group"]) for r in rows}
        self.assertEqual(by_name[a], ("vision", "lr"))
        self.assertEqual(by_name[d], ("vision", "lr"))
        self.assertEqual(by_name[plain], ("", ""))
        wide = self.server.tau("list", "--all", "-o", "wide", check=0).stdout.splitlines()
        self.assertRegex(wide[0], r"PROJECT\s+GROUP$")
        self.assertRegex(next(line for line in wide if line.startswith(b)), r"vision\s+bs$")
        described = self.server.tau("describe", a, check=0).stdout
        self.assertIn("Experiment:  project vision, name va, group lr", described)
        self.assertNotIn("Experiment:", self.server.tau("describe", plain, check=0).stdout)

    def test_quickstart_runs_plotted_on_a_terminal(self):
        # The quickstart itself (examples/quickstart), twice, with two learning rates.
        example = os.path.join(REPO, "examples", "quickstart")
        with open(os.path.join(example, "tau.yaml")) as f:
            spec_text = f.read()
        with open(os.path.join(example, "train.py")) as f:
            spec = self.project(spec_text, {"train.py": f.read()})
        a = self.run_with(spec, "0.05")
        b = self.run_with(spec, "0.2")
        self.compared(a, b)
        self.server.env["COLUMNS"] = "70"
        try:
            p = self.server.tau("compare", a, b, "--metric", "loss", "--plot", check=0)
        finally:
            del self.server.env["COLUMNS"]
        out = p.stdout
        if os.environ.get("TAU_SHOW_PLOT"):
            print(out)
        self.assertIn("runtime.env.LEARNING_RATE", out)
        self.assertIn("0.05 (command line)", out)
        self.assertIn("0.2 (command line)", out)
        self.assertIn("loss/train last", out)
        chart = out[out.index("loss by step:"):].splitlines()[1:]
        rows = [line for line in chart if " |" in line]
        self.assertEqual(len(rows), 15, out)
        self.assertTrue(all(len(line) <= 70 for line in chart[:17]), out)  # fits COLUMNS
        self.assertTrue(any("*" in r for r in rows) and any("o" in r.split("|", 1)[1] for r in rows),
                        out)
        self.assertIn(f"  * {a}", chart)
        self.assertIn(f"  o {b}", chart)
        self.assertRegex(chart[16], r"^\s+1\s+30$")  # the steps: --steps 30, from 1

        # --metric restricts the summaries; the data form has no chart.
        out = json.loads(self.server.tau("compare", a, b, "--metric", "loss", "-o", "json",
                                         check=0).stdout)
        self.assertEqual({m["name"] for m in out["metrics"]}, {"loss"})
        p = self.server.tau("compare", a, b, "--metric", "acc", check=125)
        self.assertIn("no run has metric 'acc' (their series: loss/train)", p.stderr)

    def test_compare_refuses_what_it_cannot_compare(self):
        p = self.server.tau("compare", "run-a", "run-b", "--plot", check=125)
        self.assertIn("--plot draws one metric: name it with --metric NAME", p.stderr)
        p = self.server.tau("compare", "run-a", "run-b", "--metric", "loss", "--plot", "-o",
                            "json", check=125)
        self.assertIn("--plot draws on a terminal and has no -o json form", p.stderr)
        p = self.server.tau("compare", "only-one", check=125)
        self.assertIn("name two runs or more", p.stderr)
        p = self.server.tau("compare", "nope-1", "nope-2", check=None)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("nope-1", p.stderr)


if __name__ == "__main__":
    unittest.main()
