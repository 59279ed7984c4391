#include "controller/controller.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/layout.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "controller/array_throttle.h"
#include "controller/redact.h"
#include "controller/run_storage.h"
#include "controller/workflow_gate.h"
#include "recovery/failure_class.h"
#include "recovery/recovery.h"
#include "recovery/retry.h"
#include "run/run_machine.h"

extern char** environ;

namespace tau::server {

using recovery::FailureClass;
using store::AttemptRecord;
using store::AttemptState;
using store::Batch;
using store::Event;
using store::RunRecord;
using store::RunState;

Controller::Controller(ControllerOptions options, store::Store* store, health::GpuInventory gpus)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : SystemClock()),
      store_(store),
      gpus_(std::move(gpus)) {
  evidence_ = std::make_unique<EvidenceWorker>(
      options_.home, store_, clock_, gpus_,
      [this](const RunRecord& r, bool final_save, const evidence::RecordInput* prev,
             evidence::RuntimeInfo* rt) { backend_->DescribeRuntime(r, final_save, prev, rt); },
      [this](InboxMessage m) { inbox_.Push(std::move(m)); });
  cpu_capacity_milli_ = options_.cpu_capacity_milli;
  memory_capacity_bytes_ = options_.memory_capacity_bytes;
  backend_ = options_.backend;
  PassHost* host = this;
  passes_.push_back(std::make_unique<WorkflowGate>(host));
  passes_.push_back(std::make_unique<ArrayThrottle>(host));
}

Controller::~Controller() { Stop(); }

std::string Controller::StorageDir(const RunRecord& r, const std::string& role) const {
  return server::StorageDir(options_.home, r, role);
}

std::string Controller::AttemptDir(const std::string& name, int attempt) const {
  return layout::AttemptDir(options_.home, name, attempt);
}

Status Controller::Start() {
  if (backend_ == nullptr)
    return InvalidArgument("the controller needs a backend (ControllerOptions::backend)");
  TAU_RETURN_IF_ERROR(LoadPlatformFile());
  RebuildEngine();
  TAU_RETURN_IF_ERROR(LoadLedger());
  // An applied platform, not the built-in default (which describes this machine), unless the
  // default was sized to the backend's cluster.
  const bool applied = (!options_.platform_file.empty() && PathExists(options_.platform_file)) ||
                       options_.default_platform_size.has_value();
  TAU_RETURN_IF_ERROR(backend_->Start(this, applied ? CurrentPlatform().platform.get() : nullptr));
  Batch batch;
  Recover(&batch);
  if (Status s = store_->Commit(batch); s.code() == StatusCode::kUnavailable) {
    // A full disk: the server still starts and serves what the store holds; the loop commits
    // the recovery first, once there is room, before it decides anything else.
    std::fprintf(stderr,
                 "tau server: the disk is full: serving reads; what the restart recovered is "
                 "committed once there is space (%s)\n",
                 s.ToString().c_str());
    recovered_ = std::move(batch);
  } else if (!s.ok()) {
    CommitOrDie(std::move(batch));  // says why, and stops
  }
  if (Status s = RestoreFairUsage(); !s.ok())
    std::fprintf(stderr, "tau server: admission fair sharing: %s\n", s.ToString().c_str());
  sync_all_ = true;  // the first pass gives the engine every recovered run
  RefreshPending(0);
  BuildViews();  // the views of what was recovered, before the loop runs
  evidence_->Start();
  if (options_.loop_thread) thread_ = std::thread(&Controller::Loop, this);
  return Status::Ok();
}

void Controller::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    platform_cv_.SignalAll();
    views_cv_.SignalAll();
    committed_cv_.SignalAll();
  }
  inbox_.Close();
  if (thread_.joinable()) thread_.join();
  // The worker finishes the records already queued (ended runs) before it stops.
  evidence_->Stop();
  if (backend_ != nullptr) backend_->Stop();
}

Resources Controller::Needs(const policy::ResolvedRun& resolved) {
  Resources r;
  r.gpus = resolved.gpus_per_worker * resolved.workers;
  auto total = [&](const char* name) -> const Quantity* {
    auto it = resolved.total_requests.find(name);
    return it == resolved.total_requests.end() ? nullptr : &it->second;
  };
  if (const Quantity* q = total(policy::kCpuResource)) r.cpu_milli = q->milli();
  if (const Quantity* q = total(policy::kMemoryResource)) r.memory_bytes = q->CeilUnits();
  return r;
}

namespace {

// A replica that ran this long before it stopped is restarted after its first backoff again.
constexpr int64_t kReplicaBackoffResetMs = 10 * 60 * 1000;

// What the insert appends to a spec's name, as long as it can be: "-" and 8 random hex digits,
// then, for a run of an array, "-" and its index (up to `max_index`).
std::string NameSuffixLike(std::optional<int64_t> max_index) {
  std::string suffix = "-" + std::string(8, 'f');
  if (max_index) suffix += "-" + std::to_string(*max_index);
  return suffix;
}

// A run's own webhooks sign with secrets of its workspace, as the workspace's do; one that is not
// set would make every delivery fail, so the submission is refused (only the submission: a secret
// removed later fails deliveries, never the run).
Status CheckWebhookSecrets(store::Store* store, const spec::RunSpec& spec,
                           const std::string& workspace) {
  if (spec.policy.webhooks.empty()) return Status::Ok();
  TAU_ASSIGN_OR_RETURN(auto values, store->SecretValues(workspace));
  for (size_t i = 0; i < spec.policy.webhooks.size(); ++i) {
    const std::string& secret = spec.policy.webhooks[i].secret;
    if (!values.count(secret))
      return FailedPrecondition(fmt::format(
          "policy.webhooks[{}].secret: workspace '{}' has no secret '{}' to sign the payload "
          "with; set it with `tau secret set {} {}` (the value is read from the terminal or stdin)",
          i, workspace, secret, workspace, secret));
  }
  return Status::Ok();
}

}  // namespace

Status Controller::InsertWithUniqueName(
    RunRecord* r, const std::string& base,
    const std::function<std::vector<Event>(const std::string& name)>& events) {
  Status inserted;
  for (int attempt = 0; attempt < 8; ++attempt) {
    // 32 random bits: guessing another user's run names is pointless (and gains nothing: access
    // never depends on a name being secret). The spec's name leaves room for them in a label.
    r->name = fmt::format("{}-{}", base, RandomHex(8));
    inserted = store_->InsertRun(r, events(r->name));
    if (inserted.code() != StatusCode::kAlreadyExists) break;
  }
  return inserted;
}

Result<std::vector<std::string>> Controller::BlobsToUpload(const Manifest& manifest,
                                                           const std::string& user,
                                                           const ReadableWorkspaces& readable) {
  const bool stored = PathExists(layout::SnapshotsDir(options_.home) + "/" + manifest.digest);
  // The code of a run the caller may read, whole: theirs to run again (blobs from before the
  // store knew who uploaded what are usable this way too).
  if (stored) {
    TAU_ASSIGN_OR_RETURN(bool used, store_->SnapshotUsedIn(manifest.digest, readable));
    if (used) return std::vector<std::string>();
  }
  std::set<std::string> distinct;
  for (const CodeManifestEntry& f : manifest.files) distinct.insert(f.sha256);
  std::vector<std::string> blobs(distinct.begin(), distinct.end());
  TAU_ASSIGN_OR_RETURN(std::set<std::string> usable, store_->UsableBlobs(user, readable, blobs));
  // A blob the caller may not name is missing to them, exactly as one nobody stored: the answer
  // says nothing of what others uploaded. Sending its bytes proves they have it.
  const std::string blobs_root = layout::BlobsDir(options_.home);
  std::vector<std::string> out;
  for (const std::string& blob : blobs)
    if (!usable.count(blob) || (!stored && !PathExists(blobs_root + "/" + blob)))
      out.push_back(blob);
  return out;
}

