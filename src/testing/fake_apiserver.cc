#include "testing/fake_apiserver.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "kube/kube.h"
#include "kubeapi/kubeapi.h"

namespace tau::testutil {

using nlohmann::json;

// What a request's path names.
struct FakeApiServer::Target {
  std::string group_version;  // "v1", "batch/v1"
  std::string resource;       // "jobs"
  std::string collection;     // "batch/v1/jobs"
  std::string kind;           // "Job"
  std::string ns;
  std::string name;
  std::string subresource;  // "status", "log"
  bool namespaced = false;
};

// A LIST's or a watch's labelSelector and fieldSelector.
struct FakeApiServer::Selector {
  std::string collection;
  std::map<std::string, std::string> equal;  // label selector requirements
  std::map<std::string, std::string> not_equal;
  std::vector<std::string> exists;
  struct Field {
    std::string name;
    std::string value;
    bool negated;
  };
  std::vector<Field> fields;
  // False with the 400's message for a field selector the API server would refuse.
  bool Parse(const std::string& collection, const http::HttpRequest& req, std::string* error);
  bool Matches(const nlohmann::json& object) const;
};

struct FakeApiServer::WatchCursor {
  std::string collection;
  std::string ns;
  Selector selector;
  int64_t sent_rv = 0;
  int64_t deadline_ms = 0;
  bool bookmarks = false;
  int64_t next_bookmark_ms = 0;
  int expire_epoch = 0;
  int end_epoch = 0;
  std::string pending;  // lines decided under the lock, written outside it
  bool expired = false;
};

namespace {

json StatusBody(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

void Reply(http::HttpResponse& res, int code, const json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void Fail(http::HttpResponse& res, int code, const std::string& reason,
          const std::string& message) {
  Reply(res, code, StatusBody(code, reason, message));
}

std::string Key(const std::string& ns, const std::string& name) { return ns + "/" + name; }

// Parses /api/v1/... and /apis/G/V/...; false for anything else.
bool ParseTarget(const std::string& path, std::string* group_version,
                 std::vector<std::string>* rest) {
  std::vector<std::string> parts = Split(path, '/');
  if (parts.size() < 3 || !parts[0].empty()) return false;
  size_t start;
  if (parts[1] == "api") {
    *group_version = parts[2];
    start = 3;
  } else if (parts[1] == "apis" && parts.size() >= 4) {
    *group_version = parts[2] + "/" + parts[3];
    start = 4;
  } else {
    return false;
  }
  rest->assign(parts.begin() + static_cast<long>(start), parts.end());
  return !rest->empty();
}

void ParseSelector(const std::string& selector, std::map<std::string, std::string>* equal,
                   std::map<std::string, std::string>* not_equal,
                   std::vector<std::string>* exists) {
  for (std::string term : Split(selector, ',')) {
    term.erase(0, term.find_first_not_of(' '));
    while (!term.empty() && term.back() == ' ') term.pop_back();
    if (term.empty()) continue;
    if (size_t p = term.find("!="); p != std::string::npos) {
      (*not_equal)[term.substr(0, p)] = term.substr(p + 2);
    } else if (size_t p2 = term.find("=="); p2 != std::string::npos) {
      (*equal)[term.substr(0, p2)] = term.substr(p2 + 2);
    } else if (size_t p3 = term.find('='); p3 != std::string::npos) {
      (*equal)[term.substr(0, p3)] = term.substr(p3 + 1);
    } else {
      exists->push_back(term);
    }
  }
}

bool MatchesLabels(const json& object, const std::map<std::string, std::string>& equal,
                   const std::map<std::string, std::string>& not_equal,
                   const std::vector<std::string>& exists) {
  json labels = object.contains("metadata") ? object["metadata"].value("labels", json::object())
                                            : json::object();
  if (!labels.is_object()) labels = json::object();
  for (const auto& [k, v] : equal)
    if (!labels.contains(k) || labels[k] != v) return false;
  for (const auto& [k, v] : not_equal)
    if (labels.contains(k) && labels[k] == v) return false;
  for (const std::string& k : exists)
    if (!labels.contains(k)) return false;
  return true;
}

// A boolean query parameter as the API server reads it (Go's strconv.ParseBool): the Python
// client sends watch=True.
bool QueryBool(const std::string& value) {
  for (const char* yes : {"1", "t", "T", "true", "TRUE", "True"})
    if (value == yes) return true;
  return false;
}

json WithoutMetadataAndStatus(json object) {
  object.erase("metadata");
  object.erase("status");
  return object;
}

int64_t ParseVersion(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  return end != nullptr && *end == '\0' ? v : -1;
}

// ---- field selectors ----

// A field a selector may name beyond metadata.name and metadata.namespace: per collection, where
// it is in the object, and its value when absent (what the API server would have defaulted).
struct SelectableField {
  const char* collection;
  const char* field;
  const char* path;
  const char* absent;
};

constexpr SelectableField kSelectableFields[] = {
    {"v1/pods", "spec.nodeName", "spec.nodeName", ""},
    {"v1/pods", "spec.restartPolicy", "spec.restartPolicy", "Always"},
    {"v1/pods", "spec.schedulerName", "spec.schedulerName", "default-scheduler"},
    {"v1/pods", "spec.serviceAccountName", "spec.serviceAccountName", "default"},
    {"v1/pods", "spec.hostNetwork", "spec.hostNetwork", "false"},
    {"v1/pods", "status.phase", "status.phase", "Pending"},
    {"v1/pods", "status.podIP", "status.podIP", ""},
    {"v1/pods", "status.nominatedNodeName", "status.nominatedNodeName", ""},
    {"v1/events", "involvedObject.kind", "involvedObject.kind", ""},
    {"v1/events", "involvedObject.namespace", "involvedObject.namespace", ""},
    {"v1/events", "involvedObject.name", "involvedObject.name", ""},
    {"v1/events", "involvedObject.uid", "involvedObject.uid", ""},
    {"v1/events", "involvedObject.apiVersion", "involvedObject.apiVersion", ""},
    {"v1/events", "involvedObject.resourceVersion", "involvedObject.resourceVersion", ""},
    {"v1/events", "involvedObject.fieldPath", "involvedObject.fieldPath", ""},
    {"v1/events", "reason", "reason", ""},
    {"v1/events", "reportingComponent", "reportingComponent", ""},
    {"v1/events", "source", "source.component", ""},
    {"v1/events", "type", "type", ""},
    {"batch/v1/jobs", "status.successful", "status.succeeded", "0"},
    {"v1/nodes", "spec.unschedulable", "spec.unschedulable", "false"},
    {"v1/namespaces", "status.phase", "status.phase", ""},
    {"v1/secrets", "type", "type", ""},
};

// The kinds whose field selectors the API server converts itself (and so words an unknown field
// "field label not supported"); for the others it has the generic metadata-only answer.
bool HasFieldConversion(const std::string& collection) {
  for (const SelectableField& f : kSelectableFields)
    if (collection == f.collection) return true;
  return false;
}

std::string FieldText(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

// The value a field selector compares, or null when the collection has no such field.
std::optional<std::string> FieldValue(const std::string& collection, const json& object,
                                      const std::string& field) {
  const json metadata = object.value("metadata", json::object());
  if (field == "metadata.name") return metadata.value("name", "");
  if (field == "metadata.namespace") return metadata.value("namespace", "");
  for (const SelectableField& f : kSelectableFields) {
    if (collection != f.collection || field != f.field) continue;
    const json* node = &object;
    for (const std::string& key : Split(f.path, '.')) {
      if (!node->is_object() || !node->contains(key)) return std::string(f.absent);
      node = &(*node)[key];
    }
    return node->is_null() ? std::string(f.absent) : FieldText(*node);
  }
  return std::nullopt;
}

// ---- server-side apply's field sets ----

// A field's path from the object's top ("spec", "template", ...); lists are owned whole.
using FieldPath = std::vector<std::string>;
using FieldSet = std::set<FieldPath>;

void CollectLeaves(const json& value, FieldPath* prefix, FieldSet* out) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, child] : value.items()) {
      prefix->push_back(key);
      CollectLeaves(child, prefix, out);
      prefix->pop_back();
    }
  } else if (!prefix->empty()) {
    out->insert(*prefix);
  }
}

// The fields a write to the object (or its /status) sets, as managedFields counts them: identity
// and what the server sets are nobody's; the main resource never writes status, /status nothing
// else.
FieldSet WrittenFields(json object, const std::string& subresource) {
  object.erase("apiVersion");
  object.erase("kind");
  if (subresource == "status") {
    json only = json::object();
    if (object.contains("status")) only["status"] = object["status"];
    object = only;
  } else {
    object.erase("status");
  }
  if (object.contains("metadata") && object["metadata"].is_object()) {
    for (const char* field :
         {"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
          "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"})
      object["metadata"].erase(field);
    if (object["metadata"].empty()) object.erase("metadata");
  }
  FieldSet out;
  FieldPath prefix;
  CollectLeaves(object, &prefix, &out);
  return out;
}

// managedFields' fieldsV1: "f:KEY" maps, {} at a leaf. Real clients decode it (kubectl's
// server-side apply reads every entry's, and crashed on entries without one).
json ToFieldsV1(const FieldSet& fields) {
  json out = json::object();
  for (const FieldPath& path : fields) {
    json* node = &out;
    for (const std::string& key : path) node = &(*node)["f:" + key];
    if (node->is_null()) *node = json::object();
  }
  return out;
}

// "k:", "v:" and "i:" entries (list items, as the API server names them) own their list whole here.
void ReadFieldsV1(const json& node, FieldPath* prefix, FieldSet* out) {
  bool leaf = true;
  if (node.is_object())
    for (const auto& [key, child] : node.items()) {
      if (!StartsWith(key, "f:")) continue;
      leaf = false;
      prefix->push_back(key.substr(2));
      ReadFieldsV1(child, prefix, out);
      prefix->pop_back();
    }
  if (leaf && !prefix->empty()) out->insert(*prefix);
}

const json* At(const json& object, const FieldPath& path) {
  const json* node = &object;
  for (const std::string& key : path) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

void SetAt(json& object, const FieldPath& path, const json& value) {
  json* node = &object;
  for (const std::string& key : path) {
    if (!node->is_object()) *node = json::object();
    node = &(*node)[key];
  }
  // An empty map applied claims the map, not the removal of what others put in it.
  if (value.is_object() && value.empty() && node->is_object()) return;
  *node = value;
}

// Removes the field, then the maps it leaves empty (which only it kept there).
void EraseAt(json& object, const FieldPath& path) {
  for (size_t depth = path.size(); depth > 1 || (depth == 1 && path[0] != "metadata"); --depth) {
    json* parent = &object;
    for (size_t i = 0; i + 1 < depth && parent != nullptr; ++i) {
      auto it = parent->find(path[i]);
      parent = it == parent->end() || !it->is_object() ? nullptr : &*it;
    }
    if (parent == nullptr) return;
    auto it = parent->find(path[depth - 1]);
    if (it == parent->end()) return;
    if (depth < path.size() && !(it->is_object() && it->empty())) return;
    parent->erase(it);
    if (depth == 1) return;
  }
}

bool Overlap(const FieldPath& a, const FieldPath& b) {
  size_t n = std::min(a.size(), b.size());
  return std::equal(a.begin(), a.begin() + static_cast<long>(n), b.begin());
}

std::string PathText(const FieldPath& path) { return "." + Join(path, "."); }

// One managedFields entry.
struct Manager {
  std::string manager;
  std::string operation;  // "Apply", "Update"
  std::string api_version;
  std::string time;
  std::string subresource;
  FieldSet fields;
};

std::vector<Manager> ReadManagers(const json& object) {
  std::vector<Manager> out;
  const json metadata = object.value("metadata", json::object());
  const json entries =
      metadata.is_object() ? metadata.value("managedFields", json::array()) : json::array();
  if (!entries.is_array()) return out;
  for (const json& e : entries) {
    if (!e.is_object()) continue;
    Manager m{e.value("manager", ""), e.value("operation", ""),   e.value("apiVersion", ""),
              e.value("time", ""),    e.value("subresource", ""), {}};
    FieldPath prefix;
    if (e.contains("fieldsV1")) ReadFieldsV1(e["fieldsV1"], &prefix, &m.fields);
    out.push_back(std::move(m));
  }
  return out;
}

// Entries that own nothing are dropped, as the API server does.
json WriteManagers(const std::vector<Manager>& managers) {
  json out = json::array();
  for (const Manager& m : managers) {
    if (m.fields.empty()) continue;
    json e = {{"manager", m.manager},        {"operation", m.operation},
              {"apiVersion", m.api_version}, {"time", m.time},
              {"fieldsType", "FieldsV1"},    {"fieldsV1", ToFieldsV1(m.fields)}};
    if (!m.subresource.empty()) e["subresource"] = m.subresource;
    out.push_back(std::move(e));
  }
  return out;
}

// How a conflict names a manager, as the API server words it.
std::string ManagerText(const Manager& m) {
  std::string text = fmt::format("\"{}\"", m.manager);
  if (!m.subresource.empty()) text += fmt::format(" with subresource \"{}\"", m.subresource);
  text += " using " + m.api_version;
  if (m.operation == "Update" && !m.time.empty()) text += " at " + m.time;
  return text;
}

std::string NowText() { return FormatRfc3339(NowMillis() / 1000 * 1000); }

Manager* FindManager(std::vector<Manager>* managers, const std::string& manager,
                     const std::string& operation, const std::string& subresource) {
  for (Manager& m : *managers)
    if (m.manager == manager && m.operation == operation && m.subresource == subresource) return &m;
  return nullptr;
}

// A write that is no apply (POST, PUT, merge patch) by `manager`: it owns the fields it set or
// changed, taken from whoever owned them; fields that are gone are nobody's. `before` is null for a
// create.
void RecordUpdate(const json& before, json* after, const std::string& manager,
                  const std::string& subresource, const std::string& api_version) {
  std::vector<Manager> managers = ReadManagers(before.is_null() ? json::object() : before);
  FieldSet changed;
  for (const FieldPath& p : WrittenFields(*after, subresource)) {
    const json* old = before.is_null() ? nullptr : At(before, p);
    if (old == nullptr || *old != *At(*after, p)) changed.insert(p);
  }
  for (Manager& m : managers)
    for (auto it = m.fields.begin(); it != m.fields.end();) {
      bool lost = At(*after, *it) == nullptr;
      for (const FieldPath& p : changed) lost = lost || Overlap(p, *it);
      it = lost ? m.fields.erase(it) : std::next(it);
    }
  Manager* self = FindManager(&managers, manager, "Update", subresource);
  if (self == nullptr && !changed.empty()) {
    managers.push_back(Manager{manager, "Update", api_version, "", subresource, {}});
    self = &managers.back();
  }
  if (self != nullptr && !changed.empty()) {
    self->fields.insert(changed.begin(), changed.end());
    self->time = NowText();
    self->api_version = api_version;
  }
  (*after)["metadata"]["managedFields"] = WriteManagers(managers);
}

// Server-side apply of `patch` by `manager` onto `current` (null: a create). False with the 409's
// body in *conflict when another manager owns a field this apply changes and `force` is false.
bool ApplyFields(const json& current, const json& patch, const std::string& manager,
                 const std::string& subresource, const std::string& api_version, bool force,
                 json* out, json* conflict) {
  const json base = current.is_null() ? json::object() : current;
  std::vector<Manager> managers = ReadManagers(base);
  const FieldSet applied = WrittenFields(patch, subresource);
  auto is_self = [&](const Manager& m) {
    return m.manager == manager && m.operation == "Apply" && m.subresource == subresource;
  };
  // (manager index, the field it owns) for every field this apply would change under another.
  std::vector<std::pair<size_t, FieldPath>> conflicts;
  for (size_t i = 0; i < managers.size(); ++i) {
    if (is_self(managers[i])) continue;
    for (const FieldPath& owned : managers[i].fields)
      for (const FieldPath& p : applied) {
        if (!Overlap(owned, p)) continue;
        const json* have = At(base, p);
        if (have != nullptr && *have == *At(patch, p)) continue;  // the same value: shared
        conflicts.emplace_back(i, owned);
        break;
      }
  }
  if (!conflicts.empty() && !force) {
    std::map<std::string, std::vector<std::string>> by_manager;
    json causes = json::array();
    for (const auto& [i, path] : conflicts) {
      by_manager[ManagerText(managers[i])].push_back(PathText(path));
      causes.push_back({{"type", "FieldManagerConflict"},
                        {"message", "conflict with " + ManagerText(managers[i])},
                        {"field", PathText(path)}});
    }
    std::string detail;
    if (conflicts.size() == 1) {
      detail = fmt::format("conflict with {}: {}", ManagerText(managers[conflicts[0].first]),
                           PathText(conflicts[0].second));
    } else {
      std::vector<std::string> lines;
      for (const auto& [who, paths] : by_manager) {
        lines.push_back(fmt::format("conflicts with {}:", who));
        for (const std::string& p : paths) lines.push_back("- " + p);
      }
      detail = Join(lines, "\n");
    }
    *conflict = StatusBody(409, "Conflict",
                           fmt::format("Apply failed with {} conflict{}: {}", conflicts.size(),
                                       conflicts.size() == 1 ? "" : "s", detail));
    (*conflict)["details"] = {{"causes", causes}};
    return false;
  }
  // Forced: the conflicting fields are this manager's alone now.
  for (const auto& [i, path] : conflicts) managers[i].fields.erase(path);
  FieldSet before;
  if (Manager* self = FindManager(&managers, manager, "Apply", subresource); self != nullptr)
    before = self->fields;
  json object = base;
  for (const FieldPath& p : applied) SetAt(object, p, *At(patch, p));
  // What this manager applied before and no longer does goes, unless another manager owns it.
  for (const FieldPath& gone : before) {
    bool kept = false;
    for (const FieldPath& p : applied) kept = kept || Overlap(p, gone);
    for (const Manager& m : managers)
      if (!is_self(m))
        for (const FieldPath& q : m.fields) kept = kept || Overlap(q, gone);
    if (!kept) EraseAt(object, gone);
  }
  Manager* self = FindManager(&managers, manager, "Apply", subresource);
  if (self == nullptr) {
    managers.push_back(Manager{manager, "Apply", api_version, "", subresource, {}});
    self = &managers.back();
  }
  self->fields = applied;
  self->api_version = api_version;
  self->time = NowText();
  object["metadata"]["managedFields"] = WriteManagers(managers);
  *out = std::move(object);
  return true;
}

// ---- the rest ----

// The manager a write that is no apply records: fieldManager, else the client's User-Agent up to
// its first '/' (as the API server takes it), else "unknown".
std::string UpdateManager(const http::HttpRequest& req) {
  std::string manager = req.get_param_value("fieldManager");
  if (!manager.empty()) return manager;
  auto it = req.headers.find("user-agent");
  if (it != req.headers.end() && !it->second.empty()) {
    std::string prefix = it->second.substr(0, it->second.find('/'));
    if (!prefix.empty()) return prefix;
  }
  return "unknown";
}

// dryRun as the API server takes it: absent, or "All" (true). Anything else: false with the 422 in
// *error (the options' validation fails, `options_kind` naming them).
bool ParseDryRun(const std::vector<std::string>& values, const std::string& options_kind,
                 bool* dry_run, json* error) {
  *dry_run = false;
  for (const std::string& v : values) {
    if (v == "All") {
      *dry_run = true;
      continue;
    }
    std::vector<std::string> quoted;
    for (const std::string& each : values) quoted.push_back(fmt::format("\"{}\"", each));
    std::string cause = fmt::format("Unsupported value: []string{{{}}}: supported values: \"All\"",
                                    Join(quoted, ", "));
    *error =
        StatusBody(422, "Invalid",
                   fmt::format("{}.meta.k8s.io \"\" is invalid: dryRun: {}", options_kind, cause));
    (*error)["details"] = {
        {"group", "meta.k8s.io"},
        {"kind", options_kind},
        {"causes",
         json::array(
             {{{"reason", "FieldValueNotSupported"}, {"message", cause}, {"field", "dryRun"}}})}};
    return false;
  }
  return true;
}

// Whether a Job has finished (a Complete or Failed condition "True"); *at_ms is the condition's
// lastTransitionTime, or -1 without one.
bool JobFinished(const json& job, int64_t* at_ms) {
  *at_ms = -1;
  const json status = job.value("status", json::object());
  const json conditions =
      status.is_object() ? status.value("conditions", json::array()) : json::array();
  if (!conditions.is_array()) return false;
  for (const json& c : conditions) {
    if (!c.is_object() || c.value("status", "") != "True") continue;
    const std::string type = c.value("type", "");
    if (type != "Complete" && type != "Failed") continue;
    if (Result<int64_t> ms = ParseRfc3339(c.value("lastTransitionTime", "")); ms.ok()) *at_ms = *ms;
    return true;
  }
  return false;
}

bool HasFinalizer(const json& object, const std::string& finalizer) {
  const json list = object["metadata"].value("finalizers", json::array());
  if (list.is_array())
    for (const json& f : list)
      if (f == finalizer) return true;
  return false;
}

// ---- protobuf, as far as kubectl needs it ----

// kubectl's typed clients (`kubectl create namespace`) send built-in kinds as protobuf: the k8s
// envelope ("k8s\0", then runtime.Unknown) around the object. This reads that envelope and a
// Namespace's metadata (name, generateName, labels, annotations), nothing more.
class ProtoReader {
 public:
  explicit ProtoReader(std::string_view data) : data_(data) {}
  bool done() const { return pos_ >= data_.size(); }
  // The next field: its number, and for a length-delimited one its bytes. False at a malformed one.
  bool Next(uint64_t* field, std::string_view* bytes) {
    uint64_t tag = 0;
    if (!Varint(&tag)) return false;
    *field = tag >> 3;
    *bytes = {};
    uint64_t skip = 0;
    switch (tag & 7) {
      case 0:
        return Varint(&skip);
      case 1:
        skip = 8;
        break;
      case 5:
        skip = 4;
        break;
      case 2: {
        uint64_t length = 0;
        if (!Varint(&length) || length > data_.size() - pos_) return false;
        *bytes = data_.substr(pos_, length);
        skip = length;
        break;
      }
      default:
        return false;
    }
    if (skip > data_.size() - pos_) return false;
    pos_ += skip;
    return true;
  }

 private:
  bool Varint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64 && pos_ < data_.size(); shift += 7) {
      uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  std::string_view data_;
  size_t pos_ = 0;
};

// The string fields 1 and 2 of a message (a map entry's key and value, TypeMeta's apiVersion and
// kind); false when it is malformed.
bool ReadProtoFields12(std::string_view message, std::string* one, std::string* two) {
  ProtoReader r(message);
  while (!r.done()) {
    uint64_t field = 0;
    std::string_view bytes;
    if (!r.Next(&field, &bytes)) return false;
    if (field == 1) *one = bytes;
    if (field == 2) *two = bytes;
  }
  return true;
}

// A map<string,string> entry (key 1, value 2) into `out`.
bool ReadProtoMapEntry(std::string_view entry, json* out) {
  std::string key, value;
  if (!ReadProtoFields12(entry, &key, &value)) return false;
  (*out)[key] = value;
  return true;
}

// The JSON of a protobuf-encoded Namespace; null for anything else (or anything malformed).
json DecodeProtobufNamespace(std::string_view body) {
  if (body.substr(0, 4) != std::string_view("k8s\0", 4)) return nullptr;
  ProtoReader envelope(body.substr(4));
  std::string api_version, kind;
  std::string_view raw;
  while (!envelope.done()) {
    uint64_t field = 0;
    std::string_view bytes;
    if (!envelope.Next(&field, &bytes)) return nullptr;
    if (field == 2) raw = bytes;
    if (field == 1 && !ReadProtoFields12(bytes, &api_version, &kind)) return nullptr;
  }
  if (api_version != "v1" || kind != "Namespace") return nullptr;
  json metadata = json::object();
  ProtoReader object(raw);
  while (!object.done()) {
    uint64_t field = 0;
    std::string_view bytes;
    if (!object.Next(&field, &bytes)) return nullptr;
    if (field != 1) continue;  // spec and status: the server sets them
    ProtoReader meta(bytes);
    while (!meta.done()) {
      uint64_t f = 0;
      std::string_view b;
      if (!meta.Next(&f, &b)) return nullptr;
      if (f == 1) metadata["name"] = std::string(b);
      if (f == 2) metadata["generateName"] = std::string(b);
      if ((f == 11 && !ReadProtoMapEntry(b, &metadata["labels"])) ||
          (f == 12 && !ReadProtoMapEntry(b, &metadata["annotations"])))
        return nullptr;
    }
  }
  return {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", metadata}};
}

std::string GroupOf(const std::string& group_version) {
  size_t slash = group_version.find('/');
  return slash == std::string::npos ? "" : group_version.substr(0, slash);
}

// A 404 as the API server writes it, with details naming what was not found.
void NotFound(http::HttpResponse& res, const std::string& resource, const std::string& group,
              const std::string& name) {
  json body = StatusBody(
      404, "NotFound",
      fmt::format("{}{} \"{}\" not found", resource, group.empty() ? "" : "." + group, name));
  body["details"] = {{"name", name}, {"kind", resource}};
  if (!group.empty()) body["details"]["group"] = group;
  Reply(res, 404, body);
}

}  // namespace

bool FakeApiServer::Selector::Parse(const std::string& in, const http::HttpRequest& req,
                                    std::string* error) {
  collection = in;
  ParseSelector(req.get_param_value("labelSelector"), &equal, &not_equal, &exists);
  for (std::string term : Split(req.get_param_value("fieldSelector"), ',')) {
    term.erase(0, term.find_first_not_of(' '));
    while (!term.empty() && term.back() == ' ') term.pop_back();
    if (term.empty()) continue;
    Field field;
    size_t at = term.find("!=");
    size_t width = 2;
    field.negated = at != std::string::npos;
    if (at == std::string::npos) at = term.find("==");
    if (at == std::string::npos) {
      at = term.find('=');
      width = 1;
    }
    if (at == std::string::npos) {
      *error = fmt::format("invalid selector: '{}'; can't understand '{}'", term, term);
      return false;
    }
    field.name = term.substr(0, at);
    field.value = term.substr(at + width);
    if (!FieldValue(collection, json::object(), field.name)) {
      *error = HasFieldConversion(collection)
                   ? fmt::format("field label not supported: {}", field.name)
                   : fmt::format(
                         "\"{}\" is not a known field selector: only \"metadata.name\", "
                         "\"metadata.namespace\"",
                         field.name);
      return false;
    }
    fields.push_back(std::move(field));
  }
  return true;
}

bool FakeApiServer::Selector::Matches(const json& object) const {
  if (!MatchesLabels(object, equal, not_equal, exists)) return false;
  for (const Field& field : fields) {
    std::optional<std::string> value = FieldValue(collection, object, field.name);
    if (!value || (*value == field.value) == field.negated) return false;
  }
  return true;
}

namespace {
// What the fake serves: the kinds tau's client knows, and Events (for their field selectors).
const std::vector<kubeapi::ResourceInfo>& ServedResources() {
  static const std::vector<kubeapi::ResourceInfo> served = [] {
    std::vector<kubeapi::ResourceInfo> all = kubeapi::KnownResources();
    all.push_back({"v1", "Event", "events", true});
    return all;
  }();
  return served;
}

json NewNamespace(const std::string& name) {
  return {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}};
}

// What the API server sets on a namespace it creates.
void DefaultNamespace(json* ns) {
  (*ns)["metadata"]["labels"]["kubernetes.io/metadata.name"] = (*ns)["metadata"]["name"];
  (*ns)["spec"]["finalizers"] = json::array({"kubernetes"});
  (*ns)["status"] = {{"phase", "Active"}};
}
}  // namespace

FakeApiServer::FakeApiServer() {
  {
    // The namespaces every cluster starts with; resourceVersion 100 once they are there.
    MutexLock lock(&mu_);
    resource_version_ = 96;
    for (const char* name : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
      json ns = NewNamespace(name);
      ns["metadata"]["uid"] = fmt::format("00000000-0000-4000-8000-{:012d}", next_uid_++);
      ns["metadata"]["creationTimestamp"] = NowText();
      DefaultNamespace(&ns);
      Commit("v1/namespaces", "ADDED", std::move(ns));
    }
  }
  http_.set_max_body_bytes(16 << 20);
  for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE"})
    http_.Route(method, "/.*",
                [this](const http::HttpRequest& req, http::HttpResponse& res) { Handle(req, res); },
                {.max_body_bytes = 16 << 20});
}

FakeApiServer::~FakeApiServer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.SignalAll();
  http_.Shutdown(3000);
  if (serve_thread_.joinable()) serve_thread_.join();
  if (sweeper_.joinable()) sweeper_.join();
}

