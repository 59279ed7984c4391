"""Idle and stalled runs (issue #25, docs/budgets.md) with a real server, real processes and the
test NVML: a run whose GPU stays at 0 % is warned, then stopped as Idle and not retried, while a
CPU run beside it is left alone; a Python job that stops writing is marked stalled, its stacks
land in its log and its diagnosis, and it is stopped as Stalled, while a job that keeps writing
runs to its end; a spec's policy.guardrails tightens its workspace's limits (and sets them where
the workspace has none), never loosens them, and `tau explain` shows the limits that will be
enforced and where each came from."""
import getpass
import unittest

from harness import ServerTestCase

USER = getpass.getuser()

PLATFORM = f"""schema_version: 1
flavors:
  - name: gpu
queues:
  - name: gpu
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: gpu
            resources:
              - {{name: cpu, nominal: 8}}
              - {{name: memory, nominal: 16Gi}}
              - {{name: nvidia.com/gpu, nominal: 2}}
workspaces:
  - name: vision
    members: ["{USER}"]
    default_queue: gpu
    limits:
      {{limits}}
defaults:
  workspace: vision
"""


def spec(name, gpus=0, guardrails=""):
    # max_retries with the default retry_on: Idle and Stalled are not in it, so neither is retried.
    policy = f"policy:\n  guardrails:\n    {guardrails}\n" if guardrails else ""
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.py\n  workload_kind: job\n"
            f"compute:\n  gpus: {gpus}\n  cpus: 1\n  memory: 256Mi\nresilience:\n  max_retries: 2\n"
            f"{policy}")


class GuardrailCase(ServerTestCase):
    def apply(self, limits):
        p = self.apply_platform(PLATFORM.replace("{limits}", limits))
        self.assertEqual(p.returncode, 0, p.stderr)

    def types(self, run):
        return [e["type"] for e in self.server.run_json(run)["events"]]


class GuardrailTest(GuardrailCase):
    gpus = 2

    def test_idle_gpus_are_warned_then_stopped_as_idle_and_not_retried(self):
        self.apply("idle: {gpu_util_below: 5, warn_after: 2s, stop_after: 5s}")
        sleeper = "import time\nprint('holding the GPU', flush=True)\ntime.sleep(120)\n"
        idle = self.submit(spec("idle", gpus=1), {"main.py": sleeper})
        cpu = self.submit(spec("cpu-only"), {"main.py": "import time\ntime.sleep(7)\n"})
        self.server.wait_state(idle, ["Failed"], timeout=60)
        d = self.server.run_json(idle)
        self.assertEqual([a["reason"] for a in d["attempts"]], ["Idle"])
        types = [e["type"] for e in d["events"]]
        self.assertIn("IdleWarning", types)
        self.assertLess(types.index("IdleWarning"), types.index("Idle"))
        warning = next(e for e in d["events"] if e["type"] == "IdleWarning")
        self.assertRegex(warning["message"], r"^GPU \d under 5% utilisation for \d+(\.\d)?s; it is stopped "
                                             r"as Idle after 5(\.0)?s$")
        stop = next(e for e in d["events"] if e["type"] == "Idle")
        self.assertIn("limits.idle.stop_after", stop["message"])
        text = self.server.tau("describe", idle, check=0).stdout
        self.assertIn("IdleWarning", text)
        self.server.wait_state(cpu, ["Succeeded"], timeout=60)
        self.assertNotIn("IdleWarning", self.types(cpu))

    def test_a_quiet_python_job_is_marked_stalled_with_its_stacks_then_stopped(self):
        self.apply("stall: {after: 2s, stop_after: 6s}")
        quiet = ("import time\nprint('step 1', flush=True)\n"
                 "def wait_for_peers():\n    time.sleep(120)\n"
                 "wait_for_peers()\n")
        chatty = ("import time\nfor i in range(40):\n    print('step', i, flush=True)\n"
                  "    time.sleep(0.25)\n")
        stalled = self.submit(spec("stalled"), {"main.py": quiet})
        busy = self.submit(spec("busy"), {"main.py": chatty})
        self.server.wait_state(stalled, ["Failed"], timeout=60)
        d = self.server.run_json(stalled)
        self.assertEqual([a["reason"] for a in d["attempts"]], ["Stalled"])
        types = [e["type"] for e in d["events"]]
        self.assertLess(types.index("StallDetected"), types.index("Stalled"))
        mark = next(e for e in d["events"] if e["type"] == "StallDetected")
        self.assertEqual(mark["data"]["stack_dumps"], 1, mark)
        self.assertIn("1 Python process asked to write their stacks to the log", mark["message"])
        log = self.server.tau("logs", stalled, check=0).stdout
        self.assertIn("(most recent call first):", log)
        self.assertIn("in wait_for_peers", log)
        diagnosis = d["attempts"][0]["diagnosis"]
        self.assertIn("stack-dump", [e["signature"] for e in diagnosis["evidence"]])
        self.assertIn("in wait_for_peers", diagnosis["summary"])
        self.server.wait_state(busy, ["Succeeded"], timeout=60)
        self.assertNotIn("StallDetected", self.types(busy))

    def test_a_spec_tightens_its_workspaces_limits_and_never_loosens_them(self):
        # The workspace watches only for stalls, and late; the spec asks for an idle stop of its
        # own, and for an earlier stall stop than the workspace's.
        self.apply("stall: {after: 1h, stop_after: 2h}")
        sleeper = "import time\nprint('holding the GPU', flush=True)\ntime.sleep(120)\n"
        idle = self.submit(spec("spec-idle", gpus=1,
                                guardrails="idle: {warn_after: 1s, stop_after: 3s}"),
                           {"main.py": sleeper})
        quiet = "import time\nprint('step 1', flush=True)\ntime.sleep(120)\n"
        stalled = self.submit(spec("spec-stall", guardrails="stall: {stop_after: 4s}"),
                              {"main.py": quiet})
        # A looser spec than its workspace changes nothing: this one would wait for 2 h.
        loose = self.submit(spec("spec-loose", guardrails="stall: {after: 3h, stop_after: 4h}"),
                            {"main.py": "import time\nprint('once', flush=True)\ntime.sleep(8)\n"})
        for run, reason, limit in [(idle, "Idle", "policy.guardrails.idle.stop_after"),
                                   (stalled, "Stalled", "policy.guardrails.stall.stop_after")]:
            self.server.wait_state(run, ["Failed"], timeout=60)
            d = self.server.run_json(run)
            self.assertEqual([a["reason"] for a in d["attempts"]], [reason])
            stop = next(e for e in d["events"] if e["type"] == reason)
            self.assertIn(f"the run's {limit}", stop["message"])
        # The stall mark came first (at the stop's time: the workspace's 1 h mark is later).
        self.assertLess(self.types(stalled).index("StallDetected"), self.types(stalled).index("Stalled"))
        self.server.wait_state(loose, ["Succeeded"], timeout=60)
        self.assertNotIn("StallDetected", self.types(loose))
        # tau schema documents the field.
        schema = self.server.tau("schema", check=0).stdout
        self.assertIn('"guardrails"', schema)
        self.assertIn("Stopped as Idle after this long under it", schema)