Result<Snapshot> Controller::StoreManifest(const Manifest& manifest, const std::string& user,
                                           const ReadableWorkspaces& readable,
                                           std::vector<std::string>* missing) {
  TAU_ASSIGN_OR_RETURN(*missing, BlobsToUpload(manifest, user, readable));
  if (!missing->empty())
    return FailedPrecondition(fmt::format(
        "{} of the code's {} files are not stored on this server for you (blobs the reply's "
        "'missing' lists; a manifest names only blobs you uploaded or that a run you may read "
        "uses); upload them (PUT /api/v1/blobs/SHA256, each file's bytes) and submit again",
        missing->size(), manifest.files.size()));
  return StoreSnapshot(layout::SnapshotsDir(options_.home), layout::BlobsDir(options_.home),
                       manifest);
}

// Recorded once a run uses the snapshot, after its insert: the runs' transaction stays one, and a
// refused submission writes nothing. A lost record costs a blob only its whole-snapshot readers
// and the uploader's quota until the next run of the snapshot records it again.
Status Controller::RecordSnapshot(const Snapshot& snapshot) {
  std::set<std::string> blobs;
  for (const nlohmann::json& f : snapshot.files)
    if (f.contains("sha256") && f["sha256"].is_string())
      blobs.insert(f["sha256"].get<std::string>());
  return store_->AddSnapshotBlobs(snapshot.digest, {blobs.begin(), blobs.end()});
}

Result<Controller::CodeCheck> Controller::CheckCode(std::vector<CodeManifestEntry> manifest,
                                                    const std::string& user,
                                                    const ReadableWorkspaces& readable) {
  if (options_.metrics) options_.metrics->Count("tau_code_missing_checks_total", {});
  TAU_ASSIGN_OR_RETURN(Manifest checked, CheckManifest(std::move(manifest)));
  CodeCheck out;
  out.digest = checked.digest;
  TAU_ASSIGN_OR_RETURN(out.missing, BlobsToUpload(checked, user, readable));
  out.stored =
      out.missing.empty() && PathExists(layout::SnapshotsDir(options_.home) + "/" + checked.digest);
  return out;
}

Result<bool> Controller::StoreCodeBlob(const std::string& user, const std::string& sha256,
                                       std::string_view data) {
  if (!IsSha256Hex(sha256)) return StoreBlob(layout::BlobsDir(options_.home), sha256, data);
  const int64_t size = static_cast<int64_t>(data.size());
  TAU_ASSIGN_OR_RETURN(bool owned, store_->OwnsBlob(user, sha256));
  if (!owned) {
    // What this user uploaded that no run uses yet, and what they are uploading now, stays within
    // the quota: uploads alone cannot fill the server's disk.
    MutexLock lock(&blob_mu_);
    TAU_ASSIGN_OR_RETURN(int64_t unreferenced, store_->UnreferencedBlobBytes(user));
    auto in_flight = blob_bytes_in_flight_.find(user);
    const int64_t held =
        unreferenced + (in_flight == blob_bytes_in_flight_.end() ? 0 : in_flight->second);
    if (held + size > options_.max_unreferenced_blob_bytes)
      return ResourceExhausted(fmt::format(
          "user '{}' has uploaded {} bytes of code that no run uses yet; this blob of {} bytes "
          "would pass the limit of {} bytes (tau server --max-unreferenced-blob-bytes): submit "
          "the runs that use the code uploaded so far, then upload the rest (an upload that no "
          "submission took is removed after a day)",
          user, held, size, options_.max_unreferenced_blob_bytes));
    blob_bytes_in_flight_[user] += size;
  }
  auto added = StoreBlob(layout::BlobsDir(options_.home), sha256, data);
  Status recorded = added.ok() ? store_->AddBlobOwner(user, sha256, size, Now()) : added.status();
  if (!owned) {
    MutexLock lock(&blob_mu_);
    if ((blob_bytes_in_flight_[user] -= size) == 0) blob_bytes_in_flight_.erase(user);
  }
  TAU_RETURN_IF_ERROR(recorded);
  if (*added && options_.metrics) {
    options_.metrics->Count("tau_code_blobs_uploaded_total", {});
    options_.metrics->Count("tau_code_blob_bytes_uploaded_total", {},
                            static_cast<double>(data.size()));
  }
  // New to this caller or not, not to the server: a 200 would tell whoever holds some bytes that
  // someone else uploaded them.
  return !owned;
}

Result<Controller::PreparedRun> Controller::PrepareRun(
    const std::string& spec_yaml, const std::string& spec_file,
    const std::vector<spec::Override>& overrides, const std::string& code_dir,
    const policy::Caller& caller, bool token_user,
    const std::function<Result<Snapshot>()>& make_snapshot, const std::string& name_base,
    const std::string& name_suffix, SubmitError* error) {
  auto refuse = [error](Status s) {
    error->status = std::move(s);
    return error->status;
  };
  spec::ParseOutcome parsed = spec::ParseSpec(spec_yaml, spec_file, overrides);
  if (!parsed.ok()) {
    error->diagnostics = parsed.diagnostics;
    return refuse(InvalidArgument(parsed.ErrorText()));
  }
  const spec::RunSpec& spec = *parsed.spec;
  std::shared_ptr<const policy::Platform> platform = CurrentPlatform().platform;
  auto resolved = policy::Resolve(spec, *platform, caller);
  if (!resolved.ok()) return refuse(resolved.status());
  if (!code_dir.empty()) {
    if (Status s = CheckCodePath(code_dir); !s.ok())
      return refuse(InvalidArgument("code.dir: " + s.message()));
    resolved->code_subdir = code_dir;
  }
  if (Status s = CheckSecrets(spec, resolved->workspace, nullptr); !s.ok()) return refuse(s);
  if (Status s = CheckWebhookSecrets(store_, spec, resolved->workspace); !s.ok()) return refuse(s);
  if (Status s = CheckBudgets(*platform, *resolved, caller.user); !s.ok()) return refuse(s);
  Resources need = Needs(*resolved);
  if (Status s = backend_->CheckFits(need); !s.ok()) return refuse(s);
  auto snapshot = make_snapshot();
  if (!snapshot.ok()) return refuse(snapshot.status());
  SubmissionCheck check;
  check.spec = &spec;
  check.resolved = &*resolved;
  check.platform = platform.get();
  check.need = need;
  check.spec_file = spec_file;
  check.snapshot_dir = snapshot->dir;
  check.snapshot_files = &snapshot->files;
  check.caller = &caller;
  check.token_user = token_user;
  check.run_name = (name_base.empty() ? spec.name : name_base) + name_suffix;
  std::optional<std::string> run_as;
  check.run_as = &run_as;
  if (Status s = backend_->Check(check); !s.ok()) return refuse(s);
  PreparedRun out;
  RunRecord& r = out.record;
  r.spec_name = spec.name;
  r.spec_file = spec_file;
  r.spec_yaml = spec_yaml;
  r.spec_json = spec::ToJson(spec);
  r.config_hash = spec::ConfigHash(r.spec_json);
  r.snapshot_digest = snapshot->digest;
  r.snapshot_dir = snapshot->dir;
  r.workspace = resolved->workspace;
  r.queue = resolved->queue;
  r.priority = resolved->priority;
  r.owner = caller.user;
  r.resolved = policy::ToJson(*resolved);
  r.resources = {{"gpus", need.gpus},
                 {"cpu_milli", need.cpu_milli},
                 {"memory_bytes", need.memory_bytes},
                 {"workers", spec.compute.workers}};
  r.created_ms = r.updated_ms = Now();
  r.run_as = std::move(run_as);
  out.submitted = {{"config_hash", r.config_hash},
                   {"snapshot_digest", r.snapshot_digest},
                   {"files", snapshot->files.size()}};
  out.spec = std::move(*parsed.spec);
  out.resolved = std::move(*resolved);
  out.platform = std::move(platform);
  return out;
}

namespace {

std::vector<Event> SubmissionEvents(const RunRecord& r, const nlohmann::json& submitted) {
  return {
      {0, r.name, r.created_ms, "Submitted", "submitted from " + r.spec_file, submitted, "", ""},
      {0, r.name, r.created_ms, "Queued", "queued in " + r.queue, nlohmann::json::object(), "",
       ""}};
}

}  // namespace