Status FakeApiServer::Start(const http::TlsServerConfig* tls) {
  TAU_RETURN_IF_ERROR(http_.ListenTcp("127.0.0.1", 0, tls));
  tls_ = tls != nullptr;
  port_ = http_.tcp_port();
  serve_thread_ = std::thread([this] { http_.Serve(); });
  sweeper_ = std::thread([this] { SweepFinishedJobs(); });
  return Status::Ok();
}

std::string FakeApiServer::url() const {
  return fmt::format("{}://127.0.0.1:{}", tls_ ? "https" : "http", port_);
}

void FakeApiServer::RequireToken(const std::string& token) {
  MutexLock lock(&mu_);
  required_token_ = token;
}

void FakeApiServer::InjectFailures(int count, int http_status, int retry_after_seconds) {
  MutexLock lock(&mu_);
  failures_left_ = count;
  failure_status_ = http_status;
  failure_retry_after_ = retry_after_seconds;
}

namespace {
// The names of a pod's containers and init containers.
std::vector<std::string> ContainerNames(const json& pod, const char* field) {
  std::vector<std::string> names;
  if (!pod.is_object() || !pod.contains("spec") || !pod["spec"].is_object()) return names;
  const json list = pod["spec"].value(field, json::array());
  if (list.is_array())
    for (const json& c : list)
      if (c.is_object()) names.push_back(c.value("name", ""));
  return names;
}
}  // namespace

