"""Platform policy and Kueue-model admission on the local backend: two workspaces share a machine,
quotas hold, a high-priority run preempts a low one that later resumes, pending runs explain
themselves, and `tau platform apply` changes policy without a restart."""
import getpass
import json
import os
import tempfile
import unittest

import subprocess

from harness import TAU, ServerTestCase, TauServer, wait_for

USER = getpass.getuser()

PLATFORM = f"""schema_version: 1
flavors:
  - name: gpu
cohorts:
  - name: lab
queues:
  - name: vision
    cohort: lab
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: gpu
            resources:
              - {{name: cpu, nominal: 64}}
              - {{name: memory, nominal: 256Gi}}
              - {{name: nvidia.com/gpu, nominal: 2, lending_limit: 0}}
    preemption:
      within_cluster_queue: LowerPriority
  - name: speech
    cohort: lab
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: gpu
            resources:
              - {{name: cpu, nominal: 64}}
              - {{name: memory, nominal: 256Gi}}
              - {{name: nvidia.com/gpu, nominal: 2, lending_limit: 0}}
priorities:
  - {{name: low, value: 0}}
  - {{name: high, value: 1000}}
workspaces:
  - name: vision
    members: ["{USER}"]
    default_queue: vision
    default_priority: low
  - name: speech
    members: ["{USER}"]
    default_queue: speech
    default_priority: low
  - name: closed
    members: [somebody-else]
    default_queue: speech
defaults:
  workspace: vision
"""

# Waits until its release file exists; writes a complete checkpoint first when asked to.
WAITER = """import os, signal, sys, time
release = sys.argv[1]
if 'ignore-term' in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('attempt', os.environ['TAU_ATTEMPT'], 'reason', os.environ.get('TAU_FAILURE_REASON'),
      'resume', os.environ.get('TAU_RESUME_FROM'), flush=True)
if os.environ['TAU_ATTEMPT'] == '1' and 'checkpoint' in sys.argv:
    step = os.path.join(os.environ['TAU_CHECKPOINT_DIR'], 'step-1')
    os.makedirs(step, exist_ok=True)
    open(os.path.join(step, 'COMPLETE'), 'w').close()
    print('checkpointed', flush=True)
while not os.path.exists(release):
    time.sleep(0.05)
"""


def spec(name, workspace, gpus=1, priority=None, args=()):
    policy = f"policy:\n  workspace: {workspace}\n"
    if priority:
        policy += f"  priority: {priority}\n"
    arglist = "\n  args:" + "".join(f"\n    - {a}" for a in args) if args else ""
    # A shell entrypoint: tau would put a multi-GPU Python entrypoint under torchrun (PyTorch).
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: run.sh\n  workload_kind: job\n"
            f"{arglist}\ncompute:\n  gpus: {gpus}\n{policy}")


