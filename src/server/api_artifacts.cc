// The artifact routes of the API (docs/api.md, "Artifacts"): a run's checkpoints and outputs,
// from the directories its attempts wrote them to (StorageDir), with the access rules of its logs.
//   GET /api/v1/runs/NAME/artifacts                     a page of the files (?digest=1, ?offset=,
//                                                       ?limit=)
//   GET /api/v1/runs/NAME/artifacts/file?path=KIND/REL  one file, streamed
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "api/types.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "controller/redact.h"
#include "evidence/evidence.h"
#include "http/reply.h"
#include "server/api.h"

namespace tau::server {
namespace {

using nlohmann::json;

constexpr const char* kKinds[] = {"checkpoint", "output"};
// Files listed of one directory: a run that writes millions of files is listed in part, and the
// reply says so (`truncated`), rather than the server walking and sorting them all.
constexpr size_t kMaxListed = 10'000;
// Bytes hashed for one listing with ?digest=1: the rest of the page keeps sha256 null
// (`undigested`) and the next request goes on, the digests computed so far being cached.
constexpr int64_t kDigestBudgetBytes = int64_t{1} << 30;
constexpr size_t kMaxCachedDigests = 100'000;

// Digests computed on request, by (run, kind, path), valid while the file's size and mtime stay.
class DigestCache {
 public:
  std::string Find(const std::string& key, int64_t size, int64_t mtime_ms) {
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.size != size || it->second.mtime_ms != mtime_ms)
      return "";
    return it->second.sha256;
  }
  void Put(const std::string& key, int64_t size, int64_t mtime_ms, const std::string& sha256) {
    MutexLock lock(&mu_);
    if (entries_.size() >= kMaxCachedDigests) entries_.clear();  // a bound, not an LRU
    Entry& e = entries_[key];
    e.size = size;
    e.mtime_ms = mtime_ms;
    e.sha256 = sha256;
  }

 private:
  struct Entry {
    int64_t size = 0, mtime_ms = 0;
    std::string sha256;
  };
  Mutex mu_;
  std::map<std::string, Entry> entries_ TAU_GUARDED_BY(mu_);
};

DigestCache& Digests() {
  static auto* cache = new DigestCache();
  return *cache;
}

// The files are on this server only where its runs run: a cluster's pods write theirs to the
// cluster's volumes.
Status CheckLocal(Controller* controller) {
  if (controller->Caps().files_on_server) return Status::Ok();
  return FailedPrecondition(fmt::format(
      "artifacts are not available on the {} backend: a run's checkpoints and outputs are on the "
      "cluster's volumes, not on this server; read them from the volume (storage in "
      "platform.yaml)",
      controller->BackendName()));
}

// "output/a/b.txt" -> ("output", "a/b.txt"), with the relative part checked.
Status SplitArtifactPath(const std::string& path, std::string* kind, std::string* rel) {
  const size_t slash = path.find('/');
  const std::string head = path.substr(0, slash);
  if (head != "checkpoint" && head != "output")
    return InvalidArgument(
        fmt::format("path '{}': start it with checkpoint/ or output/ (as `tau artifacts` lists it)",
                    Printable(path)));
  *kind = head;
  *rel = slash == std::string::npos ? "" : path.substr(slash + 1);
  Status s = CheckRelativePath(*rel);
  if (!s.ok()) return InvalidArgument(fmt::format("path '{}': {}", Printable(path), s.message()));
  return Status::Ok();
}

// What the run's saved record hashed (its final record hashes every artifact): reused when the
// file's size and mtime are the same.
std::vector<evidence::Artifact> RecordedArtifacts(Controller* controller, const std::string& name) {
  auto loaded = evidence::LoadRecord(controller->EvidenceDir(name) + "/record.json");
  if (!loaded.ok()) return {};
  auto parsed = evidence::ParseRecord(*loaded);
  if (!parsed.ok()) return {};
  return std::move(parsed->artifacts);
}

Result<std::string> HashFile(const std::string& root, const std::string& rel, int64_t* size) {
  TAU_ASSIGN_OR_RETURN(int fd, OpenBeneath(root, rel));
  Sha256 h;
  *size = 0;
  TAU_RETURN_IF_ERROR(ReadChunksAndClose(fd, rel, [&](std::string_view c) {
    h.Update(c);
    *size += static_cast<int64_t>(c.size());
  }));
  return h.HexDigest();
}

}  // namespace