std::string FakeApiServer::LogKey(const std::string& ns, const std::string& pod,
                                  const std::string& container) {
  std::string c = container;
  if (c.empty()) {
    // The pod's one container (the API server's default), when the pod says which.
    std::vector<std::string> names = ContainerNames(
        objects_["v1/pods"].count(Key(ns, pod)) ? objects_["v1/pods"][Key(ns, pod)] : json(),
        "containers");
    if (!names.empty()) c = names.front();
  }
  return Key(ns, pod) + "/" + c;
}

void FakeApiServer::AppendLog(const std::string& ns, const std::string& pod,
                              const std::string& text, const std::string& container) {
  {
    MutexLock lock(&mu_);
    logs_[LogKey(ns, pod, container)].chunks.emplace_back(NowMillis(), text);
  }
  changed_.SignalAll();
}

void FakeApiServer::EndLog(const std::string& ns, const std::string& pod,
                           const std::string& container) {
  {
    MutexLock lock(&mu_);
    logs_[LogKey(ns, pod, container)].ended = true;
  }
  changed_.SignalAll();
}

void FakeApiServer::CutLogStreams() {
  MutexLock lock(&mu_);
  ++log_cut_epoch_;
  changed_.SignalAll();
}

void FakeApiServer::ExpireWatches() {
  {
    MutexLock lock(&mu_);
    history_.clear();
    compacted_rv_ = resource_version_;
    ++expire_epoch_;
  }
  changed_.SignalAll();
}

