"""`tau run --set` and `tau rerun --set` (issue #23), `tau validate`, `tau plan` and `tau explain`
with --set, and TauGrid's repository layout (`tau run NAME` -> tau/NAME.yaml at the repository
root, the run started there), with a real server and real processes: the run sees what --set gave
it, describe, explain and the evidence record say it came from the command line, a bad --set is
refused before anything is submitted or planned, a rerun changes only what it sets."""
import json
import os
import subprocess
import unittest

from harness import TAU, ServerTestCase, wait_for

SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 16Mi\n"
        "runtime:\n  env:\n    LR: '0.1'\n    B: file\n")
# Prints what the run saw, last.
SCRIPT = "#!/bin/sh\necho \"index=${TAU_ARRAY_INDEX:-none} lr=$LR b=$B\"\n"


class SetTest(ServerTestCase):
    def last_line(self, run):
        log = self.server.tau("logs", run, check=0).stdout
        return log.strip().splitlines()[-1] if log.strip() else ""

    def wait_ended(self, name):
        return self.server.wait_state(name, ["Succeeded", "Failed", "Cancelled"], timeout=60)

    def evidence(self, name):
        def ready():
            p = self.server.tau("evidence", name, "-o", "json")
            return json.loads(p.stdout) if p.returncode == 0 else None
        return wait_for(ready, timeout=30, what=f"the evidence of {name}")

    def all_runs(self):
        return json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)

    def test_a_set_reaches_the_run_and_is_recorded_as_the_command_lines(self):
        spec = self.project(SPEC.format(name="lr"), {"main.sh": SCRIPT})
        p = self.server.tau("run", "--detach", "--set", "runtime.env.LR=0.01", "--set",
                            "compute.cpus=200m", spec, check=0)
        name = p.stdout.strip()
        self.assertEqual(self.wait_ended(name)["run"]["state"], "Succeeded")
        self.assertEqual(self.last_line(name), "index=none lr=0.01 b=file")
        detail = self.server.run_json(name)["run"]
        # The canonical spec holds the values set, and the --set texts.
        env = detail["spec"]["runtime"]["env"]
        self.assertEqual(env, {"LR": "0.01", "B": "file"})
        self.assertEqual(detail["spec"]["compute"]["cpus"], "200m")
        self.assertEqual(detail["spec"]["overrides"],
                         [{"path": "runtime.env.LR", "value": "0.01"},
                          {"path": "compute.cpus", "value": "200m"}])
        self.assertEqual(detail["resources"]["cpu_milli"], 200)
        described = self.server.tau("describe", name, check=0).stdout
        self.assertIn("Set:         runtime.env.LR=0.01 (command line)", described)
        self.assertIn("Set:         compute.cpus=200m (command line)", described)
        # The evidence record's provenance: the command line's, not the file's.
        record = self.evidence(name)
        provenance = {p["field"]: (p["value"], p["source"])
                      for p in record["config"]["provenance"]}
        self.assertEqual(provenance["compute.cpus"], ("200m", "command line"))
        self.assertEqual(provenance["runtime.env.LR"], ("0.01", "command line"))
        self.assertEqual(provenance["compute.memory"][1], "spec")
        self.assertEqual(record["config"]["spec"]["overrides"], detail["spec"]["overrides"])
        # The same file without --set is another configuration.
        plain = self.server.tau("run", "--detach", spec, check=0).stdout.strip()
        self.wait_ended(plain)
        self.assertEqual(self.last_line(plain), "index=none lr=0.1 b=file")
        self.assertNotEqual(self.server.run_json(plain)["run"]["config_hash"],
                            detail["config_hash"])
        self.assertNotIn("Set:", self.server.tau("describe", plain, check=0).stdout)

    def test_a_bad_set_is_refused_before_anything_is_submitted(self):
        spec = self.project(SPEC.format(name="bad"), {"main.sh": SCRIPT})
        p = self.server.tau("run", "--set", "compute.workers=two", spec, check=1)
        self.assertEqual(p.stderr.strip(),
                         "--set compute.workers=two: error: compute.workers: expected an "
                         "integer, got a string ('two')")
        p = self.server.tau("run", "--set", "compute.worker=2", spec, check=1)
        self.assertIn("--set compute.worker=2: error: compute.worker: unknown field 'worker' in "
                      "'compute' of the manifest shape (did you mean 'workers'?)", p.stderr)
        p = self.server.tau("run", "--set", "workers", spec, check=125)
        self.assertIn("--set 'workers': expected PATH=VALUE", p.stderr)
        p = self.server.tau("run", "--array", "0-3", "--set", "runtime.env.TAU_X=1", spec,
                            check=1)
        self.assertTrue(p.stderr.startswith("--set runtime.env.TAU_X=1: error: runtime.env: "
                                            "TAU_X is reserved"), p.stderr)
        self.assertEqual(self.all_runs()["runs"], [])

    def test_validate_checks_a_spec_with_the_sets(self):
        spec = self.project(SPEC.format(name="val"), {"main.sh": SCRIPT})
        p = self.server.tau("validate", "--set", "compute.workers=two", spec, check=1)
        self.assertIn("--set compute.workers=two: error: compute.workers: expected an integer",
                      p.stderr)
        p = self.server.tau("validate", "--set", "name=renamed", "-o", "json", spec, check=0)
        [result] = json.loads(p.stdout)
        self.assertTrue(result["valid"], p.stdout)
        self.assertEqual(result["summary"], "manifest shape, job 'renamed'")
        self.server.tau("validate", "--set", "workers", spec, check=125)

    def test_plan_shows_the_launch_the_sets_make(self):
        spec = self.project(SPEC.format(name="planned"), {"main.sh": SCRIPT})
        p = self.server.tau("plan", "--set", "runtime.env.LR=0.01", "--set", "compute.cpus=200m",
                            "-o", "json", spec, check=0)
        plan = json.loads(p.stdout)
        [worker] = plan["launch"]
        self.assertEqual((worker["env"]["LR"], worker["env"]["B"]), ("0.01", "file"))
        self.assertEqual(plan["resolved"]["cpus_per_worker"], "200m")
        plain = json.loads(self.server.tau("plan", "-o", "json", spec, check=0).stdout)
        self.assertEqual(plain["launch"][0]["env"]["LR"], "0.1")
        # The same checks and errors as tau validate --set, and nothing planned.
        p = self.server.tau("plan", "--set", "compute.workers=two", spec, check=1)
        self.assertEqual(p.stderr.strip(),
                         "--set compute.workers=two: error: compute.workers: expected an "
                         "integer, got a string ('two')")
        self.assertEqual(p.stdout, "")
        p = self.server.tau("plan", "--set", "workers", spec, check=125)
        self.assertIn("--set 'workers': expected PATH=VALUE", p.stderr)

    def test_explain_says_what_the_sets_gave(self):
        spec = self.project(SPEC.format(name="explained"), {"main.sh": SCRIPT})
        p = self.server.tau("explain", "--set", "compute.cpus=200m", "-o", "json", spec, check=0)
        provenance = {p["field"]: (p["value"], p["source"])
                      for p in json.loads(p.stdout)["provenance"]}
        self.assertEqual(provenance["compute.cpus"], ("200m", "command line"))
        self.assertEqual(provenance["compute.memory"][1], "spec")
        table = self.server.tau("explain", "--set", "compute.cpus=200m", spec, check=0).stdout
        self.assertRegex(table, r"compute\.cpus\s+200m\s+command line")
        p = self.server.tau("explain", "--set", "compute.worker=2", spec, check=1)
        self.assertIn("--set compute.worker=2: error: compute.worker: unknown field 'worker' in "
                      "'compute' of the manifest shape (did you mean 'workers'?)", p.stderr)
        self.server.tau("explain", "--set", "workers", spec, check=125)

    def test_an_array_runs_with_the_set(self):
        spec = self.project(SPEC.format(name="arr"), {"main.sh": SCRIPT})
        p = self.server.tau("run", "--array", "0-2", "--detach", "--set", "runtime.env.LR=0.5",
                            spec, check=0)
        names = p.stdout.split()
        self.assertEqual(len(names), 3, p.stdout)
        for i, name in enumerate(names):
            self.assertEqual(self.wait_ended(name)["run"]["state"], "Succeeded")
            self.assertEqual(self.last_line(name), f"index={i} lr=0.5 b=file")
            self.assertEqual(self.server.run_json(name)["run"]["spec"]["overrides"],
                             [{"path": "runtime.env.LR", "value": "0.5"}])

    def test_a_restarted_server_keeps_the_set(self):
        # The retry after a restart is started from the spec the new server parses from its
        # store: it must apply the run's --set again, or the second attempt would see the file's
        # LR.
        spec = self.project(
            SPEC.format(name="restart") +
            "resilience:\n  max_retries: 1\n  retry_on: [UserError]\n  backoff_initial: 1s\n",
            {"main.sh": "#!/bin/sh\nif [ \"$TAU_ATTEMPT\" = 1 ]; then sleep 2; exit 3; fi\n"
                        "echo \"attempt=$TAU_ATTEMPT lr=$LR\"\n"})
        name = self.server.tau("run", "--detach", "--set", "runtime.env.LR=0.01", spec,
                               check=0).stdout.strip()
        self.server.wait_state(name, "Running")
        self.server.kill()
        self.server.start()
        self.assertEqual(self.wait_ended(name)["run"]["state"], "Succeeded")
        self.assertEqual(self.last_line(name), "attempt=2 lr=0.01")

    def test_rerun_with_set_changes_only_what_it_sets(self):
        spec = self.project(SPEC.format(name="re"), {"main.sh": SCRIPT})
        first = self.server.tau("run", "--detach", "--set", "runtime.env.LR=0.01", spec,
                                check=0).stdout.strip()
        self.wait_ended(first)
        # A rerun is the run that was, --set included.
        again = self.server.tau("rerun", first, check=0).stdout.strip()
        self.wait_ended(again)
        self.assertEqual(self.last_line(again), "index=none lr=0.01 b=file")
        self.assertEqual(self.server.run_json(again)["run"]["config_hash"],
                         self.server.run_json(first)["run"]["config_hash"])
        # With --set: the run's own overrides, and this one over them.
        changed = self.server.tau("rerun", first, "--set", "runtime.env.B=cli", "--set",
                                  "compute.cpus=300m", check=0).stdout.strip()
        self.assertEqual(self.wait_ended(changed)["run"]["state"], "Succeeded")
        self.assertEqual(self.last_line(changed), "index=none lr=0.01 b=cli")
        run = self.server.run_json(changed)
        self.assertEqual(run["run"]["spec"]["overrides"],
                         [{"path": "runtime.env.LR", "value": "0.01"},
                          {"path": "runtime.env.B", "value": "cli"},
                          {"path": "compute.cpus", "value": "300m"}])
        self.assertEqual(run["run"]["resources"]["cpu_milli"], 300)
        self.assertEqual(run["run"]["snapshot_digest"],
                         self.server.run_json(first)["run"]["snapshot_digest"])
        submitted = [e for e in run["events"] if e["type"] == "Submitted"][0]
        self.assertEqual(submitted["data"]["rerun_of"], first)
        self.assertEqual(submitted["data"]["set"], ["runtime.env.B=cli", "compute.cpus=300m"])
        provenance = {p["field"]: (p["value"], p["source"])
                      for p in self.evidence(changed)["config"]["provenance"]}
        self.assertEqual(provenance["runtime.env.B"], ("cli", "command line"))
        self.assertEqual(provenance["compute.cpus"], ("300m", "command line"))
        # Everything else as the first run had it.
        a, b = (self.server.run_json(n)["run"]["spec"] for n in (first, changed))
        for key in ("compute", "runtime", "overrides"):
            a.pop(key)
            b.pop(key)
        self.assertEqual(a, b)
        # A bad --set of a rerun is refused at the flag, and makes nothing.
        before = len(self.all_runs()["runs"])
        p = self.server.tau("rerun", first, "--set", "compute.gpus=many", check=1)
        self.assertEqual(p.stderr.strip(),
                         "--set compute.gpus=many: error: compute.gpus: expected an integer, got "
                         "a string ('many')")
        self.assertEqual(len(self.all_runs()["runs"]), before)


