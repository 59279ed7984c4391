#include "api/types.h"

#include <limits>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace tau::api {
namespace {

using nlohmann::json;

const char* TypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number with a fraction";
    default:
      return "not JSON";
  }
}

// Reads the members of one JSON object into a type. Each read marks its member as known; the
// first problem is kept and named by its path ("attempts[1].exit_code"); Finish hands the members
// nobody read to `extra`.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object())
      status_ = InvalidArgument(fmt::format("{} is {}, expected an object",
                                            path_.empty() ? "the reply" : "member '" + path_ + "'",
                                            TypeName(j_)));
  }

  // The member, marked as known; nullptr when it is missing (an error if `required`).
  const json* Member(const char* key, bool required = true) {
    if (!status_.ok()) return nullptr;
    known_.insert(key);
    auto it = j_.find(key);
    if (it != j_.end()) return &*it;
    if (required) status_ = InvalidArgument(fmt::format("member '{}' is missing", Path(key)));
    return nullptr;
  }
  bool Has(const char* key) const { return j_.is_object() && j_.contains(key); }

  void Str(const char* key, std::string* out) {
    if (const json* v = Member(key)) {
      if (v->is_string())
        *out = v->get<std::string>();
      else
        Wrong(key, *v, "a string");
    }
  }
  // Null is nullopt.
  void NullableStr(const char* key, std::optional<std::string>* out) {
    if (const json* v = Member(key)) {
      if (v->is_null())
        out->reset();
      else if (v->is_string())
        *out = v->get<std::string>();
      else
        Wrong(key, *v, "a string or null");
    }
  }
  // Absent is nullopt.
  void OptionalStr(const char* key, std::optional<std::string>* out) {
    if (!Has(key)) {
      Member(key, /*required=*/false);
      return;
    }
    std::string s;
    Str(key, &s);
    *out = std::move(s);
  }
  void Bool(const char* key, bool* out) {
    if (const json* v = Member(key)) {
      if (v->is_boolean())
        *out = v->get<bool>();
      else
        Wrong(key, *v, "a boolean");
    }
  }
  // Null is nullopt.
  void NullableBool(const char* key, std::optional<bool>* out) {
    if (const json* v = Member(key)) {
      if (v->is_null())
        out->reset();
      else if (v->is_boolean())
        *out = v->get<bool>();
      else
        Wrong(key, *v, "a boolean or null");
    }
  }
  void Double(const char* key, double* out) {
    if (const json* v = Member(key)) {
      if (v->is_number())
        *out = v->get<double>();
      else
        Wrong(key, *v, "a number");
    }
  }
  void NullableDouble(const char* key, std::optional<double>* out) {
    if (const json* v = Member(key)) {
      if (v->is_null())
        out->reset();
      else if (v->is_number())
        *out = v->get<double>();
      else
        Wrong(key, *v, "a number or null");
    }
  }
  template <typename T>
  void Int(const char* key, T* out) {
    if (const json* v = Member(key)) ToInt(key, *v, out, "an integer");
  }
  template <typename T>
  void NullableInt(const char* key, std::optional<T>* out) {
    if (const json* v = Member(key)) {
      if (v->is_null()) {
        out->reset();
        return;
      }
      T n{};
      if (ToInt(key, *v, &n, "an integer or null")) *out = n;
    }
  }
  // Absent is nullopt.
  template <typename T>
  void OptionalInt(const char* key, std::optional<T>* out) {
    if (!Has(key)) {
      Member(key, /*required=*/false);
      return;
    }
    T n{};
    Int(key, &n);
    *out = n;
  }
  void Any(const char* key, json* out) {
    if (const json* v = Member(key)) *out = *v;
  }
  void Object(const char* key, json* out) {
    if (const json* v = Member(key)) {
      if (v->is_object())
        *out = *v;
      else
        Wrong(key, *v, "an object");
    }
  }
  void IntList(const char* key, std::vector<int>* out) {
    const json* v = Member(key);
    if (v == nullptr) return;
    if (!v->is_array()) return Wrong(key, *v, "an array of integers");
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      int n = 0;
      std::string item = fmt::format("{}[{}]", key, i);
      if (!ToInt(item.c_str(), (*v)[i], &n, "an integer")) return;
      out->push_back(n);
    }
  }
  void StrList(const char* key, std::vector<std::string>* out) {
    const json* v = Member(key);
    if (v == nullptr) return;
    if (!v->is_array()) return Wrong(key, *v, "an array of strings");
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) return Wrong(fmt::format("{}[{}]", key, i), (*v)[i], "a string");
      out->push_back((*v)[i].get<std::string>());
    }
  }
  // `read(item_json, item_path, &item)` for each element.
  template <typename T, typename F>
  void List(const char* key, std::vector<T>* out, F read, bool required = true) {
    const json* v = Member(key, required);
    if (v == nullptr) return;
    if (!v->is_array()) return Wrong(key, *v, "an array");
    out->clear();
    for (size_t i = 0; i < v->size() && status_.ok(); ++i) {
      T item;
      status_ = read((*v)[i], fmt::format("{}[{}]", Path(key), i), &item);
      out->push_back(std::move(item));
    }
  }
  template <typename T, typename F>
  void Nested(const char* key, T* out, F read) {
    if (const json* v = Member(key)) status_ = read(*v, Path(key), out);
  }

  Status Finish(json* extra) {
    if (!status_.ok()) return status_;
    *extra = json::object();
    for (const auto& [k, v] : j_.items())
      if (!known_.count(k)) (*extra)[k] = v;
    return Status::Ok();
  }
  const std::string& path() const { return path_; }

 private:
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  void Wrong(const std::string& key, const json& v, const char* want) {
    status_ = InvalidArgument(
        fmt::format("member '{}' is {}, expected {}", Path(key), TypeName(v), want));
  }
  template <typename T>
  bool ToInt(const std::string& key, const json& v, T* out, const char* want) {
    bool fits = false;
    if (v.is_number_unsigned())
      fits = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    else if (v.is_number_integer())
      fits = v.get<int64_t>() >= std::numeric_limits<T>::min() &&
             v.get<int64_t>() <= std::numeric_limits<T>::max();
    if (!v.is_number_integer()) {
      Wrong(key, v, want);
      return false;
    }
    if (!fits) {
      status_ = InvalidArgument(fmt::format("member '{}' is out of range", Path(key)));
      return false;
    }
    *out = v.get<T>();
    return true;
  }

  const json& j_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
  Status status_;
};