void FakeApiServer::EndWatches() {
  {
    MutexLock lock(&mu_);
    ++end_epoch_;
  }
  changed_.SignalAll();
}

void FakeApiServer::PauseWatches(bool paused) {
  {
    MutexLock lock(&mu_);
    watches_paused_ = paused;
  }
  changed_.SignalAll();
}

void FakeApiServer::PauseWatchesOf(const std::string& collection, bool paused) {
  {
    MutexLock lock(&mu_);
    if (paused) {
      paused_collections_.insert(collection);
    } else {
      paused_collections_.erase(collection);
    }
  }
  changed_.SignalAll();
}

void FakeApiServer::FailLists(const std::string& collection, int http_status) {
  MutexLock lock(&mu_);
  if (http_status == 0) {
    failing_lists_.erase(collection);
  } else {
    failing_lists_[collection] = http_status;
  }
}

void FakeApiServer::StallWatches(bool stalled) {
  {
    MutexLock lock(&mu_);
    watches_stalled_ = stalled;
  }
  changed_.SignalAll();
}

void FakeApiServer::HoldWrites(const std::string& ns, bool held) {
  {
    MutexLock lock(&mu_);
    if (held) {
      held_namespaces_.insert(ns);
    } else {
      held_namespaces_.erase(ns);
    }
  }
  changed_.SignalAll();
}

void FakeApiServer::SetSchemas(std::shared_ptr<const kube::SchemaSet> schemas) {
  MutexLock lock(&mu_);
  schemas_ = std::move(schemas);
}

Status FakeApiServer::LoadCrds(const std::string& dir) {
  auto set = std::make_shared<kube::SchemaSet>();
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  if (ec) return InvalidArgument(fmt::format("{}: {}", dir, ec.message()));
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    TAU_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
    Result<std::vector<json>> docs = kube::ParseYaml(text);
    if (!docs.ok()) return InvalidArgument(fmt::format("{}: {}", file, docs.status().message()));
    for (const json& doc : *docs)
      if (doc.is_object() && doc.value("kind", "") == "CustomResourceDefinition")
        if (Status s = set->AddCrd(doc); !s.ok())
          return InvalidArgument(fmt::format("{}: {}", file, s.message()));
  }
  SetSchemas(std::move(set));
  return Status::Ok();
}

bool FakeApiServer::SchemaValid(const Target& target, const json& object,
                                http::HttpResponse& res) const {
  // Custom resources only: built-in kinds are the API server's own code, not a schema here.
  const std::string group = GroupOf(target.group_version);
  if (schemas_ == nullptr || group.find('.') == std::string::npos ||
      (EndsWith(group, "k8s.io") && !EndsWith(group, ".x-k8s.io")) || !schemas_->Knows(object))
    return true;
  // The validator knows the metadata a client sets; what the server set is checked by nobody.
  json checked = object;
  for (const char* field : {"uid", "resourceVersion", "generation", "creationTimestamp",
                            "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"})
    checked["metadata"].erase(field);
  Status valid = schemas_->Validate(checked);
  if (valid.ok()) return true;
  // Each line: "Kind/name: path: what is wrong".
  const std::string name = object["metadata"].value("name", "");
  json causes = json::array();
  std::vector<std::string> errors;
  for (std::string line : Split(valid.message(), '\n')) {
    if (size_t p = line.find(": ");
        p != std::string::npos && line.compare(0, p, target.kind + "/" + name) == 0)
      line = line.substr(p + 2);
    size_t p = line.find(": ");
    std::string field = p == std::string::npos ? "" : line.substr(0, p);
    std::string message = p == std::string::npos ? line : line.substr(p + 2);
    causes.push_back({{"reason", "FieldValueInvalid"}, {"message", message}, {"field", field}});
    errors.push_back(line);
  }
  json body =
      StatusBody(422, "Invalid",
                 fmt::format("{}.{} \"{}\" is invalid: {}", target.kind, group, name,
                             errors.size() == 1 ? errors[0] : "[" + Join(errors, ", ") + "]"));
  body["details"] = {{"name", name}, {"group", group}, {"kind", target.kind}, {"causes", causes}};
  Reply(res, 422, body);
  return false;
}

void FakeApiServer::set_bookmark_interval_ms(int ms) {
  MutexLock lock(&mu_);
  bookmark_interval_ms_ = ms;
}

void FakeApiServer::set_history_limit(size_t events) {
  MutexLock lock(&mu_);
  history_limit_ = events;
}

void FakeApiServer::Grant(const std::string& user, const std::string& verb,
                          const std::string& group, const std::string& resource,
                          const std::string& ns) {
  MutexLock lock(&mu_);
  grants_.insert(fmt::format("{}|{}|{}|{}|{}", user, verb, group, resource, ns));
}

std::vector<FakeApiServer::RequestRecord> FakeApiServer::Requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

void FakeApiServer::ClearRequests() {
  MutexLock lock(&mu_);
  requests_.clear();
}

int64_t FakeApiServer::resource_version() const {
  MutexLock lock(&mu_);
  return resource_version_;
}

json FakeApiServer::Object(const std::string& collection, const std::string& ns,
                           const std::string& name) const {
  MutexLock lock(&mu_);
  auto c = objects_.find(collection);
  if (c == objects_.end()) return nullptr;
  auto o = c->second.find(Key(ns, name));
  return o == c->second.end() ? json(nullptr) : o->second;
}

size_t FakeApiServer::ObjectCount(const std::string& collection) const {
  MutexLock lock(&mu_);
  auto c = objects_.find(collection);
  return c == objects_.end() ? 0 : c->second.size();
}

json FakeApiServer::Commit(const std::string& collection, const std::string& type, json object,
                           bool dry_run) {
  const std::string ns = object["metadata"].value("namespace", "");
  const std::string key = Key(ns, object["metadata"].value("name", ""));
  if (dry_run) {
    // Nothing stored, no resourceVersion spent: a create has none yet, an update keeps its own.
    if (type == "ADDED") object["metadata"].erase("resourceVersion");
    return object;
  }
  ++resource_version_;
  // A deleted object's last state carries the deletion's resourceVersion too, as in the API.
  object["metadata"]["resourceVersion"] = std::to_string(resource_version_);
  auto& objects = objects_[collection];
  json previous;
  if (auto it = objects.find(key); it != objects.end() && type == "MODIFIED") previous = it->second;
  if (type == "DELETED") {
    objects.erase(key);
  } else {
    objects[key] = object;
  }
  if (collection == "batch/v1/jobs") {
    const std::string uid = object["metadata"].value("uid", "");
    int64_t at_ms = 0;
    if (type == "DELETED" || !JobFinished(object, &at_ms))
      finished_seen_ms_.erase(uid);
    else
      finished_seen_ms_.emplace(uid, NowMillis());
  }
  history_.push_back(Event{resource_version_, collection, ns, type, object, previous});
  while (history_.size() > history_limit_) {
    compacted_rv_ = history_.front().resource_version;
    history_.pop_front();
  }
  changed_.SignalAll();
  return object;
}

bool FakeApiServer::NamespaceExists(const std::string& ns) const {
  auto c = objects_.find("v1/namespaces");
  return c != objects_.end() && c->second.count(Key("", ns)) > 0;
}

bool FakeApiServer::UidExists(const std::string& uid) const {
  for (const auto& [collection, objects] : objects_)
    for (const auto& [key, object] : objects)
      if (object["metadata"].value("uid", "") == uid) return true;
  return false;
}

std::vector<std::pair<std::string, std::string>> FakeApiServer::Dependents(
    const std::string& uid) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [collection, objects] : objects_)
    for (const auto& [key, object] : objects) {
      const json refs = object["metadata"].value("ownerReferences", json::array());
      if (!refs.is_array()) continue;
      for (const json& ref : refs)
        if (ref.is_object() && ref.value("uid", "") == uid) {
          out.emplace_back(collection, key);
          break;
        }
    }
  return out;
}

