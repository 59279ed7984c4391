// Services on the controller: a replica is a run of the service's spec and code, with its place
// (service, revision, port) and, when the service serves a trained run, that run as its upstream
// (workflow.cc resolves its checkpoint once it has ended). What a replica does when it stops is
// the controller's retry policy (a service's spec restarts on every failure class); what the
// service does with its replicas is the service manager's (server/services.h).
#include <fmt/format.h>

#include <algorithm>

#include "common/files.h"
#include "controller/controller.h"

namespace tau::server {

using store::Event;
using store::RunRecord;

Result<Snapshot> Controller::StoreCode(std::vector<CodeFile> files,
                                       std::optional<std::vector<CodeManifestEntry>> manifest,
                                       const std::string& user,
                                       const ReadableWorkspaces& readable) {
  Snapshot stored;
  if (!manifest) {
    TAU_ASSIGN_OR_RETURN(stored, StoreSnapshot(layout::SnapshotsDir(options_.home),
                                               layout::BlobsDir(options_.home), std::move(files)));
  } else {
    TAU_ASSIGN_OR_RETURN(Manifest checked, CheckManifest(std::move(*manifest)));
    std::vector<std::string> missing;
    TAU_ASSIGN_OR_RETURN(stored, StoreManifest(checked, user, readable, &missing));
  }
  // Recorded at once: the service's replicas, the runs that use it, read no files list of theirs.
  TAU_RETURN_IF_ERROR(RecordSnapshot(stored));
  return stored;
}

Result<PreparedReplica> Controller::PrepareReplica(const ReplicaRequest& request,
                                                   SubmitError* error) {
  const std::string dir = layout::SnapshotsDir(options_.home) + "/" + request.snapshot_digest;
  auto snapshot = [&]() -> Result<Snapshot> {
    if (!IsSha256Hex(request.snapshot_digest) || !PathExists(dir))
      return FailedPrecondition(fmt::format("the code snapshot {} of service '{}' is gone",
                                            request.snapshot_digest, request.service));
    TAU_ASSIGN_OR_RETURN(std::vector<CodeFile> files, ReadSnapshot(dir));
    Snapshot s;
    s.digest = request.snapshot_digest;
    s.dir = dir;
    s.files = nlohmann::json::array();
    for (const CodeFile& f : files)
      s.files.push_back({{"path", f.path}, {"size", f.data.size()}, {"mode", f.mode}});
    return s;
  };
  TAU_ASSIGN_OR_RETURN(PreparedRun prepared,
                       PrepareRun(request.spec_yaml, request.spec_file, request.overrides,
                                  request.code_dir, request.caller, request.token_user, snapshot,
                                  request.service, "-" + std::string(8, 'f'), error));
  if (!prepared.spec.serve) {
    error->status = InvalidArgument(
        fmt::format("{}: this spec is a run, not a service: add 'kind: service' (and a serve "
                    "section), or run it with `tau run`",
                    request.spec_file));
    return error->status;
  }
  PreparedReplica out;
  out.platform = std::move(prepared.platform);
  out.resolved = std::move(prepared.resolved);
  const bool refers =
      std::any_of(prepared.spec.runtime.env.begin(), prepared.spec.runtime.env.end(),
                  [](const spec::EnvVar& v) { return v.secret_ref && v.secret_name.empty(); });
  if (refers) {
    auto values = store_->SecretValues(out.resolved.workspace);
    if (!values.ok()) {
      error->status = values.status();
      return error->status;
    }
    out.secrets = std::move(*values);
  }
  out.record = std::move(prepared.record);
  out.spec = std::move(prepared.spec);
  out.submitted = std::move(prepared.submitted);
  return out;
}

Result<RunRecord> Controller::SubmitReplica(const ReplicaRequest& request, SubmitError* error) {
  TAU_ASSIGN_OR_RETURN(PreparedReplica prepared, PrepareReplica(request, error));
  RunRecord& r = prepared.record;
  r.service = {{"name", request.service}, {"revision", request.revision}, {"port", request.port}};
  if (!request.from_run.empty()) {
    // The trained run is the replica's upstream: it waits for it to end, then gets its newest
    // complete checkpoint and output directory, read-only, with their digests in its lineage.
    r.workflow = {
        {"stage", kModelStage},
        {"after",
         nlohmann::json::array(
             {{{"stage", kModelStage}, {"run", request.from_run}, {"condition", "finished"}}})}};
  }
  if (request.dry_run) return std::move(r);
  Status inserted = InsertWithUniqueName(&r, request.service, [&](const std::string&) {
    std::vector<Event> events = {{0, r.name, r.created_ms, "Submitted",
                                  fmt::format("replica of service {} (revision {}, port {})",
                                              request.service, request.revision, request.port),
                                  prepared.submitted, "", ""},
                                 {0, r.name, r.created_ms, "Queued", "queued in " + r.queue,
                                  nlohmann::json::object(), "", ""}};
    events[0].data["service"] = r.service;
    return events;
  });
  if (!inserted.ok()) {
    error->status = inserted;
    return inserted;
  }
  Accepted(r, std::move(prepared.spec));
  return std::move(r);
}

void Controller::RestartReplica(const std::string& name, const std::string& why) {
  inbox_.Push(RestartRequest{name, why});
}

void Controller::HandleRestart(const RestartRequest& request, store::Batch* batch) {
  auto it = active_.find(request.run);
  if (it == active_.end()) return;
  ActiveRun& run = it->second;
  if (store::IsTerminal(run.record.state) || run.record.cancel_requested ||
      run.record.state != store::RunState::kRunning)
    return;
  backend_->StopAttempt(run, recovery::FailureClass::kLivenessFailed, request.why, batch);
}

}  // namespace tau::server
