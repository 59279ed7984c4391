// `tau run`: validate locally, snapshot the code directory, submit, then follow the run to its end.
#include <dirent.h>
#include <fnmatch.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/code.h"
#include "cli/commands.h"
#include "cli/connect.h"
#include "cli/digest_cache.h"
#include "client/tau_api.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/json_text.h"
#include "common/limits.h"
#include "common/strings.h"
#include "spec/spec.h"

namespace tau::cli {
namespace {

namespace fs = std::filesystem;

// Ctrl-C while following a run detaches; the run goes on in the server.
char g_detach_message[512];
void OnInterrupt(int) {
  (void)!::write(STDERR_FILENO, g_detach_message, std::strlen(g_detach_message));
  ::_exit(130);
}

std::string StatusLine(const api::Run& run) {
  std::string queued = QueuedLine(run);
  return queued.empty() ? run.state : queued;
}

// The manifest of a walked code directory: each file's size and sha256, read in chunks unless the
// digest cache knows the file as it is. A file
// that grew since the walk is held to what is left of the limit.
Result<nlohmann::json> HashCode(const std::string& root, const CodeWalk& code) {
  nlohmann::json manifest = nlohmann::json::array();
  size_t total = 0;
  DigestCache cache = DigestCache::Open(root);
  for (const CodeFile& f : code.files) {
    const std::string path = root + "/" + f.path;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError("cannot read " + path, errno);
    std::string digest = cache.Find(f.path, st);
    size_t size = static_cast<size_t>(st.st_size);
    if (digest.empty()) {
      Sha256 hash;
      size = 0;
      TAU_RETURN_IF_ERROR(ReadFileChunks(path, [&](std::string_view chunk) {
        hash.Update(chunk);
        size += chunk.size();
      }));
      digest = hash.HexDigest();
      if (size == static_cast<size_t>(st.st_size)) cache.Record(f.path, st, digest);
    }
    total += size;
    if (total > kMaxSnapshotBytes)
      return ResourceExhausted(fmt::format(
          "the code directory {} holds more than {} MiB; keep data sets and checkpoints out of it "
          "or list them in .tauignore (gitignore-style patterns)",
          root, kMaxSnapshotBytes >> 20));
    manifest.push_back({{"path", f.path}, {"mode", f.mode}, {"size", size}, {"sha256", digest}});
  }
  cache.Save();
  return manifest;
}

// Sends the server the blobs of `manifest` it lacks (none when it holds the snapshot). False when
// the server predates code upload (it answers the manifest's route with 404).
Result<bool> UploadCode(const std::string& root, const CodeWalk& code,
                        const nlohmann::json& manifest, client::Connection* conn) {
  client::TauApi tau(conn);
  auto missing = tau.CodeMissing(JsonText({{"files", manifest}}));
  if (!missing.ok() && missing.status().code() == StatusCode::kNotFound) return false;
  if (!missing.ok()) return missing.status();
  if (missing->missing.empty()) return true;
  std::map<std::string, size_t> by_digest;
  for (size_t i = 0; i < manifest.size(); ++i)
    by_digest.emplace(manifest[i]["sha256"].get<std::string>(), i);
  for (const std::string& digest : missing->missing) {
    auto at = by_digest.find(digest);
    if (at == by_digest.end())
      return Internal("the server asked for blob " + digest + ", which is not in the manifest");
    const std::string path = root + "/" + code.files[at->second].path;
    TAU_ASSIGN_OR_RETURN(std::string data, ReadFileAtMost(path, kMaxSnapshotBytes, "a code file"));
    if (Sha256Hex(data) != digest)
      return FailedPrecondition(
          fmt::format("{} changed while tau run read it; run it again", path));
    TAU_RETURN_IF_ERROR(tau.PutBlob(digest, data));
  }
  return true;
}

constexpr int kTries = 4;

// `call` on the connection, and again on a new one (kTries in all, waiting 1, 2, 4 s between)
// while no answer comes (a timeout, a lost connection): only for calls that are safe to repeat.
// `again` says so before each new try.
template <typename Call>
auto Retrying(const Global& g, std::unique_ptr<client::Connection>* conn, Call call,
              const std::function<void(const Status&, int)>& again) -> decltype(call(nullptr)) {
  auto got = call(conn->get());
  for (int tried = 1;
       tried < kTries && !got.ok() &&
       (got.status().code() == StatusCode::kUnavailable || got.status().code() == StatusCode::kIo);
       ++tried) {
    again(got.status(), tried);
    std::this_thread::sleep_for(std::chrono::seconds(1 << (tried - 1)));
    auto reconnected = ConnectToServer(g.server);
    if (!reconnected.ok()) {
      got = reconnected.status();
      continue;
    }
    *conn = std::move(*reconnected);
    got = call(conn->get());
  }
  return got;
}

}  // namespace

int RunExitStatus(const api::Run& run) {
  if (run.state == "Succeeded") return 0;
  if (run.exit_code && *run.exit_code > 0 && *run.exit_code < 256) return *run.exit_code;
  return kExitInvalid;
}

int CmdRun(const Global& g, const std::string& file, bool detach) {
  std::string spec_text;
  int rc = 0;
  std::optional<spec::ParseOutcome> read = ReadSpecFile(file, &spec_text, &rc);
  if (!read) return rc;
  const spec::ParseOutcome& parsed = *read;
  auto root = FindCodeRoot(file, *parsed.spec);
  if (!root.ok()) return Fail(root.status().message());
  // The limits are checked from the files' sizes before any is read; then each file is hashed.
  auto code = ListCode(root->root, parsed.spec->code_excludes);
  if (!code.ok()) return Fail(code.status().message());
  for (const std::string& w : code->warnings) std::fprintf(stderr, "tau: warning: %s\n", w.c_str());
  auto manifest = HashCode(root->root, *code);
  if (!manifest.ok()) return Fail(manifest.status().message());
  auto conn = ConnectToServer(g.server);
  if (!conn.ok()) return Fail(conn.status().message());
  // Sent again when no answer came, like the submission: blobs are named by their content, so a
  // repeat changes nothing.
  auto uploaded = Retrying(
      g, &*conn, [&](client::Connection* c) { return UploadCode(root->root, *code, *manifest, c); },
      [](const Status& s, int tried) {
        std::fprintf(stderr,
                     "tau: no answer to the code upload (%s); sending it again, which changes "
                     "nothing the server has (try %d of %d)\n",
                     s.message().c_str(), tried + 1, kTries);
      });
  if (!uploaded.ok()) return Fail(uploaded.status().message());
  nlohmann::json body = {{"spec", {{"file", file}, {"yaml", spec_text}}},
                         {"code", {{"dir", root->subdir}}}};
  if (*uploaded) {
    body["code"]["manifest"] = std::move(*manifest);
  } else {
    // A server older than code upload: the files inline, as it reads them.
    auto collected = CollectCode(root->root, kMaxSnapshotBytes, parsed.spec->code_excludes);
    if (!collected.ok()) return Fail(collected.status().message());
    nlohmann::json files = nlohmann::json::array();
    for (const CodeFile& f : collected->files)
      files.push_back({{"path", f.path}, {"mode", f.mode}, {"data", Base64Encode(f.data)}});
    body["code"]["files"] = std::move(files);
  }
  const std::string request = JsonText(body);
  // One key for every try of this submission: a try the server got but did not answer (a timeout,
  // a lost connection) made the run, and the next try gets that run back instead of a second one.
  const std::string key = RandomHex(32);
  auto submitted = Retrying(
      g, &*conn, [&](client::Connection* c) { return client::TauApi(c).Submit(request, key); },
      [](const Status& s, int tried) {
        std::fprintf(stderr,
                     "tau: no answer to the submission (%s); sending it again with the same key, "
                     "which never makes a second run (try %d of %d)\n",
                     s.message().c_str(), tried + 1, kTries);
      });
  if (!submitted.ok()) {
    // A refusal of the spec (resolution, the backend's checks) is printed at the fields it names.
    if (submitted.status().code() == StatusCode::kInvalidArgument ||
        submitted.status().code() == StatusCode::kFailedPrecondition ||
        submitted.status().code() == StatusCode::kPermissionDenied) {
      std::fprintf(stderr, "%s\n",
                   LocatedErrors(file, parsed, submitted.status().message()).c_str());
      return kExitTauError;  // as before: the run never existed
    }
    return Fail(submitted.status().message());
  }
  client::TauApi tau(conn->get());
  api::Run run = std::move(submitted->run);
  std::string name = run.name;
  if (detach) {
    std::puts(name.c_str());
    return 0;
  }
  bool tty = StderrIsTerminal();
  std::fprintf(stderr, "tau: run %s submitted\n", name.c_str());
  std::snprintf(
      g_detach_message, sizeof g_detach_message,
      "\ntau: detached; run %s goes on without this terminal. Follow it: tau logs -f %s   "
      "Stop it: tau cancel %s\n",
      name.c_str(), name.c_str(), name.c_str());
  ::signal(SIGINT, OnInterrupt);
  // While it waits for admission, show where it stands: one line kept up to date on a terminal,
  // a line per change (of its place or reason code) otherwise.
  std::string last_line, last_key;
  int64_t started = MonotonicMillis();
  while (true) {
    auto now = tau.GetRun(name);
    if (!now.ok()) return Fail(now.status().message());
    run = std::move(now->run);
    if (run.state != "Queued" && run.state != "Admitted") break;
    std::string line = StatusLine(run);
    if (tty && line != last_line) {
      std::fprintf(stderr, "\r\033[Ktau: %s", line.c_str());
      last_line = line;
    }
    std::string key = QueuedKey(run);
    if (!tty && !key.empty() && key != last_key) std::fprintf(stderr, "tau: %s\n", line.c_str());
    last_key = key;
    int64_t waited = MonotonicMillis() - started;
    std::this_thread::sleep_for(std::chrono::milliseconds(waited < 1000 ? 20 : 250));
  }
  if (tty && !last_line.empty()) std::fprintf(stderr, "\r\033[K");
  client::LogQuery follow;
  follow.follow = true;
  auto streamed = FollowLog(g.server, &*conn, name, follow, /*since_submitted=*/true);
  if (!streamed.ok()) return Fail("lost the log stream: " + streamed.status().message());
  // The stream ends when the run does; the final state may take a moment to be recorded.
  for (int i = 0; i < 600; ++i) {
    auto now = client::TauApi(conn->get()).GetRun(name);  // FollowLog may have reconnected
    if (!now.ok()) return Fail(now.status().message());
    run = std::move(now->run);
    if (run.IsTerminal()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string& state = run.state;
  const std::string& detail = run.message;
  if (state == "Succeeded") {
    std::fprintf(stderr, "tau: run %s succeeded\n", name.c_str());
  } else {
    std::fprintf(stderr, "tau: run %s %s (%s): %s\n", name.c_str(),
                 state == "Cancelled" ? "was cancelled" : "failed", run.reason.c_str(),
                 detail.c_str());
    std::fprintf(stderr, "tau: details: tau describe %s\n", name.c_str());
    // Only rank 0's output was streamed here; the rank that failed may be another.
    if (run.Workers() > 1)
      std::fprintf(stderr,
                   "tau: this terminal showed rank 0; each rank's log: tau logs %s --rank R\n",
                   name.c_str());
  }
  return RunExitStatus(run);
}

}  // namespace tau::cli
