"""Every command's -o: each command that has one is run with every format it offers, and its output
is read back in that format (JSON and YAML parse to the same kind of object, a table is text and not
data, `name` gives the names the JSON has, `wide` has more columns than `table`). A format a command
does not offer is refused, naming the ones it does. The commands are found by walking `tau --help`,
so a new command with -o fails this test until it is listed here."""
import json
import os
import re
import unittest

import yaml

import subprocess

from harness import TAU, ServerTestCase

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

FORMATS = ("table", "wide", "name", "json", "yaml")


def help_text(path):
    return subprocess.run([TAU, *path, "--help"], capture_output=True, text=True, timeout=30).stdout


def walk(path=()):
    """(path, formats) of every command under `path` whose -o is an output format."""
    text = help_text(path)
    found = []
    m = re.search(r"-o,--output TEXT\s+Output format: ([a-z, ]+?) \(default", text)
    if m:
        found.append((path, re.split(r", | or ", m.group(1))))
    sub = text.split("Subcommands:\n", 1)
    if len(sub) == 2:
        for line in sub[1].splitlines():
            name = re.match(r"^  ([a-z][a-z-]*)\s", line)
            if name:
                found += walk(path + (name.group(1),))
    return found


class OutputTest(ServerTestCase):
    def setUp(self):
        super().setUp()
        self.spec = self.project(
            "schema_version: 1\nname: out\nrun:\n  entrypoint: main.py\n  workload_kind: job\n",
            {"main.py": "import json, os\n"
                        "open(os.environ['TAU_METRICS_FILE'], 'a').write("
                        "json.dumps({'name': 'loss', 'step': 1, 'value': 0.5}) + '\\n')\n"})
        self.run_name = self.server.tau("run", "--detach", self.spec, check=0).stdout.strip()
        self.server.wait_state(self.run_name, "Succeeded")
        p = self.server.tau("secret", "set", "default", "api-key", input="v\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.platform = os.path.join(REPO, "tests/data/policy/valid/minimal.yaml")
        # A token, for `admin token list`.
        self.server.tau("admin", "token", "create", "--description", "output", check=0)

    def args(self, path):
        """The arguments each command with -o is run with."""
        scenario = os.path.join(REPO, "tests/data/admission/fair_sharing_order.yaml")
        if path == ("compare",):
            # A second run, made here so that the other tests see one run.
            other = self.server.tau("run", "--detach", self.spec, check=0).stdout.strip()
            self.server.wait_state(other, "Succeeded")
            return [self.run_name, other]
        if path == ("workflow", "status"):
            wf = os.path.join(os.path.dirname(self.spec), "wf.yaml")
            with open(wf, "w") as f:
                f.write("kind: workflow\nname: out\nstages:\n  - {name: only, spec: tau.yaml}\n")
            run = self.server.tau("run", "--detach", wf, check=0).stdout.split()[0]
            self.server.wait_state(run, "Succeeded")
            return [run.rsplit("-", 1)[0]]
        if path in (("serve", "list"), ("serve", "status")):
            if self.server.tau("serve", "status", "out").returncode != 0:
                spec = self.project(
                    "schema_version: 1\nkind: service\nname: out\nrun:\n  entrypoint: app.py\n"
                    "  workload_kind: job\nserve:\n  replicas: 0\n", {"app.py": "pass\n"})
                self.server.tau("serve", "deploy", spec, check=0)
            return ["out"] if path == ("serve", "status") else []
        return {
            ("version",): [],
            ("validate",): [self.spec],
            ("schema",): [],
            ("list",): ["--all"],
            ("status",): [self.run_name],
            ("top",): ["--once"],
            ("describe",): [self.run_name],
            ("evidence",): [self.run_name],
            ("gpus",): [],
            ("platform", "validate"): [self.platform],
            ("platform", "show"): [],
            ("queues",): [],
            ("usage",): [],
            ("queue", "show"): ["default"],
            ("explain",): [self.spec],
            ("plan",): [self.spec],
            ("health", "check"): [],
            ("admission", "simulate"): [scenario],
            ("whoami",): [],
            ("admin", "token", "list"): [],
            ("admin", "audit"): [],
            ("secret", "list"): ["default"],
            ("metrics",): [self.run_name, "loss"],
            ("artifacts",): [self.run_name],
        }[path]

    # What `-o name` must print: the names the JSON output has.
    NAMES = {
        ("list",): lambda d: [r["name"] for r in d["runs"]],
        ("queues",): lambda d: [q["name"] for q in d["queues"]],
        ("admin", "token", "list"): lambda d: [t["id"] for t in d["tokens"]],
        ("secret", "list"): lambda d: [s["key"] for s in d["secrets"]],
    }

    def test_every_command_with_every_format(self):
        commands = walk()
        self.assertGreater(len(commands), 15)
        for path, formats in commands:
            with self.subTest(command=" ".join(path)):
                args = self.args(path)  # KeyError: a new command with -o, not listed above
                out = {}
                for fmt in formats:
                    p = self.server.tau(*path, *args, "-o", fmt)
                    # health check's exit says whether the GPUs are healthy (the fake ones are).
                    self.assertEqual(p.returncode, 0, f"-o {fmt}: {p.stderr}")
                    self.assertTrue(p.stdout.strip(), f"-o {fmt} printed nothing")
                    out[fmt] = p.stdout
                    if fmt == "json":
                        json.loads(p.stdout)
                    elif fmt == "yaml":
                        yaml.safe_load(p.stdout)
                    elif fmt == "jsonl":
                        for line in p.stdout.splitlines():
                            json.loads(line)
                    elif fmt in ("table", "wide") and path != ("plan",):
                        with self.assertRaises(ValueError, msg=f"-o {fmt} printed JSON"):
                            json.loads(p.stdout)
                if "json" in out and "yaml" in out:
                    j, y = json.loads(out["json"]), yaml.safe_load(out["yaml"])
                    self.assertEqual(type(j), type(y))
                    if isinstance(j, dict):
                        self.assertEqual(sorted(j), sorted(y))
                    else:
                        self.assertEqual(len(j), len(y))
                if "name" in formats:
                    self.assertEqual(out["name"].split(), self.NAMES[path](json.loads(out["json"])))
                if "wide" in formats:
                    header = lambda text: len(text.splitlines()[0].split())
                    self.assertGreater(header(out["wide"]), header(out["table"]))
                # What it does not print is refused, with what it does.
                for fmt in FORMATS:
                    if fmt in formats:
                        continue
                    p = self.server.tau(*path, *args, "-o", fmt)
                    self.assertEqual(p.returncode, 125, f"-o {fmt} accepted")
                    self.assertIn(f"has no -o {fmt}: it prints", p.stderr)
                p = self.server.tau(*path, *args, "-o", "xml")
                self.assertEqual(p.returncode, 125)
                self.assertIn("unknown output format 'xml'", p.stderr)

    def test_metrics_formats(self):
        # `tau metrics` also has jsonl, its default off a terminal.
        points = {}
        for fmt in ("table", "json", "yaml", "jsonl"):
            p = self.server.tau("metrics", self.run_name, "loss", "-o", fmt)
            self.assertEqual(p.returncode, 0, p.stderr)
            points[fmt] = p.stdout
        self.assertEqual(json.loads(points["json"]), yaml.safe_load(points["yaml"]))
        self.assertEqual(json.loads(points["jsonl"].splitlines()[0])["value"], 0.5)
        self.assertIn("loss", points["table"])

    def test_list_filters_and_wide_columns(self):
        p = self.server.tau("list", "--all", "-o", "wide", check=0).stdout
        self.assertRegex(p.splitlines()[0], r"WORKSPACE\s+USER\s+PRIORITY.*DURATION")
        self.assertIn("default", p.splitlines()[1])
        names = lambda *f: self.server.tau("list", "--all", "-o", "name", *f, check=0).stdout.split()
        self.assertEqual(names("--workspace", "default"), [self.run_name])
        self.assertEqual(names("--queue", "default"), [self.run_name])
        user = json.loads(self.server.tau("list", "--all", "-o", "json", check=0).stdout)["runs"][0]["user"]
        self.assertTrue(user)
        self.assertEqual(names("--user", user), [self.run_name])
        self.assertEqual(names("--user", "nobody-at-all"), [])


    def test_top_fits_a_small_terminal(self):
        import fcntl
        import pty
        import select
        import struct
        import termios
        import time
        rows, cols = 10, 40
        pid, fd = pty.fork()
        if pid == 0:  # the terminal is 40 x 10 before top looks at it
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            os.execve(TAU, [TAU, "top"], self.server.env)
        out = b""
        deadline = time.time() + 20
        while time.time() < deadline and out.count(b"\x1b[2J") < 2:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
        os.write(fd, b"q")
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        frame = out.decode().split("\x1b[H\x1b[2J")[1]
        lines = [l.rstrip("\r") for l in frame.split("\n") if l.strip("\r")]
        self.assertIn("tau top", lines[0])
        self.assertLessEqual(len(lines), rows)
        self.assertTrue(all(len(l) <= cols for l in lines), lines)
        self.assertTrue(any("more lines" in l for l in lines), lines)

if __name__ == "__main__":
    unittest.main()
