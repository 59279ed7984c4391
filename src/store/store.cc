#include "store/store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/event_chain.h"
#include "common/json_text.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace tau::store {
namespace {

constexpr const char* kRunStateNames[] = {"Queued",    "Admitted", "Running",
                                          "Succeeded", "Failed",   "Cancelled"};

// Schema version 1. Later versions add ALTER statements to kMigrations, never edit old ones.
constexpr const char* kMigrations[] = {
    R"sql(
CREATE TABLE runs (
  name TEXT PRIMARY KEY,
  seq INTEGER NOT NULL UNIQUE,
  spec_name TEXT NOT NULL,
  spec_file TEXT NOT NULL,
  spec_yaml TEXT NOT NULL,
  spec_json TEXT NOT NULL,
  config_hash TEXT NOT NULL,
  snapshot_digest TEXT NOT NULL,
  snapshot_dir TEXT NOT NULL,
  workspace TEXT NOT NULL,
  queue TEXT NOT NULL,
  priority INTEGER NOT NULL,
  resources TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT NOT NULL,
  message TEXT NOT NULL,
  exit_code INTEGER,
  signal INTEGER,
  attempts INTEGER NOT NULL,
  gpus TEXT NOT NULL,
  cancel_requested INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  admitted_ms INTEGER,
  started_ms INTEGER,
  finished_ms INTEGER
);
CREATE INDEX runs_state ON runs(state, seq);
CREATE TABLE attempts (
  run TEXT NOT NULL,
  number INTEGER NOT NULL,
  state TEXT NOT NULL,
  dir TEXT NOT NULL,
  shim_pid INTEGER NOT NULL,
  shim_start_time INTEGER NOT NULL,
  gpus TEXT NOT NULL,
  started_ms INTEGER NOT NULL,
  ended_ms INTEGER,
  exit_code INTEGER,
  signal INTEGER,
  outcome TEXT NOT NULL,
  reason TEXT NOT NULL,
  message TEXT NOT NULL,
  PRIMARY KEY (run, number)
);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run TEXT NOT NULL,
  ts_ms INTEGER NOT NULL,
  type TEXT NOT NULL,
  message TEXT NOT NULL,
  data TEXT NOT NULL,
  prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL
);
CREATE INDEX events_run ON events(run, id);
)sql",
    // 2: retries wait for their backoff.
    "ALTER TABLE runs ADD COLUMN not_before_ms INTEGER;",
    // 3: what a failed attempt's logs say.
    "ALTER TABLE attempts ADD COLUMN diagnosis TEXT NOT NULL DEFAULT '{}';",
    // 4: platform policy: who submitted, the resolved settings with provenance, and the flavors
    // the admission engine assigned (restored after a restart so quota stays accounted).
    "ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE runs ADD COLUMN resolved TEXT NOT NULL DEFAULT '{}';"
    "ALTER TABLE runs ADD COLUMN flavors TEXT NOT NULL DEFAULT '{}';"
    "ALTER TABLE runs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;",
    // 5: identity: API tokens (digests only), the audit trail, workspace secrets.
    R"sql(
CREATE TABLE tokens (
  id TEXT PRIMARY KEY,
  digest TEXT NOT NULL UNIQUE,
  user TEXT NOT NULL,
  groups TEXT NOT NULL,
  description TEXT NOT NULL,
  created_by TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  expires_ms INTEGER,
  revoked_ms INTEGER
);
CREATE TABLE audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  ts_ms INTEGER NOT NULL,
  user TEXT NOT NULL,
  via TEXT NOT NULL,
  method TEXT NOT NULL,
  path TEXT NOT NULL,
  status INTEGER NOT NULL,
  action TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE TABLE secrets (
  workspace TEXT NOT NULL,
  key TEXT NOT NULL,
  value BLOB NOT NULL,
  updated_ms INTEGER NOT NULL,
  updated_by TEXT NOT NULL,
  PRIMARY KEY (workspace, key)
);
)sql",
    // 6: idempotent submission: the key a client sent with the run's submission, unique per owner.
    R"sql(
ALTER TABLE runs ADD COLUMN submit_key TEXT NOT NULL DEFAULT '';
CREATE UNIQUE INDEX runs_submit_key ON runs(owner, submit_key) WHERE submit_key <> '';
)sql",
    // 7: whom a run's processes run as, decided at submission (NULL: a run from before, decided as
    // it was then); and which system user of a workspace's pool each token user was given, each
    // system user to one user of one workspace for good.
    R"sql(
ALTER TABLE runs ADD COLUMN run_as TEXT;
CREATE TABLE run_users (
  system_user TEXT PRIMARY KEY,
  workspace TEXT NOT NULL,
  user TEXT NOT NULL,
  assigned_ms INTEGER NOT NULL
);
CREATE INDEX run_users_by_user ON run_users(workspace, user);
)sql",
    // 8: a run of an array (`tau run --array`): the array's name, the run's index and the range,
    // as JSON; NULL for a run of its own.
    "ALTER TABLE runs ADD COLUMN array_place TEXT;",
    // 9: a store that stays flat as ended runs pile up. The spec's kind as a column (list pages
    // read no spec); when retention pruned a run's logs and samples, with partial indexes of the
    // ended runs not pruned yet, by finished time, so a retention pass reads only what is due; and
    // the active runs by seq, so a restart reads only those. A run pruned before this version is
    // found due once, and marked then from its record.
    R"sql(
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT '';
UPDATE runs SET kind = COALESCE(json_extract(spec_json, '$.kind'), '') WHERE json_valid(spec_json);
ALTER TABLE runs ADD COLUMN logs_pruned_ms INTEGER;
ALTER TABLE runs ADD COLUMN samples_pruned_ms INTEGER;
CREATE INDEX runs_logs_due ON runs(finished_ms, seq)
  WHERE logs_pruned_ms IS NULL AND state IN ('Succeeded','Failed','Cancelled');
CREATE INDEX runs_samples_due ON runs(finished_ms, seq)
  WHERE samples_pruned_ms IS NULL AND state IN ('Succeeded','Failed','Cancelled');
CREATE INDEX runs_active ON runs(seq) WHERE state IN ('Queued','Admitted','Running');
)sql",
    // 10: the spec's experiment.project and experiment.group as columns, so that `tau list
    // --project P --group G` reads no spec; filled from the specs of the runs already there.
    R"sql(
ALTER TABLE runs ADD COLUMN project TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN experiment_group TEXT NOT NULL DEFAULT '';
UPDATE runs SET
  project = COALESCE(json_extract(spec_json, '$.experiment.project'), ''),
  experiment_group = COALESCE(json_extract(spec_json, '$.experiment.group'), '')
  WHERE json_valid(spec_json);
CREATE INDEX runs_by_project ON runs(project, seq);
)sql",
    // 11: a run of a workflow's stage (`tau run workflow.yaml`): the workflow's name as a column
    // (its runs are listed by it), and the run's place (stage, upstream runs) as JSON; '' and NULL
    // for a run of its own.
    R"sql(
ALTER TABLE runs ADD COLUMN workflow TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN workflow_place TEXT;
CREATE INDEX runs_by_workflow ON runs(workflow, seq) WHERE workflow != '';
)sql",
    // 12: services (`tau serve deploy`): one row each, what the service manager keeps of it as a
    // JSON document beside the columns lists filter on; and a replica's run, the service's name
    // as a column (its replicas are listed by it) and its place (revision, port) as JSON.
    R"sql(
CREATE TABLE services (
  name TEXT PRIMARY KEY,
  workspace TEXT NOT NULL,
  owner TEXT NOT NULL,
  state TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  doc TEXT NOT NULL
);
ALTER TABLE runs ADD COLUMN service TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN service_place TEXT;
CREATE INDEX runs_by_service ON runs(service, seq) WHERE service != '';
)sql",
    // 13: budgets' metering: each time a run held quota is a Metered event (admission to release);
    // a restart reads those of the budgets' periods back by time.
    R"sql(
CREATE INDEX events_metered ON events(ts_ms) WHERE type = 'Metered';
)sql",
    // 14: webhooks: the outbox of deliveries (each in order per URL, kept until its receiver takes
    // it), and the last event routed to it, which starts at the newest event: no history is sent.
    R"sql(
CREATE TABLE deliveries (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  workspace TEXT NOT NULL,
  url TEXT NOT NULL,
  secret TEXT NOT NULL,
  event_id INTEGER NOT NULL,
  body TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  next_ms INTEGER NOT NULL,
  last_error TEXT NOT NULL DEFAULT ''
);
CREATE INDEX deliveries_by_url ON deliveries(url, id);
CREATE TABLE delivery_cursor (one INTEGER PRIMARY KEY CHECK (one = 1), event_id INTEGER NOT NULL);
INSERT INTO delivery_cursor VALUES (1, (SELECT COALESCE(MAX(id), 0) FROM events));
)sql",
    // 15: code blobs are capabilities: who uploaded each blob (the bytes prove possession), and
    // which blobs each snapshot is made of, so that a manifest names only blobs its caller sent or
    // that a run they may read uses. Blobs and snapshots stored before have no rows: such a blob
    // is usable by a manifest whose whole snapshot a readable run uses, or once uploaded again.
    R"sql(
CREATE TABLE blob_owners (
  owner TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  size INTEGER NOT NULL,
  uploaded_ms INTEGER NOT NULL,
  PRIMARY KEY (owner, sha256)
) WITHOUT ROWID;
CREATE INDEX blob_owners_by_blob ON blob_owners(sha256);
CREATE TABLE snapshot_blobs (
  sha256 TEXT NOT NULL,
  snapshot TEXT NOT NULL,
  PRIMARY KEY (sha256, snapshot)
) WITHOUT ROWID;
CREATE INDEX snapshot_blobs_by_snapshot ON snapshot_blobs(snapshot);
CREATE INDEX runs_by_snapshot ON runs(snapshot_digest);
)sql",
};

