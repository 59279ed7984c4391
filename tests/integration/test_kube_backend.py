"""The Kubernetes backend end to end: a real `tau server --backend kubernetes` and the real CLI against
tau-fake-apiserver (src/testing/fake_apiserver.h as a program of its own, tests/fake_apiserver). The
test plays Kueue (it makes the Workload, reserves quota, unsuspends the Job) and the kubelet (it
makes the pods, writes their logs through the fake's test control POST /fake/logs/NS/POD, ends
them) with plain API calls, as those controllers would; src/backend/kube/kube_backend_test.cc does the
same inside one process."""
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import unittest
import urllib.parse
import urllib.error
import urllib.request

from harness import BINARY_DIR, TAU, TauServer, wait_for
from test_tls import make_certs

FAKE_APISERVER = os.path.abspath(os.path.join(BINARY_DIR, "tests", "tau-fake-apiserver"))
TOKEN = "e2e-t0ken"
NS = "default"
CLUSTER_QUEUE = "team-a"
KUEUE_MESSAGE = ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in "
                 "flavor default, 1 more needed")

SPEC = """schema_version: 1
name: {name}
run:
  entrypoint: train.py
  workload_kind: job
compute:
  gpus: 0
  workers: 1
  cpus: 1
  memory: 1Gi
runtime:
  image: python:3.12
"""


