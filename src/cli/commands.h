// The commands behind `tau ...`, one function each; main.cc parses flags and calls them.
#pragma once

#include <string>
#include <vector>

#include "cli/output.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tau::cli {

struct Global {
  std::string server;  // --server
};

int CmdVersion(const Global& g, bool with_server);
int CmdValidate(const std::vector<std::string>& files, bool quiet);
int CmdSchema(Format format);
int CmdRun(const Global& g, const std::string& file, bool detach);
int CmdList(const Global& g, const std::string& state, bool all, int limit, Format format);
int CmdStatus(const Global& g, const std::string& run, Format format);
int CmdDescribe(const Global& g, const std::string& run, Format format);
int CmdLogs(const Global& g, const std::string& run, bool follow, int attempt, int rank);
int CmdCancel(const Global& g, const std::vector<std::string>& runs);
int CmdRerun(const Global& g, const std::string& run);
int CmdResume(const Global& g, const std::string& run, const std::string& from, bool force);
int CmdGpus(const Global& g, Format format);
int CmdHealthCheck(const Global& g, bool active, Format format);
int CmdAdmissionSimulate(const std::string& file, int cycles, Format format);
int CmdPlatformValidate(const std::vector<std::string>& files, bool quiet);
int CmdExplain(const std::string& spec_file, std::string platform_file, const std::string& user,
               Format format);

// queue_commands.cc
int CmdPlatformApply(const Global& g, const std::string& file);
int CmdPlatformShow(const Global& g, Format format);
int CmdQueues(const Global& g, Format format);
int CmdQueueShow(const Global& g, const std::string& queue, Format format);

// evidence_commands.cc
int CmdEvidence(const Global& g, const std::string& run, Format format);
int CmdEvidenceExport(const Global& g, const std::string& run, const std::string& file);
int CmdEvidenceVerify(const Global& g, const std::string& file, bool run_check);
// `output`: table (sparkline and table), json, jsonl; "" = table on a terminal, else jsonl.
int CmdMetrics(const Global& g, const std::string& run, const std::string& name,
               const std::string& split, bool has_split, const std::string& output);

// identity_commands.cc: login, logout, whoami, admin token|audit, secret (registered on `app`).
void RegisterIdentityCommands(CLI::App* app, const Global* g, int* rc);
int CmdLogin(const Global& g, const std::string& server, const std::string& ca_file,
             bool token_stdin);
int CmdLogout(const Global& g, const std::string& server);
int CmdWhoami(const Global& g, Format format);
int CmdTokenCreate(const Global& g, const std::string& user, const std::vector<std::string>& groups,
                   const std::string& expires_in, const std::string& description);
int CmdTokenList(const Global& g, const std::string& user, Format format);
int CmdTokenRevoke(const Global& g, const std::string& id);
int CmdTokenHash();
int CmdAudit(const Global& g, int limit, Format format);
int CmdSecretSet(const Global& g, const std::string& workspace, const std::string& key,
                 const std::string& from_file);
int CmdSecretList(const Global& g, const std::string& workspace, Format format);
int CmdSecretDelete(const Global& g, const std::string& workspace, const std::string& key);

// Prints "tau: error: <message>" to stderr and returns kExitTauError.
int Fail(const std::string& message);
// Run names are lowercase letters, digits and '-' (a spec name and a suffix): anything else names
// no run, and is said so before it is put in a request path.
bool IsRunName(const std::string& name);
int NoSuchRun(const std::string& name);

}  // namespace tau::cli
