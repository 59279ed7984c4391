"""Observability: a real Prometheus (Debian's `prometheus`) scrapes a running tau server while runs go
through it, and PromQL answers match what happened; `promtool check metrics` accepts the output."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from harness import ServerTestCase, TauServer, free_port, wait_for
from test_local import job_spec

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def http_get(url, timeout=5, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


@unittest.skipUnless(PROMETHEUS and PROMTOOL, "needs Debian's prometheus package")
class PrometheusTest(ServerTestCase):
    def setUp(self):
        self.port = free_port()
        # Two test GPUs (the stand-in NVML), so the GPU families are exported too.
        self.server = TauServer(gpus=2, extra_args=["--listen", f"127.0.0.1:{self.port}", "--insecure-listen"]).start()
        self.work = tempfile.mkdtemp(prefix="tau-it-code-")
        self.prom_dir = tempfile.mkdtemp(prefix="tau-it-prom-")
        self.prom_port = free_port()
        # /metrics needs a platform viewer's or an admin's token: the server's own user's here.
        self.token = self.server.tau("admin", "token", "create", "--description", "prometheus",
                                     check=0).stdout.strip()
        token_file = os.path.join(self.prom_dir, "token")
        with open(token_file, "w") as f:
            f.write(self.token)
        with open(os.path.join(self.prom_dir, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: tau\n"
                    f"    authorization:\n      credentials_file: {token_file}\n"
                    "    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{self.port}']\n")
        with open(os.path.join(self.prom_dir, "log"), "w") as log:
            self.prom = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.prom_dir}/prometheus.yml",
                 f"--storage.tsdb.path={self.prom_dir}/data",
                 f"--web.listen-address=127.0.0.1:{self.prom_port}"],
                stdout=subprocess.DEVNULL, stderr=log)

    def tearDown(self):
        self.prom.terminate()
        try:
            self.prom.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.prom.kill()
        shutil.rmtree(self.prom_dir, ignore_errors=True)
        super().tearDown()

    def query(self, promql):
        url = (f"http://127.0.0.1:{self.prom_port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        body = json.loads(http_get(url))
        self.assertEqual(body["status"], "success", body)
        return body["data"]["result"]

    def value(self, promql):
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def test_promql_answers_match_what_happened(self):
        with self.assertRaises(urllib.error.HTTPError) as denied:
            http_get(f"http://127.0.0.1:{self.port}/metrics")  # no token: 401
        self.assertEqual(denied.exception.code, 401)
        metrics = http_get(f"http://127.0.0.1:{self.port}/metrics", token=self.token)
        check = subprocess.run([PROMTOOL, "check", "metrics"], input=metrics, capture_output=True,
                               text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

        ok = [self.submit(job_spec(f"ok{i}"), {"main.py": "print('fine')\n"}) for i in range(3)]
        bad = self.submit(job_spec("bad"), {"main.py": "raise SystemExit(3)\n"})
        for name in ok:
            self.server.wait_state(name, "Succeeded")
        self.server.wait_state(bad, "Failed")

        wait_for(lambda: self.value('up{job="tau"}') == 1, timeout=60, what="the first scrape")
        # Prometheus's answers once it has scraped the end state.
        wait_for(lambda: self.value('sum(tau_runs{state="Succeeded"})') == 3, timeout=30,
                 what="tau_runs{state=Succeeded} == 3 in Prometheus")
        self.assertEqual(self.value('sum(tau_runs{state="Failed",workspace="default"})'), 1)
        self.assertEqual(self.value('sum(tau_attempts_total{failure_class="Succeeded"})'), 3)
        self.assertEqual(self.value('sum(tau_attempts_total{failure_class="UserError"})'), 1)
        self.assertEqual(self.value('sum(tau_runs_submitted_total{queue="default"})'), 4)
        self.assertEqual(
            self.value('tau_admission_wait_seconds_count{cluster_queue="default"}'), 4)
        self.assertEqual(self.value('sum(tau_run_duration_seconds_count)'), 4)
        self.assertEqual(
            self.value('tau_cluster_queue_nominal_quota{cluster_queue="default",resource="cpu"}'),
            os.cpu_count())
        self.assertEqual(self.value('tau_cluster_queue_pending_workloads{cluster_queue="default"}'), 0)
        # Request latency by route pattern, not by path: a histogram with a finite median.
        median = self.value('histogram_quantile(0.5, sum by (le) '
                            '(tau_http_request_duration_seconds_bucket{route="/api/v1/runs"}))')
        self.assertIsNotNone(median)
        self.assertLess(median, 1.0)
        self.assertGreater(self.value('sum(tau_store_commit_duration_seconds_count)'), 0)
        # Every metric the Grafana dashboard (deploy/grafana/) queries is one tau exports.
        repo = os.path.join(os.path.dirname(__file__), "..", "..")
        dashboard = json.load(open(os.path.join(repo, "deploy/grafana/tau-dashboard.json")))
        exported = {line.split()[2] for line in http_get(
            f"http://127.0.0.1:{self.port}/metrics", token=self.token).splitlines() if line.startswith("# TYPE")}
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                names = set(re.findall(r"\b((?:tau|DCGM)_[A-Za-z0-9_]+?)(?:_bucket|_count|_sum)?\b",
                                       target["expr"]))
                self.assertTrue(names, target["expr"])
                for name in names:
                    self.assertIn(name, exported, f"panel {panel['title']!r}")
        # No series is labelled with a run name (cardinality stays bounded).
        for series in self.query('{job="tau"}'):
            for value in series["metric"].values():
                self.assertFalse(any(value.startswith(n) for n in ok + [bad]), series["metric"])


if __name__ == "__main__":
    unittest.main()