constexpr int64_t kLatestSchema = sizeof(kMigrations) / sizeof(kMigrations[0]);

// Prepared statements kept for the next use of the same SQL text: preparing one costs more than
// running most of the store's statements. Used under the store's mutex.
struct CachedStatement {
  sqlite3_stmt* stmt = nullptr;
  bool busy = false;  // a Stmt uses it now
};
using StatementCache = std::unordered_map<std::string, CachedStatement>;

// A prepared statement, taken from the cache (and reset for the next user when done) or, when the
// cache's copy is in use, prepared for this use alone (and finalised).
class Stmt {
 public:
  Stmt(sqlite3* db, StatementCache* cache, const std::string& sql) {
    CachedStatement& c = (*cache)[sql];
    if (c.busy) {
      rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
      return;
    }
    rc_ = c.stmt != nullptr ? SQLITE_OK
                            : sqlite3_prepare_v3(db, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT,
                                                 &c.stmt, nullptr);
    if (rc_ != SQLITE_OK) return;
    stmt_ = c.stmt;
    cached_ = &c;
    c.busy = true;
  }
  ~Stmt() {
    if (cached_ == nullptr) {
      sqlite3_finalize(stmt_);
      return;
    }
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    cached_->busy = false;
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, const std::optional<std::string>& v) {
    if (v)
      Bind(i, *v);
    else
      sqlite3_bind_null(stmt_, i);
  }
  void Bind(int i, const std::optional<int64_t>& v) {
    if (v)
      sqlite3_bind_int64(stmt_, i, *v);
    else
      sqlite3_bind_null(stmt_, i);
  }
  void Bind(int i, const std::optional<int>& v) {
    if (v)
      sqlite3_bind_int64(stmt_, i, *v);
    else
      sqlite3_bind_null(stmt_, i);
  }
  // By name (":state"): for statements whose parameters are named.
  template <typename T>
  void Bind(const char* name, const T& v) {
    Bind(sqlite3_bind_parameter_index(stmt_, name), v);
  }
  int Step() { return sqlite3_step(stmt_); }
  std::string Text(int col) {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::optional<std::string> OptText(int col) {
    if (sqlite3_column_type(stmt_, col) == SQLITE_NULL) return std::nullopt;
    return Text(col);
  }
  std::optional<int64_t> OptInt(int col) {
    if (sqlite3_column_type(stmt_, col) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_int64(stmt_, col);
  }
  std::optional<int> OptInt32(int col) {
    auto v = OptInt(col);
    if (!v) return std::nullopt;
    return static_cast<int>(*v);
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  CachedStatement* cached_ = nullptr;  // null: stmt_ is this object's own
  int rc_ = SQLITE_ERROR;
};

nlohmann::json ParseJsonColumn(const std::string& text, nlohmann::json fallback) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? fallback : j;
}

std::vector<int> ParseIntList(const std::string& text) {
  std::vector<int> out;
  auto j = ParseJsonColumn(text, nlohmann::json::array());
  if (!j.is_array()) return out;
  for (const auto& v : j)
    if (v.is_number_integer()) out.push_back(v.get<int>());
  return out;
}

std::string IntListJson(const std::vector<int>& v) { return JsonText(nlohmann::json(v)); }

constexpr const char* kRunColumns =
    "name, seq, spec_name, spec_file, spec_yaml, spec_json, config_hash, snapshot_digest, "
    "snapshot_dir, workspace, queue, priority, resources, state, reason, message, exit_code, "
    "signal, attempts, gpus, cancel_requested, created_ms, updated_ms, admitted_ms, started_ms, "
    "finished_ms, not_before_ms, owner, resolved, flavors, preemptions, submit_key, run_as, "
    "array_place, kind, logs_pruned_ms, samples_pruned_ms, project, experiment_group, "
    "workflow_place, service_place";
// The same columns for a list page: the heavy ones (spec_yaml, spec_json, resolved, flavors) are
// NULL, so SQLite neither copies nor we parse them.
constexpr const char* kSummaryColumns =
    "name, seq, spec_name, spec_file, NULL, NULL, config_hash, snapshot_digest, "
    "snapshot_dir, workspace, queue, priority, resources, state, reason, message, exit_code, "
    "signal, attempts, gpus, cancel_requested, created_ms, updated_ms, admitted_ms, started_ms, "
    "finished_ms, not_before_ms, owner, NULL, NULL, preemptions, submit_key, run_as, "
    "array_place, kind, logs_pruned_ms, samples_pruned_ms, project, experiment_group, "
    "workflow_place, service_place";

// `summary`: read from kSummaryColumns (the heavy columns are left empty).
RunRecord ReadRun(Stmt& s, bool summary = false) {
  RunRecord r;
  r.name = s.Text(0);
  r.seq = s.Int(1);
  r.spec_name = s.Text(2);
  r.spec_file = s.Text(3);
  if (!summary) {
    r.spec_yaml = s.Text(4);
    r.spec_json = ParseJsonColumn(s.Text(5), nlohmann::json::object());
  }
  r.config_hash = s.Text(6);
  r.snapshot_digest = s.Text(7);
  r.snapshot_dir = s.Text(8);
  r.workspace = s.Text(9);
  r.queue = s.Text(10);
  r.priority = static_cast<int>(s.Int(11));
  r.resources = ParseJsonColumn(s.Text(12), nlohmann::json::object());
  r.state = ParseRunState(s.Text(13)).ok() ? *ParseRunState(s.Text(13)) : RunState::kFailed;
  r.reason = s.Text(14);
  r.message = s.Text(15);
  r.exit_code = s.OptInt32(16);
  r.signal = s.OptInt32(17);
  r.attempts = static_cast<int>(s.Int(18));
  r.gpus = ParseIntList(s.Text(19));
  r.cancel_requested = s.Int(20) != 0;
  r.created_ms = s.Int(21);
  r.updated_ms = s.Int(22);
  r.admitted_ms = s.OptInt(23);
  r.started_ms = s.OptInt(24);
  r.finished_ms = s.OptInt(25);
  r.not_before_ms = s.OptInt(26);
  r.owner = s.Text(27);
  if (!summary) {
    r.resolved = ParseJsonColumn(s.Text(28), nlohmann::json::object());
    r.flavors = ParseJsonColumn(s.Text(29), nlohmann::json::object());
  }
  r.preemptions = static_cast<int>(s.Int(30));
  r.submit_key = s.Text(31);
  r.run_as = s.OptText(32);
  if (std::optional<std::string> place = s.OptText(33))
    r.array = ParseJsonColumn(*place, nlohmann::json());
  r.kind = s.Text(34);
  r.logs_pruned_ms = s.OptInt(35);
  r.samples_pruned_ms = s.OptInt(36);
  r.project = s.Text(37);
  r.group = s.Text(38);
  if (std::optional<std::string> place = s.OptText(39))
    r.workflow = ParseJsonColumn(*place, nlohmann::json());
  if (std::optional<std::string> place = s.OptText(40))
    r.service = ParseJsonColumn(*place, nlohmann::json());
  return r;
}

// The spec's workload kind, as the kind column keeps it.
std::string KindOf(const nlohmann::json& spec_json) {
  if (!spec_json.is_object()) return "";
  auto it = spec_json.find("kind");
  return it != spec_json.end() && it->is_string() ? it->get<std::string>() : "";
}

// The spec's experiment.<field>, as the project and experiment_group columns keep it.
std::string ExperimentOf(const nlohmann::json& spec_json, const char* field) {
  if (!spec_json.is_object()) return "";
  auto e = spec_json.find("experiment");
  if (e == spec_json.end() || !e->is_object()) return "";
  auto it = e->find(field);
  return it != e->end() && it->is_string() ? it->get<std::string>() : "";
}

// A workflow (or service) place's name, as the workflow (service) column keeps it.
std::string WorkflowOf(const nlohmann::json& place) {
  if (!place.is_object()) return "";
  auto it = place.find("name");
  return it != place.end() && it->is_string() ? it->get<std::string>() : "";
}

// The columns of a run that commits change (RunProgress), as named parameters (":state" binds
// state), shared by the insert and the update.
constexpr const char* kProgressColumns[] = {
    "state",      "reason",      "message",          "exit_code",  "signal",
    "attempts",   "gpus",        "cancel_requested", "updated_ms", "admitted_ms",
    "started_ms", "finished_ms", "not_before_ms",    "flavors",    "preemptions"};

void BindProgress(Stmt& s, const RunProgress& p) {
  s.Bind(":state", std::string(RunStateName(p.state)));
  s.Bind(":reason", p.reason);
  s.Bind(":message", p.message);
  s.Bind(":exit_code", p.exit_code);
  s.Bind(":signal", p.signal);
  s.Bind(":attempts", static_cast<int64_t>(p.attempts));
  s.Bind(":gpus", IntListJson(p.gpus));
  s.Bind(":cancel_requested", static_cast<int64_t>(p.cancel_requested));
  s.Bind(":updated_ms", p.updated_ms);
  s.Bind(":admitted_ms", p.admitted_ms);
  s.Bind(":started_ms", p.started_ms);
  s.Bind(":finished_ms", p.finished_ms);
  s.Bind(":not_before_ms", p.not_before_ms);
  s.Bind(":flavors", JsonText(p.flavors));
  s.Bind(":preemptions", static_cast<int64_t>(p.preemptions));
}

// The largest JSON columns as text, kept from the run inserted before: a batch's runs of one
// submission share them, and comparing is cheaper than writing them out again.
struct RunTexts {
  const RunRecord* previous = nullptr;
  std::string spec_json, resolved;
};

void BindRun(Stmt& s, const RunRecord& r, RunTexts* texts) {
  if (texts->previous == nullptr || texts->previous->spec_json != r.spec_json ||
      texts->previous->resolved != r.resolved) {
    texts->spec_json = JsonText(r.spec_json);
    texts->resolved = JsonText(r.resolved);
  }
  texts->previous = &r;
  s.Bind(":name", r.name);
  s.Bind(":seq", r.seq);
  s.Bind(":spec_name", r.spec_name);
  s.Bind(":spec_file", r.spec_file);
  s.Bind(":spec_yaml", r.spec_yaml);
  s.Bind(":spec_json", texts->spec_json);
  s.Bind(":config_hash", r.config_hash);
  s.Bind(":snapshot_digest", r.snapshot_digest);
  s.Bind(":snapshot_dir", r.snapshot_dir);
  s.Bind(":workspace", r.workspace);
  s.Bind(":queue", r.queue);
  s.Bind(":priority", static_cast<int64_t>(r.priority));
  s.Bind(":resources", JsonText(r.resources));
  s.Bind(":created_ms", r.created_ms);
  s.Bind(":owner", r.owner);
  s.Bind(":resolved", texts->resolved);
  s.Bind(":submit_key", r.submit_key);
  s.Bind(":run_as", r.run_as);
  s.Bind(":array_place",
         r.array.is_null() ? std::optional<std::string>() : std::optional(JsonText(r.array)));
  s.Bind(":kind", r.kind.empty() ? KindOf(r.spec_json) : r.kind);
  s.Bind(":project", r.project.empty() ? ExperimentOf(r.spec_json, "project") : r.project);
  s.Bind(":experiment_group", r.group.empty() ? ExperimentOf(r.spec_json, "group") : r.group);
  s.Bind(":workflow_place",
         r.workflow.is_null() ? std::optional<std::string>() : std::optional(JsonText(r.workflow)));
  s.Bind(":workflow", WorkflowOf(r.workflow));
  s.Bind(":service_place",
         r.service.is_null() ? std::optional<std::string>() : std::optional(JsonText(r.service)));
  s.Bind(":service", WorkflowOf(r.service));
  s.Bind(":logs_pruned_ms", r.logs_pruned_ms);
  s.Bind(":samples_pruned_ms", r.samples_pruned_ms);
  BindProgress(s, r);
}

}  // namespace

const char* RunStateName(RunState state) { return kRunStateNames[static_cast<int>(state)]; }

Result<RunState> ParseRunState(std::string_view name) {
  for (int i = 0; i < 6; ++i) {
    if (name == kRunStateNames[i]) return static_cast<RunState>(i);
  }
  // Accept lowercase too, for CLI filters.
  for (int i = 0; i < 6; ++i) {
    std::string lower = kRunStateNames[i];
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == lower) return static_cast<RunState>(i);
  }
  return InvalidArgument(fmt::format(
      "unknown run state '{}' (one of Queued, Admitted, Running, Succeeded, Failed, Cancelled)",
      name));
}

