"""Chaos: many short runs, some failing and retrying, while the server is killed with SIGKILL and restarted
again and again at random moments. Afterwards every run must be finished, none lost, no two attempts of a run
may have overlapped, and each run's attempt count must match its retry policy.

TAU_CHAOS_RUNS and TAU_CHAOS_KILLS scale it (defaults 200 and 10)."""
import json
import os
import random
import signal
import time
import unittest

from harness import ServerTestCase, wait_for

RUNS = int(os.environ.get("TAU_CHAOS_RUNS", "200"))
KILLS = int(os.environ.get("TAU_CHAOS_KILLS", "10"))

# Each worker appends "start <attempt> <t>" and "end <attempt> <t>" to a per-run ledger in its output
# directory, so overlapping attempts would be visible whatever the server recorded.
CODE = """import os, sys, time
out = os.environ['TAU_OUTPUT_DIR']
attempt = int(os.environ['TAU_ATTEMPT'])
kind = os.environ['CHAOS_KIND']
def note(what):
    with open(os.path.join(out, 'ledger'), 'a') as f:
        f.write('%s %d %.6f\\n' % (what, attempt, time.time()))
        f.flush()
        os.fsync(f.fileno())
note('start')
time.sleep(float(os.environ['CHAOS_SLEEP']))
code = 0
if kind == 'flaky' and attempt == 1:
    code = 1
if kind == 'broken':
    code = 2
note('end')
sys.exit(code)
"""


def spec(name, kind, sleep):
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.py\n  workload_kind: job\n"
            f"runtime:\n  env:\n    CHAOS_KIND: {kind}\n    CHAOS_SLEEP: '{sleep}'\n"
            "resilience:\n  max_retries: 1\n  retry_on: [UserError]\n  backoff_initial: 50ms\n")


class ChaosTest(ServerTestCase):
    def test_server_killed_repeatedly_loses_and_duplicates_nothing(self):
        rng = random.Random(1234)
        kinds = {"ok": 1, "flaky": 2, "broken": 2}  # expected attempts (max_retries 1, retry UserError)
        want = {}
        submitted_at = time.monotonic()
        kills = 0
        for i in range(RUNS):
            kind = rng.choice(list(kinds))
            name = self.submit(spec(f"chaos-{kind}", kind, rng.choice(["0", "0.05", "0.2", "0.5"])),
                               {"main.py": CODE})
            want[name] = kind
            if kills < KILLS and i % max(1, RUNS // KILLS) == RUNS // KILLS // 2:
                time.sleep(rng.uniform(0, 0.3))
                self.server.kill(signal.SIGKILL)
                kills += 1
                self.server.start()
        while kills < KILLS:
            time.sleep(rng.uniform(0.05, 0.3))
            self.server.kill(signal.SIGKILL)
            kills += 1
            self.server.start()

        def all_done():
            runs = json.loads(self.server.tau("list", "--all", "--limit", "1000", "-o", "json").stdout)
            states = {r["name"]: r for r in runs["runs"]}
            return states if all(states.get(n, {}).get("state") in ("Succeeded", "Failed")
                                 for n in want) else None
        states = wait_for(all_done, timeout=300, interval=0.5, what="every chaos run to finish")
        overlaps, wrong_counts, wrong_states, never_ran = [], [], [], []
        for name, kind in want.items():
            r = states[name]
            expected_state = "Succeeded" if kind in ("ok", "flaky") else "Failed"
            if r["state"] != expected_state:
                wrong_states.append((name, kind, r["state"], r["reason"], r["message"]))
            if r["attempts"] != kinds[kind]:
                wrong_counts.append((name, kind, r["attempts"]))
            ledger = os.path.join(self.server.home, "runs", name, "output", "ledger")
            if not os.path.exists(ledger):
                never_ran.append((name, kind, r["state"], r["reason"], r["message"],
                                  self.server.run_json(name)["attempts"]))
                continue
            with open(ledger) as f:
                events = [line.split() for line in f.read().splitlines()]
            running = 0
            for what, _attempt, _t in sorted(events, key=lambda e: float(e[2])):
                running += 1 if what == "start" else -1
                if running > 1:
                    overlaps.append(name)
                    break
        print(f"\nchaos: {len(want)} runs, {kills} server kills, "
              f"{sum(r['attempts'] for n, r in states.items() if n in want)} attempts, "
              f"{time.monotonic() - submitted_at:.1f}s")
        self.assertEqual(len(want), RUNS)
        self.assertEqual(never_ran, [], self.server.server_log()[-3000:])
        self.assertEqual(overlaps, [])
        self.assertEqual(wrong_states, [])
        self.assertEqual(wrong_counts, [])


if __name__ == "__main__":
    unittest.main()