class GuardrailWithoutGpusTest(GuardrailCase):
    """A machine with no GPUs takes no GPU samples: a spec's own stall limit is still watched."""
    gpus = 0

    def test_a_specs_own_stall_limit_is_watched_without_gpu_samples(self):
        self.apply("max_runtime: 1h")  # no idle or stall limit in the workspace
        quiet = "import time\nprint('step 1', flush=True)\ntime.sleep(120)\n"
        stalled = self.submit(spec("cpu-stall", guardrails="stall: {after: 1s, stop_after: 3s}"),
                              {"main.py": quiet})
        self.server.wait_state(stalled, ["Failed"], timeout=60)
        d = self.server.run_json(stalled)
        self.assertEqual([a["reason"] for a in d["attempts"]], ["Stalled"])

    def test_explain_shows_the_enforced_limits_and_where_they_came_from(self):
        self.apply("idle: {gpu_util_below: 5, warn_after: 30m, stop_after: 1h}\n"
                   "      stall: {after: 1h}")
        # The spec asks for looser idle limits than its workspace's, and an earlier stall mark.
        path = self.project(spec("explained", guardrails="idle: {warn_after: 2h, stop_after: 3h}\n"
                                                          "    stall: {after: 10m}"),
                            {"main.py": "print('hi')\n"})
        out = self.server.tau("explain", path, check=0).stdout
        rows = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line}
        self.assertRegex(rows["policy.guardrails.idle.warn_after"],
                         r"^30m \(spec asked 2h\) +workspace guardrail \(workspace vision\)$")
        self.assertRegex(rows["policy.guardrails.idle.stop_after"],
                         r"^1h \(spec asked 3h\) +workspace guardrail \(workspace vision\)$")
        self.assertRegex(rows["policy.guardrails.idle.gpu_util_below"],
                         r"^5% +workspace guardrail \(workspace vision\)$")
        self.assertRegex(rows["policy.guardrails.stall.after"], r"^10m +spec$")


if __name__ == "__main__":
    unittest.main()
