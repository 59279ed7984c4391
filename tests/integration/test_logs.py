"""The logs a run leaves on disk: written by the shim's log pump, with secrets masked as they are
written (not once the attempt ends), kept under the workspace's limits.max_log_bytes with the
newest output, and a LogTruncated event when the cap first cuts a log."""
import getpass
import json
import os
import subprocess
import time
import unittest

from harness import TAU, ServerTestCase, wait_for

SECRET = "s3cr3t-value-4711"
CAP = 1 << 20  # limits.max_log_bytes: 1Mi

PLATFORM = f"""schema_version: 1
flavors:
  - name: cpu-only
queues:
  - name: main
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: cpu-only
            resources:
              - {{name: cpu, nominal: 64}}
              - {{name: memory, nominal: 512Gi}}
priorities:
  - {{name: normal, value: 10}}
workspaces:
  - name: team
    members: ["{getpass.getuser()}"]
    default_queue: main
    default_priority: normal
    limits: {{max_log_bytes: 1Mi}}
defaults:
  workspace: team
"""

# Prints the secret, waits until the test has looked at the log on disk, then about 50 MB in a
# hurry, and a last line.
PROGRAM = """import os, sys, time
print('the key is ' + os.environ['K'], flush=True)
deadline = time.time() + 30
while not os.path.exists('go') and time.time() < deadline:
    time.sleep(0.05)
line = ('x' * 99) + '\\n'
block = line * 10000
for i in range(50):
    sys.stdout.write(block)
sys.stdout.write('the very last line\\n')
"""


class CappedAndMaskedLogTest(ServerTestCase):
    def test_a_50mb_log_is_capped_with_its_tail_and_its_secret_is_masked_on_disk_while_running(self):
        platform = os.path.join(self.work, "platform.yaml")
        with open(platform, "w") as f:
            f.write(PLATFORM)
        self.server.tau("platform", "apply", platform, check=0)
        p = subprocess.run([TAU, "secret", "set", "team", "api-key"], input=SECRET,
                           env=self.server.env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        spec = ("schema_version: 1\nname: chatty\nrun:\n  entrypoint: main.py\n"
                "  workload_kind: job\ncompute:\n  gpus: 0\n  workers: 1\n"
                "runtime:\n  env:\n    K: SECRET:api-key\n")
        name = self.submit(spec, {"main.py": PROGRAM})
        attempt = os.path.join(self.server.home, "runs", name, "attempts", "1")
        log_path = os.path.join(attempt, "logs", "rank-0.log")

        def read_log():
            try:
                with open(log_path) as f:
                    return f.read()
            except FileNotFoundError:
                return ""

        # While the run still runs, the file on disk already has the secret masked.
        wait_for(lambda: "the key is" in read_log(), timeout=30, what="the key's line on disk")
        time.sleep(0.2)
        on_disk = read_log()
        self.assertIn("the key is ***\n", on_disk)
        self.assertNotIn(SECRET, on_disk)
        self.assertEqual(self.server.run_json(name)["run"]["state"], "Running")
        with open(os.path.join(self.server.home, "runs", name, "work", "go"), "w"):
            pass

        d = self.server.wait_state(name, ["Succeeded", "Failed"], timeout=120)
        self.assertEqual(d["run"]["state"], "Succeeded", d)
        size = os.path.getsize(log_path)
        self.assertLessEqual(size, CAP + 512)
        text = read_log()
        self.assertTrue(text.startswith("[tau] "), text[:200])
        first = text.split("\n", 1)[0]
        self.assertIn("bytes of earlier output dropped: the log reached its cap of 1048576 bytes",
                      first)
        self.assertIn("raise limits.max_log_bytes", first)
        self.assertTrue(text.endswith("x" * 99 + "\nthe very last line\n"), text[-300:])
        self.assertNotIn(SECRET, text)

        truncated = [e for e in d["events"] if e["type"] == "LogTruncated"]
        self.assertEqual(len(truncated), 1, [e["type"] for e in d["events"]])
        self.assertEqual(truncated[0]["data"]["rank"], 0)
        self.assertEqual(truncated[0]["data"]["limit"], CAP)
        self.assertEqual(truncated[0]["data"]["attempt"], 1)
        # tau describe shows it; tau logs serves the capped file.
        described = self.server.tau("describe", name, check=0).stdout
        self.assertIn("LogTruncated", described)
        logs = self.server.tau("logs", name, check=0).stdout
        self.assertTrue(logs.endswith("the very last line\n"), logs[-200:])
        self.assertLessEqual(len(logs), CAP + 512)


if __name__ == "__main__":
    unittest.main()


class LogOptionsTest(ServerTestCase):
    def test_tail_all_ranks_and_the_attempt_shown(self):
        program = ("import os, sys\n"
                   "rank = os.environ.get('RANK', '0')\n"
                   "for i in range(5):\n    print(f'r{rank} line {i}', flush=True)\n"
                   "sys.exit(0 if os.environ.get('TAU_ATTEMPT', '1') != '1' else 3)\n")
        spec = ("schema_version: 1\nname: ranks\nrun:\n  entrypoint: main.py\n"
                "  workload_kind: job\ncompute:\n  gpus: 0\n  workers: 2\n"
                "resilience:\n  max_retries: 1\n  backoff_initial: 1s\n  retry_on: [UserError]\n")
        name = self.submit(spec, {"main.py": program})
        d = self.server.wait_state(name, ["Succeeded", "Failed"], timeout=90)
        self.assertEqual(d["run"]["state"], "Succeeded", d)
        self.assertEqual(d["run"]["attempts"], 2)
        p = self.server.tau("logs", name, "--all-ranks", "--tail", "2", check=0)
        self.assertEqual(p.stdout, "[rank 0] r0 line 3\n[rank 0] r0 line 4\n"
                                   "[rank 1] r1 line 3\n[rank 1] r1 line 4\n")
        self.assertIn("attempt 2 of 2", p.stderr)
        p = self.server.tau("logs", name, "--tail", "1", "--rank", "1", check=0)
        self.assertEqual(p.stdout, "r1 line 4\n")
        p = self.server.tau("logs", name, "--tail", "1", "-f")
        self.assertEqual(p.returncode, 125)
        self.assertIn("without -f", p.stderr)