class FakeKube:
    """The fake API server process over https (a token goes over TLS only), and Kueue's and the
    kubelet's part."""

    def __init__(self, work):
        make_certs(work)
        self.ca = os.path.join(work, "ca.pem")
        self.context = ssl.create_default_context(cafile=self.ca)
        # stdin is a pipe the fake watches: it goes when this process does, however that happens.
        self.proc = subprocess.Popen(
            [FAKE_APISERVER, "--require-token", TOKEN, "--tls-cert",
             os.path.join(work, "server.pem"), "--tls-key", os.path.join(work, "server.key")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("https://127.0.0.1:"):
            self.stop()
            raise AssertionError(f"tau-fake-apiserver printed {self.url!r}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()

    def kubeconfig(self, path, namespace=None):
        """A kubeconfig that trusts the fake's CA and carries the token (`namespace`: the
        context's)."""
        context_ns = f"    namespace: {namespace}\n" if namespace else ""
        with open(self.ca, "rb") as f:
            ca_data = base64.b64encode(f.read()).decode()
        with open(path, "w") as f:
            f.write("apiVersion: v1\nkind: Config\n"
                    f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
                    f"    certificate-authority-data: {ca_data}\n"
                    f"users:\n- name: tester\n  user:\n    token: {TOKEN}\n"
                    "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n"
                    f"{context_ns}current-context: fake\n")

    def request(self, method, path, body=None, content_type="application/json"):
        """(HTTP status, decoded JSON body or None)."""
        data = None
        if body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {TOKEN}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.context) as res:
                status, text = res.status, res.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    def must(self, method, path, body=None, content_type="application/json"):
        status, obj = self.request(method, path, body, content_type)
        if status // 100 != 2:
            raise AssertionError(f"{method} {path}: {status} {obj}")
        return obj

    def get(self, path):
        """The object, or None when the API server answers 404."""
        status, obj = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise AssertionError(f"GET {path}: {status} {obj}")
        return obj

    def merge_patch(self, path, patch):
        return self.must("PATCH", path, patch, "application/merge-patch+json")

    # ---- paths ----
    @staticmethod
    def job_path(job):
        return f"/apis/batch/v1/namespaces/{NS}/jobs/{job}"

    @staticmethod
    def pod_path(pod):
        return f"/api/v1/namespaces/{NS}/pods/{pod}"

    @staticmethod
    def workload_path(workload=""):
        return f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/workloads" + (
            f"/{workload}" if workload else "")

    def job(self, job):
        return self.get(self.job_path(job))

    # ---- Kueue's part ----
    def make_pending_workload(self, job):
        uid = self.job(job)["metadata"]["uid"]
        self.must("POST", self.workload_path(), {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{job}-1a2b3", "namespace": NS, "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid,
                 "controller": True}]},
            "spec": {"queueName": "default", "priority": 0},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                       "reason": "Pending", "message": KUEUE_MESSAGE}]}})

    def admit(self, job):
        self.merge_patch(self.workload_path(f"job-{job}-1a2b3") + "/status", {"status": {
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                           {"type": "Admitted", "status": "True", "reason": "Admitted"}],
            "admission": {"clusterQueue": CLUSTER_QUEUE, "podSetAssignments": [
                {"name": "main", "flavors": {"cpu": "default", "memory": "default"}}]}}})
        self.merge_patch(self.job_path(job), {"spec": {"suspend": False}})

    # ---- the kubelet's and the Job controller's part ----
    def start_pod(self, run, attempt=1):
        pod = f"{run}-{attempt}-x7k"
        self.must("POST", f"/api/v1/namespaces/{NS}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": NS,
                         "labels": {"tau.dev/run": run, "tau.dev/attempt": str(attempt)}},
            "spec": {"containers": [{"name": "worker", "image": "python:3.12"}]},
            "status": {"phase": "Running"}})
        return pod

    def set_pod_status(self, pod, status):
        self.merge_patch(self.pod_path(pod) + "/status", {"status": status})

    def set_job_condition(self, job, type_, reason):
        self.merge_patch(self.job_path(job) + "/status", {"status": {"conditions": [
            {"type": type_, "status": "True", "reason": reason}]}})

    def append_log(self, pod, text):
        self.must("POST", f"/fake/logs/{NS}/{pod}", text, "text/plain")

    def end_log(self, pod):
        self.must("POST", f"/fake/logs/{NS}/{pod}?end=true", "", "text/plain")

    def cut_log_streams(self):
        """Ends the open log streams while the pods run on (as a kubelet restart would)."""
        self.must("POST", "/fake/cut-logs", "", "text/plain")

    def hold_writes(self, namespace, held=True):
        """The namespace's writes wait, as behind an admission webhook that does not answer."""
        query = urllib.parse.urlencode({"namespace": namespace, "held": str(held).lower()})
        self.must("POST", f"/fake/hold-writes?{query}", "", "text/plain")

    # ---- KubeRay's and Ray's part ----
    def serve_ray_job_logs(self, service, job_id, text):
        """What the Ray head's dashboard answers for the job's logs, through the service proxy."""
        query = urllib.parse.urlencode({"namespace": NS, "service": f"{service}:8265",
                                        "path": f"/api/jobs/{job_id}/logs"})
        self.must("POST", f"/fake/proxy?{query}", json.dumps({"logs": text}))


