"""Batch submission (POST /api/v1/runs/batch) and `tau run --array`, with real processes: an array
runs one process per index, each seeing its own TAU_ARRAY_INDEX; a batch with one bad item makes
nothing; a batch whose answer was lost and is sent again gives the same runs."""
import json
import os
import re
import subprocess
import unittest

from harness import TAU, AnswerLosingProxy, ServerTestCase, UnixHTTPConnection, wait_for

# A shell script, not Python: a hundred runs on two cores should not wait on interpreters.
SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: 0\n  workers: 1\n  cpus: 100m\n  memory: 16Mi\n")
SCRIPT = "#!/bin/sh\necho \"index=$TAU_ARRAY_INDEX\"\n"


class ArrayTest(ServerTestCase):
    def call(self, method, path, body=None):
        conn = UnixHTTPConnection(os.path.join(self.server.home, "tau.sock"))
        try:
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json"})
            res = conn.getresponse()
            text = res.read().decode()
        finally:
            conn.close()
        return res.status, json.loads(text)

    def runs(self):
        status, body = self.call("GET", "/api/v1/runs?limit=1000")
        self.assertEqual(status, 200, body)
        return body["runs"]

    def last_line(self, run):
        """The last line its process printed (tau's own notices, such as limits a machine without
        cgroup v2 cannot enforce, come first)."""
        log = self.server.tau("logs", run, check=0).stdout
        return log.strip().splitlines()[-1] if log.strip() else ""

    def array_project(self, name):
        return self.project(SPEC.format(name=name), {"main.sh": SCRIPT})

    def wait_all_ended(self, count, timeout=120):
        def ended():
            runs = self.runs()
            done = [r for r in runs if r["state"] in ("Succeeded", "Failed", "Cancelled")]
            return runs if len(runs) == count and len(done) == count else None
        return wait_for(ended, timeout=timeout, interval=0.5, what=f"{count} runs to end")

    def test_an_array_of_a_hundred_runs_completes_and_each_run_saw_its_index(self):
        p = self.server.tau("run", "--array", "0-99", "--detach", self.array_project("arr"),
                            check=0)
        names = p.stdout.split()
        self.assertEqual(len(names), 100, p.stdout)
        array = names[0][: names[0].rindex("-")]
        self.assertEqual(names, [f"{array}-{i}" for i in range(100)])
        runs = self.wait_all_ended(100)
        self.assertEqual({r["state"] for r in runs}, {"Succeeded"})
        for r in runs:
            self.assertEqual(r["array"]["name"], array)
            self.assertEqual(r["name"], f"{array}-{r['array']['index']}")
            self.assertEqual((r["array"]["first"], r["array"]["last"], r["array"]["step"]),
                             (0, 99, 1))
        for i, name in enumerate(names):
            self.assertEqual(self.last_line(name), f"index={i}", name)
        # describe and list --wide say where each run stands in its array ...
        described = self.server.tau("describe", names[42], check=0).stdout
        self.assertIn(f"Array:       {array}, index 42 of 0-99", described)
        wide = self.server.tau("list", "--all", "-o", "wide", "--limit", "1000", check=0).stdout
        self.assertIn(f"{array}[42]", wide)
        # ... and still do after a restart: the array is part of each run's record.
        self.server.kill()
        self.server.start()
        self.assertEqual(self.server.run_json(names[7])["run"]["array"]["index"], 7)

    def test_a_step_gives_every_steps_index(self):
        p = self.server.tau("run", "--array", "3-9:3", "--detach", self.array_project("step"),
                            check=0)
        names = p.stdout.split()
        self.assertEqual([n.rsplit("-", 1)[1] for n in names], ["3", "6", "9"])
        runs = self.wait_all_ended(3)
        for r in runs:
            self.assertEqual(self.last_line(r["name"]), f"index={r['array']['index']}")
        # Attached, the array says on stderr how many runs are done as the count changes, from
        # none to all, each line once; stdout has nothing.
        p = self.server.tau("run", "--array", "0-2", self.array_project("attached"), check=0)
        self.assertEqual(p.stdout, "")
        progress = [line.split(": ", 2)[2] for line in p.stderr.splitlines()
                    if re.match(r"tau: array \S+: \d+/3 runs done", line)]
        self.assertEqual(progress[0], "0/3 runs done, 0 running", p.stderr)
        self.assertEqual(progress[-1], "3/3 runs done, 0 running", p.stderr)
        self.assertTrue(all(a != b for a, b in zip(progress, progress[1:])), progress)

    def test_a_bad_range_is_refused_naming_the_flag_and_nothing_is_sent(self):
        spec = self.array_project("bad")
        for bad in ("", "5-1", "a-b", "7", "0-10000", "0-9:0", "-1-3", "0-3:x", "1 -3"):
            p = self.server.tau("run", f"--array={bad}", "--detach", spec, check=125)
            self.assertIn("--array", p.stderr, bad)
            self.assertEqual(p.stdout, "", bad)
        # 10,000 runs is the limit; 0-9999 would be accepted (not sent here: it is a bench).
        self.assertEqual(self.runs(), [])

    def test_a_batch_with_one_bad_item_leaves_nothing_behind(self):
        good = {"yaml": SPEC.format(name="good"), "file": "tau.yaml"}
        bad = {"yaml": SPEC.format(name="bad").replace("entrypoint", "entrypointt"),
               "file": "bad.yaml"}
        code = {"files": [{"path": "main.sh", "mode": 0o755,
                           "data": "IyEvYmluL3NoCmVjaG8gaGkK"}]}
        body = {"codes": [code],
                "runs": [{"spec": good, "code": 0}, {"spec": good, "code": 0},
                         {"spec": bad, "code": 0}, {"spec": good, "code": 0}]}
        status, reply = self.call("POST", "/api/v1/runs/batch", json.dumps(body))
        self.assertEqual(status, 400, reply)
        self.assertEqual(reply["error"]["index"], 2)
        self.assertTrue(reply["error"]["message"].startswith("runs[2]: "), reply)
        self.assertTrue(any("entrypointt" in d for d in reply["error"]["diagnostics"]), reply)
        self.assertEqual(self.runs(), [])
        # A member the batch does not know is refused, not ignored.
        body["runs"][2] = {"spec": good, "code": 0, "priority": 5}
        status, reply = self.call("POST", "/api/v1/runs/batch", json.dumps(body))
        self.assertEqual(status, 400, reply)
        self.assertIn("runs[2].priority", reply["error"]["message"])
        self.assertEqual(self.runs(), [])
        # Once every item is good, all of them are made.
        body["runs"][2] = {"spec": good, "code": 0}
        status, reply = self.call("POST", "/api/v1/runs/batch", json.dumps(body))
        self.assertEqual(status, 201, reply)
        self.assertEqual(len(self.runs()), 4)

    def test_a_lost_answer_sent_again_gives_the_same_runs(self):
        # A proxy in front of the server loses the first answer to the batch: the server made the
        # runs, the CLI hears nothing within its timeout and sends the batch again with the
        # same key, which must answer with those runs, not make a second array.
        proxy_path = os.path.join(self.work, "proxy.sock")
        batches = lambda: proxy.answers.get("/api/v1/runs/batch", [])
        with AnswerLosingProxy(proxy_path, os.path.join(self.server.home, "tau.sock"),
                               lambda route: route == "/api/v1/runs/batch"
                               and len(batches()) == 1) as proxy:
            env = dict(self.server.env, TAU_TIMEOUT="4s", TAU_SERVER="unix://" + proxy_path)
            p = subprocess.run([TAU, "run", "--array", "0-4", "--detach",
                                self.array_project("lost")],
                               env=env, capture_output=True, text=True, timeout=60)
        batches = batches()
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("sending it again with the same key", p.stderr)
        self.assertEqual(len(batches), 2)
        self.assertIn(b"Idempotent-Replayed: true", batches[1])
        names = p.stdout.split()
        self.assertEqual(len(names), 5)
        first = json.loads(batches[0].partition(b"\r\n\r\n")[2])
        self.assertEqual([r["name"] for r in first["runs"]], names)
        self.assertEqual(sorted(r["name"] for r in self.runs()), sorted(names),
                         "five runs, though the batch reached the server twice")


if __name__ == "__main__":
    unittest.main()