bool IsTerminal(RunState s) {
  return s == RunState::kSucceeded || s == RunState::kFailed || s == RunState::kCancelled;
}

const char* AttemptStateName(AttemptState state) {
  switch (state) {
    case AttemptState::kStarting:
      return "Starting";
    case AttemptState::kRunning:
      return "Running";
    case AttemptState::kFinished:
      return "Finished";
  }
  return "Unknown";
}

static AttemptState ParseAttemptState(const std::string& s) {
  if (s == "Running") return AttemptState::kRunning;
  if (s == "Finished") return AttemptState::kFinished;
  return AttemptState::kStarting;
}

struct Store::Impl {
  Mutex mu;
  sqlite3* db TAU_GUARDED_BY(mu) = nullptr;
  StatementCache cache TAU_GUARDED_BY(mu);

  Status Exec(const char* sql) TAU_REQUIRES(mu) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      return Classify(fmt::format("sqlite: {} (in: {:.60})", msg, sql));
    }
    return Status::Ok();
  }
  Status Error(const char* what) TAU_REQUIRES(mu) {
    return Classify(fmt::format("sqlite: {}: {}", what, sqlite3_errmsg(db)));
  }
  // A full disk passes once space is freed: Unavailable (try again), unlike the other failures.
  Status Classify(std::string message) TAU_REQUIRES(mu) {
    if ((sqlite3_errcode(db) & 0xff) == SQLITE_FULL)
      return Unavailable("the store's disk is full (" + message + "); free some space");
    return Internal(std::move(message));
  }

  Status Migrate() TAU_REQUIRES(mu) {
    Stmt v(db, &cache, "PRAGMA user_version");
    if (!v.ok() || v.Step() != SQLITE_ROW) return Error("reading schema version");
    int64_t version = v.Int(0);
    return MigrateTo(version, kLatestSchema);
  }

  // Applies the migrations after `version` up to `target`.
  Status MigrateTo(int64_t version, int64_t target) TAU_REQUIRES(mu) {
    if (version > kLatestSchema)
      return FailedPrecondition(
          fmt::format("the store's schema version {} is newer than this tau ({}); upgrade tau",
                      version, kLatestSchema));
    for (int64_t i = version; i < target; ++i) {
      TAU_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
      Status s = Exec(kMigrations[i]);
      if (s.ok()) s = Exec(fmt::format("PRAGMA user_version = {}", i + 1).c_str());
      if (!s.ok()) {
        (void)Exec("ROLLBACK");
        return s;
      }
      TAU_RETURN_IF_ERROR(Exec("COMMIT"));
    }
    return Status::Ok();
  }

  Status InsertRun(const RunRecord& r, RunTexts* texts) TAU_REQUIRES(mu) {
    static const std::string sql = [] {
      // The workflow's and service's names are written with the run, never read back: their
      // places say them.
      const std::string columns = std::string(kRunColumns) + ", workflow, service";
      std::vector<std::string> names;
      for (const std::string& c : Split(columns, ',')) {
        // Appended, not `":" + ...`: gcc 12 at -O3 warns of an overlap that cannot happen.
        std::string name = ":";
        name += Trim(c);
        names.push_back(std::move(name));
      }
      return fmt::format("INSERT INTO runs ({}) VALUES ({})", columns, Join(names, ", "));
    }();
    Stmt s(db, &cache, sql);
    if (!s.ok()) return Error("preparing run insert");
    BindRun(s, r, texts);
    if (s.Step() != SQLITE_DONE) return Error("writing run");
    return Status::Ok();
  }

  Status UpdateRun(const RunProgress& r) TAU_REQUIRES(mu) {
    static const std::string sql = [] {
      std::vector<std::string> sets;
      for (const char* c : kProgressColumns) sets.push_back(fmt::format("{} = :{}", c, c));
      return fmt::format("UPDATE runs SET {} WHERE name = :name", Join(sets, ", "));
    }();
    Stmt s(db, &cache, sql);
    if (!s.ok()) return Error("preparing run update");
    s.Bind(":name", r.name);
    BindProgress(s, r);
    if (s.Step() != SQLITE_DONE) return Error("writing run");
    if (sqlite3_changes(db) != 1) return NotFound(fmt::format("no run named '{}'", r.name));
    return Status::Ok();
  }

  Status UpsertAttempt(const AttemptRecord& a) TAU_REQUIRES(mu) {
    Stmt s(db, &cache,
           "INSERT OR REPLACE INTO attempts (run, number, state, dir, shim_pid, shim_start_time, "
           "gpus, started_ms, ended_ms, exit_code, signal, outcome, reason, message, diagnosis) "
           "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    if (!s.ok()) return Error("preparing attempt upsert");
    s.Bind(1, a.run);
    s.Bind(2, static_cast<int64_t>(a.number));
    s.Bind(3, std::string(AttemptStateName(a.state)));
    s.Bind(4, a.dir);
    s.Bind(5, static_cast<int64_t>(a.shim_pid));
    s.Bind(6, static_cast<int64_t>(a.shim_start_time));
    s.Bind(7, IntListJson(a.gpus));
    s.Bind(8, a.started_ms);
    s.Bind(9, a.ended_ms);
    s.Bind(10, a.exit_code);
    s.Bind(11, a.signal);
    s.Bind(12, a.outcome);
    s.Bind(13, a.reason);
    s.Bind(14, a.message);
    s.Bind(15, JsonText(a.diagnosis));
    if (s.Step() != SQLITE_DONE) return Error("writing attempt");
    return Status::Ok();
  }

  Status AppendEvent(Event* e) TAU_REQUIRES(mu) {
    Stmt last(db, &cache, "SELECT hash FROM events WHERE run = ? ORDER BY id DESC LIMIT 1");
    if (!last.ok()) return Error("preparing event chain lookup");
    last.Bind(1, e->run);
    e->prev_hash = last.Step() == SQLITE_ROW ? last.Text(0) : std::string();
    e->hash = EventHash(e->run, e->ts_ms, e->type, e->message, e->data, e->prev_hash);
    Stmt s(db, &cache,
           "INSERT INTO events (run, ts_ms, type, message, data, prev_hash, hash) VALUES "
           "(?,?,?,?,?,?,?)");
    if (!s.ok()) return Error("preparing event insert");
    s.Bind(1, e->run);
    s.Bind(2, e->ts_ms);
    s.Bind(3, e->type);
    s.Bind(4, e->message);
    s.Bind(5, JsonText(e->data));
    s.Bind(6, e->prev_hash);
    s.Bind(7, e->hash);
    if (s.Step() != SQLITE_DONE) return Error("writing event");
    e->id = sqlite3_last_insert_rowid(db);
    return Status::Ok();
  }

  // What waits for the group commit: runs to insert (one, or a batch's: all or none of them), or
  // a Batch of changes (`batch` set) to commit.
  struct PendingInsert {
    RunRecord* runs;
    std::vector<Event>* events;  // runs[i]'s
    size_t count;
    Status result;
    bool done = false;             // guarded by Impl::group_mu
    const Batch* batch = nullptr;  // a commit instead of inserts
  };
  int64_t transactions TAU_GUARDED_BY(mu) = 0;  // committed by InTransaction
  Mutex group_mu;                               // before `mu` when both are held
  CondVar group_cv;
  std::vector<PendingInsert*> pending TAU_GUARDED_BY(group_mu);
  bool group_leader TAU_GUARDED_BY(group_mu) = false;  // a thread is committing a group

  Status InsertOne(PendingInsert& p) TAU_REQUIRES(mu) {
    // A batch's runs take consecutive numbers after the largest there is.
    int64_t first_seq = 0;
    {
      Stmt seq(db, &cache, "SELECT COALESCE(MAX(seq), 0) + 1 FROM runs");
      if (!seq.ok() || seq.Step() != SQLITE_ROW) return Error("assigning run sequence");
      first_seq = seq.Int(0);
    }
    RunTexts texts;
    for (size_t i = 0; i < p.count; ++i) {
      RunRecord& run = p.runs[i];
      Stmt exists(db, &cache, "SELECT 1 FROM runs WHERE name = ?");
      exists.Bind(1, run.name);
      if (exists.Step() == SQLITE_ROW)
        return AlreadyExists("run '" + run.name + "' already exists");
      run.seq = first_seq + static_cast<int64_t>(i);
      TAU_RETURN_IF_ERROR(InsertRun(run, &texts));
      for (Event& e : p.events[i]) TAU_RETURN_IF_ERROR(AppendEvent(&e));
    }
    return Status::Ok();
  }

  // One transaction for the group; each insert inside a savepoint of its own, so that one that
  // fails leaves no trace while the others go on. A transaction that fails (to begin or to commit)
  // fails them all.
  // The decision loop's commits and the API's inserts share it: a submission that arrives while
  // the loop commits rides in the loop's next transaction, not in one (and one fsync) of its own.
  void CommitInserts(const std::vector<PendingInsert*>& group) {
    MutexLock lock(&mu);
    // In WAL mode synchronous=NORMAL appends the commit without an fsync; the next FULL commit's
    // fsync makes it durable too. Only a group of batches that asked for none goes without.
    const bool sync = std::any_of(group.begin(), group.end(), [](const PendingInsert* p) {
      return p->batch == nullptr || p->batch->sync;
    });
    if (!sync) {
      if (Status s = Exec("PRAGMA synchronous=NORMAL"); !s.ok()) {
        for (PendingInsert* p : group) p->result = s;
        return;
      }
    }
    Status committed = InTransaction([&]() TAU_REQUIRES(mu) {
      for (PendingInsert* p : group) {
        Status s = Exec("SAVEPOINT run_insert");
        if (s.ok()) {
          s = p->batch ? ApplyBatch(*p->batch) : InsertOne(*p);
          if (!s.ok()) (void)Exec("ROLLBACK TO run_insert");
          Status released = Exec("RELEASE run_insert");
          if (s.ok()) s = released;
        }
        p->result = s;
      }
      return Status::Ok();
    });
    // Every later commit must be FULL again; a store that cannot say so must not go on.
    if (!sync) {
      Status full = Exec("PRAGMA synchronous=FULL");
      if (committed.ok()) committed = full;
    }
    if (committed.ok()) return;
    for (PendingInsert* p : group)
      if (p->result.ok()) p->result = committed;
  }

  // Inside a savepoint: all of `batch` or, on an error, none of it.
  Status ApplyBatch(const Batch& batch) TAU_REQUIRES(mu) {
    for (const RunProgress& r : batch.runs) TAU_RETURN_IF_ERROR(UpdateRun(r));
    for (const AttemptRecord& a : batch.attempts) TAU_RETURN_IF_ERROR(UpsertAttempt(a));
    for (Event e : batch.events) TAU_RETURN_IF_ERROR(AppendEvent(&e));
    return Status::Ok();
  }

  // Adds `me` to the group commit and returns once its group is committed: the first to find no
  // group being committed commits everything waiting, the others wait for it.
  Status Enqueue(PendingInsert* me) {
    group_mu.Lock();
    pending.push_back(me);
    while (!me->done) {
      if (group_leader) {
        group_cv.Wait(&group_mu);
        continue;
      }
      group_leader = true;
      std::vector<PendingInsert*> group;
      group.swap(pending);
      group_mu.Unlock();
      CommitInserts(group);
      group_mu.Lock();
      group_leader = false;
      for (PendingInsert* p : group) p->done = true;
      group_cv.SignalAll();
    }
    group_mu.Unlock();
    return me->result;
  }

  // Store::MarkPruned, under the store's mutex.
  Status MarkPruned(PruneKind kind, const std::vector<std::string>& runs, int64_t pruned_ms)
      TAU_REQUIRES(mu) {
    const char* column = kind == PruneKind::kLogs ? "logs_pruned_ms" : "samples_pruned_ms";
    return InTransaction([&]() TAU_REQUIRES(mu) -> Status {
      Stmt s(db, &cache,
             fmt::format("UPDATE runs SET {0} = COALESCE({0}, ?1) WHERE name = ?2", column));
      if (!s.ok()) return Error("preparing a retention mark");
      for (const std::string& name : runs) {
        sqlite3_reset(s.get());
        s.Bind(1, pruned_ms);
        s.Bind(2, name);
        if (s.Step() != SQLITE_DONE) return Error("marking a run pruned");
      }
      return Status::Ok();
    });
  }

  // Store::AddSnapshotBlobs (once it knows the snapshot is new) and ForgetBlobs, under the
  // store's mutex.
  Status AddSnapshotBlobs(const std::string& snapshot, const std::vector<std::string>& blobs)
      TAU_REQUIRES(mu);
  Status ForgetBlobs(const std::vector<std::string>& blobs) TAU_REQUIRES(mu);
  // Store::InsertToken and CountLiveTokens, under the store's mutex.
  Status InsertToken(const TokenRecord& t) TAU_REQUIRES(mu);
  Result<int64_t> CountLiveTokens(const std::string& user, int64_t now_ms) TAU_REQUIRES(mu);

  // Store::AssignRunUser, under the store's mutex.
  Result<std::string> AssignRunUser(const std::string& workspace, const std::string& user,
                                    const std::vector<std::string>& keep,
                                    const std::vector<std::string>& pool, int64_t now_ms)
      TAU_REQUIRES(mu) {
    auto listed = [](const std::vector<std::string>& names, const std::string& name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    std::string chosen;
    Status s = InTransaction([&]() TAU_REQUIRES(mu) -> Status {
      // The newest one this user already has, while they may use it: the same uid run after run.
      Stmt mine(db, &cache,
                "SELECT system_user FROM run_users WHERE workspace = ? AND user = ? "
                "ORDER BY assigned_ms DESC, rowid DESC");
      if (!mine.ok()) return Error("preparing run user lookup");
      mine.Bind(1, workspace);
      mine.Bind(2, user);
      int rc;
      while ((rc = mine.Step()) == SQLITE_ROW) {
        std::string held = mine.Text(0);
        if (listed(pool, held) || listed(keep, held)) {
          chosen = std::move(held);
          return Status::Ok();
        }
      }
      if (rc != SQLITE_DONE) return Error("reading run users");
      // Else the first one nobody has been given: a system user, once given, is never another's.
      for (const std::string& candidate : pool) {
        Stmt take(db, &cache,
                  "INSERT OR IGNORE INTO run_users (system_user, workspace, user, assigned_ms) "
                  "VALUES (?, ?, ?, ?)");
        if (!take.ok()) return Error("preparing run user assignment");
        take.Bind(1, candidate);
        take.Bind(2, workspace);
        take.Bind(3, user);
        take.Bind(4, now_ms);
        if (take.Step() != SQLITE_DONE) return Error("assigning a run user");
        if (sqlite3_changes(db) == 1) {
          chosen = candidate;
          return Status::Ok();
        }
      }
      return Status::Ok();
    });
    TAU_RETURN_IF_ERROR(s);
    if (chosen.empty())
      return ResourceExhausted(
          fmt::format("every system user of workspace '{}''s pool is taken", workspace));
    return chosen;
  }

  // Store::QueueDeliveries, under the store's mutex.
  Status QueueDeliveries(const std::vector<Delivery>& add, int64_t cursor, int64_t max_per_url,
                         int64_t* dropped) TAU_REQUIRES(mu) {
    *dropped = 0;
    return InTransaction([&]() TAU_REQUIRES(mu) -> Status {
      Stmt ins(db, &cache,
               "INSERT INTO deliveries (workspace, url, secret, event_id, body, attempts, "
               "created_ms, next_ms) VALUES (?, ?, ?, ?, ?, 0, ?, ?)");
      if (!ins.ok()) return Error("preparing a delivery");
      std::set<std::string> urls;
      for (const Delivery& d : add) {
        sqlite3_reset(ins.get());
        ins.Bind(1, d.workspace);
        ins.Bind(2, d.url);
        ins.Bind(3, d.secret);
        ins.Bind(4, d.event_id);
        ins.Bind(5, d.body);
        ins.Bind(6, d.created_ms);
        ins.Bind(7, d.next_ms);
        if (ins.Step() != SQLITE_DONE) return Error("queueing a delivery");
        urls.insert(d.url);
      }
      for (const std::string& url : urls) {
        Stmt trim(db, &cache,
                  "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE url = ?1 "
                  "ORDER BY id LIMIT MAX(0, (SELECT COUNT(*) FROM deliveries WHERE url = ?1) - "
                  "?2))");
        if (!trim.ok()) return Error("preparing a delivery trim");
        trim.Bind(1, url);
        trim.Bind(2, max_per_url);
        if (trim.Step() != SQLITE_DONE) return Error("trimming deliveries");
        *dropped += sqlite3_changes(db);
      }
      Stmt move(db, &cache, "UPDATE delivery_cursor SET event_id = ? WHERE one = 1");
      if (!move.ok()) return Error("preparing the delivery cursor");
      move.Bind(1, cursor);
      if (move.Step() != SQLITE_DONE) return Error("moving the delivery cursor");
      return Status::Ok();
    });
  }

  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT, rolling back on error.
  template <typename F>
  Status InTransaction(F body) TAU_REQUIRES(mu) {
    TAU_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status s = body();
    if (s.ok()) s = Exec("COMMIT");
    if (s.ok()) ++transactions;
    // A COMMIT that failed (a full disk) can leave the transaction open; the next one must not find
    // it so.
    if (!s.ok() && sqlite3_get_autocommit(db) == 0) (void)Exec("ROLLBACK");
    return s;
  }
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() {
  if (!impl_ || !impl_->db) return;
  for (auto& [sql, c] : impl_->cache) sqlite3_finalize(c.stmt);
  sqlite3_close_v2(impl_->db);
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  MutexLock lock(&impl->mu);  // no one else has it yet; the analysis wants it held all the same
  int rc =
      sqlite3_open_v2(path.c_str(), &impl->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = impl->db ? sqlite3_errmsg(impl->db) : "out of memory";
    if (impl->db) sqlite3_close_v2(impl->db);
    impl->db = nullptr;
    return Status(StatusCode::kIo, fmt::format("cannot open store {}: {}", path, msg));
  }
  sqlite3_busy_timeout(impl->db, 5000);
  // The store holds workspace secrets and token digests: only the server's user may read it
  // (SQLite creates the -wal and -shm files with the database's mode).
  if (path != ":memory:") (void)::chmod(path.c_str(), 0600);
  // WAL lets readers run beside the writer; synchronous=FULL fsyncs every commit, so a committed
  // state change survives a crash of the server or of the machine.
  Status ready = impl->Exec("PRAGMA journal_mode=WAL");
  if (ready.ok()) ready = impl->Exec("PRAGMA synchronous=FULL");
  if (ready.ok()) ready = impl->Exec("PRAGMA foreign_keys=ON");
  if (ready.ok()) ready = impl->Migrate();
  // The first statements are where a file that is not a database, or one from a newer tau, shows.
  if (!ready.ok())
    return Status(ready.code(), fmt::format("store {}: {} (move the file aside to start with an "
                                            "empty store, or restore it from a backup)",
                                            path, ready.message()));
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Status Store::CreateSchemaForTest(const std::string& path, int64_t version) {
  if (version < 1 || version > kLatestSchema)
    return InvalidArgument(fmt::format("no schema version {}", version));
  Impl impl;
  MutexLock lock(&impl.mu);
  if (sqlite3_open_v2(path.c_str(), &impl.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                      nullptr) != SQLITE_OK) {
    sqlite3_close_v2(impl.db);
    return Status(StatusCode::kIo, fmt::format("cannot open store {}", path));
  }
  Status s = impl.MigrateTo(0, version);
  for (auto& [sql, c] : impl.cache) sqlite3_finalize(c.stmt);
  sqlite3_close_v2(impl.db);
  impl.db = nullptr;
  return s;
}

Status Store::InsertRun(RunRecord* run, std::vector<Event> events) {
  return InsertRuns(run, &events, 1);
}

Status Store::InsertRuns(std::vector<RunRecord>* runs, std::vector<std::vector<Event>> events) {
  if (runs->size() != events.size())
    return InvalidArgument(
        fmt::format("InsertRuns: {} runs but {} lists of events", runs->size(), events.size()));
  if (runs->empty()) return Status::Ok();
  return InsertRuns(runs->data(), events.data(), runs->size());
}

Status Store::InsertRuns(RunRecord* runs, std::vector<Event>* events, size_t count) {
  // Group commit: submissions that arrive while another group is being committed (its fsync is
  // most of the wait) are committed together in the next transaction, one fsync for all of them.
  // Each returns only once its group is durable; each keeps its own outcome (a taken name refuses
  // that insert alone).
  Impl::PendingInsert me{runs, events, count, Status::Ok(), false};
  return impl_->Enqueue(&me);
}

int64_t Store::TransactionsCommitted() {
  MutexLock lock(&impl_->mu);
  return impl_->transactions;
}

Status Store::Commit(const Batch& batch) {
  if (batch.empty()) return Status::Ok();
  Impl::PendingInsert me{nullptr, nullptr, 0, Status::Ok(), false, &batch};
  return impl_->Enqueue(&me);
}

Result<RunRecord> Store::GetRun(const std::string& name) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM runs WHERE name = ?", kRunColumns).c_str());
  if (!s.ok()) return impl_->Error("preparing run lookup");
  s.Bind(1, name);
  int rc = s.Step();
  if (rc == SQLITE_ROW) return ReadRun(s);
  if (rc == SQLITE_DONE) return NotFound(fmt::format("no run named '{}'", name));
  return impl_->Error("reading run");
}

Result<RunRecord> Store::FindRunBySubmitKey(const std::string& owner, const std::string& key) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM runs WHERE owner = ? AND submit_key = ? AND submit_key <> ''",
                     kRunColumns)
             .c_str());
  if (!s.ok()) return impl_->Error("preparing run lookup by submission key");
  s.Bind(1, owner);
  s.Bind(2, key);
  int rc = s.Step();
  if (rc == SQLITE_ROW) return ReadRun(s);
  if (rc == SQLITE_DONE)
    return NotFound(fmt::format("no run of {} has submission key '{}'", owner, key));
  return impl_->Error("reading run");
}

