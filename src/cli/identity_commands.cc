// `tau login|logout|whoami`, `tau admin token ...|audit`, `tau secret ...`: identity on the
// client. The client config (config.json, mode 0600) remembers a server address, its token and
// its CA file, so that `tau login` once is enough.
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "auth/auth.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "client/tau_api.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/json_text.h"
#include "common/strings.h"

namespace tau::cli {
namespace {

// Reads a secret from stdin without echoing it on a terminal; one line, trailing newline removed.
std::string ReadSecretLine(const char* prompt) {
  bool tty = ::isatty(STDIN_FILENO);
  termios old{};
  if (tty) {
    std::fprintf(stderr, "%s", prompt);
    ::tcgetattr(STDIN_FILENO, &old);
    termios quiet = old;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    ::tcsetattr(STDIN_FILENO, TCSANOW, &quiet);
  }
  std::string line;
  std::getline(std::cin, line);
  if (tty) {
    ::tcsetattr(STDIN_FILENO, TCSANOW, &old);
    std::fprintf(stderr, "\n");
  }
  return std::string(Trim(line));
}

std::string ReadAllStdin() {
  std::string out((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  return out;
}

// One typed call on a new connection to the server.
template <typename F>
auto Call(const Global& g, F call) -> decltype(call(std::declval<client::TauApi&>())) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return conn.status();
  client::TauApi tau(conn->get());
  return call(tau);
}

}  // namespace

static int CmdLogin(const Global& g, const std::string& server, const std::string& ca_file,
                    bool token_stdin) {
  std::string address = server.empty() ? g.server : server;
  if (address.empty())
    return Fail("which server? `tau login https://HOST:PORT` (the local socket needs no login)");
  std::string token = token_stdin || !::isatty(STDIN_FILENO) ? std::string(Trim(ReadAllStdin()))
                                                             : ReadSecretLine("API token: ");
  if (token.empty())
    return Fail("no token given (paste the token `tau admin token create` printed)");
  ClientConfig config = LoadClientConfig();
  ServerEntry entry;
  entry.token = token;
  entry.ca_file = ca_file.empty() ? config.servers[address].ca_file : ca_file;
  if (!entry.ca_file.empty()) entry.ca_file = std::filesystem::absolute(entry.ca_file).string();
  auto conn = ConnectWith(address, entry);
  if (!conn.ok()) return Fail(conn.status().message());
  auto me = client::TauApi(conn->get()).Whoami();
  if (!me.ok()) return Fail(me.status().message());
  config.servers[address] = entry;
  config.current = address;
  if (Status s = SaveClientConfig(config); !s.ok()) return Fail(s.message());
  std::printf("signed in to %s as %s; saved in %s\n", address.c_str(), me->user.c_str(),
              ClientConfigPath().c_str());
  return 0;
}

static int CmdLogout(const Global& g, const std::string& server) {
  ClientConfig config = LoadClientConfig();
  std::string address = !server.empty() ? server : !g.server.empty() ? g.server : config.current;
  if (address.empty() || config.servers.erase(address) == 0)
    return Fail(fmt::format("not signed in to {}", address.empty() ? "any server" : address));
  if (config.current == address) config.current.clear();
  if (Status s = SaveClientConfig(config); !s.ok()) return Fail(s.message());
  std::printf("signed out of %s\n", address.c_str());
  return 0;
}

static int CmdWhoami(const Global& g, Format format) {
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  client::TauApi tau(conn->get());
  auto me = tau.Whoami();
  if (!me.ok()) return Fail(me.status().message());
  if (IsData(format)) return PrintData(me->ToJson(), format);
  // Which server answered: the socket or URL the CLI reached (--server, $TAU_SERVER, the login's
  // or the local one), and its version.
  auto version = tau.Version();
  std::printf("server:   %s (tau %s)\n", (*conn)->endpoint().ToString().c_str(),
              version.ok() ? version->version.c_str() : "version unknown");
  std::printf("user:     %s (%s%s)\n", me->user.c_str(), me->via.c_str(),
              me->token_id.empty() ? "" : (" " + me->token_id).c_str());
  std::printf("groups:   %s\n", me->groups.empty() ? "-" : Join(me->groups, ", ").c_str());
  std::printf("platform: %s\n", me->admin ? "admin" : me->platform_viewer ? "viewer" : "-");
  std::vector<std::vector<std::string>> rows;
  for (const api::WorkspaceRole& w : me->workspaces) rows.push_back({w.name, w.role});
  PrintTable({"WORKSPACE", "ROLE"}, rows);
  return 0;
}

static int CmdTokenCreate(const Global& g, const std::string& user,
                          const std::vector<std::string>& groups, const std::string& expires_in,
                          const std::string& description) {
  auto made = Call(g, [&](client::TauApi& tau) {
    return tau.CreateToken(user, groups, expires_in, description);
  });
  if (!made.ok()) return Fail(made.status().message());
  // The token alone on stdout (scripts capture it); the advice on stderr.
  std::printf("%s\n", made->token.value_or("").c_str());
  std::fprintf(stderr,
               "token %s for user '%s'%s; it is shown only now. Sign in with: tau login SERVER\n",
               made->id.c_str(), made->user.c_str(),
               made->expires ? (", expires " + *made->expires).c_str() : "");
  return 0;
}

static int CmdTokenList(const Global& g, const std::string& user, Format format) {
  auto got = Call(g, [&](client::TauApi& tau) { return tau.ListTokens(user); });
  if (!got.ok()) return Fail(got.status().message());
  if (IsData(format)) return PrintData(got->ToJson(), format);
  if (format == Format::kName) {
    for (const api::Token& t : got->tokens) std::printf("%s\n", t.id.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const api::Token& t : got->tokens)
    rows.push_back({t.id, t.user, t.groups.empty() ? "-" : Join(t.groups, ","), Cell(t.created),
                    Cell(t.expires.value_or("")), Cell(t.revoked.value_or("")),
                    Cell(t.description)});
  PrintTable({"ID", "USER", "GROUPS", "CREATED", "EXPIRES", "REVOKED", "DESCRIPTION"}, rows);
  return 0;
}

static int CmdTokenRevoke(const Global& g, const std::string& id) {
  Status revoked = Call(g, [&](client::TauApi& tau) { return tau.RevokeToken(id); });
  if (!revoked.ok()) return Fail(revoked.message());
  std::printf("revoked token %s\n", id.c_str());
  return 0;
}

static int CmdTokenHash() {
  std::string token =
      ::isatty(STDIN_FILENO) ? ReadSecretLine("API token: ") : std::string(Trim(ReadAllStdin()));
  if (token.empty()) return Fail("no token on stdin");
  std::printf("%s\n", auth::TokenDigest(token).c_str());
  return 0;
}

static int CmdAudit(const Global& g, int limit, Format format) {
  auto got = Call(g, [&](client::TauApi& tau) { return tau.GetAudit(limit); });
  if (!got.ok()) return Fail(got.status().message());
  if (IsData(format)) return PrintData(got->ToJson(), format);
  std::vector<std::vector<std::string>> rows;
  for (const api::AuditRecord& a : got->audit)
    rows.push_back({a.time, a.user.empty() ? "(anonymous)" : a.user, a.action,
                    std::to_string(a.status), a.method + " " + a.path, a.detail});
  PrintTable({"TIME", "USER", "ACTION", "STATUS", "REQUEST", "DETAIL"}, rows);
  return 0;
}

static int CmdSecretSet(const Global& g, const std::string& workspace, const std::string& key,
                        const std::string& from_file) {
  std::string value;
  if (!from_file.empty()) {
    auto text = ReadFile(from_file);
    if (!text.ok()) return Fail(text.status().message());
    value = *text;
  } else if (::isatty(STDIN_FILENO)) {
    value = ReadSecretLine(fmt::format("value of {}/{}: ", workspace, key).c_str());
  } else {
    value = ReadAllStdin();
    if (!value.empty() && value.back() == '\n') value.pop_back();  // `echo x |` adds one
  }
  // A secret becomes an environment variable, and travels as JSON text: UTF-8 only.
  if (size_t bad = FindInvalidUtf8(value); bad != std::string::npos)
    return Fail(
        fmt::format("the value is not UTF-8 text (byte {} is 0x{:02x}); a binary secret has to "
                    "be encoded first, e.g. `base64 FILE | tau secret set {} {}`",
                    bad, static_cast<unsigned char>(value[bad]), workspace, key));
  Status set = Call(g, [&](client::TauApi& tau) { return tau.SetSecret(workspace, key, value); });
  if (!set.ok()) return Fail(set.message());
  std::printf("set secret %s in workspace %s (%zu bytes); use it as SECRET:%s in runtime.env\n",
              key.c_str(), workspace.c_str(), value.size(), key.c_str());
  return 0;
}

static int CmdSecretList(const Global& g, const std::string& workspace, Format format) {
  auto got = Call(g, [&](client::TauApi& tau) { return tau.ListSecrets(workspace); });
  if (!got.ok()) return Fail(got.status().message());
  if (IsData(format)) return PrintData(got->ToJson(), format);
  if (format == Format::kName) {
    for (const api::SecretInfo& s : got->secrets) std::printf("%s\n", s.key.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const api::SecretInfo& s : got->secrets)
    rows.push_back({s.key, std::to_string(s.size), s.updated, s.updated_by});
  PrintTable({"KEY", "BYTES", "UPDATED", "BY"}, rows);
  return 0;
}

static int CmdSecretDelete(const Global& g, const std::string& workspace, const std::string& key) {
  Status deleted = Call(g, [&](client::TauApi& tau) { return tau.DeleteSecret(workspace, key); });
  if (!deleted.ok()) return Fail(deleted.message());
  std::printf("deleted secret %s from workspace %s\n", key.c_str(), workspace.c_str());
  return 0;
}

void RegisterIdentityCommands(CLI::App* app, Context* ctx) {
  // Owned by the callbacks, which outlive this function (CLI11 runs them during parse()).
  struct Args {
    std::string server, ca_file, user, expires, description, workspace, key, from_file, id;
    std::vector<std::string> groups;
    bool token_stdin = false;
    int limit = 50;
  };
  auto a = std::make_shared<Args>();
  const Global* g = &ctx->g;
  int* rc = &ctx->rc;
  auto add_output = [ctx](CLI::App* cmd) { return AddOutput(cmd, ctx); };
  // Lists whose items have names: -o name too.
  auto add_list_output = [ctx](CLI::App* cmd) {
    return AddOutput(cmd, ctx, {Format::kTable, Format::kName, Format::kJson, Format::kYaml});
  };

  auto* login = app->add_subcommand(
      "login", "Sign in to a tau server with an API token (read from the terminal or stdin)");
  login->add_option("server", a->server, "https://HOST:PORT (default: --server)");
  login->add_option("--ca-file", a->ca_file, "CA certificate that signed the server's");
  login->add_flag("--token-stdin", a->token_stdin, "Read the token from stdin");
  login->callback([=] { *rc = CmdLogin(*g, a->server, a->ca_file, a->token_stdin); });
  auto* logout = app->add_subcommand("logout", "Forget a server's token");
  logout->add_option("server", a->server, "default: the current server");
  logout->callback([=] { *rc = CmdLogout(*g, a->server); });
  auto* whoami = app->add_subcommand("whoami", "Who the server thinks you are, and your roles");
  auto whoami_format = add_output(whoami);
  whoami->callback([=] {
    if (auto f = whoami_format()) *rc = CmdWhoami(*g, *f);
  });

  auto* admin = app->add_subcommand("admin", "Administration: API tokens, the audit trail");
  admin->require_subcommand(1);
  auto* token = admin->add_subcommand("token", "API tokens");
  token->require_subcommand(1);
  auto* create = token->add_subcommand(
      "create", "Create an API token (printed once; only its digest is kept)");
  create->add_option("--user", a->user, "Whose token (default: yours; others: admins only)");
  create->add_option("--group", a->groups, "A group the token's user is in (repeatable)");
  create->add_option("--expires", a->expires, "Lifetime, e.g. 12h or 90d (default: none)");
  create->add_option("--description", a->description, "What the token is for");
  create->callback(
      [=] { *rc = CmdTokenCreate(*g, a->user, a->groups, a->expires, a->description); });
  auto* list = token->add_subcommand("list", "List tokens (admins: all, or --user)");
  list->add_option("--user", a->user, "Only this user's");
  auto list_format = add_list_output(list);
  list->callback([=] {
    if (auto f = list_format()) *rc = CmdTokenList(*g, a->user, *f);
  });
  auto* revoke = token->add_subcommand("revoke", "Revoke a token by id");
  revoke->add_option("id", a->id, "The id `tau admin token list` shows")->required();
  revoke->callback([=] { *rc = CmdTokenRevoke(*g, a->id); });
  auto* hash = token->add_subcommand(
      "hash", "Print a token's SHA-256 (stdin) for platform.yaml users[].token_sha256");
  hash->callback([=] { *rc = CmdTokenHash(); });
  auto* audit = admin->add_subcommand("audit", "The audit trail: denials and policy changes");
  audit->add_option("--limit", a->limit, "How many records (newest first)")
      ->check(CLI::Range(1, 10000));
  auto audit_format = add_output(audit);
  audit->callback([=] {
    if (auto f = audit_format()) *rc = CmdAudit(*g, a->limit, *f);
  });

  auto* secret = app->add_subcommand("secret", "Workspace secrets, for SECRET:KEY in runtime.env");
  secret->require_subcommand(1);
  auto* set = secret->add_subcommand(
      "set", "Set a secret; the value comes from the terminal, stdin or --from-file, never argv");
  set->add_option("workspace", a->workspace, "Workspace")->required();
  set->add_option("key", a->key, "Key")->required();
  set->add_option("--from-file", a->from_file, "Read the value from this file");
  set->callback([=] { *rc = CmdSecretSet(*g, a->workspace, a->key, a->from_file); });
  auto* slist = secret->add_subcommand("list", "A workspace's secret keys (never values)");
  slist->add_option("workspace", a->workspace, "Workspace")->required();
  auto slist_format = add_list_output(slist);
  slist->callback([=] {
    if (auto f = slist_format()) *rc = CmdSecretList(*g, a->workspace, *f);
  });
  auto* sdel = secret->add_subcommand("delete", "Delete a secret");
  sdel->add_option("workspace", a->workspace, "Workspace")->required();
  sdel->add_option("key", a->key, "Key")->required();
  sdel->callback([=] { *rc = CmdSecretDelete(*g, a->workspace, a->key); });
}

}  // namespace tau::cli