json FakeApiServer::DeleteLocked(const std::string& collection, const std::string& key,
                                 std::string policy, std::set<std::string>* deleting) {
  auto found = objects_[collection].find(key);
  if (found == objects_[collection].end()) return nullptr;
  json object = found->second;
  const std::string uid = object["metadata"].value("uid", "");
  if (!deleting->insert(uid).second) return object;  // on its way already (a cycle of owners)
  if (object["metadata"].value("deletionTimestamp", "").empty())
    object["metadata"]["deletionTimestamp"] = NowText();
  if (collection == "v1/namespaces") {
    // The namespace controller: Terminating, then what is in it goes, then the namespace.
    object["status"]["phase"] = "Terminating";
    json answer = Commit(collection, "MODIFIED", object);
    const std::string ns = object["metadata"].value("name", "");
    std::vector<std::pair<std::string, std::string>> inside;
    for (const auto& [c, objects] : objects_)
      for (const auto& [k, o] : objects)
        if (o["metadata"].value("namespace", "") == ns) inside.emplace_back(c, k);
    for (const auto& [c, k] : inside) DeleteLocked(c, k, "Background", deleting);
    json last = objects_[collection][key];
    last["spec"]["finalizers"] = json::array();
    Commit(collection, "DELETED", last);
    return answer;
  }
  if (policy.empty()) {
    // The object's own finalizers say, else the resource's default: batch/v1 Jobs orphan their
    // pods (kept so for compatibility), the rest are deleted in the background.
    if (HasFinalizer(object, "orphan"))
      policy = "Orphan";
    else if (HasFinalizer(object, "foregroundDeletion"))
      policy = "Foreground";
    else
      policy = collection == "batch/v1/jobs" ? "Orphan" : "Background";
  }
  if (policy == "Background") {
    json answer = Commit(collection, "DELETED", object);
    for (const auto& [c, k] : Dependents(uid)) {
      if (!objects_[c].count(k)) continue;
      if (HasOtherOwner(objects_[c][k], uid, *deleting))
        DropOwnerReference(c, k, uid);
      else
        CollectDependent(c, k, false, deleting);
    }
    return answer;
  }
  // Foreground and Orphan: the owner stays, marked with the garbage collector's finalizer, until
  // its dependents are gone or orphaned; then the finalizer goes and so does the owner.
  const std::string finalizer = policy == "Orphan" ? "orphan" : "foregroundDeletion";
  json finalizers = object["metadata"].value("finalizers", json::array());
  if (!HasFinalizer(object, finalizer)) finalizers.push_back(finalizer);
  object["metadata"]["finalizers"] = finalizers;
  json answer = Commit(collection, "MODIFIED", object);
  for (const auto& [c, k] : Dependents(uid)) {
    if (!objects_[c].count(k)) continue;
    if (policy == "Orphan" || HasOtherOwner(objects_[c][k], uid, *deleting))
      DropOwnerReference(c, k, uid);
    else
      CollectDependent(c, k, true, deleting);
  }
  json last = objects_[collection][key];
  json left = json::array();
  for (const json& f : last["metadata"].value("finalizers", json::array()))
    if (f != finalizer) left.push_back(f);
  if (left.empty())
    last["metadata"].erase("finalizers");
  else
    last["metadata"]["finalizers"] = left;
  Commit(collection, "DELETED", last);
  return answer;
}

bool FakeApiServer::HasOtherOwner(const json& dependent, const std::string& uid,
                                  const std::set<std::string>& deleting) const {
  for (const json& ref : dependent["metadata"].value("ownerReferences", json::array())) {
    const std::string other = ref.is_object() ? ref.value("uid", "") : "";
    if (other != uid && !deleting.count(other) && UidExists(other)) return true;
  }
  return false;
}

void FakeApiServer::DropOwnerReference(const std::string& collection, const std::string& key,
                                       const std::string& uid) {
  json dependent = objects_[collection][key];
  json kept = json::array();
  for (const json& ref : dependent["metadata"].value("ownerReferences", json::array()))
    if (!ref.is_object() || ref.value("uid", "") != uid) kept.push_back(ref);
  if (kept.empty())
    dependent["metadata"].erase("ownerReferences");
  else
    dependent["metadata"]["ownerReferences"] = kept;
  Commit(collection, "MODIFIED", dependent);
}

void FakeApiServer::CollectDependent(const std::string& collection, const std::string& key,
                                     bool foreground, std::set<std::string>* deleting) {
  // The garbage collector deletes with the dependent's finalizers' policy, else Background; in
  // a foreground deletion, one with dependents of its own goes in the foreground too.
  const json& dependent = objects_[collection][key];
  std::string policy = "Background";
  if (HasFinalizer(dependent, "orphan"))
    policy = "Orphan";
  else if (HasFinalizer(dependent, "foregroundDeletion") ||
           (foreground && !Dependents(dependent["metadata"].value("uid", "")).empty()))
    policy = "Foreground";
  DeleteLocked(collection, key, policy, deleting);
}

void FakeApiServer::SweepFinishedJobs() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    const int64_t now = NowMillis();
    int64_t next = now + 1000;
    std::vector<std::string> due;
    for (const auto& [key, job] : objects_["batch/v1/jobs"]) {
      const json spec = job.value("spec", json::object());
      if (!spec.is_object() || !spec.contains("ttlSecondsAfterFinished") ||
          !spec["ttlSecondsAfterFinished"].is_number_integer())
        continue;
      if (!job["metadata"].value("deletionTimestamp", "").empty()) continue;
      int64_t finished_ms = 0;
      if (!JobFinished(job, &finished_ms)) continue;
      if (finished_ms < 0) {
        auto seen = finished_seen_ms_.find(job["metadata"].value("uid", ""));
        if (seen == finished_seen_ms_.end()) continue;
        finished_ms = seen->second;
      }
      const int64_t due_ms = finished_ms + spec["ttlSecondsAfterFinished"].get<int64_t>() * 1000;
      if (due_ms <= now)
        due.push_back(key);
      else
        next = std::min(next, due_ms);
    }
    // As the TTL controller deletes: Foreground, so the Job goes after its pods.
    for (const std::string& key : due) {
      std::set<std::string> deleting;
      DeleteLocked("batch/v1/jobs", key, "Foreground", &deleting);
    }
    if (!due.empty()) continue;
    changed_.WaitFor(&mu_, std::chrono::milliseconds(std::clamp<int64_t>(next - now, 10, 1000)));
  }
}