static std::string WhereClause(const RunFilter& f) {
  std::vector<std::string> conds;
  if (f.state) conds.push_back("state = ?1");
  if (f.active_only) conds.push_back("state IN ('Queued','Admitted','Running')");
  if (!f.workspace.empty()) conds.push_back("workspace = ?2");
  if (!f.queue.empty()) conds.push_back("queue = ?3");
  if (f.workspaces_in) conds.push_back("workspace IN (SELECT value FROM json_each(?4))");
  if (!f.owner.empty()) conds.push_back("owner = ?7");
  if (!f.project.empty()) conds.push_back("project = ?8");
  if (!f.group.empty()) conds.push_back("experiment_group = ?9");
  if (!f.workflow.empty()) conds.push_back("workflow = ?10");
  if (!f.service.empty()) conds.push_back("service = ?11");
  std::string out;
  for (size_t i = 0; i < conds.size(); ++i) out += (i ? " AND " : " WHERE ") + conds[i];
  return out;
}

static void BindFilter(Stmt& s, const RunFilter& f) {
  if (f.state) s.Bind(1, std::string(RunStateName(*f.state)));
  if (!f.workspace.empty()) s.Bind(2, f.workspace);
  if (!f.queue.empty()) s.Bind(3, f.queue);
  if (f.workspaces_in) s.Bind(4, JsonText(nlohmann::json(*f.workspaces_in)));
  if (!f.owner.empty()) s.Bind(7, f.owner);
  if (!f.project.empty()) s.Bind(8, f.project);
  if (!f.group.empty()) s.Bind(9, f.group);
  if (!f.workflow.empty()) s.Bind(10, f.workflow);
  if (!f.service.empty()) s.Bind(11, f.service);
}

