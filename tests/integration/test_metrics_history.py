"""TauGrid's metric history (spec `metrics.history`, issue #23, docs/evidence.md): a run writes rows of
many keys with `_step` and `_timestamp` to a file in its output directory; each numeric key becomes a
series, read while the run runs and at its end, and a retried attempt that rewrites its steps does
not double them."""
import json
import os
import unittest

from harness import ServerTestCase, wait_for

# Attempt 1 writes steps 0..5 and fails; attempt 2 (the retry) rewrites the file from step 3 on, as a
# job resumed from a checkpoint does, with other values. A bad line and a row without `_step` are
# counted, a string value is ignored.
MAIN = """import json, os, sys, time
attempt = int(os.environ['TAU_ATTEMPT'])
path = os.path.join(os.environ['TAU_OUTPUT_DIR'], 'wandb', 'history.jsonl')
os.makedirs(os.path.dirname(path), exist_ok=True)
first, scale = (0, 1.0) if attempt == 1 else (3, 10.0)
with open(path, 'w') as f:
    for step in range(first, 6 if attempt == 1 else 8):
        f.write(json.dumps({'_step': step, '_timestamp': 1733300000 + step, 'loss': scale / (step + 1),
                            'lr': 0.001, 'phase': 'train'}) + '\\n')
        f.flush()
        time.sleep(0.05)
    if attempt == 2:
        f.write('not json\\n')
        f.write(json.dumps({'loss': 1}) + '\\n')
        # Read while the attempt runs: the server's 2 s poll must see these before the end.
        f.write(json.dumps({'_step': 100, 'loss': 0.5}) + '\\n')
        f.flush()
        marker = os.path.join(os.environ['TAU_OUTPUT_DIR'], 'go')
        for _ in range(300):
            if os.path.exists(marker):
                break
            time.sleep(0.1)
sys.exit(1 if attempt == 1 else 0)
"""

SPEC = """schema_version: 1
name: history
run:
  entrypoint: main.py
  workload_kind: job
compute:
  gpus: 0
  workers: 1
metrics:
  history: ["wandb/*.jsonl"]
resilience:
  max_retries: 1
  retry_on: [UserError]
  backoff_initial: 100ms
"""


class MetricsHistoryTest(ServerTestCase):
    def metrics(self, name, metric):
        p = self.server.tau("metrics", name, metric, "-o", "jsonl")
        if p.returncode != 0:
            self.assertIn("has no points of metric", p.stderr)  # none yet
            return []
        return [json.loads(x) for x in p.stdout.splitlines()]

    def test_history_rows_become_series_deduplicated_across_attempts(self):
        spec = self.project(SPEC, {"main.py": MAIN})
        p = self.server.tau("run", "--detach", spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("warning", p.stderr)  # the field is acted on now
        name = p.stdout.strip()
        # Followed while the attempt runs: step 100 shows up before the run is let go.
        wait_for(lambda: any(x["step"] == 100 for x in self.metrics(name, "loss")), timeout=30,
                 what="the running attempt's history rows")
        self.assertEqual(self.server.run_json(name)["run"]["state"], "Running")
        out = os.path.join(self.server.home, "runs", name, "output", "go")
        with open(out, "w"):
            pass
        self.server.wait_state(name, "Succeeded", timeout=60)
        loss = self.metrics(name, "loss")
        self.assertEqual([x["step"] for x in loss], [0, 1, 2, 3, 4, 5, 6, 7, 100])
        self.assertEqual([x["attempt"] for x in loss], [1, 1, 1, 2, 2, 2, 2, 2, 2])
        self.assertAlmostEqual(loss[2]["value"], 1.0 / 3)
        self.assertAlmostEqual(loss[3]["value"], 10.0 / 4)  # the retry's, not doubled
        self.assertEqual(len(self.metrics(name, "lr")), 8)
        # The API's summary: two series (the string-valued "phase" is none), and the bad lines.
        body = json.loads(self.server.tau_http(f"/api/v1/runs/{name}/metrics"))
        self.assertEqual(sorted(s["name"] for s in body["summaries"]), ["loss", "lr"])
        self.assertEqual(body["stats"]["malformed"], 2)
        rec = json.loads(self.server.tau("evidence", name, "-o", "json", check=0).stdout)
        errors = [m["error"] for m in rec["metrics"]["first_malformed"]]
        self.assertIn('missing "_step"', errors)
        self.assertIn("not valid JSON", errors)
        self.assertTrue(all(m["source"].endswith("wandb/history.jsonl")
                            for m in rec["metrics"]["first_malformed"]))


if __name__ == "__main__":
    unittest.main()
