"""Workflows (issue #23) with a real server and real processes: `tau run workflow.yaml` runs
prepare -> train -> eval, each stage a run of its own that starts only after the stages it waits
for; eval reads train's checkpoint, read-only, and its evidence names the checkpoint's digest; a
failed train stops eval with a reason and `tau workflow retry-stage` runs both again; a server
SIGKILLed in the middle of a workflow carries on with no stage run twice; a workflow file with a
cycle or an unknown stage is refused at file:line:col with nothing submitted; `tau validate` reads a
workflow file with the workflow's reader (a key given twice refused at its place), plan and explain
say which command takes it, and a file of no kind tau reads is named as such."""
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import unittest

from harness import TAU, ServerTestCase, wait_for

STAGE = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: {name}.py\n  workload_kind: job\n"
         "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 64Mi\n"
         "runtime:\n  env:\n    MARKS: '{marks}'\n")
# Each stage appends its name to MARKS/ran (one line per attempt), so a test can tell whether a
# stage ran twice.
PREPARE = """import os
open(os.path.join(os.environ["MARKS"], "ran"), "a").write("prepare\\n")
with open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "data.txt"), "w") as f:
    f.write("prepared")
"""
TRAIN = """import os, time
marks = os.environ["MARKS"]
open(os.path.join(marks, "ran"), "a").write("train\\n")
data = open(os.path.join(os.environ["TAU_UPSTREAM_PREPARE_OUTPUT_DIR"], "data.txt")).read()
while os.path.exists(os.path.join(marks, "hold")):
    time.sleep(0.05)
if os.path.exists(os.path.join(marks, "fail")):
    raise SystemExit("training diverged")
# The checkpoint protocol: written under a temporary name, renamed when complete.
tmp = os.path.join(os.environ["TAU_CHECKPOINT_DIR"], "step-3.tmp")
os.makedirs(tmp)
with open(os.path.join(tmp, "model.bin"), "w") as f:
    f.write("weights from " + data)
open(os.path.join(tmp, "COMPLETE"), "w").close()
os.rename(tmp, os.path.join(os.environ["TAU_CHECKPOINT_DIR"], "step-3"))
"""
EVAL = """import os
open(os.path.join(os.environ["MARKS"], "ran"), "a").write("eval\\n")
ckpt = os.environ["TAU_UPSTREAM_TRAIN_CHECKPOINT"]
print("eval read:", open(os.path.join(ckpt, "model.bin")).read(), flush=True)
try:
    open(os.path.join(ckpt, "model.bin"), "a").write("tampered")
    print("upstream writable", flush=True)
except OSError as e:
    print("upstream read-only:", e.strerror, flush=True)
"""
WORKFLOW = """kind: workflow
name: pipeline
stages:
  - name: prepare
    spec: prepare.yaml
  - name: train
    spec: train.yaml
    after: [prepare]
  - name: eval
    spec: eval.yaml
    after:
      - {stage: train, condition: succeeded}
"""


