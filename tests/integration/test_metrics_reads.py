"""Reading a run's metrics costs bounded memory whatever the run wrote (issue #47): a run that logs its
way to its workspace's limits.max_metric_points, then a read of its series (downsampled for
display, keeping the first and last points and the extremes), a read of its summaries (kept with
the ended run's compacted file), and a JSONL read that streams every point. The server's peak RSS
growth and each read's time are measured and bounded.

The figures measured are printed (stderr) so that CI logs keep them."""
import getpass
import json
import os
import socket
import sys
import time
import unittest

from harness import ServerTestCase, wait_for

USER = getpass.getuser()
UNDER_TSAN = "TSAN_OPTIONS" in os.environ
CAP = 200_000 if UNDER_TSAN else 1_000_000
# A read may grow the server's peak RSS by this much at most: holding the capped series (as reads
# did) costs hundreds of MiB.
RSS_GROWTH_LIMIT_KB = 64 * 1024
READ_LIMIT_S = 60  # generous: CI's 2 shared cores; the figures are printed

PLATFORM = f"""schema_version: 1
flavors:
  - name: cpu
queues:
  - name: main
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: cpu
            resources:
              - {{name: cpu, nominal: 64}}
              - {{name: memory, nominal: 256Gi}}
workspaces:
  - name: capped
    members: ["{USER}"]
    default_queue: main
    limits: {{max_metric_points: {CAP}}}
defaults:
  workspace: capped
"""

# A spike at one step, so the downsampled series must keep it; then past the cap.
FLOOD = """import os, sys
n = int(sys.argv[1])
spike = n // 3
with open(os.environ['TAU_METRICS_FILE'], 'a') as f:
    for start in range(0, n, 100000):
        f.write(''.join('{"name":"loss","step":%d,"value":%s}\\n' % (i, '9.5' if i == spike else
                        '%.4f' % (1.0 / (1 + i))) for i in range(start, min(n, start + 100000))))
"""

SPEC = ("schema_version: 1\nname: flood\nrun:\n  entrypoint: flood.py\n  workload_kind: job\n"
        f"  args: [\"{CAP + CAP // 5}\"]\ncompute:\n  gpus: 0\n  workers: 1\n")


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class MetricsReadTest(ServerTestCase):
    def get(self, path):
        """(headers, body bytes, seconds) of a GET over the server's socket."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(120)
        s.connect(os.path.join(self.server.home, "tau.sock"))
        started = time.monotonic()
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: tau\r\nConnection: close\r\n\r\n".encode())
        data = bytearray()
        while chunk := s.recv(1 << 20):
            data += chunk
        took = time.monotonic() - started
        s.close()
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        self.assertIn(b" 200 ", head.split(b"\r\n")[0], head)
        if b"transfer-encoding: chunked" in head.lower():
            out, rest = bytearray(), body
            while True:
                size_text, _, rest = rest.partition(b"\r\n")
                size = int(size_text, 16)
                if size == 0:
                    break
                out += rest[:size]
                rest = rest[size + 2:]
            body = bytes(out)
        return head.decode().lower(), body, took

    def measured(self, path):
        """Reads `path`; (headers, body, seconds, peak RSS growth in kB)."""
        pid = self.server.proc.pid
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets the peak (VmHWM) to the current RSS
        before = status_kb(pid, "VmHWM")
        head, body, took = self.get(path)
        return head, body, took, status_kb(pid, "VmHWM") - before

    def test_reads_of_a_run_at_its_point_cap_are_bounded(self):
        path = os.path.join(self.work, "platform.yaml")
        with open(path, "w") as f:
            f.write(PLATFORM)
        self.server.tau("platform", "apply", path, check=0)
        name = self.submit(SPEC, {"flood.py": FLOOD})
        self.server.wait_state(name, "Succeeded", timeout=240)
        evidence = os.path.join(self.server.home, "runs", name, "evidence")
        wait_for(lambda: os.path.exists(os.path.join(evidence, "record.json")), timeout=240,
                 interval=0.2, what="the final record")

        head, body, took, grew = self.measured(f"/api/v1/runs/{name}/metrics?name=loss")
        reply = json.loads(body)
        print(f"\n[metrics reads] {CAP} points: series read {took:.2f}s, peak RSS +{grew // 1024} "
              f"MiB, {len(reply['series'][0]['points'])} points", file=sys.stderr)
        self.assertEqual(reply["stats"]["refused_points"], CAP // 5)
        self.assertEqual(reply["summaries"][0]["count"], CAP)
        series = reply["series"][0]
        points = series["points"]
        self.assertEqual(series["downsampled"], {"points": CAP, "max_points": 2000})
        self.assertLessEqual(len(points), 2000)
        self.assertGreater(len(points), 1000)
        steps = [p["step"] for p in points]
        self.assertEqual(steps, sorted(set(steps)))
        self.assertEqual((steps[0], steps[-1]), (0, CAP - 1))
        self.assertIn({"attempt": 1, "step": (CAP + CAP // 5) // 3, "value": 9.5}, points)
        self.assertLess(grew, RSS_GROWTH_LIMIT_KB)
        self.assertLess(took, READ_LIMIT_S)

        # Fewer points asked for; an impossible bound refused.
        small = json.loads(self.get(f"/api/v1/runs/{name}/metrics?name=loss&max_points=40")[1])
        self.assertLessEqual(len(small["series"][0]["points"]), 40)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.path.join(self.server.home, "tau.sock"))
        s.sendall(f"GET /api/v1/runs/{name}/metrics?name=loss&max_points=3 HTTP/1.1\r\n"
                  "Host: tau\r\nConnection: close\r\n\r\n".encode())
        self.assertIn(b" 400 ", s.recv(4096).split(b"\r\n")[0])
        s.close()

        # The summaries are kept with the ended run: no re-read of every point.
        self.assertTrue(os.path.exists(os.path.join(evidence, "metrics-summary.json")))
        _, body, took, grew = self.measured(f"/api/v1/runs/{name}/metrics")
        print(f"[metrics reads] summaries read {took:.3f}s, peak RSS +{grew // 1024} MiB",
              file=sys.stderr)
        self.assertEqual(json.loads(body)["summaries"], reply["summaries"])
        self.assertLess(took, 5)
        self.assertLess(grew, RSS_GROWTH_LIMIT_KB)

        # Every point, streamed.
        head, body, took, grew = self.measured(f"/api/v1/runs/{name}/metrics?format=jsonl")
        lines = body.decode().splitlines()
        print(f"[metrics reads] JSONL read {took:.2f}s ({len(body) >> 20} MiB), peak RSS "
              f"+{grew // 1024} MiB", file=sys.stderr)
        self.assertIn("transfer-encoding: chunked", head)
        self.assertEqual(len(lines), CAP)
        self.assertEqual([json.loads(lines[i])["step"] for i in (0, -1)], [0, CAP - 1])
        self.assertLess(grew, RSS_GROWTH_LIMIT_KB)
        self.assertLess(took, READ_LIMIT_S)


if __name__ == "__main__":
    unittest.main()