class KubeBackendTest(unittest.TestCase):
    def setUp(self):
        # Built with the tests (tests/CMakeLists.txt), as the suite is: missing is a failure.
        self.assertTrue(os.path.exists(FAKE_APISERVER),
                        f"{FAKE_APISERVER} is missing: build the tau_fake_apiserver target")
        self.work = tempfile.mkdtemp(prefix="tau-it-kube-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.kube = FakeKube(self.work)
        self.addCleanup(self.kube.stop)
        kubeconfig = os.path.join(self.work, "kubeconfig")
        self.kube.kubeconfig(kubeconfig)
        self.server = TauServer(extra_args=[
            "--backend", "kubernetes", "--kubeconfig", kubeconfig,
            "--default-image", "python:3.12"])
        self.addCleanup(self.server.stop)
        self.server.start()

    def submit(self, name="k8s-train", spec=SPEC):
        d = tempfile.mkdtemp(dir=self.work)
        with open(os.path.join(d, "train.py"), "w") as f:
            f.write("print('hello from the cluster')\n")
        with open(os.path.join(d, "tau.yaml"), "w") as f:
            f.write(spec.format(name=name))
        run = self.server.tau("run", "--detach", os.path.join(d, "tau.yaml"), check=0).stdout.strip()
        self.assertRegex(run, r"^[a-z0-9-]+$")
        return run

    def wait(self, predicate, what, timeout=20):
        """harness.wait_for; `what` (a callable) and the server's log describe a timeout."""
        try:
            return wait_for(predicate, timeout=timeout)
        except AssertionError:
            self.fail(f"timed out after {timeout}s waiting for {what()}\n"
                      f"--- the server's log ---\n{self.server.server_log()}")

    def wait_job(self, run, attempt=1):
        job = f"{run}-{attempt}"
        return self.wait(lambda: self.kube.job(job), lambda: f"the Job {job}")

    def status(self, run):
        """`tau status RUN`: (the STATE cell of its row, the whole output)."""
        out = self.server.tau("status", run, check=0).stdout
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("NAME"), out)
        row = lines[1]
        self.assertTrue(row.startswith(run + " "), out)
        cells = [c for c in row[len(run):].split("  ") if c.strip()]
        return cells[0].strip(), out

    def wait_status(self, run, state):
        """Waits for `tau status RUN` to show STATE; returns its output."""
        return self.wait(lambda: (lambda s: s[1] if s[0] == state else None)(self.status(run)),
                         lambda: f"`tau status {run}` to say {state}:\n{self.status(run)[1]}")

    def logs(self, run):
        return self.server.tau("logs", run, check=0).stdout

    def admit_and_start(self, run):
        job = f"{run}-1"
        self.wait_job(run)
        self.kube.make_pending_workload(job)
        self.kube.admit(job)
        pod = self.kube.start_pod(run)
        self.wait_status(run, "Running")
        return job, pod

    def test_run_goes_through_kueue_and_keeps_its_logs(self):
        run = self.submit()
        job_name = f"{run}-1"
        job = self.wait_job(run)
        self.assertIs(job["spec"].get("suspend"), True, "created suspended, for Kueue to admit")
        self.assertEqual(job["metadata"]["labels"].get("kueue.x-k8s.io/queue-name"), "default")
        state, out = self.status(run)
        self.assertEqual(state, "Queued", out)
        # Before Kueue has a Workload for it, tau says what it waits for.
        self.wait(lambda: "waiting for Kueue to create the run's Workload" in self.status(run)[1],
                  lambda: f"`tau status` to say it waits for Kueue:\n{self.status(run)[1]}")

        # Kueue makes the Workload and cannot place it yet: tau says why, and where it stands.
        self.kube.make_pending_workload(job_name)
        out = self.wait(lambda: (lambda o: o if KUEUE_MESSAGE in o else None)(self.status(run)[1]),
                        lambda: f"Kueue's message in `tau status`:\n{self.status(run)[1]}")
        self.assertIn("pending: position 1 in queue default; ", out)
        self.assertEqual(self.status(run)[0], "Queued")

        self.kube.admit(job_name)
        self.wait_status(run, "Admitted")
        pod = self.kube.start_pod(run)
        self.wait_status(run, "Running")
        self.kube.append_log(pod, "step 1 loss 0.5\n")
        self.kube.append_log(pod, "step 2 loss 0.25\n")
        lines = "step 1 loss 0.5\nstep 2 loss 0.25\n"
        self.wait(lambda: self.logs(run) == lines,
                  lambda: f"the pod's log in `tau logs`: {self.logs(run)!r}")

        self.kube.end_log(pod)
        self.kube.set_pod_status(pod, {"phase": "Succeeded", "containerStatuses": [
            {"name": "worker", "state": {"terminated": {"exitCode": 0}}}]})
        self.kube.set_job_condition(job_name, "Complete", "Completed")
        out = self.wait_status(run, "Succeeded")
        self.assertRegex(out.splitlines()[1], rf"^{run}\s+Succeeded\s+0\s+1\s", out)
        # The pod may go; the log stays with the run.
        self.kube.must("DELETE", self.kube.pod_path(pod))
        self.assertIsNone(self.kube.get(self.kube.pod_path(pod)))
        self.assertEqual(self.logs(run), lines)

        describe = self.server.tau("describe", run, check=0).stdout
        # On this backend the image is what the pods run, not a record only.
        self.assertRegex(describe, r"\nImage:\s+python:3\.12\n", describe)
        self.assertRegex(describe, r"\n  \S+\s+Admitted\s+admitted by Kueue \(ClusterQueue "
                         rf"{CLUSTER_QUEUE}; cpu on default, memory on default\)\n", describe)
        self.assertRegex(describe, rf"\n  1\s+Finished\s+Succeeded\s+0\s", describe)
        # The run's checkpoints and outputs are on the cluster's volumes: said, not an empty list.
        for args in (("artifacts", run), ("get", run, "output/result.txt", "-f", "-")):
            p = self.server.tau(*args)
            self.assertNotEqual(p.returncode, 0, p.stdout)
            self.assertIn("artifacts are not available on the kubernetes backend", p.stderr)

    # One Admitted event per admission: neither the observation "Admitted" seen again while the
    # run runs nor a pod that ends before its Job's Complete condition adds another.
    def test_admission_is_one_event(self):
        run = self.submit()
        job, pod = self.admit_and_start(run)
        self.kube.set_pod_status(pod, {"phase": "Succeeded", "containerStatuses": [
            {"name": "worker", "state": {"terminated": {"exitCode": 0}}}]})
        self.kube.set_job_condition(job, "Complete", "Completed")
        self.wait_status(run, "Succeeded")
        events = [e["type"] for e in self.server.run_json(run)["events"]]
        self.assertEqual(events.count("Admitted"), 1, events)

    def test_server_version_names_the_backend(self):
        out = self.server.tau("version", "--server-version", check=0).stdout
        self.assertRegex(out, r"\nserver \S+ \(api v1, backend kubernetes\)\n", out)

    def test_cancel_deletes_the_job(self):
        run = self.submit()
        job_name = f"{run}-1"
        self.wait_job(run)
        self.kube.make_pending_workload(job_name)
        self.server.tau("cancel", run, check=0)
        self.wait(lambda: self.kube.job(job_name) is None,
                  lambda: f"the Job {job_name} to be deleted")
        self.wait_status(run, "Cancelled")
        self.assertEqual(self.server.run_json(run)["run"]["state"], "Cancelled")

    def test_oom_killed_pod_fails_the_run(self):
        run = self.submit()
        job, pod = self.admit_and_start(run)
        self.kube.set_pod_status(pod, {"phase": "Failed", "containerStatuses": [
            {"name": "worker",
             "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
        self.kube.set_job_condition(job, "Failed", "BackoffLimitExceeded")
        out = self.wait_status(run, "Failed (OOMKilled)")
        self.assertRegex(out.splitlines()[1], rf"^{run}\s+Failed \(OOMKilled\)\s+137\s", out)
        d = self.server.run_json(run)["run"]
        self.assertEqual((d["state"], d["reason"], d["exit_code"]), ("Failed", "OOMKilled", 137))

    def test_restart_readopts_a_job_that_finished_meanwhile(self):
        run = self.submit()
        job, pod = self.admit_and_start(run)
        self.kube.append_log(pod, "step 1\n")
        self.wait(lambda: self.logs(run) == "step 1\n", lambda: f"the log: {self.logs(run)!r}")
        self.server.kill(signal.SIGTERM)
        self.assertIsNotNone(self.kube.job(job), "stopping the server leaves the Job alone")
        # While the server is away, the pod writes more and the Job finishes.
        self.kube.append_log(pod, "step 2\n")
        self.kube.end_log(pod)
        self.kube.set_pod_status(pod, {"phase": "Succeeded", "containerStatuses": [
            {"name": "worker", "state": {"terminated": {"exitCode": 0}}}]})
        self.kube.set_job_condition(job, "Complete", "Completed")
        self.server.start()
        self.wait_status(run, "Succeeded")
        self.assertIsNone(self.kube.job(f"{run}-2"), "re-adopted, not created again")
        jobs = self.kube.must("GET", "/apis/batch/v1/namespaces/default/jobs")["items"]
        self.assertEqual([j["metadata"]["name"] for j in jobs], [job])
        self.assertEqual(self.server.run_json(run)["run"]["attempts"], 1)
        # The log is kept whole: what was written meanwhile, and nothing twice.
        self.wait(lambda: self.logs(run) == "step 1\nstep 2\n",
                  lambda: f"the whole log after the restart: {self.logs(run)!r}")

    def test_a_held_namespace_does_not_delay_another_namespaces_run(self):
        platform = os.path.join(self.work, "platform.yaml")
        with open(platform, "w") as f:
            f.write("schema_version: 1\nflavors: [{name: default}]\nqueues:\n  - name: q\n"
                    "    resource_groups:\n      - covered_resources: [cpu, memory]\n"
                    "        flavors: [{name: default, resources: [{name: cpu, nominal: 64}, "
                    "{name: memory, nominal: 256Gi}]}]\n"
                    "workspaces:\n  - {name: team-a, members: [\"*\"], default_queue: q}\n"
                    "  - {name: team-b, members: [\"*\"], default_queue: q}\n")
        self.server.tau("platform", "apply", platform, check=0)
        # team-a's admission webhook hangs: its run's create waits on the API server.
        self.kube.hold_writes("team-a")
        self.addCleanup(self.kube.hold_writes, "team-a", False)
        held = self.submit(name="held", spec=SPEC + "policy:\n  workspace: team-a\n")
        other = self.submit(name="other", spec=SPEC + "policy:\n  workspace: team-b\n")
        queued = time.monotonic()
        path = f"/apis/batch/v1/namespaces/team-b/jobs/{other}-1"
        self.wait(lambda: self.kube.get(path), lambda: f"the Job {other}-1 in team-b")
        took = time.monotonic() - queued
        self.assertIsNone(self.kube.get(f"/apis/batch/v1/namespaces/team-a/jobs/{held}-1"))
        self.assertLess(took, 1.0, f"team-b's Job came {took:.2f}s after its run was queued")
        # Released, the held create goes through.
        self.kube.hold_writes("team-a", False)
        self.wait(lambda: self.kube.get(f"/apis/batch/v1/namespaces/team-a/jobs/{held}-1"),
                  lambda: f"the Job {held}-1 in team-a")

    def test_a_rayjobs_driver_log_comes_from_rays_job_api(self):
        run = self.submit(spec=SPEC.replace("workload_kind: job", "workload_kind: rayjob"))
        path = f"/apis/ray.io/v1/namespaces/{NS}/rayjobs/{run}-1"
        rayjob = self.wait(lambda: self.kube.get(path), lambda: f"the RayJob {run}-1")
        self.assertEqual(rayjob["spec"]["submissionMode"], "HTTPMode")
        # Kueue admits it; KubeRay makes the cluster and its head Service and submits the job to
        # the dashboard itself (HTTPMode: no submitter pod); Ray keeps the driver's output.
        self.kube.must("POST", self.kube.workload_path(), {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"rayjob-{run}-1", "namespace": NS, "ownerReferences": [
                {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": f"{run}-1",
                 "uid": rayjob["metadata"]["uid"], "controller": True}]},
            "spec": {"queueName": "default"},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                      {"type": "Admitted", "status": "True"}],
                       "admission": {"clusterQueue": CLUSTER_QUEUE}}})
        self.kube.merge_patch(path, {"spec": {"suspend": False}})
        cluster, job_id = f"{run}-1-raycluster-k8p2x", f"{run}-1-zq4v7"
        self.kube.must("POST", f"/api/v1/namespaces/{NS}/services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{cluster}-head-svc", "namespace": NS},
            "spec": {"ports": [{"name": "dashboard", "port": 8265}]}})
        self.kube.serve_ray_job_logs(f"{cluster}-head-svc", job_id, "epoch 1\n")
        self.kube.merge_patch(path + "/status", {"status": {
            "jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": job_id,
            "rayClusterName": cluster}})
        self.wait_status(run, "Running")
        self.wait(lambda: self.logs(run) == "epoch 1\n", lambda: f"the log: {self.logs(run)!r}")
        self.kube.serve_ray_job_logs(f"{cluster}-head-svc", job_id, "epoch 1\nepoch 2\ndone\n")
        self.kube.merge_patch(path + "/status", {"status": {
            "jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}})
        self.wait_status(run, "Succeeded")
        self.wait(lambda: self.logs(run) == "epoch 1\nepoch 2\ndone\n",
                  lambda: f"the whole driver log: {self.logs(run)!r}")

    def test_a_secret_in_a_pod_log_is_masked_on_disk_while_it_runs(self):
        p = subprocess.run([TAU, "secret", "set", "default", "api-key"], input="hunter2-4711",
                           env=self.server.env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        run = self.submit(spec=SPEC + "  env:\n    K: SECRET:api-key\n")
        job, pod = self.admit_and_start(run)
        path = os.path.join(self.server.home, "runs", run, "attempts", "1", "logs", "rank-0.log")

        def on_disk():
            try:
                with open(path) as f:
                    return f.read()
            except FileNotFoundError:
                return ""

        def wait_disk(text):
            self.wait(lambda: on_disk() == text, lambda: f"{text!r} on disk, not {on_disk()!r}")

        # The secret's start is held back (not on disk) until the rest comes, across a cut stream.
        self.kube.append_log(pod, "key=hunter2-")
        wait_disk("key=")
        self.kube.cut_log_streams()
        self.kube.append_log(pod, "4711 ok\n")
        wait_disk("key=*** ok\n")
        # The server stops in a secret's middle; the rest comes while it is away.
        self.kube.append_log(pod, "again hunter2")
        wait_disk("key=*** ok\nagain ")
        self.server.kill(signal.SIGTERM)
        self.kube.append_log(pod, "-4711 end\n")
        self.kube.end_log(pod)
        self.kube.set_pod_status(pod, {"phase": "Succeeded", "containerStatuses": [
            {"name": "worker", "state": {"terminated": {"exitCode": 0}}}]})
        self.kube.set_job_condition(job, "Complete", "Completed")
        self.server.start()
        self.wait_status(run, "Succeeded")
        wait_disk("key=*** ok\nagain *** end\n")
        self.assertEqual(self.logs(run), "key=*** ok\nagain *** end\n")


if __name__ == "__main__":
    unittest.main()


SERVICE_SPEC = """schema_version: 1
kind: service
name: {name}
run:
  entrypoint: app.py
  workload_kind: job
compute:
  gpus: 0
  cpus: 1
  memory: 1Gi
runtime:
  image: python:3.12
  env:
    VERSION: "{version}"
serve:
  replicas: 2
  port: 8000
  readiness:
    http_path: /healthz
    period: 1s
"""


class KubeServiceTest(unittest.TestCase):
    """Services on the Kubernetes backend (docs/serving.md, "Kubernetes"): tau applies the
    Deployment and Service, the test plays the Deployment controller and the kubelet (it makes the
    replica pods, sets their readiness and restarts, writes their logs), and tau reads it all
    back."""

    NAME = "predictor"
    setUp = KubeBackendTest.setUp
    wait = KubeBackendTest.wait

    def deploy(self, version="1", update=False):
        d = tempfile.mkdtemp(dir=self.work)
        with open(os.path.join(d, "app.py"), "w") as f:
            f.write("print('serving')\n")
        path = os.path.join(d, "tau.yaml")
        with open(path, "w") as f:
            f.write(SERVICE_SPEC.format(name=self.NAME, version=version))
        args = ("serve", "update", self.NAME, path) if update else ("serve", "deploy", path)
        return self.server.tau(*args, check=0).stdout

    def service(self):
        return json.loads(self.server.tau("serve", "status", self.NAME, "-o", "json",
                                          check=0).stdout)

    def deployment(self):
        return self.kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{self.NAME}")

    def wait_deployment(self, predicate, what):
        return self.wait(lambda: (lambda d: d if d is not None and predicate(d) else None)(
            self.deployment()), lambda: f"{what}: {self.deployment()}")

    def start_replica(self, suffix, ready, revision="1", restarts=0):
        pod = f"{self.NAME}-5d9c8-{suffix}"
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": NS,
                         "labels": {"tau.dev/service": self.NAME},
                         "annotations": {"tau.dev/revision": revision}},
            "spec": {"containers": [{"name": "worker", "image": "python:3.12"}]}}
        if self.kube.get(self.kube.pod_path(pod)) is None:
            self.kube.must("POST", f"/api/v1/namespaces/{NS}/pods", body)
        self.kube.set_pod_status(pod, {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "message": "" if ready else "readiness probe failed: HTTP 503"}],
            "containerStatuses": [{"name": "worker", "restartCount": restarts, "ready": ready,
                                   "state": {"running": {}}}]})
        return pod

    def test_a_service_is_a_deployment_tau_applies_reads_back_and_deletes(self):
        out = self.deploy()
        self.assertIn(f"service {self.NAME} deployed", out)
        d = self.wait_deployment(lambda d: True, "the Deployment")
        self.assertEqual(d["spec"]["replicas"], 2)
        template = d["spec"]["template"]
        self.assertEqual(template["metadata"]["labels"]["tau.dev/service"], self.NAME)
        self.assertEqual(template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "default")
        self.assertEqual(template["metadata"]["annotations"]["tau.dev/revision"], "1")
        container = template["spec"]["containers"][0]
        self.assertEqual(container["readinessProbe"]["httpGet"]["path"], "/healthz")
        self.assertIn({"name": "VERSION", "value": "1"}, container["env"])
        svc = self.kube.get(f"/api/v1/namespaces/{NS}/services/{self.NAME}")
        self.assertIsNotNone(svc, "the Service in front of the replicas")
        self.assertEqual(svc["spec"]["selector"], {"tau.dev/service": self.NAME})

        # The Deployment controller's and the kubelet's part: two pods, one ready.
        ready = self.start_replica("a1", True)
        starting = self.start_replica("b2", False)
        self.kube.merge_patch(
            f"/apis/apps/v1/namespaces/{NS}/deployments/{self.NAME}/status",
            {"status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}})
        s = self.wait(lambda: (lambda s: s if s["ready"] == 1 and len(s["replica_list"]) == 2
                               else None)(self.service()),
                      lambda: f"both pods in the service: {self.service()}")
        self.assertEqual(s["endpoint"], f"http://{self.NAME}.{NS}.svc:80")
        cluster = s["cluster"]
        self.assertEqual((cluster["kind"], cluster["namespace"], cluster["name"]),
                         ("Deployment", NS, self.NAME))
        self.assertEqual((cluster["desired"], cluster["ready"], cluster["found"]), (2, 1, True))
        pods = {r["run"]: r for r in s["replica_list"]}
        self.assertTrue(pods[ready]["ready"])
        self.assertFalse(pods[starting]["ready"])
        self.assertIn("readiness probe failed", pods[starting]["reason"])
        text = self.server.tau("serve", "status", self.NAME, check=0).stdout
        self.assertIn("Deployment default/predictor: 2 desired, 1 ready", text)
        self.assertIn(ready, text)

        # Its pods' logs are kept by the server, and read back by `tau serve logs`.
        self.kube.append_log(ready, "loaded the model\nserving on 8000\n")
        self.wait(lambda: "serving on 8000" in self.server.tau(
                      "serve", "logs", self.NAME, "--replica", ready, check=None).stdout,
                  lambda: self.server.tau("serve", "logs", self.NAME, "--replica", ready,
                                          check=None))

        # A container that restarts is counted.
        self.start_replica("b2", False, restarts=1)
        s = self.wait(lambda: (lambda s: s if s["restarts"] == 1 else None)(self.service()),
                      lambda: f"the restart counted: {self.service()}")
        self.assertIn("ReplicaRestarted", [h["type"] for h in s["history"]])

        # The endpoint on the server does not reach into the cluster, and says where to go.
        status = self.server.tau_http(f"/serve/{self.NAME}/predict", status=412)
        self.assertIn(f"http://{self.NAME}.{NS}.svc:80", json.dumps(status))

        # Scale and update are applied to the Deployment (which rolls the pods itself).
        self.server.tau("serve", "scale", self.NAME, "3", check=0)
        self.wait_deployment(lambda d: d["spec"]["replicas"] == 3, "replicas: 3")
        self.deploy(version="2", update=True)
        d = self.wait_deployment(
            lambda d: d["spec"]["template"]["metadata"]["annotations"]["tau.dev/revision"] == "2",
            "revision 2")
        self.assertEqual(d["spec"]["replicas"], 3, "an update keeps the scaled count")
        self.assertIn({"name": "VERSION", "value": "2"},
                      d["spec"]["template"]["spec"]["containers"][0]["env"])

        # A server restart re-reads the service without applying it again.
        applied = [h for h in self.service()["history"] if h["type"] == "Applied"]
        self.server.kill()
        self.server.start()
        s = self.wait(lambda: (lambda s: s if len(s["replica_list"]) == 2 else None)(
            self.service()), lambda: f"the pods after a restart: {self.service()}")
        self.assertEqual([h for h in s["history"] if h["type"] == "Applied"], applied)
        self.assertEqual(s["restarts"], 1, "restarts are not counted again after a restart")

        # A Deployment deleted behind tau's back is applied again.
        self.kube.must("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/{self.NAME}")
        self.wait_deployment(lambda d: d["spec"]["replicas"] == 3, "the Deployment again")

        # Delete: the Deployment and the Service go, and the service is forgotten.
        self.server.tau("serve", "delete", self.NAME, check=0)
        self.wait(lambda: self.deployment() is None and self.kube.get(
            f"/api/v1/namespaces/{NS}/services/{self.NAME}") is None,
            lambda: "the Deployment and the Service deleted")
        self.wait(lambda: "no services" in self.server.tau("serve", "list", check=0).stdout,
                  lambda: self.server.tau("serve", "list", check=0).stdout)

    def test_a_service_the_cluster_refuses_says_why_and_applies_once_fixed(self):
        # A rayjob service without serve.import_path cannot be rendered: refused at deploy.
        d = tempfile.mkdtemp(dir=self.work)
        with open(os.path.join(d, "app.py"), "w") as f:
            f.write("print('x')\n")
        with open(os.path.join(d, "tau.yaml"), "w") as f:
            f.write(SERVICE_SPEC.format(name=self.NAME, version="1").replace(
                "workload_kind: job", "workload_kind: rayjob"))
        r = self.server.tau("serve", "deploy", os.path.join(d, "tau.yaml"), check=None)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("serve.import_path", r.stderr)
        self.assertIsNone(self.kube.get(f"/apis/ray.io/v1/namespaces/{NS}/rayservices/{self.NAME}"))
        # The API server refuses the Deployment for a while (an admission webhook): the history
        # says so once, and it is applied when the API server takes it.
        self.kube.must("POST", "/fake/inject-failures?count=1000&status=403", "", "text/plain")
        self.deploy()
        s = self.wait(lambda: (lambda s: s if "ApplyFailed" in [h["type"] for h in s["history"]]
                               else None)(self.service()),
                      lambda: f"ApplyFailed in the history: {self.service()}")
        self.assertIn("error", s["cluster"])
        self.kube.must("POST", "/fake/inject-failures?count=0&status=403", "", "text/plain")
        self.wait_deployment(lambda d: True, "the Deployment once the API server takes it")
        s = self.service()
        self.assertEqual([h["type"] for h in s["history"]].count("ApplyFailed"), 1)
