"""A server nobody can wedge (issue #20): budgets per identity and per address, deadlines, and
refusals that are counted rather than each written down.

Each test starts a real server with a TCP listener on loopback and some limits lowered, then plays
one hostile client against it while another client's requests are timed: an identity that holds
more event streams than its budget, a slowloris wave from one address that sends no token, and a
flood of refused requests, whose audit rows must stay few while /metrics counts every one. Other
source addresses are other loopback addresses (127.0.0.0/8 is all loopback on Linux)."""
import json
import os
import re
import socket
import statistics
import sys
import time
import unittest

from harness import TauServer, free_port, wait_for


def connect_tcp(port, source="127.0.0.1", timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def request_bytes(method, path, token=None, close=True):
    lines = [f"{method} {path} HTTP/1.1", "Host: tau", "Content-Length: 0"]
    if close:
        lines.append("Connection: close")
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_head(s):
    """The status, the headers (lowercase names) and what followed, of the answer on `s`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0].startswith("HTTP/") else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, rest


def read_response(s):
    """One whole answer with a Content-Length (not a stream): (status, headers, body text)."""
    status, headers, rest = read_head(s)
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:length].decode(errors="replace")


def call_tcp(port, method, path, token=None, source="127.0.0.1"):
    """One request on a connection of its own; (status, body, seconds it took)."""
    start = time.monotonic()
    s = connect_tcp(port, source)
    try:
        s.sendall(request_bytes(method, path, token))
        status, _, body = read_response(s)
    finally:
        s.close()
    return status, body, time.monotonic() - start


def call_unix(server, method, path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(os.path.join(server.home, "tau.sock"))
    try:
        s.sendall(request_bytes(method, path))
        status, _, body = read_response(s)
    finally:
        s.close()
    return status, body


def closed_by_server(s):
    """True when the server has closed `s` (what it sent first is read and dropped)."""
    s.setblocking(False)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.setblocking(True)


def metric(text, name, **labels):
    """The value of one sample in Prometheus text, 0 when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def report(what, seconds):
    print(f"\n  {what}: {len(seconds)} requests, median {statistics.median(seconds) * 1000:.1f} ms, "
          f"max {max(seconds) * 1000:.1f} ms", file=sys.stderr)


class LimitsCase(unittest.TestCase):
    extra_args = ()

    def setUp(self):
        self.port = free_port()
        self.server = TauServer(extra_args=["--listen", f"127.0.0.1:{self.port}",
                                            "--insecure-listen", *self.extra_args]).start()
        self.open = []

    def tearDown(self):
        for s in self.open:
            s.close()
        self.server.stop()

    def token(self, user):
        p = self.server.tau("admin", "token", "create", "--user", user, check=0)
        token = p.stdout.strip()
        self.assertTrue(token.startswith("tau_"), p.stdout + p.stderr)
        return token

    def metrics(self):
        status, body = call_unix(self.server, "GET", "/metrics")
        self.assertEqual(status, 200, body)
        return body


class StreamBudgetTest(LimitsCase):
    extra_args = ("--max-streams-per-identity", "50")

    def test_one_identity_holding_streams_leaves_others_served(self):
        # eve belongs to no workspace; she opens 60 event streams from four addresses, 15 each, so
        # no address is near its connection budget: only her identity's budget (50) stops her.
        eve, alice = self.token("eve"), self.token("alice")
        held, refused = [], []
        for i in range(60):
            s = connect_tcp(self.port, f"127.0.0.{10 + i % 4}")
            self.open.append(s)
            s.sendall(request_bytes("GET", "/api/v1/events", eve, close=False))
            status, headers, rest = read_head(s)
            if status == 200:
                # The stream is live: its first chunk carries the hello event.
                while b"event: hello" not in rest:
                    rest += s.recv(65536)
                held.append(s)
            else:
                length = int(headers.get("content-length", "0"))
                while len(rest) < length:
                    rest += s.recv(65536)
                refused.append((status, headers, rest.decode()))
        self.assertEqual(len(held), 50)
        self.assertEqual(len(refused), 10)
        for status, headers, body in refused:
            self.assertEqual(status, 429, body)
            self.assertIn("retry-after", headers)
            message = json.loads(body)["error"]["message"]
            self.assertIn("user 'eve' already holds 50 open streams", message)
            self.assertIn("--max-streams-per-identity", message)

        # Meanwhile another identity is served at once, from one of eve's addresses too, and may
        # open a stream of her own.
        took = []
        for i in range(20):
            for path in ("/api/v1/runs", "/api/v1/version"):
                status, body, seconds = call_tcp(self.port, "GET", path, alice,
                                                 source=f"127.0.0.{10 + i % 5}")
                self.assertEqual(status, 200, body)
                took.append(seconds)
        report("alice's requests while eve holds 50 streams", took)
        self.assertLess(max(took), 2.0)
        s = connect_tcp(self.port, "127.0.0.10")
        self.open.append(s)
        s.sendall(request_bytes("GET", "/api/v1/events", alice, close=False))
        self.assertEqual(read_head(s)[0], 200)
        # The local CLI too (the Unix socket has budgets of its own).
        self.assertEqual(call_unix(self.server, "GET", "/api/v1/runs")[0], 200)

        # eve is still at her limit; once she closes streams, she gets their places back.
        self.assertEqual(call_tcp(self.port, "GET", "/api/v1/events", eve, "127.0.0.20")[0], 429)
        self.assertEqual(
            metric(self.metrics(), "tau_http_refused_total", route="/api/v1/events", status="429"),
            11)
        for s in held[:5]:
            s.close()

        def reopened():
            s = connect_tcp(self.port, "127.0.0.20")
            self.open.append(s)
            s.sendall(request_bytes("GET", "/api/v1/events", eve, close=False))
            return read_head(s)[0] == 200
        wait_for(reopened, timeout=10, interval=0.2, what="a stream of eve's to be let in again")


class ThousandStreamsTest(LimitsCase):
    """The issue's figure with the default budgets: one identity asks for 1,000 streams."""

    def test_a_thousand_stream_requests_of_one_identity_leave_others_served(self):
        eve, alice = self.token("eve"), self.token("alice")
        held, refused = 0, 0
        # From 20 addresses, 50 each: under each address's connection budget (64), so only the
        # identity's stream budget (32 by default) stops her.
        for i in range(1000):
            s = connect_tcp(self.port, f"127.0.1.{10 + i % 20}")
            s.sendall(request_bytes("GET", "/api/v1/events", eve, close=False))
            status = read_head(s)[0]
            if status == 200:
                held += 1
                self.open.append(s)
            else:
                self.assertEqual(status, 429)
                refused += 1
                s.close()
        self.assertEqual((held, refused), (32, 968))
        took = []
        for i in range(20):
            status, body, seconds = call_tcp(self.port, "GET", "/api/v1/runs", alice,
                                             source=f"127.0.1.{10 + i % 20}")
            self.assertEqual(status, 200, body)
            took.append(seconds)
        report("alice's requests after eve asked for 1,000 streams", took)
        self.assertLess(max(took), 2.0)


class SlowlorisTest(LimitsCase):
    extra_args = ("--header-deadline", "3000")

    def test_a_slowloris_wave_from_one_address_leaves_others_served(self):
        alice = self.token("alice")
        # 200 connections from one address, no token: 64 (the default budget per peer) are taken,
        # 64 more on probation (their first request must come within a second and sign in), the
        # other 72 are refused as they connect, before a byte is sent.
        wave = [connect_tcp(self.port, "127.0.0.1") for _ in range(200)]
        self.open.extend(wave)
        started = time.monotonic()
        time.sleep(1.5)
        refused = [s for s in wave if closed_by_server(s)]
        taken = [s for s in wave if s not in refused]
        self.assertEqual(len(refused), 136)
        self.assertEqual(len(taken), 64)
        # The taken ones trickle a byte each 100 ms; an authenticated client of the same peer
        # (loopback is one) is served all the while.
        partial = b"GET /api/v1/runs HTTP/1.1\r\nHost: tau\r\nX-Slow: " + b"a" * 1000
        took, step = [], 0
        while time.monotonic() - started < 5.0:
            for s in taken:
                try:
                    s.send(partial[step:step + 1])
                except OSError:
                    pass  # cut off by the deadline
            step += 1
            status, body, seconds = call_tcp(self.port, "GET", "/api/v1/runs", alice, "127.0.0.2")
            self.assertEqual(status, 200, body)
            took.append(seconds)
            time.sleep(0.1)
        report("alice's requests during a slowloris wave of 200 connections", took)
        self.assertLess(max(took), 2.0)
        # Every trickling connection was cut off at the header deadline (3 s from its accept).
        wait_for(lambda: all(closed_by_server(s) for s in taken), timeout=5,
                 what="the header deadline to close the trickling connections")
        # The address has its slots back.
        self.assertEqual(call_tcp(self.port, "GET", "/api/v1/healthz")[0], 200)
        text = self.metrics()
        self.assertEqual(metric(text, "tau_http_connections_refused_total",
                                reason="peer_connection_limit"), 72)
        self.assertEqual(metric(text, "tau_http_connections_refused_total",
                                reason="header_deadline"), 128)


class LoopbackFlood:
    """Issue #47, item 7: trickling connections without a token from 150 addresses of 127/8,
    two each, against a listener of 128 connections. Loopback is one peer, and connections not yet
    signed in hold at most three quarters of the listener (the rest a second each, on probation),
    so another user's token requests over TCP are served throughout."""

    def test_a_flood_from_many_loopback_addresses_leaves_a_token_user_served(self):
        alice = self.token("alice")
        sources = [f"127.1.{i // 100}.{i % 100 + 1}" for i in range(150)]
        wave = []
        for source in sources * 2:
            try:
                wave.append(connect_tcp(self.port, source, timeout=5))
            except OSError:
                pass  # a full accept queue: the wave is no smaller for the server
        self.open.extend(wave)
        started = time.monotonic()
        partial = b"GET /api/v1/runs HTTP/1.1\r\nHost: tau\r\nX-Slow: " + b"a" * 1000
        took, step, statuses = [], 0, []
        while time.monotonic() - started < 4.5:
            for s in wave:
                try:
                    s.send(partial[step:step + 1])
                except OSError:
                    pass  # refused or cut off
            step += 1
            # Past the probation second, every request of alice's is served.
            if time.monotonic() - started > 1.5:
                status, body, seconds = call_tcp(self.port, "GET", "/api/v1/runs", alice,
                                                 sources[step % len(sources)])
                statuses.append(status)
                if status == 200:
                    took.append(seconds)
            time.sleep(0.1)
        self.assertEqual(set(statuses), {200}, statuses)
        report("alice's requests during a trickling flood from 150 loopback addresses", took)
        self.assertGreaterEqual(len(took), 20)
        self.assertLess(max(took), 2.0)
        # The flood held no more than the share for callers without a token.
        held = [s for s in wave if not closed_by_server(s)]
        self.assertLessEqual(len(held), self.most_held)


class LoopbackFloodTest(LoopbackFlood, LimitsCase):
    # Loopback is one peer: its budget (64) binds first.
    extra_args = ("--max-connections", "128", "--header-deadline", "6000")
    most_held = 64


class LoopbackFloodUnderTheShareTest(LoopbackFlood, LimitsCase):
    # A peer's budget as large as the listener: only the share for callers without a token (96 of
    # 128) keeps the rest for signed-in ones.
    extra_args = ("--max-connections", "128", "--max-connections-per-address", "128",
                  "--header-deadline", "6000")
    most_held = 96


class RefusalSamplingTest(LimitsCase):
    extra_args = ("--audit-refusals-per-minute", "5", "--audit-refusal-window", "5000")

    def flood(self, path, token, count):
        """`count` requests on one kept-alive connection; the statuses and seconds taken."""
        s = connect_tcp(self.port)
        self.open.append(s)
        statuses, start = set(), time.monotonic()
        for _ in range(count):
            s.sendall(request_bytes("GET", path, token, close=False))
            statuses.add(read_response(s)[0])
        return statuses, time.monotonic() - start

    def test_a_flood_of_refusals_writes_a_bounded_sample_and_counts_all(self):
        eve = self.token("eve")
        first = time.monotonic()
        statuses, flood_401 = self.flood("/api/v1/runs", "tau_" + "x" * 43, 500)  # unknown token
        self.assertEqual(statuses, {401})
        statuses, flood_403 = self.flood("/metrics", eve, 300)  # eve is no platform viewer
        self.assertEqual(statuses, {403})
        took = time.monotonic() - first

        def rows():
            status, body = call_unix(self.server, "GET", "/api/v1/audit?limit=10000")
            self.assertEqual(status, 200, body)
            return json.loads(body)["audit"]
        # At most 5 rows per caller, status and route in a window (5 s): the flood may span two.
        windows = int(took // 5) + 2
        audit = rows()
        one_by_one_401 = [a for a in audit if a["status"] == 401 and a["action"] == "unauthenticated"
                          and a["path"] == "/api/v1/runs"]
        one_by_one_403 = [a for a in audit if a["status"] == 403 and a["action"] == "denied"
                          and a["path"] == "/metrics"]
        self.assertGreaterEqual(len(one_by_one_401), 5)
        self.assertLessEqual(len(one_by_one_401), 5 * windows)
        self.assertGreaterEqual(len(one_by_one_403), 5)
        self.assertLessEqual(len(one_by_one_403), 5 * windows)
        self.assertTrue(all(a["user"] == "eve" for a in one_by_one_403), one_by_one_403[:2])
        # And as few lines in the server's log.
        log = self.server.server_log()
        self.assertLessEqual(log.count("unauthenticated GET /api/v1/runs"), 5 * windows)
        self.assertLessEqual(log.count("denied GET /metrics"), 5 * windows)
        # /metrics counts every one.
        text = self.metrics()
        self.assertEqual(metric(text, "tau_http_refused_total", route="/api/v1/runs",
                                status="401"), 500)
        self.assertEqual(metric(text, "tau_http_refused_total", route="/metrics", status="403"), 300)

        # Once a window is over, the next request writes what it left out as one row each; every
        # refusal is then accounted for, one by one or in a summary.
        time.sleep(max(0.0, first + took + 5.5 - time.monotonic()))
        call_unix(self.server, "GET", "/api/v1/healthz")
        audit = rows()
        for path, status, total, one_by_one in (("/api/v1/runs", 401, 500, one_by_one_401),
                                                ("/metrics", 403, 300, one_by_one_403)):
            summaries = [a for a in audit if a["action"] == "refusals.suppressed"
                         and a["path"] == path and a["status"] == status]
            self.assertTrue(summaries, audit[:10])
            suppressed = sum(int(re.match(r"(\d+) more", a["detail"]).group(1)) for a in summaries)
            self.assertEqual(len(one_by_one) + suppressed, total, summaries)
        anonymous = [a for a in audit if a["action"] == "refusals.suppressed" and a["status"] == 401]
        self.assertIn("an anonymous caller from loopback", anonymous[0]["detail"])
        print(f"\n  800 refusals in {took:.2f} s: {len(one_by_one_401) + len(one_by_one_403)} rows "
              f"one by one, {len([a for a in audit if a['action'] == 'refusals.suppressed'])} "
              "summaries", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
