// tau-fake-apiserver: the in-process stand-in Kubernetes API server (src/testing/fake_apiserver.h)
// as a program of its own, for end-to-end tests that run a real `tau server --backend kubernetes`
// against it (tests/integration/test_kube_backend.py). Test-only; not part of the tau binary.
//
// Listens on 127.0.0.1 on a free port, prints its URL ("http://127.0.0.1:PORT") as one line on
// stdout, and serves until SIGTERM or SIGINT, or, when stdin is a pipe, until it closes (so it
// does not outlive a test that dies). `--require-token TOKEN`: requests must carry it as a bearer
// token (FakeApiServer::RequireToken); `--tls-cert PEM --tls-key PEM`: HTTPS only (the URL says
// https://), as real clients send tokens over TLS only; `--crds DIR`: validate custom resources
// against the CRDs in DIR's *.yaml (FakeApiServer::LoadCrds; by default the repository's copies,
// tests/data/kube/schemas, "" for none). Tests write pod logs with POST
// /fake/logs/NAMESPACE/POD[?end=true].
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "testing/fake_apiserver.h"

int main(int argc, char** argv) {
  // The signals are taken synchronously below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  tau::testutil::FakeApiServer fake;
  tau::http::TlsServerConfig tls;
  std::string crds = TAU_FAKE_CRD_DIR;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--require-token") == 0 && i + 1 < argc) {
      fake.RequireToken(argv[++i]);
    } else if (std::strcmp(argv[i], "--tls-cert") == 0 && i + 1 < argc) {
      tls.cert_file = argv[++i];
    } else if (std::strcmp(argv[i], "--tls-key") == 0 && i + 1 < argc) {
      tls.key_file = argv[++i];
    } else if (std::strcmp(argv[i], "--crds") == 0 && i + 1 < argc) {
      crds = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: tau-fake-apiserver [--require-token TOKEN] [--tls-cert PEM "
                   "--tls-key PEM] [--crds DIR]\n");
      return 2;
    }
  }
  if (!crds.empty()) {
    if (tau::Status loaded = fake.LoadCrds(crds); !loaded.ok()) {
      std::fprintf(stderr, "tau-fake-apiserver: %s\n", loaded.ToString().c_str());
      return 1;
    }
  }
  tau::Status started = fake.Start(tls.cert_file.empty() ? nullptr : &tls);
  if (!started.ok()) {
    std::fprintf(stderr, "tau-fake-apiserver: %s\n", started.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", fake.url().c_str());
  std::fflush(stdout);

  struct stat in_stat {};
  bool watch_stdin = fstat(STDIN_FILENO, &in_stat) == 0 && S_ISFIFO(in_stat.st_mode);
  for (;;) {
    timespec tick{0, 200 * 1000 * 1000};
    int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (!watch_stdin) continue;
    pollfd in{STDIN_FILENO, POLLIN, 0};
    if (poll(&in, 1, 0) > 0) {
      char buf[256];
      ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;  // stdin closed
    }
  }
  return 0;
}