class QueueTest(ServerTestCase):
    gpus = 4

    def setUp(self):
        super().setUp()
        self.releases = tempfile.mkdtemp(prefix="tau-it-rel-")
        fd, self.platform_file = tempfile.mkstemp(prefix="tau-it-platform-", suffix=".yaml")
        os.write(fd, PLATFORM.encode())
        os.close(fd)

    def tearDown(self):
        super().tearDown()
        os.unlink(self.platform_file)

    def release(self, tag):
        open(os.path.join(self.releases, tag), "w").close()

    def waiter(self, name, workspace, tag, gpus=1, priority=None, checkpoint=False, ignore_term=False):
        args = ([os.path.join(self.releases, tag)] + (["checkpoint"] if checkpoint else []) +
                (["ignore-term"] if ignore_term else []))
        return self.submit(spec(name, workspace, gpus, priority, args),
                           {"main.py": WAITER, "run.sh": '#!/bin/sh\nexec python3 main.py "$@"\n'})

    def apply(self):
        self.server.tau("platform", "apply", self.platform_file, check=0)

    def pending(self, name):
        return json.loads(self.server.tau("status", name, "-o", "json", check=0).stdout).get("pending")

    def queue(self, name):
        return json.loads(self.server.tau("queue", "show", name, "-o", "json", check=0).stdout)

    def test_platform_apply_and_show(self):
        shown = json.loads(self.server.tau("platform", "show", "-o", "json", check=0).stdout)
        self.assertEqual(shown["source"], "default")
        self.assertEqual([q["name"] for q in shown["platform"]["queues"]], ["default"])
        # A mistake is refused with file:line:col and changes nothing.
        bad = self.platform_file + ".bad.yaml"
        with open(bad, "w") as f:
            f.write(PLATFORM.replace("within_cluster_queue: LowerPriority",
                                     "within_cluster_queue: Sometimes"))
        p = self.server.tau("platform", "apply", bad)
        os.unlink(bad)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"\.bad\.yaml:18:29: error: .*Sometimes")
        # One mistake, one error: the queue with the bad field still counts for references.
        self.assertNotIn("unknown queue", p.stderr)
        self.apply()
        shown = json.loads(self.server.tau("platform", "show", "-o", "json", check=0).stdout)
        self.assertEqual(shown["source"], self.platform_file)
        self.assertEqual([q["name"] for q in shown["platform"]["queues"]], ["vision", "speech"])
        table = self.server.tau("queues", check=0).stdout
        self.assertRegex(table, r"vision\s+lab\s+0\s+0")
        # plan resolves against the applied platform, as explain and run do.
        planned = self.project(spec("planned", "speech"), {"run.sh": "#!/bin/sh\n"})
        plan = self.server.tau("plan", planned)
        explain = self.server.tau("explain", planned)
        self.assertEqual((plan.returncode, explain.returncode), (0, 0), plan.stderr + explain.stderr)
        self.assertIn("speech", explain.stdout)
        self.assertIn(explain.stdout, plan.stdout)
        # Membership is checked at submission, naming the workspace.
        p = self.server.tau("run", "--detach",
                            self.project(spec("nope", "closed", gpus=0), {"main.py": "print(1)\n"}))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("closed", p.stderr)
        # The policy survives a server restart.
        self.server.kill()
        self.server.start()
        shown = json.loads(self.server.tau("platform", "show", "-o", "json", check=0).stdout)
        self.assertEqual(shown["source"], self.platform_file)

    def test_platform_show_is_a_platform_file(self):
        # What `tau platform show` prints validates and applies back, for the default platform
        # and for an applied one, also after a restart.
        def shown_validates():
            text = self.server.tau("platform", "show", check=0).stdout
            p = self.server.tau("platform", "validate", "-", input=text)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr + text)
            return text
        default = shown_validates()
        self.assertIn("name: default", default)
        copy = os.path.join(self.work, "shown.yaml")
        with open(copy, "w") as f:
            f.write(default)
        self.server.tau("platform", "apply", copy, check=0)
        # What is in force now is that text, comments and all.
        self.assertEqual(shown_validates().split("\n", 1)[1], default)
        self.apply()
        with open(self.platform_file) as f:
            self.assertEqual(shown_validates().split("\n", 1)[1], f.read())
        self.server.kill()
        self.server.start()
        with open(self.platform_file) as f:
            self.assertEqual(shown_validates().split("\n", 1)[1], f.read())
        # A file the server cannot take names where, read from standard input.
        p = self.server.tau("platform", "validate", "-", input="schema_version: 1\nqueuez: []\n")
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, r"-:2:1: error: unknown field 'queuez'")

    def test_server_platform_flag(self):
        # `tau server --platform FILE` (the Helm chart's ConfigMap) applies the file at start.
        self.server.stop()
        self.server = TauServer(gpus=self.gpus, extra_args=["--platform", self.platform_file])
        self.server.start()
        shown = json.loads(self.server.tau("platform", "show", "-o", "json", check=0).stdout)
        self.assertEqual(shown["source"], self.platform_file)
        self.assertEqual([q["name"] for q in shown["platform"]["queues"]], ["vision", "speech"])
        # A bad file stops the server at start with its file:line:col.
        self.server.stop()
        bad = self.platform_file + ".bad.yaml"
        with open(bad, "w") as f:
            f.write(PLATFORM.replace("nominal: 64", "nominal: lots", 1))
        self.server = TauServer(gpus=self.gpus)
        p = subprocess.run([TAU, "server", "--home", self.server.home, "--platform", bad],
                           env=self.server.env, capture_output=True, text=True, timeout=30)
        os.unlink(bad)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertRegex(p.stderr, r"\.bad\.yaml:\d+:\d+: error: .*lots")

    def test_two_workspaces_share_the_machine_and_quotas_hold(self):
        self.apply()
        v1 = self.waiter("v1", "vision", "v1")
        v2 = self.waiter("v2", "vision", "v2")
        v3 = self.waiter("v3", "vision", "v3")
        s1 = self.waiter("s1", "speech", "s1")
        for name in (v1, v2, s1):
            self.server.wait_state(name, "Running")
        # vision has used its 2 GPUs: v3 waits although the machine has a free GPU, because
        # vision lends nothing and speech lends nothing (lending_limit: 0).
        p = wait_for(lambda: (self.pending(v3) or {}).get("code") == "WaitingForQuota"
                     and self.pending(v3), what="v3's pending reason")
        self.assertEqual(p["position"], 1)
        self.assertIn("needs 1 nvidia.com/gpu; queue vision has 0 of 2 free on flavor gpu",
                      p["reason"])
        self.assertIn("first in line", p["reason"])
        status = self.server.tau("status", v3, check=0).stdout
        self.assertIn("queue vision has 0 of 2 free", status)
        q = self.queue("vision")
        self.assertEqual((q["admitted"], q["pending"]), (2, 1))
        gpu = next(u for u in q["usage"] if u["resource"] == "nvidia.com/gpu")
        self.assertEqual((gpu["usage"], gpu["nominal"]), ("2", "2"))
        self.assertEqual(q["pending_runs"][0]["name"], v3)
        self.assertEqual(self.queue("speech")["admitted"], 1)
        self.assertIn(v3, self.server.tau("queue", "show", "vision", check=0).stdout)
        # A run in speech still starts: its own quota is free.
        s2 = self.waiter("s2", "speech", "s2")
        self.server.wait_state(s2, "Running")
        # When v1 ends, v3 gets its quota.
        self.release("v1")
        self.server.wait_state(v1, "Succeeded")
        self.server.wait_state(v3, "Running")
        for tag in ("v2", "v3", "s1", "s2"):
            self.release(tag)
        for name in (v2, v3, s1, s2):
            self.server.wait_state(name, "Succeeded")
        d = self.server.run_json(v3)
        types = [e["type"] for e in d["events"]]
        self.assertIn("Admitted", types)
        admitted = next(e for e in d["events"] if e["type"] == "Admitted")
        self.assertIn("admitted by queue vision", admitted["message"])

    def test_queue_show_pages_a_deep_line_and_the_counts_stay_whole(self):
        self.apply()
        holders = [self.waiter(f"h{i}", "vision", f"h{i}") for i in range(2)]
        for name in holders:
            self.server.wait_state(name, "Running")
        waiting = [self.waiter(f"w{i}", "vision", f"w{i}") for i in range(7)]
        wait_for(lambda: self.queue("vision")["pending"] == 7 and all(
            p.get("position") for p in self.queue("vision")["pending_runs"]), what="7 positions")
        # The whole line, by position, as the default page of the API (no limit) gives it.
        line = [p["name"] for p in self.queue("vision")["pending_runs"]]
        self.assertEqual(line, waiting)
        # Positions 3 to 5: the counts are the queue's, the runs the page's.
        page = json.loads(self.server.tau("queue", "show", "vision", "--offset", "2", "--limit",
                                          "3", "-o", "json", check=0).stdout)
        self.assertEqual((page["pending"], page["admitted"]), (7, 2))
        self.assertEqual([p["name"] for p in page["pending_runs"]], waiting[2:5])
        self.assertEqual([p["position"] for p in page["pending_runs"]], [3, 4, 5])
        table = self.server.tau("queue", "show", "vision", "--limit", "2", check=0).stdout
        self.assertIn("positions 1 to 2 of 7 shown: --offset 2 for the next page", table)
        self.assertIn(waiting[1], table)
        self.assertNotIn(waiting[2], table)
        every = self.server.tau("queue", "show", "vision", "--all", check=0).stdout
        self.assertTrue(all(name in every for name in waiting))
        self.assertNotIn("shown:", every)
        # The queues' summary carries the counts only; the list pages each queue the same way.
        summary = json.loads(self.server.tau_http("/api/v1/queues?summary=1"))
        vision = next(q for q in summary["queues"] if q["name"] == "vision")
        self.assertEqual((vision["pending"], "pending_runs" in vision), (7, False))
        head = json.loads(self.server.tau_http("/api/v1/queues?limit=1"))
        vision = next(q for q in head["queues"] if q["name"] == "vision")
        self.assertEqual([p["name"] for p in vision["pending_runs"]], waiting[:1])
        body = self.server.tau_http("/api/v1/queues/vision?limit=many", status=400)
        self.assertIn("query parameter 'limit' must be an integer", body)
        for tag in [f"h{i}" for i in range(2)] + [f"w{i}" for i in range(7)]:
            self.release(tag)
        for name in holders + waiting:
            self.server.wait_state(name, "Succeeded", timeout=60)

    def test_a_borrowing_queue_says_the_cohort_is_the_limit(self):
        # speech lends one of its 2 GPUs: vision can run 3, and then a 4th waits for the cohort.
        head, speech = PLATFORM.split("  - name: speech\n", 1)
        platform = head + "  - name: speech\n" + speech.replace("lending_limit: 0", "lending_limit: 1", 1)
        with open(self.platform_file, "w") as f:
            f.write(platform)
        self.apply()
        big = self.waiter("big", "vision", "big", gpus=3)
        self.server.wait_state(big, "Running")
        gpu = next(u for u in self.queue("vision")["usage"] if u["resource"] == "nvidia.com/gpu")
        self.assertEqual((gpu["usage"], gpu["nominal"], gpu["borrowed"]), ("3", "2", "1"))
        small = self.waiter("small", "vision", "small")
        p = wait_for(lambda: (self.pending(small) or {}).get("code") == "WaitingForQuota"
                     and self.pending(small), what="the small run's pending reason")
        # Not "0 of 2 free" (it uses 3 of 2): the limit is what speech lends.
        self.assertIn("needs 1 nvidia.com/gpu; queue vision has 0 available on flavor gpu "
                      "(uses 3 of its nominal 2;", p["reason"])
        self.assertIn("lending limits", p["reason"])
        self.release("big")
        self.release("small")
        for name in (big, small):
            self.server.wait_state(name, "Succeeded", timeout=30)

    def test_quota_taken_back_before_admission_is_no_preemption(self):
        # vision's quota (6 GPUs) is larger than the machine (4): a run can hold quota and still
        # wait for the machine. A high-priority run then takes that quota back: the waiting run
        # never started, so it was not preempted, and no preemption is counted.
        head, rest = PLATFORM.split("  - name: speech\n", 1)
        head = head.replace("nvidia.com/gpu, nominal: 2, lending_limit: 0", "nvidia.com/gpu, nominal: 6")
        with open(self.platform_file, "w") as f:
            f.write(head + "  - name: speech\n" + rest)
        self.apply()
        big = self.waiter("big", "vision", "big", gpus=4)
        self.server.wait_state(big, "Running")
        held = self.waiter("held", "vision", "held", gpus=2)
        wait_for(lambda: "QuotaReserved" in [e["type"] for e in self.server.run_json(held)["events"]],
                 what="the held run's quota reservation")
        high = self.waiter("urgent", "vision", "urgent", gpus=2, priority="high")
        d = wait_for(lambda: (lambda d: d if "QuotaWithdrawn" in [e["type"] for e in d["events"]]
                              else None)(self.server.run_json(held)),
                     what="the held run's reservation to be taken back")
        self.assertEqual(d["run"]["state"], "Queued")
        types = [e["type"] for e in d["events"]]
        self.assertNotIn("Preempted", types)
        self.assertNotIn("Requeued", types)
        self.assertEqual(d["attempts"], [])
        withdrawn = next(e for e in d["events"] if e["type"] == "QuotaWithdrawn")
        self.assertIn(high, withdrawn["message"])
        metrics = self.server.tau_http("/metrics")
        self.assertNotRegex(metrics, r"tau_preemptions_total\{[^}]*\} [1-9]")
        for tag in ("big", "held", "urgent"):
            self.release(tag)
        for name in (big, held, high):
            self.server.wait_state(name, "Succeeded", timeout=30)

    def test_high_priority_preempts_low_and_low_resumes_later(self):
        self.apply()
        low = self.waiter("low", "vision", "low", gpus=2, checkpoint=True)
        self.server.wait_state(low, "Running")
        wait_for(lambda: "checkpointed" in self.server.tau("logs", low).stdout,
                 what="the low run's checkpoint")
        high = self.waiter("high", "vision", "high", gpus=2, priority="high")
        self.server.wait_state(high, "Running", timeout=30)
        d = self.server.run_json(low)
        self.assertEqual(d["run"]["state"], "Queued")
        self.assertEqual(d["run"]["reason"], "Preempted")
        # Queued again, it has not exited: the attempt's exit (143) is the attempt's, not the run's.
        self.assertIsNone(d["run"]["exit_code"])
        self.assertIsNone(d["run"]["finished"])
        self.assertEqual(d["attempts"][0]["reason"], "Preempted")
        self.assertIn(high, d["attempts"][0]["message"])
        types = [e["type"] for e in d["events"]]
        self.assertIn("Preempted", types)
        self.assertIn("Requeued", types)
        preempted = next(e for e in d["events"] if e["type"] == "Preempted")
        self.assertEqual(preempted["data"]["reason"], "InClusterQueue")
        # Never two runs on the same GPUs: the preemptor started after the victim's attempt ended.
        h = self.server.run_json(high)
        self.assertLessEqual(d["attempts"][0]["ended"], h["attempts"][0]["started"])
        # Requeued in one pass, back in the engine in the next: the reason follows.
        wait_for(lambda: "queue vision has 0 of 2 free" in (self.pending(low) or {}).get(
            "reason", ""), what="the low run's reason")
        # When the high run is done, the low one runs again and resumes from its checkpoint, though
        # resilience.max_retries is 0: preemption is not the run's failure.
        self.release("high")
        self.server.wait_state(high, "Succeeded")
        d = self.server.wait_state(low, "Running", timeout=30)
        # Running again: the reason it waited is history (its events and first attempt keep it).
        self.assertEqual((d["run"]["reason"], d["run"]["message"]), ("", ""))
        self.assertNotIn("Preempted", self.server.tau("status", low).stdout)
        self.release("low")
        d = self.server.wait_state(low, "Succeeded")
        self.assertEqual([a["reason"] for a in d["attempts"]], ["Preempted", "Succeeded"])
        logs = self.server.tau("logs", low, "--attempt", "2").stdout
        self.assertIn("attempt 2 reason Preempted resume", logs)
        self.assertIn("step-1", logs)

    def test_a_victim_still_stopping_when_the_server_restarts_is_requeued_not_failed(self):
        # A victim that ignores SIGTERM takes the whole grace period to stop; the server dies and
        # comes back meanwhile. The preemption was recorded, so the run still goes back to its queue.
        self.server.kill()
        self.server.stop_grace_ms = 4000
        self.server.start()
        self.apply()
        low = self.waiter("low", "vision", "low", gpus=2, checkpoint=True, ignore_term=True)
        self.server.wait_state(low, "Running")
        wait_for(lambda: "checkpointed" in self.server.tau("logs", low).stdout,
                 what="the low run's checkpoint")
        high = self.waiter("high", "vision", "high", gpus=2, priority="high")
        wait_for(lambda: any(e["type"] == "Preempted" for e in self.server.run_json(low)["events"]),
                 what="the preemption")
        self.server.kill()
        self.server.start()
        self.server.wait_state(high, "Running", timeout=30)
        d = self.server.run_json(low)
        self.assertEqual(d["run"]["state"], "Queued")
        self.assertEqual(d["run"]["reason"], "Preempted")
        # Queued again, it has not exited: the attempt's exit (143) is the attempt's, not the run's.
        self.assertIsNone(d["run"]["exit_code"])
        self.assertIsNone(d["run"]["finished"])
        self.assertEqual(d["attempts"][0]["reason"], "Preempted")
        self.assertIn(high, d["attempts"][0]["message"])
        self.release("high")
        d = self.server.wait_state(low, "Running", timeout=30)
        # Running again: the reason it waited is history (its events and first attempt keep it).
        self.assertEqual((d["run"]["reason"], d["run"]["message"]), ("", ""))
        self.assertNotIn("Preempted", self.server.tau("status", low).stdout)
        self.release("low")
        d = self.server.wait_state(low, "Succeeded")
        self.assertEqual([a["reason"] for a in d["attempts"]], ["Preempted", "Succeeded"])

    def test_quota_reservations_survive_a_server_restart(self):
        self.apply()
        a = self.waiter("a", "vision", "a", gpus=2)
        self.server.wait_state(a, "Running")
        b = self.waiter("b", "vision", "b", gpus=1)
        wait_for(lambda: (self.pending(b) or {}).get("code") == "WaitingForQuota",
                 what="b to wait for quota")
        self.server.kill()
        self.server.start()
        # a still holds vision's quota after the restart, so b still waits.
        wait_for(lambda: (self.pending(b) or {}).get("code") == "WaitingForQuota",
                 what="b to wait for quota again")
        self.assertEqual(self.queue("vision")["admitted"], 1)
        self.release("a")
        self.server.wait_state(b, "Running")
        self.release("b")
        self.server.wait_state(b, "Succeeded")


if __name__ == "__main__":
    unittest.main()