template <typename T>
json Nullable(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// The members nobody knew when the JSON was read go back where they were.
json WithExtra(json j, const json& extra) {
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

template <typename T, typename F>
json Array(const std::vector<T>& items, F to_json) {
  json a = json::array();
  for (const T& item : items) a.push_back(to_json(item));
  return a;
}

// The members of a Pending, read into `out`: shared by a run's `pending` and a queue's pending
// runs, whose entries add the run's name, workspace and priority.
void ReadPendingMembers(Reader& r, Pending* out) {
  r.NullableInt("position", &out->position);
  r.OptionalStr("queue", &out->queue);
  r.OptionalStr("code", &out->code);
  r.Str("reason", &out->reason);
  r.OptionalStr("detail", &out->detail);
}

json PendingMembers(const Pending& p) {
  json j = {{"position", Nullable(p.position)}, {"reason", p.reason}};
  if (p.queue) j["queue"] = *p.queue;
  if (p.code) j["code"] = *p.code;
  if (p.detail) j["detail"] = *p.detail;
  return j;
}

Status ReadPending(const json& j, const std::string& path, Pending* out) {
  Reader r(j, path);
  ReadPendingMembers(r, out);
  return r.Finish(&out->extra);
}

Status ReadRunArray(const json& j, const std::string& path, RunArray* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Int("index", &out->index);
  r.Int("first", &out->first);
  r.Int("last", &out->last);
  r.Int("step", &out->step);
  r.OptionalInt("max_parallel", &out->max_parallel);
  return r.Finish(&out->extra);
}

Status ReadWorkflowUpstream(const json& j, const std::string& path, WorkflowUpstream* out) {
  Reader r(j, path);
  r.Str("stage", &out->stage);
  r.Str("run", &out->run);
  r.Str("condition", &out->condition);
  return r.Finish(&out->extra);
}

Status ReadRunWorkflow(const json& j, const std::string& path, RunWorkflow* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Str("stage", &out->stage);
  r.List("after", &out->after, ReadWorkflowUpstream);
  return r.Finish(&out->extra);
}

Status ReadRun(const json& j, const std::string& path, Run* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Str("spec_name", &out->spec_name);
  r.Str("spec_file", &out->spec_file);
  r.Str("state", &out->state);
  r.Str("reason", &out->reason);
  r.Str("message", &out->message);
  r.NullableInt("exit_code", &out->exit_code);
  r.NullableInt("signal", &out->signal);
  r.Int("attempts", &out->attempts);
  r.Str("workspace", &out->workspace);
  r.Str("user", &out->user);
  r.Str("queue", &out->queue);
  r.Int("priority", &out->priority);
  r.IntList("gpus", &out->gpus);
  r.Any("resources", &out->resources);
  r.Str("config_hash", &out->config_hash);
  r.Str("snapshot_digest", &out->snapshot_digest);
  r.Bool("cancel_requested", &out->cancel_requested);
  r.Str("created", &out->created);
  r.NullableStr("admitted", &out->admitted);
  r.NullableStr("started", &out->started);
  r.NullableStr("finished", &out->finished);
  r.Str("kind", &out->kind);
  r.Str("project", &out->project);
  r.Str("group", &out->group);
  r.Str("backend", &out->backend);
  out->has_pending = r.Has("pending");
  if (const json* p = r.Member("pending", /*required=*/false); p != nullptr && !p->is_null()) {
    Pending pending;
    TAU_RETURN_IF_ERROR(
        ReadPending(*p, r.path().empty() ? "pending" : r.path() + ".pending", &pending));
    out->pending = std::move(pending);
  }
  if (const json* s = r.Member("spec", /*required=*/false)) out->spec = *s;
  if (const json* a = r.Member("array", /*required=*/false)) {
    RunArray array;
    TAU_RETURN_IF_ERROR(ReadRunArray(*a, r.path().empty() ? "array" : r.path() + ".array", &array));
    out->array = std::move(array);
  }
  if (const json* w = r.Member("workflow", /*required=*/false)) {
    RunWorkflow workflow;
    TAU_RETURN_IF_ERROR(
        ReadRunWorkflow(*w, r.path().empty() ? "workflow" : r.path() + ".workflow", &workflow));
    out->workflow = std::move(workflow);
  }
  return r.Finish(&out->extra);
}

Status ReadEvidence(const json& j, const std::string& path, DiagnosisEvidence* out) {
  Reader r(j, path);
  r.Str("signature", &out->signature);
  r.Int("rank", &out->rank);
  r.Str("line", &out->line);
  return r.Finish(&out->extra);
}

// {} is no diagnosis.
Status ReadDiagnosis(const json& j, const std::string& path, std::optional<Diagnosis>* out) {
  if (j.is_object() && j.empty()) {
    out->reset();
    return Status::Ok();
  }
  Diagnosis d;
  Reader r(j, path);
  r.Str("phase", &d.phase);
  r.Str("summary", &d.summary);
  r.List("evidence", &d.evidence, ReadEvidence);
  TAU_RETURN_IF_ERROR(r.Finish(&d.extra));
  *out = std::move(d);
  return Status::Ok();
}

Status ReadAttempt(const json& j, const std::string& path, Attempt* out) {
  Reader r(j, path);
  r.Int("number", &out->number);
  r.Str("state", &out->state);
  r.IntList("gpus", &out->gpus);
  r.Str("started", &out->started);
  r.NullableStr("ended", &out->ended);
  r.NullableInt("exit_code", &out->exit_code);
  r.NullableInt("signal", &out->signal);
  r.Str("outcome", &out->outcome);
  r.Str("reason", &out->reason);
  r.Str("message", &out->message);
  r.Int("supervisor_pid", &out->supervisor_pid);
  r.Nested("diagnosis", &out->diagnosis, ReadDiagnosis);
  return r.Finish(&out->extra);
}

Status ReadEvent(const json& j, const std::string& path, Event* out) {
  Reader r(j, path);
  r.Str("time", &out->time);
  r.Str("type", &out->type);
  r.Str("message", &out->message);
  r.Any("data", &out->data);
  r.Str("hash", &out->hash);
  return r.Finish(&out->extra);
}

Status ReadUsage(const json& j, const std::string& path, Usage* out) {
  Reader r(j, path);
  r.Str("flavor", &out->flavor);
  r.Str("resource", &out->resource);
  r.Str("nominal", &out->nominal);
  r.Str("usage", &out->usage);
  r.OptionalStr("borrowed", &out->borrowed);
  return r.Finish(&out->extra);
}

json UsageJson(const Usage& u) {
  json j = {
      {"flavor", u.flavor}, {"resource", u.resource}, {"nominal", u.nominal}, {"usage", u.usage}};
  if (u.borrowed) j["borrowed"] = *u.borrowed;
  return WithExtra(std::move(j), u.extra);
}

Status ReadFairUsage(const json& j, const std::string& path, FairUsage* out) {
  Reader r(j, path);
  r.Str("workspace", &out->workspace);
  r.NullableDouble("usage", &out->usage);
  r.Double("weight", &out->weight);
  r.Object("consumed", &out->consumed);
  r.Object("held", &out->held);
  return r.Finish(&out->extra);
}

json FairUsageJson(const FairUsage& u) {
  return WithExtra({{"workspace", u.workspace},
                    {"usage", u.usage ? json(*u.usage) : json(nullptr)},
                    {"weight", u.weight},
                    {"consumed", u.consumed},
                    {"held", u.held}},
                   u.extra);
}

Status ReadAdmittedRun(const json& j, const std::string& path, AdmittedRun* out) {
  Reader r(j, path);
  if (r.Has("hidden")) {
    r.Bool("hidden", &out->hidden);
  } else {
    r.Str("name", &out->name);
    r.Str("workspace", &out->workspace);
    r.Any("flavors", &out->flavors);
  }
  r.Str("state", &out->state);
  r.Int("priority", &out->priority);
  return r.Finish(&out->extra);
}

json AdmittedRunJson(const AdmittedRun& a) {
  json j = {{"state", a.state}, {"priority", a.priority}};
  if (a.hidden) {
    j["hidden"] = true;
  } else {
    j["name"] = a.name;
    j["workspace"] = a.workspace;
    j["flavors"] = a.flavors;
  }
  return WithExtra(std::move(j), a.extra);
}

Status ReadPendingRun(const json& j, const std::string& path, PendingRun* out) {
  Reader r(j, path);
  if (r.Has("hidden")) {
    r.Bool("hidden", &out->hidden);
    r.NullableInt("position", &out->pending.position);
  } else {
    r.Str("name", &out->name);
    r.Str("workspace", &out->workspace);
    ReadPendingMembers(r, &out->pending);
  }
  r.Int("priority", &out->priority);
  return r.Finish(&out->pending.extra);
}

json PendingRunJson(const PendingRun& p) {
  json j;
  if (p.hidden) {
    j = {{"hidden", true}, {"position", Nullable(p.pending.position)}};
  } else {
    j = PendingMembers(p.pending);
    j["name"] = p.name;
    j["workspace"] = p.workspace;
  }
  j["priority"] = p.priority;
  return WithExtra(std::move(j), p.pending.extra);
}

Status ReadQueue(const json& j, const std::string& path, Queue* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Str("cohort", &out->cohort);
  r.Str("queueing_strategy", &out->queueing_strategy);
  r.List("usage", &out->usage, ReadUsage);
  r.Int("admitted", &out->admitted);
  r.Int("pending", &out->pending);
  // Left out of a summary (GET /api/v1/queues?summary=1).
  r.List("admitted_runs", &out->admitted_runs, ReadAdmittedRun, /*required=*/false);
  r.List("pending_runs", &out->pending_runs, ReadPendingRun, /*required=*/false);
  r.List("fair_usage", &out->fair_usage, ReadFairUsage, /*required=*/false);
  return r.Finish(&out->extra);
}

Status ReadCohort(const json& j, const std::string& path, Cohort* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.List("usage", &out->usage, ReadUsage);
  return r.Finish(&out->extra);
}

Status ReadUnqueued(const json& j, const std::string& path, UnqueuedRun* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Str("why", &out->why);
  return r.Finish(&out->extra);
}

Status ReadArtifactEntry(const json& j, const std::string& path, ArtifactEntry* out) {
  Reader r(j, path);
  r.Str("path", &out->path);
  r.Str("kind", &out->kind);
  r.Int("size", &out->size);
  r.NullableStr("sha256", &out->sha256);
  r.Str("modified", &out->modified);
  return r.Finish(&out->extra);
}

Status ReadWorkspaceRole(const json& j, const std::string& path, WorkspaceRole* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Str("role", &out->role);
  return r.Finish(&out->extra);
}

Status ReadToken(const json& j, const std::string& path, Token* out) {
  Reader r(j, path);
  r.Str("id", &out->id);
  r.Str("user", &out->user);
  r.StrList("groups", &out->groups);
  r.Str("description", &out->description);
  r.Str("created_by", &out->created_by);
  r.Str("created", &out->created);
  r.NullableStr("expires", &out->expires);
  r.NullableStr("revoked", &out->revoked);
  r.OptionalStr("token", &out->token);
  return r.Finish(&out->extra);
}

Status ReadAuditRecord(const json& j, const std::string& path, AuditRecord* out) {
  Reader r(j, path);
  r.Str("time", &out->time);
  r.Str("user", &out->user);
  r.Str("via", &out->via);
  r.Str("method", &out->method);
  r.Str("path", &out->path);
  r.Int("status", &out->status);
  r.Str("action", &out->action);
  r.Str("detail", &out->detail);
  return r.Finish(&out->extra);
}

Status ReadSecretInfo(const json& j, const std::string& path, SecretInfo* out) {
  Reader r(j, path);
  r.Str("key", &out->key);
  r.Int("size", &out->size);
  r.Str("updated", &out->updated);
  r.Str("updated_by", &out->updated_by);
  return r.Finish(&out->extra);
}

Status ReadHealthReason(const json& j, const std::string& path, HealthReason* out) {
  Reader r(j, path);
  r.Str("check", &out->check);
  r.Str("status", &out->status);
  r.Str("action", &out->action);
  r.Str("clear", &out->clear);
  r.Str("message", &out->message);
  r.Str("threshold", &out->threshold);
  r.Str("source", &out->source);
  r.Str("first_seen", &out->first_seen);
  r.Str("last_seen", &out->last_seen);
  r.Int("count", &out->count);
  return r.Finish(&out->extra);
}

json HealthReasonJson(const HealthReason& h) {
  return WithExtra({{"check", h.check},
                    {"status", h.status},
                    {"action", h.action},
                    {"clear", h.clear},
                    {"message", h.message},
                    {"threshold", h.threshold},
                    {"source", h.source},
                    {"first_seen", h.first_seen},
                    {"last_seen", h.last_seen},
                    {"count", h.count}},
                   h.extra);
}

Status ReadXid(const json& j, const std::string& path, XidSeen* out) {
  Reader r(j, path);
  r.Int("xid", &out->xid);
  r.Str("at", &out->at);
  return r.Finish(&out->extra);
}

Status ReadGpuHealth(const json& j, const std::string& path, GpuHealth* out) {
  Reader r(j, path);
  r.Int("gpu", &out->gpu);
  r.Str("verdict", &out->verdict);
  r.Bool("placeable", &out->placeable);
  r.Str("since", &out->since);
  r.List("reasons", &out->reasons, ReadHealthReason);
  r.List("pending", &out->pending, ReadHealthReason);
  r.List("recent_application_xids", &out->recent_application_xids, ReadXid);
  return r.Finish(&out->extra);
}

json GpuHealthJson(const GpuHealth& h) {
  return WithExtra({{"gpu", h.gpu},
                    {"verdict", h.verdict},
                    {"placeable", h.placeable},
                    {"since", h.since},
                    {"reasons", Array(h.reasons, HealthReasonJson)},
                    {"pending", Array(h.pending, HealthReasonJson)},
                    {"recent_application_xids",
                     Array(h.recent_application_xids,
                           [](const XidSeen& x) {
                             return WithExtra({{"xid", x.xid}, {"at", x.at}}, x.extra);
                           })}},
                   h.extra);
}

Status ReadGpuDevice(const json& j, const std::string& path, GpuDevice* out) {
  Reader r(j, path);
  r.Int("index", &out->index);
  r.Str("uuid", &out->uuid);
  r.Str("name", &out->name);
  r.Int("memory_total_bytes", &out->memory_total_bytes);
  r.Str("pci_bus_id", &out->pci_bus_id);
  r.OptionalInt("minor_number", &out->minor_number);
  r.NullableBool("mig_enabled", &out->mig_enabled);
  r.NullableBool("mig_pending", &out->mig_pending);
  if (r.Has("health")) {
    GpuHealth health;
    r.Nested("health", &health, ReadGpuHealth);
    out->health = std::move(health);
  }
  return r.Finish(&out->extra);
}

json GpuDeviceJson(const GpuDevice& d) {
  json j = {{"index", d.index},
            {"uuid", d.uuid},
            {"name", d.name},
            {"memory_total_bytes", d.memory_total_bytes},
            {"pci_bus_id", d.pci_bus_id},
            {"mig_enabled", Nullable(d.mig_enabled)},
            {"mig_pending", Nullable(d.mig_pending)}};
  if (d.minor_number) j["minor_number"] = *d.minor_number;
  if (d.health) j["health"] = GpuHealthJson(*d.health);
  return WithExtra(std::move(j), d.extra);
}

// The members of an inventory: a reply of their own (GET /api/v1/gpus adds `snapshot`) or nested.
void ReadInventoryMembers(Reader& r, GpuInventory* out) {
  r.List("devices", &out->devices, ReadGpuDevice);
  r.Bool("driver_loaded", &out->driver_loaded);
  r.Str("driver_version", &out->driver_version);
  r.Str("cuda_driver_version", &out->cuda_driver_version);
  r.Str("nvml_version", &out->nvml_version);
  r.Str("library", &out->library);
  r.Str("note", &out->note);
  // Servers before it did not send it.
  if (r.Has("error")) r.Str("error", &out->error);
}

Status ReadInventory(const json& j, const std::string& path, GpuInventory* out) {
  Reader r(j, path);
  ReadInventoryMembers(r, out);
  return r.Finish(&out->extra);
}

json InventoryJson(const GpuInventory& i) {
  json j = {{"devices", Array(i.devices, GpuDeviceJson)},
            {"driver_loaded", i.driver_loaded},
            {"driver_version", i.driver_version},
            {"cuda_driver_version", i.cuda_driver_version},
            {"nvml_version", i.nvml_version},
            {"library", i.library},
            {"note", i.note}};
  if (!i.error.empty()) j["error"] = i.error;
  return WithExtra(std::move(j), i.extra);
}

Status ReadProbeResult(const json& j, const std::string& path, ProbeResult* out) {
  Reader r(j, path);
  r.Int("cuda_ordinal", &out->cuda_ordinal);
  r.Bool("passed", &out->passed);
  r.OptionalStr("name", &out->name);
  r.OptionalStr("error", &out->error);
  r.Double("ms", &out->ms);
  return r.Finish(&out->extra);
}

Status ReadActiveProbe(const json& j, const std::string& path, ActiveProbe* out) {
  Reader r(j, path);
  r.Bool("ran", &out->ran);
  r.OptionalStr("note", &out->note);
  out->has_gpus = r.Has("gpus");
  if (out->has_gpus)
    r.List("gpus", &out->gpus, ReadProbeResult);
  else
    r.Member("gpus", /*required=*/false);
  return r.Finish(&out->extra);
}

json ActiveProbeJson(const ActiveProbe& a) {
  json j = {{"ran", a.ran}};
  if (a.note) j["note"] = *a.note;
  if (a.has_gpus)
    j["gpus"] = Array(a.gpus, [](const ProbeResult& p) {
      json g = {{"cuda_ordinal", p.cuda_ordinal}, {"passed", p.passed}, {"ms", p.ms}};
      if (p.name) g["name"] = *p.name;
      if (p.error) g["error"] = *p.error;
      return WithExtra(std::move(g), p.extra);
    });
  return WithExtra(std::move(j), a.extra);
}

// FromJson of a type read by `read` at the top of a reply.
template <typename T, typename F>
Result<T> FromTop(const json& j, F read) {
  T out;
  TAU_RETURN_IF_ERROR(read(j, "", &out));
  return out;
}

}  // namespace

json Pending::ToJson() const { return WithExtra(PendingMembers(*this), extra); }

Result<Pending> Pending::FromJson(const json& j) { return FromTop<Pending>(j, ReadPending); }

bool Run::IsTerminal() const {
  return state == "Succeeded" || state == "Failed" || state == "Cancelled";
}

int Run::Workers() const {
  if (auto w = resources.find("workers");
      resources.is_object() && w != resources.end() && w->is_number_integer())
    return w->get<int>();
  return 1;
}

int64_t Run::Gpus() const {
  if (auto g = resources.find("gpus");
      resources.is_object() && g != resources.end() && g->is_number_integer())
    return g->get<int64_t>();
  return 0;
}

std::string Run::Image() const {
  if (!spec || !spec->is_object()) return "";
  auto runtime = spec->find("runtime");
  if (runtime == spec->end() || !runtime->is_object()) return "";
  auto image = runtime->find("image");
  return image != runtime->end() && image->is_string() ? image->get<std::string>() : "";
}

json Run::ToJson() const {
  json j = {{"name", name},
            {"spec_name", spec_name},
            {"spec_file", spec_file},
            {"state", state},
            {"reason", reason},
            {"message", message},
            {"exit_code", Nullable(exit_code)},
            {"signal", Nullable(signal)},
            {"attempts", attempts},
            {"workspace", workspace},
            {"user", user},
            {"queue", queue},
            {"priority", priority},
            {"gpus", gpus},
            {"resources", resources},
            {"config_hash", config_hash},
            {"snapshot_digest", snapshot_digest},
            {"cancel_requested", cancel_requested},
            {"created", created},
            {"admitted", Nullable(admitted)},
            {"started", Nullable(started)},
            {"finished", Nullable(finished)},
            {"kind", kind},
            {"project", project},
            {"group", group},
            {"backend", backend}};
  if (has_pending) j["pending"] = pending ? pending->ToJson() : json(nullptr);
  if (spec) j["spec"] = *spec;
  if (array) j["array"] = array->ToJson();
  if (workflow) j["workflow"] = workflow->ToJson();
  return WithExtra(std::move(j), extra);
}

json RunWorkflow::ToJson() const {
  return WithExtra(
      {{"name", name},
       {"stage", stage},
       {"after", Array(after,
                       [](const WorkflowUpstream& u) {
                         return WithExtra(
                             {{"stage", u.stage}, {"run", u.run}, {"condition", u.condition}},
                             u.extra);
                       })}},
      extra);
}

Result<RunWorkflow> RunWorkflow::FromJson(const json& j) {
  return FromTop<RunWorkflow>(j, ReadRunWorkflow);
}

std::string RunArray::Range() const {
  std::string range = std::to_string(first) + "-" + std::to_string(last);
  if (step != 1) range += ":" + std::to_string(step);
  if (max_parallel) range += "%" + std::to_string(*max_parallel);
  return range;
}

json RunArray::ToJson() const {
  json j = {{"name", name}, {"index", index}, {"first", first}, {"last", last}, {"step", step}};
  if (max_parallel) j["max_parallel"] = *max_parallel;
  return WithExtra(std::move(j), extra);
}

Result<RunArray> RunArray::FromJson(const json& j) { return FromTop<RunArray>(j, ReadRunArray); }

json SubmittedBatch::ToJson() const {
  return WithExtra({{"runs", Array(runs, [](const Run& r) { return r.ToJson(); })}}, extra);
}

Result<SubmittedBatch> SubmittedBatch::FromJson(const json& j) {
  return FromTop<SubmittedBatch>(j,
                                 [](const json& j, const std::string& path, SubmittedBatch* out) {
                                   Reader r(j, path);
                                   r.List("runs", &out->runs, ReadRun);
                                   return r.Finish(&out->extra);
                                 });
}

Result<Run> Run::FromJson(const json& j) { return FromTop<Run>(j, ReadRun); }

json Diagnosis::ToJson() const {
  return WithExtra(
      {{"phase", phase},
       {"summary", summary},
       {"evidence", Array(evidence,
                          [](const DiagnosisEvidence& e) {
                            return WithExtra(
                                {{"signature", e.signature}, {"rank", e.rank}, {"line", e.line}},
                                e.extra);
                          })}},
      extra);
}

Result<Diagnosis> Diagnosis::FromJson(const json& j) {
  std::optional<Diagnosis> d;
  if (j.is_object() && j.empty()) return InvalidArgument("the diagnosis is empty");
  TAU_RETURN_IF_ERROR(ReadDiagnosis(j, "", &d));
  return std::move(*d);
}

json Attempt::ToJson() const {
  json d = diagnosis ? diagnosis->ToJson() : json::object();
  return WithExtra({{"number", number},
                    {"state", state},
                    {"gpus", gpus},
                    {"started", started},
                    {"ended", Nullable(ended)},
                    {"exit_code", Nullable(exit_code)},
                    {"signal", Nullable(signal)},
                    {"outcome", outcome},
                    {"reason", reason},
                    {"message", message},
                    {"supervisor_pid", supervisor_pid},
                    {"diagnosis", std::move(d)}},
                   extra);
}

Result<Attempt> Attempt::FromJson(const json& j) { return FromTop<Attempt>(j, ReadAttempt); }

json Event::ToJson() const {
  return WithExtra(
      {{"time", time}, {"type", type}, {"message", message}, {"data", data}, {"hash", hash}},
      extra);
}

Result<Event> Event::FromJson(const json& j) { return FromTop<Event>(j, ReadEvent); }

json RunDetail::ToJson() const {
  return WithExtra({{"run", run.ToJson()},
                    {"attempts", Array(attempts, [](const Attempt& a) { return a.ToJson(); })},
                    {"events", Array(events, [](const Event& e) { return e.ToJson(); })}},
                   extra);
}

Result<RunDetail> RunDetail::FromJson(const json& j) {
  return FromTop<RunDetail>(j, [](const json& j, const std::string& path, RunDetail* out) {
    Reader r(j, path);
    r.Nested("run", &out->run, ReadRun);
    r.List("attempts", &out->attempts, ReadAttempt);
    r.List("events", &out->events, ReadEvent);
    return r.Finish(&out->extra);
  });
}

json RunList::ToJson() const {
  return WithExtra({{"runs", Array(runs, [](const Run& r) { return r.ToJson(); })},
                    {"total", total},
                    {"limit", limit},
                    {"offset", offset}},
                   extra);
}

Result<RunList> RunList::FromJson(const json& j) {
  return FromTop<RunList>(j, [](const json& j, const std::string& path, RunList* out) {
    Reader r(j, path);
    r.List("runs", &out->runs, ReadRun);
    r.Int("total", &out->total);
    r.Int("limit", &out->limit);
    r.Int("offset", &out->offset);
    return r.Finish(&out->extra);
  });
}

json Submitted::ToJson() const {
  json j = {{"run", run.ToJson()}};
  if (warning) j["warning"] = *warning;
  return WithExtra(std::move(j), extra);
}

Result<Submitted> Submitted::FromJson(const json& j) {
  return FromTop<Submitted>(j, [](const json& j, const std::string& path, Submitted* out) {
    Reader r(j, path);
    r.Nested("run", &out->run, ReadRun);
    r.OptionalStr("warning", &out->warning);
    return r.Finish(&out->extra);
  });
}

json RunEvent::ToJson() const {
  return WithExtra({{"name", name},
                    {"state", state},
                    {"reason", reason},
                    {"message", message},
                    {"queue", queue},
                    {"workspace", workspace},
                    {"attempts", attempts},
                    {"updated", updated}},
                   extra);
}

Result<RunEvent> RunEvent::FromJson(const json& j) {
  return FromTop<RunEvent>(j, [](const json& j, const std::string& path, RunEvent* out) {
    Reader r(j, path);
    r.Str("name", &out->name);
    r.Str("state", &out->state);
    r.Str("reason", &out->reason);
    r.Str("message", &out->message);
    r.Str("queue", &out->queue);
    r.Str("workspace", &out->workspace);
    r.Int("attempts", &out->attempts);
    r.Str("updated", &out->updated);
    return r.Finish(&out->extra);
  });
}

json Queue::ToJson() const {
  json j = {{"name", name},
            {"cohort", cohort},
            {"queueing_strategy", queueing_strategy},
            {"usage", Array(usage, UsageJson)},
            {"admitted", admitted},
            {"pending", pending},
            {"admitted_runs", Array(admitted_runs, AdmittedRunJson)},
            {"pending_runs", Array(pending_runs, PendingRunJson)}};
  if (!fair_usage.empty()) j["fair_usage"] = Array(fair_usage, FairUsageJson);
  return WithExtra(std::move(j), extra);
}

Result<Queue> Queue::FromJson(const json& j) { return FromTop<Queue>(j, ReadQueue); }

json Queues::ToJson() const {
  return WithExtra(
      {{"queues", Array(queues, [](const Queue& q) { return q.ToJson(); })},
       {"cohorts",
        Array(cohorts,
              [](const Cohort& c) {
                return WithExtra({{"name", c.name}, {"usage", Array(c.usage, UsageJson)}}, c.extra);
              })},
       {"unqueued_runs", Array(unqueued_runs,
                               [](const UnqueuedRun& u) {
                                 return WithExtra({{"name", u.name}, {"why", u.why}}, u.extra);
                               })}},
      extra);
}

Result<Queues> Queues::FromJson(const json& j) {
  return FromTop<Queues>(j, [](const json& j, const std::string& path, Queues* out) {
    Reader r(j, path);
    r.List("queues", &out->queues, ReadQueue);
    r.List("cohorts", &out->cohorts, ReadCohort);
    r.List("unqueued_runs", &out->unqueued_runs, ReadUnqueued);
    return r.Finish(&out->extra);
  });
}

json QueueReply::ToJson() const { return WithExtra({{"queue", queue.ToJson()}}, extra); }

Result<QueueReply> QueueReply::FromJson(const json& j) {
  return FromTop<QueueReply>(j, [](const json& j, const std::string& path, QueueReply* out) {
    Reader r(j, path);
    r.Nested("queue", &out->queue, ReadQueue);
    return r.Finish(&out->extra);
  });
}

json Capacity::ToJson() const {
  return WithExtra({{"gpus_total", gpus_total},
                    {"gpus_free", gpus_free},
                    {"gpus_unplaceable", gpus_unplaceable},
                    {"cpu_milli_total", cpu_milli_total},
                    {"cpu_milli_free", cpu_milli_free},
                    {"memory_bytes_total", memory_bytes_total},
                    {"memory_bytes_free", memory_bytes_free},
                    {"queued", queued},
                    {"active", active}},
                   extra);
}

Result<Capacity> Capacity::FromJson(const json& j) {
  return FromTop<Capacity>(j, [](const json& j, const std::string& path, Capacity* out) {
    Reader r(j, path);
    r.Int("gpus_total", &out->gpus_total);
    r.Int("gpus_free", &out->gpus_free);
    r.Int("gpus_unplaceable", &out->gpus_unplaceable);
    r.Int("cpu_milli_total", &out->cpu_milli_total);
    r.Int("cpu_milli_free", &out->cpu_milli_free);
    r.Int("memory_bytes_total", &out->memory_bytes_total);
    r.Int("memory_bytes_free", &out->memory_bytes_free);
    r.Int("queued", &out->queued);
    r.Int("active", &out->active);
    return r.Finish(&out->extra);
  });
}

json Version::ToJson() const {
  return WithExtra({{"version", version}, {"api", api}, {"backend", backend}}, extra);
}

Result<Version> Version::FromJson(const json& j) {
  return FromTop<Version>(j, [](const json& j, const std::string& path, Version* out) {
    Reader r(j, path);
    r.Str("version", &out->version);
    r.Str("api", &out->api);
    r.Str("backend", &out->backend);
    return r.Finish(&out->extra);
  });
}

json CodeMissing::ToJson() const {
  return WithExtra({{"digest", digest}, {"stored", stored}, {"missing", missing}}, extra);
}

Result<CodeMissing> CodeMissing::FromJson(const json& j) {
  return FromTop<CodeMissing>(j, [](const json& j, const std::string& path, CodeMissing* out) {
    Reader r(j, path);
    r.Str("digest", &out->digest);
    r.Bool("stored", &out->stored);
    r.StrList("missing", &out->missing);
    return r.Finish(&out->extra);
  });
}

json ArtifactList::ToJson() const {
  return WithExtra({{"run", run},
                    {"artifacts", Array(artifacts,
                                        [](const ArtifactEntry& a) {
                                          return WithExtra({{"path", a.path},
                                                            {"kind", a.kind},
                                                            {"size", a.size},
                                                            {"sha256", Nullable(a.sha256)},
                                                            {"modified", a.modified}},
                                                           a.extra);
                                        })},
                    {"total", total},
                    {"offset", offset},
                    {"limit", limit},
                    {"truncated", truncated},
                    {"max_listed", max_listed},
                    {"undigested", undigested}},
                   extra);
}

Result<ArtifactList> ArtifactList::FromJson(const json& j) {
  return FromTop<ArtifactList>(j, [](const json& j, const std::string& path, ArtifactList* out) {
    Reader r(j, path);
    r.Str("run", &out->run);
    r.List("artifacts", &out->artifacts, ReadArtifactEntry);
    r.Int("total", &out->total);
    r.Int("offset", &out->offset);
    r.Int("limit", &out->limit);
    r.Bool("truncated", &out->truncated);
    r.Int("max_listed", &out->max_listed);
    r.Int("undigested", &out->undigested);
    return r.Finish(&out->extra);
  });
}

namespace {

json ServiceReplicaJson(const ServiceReplica& r) {
  return WithExtra({{"run", r.run},
                    {"state", r.state},
                    {"revision", r.revision},
                    {"port", r.port},
                    {"ready", r.ready},
                    {"draining", r.draining},
                    {"restarts", r.restarts},
                    {"probe", r.probe},
                    {"reason", r.reason}},
                   r.extra);
}

Status ReadServiceReplica(const json& j, const std::string& path, ServiceReplica* out) {
  Reader r(j, path);
  r.Str("run", &out->run);
  r.Str("state", &out->state);
  r.Int("revision", &out->revision);
  r.Int("port", &out->port);
  r.Bool("ready", &out->ready);
  r.Bool("draining", &out->draining);
  r.Int("restarts", &out->restarts);
  r.Str("probe", &out->probe);
  r.Str("reason", &out->reason);
  return r.Finish(&out->extra);
}

Status ReadService(const json& j, const std::string& path, Service* out) {
  Reader r(j, path);
  r.Str("name", &out->name);
  r.Str("workspace", &out->workspace);
  r.Str("owner", &out->owner);
  r.Str("state", &out->state);
  r.Int("replicas", &out->replicas);
  r.Int("ready", &out->ready);
  r.Int("revision", &out->revision);
  r.Str("endpoint", &out->endpoint);
  r.Str("spec_file", &out->spec_file);
  r.Str("config_hash", &out->config_hash);
  r.Str("snapshot_digest", &out->snapshot_digest);
  r.Any("model", &out->model);
  r.Any("serve", &out->serve);
  r.List("replica_list", &out->replica_list, ReadServiceReplica);
  r.Int("restarts", &out->restarts);
  r.Object("requests", &out->requests);
  r.Any("history", &out->history);
  r.Str("created", &out->created);
  r.Str("updated", &out->updated);
  return r.Finish(&out->extra);
}

}  // namespace

json Service::ToJson() const {
  return WithExtra({{"name", name},
                    {"workspace", workspace},
                    {"owner", owner},
                    {"state", state},
                    {"replicas", replicas},
                    {"ready", ready},
                    {"revision", revision},
                    {"endpoint", endpoint},
                    {"spec_file", spec_file},
                    {"config_hash", config_hash},
                    {"snapshot_digest", snapshot_digest},
                    {"model", model},
                    {"serve", serve},
                    {"replica_list", Array(replica_list, ServiceReplicaJson)},
                    {"restarts", restarts},
                    {"requests", requests},
                    {"history", history},
                    {"created", created},
                    {"updated", updated}},
                   extra);
}

Result<Service> Service::FromJson(const json& j) {
  return FromTop<Service>(j, [](const json& j, const std::string& path, Service* out) {
    return ReadService(j, path, out);
  });
}

json ServiceList::ToJson() const {
  return WithExtra({{"services", Array(services, [](const Service& s) { return s.ToJson(); })}},
                   extra);
}

Result<ServiceList> ServiceList::FromJson(const json& j) {
  return FromTop<ServiceList>(j, [](const json& j, const std::string& path, ServiceList* out) {
    Reader r(j, path);
    r.List("services", &out->services, ReadService);
    return r.Finish(&out->extra);
  });
}

json Whoami::ToJson() const {
  return WithExtra(
      {{"user", user},
       {"groups", groups},
       {"via", via},
       {"token_id", token_id},
       {"admin", admin},
       {"platform_viewer", platform_viewer},
       {"workspaces", Array(workspaces,
                            [](const WorkspaceRole& w) {
                              return WithExtra({{"name", w.name}, {"role", w.role}}, w.extra);
                            })}},
      extra);
}

Result<Whoami> Whoami::FromJson(const json& j) {
  return FromTop<Whoami>(j, [](const json& j, const std::string& path, Whoami* out) {
    Reader r(j, path);
    r.Str("user", &out->user);
    r.StrList("groups", &out->groups);
    r.Str("via", &out->via);
    r.Str("token_id", &out->token_id);
    r.Bool("admin", &out->admin);
    r.Bool("platform_viewer", &out->platform_viewer);
    r.List("workspaces", &out->workspaces, ReadWorkspaceRole);
    return r.Finish(&out->extra);
  });
}

json Token::ToJson() const {
  json j = {{"id", id},
            {"user", user},
            {"groups", groups},
            {"description", description},
            {"created_by", created_by},
            {"created", created},
            {"expires", Nullable(expires)},
            {"revoked", Nullable(revoked)}};
  if (token) j["token"] = *token;
  return WithExtra(std::move(j), extra);
}

Result<Token> Token::FromJson(const json& j) { return FromTop<Token>(j, ReadToken); }

json TokenList::ToJson() const {
  return WithExtra({{"tokens", Array(tokens, [](const Token& t) { return t.ToJson(); })}}, extra);
}

Result<TokenList> TokenList::FromJson(const json& j) {
  return FromTop<TokenList>(j, [](const json& j, const std::string& path, TokenList* out) {
    Reader r(j, path);
    r.List("tokens", &out->tokens, ReadToken);
    return r.Finish(&out->extra);
  });
}

json AuditList::ToJson() const {
  return WithExtra({{"audit", Array(audit,
                                    [](const AuditRecord& a) {
                                      return WithExtra({{"time", a.time},
                                                        {"user", a.user},
                                                        {"via", a.via},
                                                        {"method", a.method},
                                                        {"path", a.path},
                                                        {"status", a.status},
                                                        {"action", a.action},
                                                        {"detail", a.detail}},
                                                       a.extra);
                                    })}},
                   extra);
}

Result<AuditList> AuditList::FromJson(const json& j) {
  return FromTop<AuditList>(j, [](const json& j, const std::string& path, AuditList* out) {
    Reader r(j, path);
    r.List("audit", &out->audit, ReadAuditRecord);
    return r.Finish(&out->extra);
  });
}

json SecretList::ToJson() const {
  return WithExtra({{"workspace", workspace},
                    {"secrets", Array(secrets,
                                      [](const SecretInfo& s) {
                                        return WithExtra({{"key", s.key},
                                                          {"size", s.size},
                                                          {"updated", s.updated},
                                                          {"updated_by", s.updated_by}},
                                                         s.extra);
                                      })}},
                   extra);
}

Result<SecretList> SecretList::FromJson(const json& j) {
  return FromTop<SecretList>(j, [](const json& j, const std::string& path, SecretList* out) {
    Reader r(j, path);
    r.Str("workspace", &out->workspace);
    r.List("secrets", &out->secrets, ReadSecretInfo);
    return r.Finish(&out->extra);
  });
}

json PlatformView::ToJson() const {
  return WithExtra(
      {{"source", source}, {"applied", applied}, {"platform", platform}, {"text", text}}, extra);
}

Result<PlatformView> PlatformView::FromJson(const json& j) {
  return FromTop<PlatformView>(j, [](const json& j, const std::string& path, PlatformView* out) {
    Reader r(j, path);
    r.Str("source", &out->source);
    r.Str("applied", &out->applied);
    r.Object("platform", &out->platform);
    r.Str("text", &out->text);
    return r.Finish(&out->extra);
  });
}

json Gpus::ToJson() const {
  json j = InventoryJson(inventory);
  j["snapshot"] = snapshot;
  return j;
}

Result<Gpus> Gpus::FromJson(const json& j) {
  return FromTop<Gpus>(j, [](const json& j, const std::string& path, Gpus* out) {
    Reader r(j, path);
    ReadInventoryMembers(r, &out->inventory);
    r.Object("snapshot", &out->snapshot);
    return r.Finish(&out->inventory.extra);
  });
}

json HealthCheck::ToJson() const {
  json j = {{"gpus", Array(gpus, GpuHealthJson)}, {"inventory", InventoryJson(inventory)}};
  if (active) j["active"] = ActiveProbeJson(*active);
  return WithExtra(std::move(j), extra);
}

Result<HealthCheck> HealthCheck::FromJson(const json& j) {
  return FromTop<HealthCheck>(j, [](const json& j, const std::string& path, HealthCheck* out) {
    Reader r(j, path);
    r.List("gpus", &out->gpus, ReadGpuHealth);
    r.Nested("inventory", &out->inventory, ReadInventory);
    if (r.Has("active")) {
      ActiveProbe active;
      r.Nested("active", &active, ReadActiveProbe);
      out->active = std::move(active);
    }
    return r.Finish(&out->extra);
  });
}

}  // namespace tau::api