void Controller::Accepted(const RunRecord& r, spec::RunSpec spec) {
  Count("tau_runs_submitted_total", {{"workspace", r.workspace}, {"queue", r.queue}});
  // The loop's view of the run is made here, from the spec just parsed, exactly as Load would make
  // it from the store after a restart: the decision loop, which every run passes through, neither
  // reads the run back nor parses its spec again.
  auto prepared = Load(r, std::move(spec));
  {
    MutexLock lock(&mu_);
    pending_info_[r.name] = WaitingForScheduler();
  }
  PostWrite(NewRun{r.name, prepared.ok() ? std::make_optional(std::move(*prepared))
                                         : std::optional<ActiveRun>()});
}

Result<SubmitOutcome> Controller::Submit(SubmitRequest request, SubmitError* error) {
  const std::string snapshots = layout::SnapshotsDir(options_.home);
  const std::string blobs = layout::BlobsDir(options_.home);
  std::optional<Snapshot> made;  // recorded once the run is inserted
  auto snapshot = [&]() -> Result<Snapshot> {
    Result<Snapshot> stored = !request.manifest
                                  ? StoreSnapshot(snapshots, blobs, std::move(request.code))
                                  : [&]() -> Result<Snapshot> {
      TAU_ASSIGN_OR_RETURN(Manifest manifest, CheckManifest(std::move(*request.manifest)));
      return StoreManifest(manifest, request.caller.user, request.readable_workspaces,
                           &error->missing_blobs);
    }();
    if (stored.ok()) made = *stored;
    return stored;
  };
  TAU_ASSIGN_OR_RETURN(PreparedRun prepared,
                       PrepareRun(request.spec_yaml, request.spec_file, request.spec_overrides,
                                  request.code_dir, request.caller, request.token_user, snapshot,
                                  "", NameSuffixLike(std::nullopt), error));
  if (prepared.spec.serve) {
    error->status = InvalidArgument(
        fmt::format("{}: this spec is a service (kind: service): deploy it with `tau serve deploy` "
                    "(POST /api/v1/services), not as a run",
                    request.spec_file));
    return error->status;
  }
  RunRecord& r = prepared.record;
  r.submit_key = request.idempotency_key;
  auto insert = [&] {
    return InsertWithUniqueName(&r, r.spec_name, [&](const std::string&) {
      return SubmissionEvents(r, prepared.submitted);
    });
  };
  Status inserted;
  if (r.submit_key.empty()) {
    inserted = insert();
  } else {
    MutexLock lock(&submit_mu_);
    auto earlier = store_->FindRunBySubmitKey(r.owner, r.submit_key);
    if (earlier.ok()) {
      if (earlier->config_hash != r.config_hash || earlier->snapshot_digest != r.snapshot_digest) {
        error->status = AlreadyExists(fmt::format(
            "idempotency key '{}' was used for run {} with another spec or other code; a new "
            "submission needs a new key",
            r.submit_key, earlier->name));
        return error->status;
      }
      return SubmitOutcome{std::move(*earlier), true};
    }
    if (earlier.status().code() != StatusCode::kNotFound) {
      error->status = earlier.status();
      return error->status;
    }
    inserted = insert();
  }
  if (!inserted.ok()) {
    error->status = inserted;
    return inserted;
  }
  if (made)
    if (Status s = RecordSnapshot(*made); !s.ok())
      std::fprintf(stderr, "tau server: recording the blobs of snapshot %s: %s\n",
                   made->digest.c_str(), s.ToString().c_str());
  Accepted(r, std::move(prepared.spec));
  return SubmitOutcome{std::move(r), false};
}