void RegisterArtifactsApi(SecureRouter* api, Controller* controller, store::Store* store) {
  api->Route("GET", R"(/api/v1/runs/([a-z0-9-]+)/artifacts)", Access::kRunRead,
             [controller, store](const http::HttpRequest& req, http::HttpResponse& res) {
               const std::string name = req.matches[1];
               auto run = store->GetRun(name);
               if (!run.ok()) return http::ReplyError(res, run.status());
               if (Status s = CheckLocal(controller); !s.ok()) return http::ReplyError(res, s);
               auto offset = IntParam(req, "offset", 0, 0, INT64_MAX);
               if (!offset.ok()) return http::ReplyError(res, offset.status());
               auto limit = IntParam(req, "limit", 1000, 1, static_cast<int64_t>(kMaxListed));
               if (!limit.ok()) return http::ReplyError(res, limit.status());
               const std::string digest = req.get_param_value("digest");
               const bool want_digests = digest == "1" || digest == "true";
               const std::vector<evidence::Artifact> recorded = RecordedArtifacts(controller, name);
               api::ArtifactList list;
               list.run = name;
               list.offset = *offset;
               list.limit = *limit;
               list.max_listed = static_cast<int64_t>(kMaxListed);
               std::vector<evidence::Artifact> all;
               std::map<std::string, std::string> roots;
               for (const char* kind : kKinds) {
                 roots[kind] = controller->StorageDir(*run, kind);
                 bool truncated = false;
                 auto found =
                     evidence::ListArtifacts(roots[kind], kind, kMaxListed, &recorded, &truncated);
                 if (!found.ok()) return http::ReplyError(res, found.status());
                 list.truncated = list.truncated || truncated;
                 for (auto& a : *found) all.push_back(std::move(a));
               }
               list.total = static_cast<int64_t>(all.size());
               auto secrets = SecretValuesOf(store, *run);
               if (!secrets.ok()) return http::ReplyError(res, secrets.status());
               int64_t budget = kDigestBudgetBytes;
               for (int64_t i = *offset; i < list.total && i < *offset + *limit; ++i) {
                 evidence::Artifact& a = all[static_cast<size_t>(i)];
                 const std::string key = name + '\0' + a.kind + '\0' + a.path;
                 if (a.sha256.empty()) a.sha256 = Digests().Find(key, a.size, a.mtime_ms);
                 if (a.sha256.empty() && want_digests && a.size <= budget) {
                   int64_t read = 0;
                   auto sha = HashFile(roots[a.kind], a.path, &read);
                   // A file removed or swapped for a link since the walk keeps no digest.
                   if (sha.ok()) {
                     budget -= read;
                     a.sha256 = *sha;
                     if (read == a.size) Digests().Put(key, a.size, a.mtime_ms, a.sha256);
                   }
                 }
                 api::ArtifactEntry e;
                 // A file named after a secret is listed masked, as the record lists it.
                 e.path = a.kind + "/" + evidence::MaskSecrets(a.path, *secrets);
                 e.kind = a.kind;
                 e.size = a.size;
                 if (!a.sha256.empty())
                   e.sha256 = a.sha256;
                 else
                   ++list.undigested;
                 e.modified = FormatRfc3339(a.mtime_ms);
                 list.artifacts.push_back(std::move(e));
               }
               http::Reply(res, 200, list.ToJson());
             });

  api->Route("GET", R"(/api/v1/runs/([a-z0-9-]+)/artifacts/file)", Access::kRunRead,
             [controller, store](const http::HttpRequest& req, http::HttpResponse& res) {
               const std::string name = req.matches[1];
               auto run = store->GetRun(name);
               if (!run.ok()) return http::ReplyError(res, run.status());
               if (Status s = CheckLocal(controller); !s.ok()) return http::ReplyError(res, s);
               if (!req.has_param("path"))
                 return http::ReplyError(
                     res, InvalidArgument("query parameter 'path' is required: a path as `tau "
                                          "artifacts` lists it (checkpoint/... or output/...)"));
               std::string kind, rel;
               if (Status s = SplitArtifactPath(req.get_param_value("path"), &kind, &rel); !s.ok())
                 return http::ReplyError(res, s);
               auto fd = OpenBeneath(controller->StorageDir(*run, kind), rel);
               if (!fd.ok())
                 return http::ReplyError(
                     res, Status(fd.status().code(),
                                 fmt::format("run '{}' {}/{}", name, kind, fd.status().message())));
               auto shared_fd = std::shared_ptr<int>(new int(*fd), [](int* p) {
                 ::close(*p);
                 delete p;
               });
               struct stat st {};
               if (::fstat(*shared_fd, &st) != 0)
                 return http::ReplyError(res, IoError("cannot stat " + kind + "/" + rel, errno));
               // The file as it is now: a running run may still append to it, and the client checks
               // that it got this many bytes (a read error would otherwise end the stream early).
               res.headers_out.emplace_back("X-Tau-Size", std::to_string(st.st_size));
               auto left = std::make_shared<int64_t>(static_cast<int64_t>(st.st_size));
               // The file's name for a browser's download; quotes and controls are dropped from it.
               std::string base =
                   rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
               std::string shown;
               for (char c : base)
                 if (static_cast<unsigned char>(c) >= 0x20 && c != '"' && c != '\\' && c != 0x7f)
                   shown += c;
               res.headers_out.emplace_back("Content-Disposition",
                                            fmt::format("attachment; filename=\"{}\"", shown));
               res.content_type = "application/octet-stream";
               res.stream = [shared_fd, left](http::ChunkSink& sink) {
                 char buf[65536];
                 if (*left <= 0) return false;
                 ssize_t n = ::read(*shared_fd, buf,
                                    static_cast<size_t>(std::min<int64_t>(*left, sizeof buf)));
                 if (n <= 0) return false;
                 *left -= n;
                 return sink.Write(std::string_view(buf, static_cast<size_t>(n)));
               };
             });
}

}  // namespace tau::server
