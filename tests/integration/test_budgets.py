"""Budgets (issue #25, docs/budgets.md) with a real server and real processes on the test NVML: a
workspace's GPU-hour budget lets its first run go and holds the second with the budget's reason;
what was held survives a server SIGKILL exactly (nothing metered twice); a larger budget lets the
held run go; a budget that refuses runs that cannot fit refuses them at submission; a bad budget
is refused at file:line:col."""
import getpass
import json
import signal
import unittest

from harness import ServerTestCase, wait_for

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
defaults:
  workspace: vision
costs:
  currency: GPU-seconds
  flavors:
    gpu: {{gpu_hour: 3600, cpu_hour: 0}}
budgets:
  - workspace: vision
    gpu_hours: {{gpu_hours}}
    period: month
    warn_at: 0.5
"""

SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('done', flush=True)\n"


def spec(name, seconds, max_runtime=None):
    limit = f"  max_runtime: {max_runtime}\n" if max_runtime else ""
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: run.sh\n  workload_kind: job\n"
            f"  args: ['{seconds}']\n{limit}compute:\n  gpus: 1\n  cpus: 1\n  memory: 256Mi\n")


class BudgetTest(ServerTestCase):
    gpus = 2

    def apply(self, text):
        return self.apply_platform(text)

    def sleeper(self, name, seconds, max_runtime=None):
        return self.submit(spec(name, seconds, max_runtime),
                           {"main.py": SLEEPER, "run.sh": '#!/bin/sh\nexec python3 main.py "$@"\n'})

    def usage(self):
        return json.loads(self.server.tau("usage", "--since", "30d", "-o", "json", check=0).stdout)

    def events(self, run):
        return self.server.run_json(run)["events"]

    def pending(self, run):
        return json.loads(self.server.tau("status", run, "-o", "json", check=0).stdout).get("pending")

    def test_a_spent_budget_holds_the_next_run_until_it_has_room(self):
        self.assertEqual(self.apply(PLATFORM.replace("{gpu_hours}", "0.001")).returncode, 0)
        # 0.001 GPU-h is 3.6 GPU-seconds: a run holding a GPU for 4 s spends it.
        first = self.sleeper("first", 4)
        self.server.wait_state(first, ["Succeeded"], timeout=60)
        [metered] = [e for e in self.events(first) if e["type"] == "Metered"]
        held = metered["data"]["gpu_hours"]
        self.assertGreaterEqual(held, 4 / 3600)
        self.assertEqual(metered["data"]["gpus"], 1)
        # The test NVML's GPUs sit at 0 %: every second the samples saw of it was idle.
        self.assertGreater(metered["data"]["sampled_gpu_hours"], 2 / 3600)
        self.assertEqual(metered["data"]["idle_gpu_hours"], metered["data"]["sampled_gpu_hours"])

        second = self.sleeper("second", 0)
        pending = wait_for(lambda: (lambda p: p if p and p.get("code") == "BudgetSpent" else None)(
            self.pending(second)), what="the second run held by the budget")
        self.assertRegex(pending["reason"],
                         r"^budget of workspace vision spent: 0\.00\d+ of 0\.0010 GPU-h this "
                         r"month; resets in \d+")
        self.assertEqual(self.server.run_json(second)["run"]["state"], "Queued")
        self.assertIn("BudgetHold", [e["type"] for e in self.events(second)])
        [row] = self.usage()["rows"]
        self.assertEqual(row["key"], "vision")
        self.assertAlmostEqual(row["gpu_hours"], held, places=12)
        self.assertEqual(row["runs"], 1)
        self.assertEqual(row["idle_share"], 1.0)
        # Costs from the flavor's rate: 3600 an hour is the GPU-seconds held.
        self.assertAlmostEqual(row["cost"], held * 3600, places=9)
        by_flavor = json.loads(self.server.tau("usage", "--by", "flavor", "--since", "30d", "-o",
                                               "json", check=0).stdout)
        self.assertEqual(by_flavor["currency"], "GPU-seconds")
        self.assertEqual([r["key"] for r in by_flavor["rows"]], ["gpu"])
        self.assertIn("COST (GPU-seconds)", self.server.tau("usage", "--by", "flavor", check=0).stdout)
        self.assertRegex(self.server.tau("usage", check=0).stdout, r"\nvision\s+0\.00\d+\s+[\d.]+\s+100%\s+[\d.]+\s+1\n")
        queues = self.server.tau("queues", check=0).stdout
        self.assertRegex(queues, r"workspace vision\s+0\.00\d+ / 0\.0010 GPU-h\s+this month")
        self.assertIn("spent", queues)
        metrics = self.server.tau_http("/metrics")
        self.assertIn('tau_budget_limit_gpu_hours{budget="workspace vision",user=""} 0.001',
                      metrics)

        # A SIGKILL and a restart meter nothing twice, and the run is still held.
        self.server.kill(signal.SIGKILL)
        self.server.start()
        self.assertEqual(self.usage()["rows"], [row])
        wait_for(lambda: (self.pending(second) or {}).get("code") == "BudgetSpent",
                 what="the run held again after the restart")
        self.assertEqual([e["type"] for e in self.events(first)].count("Metered"), 1)

        # A larger budget lets it go.
        self.assertEqual(self.apply(PLATFORM.replace("{gpu_hours}", "1")).returncode, 0)
        self.server.wait_state(second, ["Succeeded"], timeout=60)
        types = [e["type"] for e in self.events(second)]
        self.assertLess(types.index("BudgetHold"), types.index("BudgetAvailable"))
        # Past warn_at (half of 1 GPU-h)? No: 4 s of 3600 is far below; no warning was given.
        self.assertNotIn("BudgetWarning", types)

    def test_a_budget_in_money_is_priced_at_the_flavors_rates(self):
        # The currency is GPU-seconds at 3600 an hour, so a budget of 3 is 3 GPU-seconds.
        def platform(rate):
            return PLATFORM.replace("gpu: {gpu_hour: 3600", f"gpu: {{gpu_hour: {rate}").replace(
                "    gpu_hours: {gpu_hours}\n", "    cost: 3\n")
        self.assertEqual(self.apply(platform(3600)).returncode, 0)
        first = self.sleeper("first", 4)
        self.server.wait_state(first, ["Succeeded"], timeout=60)
        [metered] = [e for e in self.events(first) if e["type"] == "Metered"]
        cost = metered["data"]["gpu_hours"] * 3600
        second = self.sleeper("second", 0)
        pending = wait_for(lambda: (lambda p: p if p and p.get("code") == "BudgetSpent" else None)(
            self.pending(second)), what="the second run held by the budget in money")
        self.assertEqual(pending["reason"].split(" this month")[0],
                         f"budget of workspace vision spent: {cost:.2f} GPU-seconds of 3.00 "
                         "GPU-seconds")
        budgets = json.loads(self.server.tau_http("/api/v1/budgets"))["budgets"]
        self.assertAlmostEqual(budgets[0]["used"]["cost"], cost, places=6)
        self.assertEqual((budgets[0]["cost"], budgets[0]["currency"]), (3, "GPU-seconds"))
        self.assertIsNone(budgets[0]["gpu_hours"])
        self.assertRegex(self.server.tau("queues", check=0).stdout,
                         r"workspace vision\s+[\d.]+ / 3\.00 GPU-seconds\s+this month")
        self.assertIn('tau_budget_limit_cost{budget="workspace vision",user="",'
                      'currency="GPU-seconds"} 3', self.server.tau_http("/metrics"))
        # After a SIGKILL the ledger is priced again from the Metered events: still spent.
        self.server.kill(signal.SIGKILL)
        self.server.start()
        wait_for(lambda: (self.pending(second) or {}).get("code") == "BudgetSpent",
                 what="the run held again after the restart")
        # A lower rate prices the month's use again (as `tau usage` does): it has room now.
        self.assertEqual(self.apply(platform(1800)).returncode, 0)
        self.server.wait_state(second, ["Succeeded"], timeout=60)
        # A budget in money without rates to price it is refused at its field.
        r = self.apply(platform(3600).split("costs:")[0] + "budgets:\n  - workspace: vision\n"
                       "    cost: 5\n    period: month\n")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("budgets[0].cost: the platform has no costs to price it with", r.stderr)

    def test_a_refusing_budget_refuses_a_run_that_cannot_fit_at_submission(self):
        platform = PLATFORM.replace("{gpu_hours}", "0.5").replace(
            "    warn_at: 0.5\n", "    warn_at: 0.5\n    on_exceed: refuse\n")
        self.assertEqual(self.apply(platform).returncode, 0)
        d = self.project(spec("long", 0, max_runtime="1h"),
                         {"main.py": SLEEPER, "run.sh": '#!/bin/sh\nexec python3 main.py "$@"\n'})
        r = self.server.tau("run", "--detach", d, check=None)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("run.max_runtime: 1 GPU(s) for 1h is up to 1.0 GPU-h, and the budget of "
                      "workspace vision has 0.5 of 0.5 GPU-h left", r.stderr)
        short = self.sleeper("short", 0, max_runtime="10m")
        self.server.wait_state(short, ["Succeeded"], timeout=60)

    def test_queues_name_a_budget_and_its_window_as_the_file_does(self):
        text = PLATFORM.replace("{gpu_hours}", "5").replace(
            "    period: month\n", "    window: 7d\n    name: vision-weekly\n")
        self.assertEqual(self.apply(text).returncode, 0)
        self.assertRegex(self.server.tau("queues", check=0).stdout,
                         r"vision-weekly \(workspace vision\)\s+[\d.]+ / 5[\d.]* GPU-h\s+last 7d")

    def test_bad_budgets_are_refused_at_their_fields(self):
        bad = PLATFORM.replace("{gpu_hours}", "-3").replace("period: month", "period: fortnight")
        bad += "  - workspace: visoin\n    gpu_hours: 1\n    window: 10m\n"
        bad += "  - workspace: vision\n    user: nobody-here\n    gpu_hours: 1\n    period: day\n"
        r = self.apply(bad)
        self.assertNotEqual(r.returncode, 0)
        lines = PLATFORM.count("\n")
        for text in [f":{lines - 2}:16: error: budgets[0].gpu_hours: -3 is negative",
                     f":{lines - 1}:13: error: budgets[0].period: 'fortnight' is not a period",
                     f":{lines + 1}:16: error: budgets[1].workspace: unknown workspace 'visoin' "
                     "(did you mean 'vision'?)",
                     f":{lines + 3}:13: error: budgets[1].window: a rolling window is at least 1h",
                     f":{lines + 5}:11: error: budgets[2].user: unknown user 'nobody-here'"]:
            self.assertIn(text, r.stderr)


if __name__ == "__main__":
    unittest.main()