Result<BatchOutcome> Controller::SubmitBatch(BatchRequest request, BatchError* error) {
  auto refuse = [error](Status s, std::optional<size_t> index = std::nullopt) {
    error->index = index;
    error->status = std::move(s);
    return error->status;
  };
  const size_t n = request.items.size();
  if (n == 0) return refuse(InvalidArgument("a batch needs at least one run in 'runs'"));
  if (n > kMaxBatchRuns)
    return refuse(ResourceExhausted(fmt::format(
        "a batch holds at most {} runs; this one has {}: send it as several", kMaxBatchRuns, n)));
  if (request.array) {
    const BatchArray& a = *request.array;
    if (a.step < 1 || a.first < 0 || a.last < a.first)
      return refuse(InvalidArgument(
          fmt::format("array: first {} and last {} must be 0 <= first <= last, step {} at least 1",
                      a.first, a.last, a.step)));
    const int64_t count = (a.last - a.first) / a.step + 1;
    if (a.max_parallel &&
        (*a.max_parallel < 1 || *a.max_parallel > static_cast<int64_t>(kMaxBatchRuns)))
      return refuse(InvalidArgument(
          fmt::format("array: max_parallel {} must be 1 to {}", *a.max_parallel, kMaxBatchRuns)));
    if (static_cast<uint64_t>(count) != n)
      return refuse(
          InvalidArgument(fmt::format("array: {}-{}:{} has {} indices, but the batch has {} runs",
                                      a.first, a.last, a.step, count, n)));
  }
  const bool workflow = !request.workflow.empty();
  if (workflow) {
    if (request.array)
      return refuse(InvalidArgument("a batch is an array or a workflow, not both"));
    if (!IsDns1123Label(request.workflow, spec::kMaxStageNameLength))
      return refuse(InvalidArgument(fmt::format(
          "workflow: '{}' is not a DNS-1123 label of at most {} characters (lowercase letters, "
          "digits and '-')",
          request.workflow, spec::kMaxStageNameLength)));
    std::vector<spec::WorkflowStage> stages(n);
    for (size_t i = 0; i < n; ++i) {
      stages[i].name = request.items[i].stage;
      stages[i].after = request.items[i].after;
    }
    std::vector<spec::GraphProblem> problems = spec::CheckStageGraph(stages);
    if (!problems.empty()) {
      const spec::GraphProblem& p = problems.front();
      return refuse(InvalidArgument(spec::GraphProblemPlace(p, "runs", "stage") + ": " + p.message),
                    p.part == spec::GraphProblem::Part::kGraph ? std::nullopt
                                                               : std::optional<size_t>(p.stage));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const BatchItem& item = request.items[i];
    if (!workflow && (!item.stage.empty() || !item.after.empty()))
      return refuse(InvalidArgument(fmt::format(
                        "runs[{}].stage: only the runs of a workflow (the batch's 'workflow') "
                        "have a stage and stages they wait for",
                        i)),
                    i);
    if (item.code >= request.codes.size())
      return refuse(InvalidArgument(fmt::format("runs[{}].code: {} is not an index of 'codes' "
                                                "(it has {})",
                                                i, item.code, request.codes.size())),
                    i);
    if (!request.array && item.array_index)
      return refuse(InvalidArgument(fmt::format(
                        "runs[{}].array_index: only the runs of an array (the batch's 'array') "
                        "have one",
                        i)),
                    i);
    if (request.array) {
      const int64_t want = request.array->first + static_cast<int64_t>(i) * request.array->step;
      if (!item.array_index || *item.array_index != want)
        return refuse(InvalidArgument(fmt::format(
                          "runs[{}].array_index: the array's run {} has index {}", i, i, want)),
                      i);
    }
  }
  // Each code once: checked and snapshotted when the first item that uses it gets that far.
  const std::string snapshots = layout::SnapshotsDir(options_.home);
  const std::string blobs = layout::BlobsDir(options_.home);
  std::vector<std::optional<Result<Snapshot>>> stored(request.codes.size());
  // Items with the same spec and code are the same submission but for their place: checked once.
  std::map<std::tuple<std::string_view, std::string_view, size_t, std::string>, size_t> seen;
  // Checked once for items alike: with the longest index's name.
  std::optional<int64_t> longest_index;
  if (request.array) {
    const int64_t first = request.array->first, last = request.array->last;
    longest_index = std::to_string(first).size() > std::to_string(last).size() ? first : last;
  }
  // A workflow's runs are "<workflow>-<hex>-<stage>", checked with its longest stage name.
  std::string name_base, name_suffix = NameSuffixLike(longest_index);
  if (workflow) {
    name_base = request.workflow;
    size_t longest = 0;
    for (const BatchItem& item : request.items) longest = std::max(longest, item.stage.size());
    name_suffix += "-" + std::string(longest, 'x');
  }
  std::vector<PreparedRun> distinct;
  std::vector<size_t> which(n);
  for (size_t i = 0; i < n; ++i) {
    const BatchItem& item = request.items[i];
    std::string set;
    for (const spec::Override& o : item.spec_overrides) (set += o.Text()) += '\n';
    auto key = std::make_tuple(std::string_view(item.spec_yaml), std::string_view(item.spec_file),
                               item.code, std::move(set));
    if (auto at = seen.find(key); at != seen.end()) {
      which[i] = at->second;
      continue;
    }
    BatchCode& code = request.codes[item.code];
    auto snapshot = [&]() -> Result<Snapshot> {
      std::optional<Result<Snapshot>>& s = stored[item.code];
      if (!s) {
        if (!code.manifest) {
          s = StoreSnapshot(snapshots, blobs, std::move(code.files));
        } else {
          auto manifest = CheckManifest(std::move(*code.manifest));
          std::vector<std::string> missing;
          s = manifest.ok() ? StoreManifest(*manifest, request.caller.user,
                                            request.readable_workspaces, &missing)
                            : Result<Snapshot>(manifest.status());
        }
      }
      return *s;
    };
    SubmitError one;
    auto prepared =
        PrepareRun(item.spec_yaml, item.spec_file, item.spec_overrides, code.dir, request.caller,
                   request.token_user, snapshot, name_base, name_suffix, &one);
    if (!prepared.ok()) {
      error->diagnostics = std::move(one.diagnostics);
      return refuse(Status(prepared.status().code(),
                           fmt::format("runs[{}]: {}", i, prepared.status().message())),
                    i);
    }
    if (prepared->spec.serve)
      return refuse(InvalidArgument(fmt::format(
                        "runs[{}]: {} is a service (kind: service): deploy it with `tau serve "
                        "deploy`, not as a run",
                        i, item.spec_file)),
                    i);
    which[i] = distinct.size();
    seen.emplace(key, distinct.size());
    distinct.push_back(std::move(*prepared));
  }
  std::vector<RunRecord> runs(n);
  for (size_t i = 0; i < n; ++i) {
    runs[i] = distinct[which[i]].record;
    if (!request.idempotency_key.empty())
      runs[i].submit_key = fmt::format("{}/{}", request.idempotency_key, i);
  }
  const std::string owner = request.caller.user;
  // Names drawn again, all of them, while one is taken (32 random bits each, as
  // InsertWithUniqueName draws). An array's runs share one draw: "<spec name>-<hex>-<index>".
  auto insert = [&]() -> Status {
    Status inserted;
    for (int attempt = 0; attempt < 8; ++attempt) {
      std::string array_name, workflow_name;
      if (request.array) array_name = fmt::format("{}-{}", runs[0].spec_name, RandomHex(8));
      if (workflow) workflow_name = fmt::format("{}-{}", request.workflow, RandomHex(8));
      std::vector<std::vector<Event>> events(n);
      for (size_t i = 0; i < n; ++i) {
        RunRecord& r = runs[i];
        if (request.array) {
          const int64_t index = *request.items[i].array_index;
          r.name = fmt::format("{}-{}", array_name, index);
          r.array = {{"name", array_name},
                     {"index", index},
                     {"first", request.array->first},
                     {"last", request.array->last},
                     {"step", request.array->step}};
          if (request.array->max_parallel) r.array["max_parallel"] = *request.array->max_parallel;
        } else if (workflow) {
          const BatchItem& item = request.items[i];
          r.name = fmt::format("{}-{}", workflow_name, item.stage);
          nlohmann::json after = nlohmann::json::array();
          for (const spec::StageDependency& d : item.after)
            after.push_back({{"stage", d.stage},
                             {"run", fmt::format("{}-{}", workflow_name, d.stage)},
                             {"condition", spec::ConditionName(d.condition)}});
          r.workflow = {{"name", workflow_name}, {"stage", item.stage}, {"after", after}};
        } else {
          r.name = fmt::format("{}-{}", r.spec_name, RandomHex(8));
        }
        events[i] = SubmissionEvents(r, distinct[which[i]].submitted);
        if (!r.array.is_null()) events[i][0].data["array"] = r.array;
        if (!r.workflow.is_null()) events[i][0].data["workflow"] = r.workflow;
      }
      inserted = store_->InsertRuns(&runs, std::move(events));
      if (inserted.code() != StatusCode::kAlreadyExists) break;
    }
    return inserted;
  };
  Status inserted;
  if (request.idempotency_key.empty()) {
    inserted = insert();
  } else {
    MutexLock lock(&submit_mu_);
    auto first = store_->FindRunBySubmitKey(owner, runs[0].submit_key);
    if (first.ok()) {
      // Sent before: the same runs, when it was the same batch.
      BatchOutcome replay;
      replay.replayed = true;
      for (size_t i = 0; i < n; ++i) {
        auto earlier =
            i == 0 ? std::move(first) : store_->FindRunBySubmitKey(owner, runs[i].submit_key);
        if (!earlier.ok() && earlier.status().code() != StatusCode::kNotFound)
          return refuse(earlier.status());
        if (!earlier.ok() || earlier->config_hash != runs[i].config_hash ||
            earlier->snapshot_digest != runs[i].snapshot_digest ||
            earlier->array.is_null() != !request.array ||
            (request.array &&
             earlier->array.value("index", int64_t{-1}) != *request.items[i].array_index) ||
            (workflow && (!earlier->workflow.is_object() ||
                          earlier->workflow.value("stage", "") != request.items[i].stage)))
          return refuse(AlreadyExists(fmt::format(
              "idempotency key '{}' was used for another batch (its run {} differs from this "
              "one's); a new batch needs a new key",
              request.idempotency_key, i)));
        replay.runs.push_back(std::move(*earlier));
      }
      auto more =
          store_->FindRunBySubmitKey(owner, fmt::format("{}/{}", request.idempotency_key, n));
      if (more.ok())
        return refuse(AlreadyExists(fmt::format(
            "idempotency key '{}' was used for a batch of more than {} runs; a new batch needs a "
            "new key",
            request.idempotency_key, n)));
      return replay;
    }
    if (first.status().code() != StatusCode::kNotFound) return refuse(first.status());
    inserted = insert();
  }
  if (!inserted.ok()) return refuse(inserted);
  for (const std::optional<Result<Snapshot>>& s : stored)
    if (s && s->ok())
      if (Status recorded = RecordSnapshot(**s); !recorded.ok())
        std::fprintf(stderr, "tau server: recording the blobs of snapshot %s: %s\n",
                     (*s)->digest.c_str(), recorded.ToString().c_str());
  // Handed to the loop as Accepted hands one run, but each distinct submission is loaded once: its
  // runs' views differ only in what Load takes from the record itself (its name and sequence).
  std::vector<std::optional<ActiveRun>> views(distinct.size());
  std::vector<bool> loaded(distinct.size(), false);
  for (size_t i = 0; i < n; ++i) {
    const RunRecord& r = runs[i];
    const size_t d = which[i];
    if (!loaded[d]) {
      loaded[d] = true;
      if (auto view = Load(r, distinct[d].spec); view.ok()) {
        views[d] = std::move(*view);
        views[d]->record = RunRecord();  // each copy gets its own
      }
    }
    std::optional<ActiveRun> view = views[d];
    if (view) {
      view->record = r;
      view->workload.name = r.name;
      view->workload.created_ms = r.seq;
    }
    Count("tau_runs_submitted_total", {{"workspace", r.workspace}, {"queue", r.queue}});
    {
      // A workflow stage held for the stages before it says so from the start, not only once a
      // pass has seen it (the views may be a pass old).
      MutexLock lock(&mu_);
      pending_info_[r.name] = view && WaitsForUpstream(*view) ? UpstreamPendingEntry(r.queue, {})
                                                              : WaitingForScheduler();
    }
    PostWrite(NewRun{r.name, std::move(view)});
  }
  BatchOutcome out;
  out.runs = std::move(runs);
  return out;
}

Status Controller::Cancel(const std::string& name, std::string* pending) {
  TAU_ASSIGN_OR_RETURN(RunRecord r, store_->GetRun(name));
  if (store::IsTerminal(r.state))
    return FailedPrecondition(
        fmt::format("run '{}' has already finished ({})", name, store::RunStateName(r.state)));
  WaitCommitted(PostWrite(CancelRequest{name}), pending);
  return Status::Ok();
}

namespace {

// A service's replicas belong to the service (docs/serving.md): a rerun would be a run of no
// service that restarts forever without the service's model or port, and a resume would start
// what the service drained. Said with what to do instead.
Status RefuseReplica(const RunRecord& run, const char* what) {
  if (!run.service.is_object()) return Status::Ok();
  const std::string service = run.service.value("name", "");
  if (service.empty()) return Status::Ok();
  return FailedPrecondition(fmt::format(
      "run '{}' is a replica of service '{}' (revision {}) and cannot be {}: the service keeps "
      "its replicas. `tau serve update {} FILE` rolls out a new revision, `tau serve scale {} N` "
      "sets how many replicas run, `tau serve rollback {}` goes back a revision (tau serve "
      "status {} shows them)",
      run.name, service, run.service.value("revision", int64_t{0}), what, service, service, service,
      service));
}

}  // namespace

Result<RunRecord> Controller::Rerun(const std::string& name, std::string* warning,
                                    const std::vector<spec::Override>& overrides,
                                    const policy::Caller* caller, bool token_user,
                                    SubmitError* error) {
  TAU_ASSIGN_OR_RETURN(RunRecord from, store_->GetRun(name));
  TAU_RETURN_IF_ERROR(RefuseReplica(from, "rerun"));
  // The run's own --set overrides, so that a rerun is the run that was, not the file alone.
  const std::vector<spec::Override> recorded = spec::RecordedOverrides(from.spec_json);
  if (!PathExists(from.snapshot_dir))
    return FailedPrecondition("the code snapshot of '" + name + "' is gone from " +
                              from.snapshot_dir);
  if (!overrides.empty())
    return RerunWithOverrides(from, recorded, overrides, caller, token_user, error);
  TAU_ASSIGN_OR_RETURN(RunRecord r, RecordFrom(from, warning));
  Status inserted = InsertWithUniqueName(&r, r.spec_name, [&](const std::string& run) {
    return std::vector<Event>{
        {0,
         run,
         r.created_ms,
         "Submitted",
         "rerun of " + name,
         {{"rerun_of", name},
          {"config_hash", r.config_hash},
          {"snapshot_digest", r.snapshot_digest}},
         "",
         ""},
        {0, run, r.created_ms, "Queued", "queued in " + r.queue, nlohmann::json::object(), "", ""}};
  });
  TAU_RETURN_IF_ERROR(inserted);
  PostWrite(NewRun{r.name, std::nullopt});
  return r;
}

Result<RunRecord> Controller::RecordFrom(const RunRecord& from, std::string* warning) {
  const std::string& name = from.name;
  if (!PathExists(from.snapshot_dir))
    return FailedPrecondition("the code snapshot of '" + name + "' is gone from " +
                              from.snapshot_dir);
  spec::ParseOutcome parsed =
      spec::ParseSpec(from.spec_yaml, from.spec_file, spec::RecordedOverrides(from.spec_json));
  if (!parsed.ok())
    return FailedPrecondition("the recorded spec of '" + name + "' no longer validates:\n" +
                              parsed.ErrorText());
  const spec::RunSpec& spec = *parsed.spec;
  RunRecord r;
  r.spec_name = spec.name;
  r.spec_file = from.spec_file;
  r.spec_yaml = from.spec_yaml;
  r.spec_json = spec::ToJson(spec);
  r.config_hash = spec::ConfigHash(spec);
  if (r.config_hash != from.config_hash)
    *warning = fmt::format(
        "the recorded spec now gives config hash {} where '{}' recorded {}: this tau reads it "
        "differently",
        r.config_hash.substr(0, 12), name, from.config_hash.substr(0, 12));
  r.snapshot_digest = from.snapshot_digest;
  r.snapshot_dir = from.snapshot_dir;
  r.workspace = from.workspace;
  r.queue = from.queue;
  r.priority = from.priority;
  r.resources = from.resources;
  r.owner = from.owner;
  r.resolved = from.resolved;  // the same queue, priority and shape as the run it reproduces
  r.created_ms = r.updated_ms = Now();
  return r;
}

Result<RunRecord> Controller::RerunWithOverrides(const RunRecord& from,
                                                 const std::vector<spec::Override>& recorded,
                                                 const std::vector<spec::Override>& overrides,
                                                 const policy::Caller* caller, bool token_user,
                                                 SubmitError* error) {
  if (caller == nullptr) return Internal("a rerun with --set needs the caller to resolve it for");
  SubmitError local;
  if (error == nullptr) error = &local;
  // The stored snapshot as it is: the same code, described as a submission's would be.
  auto snapshot = [&]() -> Result<Snapshot> {
    TAU_ASSIGN_OR_RETURN(std::vector<CodeFile> files, ReadSnapshot(from.snapshot_dir));
    Snapshot out;
    out.digest = from.snapshot_digest;
    out.dir = from.snapshot_dir;
    out.files = nlohmann::json::array();
    for (const CodeFile& f : files)
      out.files.push_back({{"path", f.path},
                           {"size", f.data.size()},
                           {"sha256", Sha256Hex(f.data)},
                           {"mode", f.mode}});
    return out;
  };
  const std::string code_dir =
      from.resolved.is_object() ? from.resolved.value("code_subdir", "") : "";
  const std::vector<spec::Override> all = spec::MergeOverrides(recorded, overrides);
  // Parsed and resolved again, as a submission is: what the --set changes (compute, queue,
  // priority) may give another queue, shape or refusal than the run had.
  TAU_ASSIGN_OR_RETURN(PreparedRun prepared,
                       PrepareRun(from.spec_yaml, from.spec_file, all, code_dir, *caller,
                                  token_user, snapshot, "", NameSuffixLike(std::nullopt), error));
  RunRecord& r = prepared.record;
  nlohmann::json data = prepared.submitted;
  data["rerun_of"] = from.name;
  nlohmann::json set = nlohmann::json::array();
  for (const spec::Override& o : overrides) set.push_back(o.Text());
  data["set"] = std::move(set);
  Status inserted = InsertWithUniqueName(&r, r.spec_name, [&](const std::string& run) {
    return std::vector<Event>{
        {0, run, r.created_ms, "Submitted", "rerun of " + from.name + " with --set", data, "", ""},
        {0, run, r.created_ms, "Queued", "queued in " + r.queue, nlohmann::json::object(), "", ""}};
  });
  if (!inserted.ok()) {
    error->status = inserted;
    return inserted;
  }
  Accepted(r, std::move(prepared.spec));
  return r;
}

Status Controller::Resume(const std::string& name, const std::string& from, bool force,
                          std::string* pending) {
  TAU_ASSIGN_OR_RETURN(RunRecord r, store_->GetRun(name));
  TAU_RETURN_IF_ERROR(RefuseReplica(r, "resumed"));
  if (!store::IsTerminal(r.state))
    return FailedPrecondition(
        fmt::format("run '{}' is still {}", name, store::RunStateName(r.state)));
  if (r.state == RunState::kSucceeded)
    return FailedPrecondition(
        fmt::format("run '{}' succeeded; `tau rerun {}` starts it again as a new run", name, name));
  if (r.reason == recovery::FailureClassName(FailureClass::kOOMKilled) && !force)
    return FailedPrecondition(
        fmt::format("run '{}' was OOMKilled: another attempt with the same memory will likely die "
                    "the same way. "
                    "Give it more memory and `tau rerun`, or resume anyway with --force",
                    name));
  std::string checkpoint;
  if (!from.empty()) {
    // Only the run's own checkpoints: a resume must not read other runs' or the server's files.
    std::string dir = StorageDir(r, "checkpoint");
    std::string candidate = from.front() == '/' ? from : dir + "/" + from;
    std::error_code ec;
    std::string real = std::filesystem::weakly_canonical(candidate, ec).string();
    std::string root = std::filesystem::weakly_canonical(dir, ec).string() + "/";
    if (ec || !StartsWith(real, root) || !PathExists(real))
      return InvalidArgument(fmt::format(
          "checkpoint '{}' is not in run '{}''s checkpoint directory {}", from, name, dir));
    root.pop_back();
    if (std::string why = recovery::IncompleteCheckpointReason(root, real); !why.empty())
      return InvalidArgument(fmt::format(
          "checkpoint '{}' is not complete: {}; name a complete one, or leave out --from for the "
          "newest complete checkpoint",
          from, why));
    checkpoint = real;
  }
  WaitCommitted(PostWrite(ResumeRequest{name, checkpoint}), pending);
  return Status::Ok();
}

void Controller::HandleResume(const ResumeRequest& request, Batch* batch) {
  if (active_.count(request.name)) return;  // resumed twice: the first one won
  auto record = store_->GetRun(request.name);
  if (!record.ok() || !store::IsTerminal(record->state) || record->state == RunState::kSucceeded)
    return;
  auto loaded = Load(*record);
  if (!loaded.ok()) return;
  ActiveRun& run = active_[request.name] = std::move(*loaded);
  RunRecord& r = run.record;
  r.cancel_requested = false;
  r.not_before_ms.reset();
  r.reason.clear();  // how it ended is history now, kept in its events and attempts
  r.message.clear();
  run.resume_from = request.from;
  run.queued_since_ms = Now();
  Transition(
      run, RunState::kQueued, "Resumed",
      request.from.empty() ? "resumed by request" : "resumed by request from " + request.from,
      batch, {{"from", request.from}});
  batch->runs.push_back(r);
}

void Controller::OnGpuVerdict(int gpu, bool placeable, bool stop_running, const std::string& why) {
  inbox_.Push(GpuNews{gpu, placeable, stop_running, why});
}

void Controller::OnGpuSamples(std::vector<evidence::GpuSample> samples) {
  if (!samples.empty()) inbox_.Push(GpuSamples{std::move(samples)});
}

nlohmann::json Controller::PendingInfo(const std::string& name) {
  MutexLock lock(&mu_);
  // One run's entry needs no wait for the caller's writes: a run submitted since the views were
  // built has its placeholder, and waiting for a build after every submission made a burst of N
  // submissions cost N builds of O(N).
  FreshViews(/*now=*/false, /*own_writes=*/false);
  auto it = pending_info_.find(name);
  // Not queued, or queued since the views were built: a pass will say.
  return it == pending_info_.end() ? nlohmann::json() : it->second;
}

nlohmann::json Controller::Capacity() {
  MutexLock lock(&mu_);
  FreshViews();
  return capacity_info_;
}

void Controller::Count(const std::string& name, const Labels& labels) {
  if (options_.metrics) options_.metrics->Count(name, labels);
}

void Controller::CountAttempt(const AttemptRecord& a) {
  Count("tau_attempts_total",
        {{"failure_class",
          a.reason.empty() ? recovery::FailureClassName(FailureClass::kUnknown) : a.reason}});
}

void Controller::CommitOrDie(Batch batch) {
  if (batch.empty()) return;
  auto start = std::chrono::steady_clock::now();
  Status s = store_->Commit(batch);
  if (options_.metrics) {
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    options_.metrics->Observe("tau_store_commit_duration_seconds", {}, took.count());
  }
  // A full disk: decisions wait (attempts keep running, the API keeps answering) until there is
  // room, rather than the server stopping for what a user can fix.
  for (int waited_s = 0; s.code() == StatusCode::kUnavailable; ++waited_s) {
    if (waited_s % 60 == 0) {
      std::fprintf(stderr, "tau server: cannot commit, waiting for space: %s\n",
                   s.ToString().c_str());
      MutexLock lock(&mu_);
      commit_trouble_ = s.message();  // what an API call that waits for a commit is told
    }
    // Stopping now loses nothing: the last committed state is what a restart recovers.
    if (inbox_.WaitClosed(1000)) std::_Exit(70);
    s = store_->Commit(batch);
    if (s.ok()) {
      std::fprintf(stderr, "tau server: committed again after waiting for space\n");
      MutexLock lock(&mu_);
      commit_trouble_.clear();
    }
  }
  if (!s.ok()) {
    // Acting on a state change that is not durable could lose or duplicate a run: stop instead. A
    // restart recovers from the last committed state.
    std::fprintf(stderr, "tau server: fatal: cannot commit to the store: %s\n",
                 s.ToString().c_str());
    std::_Exit(70);
  }
}

void Controller::Transition(ActiveRun& run, RunState state, const std::string& event_type,
                            const std::string& message, Batch* batch, nlohmann::json data) {
  Status s = run::Transition(run.record, state, event_type, message, std::move(data), Now(), batch);
  if (s.ok()) return;
  // A move the table refuses is the control plane's bug, not the run's: said and counted.
  std::fprintf(stderr, "tau server: bug: %s\n", s.message().c_str());
  Count("tau_run_transitions_refused_total", {{"to", store::RunStateName(state)}});
}

void Controller::Finish(ActiveRun& run, RunState state, const std::string& reason,
                        const std::string& message, Batch* batch) {
  RunRecord& r = run.record;
  r.reason = reason;
  r.message = message;
  r.finished_ms = Now();
  nlohmann::json data = {{"reason", reason}};
  if (r.exit_code) data["exit_code"] = *r.exit_code;
  if (r.signal) data["signal"] = *r.signal;
  // Metered before its last event (the run's end stays its last word); ReleaseResources below
  // then finds it ended, holding nothing to meter again.
  Meter(run, batch);
  Transition(run, state, store::RunStateName(state), message, batch, data);
  if (options_.metrics && r.started_ms)
    options_.metrics->Observe("tau_run_duration_seconds", {{"state", store::RunStateName(state)}},
                              static_cast<double>(*r.finished_ms - *r.started_ms) / 1000.0);
  ReleaseResources(run, batch);
  batch->runs.push_back(r);
  RunEnded(r);
}

void Controller::ReleaseResources(ActiveRun& run, Batch* batch) {
  Meter(run, batch);  // before its flavors and admission time go
  backend_->Release(run);
  RunRecord& r = run.record;
  r.gpus.clear();
  // A run that ends keeps the time of its last admission; one that goes back to the queue waits
  // for a new one.
  if (!store::IsTerminal(r.state)) r.admitted_ms.reset();
  r.flavors = nlohmann::json::object();
  if (quota_.EraseFromEngine(r.name)) (void)quota_.engine->RemoveWorkload(r.name);
  quota_.outside.erase(r.name);
}

void Controller::FailAttempt(ActiveRun& run, FailureClass failure_class, const std::string& message,
                             Batch* batch) {
  RunRecord& r = run.record;
  const std::optional<int> exit_code = r.exit_code;  // the failed attempt's, gone once requeued
  const recovery::RetryPolicy policy = spec::RetryPolicyOf(run.spec.resilience);
  // Earlier attempts preempted and requeued used no retry (the failing one is in `batch`).
  std::vector<store::AttemptRecord> attempts;
  if (auto listed = store_->ListAttempts(r.name); listed.ok()) attempts = std::move(*listed);
  std::optional<int64_t> failed_started_ms;
  for (const store::AttemptRecord& a : attempts)
    if (a.number == r.attempts && a.started_ms > 0) failed_started_ms = a.started_ms;
  const recovery::AttemptHistory history = run::HistoryOf(r, attempts);
  const int64_t now = Now();
  recovery::RetryDecision decision = recovery::Decide(policy, history, failure_class, now);
  // A service's replica that had served for a while starts again after the first backoff, not
  // the longest its earlier crashes had reached (as the kubelet resets a container's backoff).
  if (decision.retry && run.spec.serve && failed_started_ms &&
      now - *failed_started_ms >= kReplicaBackoffResetMs)
    decision.backoff_ms = policy.backoff_initial_ms;
  if (!decision.retry) {
    Finish(run, RunState::kFailed, recovery::FailureClassName(failure_class),
           recovery::StopMessage(policy, decision, message), batch);
    return;
  }
  ReleaseResources(run, batch);
  r.reason = recovery::FailureClassName(failure_class);
  r.message = message;
  r.not_before_ms = now + decision.backoff_ms;
  run.queued_since_ms = *r.not_before_ms;
  Transition(run, RunState::kQueued, "Retrying",
             recovery::RetryingMessage(policy, history, failure_class, decision, exit_code), batch,
             {{"failure_class", recovery::FailureClassName(failure_class)},
              {"backoff_ms", decision.backoff_ms}});
  batch->runs.push_back(r);
}

Result<ActiveRun> Controller::Load(const RunRecord& record) {
  spec::ParseOutcome parsed = spec::ParseSpec(record.spec_yaml, record.spec_file,
                                              spec::RecordedOverrides(record.spec_json));
  if (!parsed.ok())
    return InvalidArgument("the recorded spec no longer parses: " + parsed.ErrorText());
  return Load(record, std::move(*parsed.spec));
}

Result<ActiveRun> Controller::Load(const RunRecord& record, spec::RunSpec spec) {
  ActiveRun run;
  run.record = record;
  run.spec = std::move(spec);
  if (record.resolved.empty()) {
    // Recorded before platform policy existed: its queue and shape are the spec's own.
    run.resolved.workspace = record.workspace;
    run.resolved.queue = record.queue;
    run.resolved.priority = record.priority;
    run.resolved.workers = run.spec.compute.workers;
    run.resolved.gpus_per_worker = run.spec.compute.gpus;
    run.resolved.cpus_per_worker = run.spec.compute.cpus;
    run.resolved.memory_per_worker = run.spec.compute.memory;
    run.resolved.max_runtime_ms = run.spec.max_runtime_ms;
    int w = run.resolved.workers;
    if (run.spec.compute.cpus)
      run.resolved.total_requests[policy::kCpuResource] =
          Quantity::FromMilli(run.spec.compute.cpus->milli() * w);
    if (run.spec.compute.memory)
      run.resolved.total_requests[policy::kMemoryResource] =
          Quantity::FromMilli(run.spec.compute.memory->milli() * w);
    if (run.spec.compute.gpus > 0)
      run.resolved.total_requests[policy::kGpuResource] =
          Quantity::FromUnits(int64_t{run.spec.compute.gpus} * w);
  } else {
    TAU_ASSIGN_OR_RETURN(run.resolved, policy::ResolvedRunFromJson(record.resolved));
  }
  // The run executes with its resolved shape (a compute profile may set GPUs, CPUs and memory; a
  // workspace limit may cap the runtime).
  run.spec.compute.workers = run.resolved.workers;
  run.spec.compute.gpus = run.resolved.gpus_per_worker;
  run.spec.compute.cpus = run.resolved.cpus_per_worker;
  run.spec.compute.memory = run.resolved.memory_per_worker;
  run.spec.max_runtime_ms = run.resolved.max_runtime_ms;
  run.need = Needs(run.resolved);
  run.queued_since_ms = record.not_before_ms.value_or(record.updated_ms);
  // The engine's view: one pod set of `workers` pods. Its queue-order timestamp is the submission
  // sequence, so runs submitted within the same millisecond keep their order.
  admission::Workload& wl = run.workload;
  wl.name = record.name;
  wl.queue = run.resolved.queue;
  wl.local_queue = policy::LocalQueueName(record.workspace, run.resolved.queue);
  wl.priority = run.resolved.priority;
  wl.created_ms = record.seq;
  // The engine's view, as Kueue sees a RayJob or a Job: the workers' pod set, and the head's when
  // the resolution sized one.
  admission::PodSet ps;
  ps.count = std::max(1, run.resolved.workers);
  if (run.resolved.cpus_per_worker)
    ps.requests[policy::kCpuResource] = *run.resolved.cpus_per_worker;
  if (run.resolved.memory_per_worker)
    ps.requests[policy::kMemoryResource] = *run.resolved.memory_per_worker;
  if (run.resolved.gpus_per_worker > 0)
    ps.requests[policy::kGpuResource] = Quantity::FromUnits(run.resolved.gpus_per_worker);
  ps.node_selector = run.resolved.node_selector;
  ps.allowed_flavors = run.resolved.flavors;
  wl.pod_sets = {std::move(ps)};
  if (const std::optional<policy::PodResources>& head = run.resolved.head) {
    admission::PodSet hs;
    hs.name = "head";
    hs.count = 1;
    if (head->cpus) hs.requests[policy::kCpuResource] = *head->cpus;
    if (head->memory) hs.requests[policy::kMemoryResource] = *head->memory;
    // No selector, as the rendered head has none: any flavor of the queue may hold it.
    if (!hs.requests.empty()) wl.pod_sets.push_back(std::move(hs));
  }
  return run;
}

void Controller::Recover(Batch* batch) {
  store::RunFilter filter;
  filter.active_only = true;
  filter.newest_first = false;
  auto runs = store_->ListRuns(filter);
  if (!runs.ok()) {
    std::fprintf(stderr, "tau server: cannot list runs: %s\n", runs.status().ToString().c_str());
    std::_Exit(70);
  }
  for (const RunRecord& record : *runs) {
    auto loaded = Load(record);
    if (!loaded.ok()) {
      ActiveRun broken;
      broken.record = record;
      Finish(broken, RunState::kFailed, recovery::FailureClassName(FailureClass::kUnknown),
             loaded.status().message(), batch);
      continue;
    }
    ActiveRun& run = active_[record.name] = std::move(*loaded);
    backend_->Recover(run, batch);
    if (store::IsTerminal(run.record.state)) {
      active_.erase(record.name);
      backend_->Forget(record.name);
    }
  }
  // The runs of arrays with max_parallel that are in play take their places first (a running one
  // may come after queued ones), then the queued ones by submission order.
  std::vector<ActiveRun*> queued;
  for (auto& [name, run] : active_) {
    const bool holds = run.record.flavors.is_object() && !run.record.flavors.empty();
    if (run.record.state == RunState::kQueued && !holds)
      queued.push_back(&run);
    else
      RunAdded(run, /*recovered=*/true);
  }
  std::sort(queued.begin(), queued.end(),
            [](const ActiveRun* a, const ActiveRun* b) { return a->record.seq < b->record.seq; });
  for (ActiveRun* run : queued) RunAdded(*run, /*recovered=*/true);
}

void Controller::Loop() {
  InboxTake take;
  while (inbox_.Take(NextWakeMillis(), &take)) Pass(std::exchange(take, {}));
}

void Controller::RunOnce() { Pass(inbox_.TakeNow()); }

void Controller::Pass(InboxTake take) {
  const int64_t take_writes = take.writes;
  if (recovered_) {
    CommitOrDie(std::move(*recovered_));
    recovered_.reset();
  }
  if (take.platform) {
    loop_platform_ = take.platform->platform;
    loop_generation_ = take.platform->generation;
    RebuildEngine();
    // Its budgets may look further back than the last one's: read what was held again.
    if (Status s = LoadLedger(); !s.ok())
      std::fprintf(stderr, "tau server: budgets: %s\n", s.ToString().c_str());
  }
  Batch batch;
  // The runs this pass changes (each change is in a batch, to be committed): the engine's view of
  // them is checked (those changed after SyncEngine, in the next pass), and those that ended
  // leave the active set.
  std::set<std::string> touched;
  auto changed = [&](const Batch& b) {
    for (const store::RunProgress& r : b.runs) {
      touched.insert(r.name);
      sync_changed_.insert(r.name);
    }
  };
  for (NewRun& n : take.new_runs) {
    if (active_.count(n.name)) continue;
    sync_changed_.insert(n.name);
    std::optional<ActiveRun> run = std::move(n.run);
    if (!run) {
      auto record = store_->GetRun(n.name);
      if (!record.ok()) continue;
      auto loaded = Load(*record);
      if (!loaded.ok()) continue;
      run = std::move(*loaded);
    }
    ActiveRun& added = active_[n.name] = std::move(*run);
    RunAdded(added, /*recovered=*/false);
  }
  // Notices first: one posted just before its attempt's exit is still the run's.
  for (RunNotice& n : take.notices) {
    auto it = active_.find(n.run);
    if (it == active_.end() || store::IsTerminal(it->second.record.state)) continue;
    batch.events.push_back(
        {0, n.run, Now(), std::move(n.type), std::move(n.message), std::move(n.data), "", ""});
  }
  for (const GpuNews& g : take.gpu_news) backend_->HandleGpuNews(g, &batch);
  for (const ResumeRequest& r : take.resumes) HandleResume(r, &batch);
  for (const RestartRequest& r : take.restarts) HandleRestart(r, &batch);
  for (const AttemptExited& e : take.exits) backend_->HandleExit(e.name, &batch);
  for (const AttemptNews& n : take.attempt_news) backend_->HandleNews(n, &batch);
  for (const CancelRequest& c : take.cancels) HandleCancel(c.name, &batch);
  for (const auto& pass : passes_) pass->Apply(&batch);
  ApplyBudgets(&batch);
  ApplyGuardrails(take.samples, &batch);
  changed(batch);
  SyncEngine();
  backend_->Schedule(&batch);
  changed(batch);
  // Durable first: admissions, exits, cancels and new attempts are committed before any process
  // is started or stopped, or any object created on the cluster.
  CommitOrDie(std::move(batch));
  backend_->Committed();
  Batch started;
  backend_->Launch(&started);
  changed(started);
  // Attempts that started (Running, a supervisor's pid) are committed without an fsync of their
  // own: nothing is done on them, and the next commit's fsync makes them durable (a restart finds
  // a live supervisor by its lock even without its pid). A run that ended here is told to anyone
  // who asks, and its resources go to others: then it is fsynced.
  started.sync =
      std::any_of(started.runs.begin(), started.runs.end(),
                  [](const store::RunProgress& r) { return store::IsTerminal(r.state); });
  CommitOrDie(std::move(started));
  backend_->Launched();
  std::vector<std::vector<evidence::GpuSample>> samples;
  for (GpuSamples& s : take.samples) samples.push_back(std::move(s.samples));
  evidence_->Tick(backend_->RunningAttempts(), std::move(samples));
  // Terminal runs leave the active set once their final state is committed (the store has
  // assigned the events' hashes their records hold): their records go to the evidence worker,
  // which reads the rest of their metrics, compacts them and saves the final record.
  for (const std::string& name : touched) {
    auto it = active_.find(name);
    if (it == active_.end()) continue;
    const RunRecord& r = it->second.record;
    if (!store::IsTerminal(r.state)) {
      // Backing off since SyncEngine looked: the loop wakes when the backoff ends.
      if (r.state == RunState::kQueued && r.not_before_ms)
        sync_backoff_.insert({*r.not_before_ms, name});
      continue;
    }
    budget_warned_.erase(it->first);
    gpu_time_.erase(it->first);
    evidence_->HandOff(it->first, std::move(it->second.record));
    backend_->Forget(it->first);
    active_.erase(it);
  }
  RefreshPending(take_writes);
}

// How long the loop may sleep: until the earliest retry's backoff ends or stop request expires, at
// most a second.
int64_t Controller::NextWakeMillis() {
  int64_t now = Now();
  const bool busy =
      std::any_of(passes_.begin(), passes_.end(), [](const auto& pass) { return pass->Busy(); });
  int64_t wake = busy ? 0 : 1000;
  if (!sync_backoff_.empty())
    wake = std::min(wake, std::max<int64_t>(0, sync_backoff_.begin()->first - now));
  return backend_->NextWakeMillis(now, wake);
}

Status Controller::CheckSecrets(const spec::RunSpec& spec, const std::string& workspace,
                                spec::RunSpec* resolved_spec) {
  // tau's store holds the values of SECRET:KEY references, and of runtime.env_secret's NAME:KEY
  // as NAME.KEY, except on an engine with secrets of its own (a cluster: the namespace's
  // Kubernetes Secret NAME).
  const bool own_secrets = backend_->Caps().own_secrets;
  auto in_store = [own_secrets](const spec::EnvVar& v) {
    return v.secret_ref && (v.secret_name.empty() || !own_secrets);
  };
  if (std::none_of(spec.runtime.env.begin(), spec.runtime.env.end(), in_store)) return Status::Ok();
  TAU_ASSIGN_OR_RETURN(auto values, store_->SecretValues(workspace));
  std::vector<std::string> missing;
  for (const spec::EnvVar& var : spec.runtime.env)
    if (in_store(var) && !values.count(spec::SecretStoreKey(var)))
      missing.push_back(spec::SecretStoreKey(var));
  if (!missing.empty())
    return FailedPrecondition(fmt::format(
        "runtime.env refers to secret(s) {} that workspace '{}' does not have; set each with "
        "`tau secret set {} KEY` (the value is read from the terminal or stdin; "
        "runtime.env_secret's NAME:KEY is the secret NAME.KEY)",
        Join(missing, ", "), workspace, workspace));
  if (resolved_spec != nullptr)
    for (spec::EnvVar& var : resolved_spec->runtime.env)
      if (in_store(var)) {
        var.value = values.at(spec::SecretStoreKey(var));
        var.secret_ref = false;
        var.secret_name.clear();
      }
  return Status::Ok();
}

void Controller::AttemptVanished(ActiveRun& run, AttemptRecord attempt, const std::string& message,
                                 Batch* batch) {
  run::AttemptEnd end;
  end.failure_class = FailureClass::kNodeLost;
  end.outcome = "Lost";
  end.exit_code = attempt.exit_code;
  end.signal = attempt.signal;
  end.message = message;
  AttemptEnded(run, std::move(attempt), end, batch);
}

void Controller::AttemptEnded(ActiveRun& run, AttemptRecord attempt, const run::AttemptEnd& end,
                              Batch* batch) {
  run::RecordEnd(end, Now(), &attempt);
  batch->attempts.push_back(attempt);
  CountAttempt(attempt);
  RunRecord& r = run.record;
  r.attempts = std::max(r.attempts, attempt.number);
  // The run's exit code and signal are its last attempt's.
  r.exit_code = attempt.exit_code;
  r.signal = attempt.signal;
  const std::string& run_message = end.run_message.empty() ? end.message : end.run_message;
  switch (run::DispatchEnd(end.failure_class, spec::RetryPolicyOf(run.spec.resilience))) {
    case run::AfterEnd::kSucceed:
      return Finish(run, RunState::kSucceeded, attempt.reason, run_message, batch);
    case run::AfterEnd::kCancel:
      return Finish(run, RunState::kCancelled, attempt.reason, run_message, batch);
    case run::AfterEnd::kRequeue:
      return Requeue(run, run_message, batch);
    case run::AfterEnd::kRetryOrFail:
      return FailAttempt(run, end.failure_class, end.message, batch);
  }
}

void Controller::RunAdmitted(ActiveRun& run, const std::string& message, nlohmann::json data,
                             Batch* batch) {
  Transition(run, RunState::kAdmitted, "Admitted", message, batch, std::move(data));
  batch->runs.push_back(run.record);
}

void Controller::AttemptRunning(ActiveRun& run, AttemptRecord attempt, const std::string& message,
                                nlohmann::json data, Batch* batch) {
  RunRecord& r = run.record;
  attempt.state = AttemptState::kRunning;
  batch->attempts.push_back(attempt);
  r.attempts = attempt.number;
  if (!r.started_ms) r.started_ms = attempt.started_ms;  // the run's start: its first attempt's
  r.not_before_ms.reset();
  Transition(run, RunState::kRunning, "Running", message, batch, std::move(data));
  batch->runs.push_back(r);
}

void Controller::RunCancelled(ActiveRun& run, const std::string& message, Batch* batch) {
  Finish(run, RunState::kCancelled, recovery::FailureClassName(FailureClass::kCancelled), message,
         batch);
}

void Controller::ReturnToQueue(ActiveRun& run, const std::string& message, Batch* batch) {
  ReleaseResources(run, batch);
  Transition(run, RunState::kQueued, "Requeued", message, batch);
  batch->runs.push_back(run.record);
}

Result<std::vector<std::string>> Controller::LogSecrets(const RunRecord& run) {
  return SecretValuesOf(store_, run);
}

void Controller::HandleCancel(const std::string& name, Batch* batch) {
  auto it = active_.find(name);
  if (it == active_.end()) return;
  ActiveRun& run = it->second;
  RunRecord& r = run.record;
  if (store::IsTerminal(r.state) || r.cancel_requested) return;
  r.cancel_requested = true;
  backend_->Cancel(run, batch);
}

}  // namespace tau::server
