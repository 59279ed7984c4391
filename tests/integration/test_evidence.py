"""End-to-end tests of run evidence (issue #5, docs/evidence.md): the record of the quickstart, bundle
export and tamper detection, metric deduplication across retries, rerun reproduction, GPU samples and
retention. The record is validated against docs/evidence-record.schema.json with a small checker."""
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import unittest

from harness import ServerTestCase, TauServer, wait_for

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCHEMA = os.path.join(REPO, "docs", "evidence-record.schema.json")


def validate(instance, schema, root=None, path="$"):
    """The subset of JSON Schema the record's schema uses: type, required, properties,
    additionalProperties, items, enum, minimum, minLength, pattern, $ref. Raises AssertionError
    naming the first violation."""
    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        return validate(instance, target, root, path)
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if not any(checks[t](instance) for t in types):
            raise AssertionError(f"{path}: {instance!r} is not of type {types}")
    if "enum" in schema and instance not in schema["enum"]:
        raise AssertionError(f"{path}: {instance!r} not in {schema['enum']}")
    if isinstance(instance, str):
        if "minLength" in schema and len(instance) < schema["minLength"]:
            raise AssertionError(f"{path}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], instance):
            raise AssertionError(f"{path}: {instance!r} does not match {schema['pattern']}")
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        if "minimum" in schema and instance < schema["minimum"]:
            raise AssertionError(f"{path}: {instance} < {schema['minimum']}")
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            if key not in instance:
                raise AssertionError(f"{path}: missing required member '{key}'")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, value in instance.items():
            if key in props:
                validate(value, props[key], root, f"{path}.{key}")
            elif extra is False:
                raise AssertionError(f"{path}: unexpected member '{key}'")
            elif isinstance(extra, dict):
                validate(value, extra, root, f"{path}.{key}")
    if isinstance(instance, list) and "items" in schema:
        for i, value in enumerate(instance):
            validate(value, schema["items"], root, f"{path}[{i}]")


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tamper(bundle, member, out):
    """Copies the bundle to `out` with one byte of `member` changed (in its middle)."""
    with tarfile.open(bundle, "r:gz") as src:
        entries = [(m, src.extractfile(m).read()) for m in src.getmembers()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for info, data in entries:
            if info.name == member:
                data = bytearray(data)
                i = len(data) // 2
                data[i] = ord("#") if data[i] != ord("#") else ord("%")
                data = bytes(data)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    with open(out, "wb") as f:
        f.write(gzip.compress(buf.getvalue()))


class EvidenceTest(ServerTestCase):
    def run_quickstart(self):
        code = os.path.join(self.work, "quickstart")
        shutil.copytree(os.path.join(REPO, "examples", "quickstart"), code)
        name = self.server.tau("run", "--detach", os.path.join(code, "tau.yaml"),
                               check=0).stdout.strip()
        self.server.wait_state(name, "Succeeded", timeout=60)
        return name, code

    def record(self, name):
        return json.loads(self.server.tau("evidence", name, "-o", "json", check=0).stdout)

    def final_record(self, name):
        return wait_for(lambda: (lambda r: r if r["run"]["state"] in (
            "Succeeded", "Failed", "Cancelled") else None)(self.record(name)), timeout=20,
            what="the final record")

    def test_quickstart_record_has_every_item(self):
        name, code = self.run_quickstart()
        rec = self.final_record(name)
        with open(SCHEMA) as f:
            validate(rec, json.load(f))
        d = self.server.run_json(name)
        # Config: the spec as written, resolved settings with provenance, the config hash.
        with open(os.path.join(code, "tau.yaml")) as f:
            self.assertEqual(rec["config"]["spec_yaml"], f.read())
        self.assertEqual(rec["config"]["config_hash"], d["run"]["config_hash"])
        self.assertEqual(rec["config"]["spec"]["name"], "quickstart")
        self.assertIn("queue", rec["config"]["resolved"])
        fields = {p["field"] for p in rec["config"]["provenance"]}
        self.assertIn("policy.queue", fields)
        # Snapshot: each file with its sha256, and the digest the server computed.
        files = {f["path"]: f for f in rec["snapshot"]["files"]}
        self.assertEqual(set(files), {"tau.yaml", "train.py"})
        self.assertEqual(files["train.py"]["sha256"], sha256_file(os.path.join(code, "train.py")))
        self.assertEqual(rec["snapshot"]["digest"], d["run"]["snapshot_digest"])
        # Runtime.
        rt = rec["runtime"]
        self.assertRegex(rt["python_version"], r"^3\.\d+")
        for key in ("host", "os", "kernel", "tau_version"):
            self.assertTrue(rt[key], key)
        self.assertEqual(rt["pip"], [])
        self.assertEqual(rt["gpus"], [])  # a CPU run
        # Lifecycle, hash-chained, with timestamps.
        types = [e["type"] for e in rec["events"]]
        # Metered: the time it held quota, for budgets and `tau usage` (budgets.md).
        self.assertEqual(types,
                         ["Submitted", "Queued", "Admitted", "Running", "Metered", "Succeeded"])
        self.assertEqual([e["hash"] for e in rec["events"]], [e["hash"] for e in d["events"]])
        self.assertEqual(rec["chain_head"], d["events"][-1]["hash"])
        for prev, e in zip(rec["events"], rec["events"][1:]):
            self.assertEqual(e["prev_hash"], prev["hash"])
            self.assertGreaterEqual(e["ts_ms"], prev["ts_ms"])
        # Attempts and their logs.
        (a,) = rec["attempts"]
        self.assertEqual((a["number"], a["exit_code"], a["failure_class"]), (1, 0, "Succeeded"))
        self.assertGreater(a["ended_ms"], a["started_ms"])
        (log,) = a["logs"]
        log_path = os.path.join(self.server.home, "runs", name, "attempts", "1", "logs",
                                "rank-0.log")
        self.assertEqual(log["sha256"], sha256_file(log_path))
        self.assertEqual(log["state"], "kept")
        # Metrics: 30 loss points, summarised.
        self.assertEqual(rec["metrics"]["distinct_points"], 30)
        (series,) = rec["metrics"]["series"]
        self.assertEqual((series["name"], series["split"], series["count"]), ("loss", "train", 30))
        self.assertLess(series["latest"], series["max"])
        # Checkpoints and outputs with their hashes and the attempt that wrote them.
        arts = {(x["kind"], x["path"]): x for x in rec["artifacts"]}
        ck = arts[("checkpoint", "ckpt-000030.json")]
        self.assertEqual(ck["attempt"], 1)
        self.assertEqual(ck["sha256"], sha256_file(
            os.path.join(self.server.home, "runs", name, "checkpoints", "ckpt-000030.json")))
        self.assertIn(("output", "model.json"), arts)
        # Kept after the run's work directory is gone.
        shutil.rmtree(os.path.join(self.server.home, "runs", name, "work"))
        self.assertEqual(self.record(name)["chain_head"], rec["chain_head"])
        # The readable summary and the metrics command.
        summary = self.server.tau("evidence", name, check=0).stdout
        self.assertIn(name, summary)
        self.assertIn("Chain head", summary)
        p = self.server.tau("metrics", name, "loss", "-o", "table", check=0)
        self.assertTrue(re.search("[▁▂▃▄▅▆▇█]{10}", p.stdout), p.stdout)
        jsonl = self.server.tau("metrics", name, "loss", check=0).stdout.splitlines()
        self.assertEqual(len(jsonl), 30)
        self.assertEqual(json.loads(jsonl[0])["step"], 1)
        # A metric the run never wrote is an error in every format, not an empty answer.
        for fmt in ("jsonl", "json", "table"):
            typo = self.server.tau("metrics", name, "lossx", "-o", fmt)
            self.assertEqual(typo.returncode, 1, (fmt, typo.stdout, typo.stderr))
            self.assertEqual(typo.stdout, "")
            self.assertIn(f"run {name} has no points of metric 'lossx'", typo.stderr)

    def test_a_final_record_lost_with_the_machine_is_made_again(self):
        # The final record is saved without a disk flush: after a crash of the machine it may be
        # gone, or empty. Either way the next read makes the same record again, and saves it.
        name, _ = self.run_quickstart()
        rec = self.final_record(name)
        path = os.path.join(self.server.home, "runs", name, "evidence", "record.json")
        wait_for(lambda: os.path.exists(path), timeout=20, what="the saved record")
        for lose in (os.remove, lambda p: open(p, "w").close()):
            lose(path)
            again = self.record(name)
            for key in ("chain_head", "snapshot", "metrics", "artifacts", "config"):
                self.assertEqual(again[key], rec[key], key)
            self.assertEqual(again["attempts"][0]["logs"], rec["attempts"][0]["logs"])
            with open(path) as f:
                self.assertEqual(json.load(f)["chain_head"], rec["chain_head"])

    def test_export_verify_and_tamper_each_kind_of_file(self):
        name, _ = self.run_quickstart()
        self.final_record(name)
        bundle = os.path.join(self.work, "b.tar.gz")
        self.server.tau("evidence", "export", name, "-f", bundle, check=0)
        p = self.server.tau("evidence", "verify", bundle, "--run-check", check=0)
        self.assertIn("intact", p.stdout)
        with tarfile.open(bundle, "r:gz") as t:
            names = t.getnames()
        self.assertEqual(names[-1], "manifest.json")
        for member in ("manifest.json", "record.json", "logs/attempt-1/rank-0.log",
                       "metrics.jsonl", "checkpoints.json"):
            with self.subTest(member=member):
                self.assertIn(member, names)
                bad = os.path.join(self.work, "bad.tar.gz")
                tamper(bundle, member, bad)
                p = self.server.tau("evidence", "verify", bad)
                self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
                self.assertIn(member, p.stderr)
        # A missing file is named too.
        with tarfile.open(bundle, "r:gz") as src:
            entries = [(m, src.extractfile(m).read()) for m in src.getmembers()
                       if m.name != "metrics.jsonl"]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as dst:
            for info, data in entries:
                dst.addfile(info, io.BytesIO(data))
        missing = os.path.join(self.work, "missing.tar.gz")
        with open(missing, "wb") as f:
            f.write(gzip.compress(buf.getvalue()))
        p = self.server.tau("evidence", "verify", missing)
        self.assertEqual(p.returncode, 1)
        self.assertIn("metrics.jsonl missing", p.stderr)

    def test_retried_run_metrics_are_not_doubled(self):
        code = (
            "import json, os, sys\n"
            "attempt = int(os.environ['TAU_ATTEMPT'])\n"
            "steps = range(0, 10) if attempt == 1 else range(5, 15)\n"
            "with open(os.environ['TAU_METRICS_FILE'], 'a') as f:\n"
            "    for s in steps:\n"
            "        for n in ('loss', 'acc'):\n"
            "            f.write(json.dumps({'name': n, 'step': s, 'value': s * 0.5}) + '\\n')\n"
            "sys.exit(1 if attempt == 1 else 0)\n")
        spec = ("schema_version: 1\nname: retried\nrun:\n  entrypoint: main.py\n"
                "  workload_kind: job\ncompute:\n  gpus: 0\n  workers: 1\n"
                "resilience:\n  max_retries: 1\n  retry_on: [UserError]\n"
                "  backoff_initial: 100ms\n  backoff_max: 1s\n")
        name = self.submit(spec, {"main.py": code})
        self.server.wait_state(name, "Succeeded", timeout=60)
        rec = self.final_record(name)
        self.assertEqual(len(rec["attempts"]), 2)
        self.assertEqual(rec["attempts"][0]["failure_class"], "UserError")
        series = {s["name"]: s for s in rec["metrics"]["series"]}
        for n in ("loss", "acc"):
            self.assertEqual(series[n]["count"], 15, series[n])
            self.assertEqual((series[n]["first_step"], series[n]["last_step"]), (0, 14))
            self.assertEqual(series[n]["latest_attempt"], 2)
        self.assertEqual(rec["metrics"]["points_read"], 40)
        self.assertEqual(rec["metrics"]["distinct_points"], 30)
        lines = [json.loads(x) for x in
                 self.server.tau("metrics", name, "loss", check=0).stdout.splitlines()]
        self.assertEqual([x["step"] for x in lines], list(range(15)))
        self.assertEqual([x["attempt"] for x in lines], [1] * 5 + [2] * 10)

    def test_a_line_cut_off_by_a_dying_attempt_does_not_swallow_the_next_attempts_first(self):
        code = (
            "import json, os, sys\n"
            "attempt = int(os.environ['TAU_ATTEMPT'])\n"
            "with open(os.environ['TAU_METRICS_FILE'], 'a') as f:\n"
            "    if attempt == 1:\n"
            "        for s in range(3):\n"
            "            f.write(json.dumps({'name': 'loss', 'step': s, 'value': s}) + '\\n')\n"
            "        f.write('{\"name\": \"loss\", \"st')\n"  # killed mid-write
            "    else:\n"
            "        for s in range(2, 4):\n"
            "            f.write(json.dumps({'name': 'loss', 'step': s, 'value': s * 10}) + '\\n')\n"
            "sys.exit(1 if attempt == 1 else 0)\n")
        spec = ("schema_version: 1\nname: cutoff\nrun:\n  entrypoint: main.py\n"
                "  workload_kind: job\ncompute:\n  gpus: 0\n  workers: 1\n"
                "resilience:\n  max_retries: 1\n  retry_on: [UserError]\n  backoff_initial: 100ms\n")
        name = self.submit(spec, {"main.py": code})
        self.server.wait_state(name, "Succeeded", timeout=60)
        lines = [json.loads(x) for x in
                 self.server.tau("metrics", name, "loss", check=0).stdout.splitlines()]
        self.assertEqual([(x["step"], x["value"], x["attempt"]) for x in lines],
                         [(0, 0, 1), (1, 1, 1), (2, 20, 2), (3, 30, 2)])

    def test_server_restart_mid_run_neither_loses_nor_doubles_points(self):
        code = ("import json, os, time\n"
                "with open(os.environ['TAU_METRICS_FILE'], 'a') as f:\n"
                "    for s in range(40):\n"
                "        f.write(json.dumps({'name': 'loss', 'step': s, 'value': 1.0 / (s + 1),\n"
                "                            'unit': 'nats', 'tags': {'lr': '0.1'}}) + '\\n')\n"
                "        f.flush()\n"
                "        time.sleep(0.1)\n")
        spec = ("schema_version: 1\nname: steady\nrun:\n  entrypoint: main.py\n"
                "  workload_kind: job\ncompute:\n  gpus: 0\n  workers: 1\n")
        name = self.submit(spec, {"main.py": code})
        self.server.wait_state(name, "Running", timeout=30)
        # Let the collector read some points, then kill the server without warning.
        state = os.path.join(self.server.home, "runs", name, "evidence", "metrics-state.json")
        wait_for(lambda: os.path.exists(state), timeout=20, what="the first metrics poll")
        self.server.kill()
        self.server.start()
        self.server.wait_state(name, "Succeeded", timeout=60)
        rec = self.final_record(name)
        (series,) = rec["metrics"]["series"]
        self.assertEqual((series["count"], series["unit"]), (40, "nats"))
        self.assertEqual(rec["metrics"]["distinct_points"], 40)
        summary = self.server.tau("metrics", name, "-o", "table", check=0).stdout
        self.assertIn("loss", summary)
        as_json = json.loads(self.server.tau("metrics", name, "loss", "-o", "json", check=0).stdout)
        self.assertEqual(len(as_json[0]["points"]), 40)

    def test_rerun_reproduces_config_hash_and_code_digest(self):
        name, _ = self.run_quickstart()
        first = self.final_record(name)
        again = self.server.tau("rerun", name, check=0).stdout.strip()
        self.server.wait_state(again, "Succeeded", timeout=60)
        second = self.final_record(again)
        self.assertEqual(second["config"]["config_hash"], first["config"]["config_hash"])
        self.assertEqual(second["snapshot"]["digest"], first["snapshot"]["digest"])
        self.assertEqual(second["snapshot"]["files"], first["snapshot"]["files"])
        self.assertEqual(second["events"][0]["data"]["rerun_of"], name)

    def test_runs_made_with_overrides_verify(self):
        # Every way an override reaches a run: --set, rerun --set, and an array item with --set.
        name, code = self.run_quickstart()
        spec = os.path.join(code, "tau.yaml")
        made = [self.server.tau("run", "--detach", spec, "--set", "runtime.env.LEARNING_RATE=0.1",
                                "--set", "run.args[1]=5", check=0).stdout.strip(),
                self.server.tau("rerun", name, "--set", "run.args[1]=4", check=0).stdout.strip(),
                self.server.tau("run", "--detach", spec, "--set", "run.args[1]=30",
                                check=0).stdout.strip()]
        for run in made:
            self.server.wait_state(run, "Succeeded", timeout=60)
        for run in [name] + made:
            rec = self.final_record(run)
            if run != name:
                self.assertTrue(rec["config"]["spec"]["overrides"], rec["config"]["spec"])
            # docs/evidence.md's recipe, as a third-party verifier would apply it.
            canonical = {k: v for k, v in rec["config"]["spec"].items()
                         if k not in ("shape", "overrides")}
            text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            self.assertEqual(hashlib.sha256(text.encode()).hexdigest(),
                             rec["config"]["config_hash"], run)
            self.assertEqual(rec["config"]["config_hash"],
                             self.server.run_json(run)["run"]["config_hash"])
            bundle = os.path.join(self.work, run + ".tar.gz")
            self.server.tau("evidence", "export", run, "-f", bundle, check=0)
            p = self.server.tau("evidence", "verify", bundle, "--run-check", check=None)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.final_record(made[1])["config"]["spec"]["args"], ["--steps", "4"])
        # The file's own values reached through --set hash as the file does.
        self.assertEqual(self.final_record(made[2])["config"]["config_hash"],
                         self.final_record(name)["config"]["config_hash"])


class GpuEvidenceTest(ServerTestCase):
    gpus = 1

    def test_gpu_run_records_devices_and_samples(self):
        spec = ("schema_version: 1\nname: gpu-job\nrun:\n  entrypoint: main.py\n"
                "  workload_kind: job\ncompute:\n  gpus: 1\n  workers: 1\n")
        name = self.submit(spec, {"main.py": "import time\ntime.sleep(2)\n"})
        self.server.wait_state(name, "Succeeded", timeout=60)
        rec = wait_for(lambda: (lambda r: r if r["run"]["state"] == "Succeeded" and
                                r["gpu_samples"] else None)(
            json.loads(self.server.tau("evidence", name, "-o", "json", check=0).stdout)),
            timeout=20, what="a record with GPU samples")
        with open(SCHEMA) as f:
            validate(rec, json.load(f))
        (gpu,) = rec["runtime"]["gpus"]
        self.assertTrue(gpu["uuid"].startswith("GPU-"), gpu)
        self.assertTrue(gpu["name"])
        self.assertTrue(rec["runtime"]["driver_version"])
        self.assertGreater(rec["gpu_samples"][0]["count"], 0)
        bundle = os.path.join(self.work, "g.tar.gz")
        self.server.tau("evidence", "export", name, "-f", bundle, check=0)
        bad = os.path.join(self.work, "g-bad.tar.gz")
        tamper(bundle, "gpu-samples.jsonl", bad)
        p = self.server.tau("evidence", "verify", bad)
        self.assertEqual(p.returncode, 1)
        self.assertIn("gpu-samples.jsonl", p.stderr)


class RetentionTest(unittest.TestCase):
    def test_logs_are_pruned_and_hashes_kept(self):
        server = TauServer(extra_args=["--retain-logs", "1s", "--retain-samples", "1s"]).start()
        work = tempfile.mkdtemp(prefix="tau-it-code-")
        try:
            d = os.path.join(work, "p")
            os.makedirs(d)
            with open(os.path.join(d, "main.py"), "w") as f:
                f.write("print('hello')\n")
            with open(os.path.join(d, "tau.yaml"), "w") as f:
                f.write("schema_version: 1\nname: pruned\nrun:\n  entrypoint: main.py\n"
                        "  workload_kind: job\ncompute:\n  gpus: 0\n  workers: 1\n")
            name = server.tau("run", "-d", os.path.join(d, "tau.yaml"), check=0).stdout.strip()
            server.wait_state(name, "Succeeded", timeout=60)
            log = os.path.join(server.home, "runs", name, "attempts", "1", "logs", "rank-0.log")

            def pruned():
                r = json.loads(server.tau("evidence", name, "-o", "json", check=0).stdout)
                return r if r["retention"]["logs_pruned_ms"] else None
            rec = wait_for(pruned, timeout=20, what="retention to prune the logs")
            self.assertFalse(os.path.exists(log))
            (entry,) = rec["attempts"][0]["logs"]
            self.assertEqual(entry["state"], "pruned")
            self.assertRegex(entry["sha256"], "^[0-9a-f]{64}$")
            self.assertEqual(len(rec["events"]), 6)
            bundle = os.path.join(work, "b.tar.gz")
            server.tau("evidence", "export", name, "-f", bundle, check=0)
            server.tau("evidence", "verify", bundle, "--run-check", check=0)
        finally:
            server.stop()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
