"""`tau sweep` (issue #23) with a real server and real processes: a 3 x 2 grid over two spec paths
makes six runs in one experiment group, submitted together, and prints them best first by the
objective; a random sweep draws the same points for the same seed; a bad point or a bad sweep file
is refused before anything is submitted; an objective over a metric logged with several splits
names one or is refused naming them, and one no run logged fails the sweep; `tau validate` reads a
sweep file with the sweep's reader (a key given twice is refused at its place)."""
import json
import os
import unittest

from harness import ServerTestCase, wait_for

SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "  args: ['1']\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 16Mi\n"
        "runtime:\n  env:\n    LR: '0.1'\n")
MAIN = "#!/bin/sh\nexec python3 train.py \"$@\"\n"
# The loss after the last step is LR * SCALE (the first argument): the objective is known exactly.
TRAIN = """import json, os, sys
lr, scale = float(os.environ["LR"]), float(sys.argv[1])
with open(os.environ["TAU_METRICS_FILE"], "a") as f:
    for step in range(3):
        f.write(json.dumps({"step": step, "name": "loss", "value": 10 - step if step < 2
                            else lr * scale}) + "\\n")
"""


class SweepTest(ServerTestCase):
    def sweep_project(self, name, sweep):
        spec = self.project(SPEC.format(name=name), {"main.sh": MAIN, "train.py": TRAIN})
        path = os.path.join(os.path.dirname(spec), "sweep.yaml")
        with open(path, "w") as f:
            f.write(sweep)
        return path

    def runs(self, group=None):
        args = ["list", "--all", "-o", "json"] + (["--group", group] if group else [])
        return json.loads(self.server.tau(*args, check=0).stdout)["runs"]

    def test_a_grid_makes_every_point_in_one_group_best_first(self):
        path = self.sweep_project("grid", "spec: tau.yaml\ngroup: g1\n"
                                          "objective: {metric: loss, goal: minimize}\n"
                                          "parameters:\n"
                                          "  runtime.env.LR: ['0.3', '0.1', '0.2']\n"
                                          "  run.args: [['1'], ['5']]\n")
        p = self.server.tau("sweep", path, check=0, timeout=120)
        self.assertIn("6 runs in group g1", p.stderr)
        self.assertIn("6 of 6 runs succeeded", p.stderr)
        # Progress on stderr: a line when the count of ended points changes or a better one ends,
        # never the same line twice in a row; the last names the best point's loss.
        progress = [line for line in p.stderr.splitlines() if line.startswith("tau: sweep: ")]
        self.assertTrue(progress, p.stderr)
        self.assertTrue(all(a != b for a, b in zip(progress, progress[1:])), progress)
        done = [int(line.split()[2].split("/")[0]) for line in progress]
        self.assertEqual(done, sorted(done))
        self.assertRegex(progress[-1], r"^tau: sweep: 6/6 points done, 0 running, "
                                       r"best so far loss=0\.1 \(point [1-6]\)$")
        lines = p.stdout.strip().splitlines()
        self.assertEqual(lines[0].split(), ["RUN", "STATE", "runtime.env.LR", "run.args",
                                            "loss", "(min)"])
        table = [line.split() for line in lines[1:]]
        self.assertEqual(len(table), 6)
        # Sorted by the loss each point must give: LR * SCALE.
        got = [(row[2], row[3], float(row[-1])) for row in table]
        want = sorted(((lr, f"[{s}]", float(lr) * int(s)) for lr in ("0.3", "0.1", "0.2")
                       for s in ("1", "5")), key=lambda t: t[2])
        self.assertEqual([(lr, args) for lr, args, _ in got], [(lr, a) for lr, a, _ in want])
        for (_, _, loss), (_, _, expected) in zip(got, want):
            self.assertAlmostEqual(loss, expected, places=5)
        # All six are the group's, and nothing else is.
        in_group = self.runs("g1")
        self.assertEqual(sorted(r["name"] for r in in_group), sorted(row[0] for row in table))
        self.assertEqual(len(self.runs()), 6)
        # Each run records its point as the command line's.
        detail = self.server.run_json(table[0][0])["run"]
        texts = {o["path"]: o["value"] for o in detail["spec"]["overrides"]}
        self.assertEqual(texts["experiment.group"], "g1")
        self.assertEqual(texts["runtime.env.LR"], table[0][2])

    def test_a_random_sweep_draws_the_same_points_for_the_same_seed(self):
        sweep = ("spec: tau.yaml\nmethod: random\nsamples: 4\nseed: {seed}\ngroup: r{seed}\n"
                 "parameters:\n  runtime.env.LR: {{min: 0.001, max: 1, scale: log}}\n")
        points = {}
        for seed in (5, 5):
            path = self.sweep_project(f"rnd{len(points)}", sweep.format(seed=seed))
            names = self.server.tau("sweep", "--detach", path, check=0).stdout.split()
            self.assertEqual(len(names), 4)
            lrs = [self.server.run_json(n)["run"]["spec"]["runtime"]["env"]["LR"] for n in names]
            for lr in lrs:
                self.assertTrue(0.001 <= float(lr) <= 1, lr)
            points[len(points)] = lrs
        self.assertEqual(points[0], points[1])
        self.assertEqual(len(set(points[0])), 4)

    def test_a_bad_point_or_file_is_refused_before_anything_is_submitted(self):
        path = self.sweep_project("bad", "spec: tau.yaml\nparameters:\n"
                                         "  compute.workers: ['1', two]\n")
        # `tau validate` checks the points as `tau sweep` does.
        for args in (("validate", path), ("sweep", path)):
            p = self.server.tau(*args, check=1)
            self.assertIn("sweep.yaml: error: point 2 of 2 (compute.workers=two) cannot be used",
                          p.stderr)
            # At the value in the sweep file, not at a --set.
            self.assertIn(f"{path}:3:26: error: compute.workers: expected an integer",
                          p.stderr)
        path = self.sweep_project("bad2", "spec: tau.yaml\nmax_parallel: two\nparameters:\n"
                                          "  runtime.env.LR: ['1']\n  nosuch: 3\n")
        p = self.server.tau("sweep", path, check=1)
        self.assertIn("sweep.yaml:2:15: error: max_parallel: expected a whole number", p.stderr)
        self.assertIn("sweep.yaml:5:11: error: parameters.nosuch: give a list of values", p.stderr)
        self.assertEqual(self.runs(), [])

    def test_max_parallel_holds_the_rest_of_the_sweep_out_of_its_queue(self):
        # Each run waits until a file of its own exists: the test sees who is in play.
        gate = os.path.join(self.work, "gate")
        os.makedirs(gate)
        spec = SPEC.format(name="held").replace("  args: ['1']\n", "")
        main = ("#!/bin/sh\nwhile [ ! -e " + gate + "/$TAU_ARRAY_INDEX ]; do sleep 0.05; done\n")
        path = os.path.join(os.path.dirname(self.project(spec, {"main.sh": main})), "sweep.yaml")
        with open(path, "w") as f:
            f.write("spec: tau.yaml\ngroup: held\nmax_parallel: 2\n"
                    "parameters:\n  runtime.env.LR: ['1', '2', '3', '4', '5']\n")
        names = self.server.tau("sweep", "--detach", path, check=0).stdout.split()
        self.assertEqual(len(names), 5)
        def states():
            return [self.server.run_json(n)["run"] for n in names]
        wait_for(lambda: [r["state"] for r in states()][:2] == ["Running"] * 2,
                 what="the first two to run")
        # The views a reply reads are up to 200 ms old: a held run says so within that.
        wait_for(lambda: all(r["state"] == "Queued" and
                             r.get("pending", {}).get("code") == "ArrayMaxParallel"
                             for r in states()[2:]),
                 what="the other three to wait for a place")
        self.assertIn("max_parallel 2", states()[2]["pending"]["reason"])
        # One ends: the next in index order takes its place, and never more than two at once.
        open(os.path.join(gate, "0"), "w").close()
        wait_for(lambda: states()[2]["state"] == "Running", what="the third to start")
        self.assertEqual([r["state"] for r in states()][3:], ["Queued", "Queued"])
        for i in range(1, 5):
            open(os.path.join(gate, str(i)), "w").close()
        for n in names:
            self.server.wait_state(n, "Succeeded", timeout=60)
        runs = [self.server.run_json(n) for n in names]
        # Never more than two running at once: each start is after all but one earlier end.
        spans = sorted((r["run"]["started"], r["run"]["finished"]) for r in runs)
        for start, _ in spans:
            running = sum(1 for s, e in spans if s <= start < e)
            self.assertLessEqual(running, 2, spans)

    def test_an_objective_names_its_split_and_a_missing_one_fails_the_sweep(self):
        # loss is logged with splits train and val: val's last point is LR, train's 10 * LR.
        train = ("import json, os\nlr = float(os.environ['LR'])\n"
                 "with open(os.environ['TAU_METRICS_FILE'], 'a') as f:\n"
                 "    for split, v in (('train', 10 * lr), ('val', lr)):\n"
                 "        f.write(json.dumps({'step': 1, 'name': 'loss', 'split': split, "
                 "'value': v}) + '\\n')\n")
        spec = self.project(SPEC.format(name="splits"), {"main.sh": MAIN, "train.py": train})
        sweep = os.path.join(os.path.dirname(spec), "sweep.yaml")

        def run(objective):
            with open(sweep, "w") as f:
                f.write(f"spec: tau.yaml\nobjective: {objective}\n"
                        "parameters:\n  runtime.env.LR: ['0.3', '0.1']\n")
            return self.server.tau("sweep", sweep, timeout=120)

        p = run("{metric: loss, split: val, goal: minimize}")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("tau: sweep: 2/2 points done, 0 running, best so far loss=0.1 (point 2)",
                      p.stderr)
        # --quiet: the same table, no progress lines.
        quiet = self.server.tau("sweep", "-q", sweep, timeout=120)
        self.assertEqual(quiet.returncode, 0, quiet.stderr)
        self.assertNotIn("tau: sweep: ", quiet.stderr)
        self.assertEqual(len(quiet.stdout.strip().splitlines()), 3)
        lines = p.stdout.strip().splitlines()
        self.assertEqual(lines[0].split()[-2:], ["loss/val", "(min)"])
        self.assertEqual([(row.split()[2], float(row.split()[-1])) for row in lines[1:]],
                         [("0.1", 0.1), ("0.3", 0.3)])
        # Several splits and none named: the sweep says which there are and fails.
        p = run("{metric: loss, goal: minimize}")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("objective: the metric 'loss' is logged with several splits (train, val); "
                      "name one, such as objective: {metric: loss, split: val, goal: minimize}",
                      p.stderr)
        # A metric no run logged is an error, not a column of '-'.
        p = run("{metric: accuracy, goal: maximize}")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no run of the 2 logged the metric 'accuracy'", p.stderr)

    def test_validate_reads_a_sweep_file_and_a_quoted_value_stays_one_argument(self):
        path = self.sweep_project("quoted", "spec: tau.yaml\ngroup: q\n"
                                            "parameters:\n  run.args: [['0.1,0.2'], ['a: b']]\n")
        p = self.server.tau("validate", path, check=0)
        self.assertIn(f"{path}: ok (grid sweep of 2 run(s) of tau.yaml)", p.stdout)
        names = self.server.tau("sweep", "--detach", path, check=0).stdout.split()
        args = sorted(self.server.run_json(n)["run"]["spec"]["args"] for n in names)
        self.assertEqual(args, [["0.1,0.2"], ["a: b"]])
        with open(path, "w") as f:
            f.write("spec: tau.yaml\nparameters:\n  runtime.env.LR: ['1']\n"
                    "parameters:\n  runtime.env.LR: ['2']\n")
        for command in (["validate", path], ["sweep", path]):
            p = self.server.tau(*command, check=1)
            self.assertIn(f"{path}:4:1: error: duplicate field 'parameters' (first given on line 2, "
                          "column 1)", p.stderr)
        # plan and explain take run specs, and say what to do with a sweep file.
        p = self.server.tau("explain", path, check=1)
        self.assertIn(f"{path}: error: this is a sweep file, not a run spec; run it with "
                      f"`tau sweep {path}`", p.stderr)


if __name__ == "__main__":
    unittest.main()