Result<std::vector<RunRecord>> Store::ListRuns(const RunFilter& filter) {
  MutexLock lock(&impl_->mu);
  // The page is bound, not written into the text, so that the statement is prepared once.
  std::string sql = fmt::format("SELECT {} FROM runs{} ORDER BY seq {} LIMIT ?5 OFFSET ?6",
                                filter.summary ? kSummaryColumns : kRunColumns, WhereClause(filter),
                                filter.newest_first ? "DESC" : "ASC");
  Stmt s(impl_->db, &impl_->cache, sql);
  if (!s.ok()) return impl_->Error("preparing run list");
  BindFilter(s, filter);
  s.Bind(5, static_cast<int64_t>(filter.limit > 0 ? filter.limit : -1));
  s.Bind(6, static_cast<int64_t>(filter.offset));
  std::vector<RunRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back(ReadRun(s, filter.summary));
  if (rc != SQLITE_DONE) return impl_->Error("listing runs");
  return out;
}

Result<int64_t> Store::CountRuns(const RunFilter& filter) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT COUNT(*) FROM runs{}", WhereClause(filter)).c_str());
  if (!s.ok()) return impl_->Error("preparing run count");
  BindFilter(s, filter);
  if (s.Step() != SQLITE_ROW) return impl_->Error("counting runs");
  return s.Int(0);
}

Result<std::vector<RunCount>> Store::CountRunsByStateAndWorkspace() {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT state, workspace, COUNT(*) FROM runs GROUP BY state, workspace");
  if (!s.ok()) return impl_->Error("preparing run counts");
  std::vector<RunCount> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back({s.Text(0), s.Text(1), s.Int(2)});
  if (rc != SQLITE_DONE) return impl_->Error("counting runs");
  return out;
}