void FakeApiServer::Handle(const http::HttpRequest& req, http::HttpResponse& res) {
  // Test control, not an API-server path: POST /fake/logs/NAMESPACE/POD appends the body to the
  // pod's log (AppendLog), and ?end=true then ends it (EndLog); POST /fake/cut-logs cuts the open
  // log streams (CutLogStreams); POST /fake/inject-failures?count=N&status=S answers the next N
  // API requests S (InjectFailures). So a test in another process (tests/fake_apiserver) can play
  // the kubelet's logs. Neither recorded nor subject to the token or to injected failures.
  if (StartsWith(req.path, "/fake/")) {
    if (req.method == "POST" && req.path == "/fake/cut-logs") {
      CutLogStreams();
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/proxy") {
      SetProxied(req.get_param_value("namespace"), req.get_param_value("service"),
                 req.get_param_value("path"), req.body);
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/expire-watches") {
      ExpireWatches();
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/inject-failures") {
      InjectFailures(std::atoi(req.get_param_value("count").c_str()),
                     std::atoi(req.get_param_value("status").c_str()), 0);
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    if (req.method == "POST" && req.path == "/fake/hold-writes") {
      HoldWrites(req.get_param_value("namespace"), req.get_param_value("held") != "false");
      Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
      return;
    }
    std::vector<std::string> parts = Split(req.path.substr(1), '/');
    if (req.method != "POST" || parts.size() != 4 || parts[1] != "logs" || parts[2].empty() ||
        parts[3].empty()) {
      Fail(res, 404, "NotFound", "unknown test control");
      return;
    }
    const std::string container = req.get_param_value("container");
    if (!req.body.empty()) AppendLog(parts[2], parts[3], req.body, container);
    if (req.get_param_value("end") == "true") EndLog(parts[2], parts[3], container);
    Reply(res, 200, json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
    return;
  }
  Target target;
  {
    MutexLock lock(&mu_);
    auto header = [&](const char* name) {
      auto it = req.headers.find(name);
      return it == req.headers.end() ? std::string() : it->second;
    };
    requests_.push_back(RequestRecord{req.method, req.path, req.params, header("content-type"),
                                      header("authorization")});
    if (!required_token_.empty() && header("authorization") != "Bearer " + required_token_) {
      Fail(res, 401, "Unauthorized", "Unauthorized");
      return;
    }
    if (failures_left_ > 0) {
      --failures_left_;
      json body =
          StatusBody(failure_status_, failure_status_ == 429 ? "TooManyRequests" : "InternalError",
                     fmt::format("injected failure {}", failure_status_));
      if (failure_retry_after_ > 0) body["details"] = {{"retryAfterSeconds", failure_retry_after_}};
      Reply(res, failure_status_, body);
      if (failure_retry_after_ > 0)
        res.headers_out.emplace_back("Retry-After", std::to_string(failure_retry_after_));
      return;
    }
  }
  if (HandleDiscovery(req, res)) return;
  std::vector<std::string> rest;
  if (!ParseTarget(req.path, &target.group_version, &rest)) {
    Fail(res, 404, "NotFound", fmt::format("the server could not find the requested resource"));
    return;
  }
  if (target.group_version == "v1" && rest.size() >= 5 && rest[0] == "namespaces" &&
      rest[2] == "services" && rest[4] == "proxy") {
    HandleServiceProxy(req, rest, res);
    return;
  }
  // [namespaces NS] RESOURCE [NAME [SUBRESOURCE]]; /api/v1/namespaces[/NAME] is the Namespace
  // kind itself.
  size_t i = 0;
  if (rest[0] == "namespaces" && rest.size() >= 3) {
    target.ns = rest[1];
    i = 2;
  }
  target.resource = rest[i];
  if (i + 1 < rest.size()) target.name = rest[i + 1];
  if (i + 2 < rest.size()) target.subresource = rest[i + 2];
  if (i + 3 < rest.size()) {
    Fail(res, 404, "NotFound", "the server could not find the requested resource");
    return;
  }
  target.collection = target.group_version + "/" + target.resource;
  bool known = false;
  for (const kubeapi::ResourceInfo& info : ServedResources()) {
    if (info.api_version != target.group_version || info.resource != target.resource) continue;
    target.kind = info.kind;
    known = true;
    target.namespaced = info.namespaced;
    if (!info.namespaced) target.ns.clear();
  }
  if (!known) {
    Fail(res, 404, "NotFound",
         fmt::format("the server could not find the requested resource ({})", target.collection));
    return;
  }
  if (req.method != "GET") {
    // A held namespace's writes wait (as behind a webhook that does not answer) until released.
    MutexLock lock(&mu_);
    while (!stopping_ && held_namespaces_.count(target.ns))
      changed_.WaitFor(&mu_, std::chrono::milliseconds(50));
  }
  if (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") {
    // dryRun is validated with the request's options, before anything else.
    bool dry_run = false;
    json error;
    std::string value = req.get_param_value("dryRun");
    const char* options = req.method == "POST"  ? "CreateOptions"
                          : req.method == "PUT" ? "UpdateOptions"
                                                : "PatchOptions";
    if (!ParseDryRun(value.empty() ? std::vector<std::string>{} : std::vector<std::string>{value},
                     options, &dry_run, &error)) {
      Reply(res, 422, error);
      return;
    }
  }
  auto content_type = req.headers.find("content-type");
  if (content_type != req.headers.end() &&
      StartsWith(content_type->second, "application/vnd.kubernetes.protobuf")) {
    json decoded = req.method == "POST" && target.collection == "v1/namespaces"
                       ? DecodeProtobufNamespace(req.body)
                       : json();
    if (decoded.is_null()) {
      Fail(res, 415, "UnsupportedMediaType",
           "the stand-in reads protobuf bodies of Namespaces only; send JSON");
      return;
    }
    http::HttpRequest as_json = req;
    as_json.body = decoded.dump();
    as_json.headers["content-type"] = "application/json";
    HandleCreate(target, as_json, res);
    return;
  }
  try {
    if (target.collection == "authorization.k8s.io/v1/subjectaccessreviews" && req.method == "POST")
      HandleAccessReview(req, res);
    else if (req.method == "GET" && target.subresource == "log" && target.resource == "pods")
      HandleLog(target, req, res);
    else if (req.method == "GET" && target.name.empty() && QueryBool(req.get_param_value("watch")))
      HandleWatch(target, req, res);
    else if (req.method == "GET" && target.name.empty())
      HandleList(target, req, res);
    else if (req.method == "GET")
      HandleGet(target, req, res);
    else if (req.method == "POST" && target.name.empty())
      HandleCreate(target, req, res);
    else if (req.method == "PUT" && !target.name.empty())
      HandleReplace(target, req, res);
    else if (req.method == "PATCH" && !target.name.empty())
      HandlePatch(target, req, res);
    else if (req.method == "DELETE" && !target.name.empty())
      HandleDelete(target, req, res);
    else
      Fail(res, 405, "MethodNotAllowed", fmt::format("{} is not supported here", req.method));
  } catch (const json::exception& e) {
    Fail(res, 400, "BadRequest", fmt::format("cannot handle the body: {}", e.what()));
  }
}

void FakeApiServer::HandleGet(const Target& target, const http::HttpRequest& req,
                              http::HttpResponse& res) {
  json object = Object(target.collection, target.ns, target.name);
  if (object.is_null()) {
    NotFound(res, target.resource, GroupOf(target.group_version), target.name);
    return;
  }
  Reply(res, 200, object);
}

void FakeApiServer::HandleList(const Target& target, const http::HttpRequest& req,
                               http::HttpResponse& res) {
  {
    MutexLock lock(&mu_);
    if (auto failing = failing_lists_.find(target.collection); failing != failing_lists_.end()) {
      Fail(res, failing->second, "InternalError",
           fmt::format("injected failure {}", failing->second));
      return;
    }
  }
  Selector selector;
  if (std::string error; !selector.Parse(target.collection, req, &error)) {
    Fail(res, 400, "BadRequest", error);
    return;
  }
  int64_t limit = ParseVersion(req.get_param_value("limit"));
  std::string after;
  if (std::string token = req.get_param_value("continue"); !token.empty()) {
    Result<std::string> decoded = Base64Decode(token);
    if (!decoded.ok()) {
      Fail(res, 400, "BadRequest", "invalid continue token");
      return;
    }
    after = *decoded;
  }
  json items = json::array();
  std::string continue_token;
  std::string last_key;
  MutexLock lock(&mu_);
  const auto& objects = objects_[target.collection];
  for (auto it = after.empty() ? objects.begin() : objects.upper_bound(after); it != objects.end();
       ++it) {
    const std::string& ns = it->second["metadata"].value("namespace", "");
    if (!target.ns.empty() && ns != target.ns) continue;
    if (!selector.Matches(it->second)) continue;
    if (limit > 0 && static_cast<int64_t>(items.size()) == limit) {
      continue_token = Base64Encode(last_key);
      break;
    }
    json item = it->second;
    // Items of a List carry no apiVersion and kind in the API's JSON (the List has them).
    item.erase("apiVersion");
    item.erase("kind");
    items.push_back(std::move(item));
    last_key = it->first;
  }
  json metadata = {{"resourceVersion", std::to_string(resource_version_)}};
  if (!continue_token.empty()) metadata["continue"] = continue_token;
  Reply(res, 200,
        {{"kind", target.kind + "List"},
         {"apiVersion", target.group_version},
         {"metadata", metadata},
         {"items", items}});
}

void FakeApiServer::HandleWatch(const Target& target, const http::HttpRequest& req,
                                http::HttpResponse& res) {
  auto cursor = std::make_shared<WatchCursor>();
  cursor->collection = target.collection;
  cursor->ns = target.ns;
  if (std::string error; !cursor->selector.Parse(target.collection, req, &error)) {
    Fail(res, 400, "BadRequest", error);
    return;
  }
  int64_t timeout_s = ParseVersion(req.get_param_value("timeoutSeconds"));
  cursor->deadline_ms = MonotonicMillis() + (timeout_s > 0 ? timeout_s : 1800) * 1000;
  cursor->bookmarks = QueryBool(req.get_param_value("allowWatchBookmarks"));
  int64_t from = ParseVersion(req.get_param_value("resourceVersion"));
  {
    MutexLock lock(&mu_);
    cursor->expire_epoch = expire_epoch_;
    cursor->end_epoch = end_epoch_;
    cursor->next_bookmark_ms = MonotonicMillis() + bookmark_interval_ms_;
    if (from < 0) {
      Fail(res, 400, "BadRequest", "invalid resourceVersion");
      return;
    }
    if (from == 0) {
      // "Start at the most recent": synthetic ADDED events for what exists.
      for (const auto& [key, object] : objects_[target.collection]) {
        if (!target.ns.empty() && object["metadata"].value("namespace", "") != target.ns) continue;
        if (!cursor->selector.Matches(object)) continue;
        cursor->pending += json{{"type", "ADDED"}, {"object", object}}.dump() + "\n";
      }
      cursor->sent_rv = resource_version_;
    } else if (from < compacted_rv_) {
      cursor->expired = true;
    } else {
      cursor->sent_rv = from;
    }
  }
  res.status = 200;
  res.content_type = "application/json";
  res.stream = [this, cursor](http::ChunkSink& sink) { return StreamWatch(cursor.get(), sink); };
}

bool FakeApiServer::StreamWatch(WatchCursor* cursor, http::ChunkSink& sink) {
  bool end = false;
  std::string out;
  {
    MutexLock lock(&mu_);
    if (cursor->pending.empty() && !cursor->expired)
      changed_.WaitFor(&mu_, std::chrono::milliseconds(20));
    if (stopping_) return false;
    out = std::move(cursor->pending);
    cursor->pending.clear();
    int64_t now = MonotonicMillis();
    if (cursor->expired || cursor->expire_epoch != expire_epoch_) {
      json error = StatusBody(410, "Expired", "too old resource version");
      out += json{{"type", "ERROR"}, {"object", error}}.dump() + "\n";
      end = true;
    } else if (watches_stalled_) {
      // Held open without a word, past its timeout (a stalled connection or proxy).
    } else if (cursor->end_epoch != end_epoch_ || now >= cursor->deadline_ms) {
      end = true;
    } else if (!watches_paused_ && !paused_collections_.count(cursor->collection)) {
      for (const Event& event : history_) {
        if (event.resource_version <= cursor->sent_rv || event.collection != cursor->collection)
          continue;
        if (!cursor->ns.empty() && event.ns != cursor->ns) continue;
        // As the watch cache: an object that leaves the selection is DELETED for this watch, one
        // that enters it ADDED.
        bool selected = cursor->selector.Matches(event.object);
        bool was = event.type == "MODIFIED" && !event.previous.is_null() &&
                   cursor->selector.Matches(event.previous);
        std::string type = event.type;
        if (event.type == "MODIFIED" && selected != was) type = selected ? "ADDED" : "DELETED";
        if (!selected && !was) continue;
        out += json{{"type", type}, {"object", event.object}}.dump() + "\n";
      }
      cursor->sent_rv = resource_version_;
      if (cursor->bookmarks && now >= cursor->next_bookmark_ms) {
        // Every event up to sent_rv has been written, so the bookmark may claim it.
        std::string group_version =
            Split(cursor->collection, '/').size() == 3
                ? cursor->collection.substr(0, cursor->collection.rfind('/'))
                : cursor->collection.substr(0, cursor->collection.find('/'));
        json bookmark = {{"kind", "Bookmark"},
                         {"apiVersion", group_version},
                         {"metadata", {{"resourceVersion", std::to_string(cursor->sent_rv)}}}};
        out += json{{"type", "BOOKMARK"}, {"object", bookmark}}.dump() + "\n";
        cursor->next_bookmark_ms = now + bookmark_interval_ms_;
      }
    }
  }
  if (!out.empty() && !sink.Write(out)) return false;
  return !end;
}

bool FakeApiServer::ContainerExited(const std::string& pod_key, const std::string& container) {
  auto pods = objects_.find("v1/pods");
  if (pods == objects_.end()) return true;
  auto it = pods->second.find(pod_key);
  if (it == pods->second.end()) return true;
  const json& status = it->second.contains("status") ? it->second["status"] : json();
  if (!status.is_object()) return false;
  const std::string phase = status.value("phase", "");
  if (phase == "Succeeded" || phase == "Failed") return true;
  for (const char* field : {"containerStatuses", "initContainerStatuses"}) {
    auto statuses = status.find(field);
    if (statuses == status.end() || !statuses->is_array()) continue;
    for (const json& cs : *statuses)
      if (cs.is_object() && cs.value("name", "") == container && cs.contains("state") &&
          cs["state"].is_object() && cs["state"].contains("terminated"))
        return true;
  }
  return false;
}

void FakeApiServer::HandleLog(const Target& target, const http::HttpRequest& req,
                              http::HttpResponse& res) {
  const json pod = Object(target.collection, target.ns, target.name);
  if (pod.is_null()) {
    Fail(res, 404, "NotFound", fmt::format("pods \"{}\" not found", target.name));
    return;
  }
  // As the API server: the container must be named when the pod has several, must be one of the
  // pod's (or its init containers), and must have started.
  std::string container = req.get_param_value("container");
  std::vector<std::string> containers = ContainerNames(pod, "containers");
  std::vector<std::string> inits = ContainerNames(pod, "initContainers");
  if (container.empty() && containers.size() > 1) {
    Fail(res, 400, "BadRequest",
         fmt::format("a container name must be specified for pod {}, choose one of: [{}]",
                     target.name, Join(containers, " ")));
    return;
  }
  if (container.empty() && !containers.empty()) container = containers.front();
  if (!container.empty() && !(containers.empty() && inits.empty()) &&
      std::find(containers.begin(), containers.end(), container) == containers.end() &&
      std::find(inits.begin(), inits.end(), container) == inits.end()) {
    Fail(res, 400, "BadRequest",
         fmt::format("container {} is not valid for pod {}", container, target.name));
    return;
  }
  const json status = pod.value("status", json::object());
  for (const char* field : {"containerStatuses", "initContainerStatuses"}) {
    const json statuses = status.is_object() ? status.value(field, json::array()) : json::array();
    if (!statuses.is_array()) continue;
    for (const json& cs : statuses) {
      if (!cs.is_object() || cs.value("name", "") != container) continue;
      const json state = cs.value("state", json::object());
      if (state.is_object() && state.contains("waiting")) {
        const json waiting = state["waiting"];
        Fail(res, 400, "BadRequest",
             fmt::format("container \"{}\" in pod \"{}\" is waiting to start: {}", container,
                         target.name,
                         waiting.is_object() ? waiting.value("reason", "") : std::string()));
        return;
      }
    }
  }
  int64_t since_ms = 0;
  if (std::string since = req.get_param_value("sinceTime"); !since.empty()) {
    Result<int64_t> ms = ParseRfc3339(since);
    if (!ms.ok()) {
      Fail(res, 400, "BadRequest", ms.status().message());
      return;
    }
    since_ms = *ms;
  }
  std::string key = Key(target.ns, target.name) + "/" + container;
  if (req.get_param_value("follow") != "true") {
    MutexLock lock(&mu_);
    std::string text;
    for (const auto& [ms, chunk] : logs_[key].chunks)
      if (ms >= since_ms) text += chunk;
    res.set_content(text, "text/plain");
    return;
  }
  auto next = std::make_shared<size_t>(0);
  int cut_epoch = 0;
  {
    MutexLock lock(&mu_);
    cut_epoch = log_cut_epoch_;
  }
  res.content_type = "text/plain";
  const std::string pod_key = Key(target.ns, target.name);
  res.stream = [this, key, pod_key, container, next, since_ms, cut_epoch](http::ChunkSink& sink) {
    std::string out;
    bool end = false;
    {
      MutexLock lock(&mu_);
      const LogStream& log = logs_[key];
      // As the kubelet: a followed log ends when its container has (or its pod is gone).
      const bool exited = log.ended || ContainerExited(pod_key, container);
      if (*next == log.chunks.size() && !exited)
        changed_.WaitFor(&mu_, std::chrono::milliseconds(20));
      if (stopping_ || log_cut_epoch_ != cut_epoch) return false;
      for (; *next < log.chunks.size(); ++*next)
        if (log.chunks[*next].first >= since_ms) out += log.chunks[*next].second;
      end = exited;
    }
    if (!out.empty() && !sink.Write(out)) return false;
    return !end;
  };
}

void FakeApiServer::HandleCreate(const Target& target, const http::HttpRequest& req,
                                 http::HttpResponse& res) {
  json object = json::parse(req.body);
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].is_object()) {
    Fail(res, 400, "BadRequest", "the object has no metadata");
    return;
  }
  const bool dry_run = req.get_param_value("dryRun") == "All";
  json& metadata = object["metadata"];
  std::string name = metadata.value("name", "");
  MutexLock lock(&mu_);
  // Admission (NamespaceLifecycle): a namespaced object needs its namespace.
  if (target.namespaced && !NamespaceExists(target.ns)) {
    NotFound(res, "namespaces", "", target.ns);
    return;
  }
  if (name.empty() && metadata.contains("generateName"))
    name = metadata.value("generateName", "") + std::to_string(next_uid_);
  if (name.empty()) {
    Fail(res, 422, "Invalid", "metadata.name: Required value");
    return;
  }
  if (objects_[target.collection].count(Key(target.ns, name))) {
    std::string group = GroupOf(target.group_version);
    json body = StatusBody(409, "AlreadyExists",
                           fmt::format("{}{} \"{}\" already exists", target.resource,
                                       group.empty() ? "" : "." + group, name));
    body["details"] = {{"name", name}, {"kind", target.resource}};
    if (!group.empty()) body["details"]["group"] = group;
    Reply(res, 409, body);
    return;
  }
  metadata["name"] = name;
  if (target.namespaced)
    metadata["namespace"] = target.ns;
  else
    metadata.erase("namespace");
  metadata["uid"] = fmt::format("00000000-0000-4000-8000-{:012d}", next_uid_++);
  metadata["creationTimestamp"] = NowText();
  metadata["generation"] = 1;
  metadata.erase("managedFields");
  object["apiVersion"] = target.group_version;
  object["kind"] = target.kind;
  if (target.collection == "v1/namespaces") DefaultNamespace(&object);
  RecordUpdate(nullptr, &object, UpdateManager(req), "", target.group_version);
  if (!SchemaValid(target, object, res)) return;
  Reply(res, 201, Commit(target.collection, "ADDED", std::move(object), dry_run));
}

