"""TLS on the TCP listener: `tau server --listen --tls-cert --tls-key` serves https:// to the CLI (with
TAU_CA_FILE) and to curl; a TCP listener without TLS is refused unless it is a loopback-only
`--insecure-listen`. Certificates come from the openssl tool, made fresh for each run."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import unittest

from harness import TAU, TauServer, free_port, wait_for

OPENSSL = shutil.which("openssl")
CURL = shutil.which("curl")


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d):
    """ca.pem, and server.pem/server.key for 127.0.0.1 and localhost signed by it."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=tau-test-ca", cwd=d)
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
            cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext", cwd=d)


def tcp_connectable(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@unittest.skipUnless(OPENSSL, "needs the openssl command-line tool")
class TlsListenerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = tempfile.mkdtemp(prefix="tau-it-tls-")
        make_certs(cls.certs)
        cls.ca = os.path.join(cls.certs, "ca.pem")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.certs, ignore_errors=True)

    def setUp(self):
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.stop()

    def start_tls_server(self):
        port = free_port()
        server = TauServer(extra_args=[
            "--listen", f"127.0.0.1:{port}",
            "--tls-cert", os.path.join(self.certs, "server.pem"),
            "--tls-key", os.path.join(self.certs, "server.key")])
        self.servers.append(server)
        server.start()
        wait_for(lambda: tcp_connectable(port), what="the TLS listener")
        # TCP callers need a token: the server's own user's, made over the Unix socket.
        server.token = server.tau("admin", "token", "create", check=0).stdout.strip()
        return server, port

    def server_refuses(self, *args):
        """Runs `tau server ARGS` in a fresh home; returns its exit code and output."""
        server = TauServer(extra_args=args)
        self.servers.append(server)
        p = subprocess.run([TAU, "server", "--home", server.home, *args], env=server.env,
                           capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout + p.stderr

    def test_cli_over_https_with_a_private_ca(self):
        server, port = self.start_tls_server()
        for host in ("127.0.0.1", "localhost"):
            url = f"https://{host}:{port}"
            p = subprocess.run([TAU, "--server", url, "version", "--server-version"],
                               env={**server.env, "TAU_CA_FILE": self.ca},
                               capture_output=True, text=True, timeout=30)
            # Over TLS but without a token: the server's refusal, which only TLS could carry.
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("API token", p.stderr)
            p = subprocess.run([TAU, "--server", url, "version", "--server-version"],
                               env={**server.env, "TAU_CA_FILE": self.ca,
                                    "TAU_TOKEN": server.token},
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            p = subprocess.run([TAU, "--server", url, "list", "--all"],
                               env={**server.env, "TAU_CA_FILE": self.ca,
                                    "TAU_TOKEN": server.token},
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # Without the CA the system's store does not trust the certificate, and says why.
        p = subprocess.run([TAU, "--server", f"https://127.0.0.1:{port}", "version",
                            "--server-version"], env=server.env, capture_output=True, text=True,
                           timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("certificate verify failed", p.stderr)
        self.assertIn("listening on https://127.0.0.1", server.server_log())

    @unittest.skipUnless(CURL, "needs curl")
    def test_curl_over_https_and_plaintext_refused(self):
        server, port = self.start_tls_server()
        auth = ["-H", f"Authorization: Bearer {server.token}"]
        p = subprocess.run([CURL, "-sS", "--cacert", self.ca, *auth,
                            f"https://127.0.0.1:{port}/api/v1/version"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("version", json.loads(p.stdout))
        # Plaintext HTTP on the TLS port gets a plaintext 400 that says so, and the server carries on.
        p = subprocess.run([CURL, "-sS", f"http://127.0.0.1:{port}/api/v1/version"],
                           capture_output=True, text=True, timeout=30)
        self.assertIn("requires TLS", p.stdout)
        p = subprocess.run([CURL, "-sS", "--cacert", self.ca, *auth,
                            f"https://localhost:{port}/metrics"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("tau_runs", p.stdout)

    def test_listen_without_tls_is_refused(self):
        rc, out = self.server_refuses("--listen", f"127.0.0.1:{free_port()}")
        self.assertNotEqual(rc, 0)
        self.assertIn("a TCP listener requires TLS: pass --tls-cert and --tls-key, or "
                      "--insecure-listen for a loopback-only plaintext listener", out)

    def test_insecure_listen_only_on_loopback(self):
        rc, out = self.server_refuses("--listen", f"0.0.0.0:{free_port()}", "--insecure-listen")
        self.assertNotEqual(rc, 0)
        self.assertIn("loopback", out)
        port = free_port()
        server = TauServer(extra_args=["--listen", f"127.0.0.1:{port}", "--insecure-listen"])
        self.servers.append(server)
        server.start()
        wait_for(lambda: tcp_connectable(port), what="the plaintext loopback listener")

    def test_bad_certificate_path_is_named(self):
        missing = os.path.join(self.certs, "missing.pem")
        rc, out = self.server_refuses("--listen", f"127.0.0.1:{free_port()}", "--tls-cert",
                                      missing, "--tls-key", os.path.join(self.certs, "server.key"))
        self.assertNotEqual(rc, 0)
        self.assertIn(missing, out)


if __name__ == "__main__":
    unittest.main()