Result<std::vector<AttemptRecord>> Store::ListAttempts(const std::string& run) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT run, number, state, dir, shim_pid, shim_start_time, gpus, started_ms, ended_ms, "
         "exit_code, signal, outcome, reason, message, diagnosis FROM attempts WHERE run = ? "
         "ORDER BY number");
  if (!s.ok()) return impl_->Error("preparing attempt list");
  s.Bind(1, run);
  std::vector<AttemptRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    AttemptRecord a;
    a.run = s.Text(0);
    a.number = static_cast<int>(s.Int(1));
    a.state = ParseAttemptState(s.Text(2));
    a.dir = s.Text(3);
    a.shim_pid = static_cast<int>(s.Int(4));
    a.shim_start_time = static_cast<uint64_t>(s.Int(5));
    a.gpus = ParseIntList(s.Text(6));
    a.started_ms = s.Int(7);
    a.ended_ms = s.OptInt(8);
    a.exit_code = s.OptInt32(9);
    a.signal = s.OptInt32(10);
    a.outcome = s.Text(11);
    a.reason = s.Text(12);
    a.message = s.Text(13);
    a.diagnosis = ParseJsonColumn(s.Text(14), nlohmann::json::object());
    out.push_back(std::move(a));
  }
  if (rc != SQLITE_DONE) return impl_->Error("listing attempts");
  return out;
}

Result<std::vector<Event>> Store::ListEvents(const std::string& run) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT id, run, ts_ms, type, message, data, prev_hash, hash FROM events WHERE run = ? "
         "ORDER BY id");
  if (!s.ok()) return impl_->Error("preparing event list");
  s.Bind(1, run);
  std::vector<Event> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    Event e;
    e.id = s.Int(0);
    e.run = s.Text(1);
    e.ts_ms = s.Int(2);
    e.type = s.Text(3);
    e.message = s.Text(4);
    e.data = ParseJsonColumn(s.Text(5), nlohmann::json::object());
    e.prev_hash = s.Text(6);
    e.hash = s.Text(7);
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return impl_->Error("listing events");
  return out;
}

// ---- retention -------------------------------------------------------------------------------

Result<std::vector<RetentionDue>> Store::ListRetentionDue(PruneKind kind, int64_t cutoff_ms,
                                                          const std::optional<RetentionDue>& after,
                                                          int64_t limit) {
  MutexLock lock(&impl_->mu);
  // The WHERE repeats the partial index's own condition word for word (so SQLite may use it), and
  // INDEXED BY makes sure it does: without statistics it could prefer a scan of every run.
  const char* column = kind == PruneKind::kLogs ? "logs_pruned_ms" : "samples_pruned_ms";
  const char* index = kind == PruneKind::kLogs ? "runs_logs_due" : "runs_samples_due";
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT name, finished_ms, seq FROM runs INDEXED BY {} WHERE {} IS NULL AND "
                     "state IN ('Succeeded','Failed','Cancelled') AND finished_ms <= ?1 AND "
                     "(finished_ms, seq) > (?2, ?3) ORDER BY finished_ms, seq LIMIT ?4",
                     index, column));
  if (!s.ok()) return impl_->Error("preparing the retention due list");
  s.Bind(1, cutoff_ms);
  s.Bind(2, after ? after->finished_ms : INT64_MIN);
  s.Bind(3, after ? after->seq : INT64_MIN);
  s.Bind(4, limit > 0 ? limit : int64_t{-1});
  std::vector<RetentionDue> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back({s.Text(0), s.Int(1), s.Int(2)});
  if (rc != SQLITE_DONE) return impl_->Error("reading the retention due list");
  return out;
}

Status Store::MarkPruned(PruneKind kind, const std::vector<std::string>& runs, int64_t pruned_ms) {
  if (runs.empty()) return Status::Ok();
  MutexLock lock(&impl_->mu);
  return impl_->MarkPruned(kind, runs, pruned_ms);
}

// ---- identity ---------------------------------------------------------------------------------

static constexpr const char* kTokenColumns =
    "id, digest, user, groups, description, created_by, created_ms, expires_ms, revoked_ms";

static TokenRecord ReadToken(Stmt& s) {
  TokenRecord t;
  t.id = s.Text(0);
  t.digest = s.Text(1);
  t.user = s.Text(2);
  nlohmann::json groups = ParseJsonColumn(s.Text(3), nlohmann::json::array());
  if (groups.is_array())
    for (const auto& g : groups)
      if (g.is_string()) t.groups.push_back(g.get<std::string>());
  t.description = s.Text(4);
  t.created_by = s.Text(5);
  t.created_ms = s.Int(6);
  t.expires_ms = s.OptInt(7);
  t.revoked_ms = s.OptInt(8);
  return t;
}

Status Store::InsertToken(const TokenRecord& t) {
  MutexLock lock(&impl_->mu);
  return impl_->InsertToken(t);
}

Status Store::InsertToken(const TokenRecord& t, int64_t max_live, int64_t now_ms) {
  MutexLock lock(&impl_->mu);
  TAU_ASSIGN_OR_RETURN(int64_t live, impl_->CountLiveTokens(t.user, now_ms));
  if (live >= max_live)
    return ResourceExhausted(fmt::format(
        "user '{}' already has {} live API tokens, the most one user may hold (tau server "
        "--max-tokens-per-user); revoke those no longer used (`tau admin token list`, `tau admin "
        "token revoke ID`) or let them expire",
        t.user, live));
  return impl_->InsertToken(t);
}

Result<int64_t> Store::CountLiveTokens(const std::string& user, int64_t now_ms) {
  MutexLock lock(&impl_->mu);
  return impl_->CountLiveTokens(user, now_ms);
}

Status Store::Impl::InsertToken(const TokenRecord& t) {
  Stmt s(db, &cache,
         fmt::format("INSERT INTO tokens ({}) VALUES (?,?,?,?,?,?,?,?,?)", kTokenColumns).c_str());
  if (!s.ok()) return Error("preparing token insert");
  s.Bind(1, t.id);
  s.Bind(2, t.digest);
  s.Bind(3, t.user);
  s.Bind(4, JsonText(nlohmann::json(t.groups)));
  s.Bind(5, t.description);
  s.Bind(6, t.created_by);
  s.Bind(7, t.created_ms);
  s.Bind(8, t.expires_ms);
  s.Bind(9, t.revoked_ms);
  int rc = s.Step();
  if (rc == SQLITE_CONSTRAINT) return AlreadyExists("a token with this digest exists");
  if (rc != SQLITE_DONE) return Error("writing token");
  return Status::Ok();
}

Result<int64_t> Store::Impl::CountLiveTokens(const std::string& user, int64_t now_ms) {
  Stmt s(db, &cache,
         "SELECT COUNT(*) FROM tokens WHERE user = ? AND revoked_ms IS NULL AND (expires_ms IS "
         "NULL OR expires_ms > ?)");
  if (!s.ok()) return Error("preparing token count");
  s.Bind(1, user);
  s.Bind(2, now_ms);
  if (s.Step() != SQLITE_ROW) return Error("counting tokens");
  return s.Int(0);
}

Result<TokenRecord> Store::FindToken(const std::string& digest) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM tokens WHERE digest = ?", kTokenColumns).c_str());
  if (!s.ok()) return impl_->Error("preparing token lookup");
  s.Bind(1, digest);
  int rc = s.Step();
  if (rc == SQLITE_ROW) return ReadToken(s);
  if (rc == SQLITE_DONE) return NotFound("unknown token");
  return impl_->Error("reading token");
}

Result<std::vector<TokenRecord>> Store::ListTokens(const std::string& user) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM tokens WHERE ?1 = '' OR user = ?1 ORDER BY "
                     "created_ms, id",
                     kTokenColumns)
             .c_str());
  if (!s.ok()) return impl_->Error("preparing token list");
  s.Bind(1, user);
  std::vector<TokenRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back(ReadToken(s));
  if (rc != SQLITE_DONE) return impl_->Error("listing tokens");
  return out;
}

Status Store::RevokeToken(const std::string& id, int64_t now_ms) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "UPDATE tokens SET revoked_ms = COALESCE(revoked_ms, ?) WHERE id = ?");
  if (!s.ok()) return impl_->Error("preparing token revocation");
  s.Bind(1, now_ms);
  s.Bind(2, id);
  if (s.Step() != SQLITE_DONE) return impl_->Error("revoking token");
  if (sqlite3_changes(impl_->db) == 0) return NotFound(fmt::format("no token with id '{}'", id));
  return Status::Ok();
}

namespace {

constexpr const char* kServiceColumns =
    "name, workspace, owner, state, created_ms, updated_ms, doc";

ServiceRecord ReadService(Stmt& s) {
  ServiceRecord r;
  r.name = s.Text(0);
  r.workspace = s.Text(1);
  r.owner = s.Text(2);
  r.state = s.Text(3);
  r.created_ms = s.Int(4);
  r.updated_ms = s.Int(5);
  r.doc = ParseJsonColumn(s.Text(6), nlohmann::json::object());
  return r;
}

}  // namespace

Status Store::PutService(const ServiceRecord& r, bool create) {
  MutexLock lock(&impl_->mu);
  Stmt s(
      impl_->db, &impl_->cache,
      create
          ? fmt::format("INSERT INTO services ({}) VALUES (?,?,?,?,?,?,?)", kServiceColumns).c_str()
          : "UPDATE services SET workspace = ?2, owner = ?3, state = ?4, created_ms = ?5, "
            "updated_ms = ?6, doc = ?7 WHERE name = ?1");
  if (!s.ok()) return impl_->Error("preparing service write");
  s.Bind(1, r.name);
  s.Bind(2, r.workspace);
  s.Bind(3, r.owner);
  s.Bind(4, r.state);
  s.Bind(5, r.created_ms);
  s.Bind(6, r.updated_ms);
  s.Bind(7, JsonText(r.doc));
  int rc = s.Step();
  if (rc == SQLITE_CONSTRAINT)
    return AlreadyExists(fmt::format("a service named '{}' exists", r.name));
  if (rc != SQLITE_DONE) return impl_->Error("writing service");
  if (!create && sqlite3_changes(impl_->db) == 0)
    return NotFound(fmt::format("no service is named '{}'", r.name));
  return Status::Ok();
}