void FakeApiServer::HandleReplace(const Target& target, const http::HttpRequest& req,
                                  http::HttpResponse& res) {
  json object = json::parse(req.body);
  if (!object.is_object()) {
    Fail(res, 400, "BadRequest", "the body is not an object");
    return;
  }
  const bool dry_run = req.get_param_value("dryRun") == "All";
  MutexLock lock(&mu_);
  auto& objects = objects_[target.collection];
  auto it = objects.find(Key(target.ns, target.name));
  if (it == objects.end()) {
    NotFound(res, target.resource, GroupOf(target.group_version), target.name);
    return;
  }
  const json current = it->second;
  std::string sent_rv =
      object.contains("metadata") ? object["metadata"].value("resourceVersion", "") : "";
  if (!sent_rv.empty() && sent_rv != current["metadata"].value("resourceVersion", "")) {
    Fail(res, 409, "Conflict",
         fmt::format("Operation cannot be fulfilled on {} \"{}\": the object has been modified; "
                     "please apply your changes to the latest version and try again",
                     target.resource, target.name));
    return;
  }
  json updated;
  if (target.subresource == "status") {
    updated = current;  // the status subresource changes only the status
    if (object.contains("status")) updated["status"] = object["status"];
  } else {
    updated = object;
    // The main resource leaves status alone, as for kinds with a status subresource.
    if (current.contains("status"))
      updated["status"] = current["status"];
    else
      updated.erase("status");
    json metadata = current["metadata"];
    if (object.contains("metadata") && object["metadata"].is_object())
      for (const char* field : {"labels", "annotations", "finalizers", "ownerReferences"})
        if (object["metadata"].contains(field)) metadata[field] = object["metadata"][field];
    updated["metadata"] = metadata;
    if (WithoutMetadataAndStatus(updated) != WithoutMetadataAndStatus(current))
      updated["metadata"]["generation"] = current["metadata"].value("generation", 1) + 1;
  }
  updated["apiVersion"] = target.group_version;
  updated["kind"] = target.kind;
  RecordUpdate(current, &updated, UpdateManager(req), target.subresource, target.group_version);
  if (!SchemaValid(target, updated, res)) return;
  Reply(res, 200, Commit(target.collection, "MODIFIED", std::move(updated), dry_run));
}

void FakeApiServer::HandlePatch(const Target& target, const http::HttpRequest& req,
                                http::HttpResponse& res) {
  auto it_type = req.headers.find("content-type");
  std::string type = it_type == req.headers.end() ? "" : it_type->second;
  bool apply = StartsWith(type, "application/apply-patch+yaml");
  if (!apply && !StartsWith(type, "application/merge-patch+json") &&
      !StartsWith(type, "application/strategic-merge-patch+json")) {
    Fail(res, 415, "UnsupportedMediaType",
         fmt::format("the body of the request was in an unknown format: {}", type));
    return;
  }
  std::string manager = req.get_param_value("fieldManager");
  if (apply && manager.empty()) {
    Fail(res, 400, "BadRequest",
         "PATCH, fieldManager: Required value: is required for apply patch");
    return;
  }
  const bool force = QueryBool(req.get_param_value("force"));
  if (!apply && req.has_param("force")) {
    Fail(res, 422, "Invalid", "force: Forbidden: may not be specified for non-apply patch");
    return;
  }
  const bool dry_run = req.get_param_value("dryRun") == "All";
  // The fake takes the apply body as JSON (what tau sends); YAML is not parsed.
  json patch = json::parse(req.body);
  if (!patch.is_object()) {
    Fail(res, 400, "BadRequest", "the patch is not an object");
    return;
  }
  MutexLock lock(&mu_);
  auto& objects = objects_[target.collection];
  auto it = objects.find(Key(target.ns, target.name));
  if (it == objects.end()) {
    if (!apply || !target.subresource.empty()) {
      NotFound(res, target.resource, GroupOf(target.group_version), target.name);
      return;
    }
    if (target.namespaced && !NamespaceExists(target.ns)) {
      NotFound(res, "namespaces", "", target.ns);
      return;
    }
    // An apply that creates: what the server sets, then the applied fields (status is not
    // written through the main resource).
    json skeleton = {{"apiVersion", target.group_version},
                     {"kind", target.kind},
                     {"metadata",
                      {{"name", target.name},
                       {"uid", fmt::format("00000000-0000-4000-8000-{:012d}", next_uid_++)},
                       {"creationTimestamp", NowText()},
                       {"generation", 1}}}};
    if (target.namespaced) skeleton["metadata"]["namespace"] = target.ns;
    json object, conflict;
    ApplyFields(skeleton, patch, manager, "", target.group_version, force, &object, &conflict);
    if (target.collection == "v1/namespaces") DefaultNamespace(&object);
    if (!SchemaValid(target, object, res)) return;
    Reply(res, 201, Commit(target.collection, "ADDED", std::move(object), dry_run));
    return;
  }
  const json current = it->second;
  // A resourceVersion in the patch is a precondition, as in the API server: a stale one is a 409
  // Conflict (clients send it when a patch replaces a list whole, such as a node's taints).
  std::string sent_rv = patch.contains("metadata") && patch["metadata"].is_object()
                            ? patch["metadata"].value("resourceVersion", "")
                            : "";
  if (!sent_rv.empty() && sent_rv != current["metadata"].value("resourceVersion", "")) {
    Fail(res, 409, "Conflict",
         fmt::format("Operation cannot be fulfilled on {} \"{}\": the object has been modified; "
                     "please apply your changes to the latest version and try again",
                     target.resource, target.name));
    return;
  }
  json updated;
  if (apply) {
    json conflict;
    if (!ApplyFields(current, patch, manager, target.subresource, target.group_version, force,
                     &updated, &conflict)) {
      Reply(res, 409, conflict);
      return;
    }
  } else if (target.subresource == "status") {
    updated = current;
    json status = updated.value("status", json::object());
    status.merge_patch(patch.value("status", json::object()));
    updated["status"] = status;
    RecordUpdate(current, &updated, UpdateManager(req), "status", target.group_version);
  } else {
    updated = current;
    patch.erase("status");
    if (patch.contains("metadata") && patch["metadata"].is_object())
      for (const char* field : {"name", "namespace", "resourceVersion", "uid", "creationTimestamp",
                                "generation", "managedFields"})
        patch["metadata"].erase(field);
    updated.merge_patch(patch);
    RecordUpdate(current, &updated, UpdateManager(req), "", target.group_version);
  }
  if (WithoutMetadataAndStatus(updated) != WithoutMetadataAndStatus(current))
    updated["metadata"]["generation"] = current["metadata"].value("generation", 1) + 1;
  updated["apiVersion"] = target.group_version;
  updated["kind"] = target.kind;
  if (!SchemaValid(target, updated, res)) return;
  Reply(res, 200, Commit(target.collection, "MODIFIED", std::move(updated), dry_run));
}

