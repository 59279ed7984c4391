"""GPU health on the local backend, against the test NVML playing a scenario (see docs/fake-nvml.md)."""
import json
import os
import tempfile
import time
import unittest

from harness import ServerTestCase, wait_for
from test_local import job_spec

SCENARIO = """gpus 2
at 3s gpu 0 xid 79
"""


class ScenarioTestCase(ServerTestCase):
    gpus = 2
    scenario_text = ""

    def setUp(self):
        fd, self.scenario = tempfile.mkstemp(prefix="tau-it-scn-", suffix=".scn")
        os.write(fd, self.scenario_text.encode())
        os.close(fd)
        self.extra_env = {"TAU_FAKE_NVML_SCENARIO": self.scenario}
        super().setUp()

    def tearDown(self):
        super().tearDown()
        os.unlink(self.scenario)


class GpuHealthTest(ScenarioTestCase):
    scenario_text = SCENARIO

    def test_xid_79_stops_the_attempt_and_the_retry_runs_on_another_gpu(self):
        code = ("import os, time\nprint('attempt', os.environ['TAU_ATTEMPT'], 'gpu',"
                " os.environ['CUDA_VISIBLE_DEVICES'], os.environ.get('TAU_FAILURE_REASON'), flush=True)\n"
                "if os.environ['TAU_ATTEMPT'] == '1':\n    time.sleep(60)\n")
        extra = "resilience:\n  max_retries: 1\n  backoff_initial: 100ms\n"
        name = self.submit(job_spec("xid", gpus=1, extra=extra), {"main.py": code})
        self.server.wait_state(name, "Running")
        d = self.server.wait_state(name, "Succeeded", timeout=30)
        self.assertEqual([a["reason"] for a in d["attempts"]], ["GPUError", "Succeeded"])
        self.assertEqual([a["gpus"] for a in d["attempts"]], [[0], [1]])
        self.assertIn("GPU 0 turned unhealthy", d["attempts"][0]["message"])
        self.assertIn("GPUError", [e["type"] for e in d["events"]])
        logs = self.server.tau("logs", name, "--attempt", "2").stdout
        self.assertIn("attempt 2 gpu 1 GPUError", logs)
        # XID event to the attempt's end: well under a second.
        gpu_error = next(e for e in d["events"] if e["type"] == "GPUError")
        self.assertLess(d["attempts"][0]["ended"], d["attempts"][1]["started"])
        self.assertTrue(gpu_error["time"] <= d["attempts"][0]["ended"])
        to_ms = lambda t: time.mktime(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) * 1000 + int(t[20:23])
        stop_ms = to_ms(d["attempts"][0]["ended"]) - to_ms(gpu_error["time"])
        print(f"\nGPU health: unhealthy verdict to attempt stopped in {stop_ms:.0f} ms")
        self.assertLess(stop_ms, 1000)
        # The GPU stays out: `tau gpus` says why, and a 2-GPU run waits with the reason.
        inv = json.loads(self.server.tau("gpus", "-o", "json", check=0).stdout)
        self.assertEqual(inv["devices"][0]["health"]["verdict"], "Unhealthy")
        self.assertEqual(inv["devices"][1]["health"]["verdict"], "Healthy")
        self.assertIn("Unhealthy", self.server.tau("gpus", check=0).stdout)
        # `tau health check` runs the checks now and fails when a GPU may not be used.
        check = self.server.tau("health", "check")
        self.assertEqual(check.returncode, 1, check.stderr)
        self.assertRegex(check.stdout, r"0\s+Unhealthy")
        active = json.loads(self.server.tau("health", "check", "--active", "-o", "json").stdout)
        self.assertIn("active", active)
        if not active["active"]["ran"]:
            self.assertIn("libcuda.so.1", active["active"]["note"])
        # GPU samples and verdicts as dcgm-exporter metrics.
        metrics = self.server.tau_http("/metrics")
        self.assertIn('DCGM_FI_DEV_XID_ERRORS{gpu="0"', metrics)
        self.assertRegex(metrics, r'tau_gpu_health\{gpu="0"[^}]*\} 2')
        wide = self.submit(job_spec("wide", gpus=1, workers=2), {"main.py": "print('never')\n"})
        wait_for(lambda: "kept out by health checks" in json.dumps(
            json.loads(self.server.tau("status", wide, "-o", "json").stdout).get("pending")),
            what="the pending reason")


class RepairPendingTest(ScenarioTestCase):
    # A row remap pending: the GPU needs a reset once idle. New work stays off it; the job running
    # there is not killed for it.
    scenario_text = "gpus 2\nat 4s gpu 0 remap_pending 1\n"

    def test_running_job_finishes_and_new_work_goes_elsewhere(self):
        flag = os.path.join(self.work, "go")
        code = ("import os, time\nprint('gpu', os.environ['CUDA_VISIBLE_DEVICES'],"
                " os.environ['CUDA_DEVICE_ORDER'], flush=True)\n"
                f"while not os.path.exists({flag!r}):\n    time.sleep(0.05)\n")
        name = self.submit(job_spec("remap", gpus=1), {"main.py": code})
        d = self.server.wait_state(name, "Running")
        self.assertEqual(d["attempts"][0]["gpus"], [0], "started after the fault: rerun the test")
        wait_for(lambda: json.loads(self.server.tau("gpus", "-o", "json", check=0).stdout)
                 ["devices"][0]["health"]["verdict"] == "Unhealthy", what="GPU 0 unhealthy")
        inv = json.loads(self.server.tau("gpus", "-o", "json", check=0).stdout)
        reasons = inv["devices"][0]["health"]["reasons"]
        self.assertEqual([r["action"] for r in reasons], ["reset_when_idle"])
        # A new run is placed on GPU 1, not on the GPU waiting for its reset.
        other = self.submit(job_spec("other", gpus=1), {"main.py": "print('ok')\n"})
        o = self.server.wait_state(other, "Succeeded")
        self.assertEqual(o["attempts"][0]["gpus"], [1])
        # The first run is still running on GPU 0, and ends as it would have.
        self.assertEqual(self.server.run_json(name)["run"]["state"], "Running")
        open(flag, "w").close()
        d = self.server.wait_state(name, "Succeeded")
        self.assertEqual([a["reason"] for a in d["attempts"]], ["Succeeded"])
        self.assertNotIn("GPUError", [e["type"] for e in d["events"]])
        self.assertIn("gpu 0 PCI_BUS_ID", self.server.tau("logs", name).stdout)


class DriverNotLoadedTest(ScenarioTestCase):
    # The library is there and nvmlInit answers DRIVER_NOT_LOADED: a node that needs attention.
    scenario_text = "init_error 9\n"

    def test_health_check_fails(self):
        check = self.server.tau("health", "check")
        self.assertEqual(check.returncode, 1, check.stdout + check.stderr)
        self.assertIn("unhealthy: the NVIDIA driver cannot be used: NVML failed to initialise",
                      check.stdout)
        body = json.loads(self.server.tau("health", "check", "-o", "json").stdout)
        self.assertIn("NVML failed to initialise", body["inventory"]["error"])


if __name__ == "__main__":
    unittest.main()
