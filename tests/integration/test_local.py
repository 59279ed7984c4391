"""End-to-end tests of the local backend: a real server, the real CLI, real processes."""
import datetime
import json
import shutil
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from harness import TAU, RequestHoldingProxy, ServerTestCase, TauServer, pid_alive, wait_for

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def proc_stat(pid):
    """The state and parent of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return {"state": fields[0], "ppid": int(fields[1])}


def job_spec(name, entry="main.py", gpus=0, workers=1, extra=""):
    return (f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: {entry}\n  workload_kind: job\n"
            f"compute:\n  gpus: {gpus}\n  workers: {workers}\n{extra}")


class ValidateTest(unittest.TestCase):
    def test_valid_and_invalid_files(self):
        ok = subprocess.run([TAU, "validate", os.path.join(REPO, "examples/quickstart/tau.yaml")],
                            capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("ok", ok.stdout)
        fd, bad_path = tempfile.mkstemp(prefix="tau-it-bad-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write("schema_version: 1\nname: x\nrun:\n  entrypoint: a.py\ncompute:\n  worker: 2\n")
        bad = subprocess.run([TAU, "validate", bad_path], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn(f"{bad_path}:6:3: error: unknown field 'worker'", bad.stderr)
        self.assertIn("did you mean 'workers'", bad.stderr)
        os.unlink(bad_path)

    def test_schema_is_json(self):
        p = subprocess.run([TAU, "schema", "-o", "json"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0)
        self.assertIn("oneOf", json.loads(p.stdout))

    def test_version(self):
        p = subprocess.run([TAU, "version"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"^tau \d+\.\d+\.\d+")

    def test_help_names_a_command(self):
        p = subprocess.run([TAU, "help", "evidence", "export"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("-f,--file", p.stdout)
        self.assertEqual(p.stdout, subprocess.run([TAU, "evidence", "export", "--help"],
                                                  capture_output=True, text=True).stdout)
        p = subprocess.run([TAU, "help", "nosuch"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 125)

    def test_backend_choices_are_the_registered_engines(self):
        with tempfile.TemporaryDirectory() as home:
            for args in (["server", "--home", home], ["plan", "tau.yaml"]):
                p = subprocess.run([TAU, *args, "--backend", "nosuch"], capture_output=True,
                                   text=True, timeout=30)
                self.assertNotEqual(p.returncode, 0, args)
                self.assertIn("unknown backend 'nosuch': the registered engines are "
                              "local (processes on this machine), kubernetes (", p.stderr)
            help_text = subprocess.run([TAU, "server", "--help"], capture_output=True,
                                       text=True).stdout
            self.assertIn("local (processes on this machine)", help_text)
            self.assertIn("kubernetes: the kubeconfig context", help_text)
            # An engine's own option is refused with another engine, not ignored.
            p = subprocess.run([TAU, "server", "--home", home, "--context", "prod"],
                               capture_output=True, text=True, timeout=30)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("--context is an option of the kubernetes backend, not of local: add "
                          "--backend kubernetes", p.stderr)


class RunTest(ServerTestCase):
    def test_describe_says_an_image_is_recorded_where_the_engine_runs_none(self):
        # The local engine does not run images (its capabilities say so): the image is recorded.
        name = self.submit(job_spec("imaged", extra="runtime:\n  image: python:3.12\n"),
                           {"main.py": "print('hi')\n"})
        out = self.server.tau("describe", name, check=0).stdout
        self.assertIn("Image:       python:3.12 (recorded; not used by the local backend)\n", out)

    def test_quickstart_runs_end_to_end(self):
        p = self.server.tau("run", os.path.join(REPO, "examples/quickstart/tau.yaml"), check=0,
                            timeout=120)
        self.assertIn("done: w=2.9", p.stdout)
        self.assertIn("succeeded", p.stderr)
        out = self.server.tau("version", "--server-version", check=0).stdout
        self.assertRegex(out, r"\nserver \S+ \(api v1, backend local\)\n", out)
        runs = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)["runs"]
        self.assertEqual(len(runs), 1)
        run = runs[0]
        self.assertEqual(run["state"], "Succeeded")
        self.assertTrue(run["name"].startswith("quickstart-"))
        d = self.server.run_json(run["name"])
        self.assertEqual([e["type"] for e in d["events"]],
                         ["Submitted", "Queued", "Admitted", "Running", "Metered", "Succeeded"])
        self.assertEqual(d["attempts"][0]["exit_code"], 0)
        self.assertEqual(len(d["run"]["snapshot_digest"]), 64)
        run_dir = os.path.join(self.server.home, "runs", run["name"])
        self.assertTrue(os.path.exists(os.path.join(run_dir, "output", "model.json")))
        ckpts = os.listdir(os.path.join(run_dir, "checkpoints"))
        self.assertIn("ckpt-000030.json", ckpts)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            metrics = f.read().splitlines()
        self.assertEqual(len(metrics), 30)
        self.assertEqual(json.loads(metrics[0])["name"], "loss")

    def test_exit_code_passes_through_and_failure_is_recorded(self):
        spec = self.project(job_spec("fails"), {"main.py": "import sys\nprint('bye')\nsys.exit(3)\n"})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("bye", p.stdout)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        d = self.server.run_json(name)
        self.assertEqual(d["run"]["state"], "Failed")
        self.assertEqual(d["run"]["reason"], "UserError")
        self.assertEqual(d["run"]["exit_code"], 3)
        text = self.server.tau("describe", name, check=0).stdout
        self.assertIn("Failed", text)
        self.assertIn("Exit code:   3", text)

    def test_describe_tells_each_worker_from_the_whole_run(self):
        # The record holds totals (what quota counts); describe says what each worker gets too,
        # and in -o json, where a script reads them, the same totals.
        spec = self.project(job_spec("pair", workers=2,
                                     extra="  cpus: 1\n  memory: 256Mi\n"),
                            {"main.py": "print('ok')\n"})
        name = self.server.tau("run", "--detach", spec, check=0).stdout.strip()
        text = self.server.tau("describe", name, check=0).stdout
        self.assertIn("Resources:   2 workers, each 1 CPU, 256Mi memory "
                      "(in all 2 CPUs, 512Mi memory)", text)
        d = self.server.run_json(name)
        self.assertEqual((d["run"]["resources"]["cpu_milli"], d["run"]["resources"]["workers"]),
                         (2000, 2))
        self.server.wait_state(name, ["Succeeded", "Failed"], timeout=60)

    def test_failed_attempt_is_diagnosed_from_its_logs(self):
        code = ("import sys\nprint('loading', flush=True)\n"
                "print('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB', file=sys.stderr)\n"
                "raise ValueError('learning rate must be positive')\n")
        spec = self.project(job_spec("diag"), {"main.py": code})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 1)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        diag = self.server.run_json(name)["attempts"][0]["diagnosis"]
        self.assertEqual([e["signature"] for e in diag["evidence"]], ["cuda-oom", "python-exception"])
        self.assertEqual(diag["evidence"][1]["line"], "ValueError: learning rate must be positive")
        self.assertIn("failed while running", diag["phase"])
        text = self.server.tau("describe", name, check=0).stdout
        self.assertIn("Diagnosis of attempt 1", text)
        self.assertIn("CUDA out of memory (rank 0)", text)

    def test_an_attached_run_says_why_it_is_silent_between_attempts(self):
        # Attempt 1 exits 3; after a second's backoff attempt 2 succeeds. Off a terminal the
        # attached `tau run` says so on stderr, while stdout holds the log alone.
        code = ("import os, sys\nn = os.environ['TAU_ATTEMPT']\nprint('attempt', n, flush=True)\n"
                "sys.exit(3 if n == '1' else 0)\n")
        extra = "resilience:\n  max_retries: 1\n  retry_on: [UserError]\n  backoff_initial: 1s\n"
        spec = self.project(job_spec("retried", extra=extra), {"main.py": code})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("tau: attempt 1 failed (UserError, exit 3); retrying in 1.0s (retry 1 of 1)",
                      p.stderr)
        self.assertIn("attempt 1\n", p.stdout)
        self.assertIn("attempt 2\n", p.stdout)
        self.assertNotIn("retrying", p.stdout)

    def test_signal_death_is_128_plus_signal(self):
        spec = self.project(job_spec("sig"), {"main.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 137, p.stderr)

    def test_a_run_past_its_max_runtime_fails_with_the_code_of_its_stop(self):
        spec = job_spec("slow", entry="slow.sh").replace("  workload_kind: job\n",
                                                          "  workload_kind: job\n  max_runtime: 1s\n")
        p = self.server.tau("run", self.project(spec, {"slow.sh": "#!/bin/sh\nexec sleep 60\n"}))
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, p.stderr)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        st = json.loads(self.server.tau("status", name, "-o", "json", check=0).stdout)
        self.assertEqual((st["state"], st["reason"], st["exit_code"]), ("Failed", "Timeout", 143))
        # An ended run keeps the time it was admitted.
        self.assertIsNotNone(st["admitted"])
        self.assertLessEqual(st["admitted"], st["started"])

    def test_environment_of_an_attempt(self):
        code = ("import os, json\nkeys=['TAU_RUN_NAME','TAU_ATTEMPT','TAU_CHECKPOINT_DIR','TAU_OUTPUT_DIR',"
                "'CUDA_VISIBLE_DEVICES','MY_VAR']\nprint(json.dumps({k: os.environ.get(k) for k in keys}))\n"
                "print('CWD', os.getcwd())\n")
        spec = self.project(job_spec("envcheck", extra="runtime:\n  env:\n    MY_VAR: hello\n"),
                            {"main.py": code})
        p = self.server.tau("run", spec, check=0)
        env = json.loads(p.stdout.splitlines()[0])
        self.assertTrue(env["TAU_RUN_NAME"].startswith("envcheck-"))
        self.assertEqual(env["TAU_ATTEMPT"], "1")
        self.assertEqual(env["MY_VAR"], "hello")
        self.assertEqual(env["CUDA_VISIBLE_DEVICES"], "")
        self.assertTrue(env["TAU_CHECKPOINT_DIR"].startswith(self.server.home))
        self.assertTrue(os.path.isdir(env["TAU_OUTPUT_DIR"]))

    def test_executable_entrypoint_with_args(self):
        spec = self.project(
            job_spec("script", entry="run.sh", extra="") .replace("workload_kind: job\n",
                                                                   "workload_kind: job\n  args: [a, 'b c']\n"),
            {"run.sh": "#!/bin/sh\necho \"args:$1|$2\"\n"})
        p = self.server.tau("run", spec, check=0)
        self.assertIn("args:a|b c", p.stdout)

    def test_a_secret_printed_in_two_writes_is_masked_while_streaming(self):
        p = subprocess.run([TAU, "secret", "set", "default", "api-key"], input="hunter2-4711",
                           env=self.server.env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        code = ("import os, sys, time\nk = os.environ['K']\n"
                "sys.stdout.write('key=' + k[:5]); sys.stdout.flush()\n"
                "time.sleep(1.5)\n"  # longer than the server's log poll: the stream idles mid-secret
                "sys.stdout.write(k[5:] + '\\n')\n")
        spec = self.project(job_spec("split-secret", extra="runtime:\n  env:\n    K: SECRET:api-key\n"),
                            {"main.py": code})
        p = self.server.tau("run", spec, check=0)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("key=***", p.stdout)
        self.assertNotIn("hunte", p.stdout)

    def test_names_with_spaces_reach_the_server_as_names(self):
        p = subprocess.run([TAU, "secret", "set", "default", "api key"], input="x",
                           env=self.server.env, capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertNotIn("malformed", p.stderr)
        self.assertIn("'api key'", p.stderr)
        for args in (("queue", "show", "my queue"), ("secret", "list", "my ws"),
                     ("metrics", "nope-00000000", "a b")):
            q = self.server.tau(*args)
            self.assertNotEqual(q.returncode, 0, args)
            self.assertNotIn("malformed", q.stderr, args)

    def test_an_entrypoint_that_cannot_start_is_refused_at_submission(self):
        cases = [
            ("src", {"src/run.sh": "#!/bin/sh\necho hi\n"}, "'src' is a directory of the code"),
            ("run.sh", {"run.sh": "echo hi\n"}, "'run.sh' is not executable (mode 0644)"),
            ("no-such-tool", {"main.py": ""},
             "'no-such-tool' is neither a file of the code nor a command on the run's PATH"),
        ]
        for entry, files, message in cases:
            with self.subTest(entry=entry):
                p = self.server.tau("run", self.project(job_spec("cannot", entry=entry), files))
                self.assertEqual(p.returncode, 125, p.stdout + p.stderr)
                self.assertIn(message, p.stderr)
        self.assertEqual(json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"], [])
        # A command on PATH, and an executable script, start.
        ok = self.server.tau("run", self.project(job_spec("onpath", entry="true"), {}))
        self.assertEqual(ok.returncode, 0, ok.stderr)

    def test_an_entrypoint_missing_from_the_code_is_refused_at_submission(self):
        spec = self.project(job_spec("missing", entry="nothere.py"), {"main.py": "print('hi')\n"})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 125, p.stdout + p.stderr)
        self.assertIn("run.entrypoint: 'nothere.py' is not among the 2 file(s)", p.stderr)
        self.assertEqual(json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"], [])

    def test_what_only_a_cluster_can_do_is_refused_at_submission(self):
        digest = "@sha256:" + "0" * 64
        for extra, want in (
                (f"run:\n  source:\n    image: ghcr.io/x/src{digest}\n    path: /workspace\n",
                 "run.source: the local backend runs the code sent with the run"),
                (f"storage:\n  image_assets:\n    - name: ref\n      image: ghcr.io/x/a{digest}\n"
                 "      source_path: /opt/a\n      mount_path: /opt/ref\n",
                 "storage.image_assets: the local backend runs no container images")):
            with self.subTest(want=want):
                spec = self.project("name: cluster-only\nengine: job\nentrypoint: main.py\n" + extra,
                                    {"main.py": "print('hi')\n"})
                p = self.server.tau("run", spec)
                self.assertEqual(p.returncode, 125, p.stdout + p.stderr)
                self.assertIn(want, p.stderr)
        self.assertEqual(json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"], [])

    def test_mistyped_commands_and_options_get_a_suggestion_and_exit_125(self):
        for args, hint in ((["lsit"], "unknown command 'lsit' (did you mean 'list'?)"),
                           (["queue", "shwo"], "unknown command 'shwo' (did you mean 'show'?)"),
                           (["list", "--stat", "Failed"], "unknown option '--stat' (did you mean '--state'?)")):
            p = self.server.tau(*args)
            self.assertEqual(p.returncode, 125, (args, p.stderr))
            self.assertIn(hint, p.stderr)

    def test_detach_status_and_logs(self):
        name = self.submit(job_spec("detached"), {"main.py": "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n"})
        self.assertRegex(name, r"^detached-[0-9a-f]{8}$")
        self.server.wait_state(name, "Succeeded")
        logs = self.server.tau("logs", name, check=0).stdout
        self.assertEqual(logs.splitlines(), ["line 0", "line 1", "line 2"])
        st = json.loads(self.server.tau("status", name, "-o", "json", check=0).stdout)
        self.assertEqual(st["state"], "Succeeded")
        self.assertIn("state:", self.server.tau("status", name, "-o", "yaml", check=0).stdout)

    def test_logs_follow_streams_live(self):
        name = self.submit(job_spec("follow"), {"main.py": "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"})
        p = subprocess.Popen([TAU, "logs", "-f", name], env=self.server.env, stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        self.assertEqual(first.strip(), "tick 0")
        rest = p.stdout.read()
        p.wait(timeout=20)
        self.assertEqual(p.returncode, 0)
        self.assertIn("tick 4", rest)

    def test_waiting_commands_exit_with_the_runs_status(self):
        gate = os.path.join(self.work, "gate")
        wait_code = f"import os, sys, time\nwhile not os.path.exists({gate!r}):\n    time.sleep(0.05)\n"
        ok = self.submit(job_spec("w-ok"), {"main.py": wait_code})
        bad = self.submit(job_spec("w-bad"), {"main.py": wait_code + "sys.exit(7)\n"})
        waiters = {
            "wait": subprocess.Popen([TAU, "wait", ok, bad], env=self.server.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            "logs": subprocess.Popen([TAU, "logs", "-f", bad], env=self.server.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            "status": subprocess.Popen([TAU, "status", "-w", bad], env=self.server.env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        }
        time.sleep(0.5)
        for name, p in waiters.items():
            self.assertIsNone(p.poll(), f"tau {name} returned before the runs ended")
        open(gate, "w").close()
        out = {name: p.communicate(timeout=30) for name, p in waiters.items()}
        self.assertEqual(waiters["wait"].returncode, 7, out["wait"])
        self.assertEqual(out["wait"][0].splitlines(), [f"{ok}: Succeeded (exit 0)",
                                                       f"{bad}: Failed (exit 7)"])
        self.assertEqual(waiters["logs"].returncode, 7, out["logs"])
        self.assertEqual(waiters["status"].returncode, 7, out["status"])
        self.assertEqual(self.server.tau("wait", ok).returncode, 0)
        self.assertEqual(self.server.tau("logs", "-f", ok).returncode, 0)
        missing = self.server.tau("wait", ok, "nope-00000000")
        self.assertEqual(missing.returncode, 125)
        self.assertIn("no run named 'nope-00000000'", missing.stderr)

    def test_wait_says_each_state_the_run_reaches_on_stderr_and_quiet_says_none(self):
        gate = os.path.join(self.work, "gate")
        code = f"import os, time\nwhile not os.path.exists({gate!r}):\n    time.sleep(0.05)\n"
        run = self.submit(job_spec("w-progress"), {"main.py": code})
        self.server.wait_state(run, "Running")
        waiters = [subprocess.Popen([TAU, "wait", *flags, run], env=self.server.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for flags in ([], ["-q"])]
        # The state it found is said at once, while the run still waits for the gate.
        self.assertEqual(waiters[0].stderr.readline(), f"tau: {run}: Running\n")
        open(gate, "w").close()
        (out, err), (quiet_out, quiet_err) = (p.communicate(timeout=30) for p in waiters)
        self.assertEqual(err.splitlines(), [f"tau: {run}: Succeeded"])
        self.assertEqual(out, f"{run}: Succeeded (exit 0)\n")
        self.assertEqual((quiet_out, quiet_err), (out, ""))

    def test_a_run_that_ends_before_the_event_stream_opens_still_ends_the_waiting(self):
        # The race the waiting commands must survive: they read the run's state (running), the
        # run ends, and only then their event stream opens, whose baseline already holds the end.
        # A proxy holds each stream's request until its run has ended.
        runs = {}
        for cmd in ("wait", "status"):
            gate = os.path.join(self.work, "gate-" + cmd)
            code = f"import os, sys, time\nwhile not os.path.exists({gate!r}):\n    time.sleep(0.05)\nsys.exit(3)\n"
            runs[cmd] = (self.submit(job_spec("race-" + cmd), {"main.py": code}), gate)
        for name, _ in runs.values():
            self.server.wait_state(name, "Running")

        def hold(request_line):
            for name, gate in runs.values():
                if request_line.startswith("GET /api/v1/events?run=" + name + " "):
                    open(gate, "w").close()
                    self.server.wait_state(name, "Failed")

        proxy_path = os.path.join(self.work, "proxy.sock")
        with RequestHoldingProxy(proxy_path, os.path.join(self.server.home, "tau.sock"), hold):
            env = dict(self.server.env, TAU_SERVER="unix://" + proxy_path)
            for cmd, args in (("wait", ["wait"]), ("status", ["status", "-w"])):
                try:
                    p = subprocess.run([TAU, *args, runs[cmd][0]], env=env, capture_output=True,
                                       text=True, timeout=30)
                except subprocess.TimeoutExpired:
                    self.fail(f"tau {cmd} did not see its run end")
                self.assertEqual(p.returncode, 3, (cmd, p.stdout, p.stderr))
                self.assertIn("Failed", p.stdout, cmd)

    def test_names_that_are_no_run_names_and_log_options_out_of_range_are_told_plainly(self):
        name = self.submit(job_spec("opts"), {"main.py": "print('x')\n"})
        self.server.wait_state(name, "Succeeded")
        for args in (["status", "Upper"], ["status", "a b"], ["status", "x?y=1"], ["describe", "RUN/logs"],
                     ["cancel", "x?y=1"], ["logs", "x/y"]):
            p = self.server.tau(*args)
            self.assertEqual(p.returncode, 125, args)
            self.assertIn(f"no run named '{args[1]}'", p.stderr, args)
        p = self.server.tau("logs", name, "--attempt", "9")
        self.assertEqual((p.returncode, p.stdout), (125, ""))
        self.assertIn(f"run {name} has 1 attempt(s); --attempt takes 1 to 1", p.stderr)
        p = self.server.tau("logs", name, "--rank", "3")
        self.assertEqual((p.returncode, p.stdout), (125, ""))
        self.assertIn(f"run {name} has 1 worker(s); --rank takes 0 to 0", p.stderr)
        for bad in (["--attempt", "0"], ["--attempt", "-1"], ["--rank", "-1"]):
            p = self.server.tau("logs", name, *bad)
            self.assertNotEqual(p.returncode, 0, bad)
            self.assertIn("not in range", p.stderr, bad)

    def test_following_survives_a_server_crash_without_losing_or_repeating_lines(self):
        self.follow_through_restart(signal.SIGKILL)

    def test_following_survives_a_server_stop_without_losing_or_repeating_lines(self):
        self.follow_through_restart(signal.SIGTERM)  # its streams end cut short, not complete

    def follow_through_restart(self, sig):
        # The run waits at tick 9 for a gate the test opens after the server died: however slowly
        # the clients start (ThreadSanitizer), they are streaming when it dies, and it has not ended.
        gate = os.path.join(self.work, "gate-" + str(sig))
        code = ("import os, time\nfor i in range(40):\n    print('tick', i, flush=True)\n"
                f"    while i == 9 and not os.path.exists({gate!r}):\n        time.sleep(0.05)\n"
                "    time.sleep(0.1)\n")
        spec = self.project(job_spec("survive"), {"main.py": code})
        attached = subprocess.Popen([TAU, "run", spec], env=self.server.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        wait_for(lambda: json.loads(self.server.tau("list", "-o", "json").stdout)["runs"], what="the run")
        name = json.loads(self.server.tau("list", "-o", "json").stdout)["runs"][0]["name"]
        follower = subprocess.Popen([TAU, "logs", "-f", name], env=self.server.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        log = os.path.join(self.server.home, "runs", name, "attempts", "1", "logs", "rank-0.log")

        def printed(line):
            try:
                with open(log) as f:
                    return line in f.read()
            except FileNotFoundError:
                return False
        # Both clients are streaming when the server dies part-way through the run.
        def first_line(p):
            # From the pipe itself, a byte at a time: a buffered readline would take lines past
            # the first, which communicate() (reading the pipe) would then never see.
            line = b""
            while not line.endswith(b"\n"):
                c = os.read(p.stdout.fileno(), 1)
                if not c:
                    break
                line += c
            return line.decode()
        first = {p: first_line(p) for p in (attached, follower)}
        wait_for(lambda: printed("tick 9"), what="the run to print")
        self.server.kill(sig)  # the next command starts a local server again
        open(gate, "w").close()
        ticks = [f"tick {i}" for i in range(40)]
        for p in (attached, follower):
            out, err = p.communicate(timeout=90)
            out = first[p] + out
            self.assertEqual(p.returncode, 0, err)
            self.assertEqual(out.splitlines(), ticks, err)
            self.assertIn("lost the connection to the server", err)
            self.assertIn(f"reconnected; following {name} again", err)

    def test_tauignore_follows_gitignore_rules(self):
        lister = ("import os\nfor d, _, fs in os.walk('.'):\n    for f in fs:\n"
                  "        print(os.path.relpath(os.path.join(d, f)))\n")
        files = {"main.py": lister, "logs/x.log": "l", "src/logs/keep.txt": "k", "a.bin": "b",
                 "deep/er/z.bin": "z", "data/keep.bin": "k", "data/drop.bin": "d", "build": "a file named build",
                 "out/build/o.txt": "o", "docs/api/index.md": "i", "docs/guide.md": "g", "#notes": "n"}
        files[".tauignore"] = ("# comments and blank lines are skipped\n\n/logs/\n**/*.bin\n!data/keep.bin\n"
                               "build/\ndocs/**/*.md\n\\#notes\n")
        p = self.server.tau("run", self.project(job_spec("ignore"), files), check=0)
        got = sorted(line for line in p.stdout.splitlines() if line)
        self.assertEqual(got, sorted([".tauignore", "main.py", "tau.yaml", "src/logs/keep.txt", "data/keep.bin",
                                      "build"]))  # docs/**/*.md takes docs/guide.md too: ** may be no directory

    def test_same_file_submitted_many_times_gets_unique_names(self):
        spec = self.project(job_spec("many"), {"main.py": "print('x')\n"})
        names = {self.server.tau("run", "-d", spec, check=0).stdout.strip() for _ in range(5)}
        self.assertEqual(len(names), 5)
        for n in names:
            self.server.wait_state(n, "Succeeded")

    def test_unknown_run_is_a_clear_error(self):
        p = self.server.tau("status", "no-such-run")
        self.assertEqual(p.returncode, 125)
        self.assertIn("no run named 'no-such-run'", p.stderr)

    def test_invalid_spec_is_refused_with_position(self):
        spec = self.project("schema_version: 1\nname: Bad_Name\nrun:\n  entrypoint: x.py\n", {})
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 1)
        self.assertIn("tau.yaml:2:7: error:", p.stderr)

    def test_gpu_run_refused_without_gpus(self):
        p = self.server.tau("run", os.path.join(REPO, "examples/gpu-quickstart/tau.yaml"))
        self.assertEqual(p.returncode, 125)
        self.assertIn("this machine has none", p.stderr)
        self.assertIn("compute.gpus: 0", p.stderr)
        self.assertEqual(json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["total"], 0)

    def test_runs_larger_than_the_machine_are_refused_in_plain_units(self):
        p = self.server.tau("run", self.project(job_spec("huge", extra="  memory: 100Ti\n"), {"main.py": ""}))
        self.assertEqual(p.returncode, 125)
        self.assertRegex(p.stderr, r"asks for 100 TiB of memory in all but this machine has [0-9.]+ [GMT]iB")
        p = self.server.tau("run", self.project(job_spec("many", extra="  cpus: 4096500m\n"), {"main.py": ""}))
        self.assertEqual(p.returncode, 125)
        self.assertRegex(p.stderr, r"asks for 4096.5 CPUs in all but this machine has [0-9]+")
        # Where the value was set: the file's line, or the --set.
        self.assertRegex(p.stderr, r"tau\.yaml:9:3: error: compute\.cpus: this run asks")
        spec = self.project(job_spec("small", extra="  memory: 1Gi\n"), {"main.py": ""})
        p = self.server.tau("run", spec, "--set", "compute.memory=100Ti")
        self.assertEqual(p.returncode, 125)
        self.assertIn("--set compute.memory=100Ti: error: compute.memory: this run asks for 100 TiB",
                      p.stderr)


class GangTest(ServerTestCase):
    def test_gang_gets_ranks_and_rendezvous(self):
        code = ("import os, json\nout=os.environ['TAU_OUTPUT_DIR']\nr=os.environ['RANK']\n"
                "json.dump({k: os.environ[k] for k in ['RANK','LOCAL_RANK','WORLD_SIZE','MASTER_ADDR','MASTER_PORT']},"
                " open(os.path.join(out, 'rank-'+r+'.json'),'w'))\n")
        name = self.submit(job_spec("gang", workers=3), {"main.py": code})
        self.server.wait_state(name, "Succeeded")
        out = os.path.join(self.server.home, "runs", name, "output")
        ranks = [json.load(open(os.path.join(out, f"rank-{r}.json"))) for r in range(3)]
        self.assertEqual([x["RANK"] for x in ranks], ["0", "1", "2"])
        self.assertEqual({x["WORLD_SIZE"] for x in ranks}, {"3"})
        self.assertEqual(len({x["MASTER_PORT"] for x in ranks}), 1)
        self.assertEqual(ranks[0]["MASTER_ADDR"], "127.0.0.1")

    def test_attached_gang_failure_points_at_each_ranks_log(self):
        code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(4)\ntime.sleep(60)\n"
        p = self.server.tau("run", self.project(job_spec("gangtold", workers=2), {"main.py": code}))
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("this terminal showed rank 0; each rank's log: tau logs gangtold-", p.stderr)

    def test_one_worker_dies_and_the_gang_is_torn_down(self):
        code = ("import os, sys, time\nr=int(os.environ['RANK'])\n"
                "open(os.path.join(os.environ['TAU_OUTPUT_DIR'], 'pid-%d' % r), 'w').write(str(os.getpid()))\n"
                "if r == 1:\n    time.sleep(0.5)\n    sys.exit(4)\ntime.sleep(60)\n")
        name = self.submit(job_spec("gangfail", workers=3), {"main.py": code})
        d = self.server.wait_state(name, "Failed", timeout=30)
        self.assertEqual(d["run"]["exit_code"], 4)
        self.assertIn("worker 1", d["run"]["message"])
        out = os.path.join(self.server.home, "runs", name, "output")
        for r in range(3):
            pid = int(open(os.path.join(out, f"pid-{r}")).read())
            self.assertFalse(pid_alive(pid), f"rank {r} (pid {pid}) survived the teardown")


class CancelTest(ServerTestCase):
    def test_cancel_running_run_leaves_no_process(self):
        code = ("import os, subprocess, time\nout=os.environ['TAU_OUTPUT_DIR']\n"
                "child = subprocess.Popen(['sleep', '1000'])\n"
                "open(os.path.join(out, 'pids'), 'w').write('%d %d' % (os.getpid(), child.pid))\n"
                "time.sleep(1000)\n")
        name = self.submit(job_spec("cancelme"), {"main.py": code})
        pids_file = os.path.join(self.server.home, "runs", name, "output", "pids")
        wait_for(lambda: os.path.exists(pids_file) and open(pids_file).read(), what="the pid file")
        pids = [int(x) for x in open(pids_file).read().split()]
        self.server.tau("cancel", name, check=0)
        d = self.server.wait_state(name, "Cancelled", timeout=15)
        self.assertEqual(d["run"]["reason"], "Cancelled")
        for pid in pids:
            wait_for(lambda: not pid_alive(pid), timeout=5, what=f"pid {pid} to exit")
        self.assertIn("CancelRequested", [e["type"] for e in d["events"]])
        # Cancelling again is a clear error, not a crash.
        again = self.server.tau("cancel", name)
        self.assertNotEqual(again.returncode, 0)
        self.assertIn("already finished", again.stderr)

    def test_killed_client_does_not_stop_or_orphan_the_run(self):
        spec = self.project(job_spec("survivor"), {"main.py": "import time\nprint('start', flush=True)\ntime.sleep(1.5)\nprint('end')\n"})
        client = subprocess.Popen([TAU, "run", spec], env=self.server.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        wait_for(lambda: json.loads(self.server.tau("list", "-o", "json").stdout)["runs"], what="the run")
        name = json.loads(self.server.tau("list", "-o", "json").stdout)["runs"][0]["name"]
        self.server.wait_state(name, "Running")
        client.kill()
        client.wait()
        d = self.server.wait_state(name, "Succeeded", timeout=20)
        self.assertIn("end", self.server.tau("logs", name, check=0).stdout)
        self.assertEqual(d["attempts"][0]["state"], "Finished")


class GpuPlacementTest(ServerTestCase):
    gpus = 2

    def test_runs_get_distinct_gpus_and_the_third_waits_with_a_reason(self):
        code = ("import os, time\nprint('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
                "while not os.path.exists(os.path.join(os.environ['TAU_OUTPUT_DIR'], '..', '..', '..', 'release')):\n"
                "    time.sleep(0.05)\n")
        spec = self.project(job_spec("gpujob", gpus=1), {"main.py": code})
        a = self.server.tau("run", "-d", spec, check=0).stdout.strip()
        b = self.server.tau("run", "-d", spec, check=0).stdout.strip()
        self.server.wait_state(a, "Running")
        self.server.wait_state(b, "Running")
        c = self.server.tau("run", "-d", spec, check=0).stdout.strip()
        st = json.loads(self.server.tau("status", c, "-o", "json", check=0).stdout)
        self.assertEqual(st["state"], "Queued")
        wait_for(lambda: json.loads(self.server.tau("status", c, "-o", "json").stdout)["pending"].get("position") == 1,
                 what="a queue position")
        st = json.loads(self.server.tau("status", c, "-o", "json", check=0).stdout)
        self.assertIn("needs 1 nvidia.com/gpu; queue default has 0 of 2 free", st["pending"]["reason"])
        table = self.server.tau("status", c, check=0).stdout
        self.assertIn("position 1", table)
        wait_for(lambda: "CVD=" in self.server.tau("logs", a).stdout, what="run a's output")
        wait_for(lambda: "CVD=" in self.server.tau("logs", b).stdout, what="run b's output")
        cvd = {self.server.tau("logs", n).stdout.strip() for n in (a, b)}
        self.assertEqual(cvd, {"CVD=0", "CVD=1"})
        open(os.path.join(self.server.home, "release"), "w").close()
        for n in (a, b, c):
            self.server.wait_state(n, "Succeeded")

    def test_snapshot_is_taken_at_submit_time(self):
        release = os.path.join(self.server.home, "release")
        blocker = self.project(job_spec("blocker", gpus=1, workers=2), {"main.py": (
            "import os, time\nwhile not os.path.exists(%r):\n    time.sleep(0.02)\n" % release)})
        first = self.server.tau("run", "-d", blocker, check=0).stdout.strip()
        self.server.wait_state(first, "Running")
        spec = self.project(job_spec("snap", gpus=1), {"main.py": "print('version 1')\n"})
        queued = self.server.tau("run", "-d", spec, check=0).stdout.strip()
        with open(os.path.join(os.path.dirname(spec), "main.py"), "w") as f:
            f.write("print('version 2')\n")
        self.assertEqual(self.server.run_json(queued)["run"]["state"], "Queued")
        open(release, "w").close()
        self.server.wait_state(queued, "Succeeded", timeout=20)
        self.assertEqual(self.server.tau("logs", queued).stdout.strip(), "version 1")

    def test_multi_gpu_single_worker_needs_torchrun(self):
        if shutil.which("torchrun"):
            self.skipTest("torchrun is installed here")
        spec = self.project(job_spec("torchless", gpus=2), {"main.py": "print('hi')\n"})
        # Without torchrun the run could never start: refused at submission, before it is admitted
        # (and could preempt others), never a silent CPU run.
        p = self.server.tau("run", spec)
        self.assertEqual(p.returncode, 125, p.stderr)
        self.assertIn("compute.gpus: 2 GPUs per worker are launched with torchrun", p.stderr)
        self.assertEqual(json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"], [])
        # validate and plan say so first, as a warning at the field (the spec itself is valid).
        for command in ("validate", "plan"):
            p = self.server.tau(command, spec)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertRegex(p.stderr, r"tau\.yaml:7:3: warning: compute\.gpus: 2 GPUs per worker are "
                             r"launched with torchrun.*\(tau run would refuse it on the local backend\)")

    def test_gpus_command(self):
        inv = json.loads(self.server.tau("gpus", "-o", "json", check=0).stdout)
        self.assertEqual(len(inv["devices"]), 2)
        self.assertEqual([d["health"]["verdict"] for d in inv["devices"]], ["Healthy", "Healthy"])
        self.assertIn("Fake H200", self.server.tau("gpus", check=0).stdout)
        check = self.server.tau("health", "check", check=0)
        self.assertEqual(len([l for l in check.stdout.splitlines() if "Healthy" in l]), 2)


class RobustnessTest(ServerTestCase):
    def sleeper(self, name):
        """Submits a run whose worker records its pid and sleeps; returns (run, worker pid)."""
        code = ("import os, time\nopen(os.path.join(os.environ['TAU_OUTPUT_DIR'], 'pid'), 'w').write(str(os.getpid()))\n"
                "time.sleep(60)\n")
        run = self.submit(job_spec(name), {"main.py": code})
        self.server.wait_state(run, "Running")
        pid_file = os.path.join(self.server.home, "runs", run, "output", "pid")

        def worker():
            try:
                with open(pid_file) as f:
                    return int(f.read() or 0)
            except FileNotFoundError:
                return 0
        return run, wait_for(worker, what="the pid file")

    def raw(self, data):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(os.path.join(self.server.home, "tau.sock"))
        s.sendall(data)
        reply = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
                head, sep, body = reply.partition(b"\r\n\r\n")
                length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if sep and length and len(body) >= length[0]:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        s.close()
        return reply

    def test_malformed_requests_never_take_the_server_down(self):
        bad = [
            b"garbage\r\n\r\n",
            b"\x00\xff\xfe" * 1000,
            b"POST /api/v1/runs HTTP/1.1\r\nContent-Length: 5\r\n\r\n{bad}",
            b"POST /api/v1/runs HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]",
            b'POST /api/v1/runs HTTP/1.1\r\nContent-Length: 24\r\n\r\n{"spec": {"yaml": 1234}}',
            b'POST /api/v1/runs HTTP/1.1\r\nContent-Length: 64\r\n\r\n{"spec":{"yaml":"name: x"},"code":{"files":[{"path":"../x"}]}}',
            b"POST /api/v1/runs HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{",
            b"GET /api/v1/runs?limit=-5 HTTP/1.1\r\n\r\n",
            b"GET /api/v1/runs/..%2f..%2fetc HTTP/1.1\r\n\r\n",
            b"GET /api/v1/nothing HTTP/1.1\r\n\r\n",
            b"GET /api/v1/runs/x/logs?attempt=abc HTTP/1.1\r\n\r\n",
        ]
        for data in bad:
            self.raw(data)
        reply = self.raw(b"GET /api/v1/runs?limit=-5 HTTP/1.1\r\n\r\n")
        self.assertIn(b"400", reply.split(b"\r\n")[0])
        self.assertIn(b"limit", reply)
        reply = self.raw(b"GET /api/v1/nothing HTTP/1.1\r\n\r\n")
        self.assertIn(b"404", reply.split(b"\r\n")[0])
        path_escape = json.dumps({"spec": {"yaml": job_spec("esc")},
                                  "code": {"files": [{"path": "../evil", "data": ""}]}}).encode()
        reply = self.raw(b"POST /api/v1/runs HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(path_escape) + path_escape)
        self.assertIn(b"400", reply.split(b"\r\n")[0])
        self.assertIn(b"not a plain relative path", reply)
        # Still serving.
        self.assertEqual(self.server.tau("list", "-o", "json", check=0).returncode, 0)
        self.assertIsNone(self.server.proc.poll())

    def test_peer_uid_header_cannot_be_forged(self):
        # The header is set by the server from SO_PEERCRED; a client-sent value is dropped, so this request
        # is served like any other.
        reply = self.raw(b"GET /api/v1/healthz HTTP/1.1\r\nX-Tau-Peer-Uid: 0\r\n\r\n")
        self.assertIn(b"200", reply.split(b"\r\n")[0])

    def test_processes_that_left_the_attempt_die_with_its_killed_supervisor(self):
        # One child escapes into a session of its own (setsid), one is double-forked (reparented,
        # it keeps the process group); both outlive their parent shell. SIGKILL of the attempt's
        # supervisor must not leave them running (on a GPU box they would keep their GPU).
        script = ("#!/bin/sh\n"
                  "setsid sleep 1000 & echo $! > \"$TAU_OUTPUT_DIR/escaped\"\n"
                  "(sleep 1000 & echo $! > \"$TAU_OUTPUT_DIR/double\")\n"
                  "echo started\n"
                  "wait\n")
        name = self.submit(job_spec("leaky", entry="leak.sh"), {"leak.sh": script})
        self.server.wait_state(name, "Running")
        out = os.path.join(self.server.home, "runs", name, "output")

        def pids():
            try:
                found = []
                for f in ("escaped", "double"):
                    with open(os.path.join(out, f)) as text:
                        found.append(int(text.read()))
                return found
            except (OSError, ValueError):
                return None

        children = wait_for(pids, what="the children's pids")
        for pid in children:
            self.assertTrue(pid_alive(pid))
        shim = self.server.run_json(name)["attempts"][0]["supervisor_pid"]
        os.kill(shim, signal.SIGKILL)
        d = self.server.wait_state(name, ["Failed", "Queued", "Succeeded"], timeout=20)
        self.assertEqual(d["attempts"][0]["reason"], "NodeLost", d["attempts"][0])
        # The server's sweep after the supervisor's death: well within the stop grace (1 s).
        wait_for(lambda: not any(pid_alive(p) for p in children), timeout=5,
                 what="the escaped and double-forked children to be killed")

    def test_server_restart_readopts_running_attempts(self):
        name = self.submit(job_spec("readopt"), {"main.py": "import time\nprint('before', flush=True)\ntime.sleep(2)\nprint('after', flush=True)\n"})
        self.server.wait_state(name, "Running")
        # The shim was forked by the server's zygote, which goes when the server goes; the shim stays.
        shim = self.server.run_json(name)["attempts"][0]["supervisor_pid"]
        zygote = proc_stat(shim)["ppid"]
        self.assertEqual(open(f"/proc/{zygote}/cmdline", "rb").read().split(b"\0")[1], b"__zygote")
        self.assertEqual(proc_stat(zygote)["ppid"], self.server.proc.pid)
        self.server.kill(signal.SIGKILL)
        wait_for(lambda: not pid_alive(zygote), what="the zygote to exit")
        self.assertTrue(pid_alive(shim))
        self.server.start()
        d = self.server.wait_state(name, "Succeeded", timeout=20)
        self.assertEqual(len(d["attempts"]), 1)
        self.assertEqual(self.server.tau("logs", name).stdout.split(), ["before", "after"])

    def zygotes(self):
        """The server's zygote children."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if proc_stat(entry)["ppid"] != self.server.proc.pid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[1:2] == [b"__zygote"]:
                        found.append(int(entry))
            except OSError:
                pass
        return found

    def test_a_dead_zygote_is_replaced(self):
        [zygote] = wait_for(self.zygotes, what="the zygote")
        os.kill(zygote, signal.SIGKILL)
        wait_for(lambda: not pid_alive(zygote), what="the zygote to die")
        # The first attempt after the loss finds the zygote gone and still runs (its shim exec'd)...
        first = self.submit(job_spec("after-loss"), {"main.py": "print('ran')\n"})
        self.assertEqual(self.server.wait_state(first, "Succeeded")["run"]["state"], "Succeeded")
        self.assertEqual(self.server.tau("logs", first).stdout.split(), ["ran"])
        # ... and another zygote forks the shims from then on.
        [replacement] = wait_for(self.zygotes, what="another zygote")
        self.assertNotEqual(replacement, zygote)
        self.assertIn("started another zygote", self.server.server_log())
        second = self.submit(job_spec("forked-again"), {"main.py": "import time\ntime.sleep(30)\n"})
        self.server.wait_state(second, "Running")
        shim = self.server.run_json(second)["attempts"][0]["supervisor_pid"]
        self.assertEqual(proc_stat(shim)["ppid"], replacement)
        self.server.tau("cancel", second)

    def test_cancel_ends_a_run_whose_supervisor_is_stopped(self):
        name, worker = self.sleeper("frozen")
        shim = self.server.run_json(name)["attempts"][0]["supervisor_pid"]
        os.kill(shim, signal.SIGSTOP)
        try:
            self.server.tau("cancel", name)
            # The grace period (1 s here) and the server's margin (5 s) pass, then the server kills
            # the supervisor and the worker itself.
            d = self.server.wait_state(name, "Cancelled", timeout=20)
        finally:
            if pid_alive(shim):
                os.kill(shim, signal.SIGCONT)
        self.assertEqual(d["attempts"][0]["reason"], "Cancelled")
        forced = [e for e in d["events"] if e["type"] == "StopForced"]
        self.assertEqual(len(forced), 1, d["events"])
        self.assertIn(f"pid {shim}", forced[0]["message"])
        wait_for(lambda: not pid_alive(worker), what="the worker to be killed")

    def test_attempt_lost_while_server_down_is_node_lost(self):
        name, worker = self.sleeper("lost")
        attempt = self.server.run_json(name)["attempts"][0]
        self.server.kill(signal.SIGKILL)
        os.kill(attempt["supervisor_pid"], signal.SIGKILL)  # the machine "lost" the attempt
        wait_for(lambda: not pid_alive(worker), what="the worker to die with its supervisor")
        self.server.start()
        d = self.server.wait_state(name, "Failed", timeout=20)
        self.assertEqual(d["run"]["reason"], "NodeLost")