class WorkflowTest(ServerTestCase):
    def workflow(self, text=WORKFLOW):
        marks = os.path.join(self.work, "marks")
        os.makedirs(marks, exist_ok=True)
        os.chmod(marks, 0o777)
        d = os.path.dirname(self.project("", {
            "prepare.yaml": STAGE.format(name="prepare", marks=marks),
            "train.yaml": STAGE.format(name="train", marks=marks),
            "eval.yaml": STAGE.format(name="eval", marks=marks),
            "prepare.py": PREPARE, "train.py": TRAIN, "eval.py": EVAL}))
        os.remove(os.path.join(d, "tau.yaml"))
        path = os.path.join(d, "workflow.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path, marks

    def stages(self, name):
        out = json.loads(self.server.tau("workflow", "status", name, "-o", "json", check=0).stdout)
        return {r["workflow"]["stage"]: r for r in out["runs"]}

    def ran(self, marks):
        with open(os.path.join(marks, "ran")) as f:
            return f.read().split()

    def test_eval_reads_the_train_stages_checkpoint_and_its_evidence_names_the_digest(self):
        path, marks = self.workflow()
        p = self.server.tau("run", path, check=0, timeout=120)
        self.assertIn("3 of 3 stages succeeded", p.stderr)
        self.assertRegex(p.stdout, r"eval\s+pipeline-[0-9a-f]{8}-eval\s+Succeeded\s+train")
        self.assertEqual(self.ran(marks), ["prepare", "train", "eval"])
        name = p.stderr.split("workflow ")[1].split()[0]
        stages = self.stages(name)
        self.assertEqual(list(stages), ["prepare", "train", "eval"])
        for stage, run in stages.items():
            self.assertEqual(run["state"], "Succeeded", stage)
            self.assertEqual(run["attempts"], 1, stage)
        # Each stage started after the one before it ended.
        train, evaluation = (self.server.run_json(stages[s]["name"]) for s in ("train", "eval"))
        prepare = self.server.run_json(stages["prepare"]["name"])
        self.assertLessEqual(prepare["run"]["finished"], train["run"]["started"])
        self.assertLessEqual(train["run"]["finished"], evaluation["run"]["started"])
        log = self.server.tau("logs", stages["eval"]["name"], check=0).stdout
        self.assertIn("eval read: weights from prepared", log)
        if os.geteuid() == 0:
            self.assertIn("upstream read-only: Read-only file system", log)
        # The evidence names the checkpoint and its digest: sha256sum's lines over its files.
        record = json.loads(self.server.tau("evidence", stages["eval"]["name"], "-o", "json",
                                            check=0).stdout)
        [lineage] = record["lineage"]
        self.assertEqual(lineage["stage"], "train")
        self.assertEqual(lineage["run"], stages["train"]["name"])
        self.assertTrue(lineage["checkpoint"].endswith("/step-3"), lineage)
        files = {"model.bin": b"weights from prepared", "COMPLETE": b""}
        lines = "".join(f"{hashlib.sha256(files[n]).hexdigest()}  {n}\n" for n in sorted(files))
        self.assertEqual(lineage["checkpoint_sha256"], hashlib.sha256(lines.encode()).hexdigest())
        self.assertEqual(lineage["checkpoint_files"], 2)
        described = self.server.tau("describe", stages["eval"]["name"], check=0).stdout
        self.assertIn(f"Workflow:    {name}, stage eval, after train ({stages['train']['name']}, "
                      "succeeded)", described)
        summary = self.server.tau("evidence", stages["eval"]["name"], check=0).stdout
        self.assertIn(f"Upstream:   train <- run {stages['train']['name']} (Succeeded)", summary)

    def test_a_failed_stage_stops_the_next_and_retry_stage_runs_both_again(self):
        path, marks = self.workflow()
        open(os.path.join(marks, "fail"), "w").close()
        # train holds until the attached CLI has said it is running, so that the line is certain.
        hold = os.path.join(marks, "hold")
        open(hold, "w").close()
        proc = subprocess.Popen([TAU, "run", path], env=self.server.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        killer = threading.Timer(120, proc.kill)
        killer.start()
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if re.fullmatch(r"tau: stage train \(\S+\): Running", line.rstrip("\n")):
                os.remove(hold)
        proc.stdout.read()
        proc.wait()
        killer.cancel()
        p = subprocess.CompletedProcess(proc.args, proc.returncode, "", "".join(lines))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("1 of 3 stages succeeded", p.stderr)
        name = p.stderr.split("workflow ")[1].split()[0]
        # A line on stderr as each stage's run changes state, naming the stage and its run.
        seen = {}
        for line in p.stderr.splitlines():
            m = re.fullmatch(r"tau: stage (\w+) \((\S+)\): (.+)", line)
            if m:
                self.assertEqual(m[2], f"{name}-{m[1]}")
                seen.setdefault(m[1], []).append(m[3])
        self.assertEqual(seen["prepare"][-1], "Succeeded", p.stderr)
        self.assertIn("Running", seen["train"])
        self.assertTrue(seen["train"][-1].startswith("Failed"), p.stderr)
        self.assertEqual(seen["eval"][-1], "Cancelled (UpstreamFailed)")
        for states in seen.values():
            self.assertNotIn(states[0], ("Succeeded", "Failed", "Cancelled"))
            self.assertTrue(all(a != b for a, b in zip(states, states[1:])), states)
        stages = self.stages(name)
        self.assertEqual(stages["train"]["state"], "Failed")
        self.assertEqual(stages["eval"]["state"], "Cancelled")
        self.assertEqual(stages["eval"]["reason"], "UpstreamFailed")
        self.assertIn("stage 'train'", stages["eval"]["message"])
        self.assertEqual(stages["eval"]["attempts"], 0)
        table = self.server.tau("workflow", "status", name, check=0).stdout
        self.assertRegex(table, r"eval\s+\S+\s+Cancelled\s+train\s+UpstreamFailed")
        # Fixed (the marker gone), the stage runs again and eval after it.
        os.remove(os.path.join(marks, "fail"))
        retried = self.server.tau("workflow", "retry-stage", name, "train", check=0).stdout.split()
        self.assertEqual(retried, ["train", f"{name}-train-r2", "eval", f"{name}-eval-r2"])
        self.server.wait_state(f"{name}-eval-r2", "Succeeded", timeout=60)
        self.assertEqual(self.stages(name)["eval"]["name"], f"{name}-eval-r2")
        self.assertEqual(self.ran(marks), ["prepare", "train", "train", "eval"])
        # A stage that succeeded is not retried; nor is one of a workflow that does not exist.
        p = self.server.tau("workflow", "retry-stage", name, "prepare")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("succeeded", p.stderr)
        self.assertNotEqual(self.server.tau("workflow", "status", "nope-1").returncode, 0)

    def test_a_killed_server_carries_the_workflow_on_with_no_stage_run_twice(self):
        path, marks = self.workflow()
        open(os.path.join(marks, "hold"), "w").close()
        name = self.server.tau("run", "--detach", path, check=0).stdout.split()[0].rsplit("-", 1)[0]
        train = f"{name}-train"
        self.server.wait_state(train, "Running", timeout=60)
        # eval says it waits for its upstream from its submission on (the views it is read from
        # may be up to 200 ms old, so this waits rather than reads once), while train runs.
        wait_for(lambda: self.stages(name)["eval"]["pending"].get("code") == "WaitingForUpstream",
                 timeout=5, what="eval waiting for its upstream")
        self.assertEqual(self.stages(name)["train"]["state"], "Running")
        self.server.kill(signal.SIGKILL)
        self.server.start()
        os.remove(os.path.join(marks, "hold"))
        self.server.wait_state(f"{name}-eval", "Succeeded", timeout=60)
        self.assertEqual(self.ran(marks), ["prepare", "train", "eval"])
        for run in self.stages(name).values():
            self.assertEqual(run["attempts"], 1, run["name"])

    def test_cancel_stops_every_run_of_the_workflow_that_has_not_ended(self):
        path, marks = self.workflow()
        open(os.path.join(marks, "hold"), "w").close()
        name = self.server.tau("run", "--detach", path, check=0).stdout.split()[0].rsplit("-", 1)[0]
        self.server.wait_state(f"{name}-train", "Running", timeout=60)
        out = self.server.tau("workflow", "cancel", name, check=0).stdout.split("\n")
        self.assertEqual(sorted(line for line in out if line),
                         [f"cancelling {name}-eval", f"cancelling {name}-train"])
        for stage in ("train", "eval"):
            self.server.wait_state(f"{name}-{stage}", "Cancelled", timeout=60)
        self.assertEqual(self.stages(name)["prepare"]["state"], "Succeeded")
        out = self.server.tau("workflow", "cancel", name, check=0).stdout
        self.assertIn("has no run that has not ended", out)

    def test_a_cycle_or_an_unknown_stage_is_refused_where_it_is_with_nothing_submitted(self):
        path, _ = self.workflow(WORKFLOW.replace("after: [prepare]", "after: [eval]"))
        p = self.server.tau("run", path)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"{path}:6:5: error: stages[1]: the stages wait for each other in a cycle",
                      p.stderr)
        path, _ = self.workflow(WORKFLOW.replace("after: [prepare]", "after: [prepar]"))
        p = self.server.tau("run", path)
        self.assertIn(f"{path}:8:13: error: stages[1].after[0]: no stage is named 'prepar' "
                      "(did you mean 'prepare'?)", p.stderr)
        path, _ = self.workflow(WORKFLOW.replace("spec: eval.yaml", "spec: missing.yaml"))
        p = self.server.tau("run", path)
        self.assertNotEqual(p.returncode, 0)
        # At the stage's spec: value.
        self.assertIn(f"{path}:10:11: error: stage 'eval': spec: 'missing.yaml': no file ",
                      p.stderr)
        runs = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)["runs"]
        self.assertEqual(runs, [])

    def test_validate_reads_a_workflow_file_and_plan_says_which_command_takes_it(self):
        path, _ = self.workflow()
        p = self.server.tau("validate", path, check=0)
        self.assertIn(f"{path}: ok (workflow 'pipeline', 3 stage(s))", p.stdout)
        # A second `stages:` used to win silently, dropping the first one's stages.
        path, _ = self.workflow(WORKFLOW + "stages:\n  - {name: extra, spec: eval.yaml}\n")
        for command in (["validate", path], ["run", "--detach", path]):
            p = self.server.tau(*command, check=1)
            self.assertIn(f"{path}:13:1: error: duplicate field 'stages' (first given on line 3, "
                          "column 1)", p.stderr)
        for command in ("plan", "explain"):
            p = self.server.tau(command, path, check=1)
            self.assertIn(f"{path}: error: this is a workflow file, not a run spec; run it with "
                          f"`tau run {path}`, and check it with `tau validate {path}`", p.stderr)
            self.assertNotIn("yaml-cpp", p.stderr)
        other = os.path.join(os.path.dirname(path), "notes.yaml")
        with open(other, "w") as f:
            f.write("colour: red\n")
        for command in ("validate", "plan"):
            p = self.server.tau(command, other, check=1)
            self.assertIn(f"{other}:1:1: error: not a file tau reads (its top-level keys: colour); "
                          "tau reads a run spec", p.stderr)
        runs = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)["runs"]
        self.assertEqual(runs, [])


if __name__ == "__main__":
    unittest.main()
