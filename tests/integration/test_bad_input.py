"""Bad input is refused at the line that set it (issue 48): a sweep point's value and a workflow
stage's `set:` value are named at their place in the sweep or workflow file, not as a --set flag;
a sweep's or a stage's `spec:` naming no file is refused at that value's line. Each with a real
server and the real CLI, nothing submitted."""
import json
import os
import subprocess
import tempfile
import unittest

from harness import TAU, ServerTestCase

PLATFORM = """flavors: [{name: f}]
queues:
  - name: q
    resource_groups:
      - covered_resources: [cpu]
        flavors: [{name: f, resources: [{name: cpu, nominal: 8}]}]
workspaces:
  - name: w
    members: ["*"]
    webhooks:
      - url: https://hooks.example/tau
        secret: K
        events: []
"""

SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 16Mi\n")
MAIN = "#!/bin/sh\necho hi\n"
SERVICE = ("schema_version: 1\nkind: service\nname: sv\nrun:\n  entrypoint: main.sh\n"
           "compute:\n  gpus: 0\nserve:\n  replicas: 1\n  from: {frm}\n")


class BadInputTest(ServerTestCase):
    def write_beside(self, spec_path, name, text):
        path = os.path.join(os.path.dirname(spec_path), name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def no_runs(self):
        runs = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)["runs"]
        self.assertEqual(runs, [])

    def test_a_bad_sweep_value_is_named_at_its_line_in_the_sweep_file(self):
        spec = self.project(SPEC.format(name="sw"), {"main.sh": MAIN})
        sweep = self.write_beside(spec, "sweep.yaml",
                                  "spec: tau.yaml\n"
                                  "parameters:\n"
                                  "  compute.gpus: [0,\n"
                                  "                 two]\n")
        p = self.server.tau("sweep", sweep, check=1)
        self.assertIn(f"{sweep}:4:18: error: compute.gpus: expected an integer", p.stderr)
        self.assertNotIn("--set compute.gpus", p.stderr)
        self.no_runs()

    def test_a_bad_random_range_draw_is_named_at_the_range(self):
        spec = self.project(SPEC.format(name="sr"), {"main.sh": MAIN})
        sweep = self.write_beside(spec, "sweep.yaml",
                                  "spec: tau.yaml\nmethod: random\nsamples: 2\n"
                                  "parameters:\n"
                                  "  compute.gpus: {min: 500, max: 600}\n")
        p = self.server.tau("sweep", sweep, check=1)
        self.assertIn(f"{sweep}:5:17: error: compute.gpus:", p.stderr)
        self.no_runs()

    def test_a_bad_stage_set_value_is_named_at_its_line_in_the_workflow_file(self):
        spec = self.project(SPEC.format(name="wf"), {"main.sh": MAIN})
        for form, line, col in (("    set:\n      compute.gpus: lots\n", 7, 21),
                                ("    set: [compute.cpus=1, compute.gpus=lots]\n", 6, 27)):
            with self.subTest(form=form):
                wf = self.write_beside(spec, "wf.yaml",
                                       "kind: workflow\nname: wf\nstages:\n"
                                       "  - name: train\n    spec: tau.yaml\n" + form)
                # `tau validate` checks the stages as `tau run` does, before anything is sent.
                for args in (("validate", wf), ("run", wf)):
                    p = self.server.tau(*args, check=1)
                    self.assertIn(f"{wf}:{line}:{col}: error: compute.gpus: expected an integer",
                                  p.stderr)
                    self.assertNotIn("--set compute.gpus", p.stderr)
        self.no_runs()

    def test_validate_of_a_workflow_checks_each_stages_spec(self):
        spec = self.project(SPEC.format(name="vs"), {"main.sh": MAIN})
        self.write_beside(spec, "bad.yaml", SPEC.format(name="vs").replace("gpus: 0", "gpus: -1"))
        self.write_beside(spec, "svc.yaml", "kind: workflow\nname: x\nstages: []\n")
        text = ("kind: workflow\nname: vs\nstages:\n  - name: train\n    spec: tau.yaml\n"
                "  - name: eval\n    after: [train]\n    spec: {}\n")
        good = self.write_beside(spec, "good.yaml", text.format("tau.yaml"))
        p = self.server.tau("validate", good, check=0)
        self.assertIn("workflow 'vs', 2 stage(s)", p.stdout)
        bad_spec = os.path.join(os.path.dirname(spec), "bad.yaml")
        wf = self.write_beside(spec, "wf.yaml", text.format("bad.yaml"))
        p = self.server.tau("validate", wf, check=1)
        self.assertIn(f"{bad_spec}:7:", p.stderr)
        self.assertIn("compute.gpus", p.stderr)
        self.assertIn(f"{wf}:6:5: error: stage 'eval': its spec {bad_spec} cannot be used",
                      p.stderr)
        wf = self.write_beside(spec, "wf.yaml", text.format("svc.yaml"))
        p = self.server.tau("validate", wf, check=1)
        self.assertIn("stage 'eval': its spec", p.stderr)
        self.assertIn("is a workflow file, not a run spec", p.stderr)
        wf = self.write_beside(spec, "wf.yaml", text.format("evl.yaml"))
        p = self.server.tau("validate", wf, check=1)
        self.assertIn(f"{wf}:8:11: error: stage 'eval': spec: 'evl.yaml': no file ", p.stderr)
        self.no_runs()

    def test_a_stage_set_path_that_is_no_path_is_refused_by_validate_at_its_line(self):
        spec = self.project(SPEC.format(name="wp"), {"main.sh": MAIN})
        wf = self.write_beside(spec, "wf.yaml",
                               "kind: workflow\nname: wp\nstages:\n"
                               "  - name: train\n    spec: tau.yaml\n"
                               "    set: [compute.=1]\n")
        p = self.server.tau("validate", wf, check=1)
        self.assertIn(f"{wf}:6:11: error: stages[0].set[0]: compute.=1: 'compute.' is not a "
                      "field path", p.stderr)

    def test_a_missing_sweep_spec_is_refused_at_the_spec_line(self):
        spec = self.project(SPEC.format(name="ms"), {"main.sh": MAIN})
        sweep = self.write_beside(spec, "sweep.yaml",
                                  "parameters:\n  compute.gpus: [0]\nspec: nope.yaml\n")
        for args in (("validate", sweep), ("sweep", sweep)):
            p = self.server.tau(*args, check=1)
            self.assertIn(f"{sweep}:3:7: error: spec: 'nope.yaml': no file ", p.stderr)
        self.no_runs()

    def test_a_missing_stage_spec_is_refused_at_the_spec_line(self):
        spec = self.project(SPEC.format(name="mw"), {"main.sh": MAIN})
        wf = self.write_beside(spec, "wf.yaml",
                               "kind: workflow\nname: mw\nstages:\n"
                               "  - name: train\n    spec: tau.yaml\n"
                               "  - name: eval\n    after: [train]\n    spec: evl.yaml\n")
        p = self.server.tau("run", wf, check=1)
        self.assertIn(f"{wf}:8:11: error: stage 'eval': spec: 'evl.yaml': no file ", p.stderr)
        self.no_runs()

    def test_serve_from_is_checked_alike_by_validate_and_deploy_and_named_where_it_was_set(self):
        svc = self.project(SERVICE.format(frm="Bad_Name"), {"main.sh": MAIN})
        p = self.server.tau("validate", svc, check=1)
        self.assertIn(f"{svc}:10:9: error: serve.from: 'Bad_Name' is not a run's name", p.stderr)
        p = self.server.tau("serve", "deploy", svc)
        self.assertIn(f"{svc}:10:9: error: serve.from: 'Bad_Name' is not a run's name", p.stderr)
        ok = self.project(SERVICE.format(frm="nope-run"), {"main.sh": MAIN})
        p = self.server.tau("serve", "deploy", ok, "--from", "Bad_Name")
        self.assertIn("--from Bad_Name: not a run's name", p.stderr)
        # The server's refusal, at what set the run: the file's line, a --set, or --from.
        p = self.server.tau("serve", "deploy", ok)
        self.assertIn(f"{ok}:10:3: error: serve.from: no run is named 'nope-run'", p.stderr)
        p = self.server.tau("serve", "deploy", ok, "--set", "serve.from=other-run")
        self.assertIn("--set serve.from=other-run: error: serve.from: no run is named 'other-run'",
                      p.stderr)
        p = self.server.tau("serve", "deploy", ok, "--from", "third-run")
        self.assertIn("--from third-run: error: no run is named 'third-run'", p.stderr)
        self.assertNotIn(f"{ok}:", p.stderr)

    def test_a_set_hint_suggests_forms_that_are_accepted(self):
        spec = self.project(SPEC.format(name="hint"), {"main.sh": MAIN})
        p = self.server.tau("validate", spec, "--set", "run.args=--lr", check=1)
        self.assertIn("write the whole list as --set 'run.args=[a, b]'", p.stderr)
        # The form as the shell passes it once its quotes are gone.
        self.server.tau("validate", spec, "--set", "run.args=[a, b]", check=0)
        p = self.server.tau("validate", spec, "--set", "policy=1", check=1)
        hint = p.stderr.split("such as --set ", 1)[1].split("=VALUE", 1)[0]
        p = self.server.tau("validate", spec, "--set", hint + "=1")
        self.assertNotIn("is a section", p.stderr)

    def test_an_entrypoint_that_climbs_out_of_the_code_directory_is_refused_at_its_line(self):
        # In a repository (tau/NAME.yaml), the code is the repository: leaving it is refused.
        repo = tempfile.mkdtemp(dir=self.work)
        os.makedirs(os.path.join(repo, ".git"))
        os.makedirs(os.path.join(repo, "tau"))
        spec = os.path.join(repo, "tau", "train.yaml")
        with open(spec, "w") as f:
            f.write(SPEC.format(name="up").replace("main.sh", "../../main.sh"))
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 125, p.stderr)
        self.assertIn(f"{spec}:4:3: error: run.entrypoint: '../../main.sh' leaves the repository "
                      "root", p.stderr)
        # Beside a plain spec, ../ makes the folder above the code: what is not there is named
        # at its line too.
        spec = self.project(SPEC.format(name="up").replace("main.sh", "../main.sh"),
                            {"main.sh": MAIN})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 125, p.stderr)
        self.assertIn(f"{spec}:4:3: error: run.entrypoint: '../main.sh' is not among", p.stderr)
        self.no_runs()

    def test_a_server_refusal_of_a_set_value_names_the_set(self):
        spec = self.project(SPEC.format(name="srv"), {"main.sh": MAIN})
        p = self.server.tau("run", spec, "--set", "run.entrypoint=nothere.py")
        self.assertEqual(p.returncode, 125, p.stderr)
        self.assertIn("--set run.entrypoint=nothere.py: error: run.entrypoint: 'nothere.py' is "
                      "not among the", p.stderr)
        self.assertNotIn(f"{spec}:", p.stderr)
        self.no_runs()

    def test_a_missing_colon_is_noted_at_its_line(self):
        spec = self.project("schema_version: 1\nname: mc\nrun:\n  entrypoint main.sh\n"
                            "  workload_kind: job\n", {"main.sh": MAIN})
        p = self.server.tau("validate", spec, check=1)
        self.assertIn(f"{spec}:5:16: error: YAML syntax error: illegal map value", p.stderr)
        self.assertIn(f"{spec}:4:3: note: this line has no ':' after its key", p.stderr)

    def test_a_guardrail_duration_under_its_minimum_names_the_minimum(self):
        spec = self.project(SPEC.format(name="gd") +
                            "policy:\n  guardrails:\n    idle: {warn_after: 500ms}\n",
                            {"main.sh": MAIN})
        p = self.server.tau("validate", spec, check=1)
        self.assertIn(f"{spec}:13:24: error: policy.guardrails.idle.warn_after: must be at "
                      "least 1s, got '500ms'", p.stderr)

    def test_a_fifo_in_the_code_directory_is_skipped_with_its_path(self):
        spec = self.project(SPEC.format(name="ff"), {"main.sh": MAIN})
        os.mkfifo(os.path.join(os.path.dirname(spec), "pipe"))
        p = self.server.tau("run", spec, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("skipped 'pipe': a FIFO, not a regular file", p.stderr)

    def test_an_unclosed_brace_is_refused_at_the_brace(self):
        spec = self.project("schema_version: 1\nname: br\nrun: {entrypoint: main.sh,\n"
                            "  workload_kind: job\ncompute:\n  gpus: 0\n", {"main.sh": MAIN})
        p = self.server.tau("validate", spec, check=1)
        self.assertIn(f"{spec}:3:6: error: this '{{' is never closed: add the '}}' that ends it "
                      "(YAML syntax error at ", p.stderr)

    def test_a_utf16_spec_says_to_save_it_as_utf8(self):
        spec = self.project("", {"main.sh": MAIN})
        with open(spec, "wb") as f:
            f.write(SPEC.format(name="u16").encode("utf-16"))
        p = self.server.tau("validate", spec, check=1)
        self.assertIn(f"{spec}:1:1: error: the file is UTF-16 text; tau reads YAML as UTF-8: save "
                      "it as UTF-8", p.stderr)


class PlatformBadInputTest(unittest.TestCase):
    def test_a_webhook_with_no_events_is_refused_at_its_events(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "platform.yaml")
            with open(path, "w") as f:
                f.write(PLATFORM)
            p = subprocess.run([TAU, "platform", "validate", path], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(f"{path}:13:17: error: workspaces[0].webhooks[0].events: names no event "
                          "kind, so the receiver would get nothing; list the kinds it takes "
                          "(state, guardrail, budget), or leave events out for all", p.stderr)


if __name__ == "__main__":
    unittest.main()