class AutostartTest(unittest.TestCase):
    def test_first_command_starts_a_local_server(self):
        server = TauServer()  # not started: the CLI must start one
        try:
            spec_dir = os.path.join(server.home, "proj")
            os.makedirs(spec_dir)
            with open(os.path.join(spec_dir, "tau.yaml"), "w") as f:
                f.write(job_spec("auto"))
            with open(os.path.join(spec_dir, "main.py"), "w") as f:
                f.write("print('auto ok')\n")
            p = server.tau("run", os.path.join(spec_dir, "tau.yaml"), check=0, timeout=60)
            self.assertIn("auto ok", p.stdout)
            self.assertTrue(os.path.exists(os.path.join(server.home, "tau.sock")))
            self.assertTrue(os.path.exists(os.path.join(server.home, "server.pid")))
            sock_mode = os.stat(os.path.join(server.home, "tau.sock")).st_mode & 0o777
            self.assertEqual(sock_mode, 0o600)
        finally:
            server.stop()


class RetryTest(ServerTestCase):
    RESILIENT = ("resilience:\n  max_retries: 2\n  retry_on: [UserError]\n  backoff_initial: 100ms\n"
                 "  backoff_max: 1s\n")

    def test_retry_resumes_from_the_newest_complete_checkpoint(self):
        code = (
            "import os, sys\n"
            "ck = os.environ['TAU_CHECKPOINT_DIR']\n"
            "attempt = int(os.environ['TAU_ATTEMPT'])\n"
            "print('attempt', attempt, 'reason', os.environ.get('TAU_FAILURE_REASON'),"
            " 'resume', os.path.basename(os.environ.get('TAU_RESUME_FROM', '')), flush=True)\n"
            "if attempt == 1:\n"
            "    open(os.path.join(ck, 'ckpt-1.json.tmp'), 'w').write('{}')\n"
            "    os.rename(os.path.join(ck, 'ckpt-1.json.tmp'), os.path.join(ck, 'ckpt-1.json'))\n"
            "    open(os.path.join(ck, 'ckpt-2.json.tmp'), 'w').write('{half')\n"
            "    sys.exit(7)\n"
            "print('resumed ok')\n")
        spec = self.project(job_spec("resume", extra=self.RESILIENT), {"main.py": code})
        p = self.server.tau("run", spec, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("attempt 1 reason None resume ", p.stdout)
        self.assertIn("[tau] --- attempt 2 ---", p.stdout)
        self.assertIn("attempt 2 reason UserError resume ckpt-1.json", p.stdout)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        d = self.server.run_json(name)
        self.assertEqual(d["run"]["state"], "Succeeded")
        self.assertEqual([a["reason"] for a in d["attempts"]], ["UserError", "Succeeded"])
        self.assertEqual([a["exit_code"] for a in d["attempts"]], [7, 0])
        types = [e["type"] for e in d["events"]]
        self.assertEqual(types.count("Running"), 2)
        self.assertIn("Retrying", types)
        # Never two attempts at once: the second started after the first ended.
        self.assertLessEqual(d["attempts"][0]["ended"], d["attempts"][1]["started"])

    def test_retries_stop_at_max_retries(self):
        spec = self.project(job_spec("always-fails", extra=self.RESILIENT),
                            {"main.py": "import sys\nsys.exit(3)\n"})
        p = self.server.tau("run", spec, timeout=60)
        self.assertEqual(p.returncode, 3, p.stderr)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        d = self.server.run_json(name)
        self.assertEqual(len(d["attempts"]), 3)
        self.assertEqual(d["run"]["reason"], "UserError")
        self.assertIn("max_retries (2) is used up", d["run"]["message"])

    def test_no_retry_starts_after_max_retry_duration(self):
        # Backoffs of 1 s, then 2 s: the second retry would start about 3 s after the first start.
        extra = ("resilience:\n  max_retries: 5\n  retry_on: [UserError]\n  backoff_initial: 1s\n"
                 "  max_retry_duration: 2s\n")
        spec = self.project(job_spec("window", extra=extra), {"main.py": "import sys\nsys.exit(4)\n"})
        p = self.server.tau("run", spec, timeout=60)
        self.assertEqual(p.returncode, 4, p.stderr)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        d = self.server.run_json(name)
        self.assertEqual(len(d["attempts"]), 2, d["attempts"])
        first = datetime.datetime.fromisoformat(d["attempts"][0]["started"])
        for a in d["attempts"]:
            self.assertLessEqual((datetime.datetime.fromisoformat(a["started"]) - first).total_seconds(), 2.0)
        # Either the next backoff would end past the window, or (a slow machine) the window has
        # passed already when the second attempt ends: both say which limit stopped the retries.
        self.assertIn("resilience.max_retry_duration (2.0s)", d["run"]["message"])

    def test_a_class_not_in_retry_on_is_not_retried(self):
        extra = "resilience:\n  max_retries: 3\n  backoff_initial: 100ms\n"
        spec = self.project(job_spec("user-bug", extra=extra), {"main.py": "import sys\nsys.exit(5)\n"})
        p = self.server.tau("run", spec, timeout=60)
        self.assertEqual(p.returncode, 5)
        name = json.loads(self.server.tau("list", "--all", "-o", "json").stdout)["runs"][0]["name"]
        d = self.server.run_json(name)
        self.assertEqual(len(d["attempts"]), 1)
        self.assertIn("UserError is not in resilience.retry_on", d["run"]["message"])

    def test_node_lost_attempt_is_retried_after_a_server_restart(self):
        extra = "resilience:\n  max_retries: 1\n  backoff_initial: 100ms\n"
        code = ("import os, time\nif os.environ['TAU_ATTEMPT'] == '1':\n"
                "    open(os.path.join(os.environ['TAU_OUTPUT_DIR'], 'pid'), 'w').write(str(os.getpid()))\n"
                "    time.sleep(60)\nprint('second attempt', os.environ['TAU_FAILURE_REASON'])\n")
        name = self.submit(job_spec("lost-retry", extra=extra), {"main.py": code})
        pid_file = os.path.join(self.server.home, "runs", name, "output", "pid")
        wait_for(lambda: os.path.exists(pid_file) and open(pid_file).read(), what="the pid file")
        attempt = self.server.run_json(name)["attempts"][0]
        self.server.kill(signal.SIGKILL)
        os.kill(attempt["supervisor_pid"], signal.SIGKILL)
        wait_for(lambda: not pid_alive(int(open(pid_file).read())), what="the worker to die")
        self.server.start()
        d = self.server.wait_state(name, "Succeeded", timeout=30)
        self.assertEqual([a["reason"] for a in d["attempts"]], ["NodeLost", "Succeeded"])
        self.assertIn("second attempt NodeLost", self.server.tau("logs", name).stdout)


def cgroup_v2_memory_delegated():
    """True where the shim can put an attempt in its own cgroup v2 with a memory limit."""
    try:
        if "memory" not in open("/sys/fs/cgroup/cgroup.controllers").read().split():
            return False
        rel = open("/proc/self/cgroup").read().strip().split("::", 1)[1]
        parent = os.path.join("/sys/fs/cgroup", rel.lstrip("/"))
        return ("memory" in open(os.path.join(parent, "cgroup.subtree_control")).read().split()
                and os.access(parent, os.W_OK))
    except (OSError, IndexError):
        return False


@unittest.skipUnless(cgroup_v2_memory_delegated(),
                     "needs cgroup v2 with the memory controller delegated (not on this machine)")
class OomTest(ServerTestCase):
    def test_memory_hog_is_oomkilled_and_not_retried_unless_listed(self):
        hog = "b = []\nwhile True:\n    b.append(bytearray(16 << 20))\n"
        extra = "resilience:\n  max_retries: 2\n  backoff_initial: 100ms\n"
        spec = job_spec("hog", extra=extra).replace("  workers: 1\n", "  workers: 1\n  memory: 128Mi\n")
        name = self.submit(spec, {"main.py": hog})
        d = self.server.wait_state(name, "Failed", timeout=60)
        self.assertEqual(d["run"]["reason"], "OOMKilled")
        self.assertEqual(len(d["attempts"]), 1)  # OOMKilled is not in the default retry_on
        self.assertIn("OOMKilled is not in resilience.retry_on", d["run"]["message"])
        p = self.server.tau("resume", name)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--force", p.stderr)
        self.server.tau("resume", name, "--force", check=0)


class ManualControlTest(ServerTestCase):
    def test_rerun_reproduces_config_and_code(self):
        spec = self.project(job_spec("again"), {"main.py": "print('code v1')\n"})
        first = self.server.tau("run", "-d", spec, check=0).stdout.strip()
        self.server.wait_state(first, "Succeeded")
        with open(os.path.join(os.path.dirname(spec), "main.py"), "w") as f:
            f.write("print('code v2')\n")
        second = self.server.tau("rerun", first, check=0).stdout.strip()
        self.assertNotEqual(second, first)
        self.assertTrue(second.startswith("again-"))
        d = self.server.wait_state(second, "Succeeded")
        one = self.server.run_json(first)["run"]
        self.assertEqual(d["run"]["config_hash"], one["config_hash"])
        self.assertEqual(d["run"]["snapshot_digest"], one["snapshot_digest"])
        self.assertEqual(d["events"][0]["message"], "rerun of " + first)
        self.assertEqual(self.server.tau("logs", second).stdout.strip(), "code v1")
        self.assertIn("no run named", self.server.tau("rerun", "nope-0000").stderr)

    def test_resume_from_a_chosen_checkpoint(self):
        code = ("import os, sys\nck = os.environ['TAU_CHECKPOINT_DIR']\n"
                "if os.environ['TAU_ATTEMPT'] == '1':\n"
                "    for n in ('ckpt-a.json', 'ckpt-b.json', 'ckpt-c.json.tmp'):\n"
                "        open(os.path.join(ck, n), 'w').write('{}')\n"
                "    os.makedirs(os.path.join(ck, 'step-9'))\n"
                "    sys.exit(3)\n"
                "print('resumed from', os.path.basename(os.environ['TAU_RESUME_FROM']),"
                " 'after', os.environ['TAU_FAILURE_REASON'])\n")
        name = self.submit(job_spec("manual"), {"main.py": code})
        self.server.wait_state(name, "Failed")
        escape = self.server.tau("resume", name, "--from", "../../../etc/passwd")
        self.assertEqual(escape.returncode, 125)
        self.assertIn("not in run", escape.stderr)
        # Half-written checkpoints, by the protocol, are refused with the reason.
        tmp = self.server.tau("resume", name, "--from", "ckpt-c.json.tmp")
        self.assertEqual(tmp.returncode, 125)
        self.assertIn("is not complete: 'ckpt-c.json.tmp' is a temporary name", tmp.stderr)
        unfinished = self.server.tau("resume", name, "--from", "step-9")
        self.assertEqual(unfinished.returncode, 125)
        self.assertIn("step-9 has no COMPLETE file", unfinished.stderr)
        self.server.tau("resume", name, "--from", "ckpt-a.json", check=0)
        d = self.server.wait_state(name, "Succeeded")
        self.assertEqual(len(d["attempts"]), 2)
        self.assertIn("Resumed", [e["type"] for e in d["events"]])
        self.assertIn("resumed from ckpt-a.json after UserError",
                      self.server.tau("logs", name, "--attempt", "2").stdout)
        again = self.server.tau("resume", name)
        self.assertEqual(again.returncode, 125)
        self.assertIn("tau rerun", again.stderr)


if __name__ == "__main__":
    unittest.main()