Result<ServiceRecord> Store::GetService(const std::string& name) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM services WHERE name = ?", kServiceColumns).c_str());
  if (!s.ok()) return impl_->Error("preparing service lookup");
  s.Bind(1, name);
  int rc = s.Step();
  if (rc == SQLITE_ROW) return ReadService(s);
  if (rc == SQLITE_DONE) return NotFound(fmt::format("no service is named '{}'", name));
  return impl_->Error("reading service");
}

Result<std::vector<ServiceRecord>> Store::ListServices() {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM services ORDER BY name", kServiceColumns).c_str());
  if (!s.ok()) return impl_->Error("preparing service list");
  std::vector<ServiceRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back(ReadService(s));
  if (rc != SQLITE_DONE) return impl_->Error("listing services");
  return out;
}

// ---- webhooks --------------------------------------------------------------------------------

Result<std::vector<EventInScope>> Store::ListEventsAfter(int64_t after_id, int64_t limit) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT e.id, e.run, e.ts_ms, e.type, e.message, e.data, r.workspace, r.owner, "
         // instr first: most specs have no webhooks, and a scan for the word is cheaper than a
         // JSON parse of each event's spec.
         "CASE WHEN instr(r.spec_json, '\"webhooks\"') > 0 AND json_valid(r.spec_json) "
         "THEN json_extract(r.spec_json, '$.policy.webhooks') END "
         "FROM events e JOIN runs r ON r.name = e.run WHERE e.id > ? ORDER BY e.id LIMIT ?");
  if (!s.ok()) return impl_->Error("preparing events after");
  s.Bind(1, after_id);
  s.Bind(2, limit);
  std::vector<EventInScope> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    EventInScope e;
    e.event.id = s.Int(0);
    e.event.run = s.Text(1);
    e.event.ts_ms = s.Int(2);
    e.event.type = s.Text(3);
    e.event.message = s.Text(4);
    e.event.data = ParseJsonColumn(s.Text(5), nlohmann::json::object());
    e.workspace = s.Text(6);
    e.owner = s.Text(7);
    if (auto hooks = s.OptText(8)) e.run_webhooks = ParseJsonColumn(*hooks, e.run_webhooks);
    if (!e.run_webhooks.is_array()) e.run_webhooks = nlohmann::json::array();
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return impl_->Error("listing events after");
  return out;
}

Result<int64_t> Store::DeliveryCursor() {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "SELECT event_id FROM delivery_cursor WHERE one = 1");
  if (!s.ok()) return impl_->Error("preparing the delivery cursor");
  if (s.Step() != SQLITE_ROW) return impl_->Error("reading the delivery cursor");
  return s.Int(0);
}

Status Store::QueueDeliveries(const std::vector<Delivery>& add, int64_t cursor, int64_t max_per_url,
                              int64_t* dropped) {
  MutexLock lock(&impl_->mu);
  return impl_->QueueDeliveries(add, cursor, max_per_url, dropped);
}

static constexpr const char* kDeliveryColumns =
    "id, workspace, url, secret, event_id, body, attempts, created_ms, next_ms, last_error";

Result<std::vector<Delivery>> Store::DueDeliveries(int64_t now_ms) {
  MutexLock lock(&impl_->mu);
  // The head of each URL's queue only: a later delivery never overtakes an earlier one.
  Stmt s(impl_->db, &impl_->cache,
         fmt::format("SELECT {} FROM deliveries WHERE id IN (SELECT MIN(id) FROM deliveries "
                     "GROUP BY url) AND next_ms <= ? ORDER BY id",
                     kDeliveryColumns));
  if (!s.ok()) return impl_->Error("preparing due deliveries");
  s.Bind(1, now_ms);
  std::vector<Delivery> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    Delivery d;
    d.id = s.Int(0);
    d.workspace = s.Text(1);
    d.url = s.Text(2);
    d.secret = s.Text(3);
    d.event_id = s.Int(4);
    d.body = s.Text(5);
    d.attempts = static_cast<int>(s.Int(6));
    d.created_ms = s.Int(7);
    d.next_ms = s.Int(8);
    d.last_error = s.Text(9);
    out.push_back(std::move(d));
  }
  if (rc != SQLITE_DONE) return impl_->Error("listing due deliveries");
  return out;
}

Status Store::DeleteDelivery(int64_t id) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "DELETE FROM deliveries WHERE id = ?");
  if (!s.ok()) return impl_->Error("preparing a delivery delete");
  s.Bind(1, id);
  if (s.Step() != SQLITE_DONE) return impl_->Error("deleting a delivery");
  return Status::Ok();
}

Status Store::PostponeDelivery(int64_t id, int attempts, int64_t next_ms,
                               const std::string& error) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "UPDATE deliveries SET attempts = ?, next_ms = ?, last_error = ? WHERE id = ?");
  if (!s.ok()) return impl_->Error("preparing a delivery retry");
  s.Bind(1, static_cast<int64_t>(attempts));
  s.Bind(2, next_ms);
  s.Bind(3, error);
  s.Bind(4, id);
  if (s.Step() != SQLITE_DONE) return impl_->Error("postponing a delivery");
  return Status::Ok();
}

Result<int64_t> Store::CountDeliveries() {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "SELECT COUNT(*) FROM deliveries");
  if (!s.ok()) return impl_->Error("preparing a delivery count");
  if (s.Step() != SQLITE_ROW) return impl_->Error("counting deliveries");
  return s.Int(0);
}

Result<std::vector<UsageRecord>> Store::ListUsage(int64_t since_ms) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT e.run, e.ts_ms, e.data, r.workspace, r.owner, r.queue FROM events e "
         "JOIN runs r ON r.name = e.run WHERE e.type = 'Metered' AND e.ts_ms >= ? "
         "ORDER BY e.ts_ms, e.id");
  if (!s.ok()) return impl_->Error("preparing usage list");
  s.Bind(1, since_ms);
  std::vector<UsageRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    const nlohmann::json data = ParseJsonColumn(s.Text(2), nlohmann::json::object());
    UsageRecord u;
    u.run = s.Text(0);
    u.ended_ms = s.Int(1);
    u.workspace = s.Text(3);
    u.owner = s.Text(4);
    u.queue = s.Text(5);
    u.attempt = data.value("attempt", 0);
    u.gpus = data.value("gpus", int64_t{0});
    u.cpu_milli = data.value("cpu_milli", int64_t{0});
    u.memory_bytes = data.value("memory_bytes", int64_t{0});
    u.sampled_gpu_hours = data.value("sampled_gpu_hours", 0.0);
    u.idle_gpu_hours = data.value("idle_gpu_hours", 0.0);
    if (auto f = data.find("flavors"); f != data.end() && f->is_object()) u.flavors = *f;
    u.started_ms = data.value("admitted_ms", *u.ended_ms);
    out.push_back(std::move(u));
  }
  if (rc != SQLITE_DONE) return impl_->Error("listing usage");
  return out;
}

Status Store::DeleteService(const std::string& name) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "DELETE FROM services WHERE name = ?");
  if (!s.ok()) return impl_->Error("preparing service delete");
  s.Bind(1, name);
  if (s.Step() != SQLITE_DONE) return impl_->Error("deleting service");
  if (sqlite3_changes(impl_->db) == 0)
    return NotFound(fmt::format("no service is named '{}'", name));
  return Status::Ok();
}

Status Store::AppendAudit(const AuditRecord& a) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "INSERT INTO audit (ts_ms, user, via, method, path, status, action, detail) VALUES "
         "(?,?,?,?,?,?,?,?)");
  if (!s.ok()) return impl_->Error("preparing audit insert");
  s.Bind(1, a.ts_ms);
  s.Bind(2, a.user);
  s.Bind(3, a.via);
  s.Bind(4, a.method);
  s.Bind(5, a.path);
  s.Bind(6, static_cast<int64_t>(a.status));
  s.Bind(7, a.action);
  s.Bind(8, a.detail);
  if (s.Step() != SQLITE_DONE) return impl_->Error("writing audit record");
  return Status::Ok();
}

Result<std::vector<AuditRecord>> Store::ListAudit(int64_t limit) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT id, ts_ms, user, via, method, path, status, action, detail FROM audit ORDER BY "
         "id DESC LIMIT ?");
  if (!s.ok()) return impl_->Error("preparing audit list");
  s.Bind(1, limit > 0 ? limit : int64_t{-1});
  std::vector<AuditRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    AuditRecord a;
    a.id = s.Int(0);
    a.ts_ms = s.Int(1);
    a.user = s.Text(2);
    a.via = s.Text(3);
    a.method = s.Text(4);
    a.path = s.Text(5);
    a.status = static_cast<int>(s.Int(6));
    a.action = s.Text(7);
    a.detail = s.Text(8);
    out.push_back(std::move(a));
  }
  if (rc != SQLITE_DONE) return impl_->Error("listing audit records");
  return out;
}

