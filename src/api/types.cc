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
  // `read(item_json, item_path, &item)` for each element.
  template <typename T, typename F>
  void List(const char* key, std::vector<T>* out, F read) {
    const json* v = Member(key);
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
  r.Str("backend", &out->backend);
  out->has_pending = r.Has("pending");
  if (const json* p = r.Member("pending", /*required=*/false); p != nullptr && !p->is_null()) {
    Pending pending;
    TAU_RETURN_IF_ERROR(
        ReadPending(*p, r.path().empty() ? "pending" : r.path() + ".pending", &pending));
    out->pending = std::move(pending);
  }
  if (const json* s = r.Member("spec", /*required=*/false)) out->spec = *s;
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
  r.List("admitted_runs", &out->admitted_runs, ReadAdmittedRun);
  r.List("pending_runs", &out->pending_runs, ReadPendingRun);
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
            {"backend", backend}};
  if (has_pending) j["pending"] = pending ? pending->ToJson() : json(nullptr);
  if (spec) j["spec"] = *spec;
  return WithExtra(std::move(j), extra);
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
  return WithExtra({{"name", name},
                    {"cohort", cohort},
                    {"queueing_strategy", queueing_strategy},
                    {"usage", Array(usage, UsageJson)},
                    {"admitted", admitted},
                    {"pending", pending},
                    {"admitted_runs", Array(admitted_runs, AdmittedRunJson)},
                    {"pending_runs", Array(pending_runs, PendingRunJson)}},
                   extra);
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

}  // namespace tau::api
