// Exec credential plugins (client.authentication.k8s.io): tau runs the command the kubeconfig
// names and reads an ExecCredential from its stdout, as kubectl does. Its stderr is left on ours
// so that a plugin's prompts and errors reach the user.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/clock.h"
#include "kubeapi/internal.h"

extern char** environ;

namespace tau::kubeapi {

Result<ExecCredential> ParseExecCredential(const std::string& text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || doc.value("kind", "") != "ExecCredential")
    return InvalidArgument("exec plugin: its output is not an ExecCredential JSON document");
  const nlohmann::json status = doc.value("status", nlohmann::json::object());
  if (!status.is_object()) return InvalidArgument("exec plugin: ExecCredential has no status");
  ExecCredential cred;
  cred.token = status.value("token", "");
  cred.client_cert_data = status.value("clientCertificateData", "");
  cred.client_key_data = status.value("clientKeyData", "");
  if (cred.token.empty() && (cred.client_cert_data.empty() || cred.client_key_data.empty()))
    return InvalidArgument(
        "exec plugin: ExecCredential gives neither status.token nor a client certificate and key");
  if (std::string expiry = status.value("expirationTimestamp", ""); !expiry.empty()) {
    Result<int64_t> ms = ParseRfc3339(expiry);
    if (!ms.ok()) return ms.status().WithContext("exec plugin: status.expirationTimestamp");
    cred.expires_ms = *ms;
  }
  return cred;
}

Result<ExecCredential> RunExecPlugin(const ExecConfig& exec) {
  std::vector<std::string> args = {exec.command};
  args.insert(args.end(), exec.args.begin(), exec.args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  nlohmann::json info = {{"apiVersion", exec.api_version},
                         {"kind", "ExecCredential"},
                         {"spec", {{"interactive", false}}}};
  std::vector<std::pair<std::string, std::string>> set = exec.env;
  set.emplace_back("KUBERNETES_EXEC_INFO", info.dump());
  // The kubeconfig's variables replace inherited ones of the same name (a second entry would not:
  // most programs read the first).
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    if (std::none_of(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; }))
      env.emplace_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return IoError("exec plugin: pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return FailedPrecondition(
        fmt::format("exec plugin: cannot run '{}': {}", exec.command, std::strerror(rc)));
  }
  std::string output;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
    return Status(StatusCode::kUnauthenticated,
                  fmt::format("exec plugin '{}' failed (exit status {})", exec.command,
                              WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1));
  Result<ExecCredential> cred = ParseExecCredential(output);
  if (!cred.ok()) return cred.status().WithContext(exec.command);
  return cred;
}

}  // namespace tau::kubeapi