Status Store::PutSecret(const SecretInfo& info, const std::string& value) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "INSERT OR REPLACE INTO secrets (workspace, key, value, updated_ms, updated_by) VALUES "
         "(?,?,?,?,?)");
  if (!s.ok()) return impl_->Error("preparing secret write");
  s.Bind(1, info.workspace);
  s.Bind(2, info.key);
  s.Bind(3, value);
  s.Bind(4, info.updated_ms);
  s.Bind(5, info.updated_by);
  if (s.Step() != SQLITE_DONE) return impl_->Error("writing secret");
  return Status::Ok();
}

Status Store::DeleteSecret(const std::string& workspace, const std::string& key) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "DELETE FROM secrets WHERE workspace = ? AND key = ?");
  if (!s.ok()) return impl_->Error("preparing secret delete");
  s.Bind(1, workspace);
  s.Bind(2, key);
  if (s.Step() != SQLITE_DONE) return impl_->Error("deleting secret");
  if (sqlite3_changes(impl_->db) == 0)
    return NotFound(fmt::format("workspace '{}' has no secret '{}'", workspace, key));
  return Status::Ok();
}

Result<std::vector<SecretInfo>> Store::ListSecrets(const std::string& workspace) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT workspace, key, length(value), updated_ms, updated_by FROM secrets WHERE "
         "workspace = ? ORDER BY key");
  if (!s.ok()) return impl_->Error("preparing secret list");
  s.Bind(1, workspace);
  std::vector<SecretInfo> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW)
    out.push_back({s.Text(0), s.Text(1), s.Int(2), s.Int(3), s.Text(4)});
  if (rc != SQLITE_DONE) return impl_->Error("listing secrets");
  return out;
}

Result<std::string> Store::AssignRunUser(const std::string& workspace, const std::string& user,
                                         const std::vector<std::string>& keep,
                                         const std::vector<std::string>& pool, int64_t now_ms) {
  MutexLock lock(&impl_->mu);
  return impl_->AssignRunUser(workspace, user, keep, pool, now_ms);
}

Result<std::vector<RunUserRecord>> Store::ListRunUsers() {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT system_user, workspace, user, assigned_ms FROM run_users ORDER BY system_user");
  if (!s.ok()) return impl_->Error("preparing run user list");
  std::vector<RunUserRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Int(3)});
  if (rc != SQLITE_DONE) return impl_->Error("reading run users");
  return out;
}

Result<std::vector<RunUserRecord>> Store::RunUsersOf(const std::string& workspace,
                                                     const std::string& user) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT system_user, workspace, user, assigned_ms FROM run_users WHERE workspace = ? AND "
         "user = ? ORDER BY assigned_ms DESC, rowid DESC");
  if (!s.ok()) return impl_->Error("preparing run user lookup");
  s.Bind(1, workspace);
  s.Bind(2, user);
  std::vector<RunUserRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Int(3)});
  if (rc != SQLITE_DONE) return impl_->Error("reading run users");
  return out;
}

Result<std::map<std::string, std::string>> Store::SecretValues(const std::string& workspace) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "SELECT key, value FROM secrets WHERE workspace = ?");
  if (!s.ok()) return impl_->Error("preparing secret read");
  s.Bind(1, workspace);
  std::map<std::string, std::string> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out[s.Text(0)] = s.Text(1);
  if (rc != SQLITE_DONE) return impl_->Error("reading secrets");
  return out;
}

namespace {

// The workspaces a blob query is limited to: a JSON array bound as one parameter (json_each), or
// every workspace.
std::string WorkspacesJson(const std::optional<std::vector<std::string>>& workspaces) {
  return workspaces ? JsonText(nlohmann::json(*workspaces)) : std::string("[]");
}

}  // namespace

Status Store::AddBlobOwner(const std::string& owner, const std::string& sha256, int64_t size,
                           int64_t now_ms) {
  MutexLock lock(&impl_->mu);
  Stmt s(
      impl_->db, &impl_->cache,
      "INSERT OR IGNORE INTO blob_owners (owner, sha256, size, uploaded_ms) VALUES (?, ?, ?, ?)");
  if (!s.ok()) return impl_->Error("preparing blob owner insert");
  s.Bind(1, owner);
  s.Bind(2, sha256);
  s.Bind(3, size);
  s.Bind(4, now_ms);
  if (s.Step() != SQLITE_DONE) return impl_->Error("writing blob owner");
  return Status::Ok();
}

Result<bool> Store::OwnsBlob(const std::string& owner, const std::string& sha256) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache, "SELECT 1 FROM blob_owners WHERE owner = ? AND sha256 = ?");
  if (!s.ok()) return impl_->Error("preparing blob owner lookup");
  s.Bind(1, owner);
  s.Bind(2, sha256);
  int rc = s.Step();
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return impl_->Error("reading blob owners");
  return rc == SQLITE_ROW;
}

Status Store::AddSnapshotBlobs(const std::string& snapshot, const std::vector<std::string>& blobs) {
  MutexLock lock(&impl_->mu);
  {
    Stmt known(impl_->db, &impl_->cache, "SELECT 1 FROM snapshot_blobs WHERE snapshot = ? LIMIT 1");
    if (!known.ok()) return impl_->Error("preparing snapshot lookup");
    known.Bind(1, snapshot);
    int rc = known.Step();
    if (rc == SQLITE_ROW || blobs.empty()) return Status::Ok();
    if (rc != SQLITE_DONE) return impl_->Error("reading snapshot blobs");
  }
  return impl_->AddSnapshotBlobs(snapshot, blobs);
}

Status Store::Impl::AddSnapshotBlobs(const std::string& snapshot,
                                     const std::vector<std::string>& blobs) {
  // One statement, all rows or none, and no fsync of its own (synchronous=NORMAL in WAL mode):
  // the next commit's fsync makes it durable, and a list a crash lost is written again with the
  // next run of the snapshot.
  TAU_RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL"));
  Status written;
  {
    Stmt ins(db, &cache,
             "INSERT OR IGNORE INTO snapshot_blobs (sha256, snapshot) SELECT value, ?1 FROM "
             "json_each(?2)");
    if (!ins.ok()) {
      written = Error("preparing snapshot blob insert");
    } else {
      ins.Bind(1, snapshot);
      ins.Bind(2, JsonText(nlohmann::json(blobs)));
      if (ins.Step() != SQLITE_DONE) written = Error("writing snapshot blobs");
    }
  }
  Status full = Exec("PRAGMA synchronous=FULL");
  return written.ok() ? full : written;
}

Result<std::set<std::string>> Store::UsableBlobs(
    const std::string& owner, const std::optional<std::vector<std::string>>& workspaces,
    const std::vector<std::string>& blobs) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT EXISTS (SELECT 1 FROM blob_owners WHERE owner = ?1 AND sha256 = ?2) OR EXISTS "
         "(SELECT 1 FROM snapshot_blobs b JOIN runs r ON r.snapshot_digest = b.snapshot WHERE "
         "b.sha256 = ?2 AND (?3 = 1 OR r.workspace IN (SELECT value FROM json_each(?4))))");
  if (!s.ok()) return impl_->Error("preparing blob access check");
  const std::string in = WorkspacesJson(workspaces);
  std::set<std::string> out;
  for (const std::string& blob : blobs) {
    sqlite3_reset(s.get());
    s.Bind(1, owner);
    s.Bind(2, blob);
    s.Bind(3, int64_t{workspaces ? 0 : 1});
    s.Bind(4, in);
    if (s.Step() != SQLITE_ROW) return impl_->Error("checking blob access");
    if (s.Int(0) != 0) out.insert(blob);
  }
  return out;
}

Result<bool> Store::SnapshotUsedIn(const std::string& snapshot,
                                   const std::optional<std::vector<std::string>>& workspaces) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT 1 FROM runs WHERE snapshot_digest = ?1 AND (?2 = 1 OR workspace IN (SELECT value "
         "FROM json_each(?3))) LIMIT 1");
  if (!s.ok()) return impl_->Error("preparing snapshot access check");
  s.Bind(1, snapshot);
  s.Bind(2, int64_t{workspaces ? 0 : 1});
  s.Bind(3, WorkspacesJson(workspaces));
  int rc = s.Step();
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return impl_->Error("checking snapshot access");
  return rc == SQLITE_ROW;
}

Result<int64_t> Store::UnreferencedBlobBytes(const std::string& owner) {
  MutexLock lock(&impl_->mu);
  Stmt s(impl_->db, &impl_->cache,
         "SELECT COALESCE(SUM(o.size), 0) FROM blob_owners o WHERE o.owner = ? AND NOT EXISTS "
         "(SELECT 1 FROM snapshot_blobs b JOIN runs r ON r.snapshot_digest = b.snapshot WHERE "
         "b.sha256 = o.sha256)");
  if (!s.ok()) return impl_->Error("preparing unreferenced blob sum");
  s.Bind(1, owner);
  if (s.Step() != SQLITE_ROW) return impl_->Error("summing unreferenced blobs");
  return s.Int(0);
}

Status Store::ForgetBlobs(const std::vector<std::string>& blobs) {
  if (blobs.empty()) return Status::Ok();
  MutexLock lock(&impl_->mu);
  return impl_->ForgetBlobs(blobs);
}

Status Store::Impl::ForgetBlobs(const std::vector<std::string>& blobs) {
  return InTransaction([&]() TAU_REQUIRES(mu) -> Status {
    Stmt del(db, &cache, "DELETE FROM blob_owners WHERE sha256 = ?");
    if (!del.ok()) return Error("preparing blob owner removal");
    for (const std::string& blob : blobs) {
      sqlite3_reset(del.get());
      del.Bind(1, blob);
      if (del.Step() != SQLITE_DONE) return Error("removing blob owners");
    }
    return Status::Ok();
  });
}

}  // namespace tau::store