void FakeApiServer::HandleDelete(const Target& target, const http::HttpRequest& req,
                                 http::HttpResponse& res) {
  // DeleteOptions come in the body when there is one, else in the query, as the API server
  // reads them (kubectl and the Python client send a body).
  std::string policy;
  std::vector<std::string> dry_run_values;
  std::optional<bool> orphan;
  json preconditions = json::object();
  if (!req.body.empty()) {
    json options = json::parse(req.body);
    if (!options.is_object()) {
      Fail(res, 400, "BadRequest", "the DeleteOptions are not an object");
      return;
    }
    policy = options.value("propagationPolicy", "");
    if (options.contains("orphanDependents") && options["orphanDependents"].is_boolean())
      orphan = options["orphanDependents"].get<bool>();
    if (options.contains("dryRun") && options["dryRun"].is_array())
      for (const json& v : options["dryRun"])
        if (v.is_string()) dry_run_values.push_back(v.get<std::string>());
    if (options.contains("preconditions") && options["preconditions"].is_object())
      preconditions = options["preconditions"];
  } else {
    policy = req.get_param_value("propagationPolicy");
    if (std::string v = req.get_param_value("dryRun"); !v.empty()) dry_run_values.push_back(v);
    if (req.has_param("orphanDependents"))
      orphan = QueryBool(req.get_param_value("orphanDependents"));
  }
  bool dry_run = false;
  if (json error; !ParseDryRun(dry_run_values, "DeleteOptions", &dry_run, &error)) {
    Reply(res, 422, error);
    return;
  }
  if (!policy.empty() && policy != "Foreground" && policy != "Background" && policy != "Orphan") {
    Fail(res, 422, "Invalid",
         fmt::format("DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported "
                     "value: \"{}\": supported values: \"Foreground\", \"Background\", \"Orphan\"",
                     policy));
    return;
  }
  if (orphan && !policy.empty()) {
    Fail(res, 422, "Invalid",
         "DeleteOptions.meta.k8s.io \"\" is invalid: orphanDependents: Invalid value: "
         "OrphanDependents and DeletionPropagation cannot be both set");
    return;
  }
  if (orphan) policy = *orphan ? "Orphan" : "Background";
  MutexLock lock(&mu_);
  const std::string key = Key(target.ns, target.name);
  auto it = objects_[target.collection].find(key);
  if (it == objects_[target.collection].end()) {
    NotFound(res, target.resource, GroupOf(target.group_version), target.name);
    return;
  }
  const json& metadata = it->second["metadata"];
  for (const char* field : {"uid", "resourceVersion"}) {
    std::string want = preconditions.value(field, "");
    std::string have = metadata.value(field, "");
    if (!want.empty() && want != have) {
      std::string name = field == std::string("uid") ? "UID" : "ResourceVersion";
      Fail(res, 409, "Conflict",
           fmt::format("Operation cannot be fulfilled on {} \"{}\": Precondition failed: {} in "
                       "precondition: {}, {} in object meta: {}",
                       target.resource, target.name, name, want, name, have));
      return;
    }
  }
  if (policy.empty() && target.collection == "batch/v1/jobs")
    // The API server's own warning: a Job deleted without a policy leaves its pods.
    res.headers_out.emplace_back(
        "Warning",
        "299 - \"child pods are preserved by default when jobs are deleted; set "
        "propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress "
        "this warning\"");
  if (dry_run) {
    json object = it->second;
    object["metadata"]["deletionTimestamp"] = NowText();
    Reply(res, 200, object);
    return;
  }
  std::set<std::string> deleting;
  Reply(res, 200, DeleteLocked(target.collection, key, policy, &deleting));
}

void FakeApiServer::SetProxied(const std::string& ns, const std::string& service_port,
                               const std::string& path, const std::string& body) {
  MutexLock lock(&mu_);
  proxied_[fmt::format("{}/{}{}", ns, service_port, path)] = body;
}

void FakeApiServer::HandleServiceProxy(const http::HttpRequest& req,
                                       const std::vector<std::string>& rest,
                                       http::HttpResponse& res) {
  // rest: namespaces NS services NAME[:PORT] proxy PATH...
  const std::string& ns = rest[1];
  // [SCHEME:]NAME[:PORT]
  std::vector<std::string> parts = Split(rest[3], ':');
  const std::string service = parts.size() == 3 ? parts[1] : parts[0];
  if (req.method != "GET") {
    Fail(res, 405, "MethodNotAllowed", "the stand-in proxies GET only");
    return;
  }
  if (Object("v1/services", ns, service).is_null()) {
    Fail(res, 404, "NotFound", fmt::format("services \"{}\" not found", service));
    return;
  }
  std::string path;
  for (size_t i = 5; i < rest.size(); ++i) path += "/" + rest[i];
  MutexLock lock(&mu_);
  auto it = proxied_.find(fmt::format("{}/{}{}", ns, rest[3], path));
  if (it == proxied_.end()) {
    // What the API server says when nothing behind the Service answers.
    Fail(res, 503, "ServiceUnavailable",
         fmt::format("no endpoints available for service \"{}\"", service));
    return;
  }
  res.set_content(it->second, "application/json");
}

void FakeApiServer::HandleAccessReview(const http::HttpRequest& req, http::HttpResponse& res) {
  json review = json::parse(req.body);
  const json spec = review.value("spec", json::object());
  const json attributes = spec.value("resourceAttributes", json::object());
  std::string key =
      fmt::format("{}|{}|{}|{}|{}", spec.value("user", ""), attributes.value("verb", ""),
                  attributes.value("group", ""), attributes.value("resource", ""),
                  attributes.value("namespace", ""));
  bool allowed;
  {
    MutexLock lock(&mu_);
    allowed = grants_.count(key) > 0;
  }
  review["status"] = {{"allowed", allowed}};
  if (!allowed) review["status"]["reason"] = "no grant matches";
  review["metadata"] = json::object();
  Reply(res, 201, review);
}

bool FakeApiServer::HandleDiscovery(const http::HttpRequest& req, http::HttpResponse& res) {
  if (req.method != "GET") return false;
  if (req.path == "/api") {
    json address = {{"clientCIDR", "0.0.0.0/0"},
                    {"serverAddress", fmt::format("127.0.0.1:{}", port_)}};
    Reply(res, 200,
          {{"kind", "APIVersions"},
           {"versions", json::array({"v1"})},
           {"serverAddressByClientCIDRs", json::array({address})}});
    return true;
  }
  if (req.path == "/apis") {
    // Group -> versions in table order; the first is the preferred one.
    std::vector<std::string> order;
    std::map<std::string, std::vector<std::string>> versions;
    for (const kubeapi::ResourceInfo& info : ServedResources()) {
      size_t slash = info.api_version.find('/');
      if (slash == std::string::npos) continue;  // the core group is under /api
      std::string group = info.api_version.substr(0, slash);
      std::vector<std::string>& list = versions[group];
      if (list.empty()) order.push_back(group);
      if (std::find(list.begin(), list.end(), info.api_version) == list.end())
        list.push_back(info.api_version);
    }
    json groups = json::array();
    for (const std::string& group : order) {
      json entries = json::array();
      for (const std::string& gv : versions[group])
        entries.push_back({{"groupVersion", gv}, {"version", gv.substr(gv.find('/') + 1)}});
      groups.push_back({{"name", group}, {"versions", entries}, {"preferredVersion", entries[0]}});
    }
    Reply(res, 200, {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}});
    return true;
  }
  std::string group_version;
  if (req.path == "/api/v1") {
    group_version = "v1";
  } else if (StartsWith(req.path, "/apis/")) {
    std::string rest = req.path.substr(6);
    if (std::count(rest.begin(), rest.end(), '/') != 1) return false;
    group_version = rest;
  } else {
    return false;
  }
  json resources = json::array();
  for (const kubeapi::ResourceInfo& info : ServedResources()) {
    if (info.api_version != group_version) continue;
    std::string singular = info.kind;
    for (char& c : singular) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    resources.push_back(
        {{"name", info.resource},
         {"singularName", singular},
         {"namespaced", info.namespaced},
         {"kind", info.kind},
         {"verbs", json::array({"create", "delete", "get", "list", "patch", "update", "watch"})}});
  }
  if (resources.empty()) return false;
  Reply(res, 200,
        {{"kind", "APIResourceList"},
         {"apiVersion", "v1"},
         {"groupVersion", group_version},
         {"resources", resources}});
  return true;
}

}  // namespace tau::testutil