LAYOUT_SPEC = ("schema_version: 1\nname: layout\nrun:\n  entrypoint: train.py\n"
               "  workload_kind: job\ncompute:\n  gpus: 0\n  cpus: 100m\n  memory: 64Mi\n")
TRAIN = ("import os\n"
         "print('files=' + ','.join(sorted(os.listdir('.'))) + ' data=' + "
         "open('data/config.txt').read().strip())\n")


class RepositoryLayoutTest(ServerTestCase):
    def repo(self):
        root = os.path.join(self.work, "repo")
        for rel, text in {"tau/train.yaml": LAYOUT_SPEC, "train.py": TRAIN,
                          "data/config.txt": "from-the-root\n", "big/blob.bin": "x" * 100,
                          ".tauignore": "big/\n", "src/pkg/__init__.py": ""}.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        os.makedirs(os.path.join(root, ".git"))
        return root

    def tau_in(self, cwd, *args, check=None):
        p = subprocess.run([TAU, *args], env=self.server.env, cwd=cwd, capture_output=True,
                           text=True, timeout=60)
        if check is not None:
            self.assertEqual(p.returncode, check, f"stdout: {p.stdout}\nstderr: {p.stderr}")
        return p

    def last_line(self, run):
        log = self.server.tau("logs", run, check=0).stdout
        return log.strip().splitlines()[-1] if log.strip() else ""

    def test_tau_run_name_runs_tau_name_yaml_from_the_repository_root(self):
        root = self.repo()
        # From a folder inside the repository: tau/train.yaml at its root, the root shipped
        # (.tauignore still applies) and the run started there.
        p = self.tau_in(os.path.join(root, "src", "pkg"), "run", "train", check=0)
        self.assertIn("files=.tauignore,data,src,tau,train.py data=from-the-root", p.stdout)
        name = self.tau_in(root, "run", "--detach", "train", check=0).stdout.strip()
        self.server.wait_state(name, "Succeeded")
        self.assertEqual(self.last_line(name),
                         "files=.tauignore,data,src,tau,train.py data=from-the-root")
        self.assertEqual(self.server.run_json(name)["run"]["spec_file"], "tau/train.yaml")
        # --set works with it.
        p = self.tau_in(root, "run", "--set", "run.args=[--x]", "train", check=0)
        self.assertIn("data=from-the-root", p.stdout)

    def test_a_missing_target_names_what_was_looked_for(self):
        root = self.repo()
        p = self.tau_in(root, "run", "eval", check=125)
        self.assertIn("no file 'eval' here, and neither tau/eval.yaml nor tau/eval.yml exists "
                      "(in the repository root)", p.stderr)
        outside = os.path.join(self.work, "outside")
        os.makedirs(outside)
        p = self.tau_in(outside, "run", "train", check=125)
        self.assertIn("no repository to look for tau/train.yaml in", p.stderr)

    def test_code_dir_ships_that_folder_and_runs_from_it(self):
        root = self.repo()
        specs = os.path.join(self.work, "specs")
        os.makedirs(specs)
        with open(os.path.join(specs, "run.yaml"), "w") as f:
            f.write(LAYOUT_SPEC)
        p = self.tau_in(self.work, "run", "--code-dir", root, os.path.join(specs, "run.yaml"),
                        check=0)
        self.assertIn("files=.tauignore,data,src,tau,train.py data=from-the-root", p.stdout)

    def test_a_plain_spec_without_git_keeps_its_own_folder(self):
        # No .git: the spec's folder is the code, as before, even when it is called tau/.
        d = os.path.join(self.work, "plain", "tau")
        os.makedirs(os.path.join(d, "data"))
        with open(os.path.join(d, "train.yaml"), "w") as f:
            f.write(LAYOUT_SPEC)
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write(TRAIN)
        with open(os.path.join(d, "data", "config.txt"), "w") as f:
            f.write("beside-the-spec\n")
        p = self.tau_in(self.work, "run", os.path.join(d, "train.yaml"), check=0)
        self.assertIn("files=data,train.py,train.yaml data=beside-the-spec", p.stdout)


if __name__ == "__main__":
    unittest.main()
