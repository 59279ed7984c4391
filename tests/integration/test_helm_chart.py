"""The Helm chart deploy/helm/taugrid against `tau cluster render`: `helm lint`, `helm template` with the
default values and with a values file and a platform, compared object by object with what tau renders,
and the chart's values.schema.json refusing bad values. Skipped when `helm` is not on PATH.

The chart's optional dependencies (Kueue, KubeRay) are off by default and fetching them needs the
network, so the templates are rendered from a copy of the chart without them. YAML is read with Helm's
own `fromYaml` (through a one-template converter chart) to keep to Python's standard library."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import TAU

# helm on PATH, else the one scripts/fetch-helm.sh puts in .cache/tools/.
HELM = shutil.which("helm") or next(
    (p for p in [os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "tools", "helm")]
     if os.access(p, os.X_OK)), None)
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(REPO, "deploy", "helm", "taugrid")
CUSTOM_VALUES = os.path.join(REPO, "tests", "data", "kube", "cluster", "values-custom.yaml")
PLATFORM = os.path.join(REPO, "tests", "data", "kube", "platform-multi.yaml")
NAMESPACE = "tau-system"

CONVERTER_TEMPLATE = """{{- range $doc := regexSplit "(?m)^---\\\\s*$" .Values.input -1 }}
{{- with fromYaml $doc }}
---
{{ toJson . }}
{{- end }}
{{- end }}
"""


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


@unittest.skipIf(HELM is None, "helm is not on PATH: the chart is checked against the renderer by "
                 "kube_test (HelmChart.*) only; see docs/kubernetes.md to verify with helm")
class HelmChartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tau-helm-")
        # The chart as shipped: it has no dependencies to fetch.
        cls.chart = CHART
        cls.converter = os.path.join(cls.tmp, "yaml2json")
        os.makedirs(os.path.join(cls.converter, "templates"))
        with open(os.path.join(cls.converter, "Chart.yaml"), "w") as f:
            f.write("apiVersion: v2\nname: yaml2json\nversion: 0.0.1\n")
        with open(os.path.join(cls.converter, "templates", "out.yaml"), "w") as f:
            f.write(CONVERTER_TEMPLATE)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def objects(self, yaml_text):
        """YAML documents as dicts, read by Helm's fromYaml."""
        path = os.path.join(self.tmp, "input.yaml")
        with open(path, "w") as f:
            f.write(yaml_text)
        p = run([HELM, "template", "x", self.converter, "--set-file", "input=" + path])
        self.assertEqual(p.returncode, 0, p.stderr)
        docs = []
        for doc in re.split(r"(?m)^---\s*$", p.stdout):
            body = "\n".join(l for l in doc.splitlines() if not l.startswith("#")).strip()
            if body:
                docs.append(json.loads(body))
        return docs

    def helm_template(self, *args):
        p = run([HELM, "template", "taugrid", self.chart, "--namespace", NAMESPACE, *args])
        self.assertEqual(p.returncode, 0, p.stderr)
        return self.objects(p.stdout)

    def tau_render(self, *args):
        p = run([TAU, "cluster", "render", *args])
        self.assertEqual(p.returncode, 0, p.stderr)
        return self.objects(p.stdout)

    @staticmethod
    def normalised(objects):
        """Keyed by (kind, name), with the one intended difference removed: Helm's objects say
        managed-by Helm, tau's say tau. Quantities written as numbers become their text."""
        out = {}
        for o in objects:
            o = json.loads(json.dumps(o))
            o["metadata"].get("labels", {}).pop("app.kubernetes.io/managed-by", None)

            def fix(node):
                if isinstance(node, dict):
                    for k, v in node.items():
                        if k in ("requests", "limits") and isinstance(v, dict):
                            node[k] = {r: (str(int(q)) if isinstance(q, (int, float)) and q == int(q)
                                           else str(q)) for r, q in v.items()}
                        else:
                            fix(v)
                elif isinstance(node, list):
                    for v in node:
                        fix(v)
            fix(o)
            out[(o["kind"], o["metadata"]["name"])] = o
        return out

    def assertSameObjects(self, helm, tau):
        helm, tau = self.normalised(helm), self.normalised(tau)
        self.assertEqual(sorted(helm), sorted(tau))
        for key in sorted(helm):
            with self.subTest(object=key):
                self.assertEqual(helm[key], tau[key])

    def test_kueue_values_hold_every_workspace_job_without_a_queue(self):
        # deploy/kueue/values.yaml, for Kueue's own chart: Jobs without a queue name in tau's
        # workspace namespaces are Kueue's too (a member's Role may create Jobs there), and those
        # namespaces only: the selector must match the labels tau gives them, and no other.
        with open(os.path.join(REPO, "deploy", "kueue", "values.yaml")) as f:
            values = self.objects(f.read())[0]
        config = self.objects(values["managerConfig"]["controllerManagerConfigYaml"])[0]
        self.assertEqual(config["kind"], "Configuration")
        self.assertIs(config["manageJobsWithoutQueueName"], True)
        # Runs are Jobs, RayJobs (and their RayClusters); a `job` service's replicas are a
        # Deployment's pods, admitted as pods; a RayService through its RayCluster (Kueue 0.15 has
        # no ray.io/rayservice integration, and refuses a name it does not know).
        self.assertEqual(sorted(config["integrations"]["frameworks"]),
                         ["batch/job", "deployment", "pod", "ray.io/raycluster", "ray.io/rayjob"])
        selector = config["managedJobsNamespaceSelector"]

        def selects(labels):
            for k, v in selector.get("matchLabels", {}).items():
                if labels.get(k) != v:
                    return False
            for e in selector.get("matchExpressions", []):
                present = e["key"] in labels
                if e["operator"] == "Exists" and not present:
                    return False
                if e["operator"] == "DoesNotExist" and present:
                    return False
                if e["operator"] == "In" and labels.get(e["key"]) not in e["values"]:
                    return False
                if e["operator"] == "NotIn" and labels.get(e["key"]) in e["values"]:
                    return False
            return True

        p = run([TAU, "platform", "render", PLATFORM])
        self.assertEqual(p.returncode, 0, p.stderr)
        namespaces = [o for o in self.objects(p.stdout) if o["kind"] == "Namespace"]
        self.assertGreaterEqual(len(namespaces), 2)
        for ns in namespaces:
            self.assertTrue(selects(ns["metadata"].get("labels", {})), ns["metadata"])
        for other in ({}, {"kubernetes.io/metadata.name": NAMESPACE},
                      {"app.kubernetes.io/managed-by": "tau"}):
            self.assertFalse(selects(other), other)

    def test_server_may_deploy_services(self):
        # `tau serve deploy` on Kubernetes: the server applies (server-side apply: a PATCH), follows
        # and deletes a `job` service's Deployment and Service and a `rayjob` service's RayService,
        # cluster-wide as it does Jobs and RayJobs, and reads their pods and logs.
        roles = [o for o in self.helm_template()
                 if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "taugrid-server"]
        self.assertEqual(len(roles), 1)
        granted = set()
        for rule in roles[0]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb))
        submit = ["get", "list", "watch", "create", "patch", "delete"]
        read = ["get", "list", "watch"]
        needed = [(group, resource, verb)
                  for group, resource, verbs in [
                      ("batch", "jobs", submit), ("ray.io", "rayjobs", submit),
                      ("apps", "deployments", submit), ("ray.io", "rayservices", submit),
                      ("", "services", submit), ("ray.io", "rayclusters", read),
                      ("", "pods", read), ("", "pods/log", read)]
                  for verb in verbs]
        self.assertEqual([n for n in needed if n not in granted], [])

    def test_lint(self):
        # The chart as shipped, strictly, with no network: with the defaults and with a values file.
        for extra in ([], ["-f", CUSTOM_VALUES, "--set-file", "platform=" + PLATFORM]):
            p = run([HELM, "lint", "--strict", self.chart, *extra])
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_defaults_are_what_tau_renders(self):
        helm = self.helm_template()
        self.assertEqual(len(helm), 9)  # no ConfigMap without a platform
        self.assertSameObjects(helm, self.tau_render())

    def test_values_file_and_platform_are_what_tau_renders(self):
        helm = self.helm_template("-f", CUSTOM_VALUES, "--set-file", "platform=" + PLATFORM)
        tau = self.tau_render("--values", CUSTOM_VALUES, "--platform", PLATFORM)
        # tau also prints the platform's objects (namespaces, RBAC, Kueue queues), which the chart
        # leaves to the server or `tau platform render`.
        chart_objects = [o for o in tau
                         if o["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "taugrid"]
        self.assertGreater(len(tau), len(chart_objects))
        self.assertSameObjects(helm, chart_objects)
        kinds = {o["kind"] for o in helm}
        self.assertIn("ConfigMap", kinds)

    def test_namespace_and_image_flags_are_the_helm_values(self):
        helm = run([HELM, "template", "taugrid", self.chart, "--namespace", "gpu-ops",
                    "--set", "image.repository=registry.example.com/tau", "--set", "image.tag=1.2.3"])
        self.assertEqual(helm.returncode, 0, helm.stderr)
        self.assertSameObjects(self.objects(helm.stdout),
                               self.tau_render("--namespace", "gpu-ops",
                                               "--image", "registry.example.com/tau:1.2.3"))

    def test_schema_refuses_bad_values(self):
        for setting in ("server.storage.size=-5Gi", "imagee.tag=x", "image.pullPolicy=Sometimes",
                        "healthAgent.pollInterval=soon", "server.tls.secretName="):
            with self.subTest(setting=setting):
                p = run([HELM, "template", "taugrid", self.chart, "--set", setting])
                self.assertNotEqual(p.returncode, 0, setting)
                self.assertIn("values don't meet the specifications of the schema", p.stderr)


if __name__ == "__main__":
    unittest.main()
