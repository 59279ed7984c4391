// The spec's JSON forms: the canonical run config (and its hash) and the JSON Schema of both file
// shapes.
#include "common/hash.h"
#include "spec/spec.h"
#include "spec/walk.h"

namespace tau::spec {

namespace {

using nlohmann::json;

json OptQuantity(const std::optional<Quantity>& q) {
  return q ? json(q->ToString()) : json(nullptr);
}

template <typename T>
json Opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json ComputeJson(const Compute& c) {
  json out = {
      {"gpus", c.gpus},
      {"workers", c.workers},
      {"cpus", OptQuantity(c.cpus)},
      {"memory", OptQuantity(c.memory)},
      {"worker_cpus", OptQuantity(c.worker_cpus)},
      {"worker_memory", OptQuantity(c.worker_memory)},
      {"worker_cpu_limit", OptQuantity(c.worker_cpu_limit)},
      {"worker_memory_limit", OptQuantity(c.worker_memory_limit)},
      {"head_cpus", OptQuantity(c.head_cpus)},
      {"head_memory", OptQuantity(c.head_memory)},
      {"head_cpu_limit", OptQuantity(c.head_cpu_limit)},
      {"head_memory_limit", OptQuantity(c.head_memory_limit)},
      {"gpu_resource_mode", c.gpu_resource_mode},
  };
  // Only when given, so that specs without them keep their config hash.
  if (c.cpu_limit) out["cpu_limit"] = c.cpu_limit->ToString();
  if (c.memory_limit) out["memory_limit"] = c.memory_limit->ToString();
  return out;
}

json RuntimeJson(const Runtime& r) {
  // Env as an object keyed by name: the order of variables in the file does not change the run.
  json env = json::object();
  for (const EnvVar& var : r.env) {
    if (!var.secret_ref) {
      env[var.name] = var.value;
    } else if (var.secret_name.empty()) {
      env[var.name] = {{"secret_ref", var.value}};
    } else {
      env[var.name] = {{"secret_ref", var.value}, {"secret_name", var.secret_name}};
    }
  }
  return {{"image", r.image},
          {"pip", r.pip},
          {"env", env},
          {"working_dir", r.working_dir},
          {"security_mode", r.security_mode}};
}

json PolicyJson(const Policy& p) {
  json out = {{"workspace", p.workspace},
              {"namespace", p.namespace_name},
              {"queue", p.queue},
              {"profile", p.profile},
              {"lane", p.lane},
              {"team", p.team},
              {"preset", p.preset},
              {"gpu_class", p.gpu_class},
              {"topology", p.topology},
              {"priority_tier", p.priority_tier},
              {"priority", p.priority},
              {"disable_default_priorities", p.disable_default_priorities},
              {"node_selector", p.node_selector}};
  // The newer sections appear only when given, so that specs without them keep their config hash.
  json guardrails = json::object();
  if (p.idle)
    guardrails["idle"] = {{"gpu_util_below", Opt(p.idle->gpu_util_below)},
                          {"warn_after_ms", Opt(p.idle->warn_after_ms)},
                          {"stop_after_ms", Opt(p.idle->stop_after_ms)}};
  if (p.stall)
    guardrails["stall"] = {{"after_ms", Opt(p.stall->after_ms)},
                           {"stop_after_ms", Opt(p.stall->stop_after_ms)}};
  if (!guardrails.empty()) out["guardrails"] = std::move(guardrails);
  if (!p.webhooks.empty()) {
    json hooks = json::array();
    for (const Webhook& h : p.webhooks)
      hooks.push_back({{"url", h.url}, {"secret", h.secret}, {"events", h.events}});
    out["webhooks"] = std::move(hooks);
  }
  return out;
}

json StorageJson(const Storage& s) {
  json assets = json::array();
  for (const ImageAsset& a : s.image_assets) {
    assets.push_back({{"name", a.name},
                      {"image", a.image},
                      {"source_path", a.source_path},
                      {"mount_path", a.mount_path}});
  }
  return {{"data_pvc", s.data_pvc},
          {"output", s.output},
          {"checkpoint", s.checkpoint},
          {"publish", s.publish},
          {"image_assets", assets}};
}

json ResilienceJson(const Resilience& r) {
  // The default retry set is filled in so that saying it explicitly and leaving it out hash the
  // same.
  std::vector<std::string> retry_on = r.retry_on_set ? r.retry_on : DefaultRetryOn();
  return {{"max_retries", r.max_retries},
          {"retry_on", retry_on},
          {"backoff_initial_ms", r.backoff_initial_ms},
          {"backoff_max_ms", r.backoff_max_ms},
          {"max_retry_duration_ms", Opt(r.max_retry_duration_ms)},
          {"checkpoint_path", r.checkpoint_path}};
}

// ---- JSON Schema
// ----------------------------------------------------------------------------------

constexpr const char* kQuantityPattern =
    "^[+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i|[mkMGTPE])?$";
constexpr const char* kDurationPattern = "^([0-9]+(\\.[0-9]+)?(ms|s|m|h|d))+$";

json ScalarText(const internal::FieldDef& f) {
  return f.scalar_text ? json::array({"string", "number", "boolean"}) : json("string");
}

json SchemaFor(const internal::FieldDef& f);

json ObjectSchema(const std::vector<internal::FieldDef>& fields,
                  const std::vector<std::string>& required) {
  json properties = json::object();
  for (const internal::FieldDef& f : fields) properties[f.name] = SchemaFor(f);
  json schema = {{"type", "object"}, {"properties", properties}, {"additionalProperties", false}};
  if (!required.empty()) schema["required"] = required;
  return schema;
}

json SchemaFor(const internal::FieldDef& f) {
  using internal::Kind;
  json s;
  switch (f.kind) {
    case Kind::kString:
      s = {{"type", ScalarText(f)}};
      if (!f.allow_empty) s["minLength"] = 1;
      if (f.max) s["maxLength"] = *f.max;
      if (!f.pattern.empty()) s["pattern"] = f.pattern;
      break;
    case Kind::kInt:
      s = {{"type", "integer"}};
      if (f.min) s["minimum"] = *f.min;
      if (f.max) s["maximum"] = *f.max;
      if (f.name == "schema_version") s["const"] = 1;
      break;
    case Kind::kBool:
      s = {{"type", "boolean"}};
      break;
    case Kind::kQuantity:
      s = {{"type", json::array({"string", "number"})},
           {"pattern", kQuantityPattern},
           {"exclusiveMinimum", 0}};
      break;
    case Kind::kDuration:
      s = {{"type", "string"}, {"pattern", kDurationPattern}};
      break;
    case Kind::kEnum:
      s = {{"type", "string"}, {"enum", f.enum_values}};
      if (!f.deprecated_values.empty()) {
        // Deprecated aliases are accepted (the parser warns and normalises them).
        s = {{"oneOf", json::array({s, json{{"type", "string"},
                                            {"enum", f.deprecated_values},
                                            {"deprecated", true}}})}};
      }
      break;
    case Kind::kStringList:
      s = {{"type", "array"}, {"items", {{"type", ScalarText(f)}, {"minLength", 1}}}};
      break;
    case Kind::kEnumList:
      s = {{"type", "array"},
           {"uniqueItems", true},
           {"items", {{"type", "string"}, {"enum", f.enum_values}}}};
      break;
    case Kind::kStringMap:
    case Kind::kEnv: {
      s = {{"type", "object"}, {"additionalProperties", {{"type", ScalarText(f)}}}};
      if (!f.pattern.empty()) s["propertyNames"] = {{"pattern", f.pattern}};
      if (f.max) s["maxProperties"] = *f.max;
      if (f.kind == Kind::kStringMap) break;
      // runtime.env is a mapping or a list of {name, value}.
      json name = {{"type", "string"}, {"minLength", 1}};
      if (!f.pattern.empty()) name["pattern"] = f.pattern;
      json item = {{"type", "object"},
                   {"properties", {{"name", name}, {"value", {{"type", ScalarText(f)}}}}},
                   {"required", json::array({"name", "value"})},
                   {"additionalProperties", false}};
      json list = {{"type", "array"}, {"items", item}};
      if (f.max) list["maxItems"] = *f.max;
      s = {{"oneOf", json::array({s, list})}};
      break;
    }
    case Kind::kObject:
      s = ObjectSchema(f.children, f.required);
      break;
    case Kind::kObjectList:
      s = {{"type", "array"}, {"items", ObjectSchema(f.children, f.required)}};
      break;
    case Kind::kAny:
      s = json::object();
      if (f.must_be_mapping) s["type"] = "object";
      break;
  }
  s["description"] = f.doc;
  return s;
}

}  // namespace

namespace internal {

nlohmann::json SchemaForFields(const std::vector<FieldDef>& fields,
                               const std::vector<std::string>& required) {
  return ObjectSchema(fields, required);
}

}  // namespace internal

namespace {

json ExecutionJson(const Execution& e) {
  return {{"launcher", e.launcher},
          {"nodes", Opt(e.nodes)},
          {"processes_per_node", Opt(e.processes_per_node)},
          {"mode", e.tune_mode},
          {"metric", e.tune_metric},
          {"num_samples", Opt(e.num_samples)},
          {"max_concurrent_trials", Opt(e.max_concurrent_trials)},
          {"configs", e.configs},
          {"allow_nccl_override", e.allow_nccl_override}};
}

bool IsDefault(const Execution& e) {
  return e.launcher.empty() && !e.nodes && !e.processes_per_node && e.tune_mode.empty() &&
         e.tune_metric.empty() && !e.num_samples && !e.max_concurrent_trials &&
         e.configs.is_null() && !e.allow_nccl_override;
}

json ProbeJson(const Probe& p, bool readiness) {
  json out = {{"http_path", p.http_path},
              {"initial_delay_ms", p.initial_delay_ms},
              {"period_ms", p.period_ms},
              {"timeout_ms", p.timeout_ms},
              {"failure_threshold", p.failure_threshold}};
  if (readiness) out["success_threshold"] = p.success_threshold;
  return out;
}

}  // namespace

json ServeJson(const Serve& s) {
  return {{"replicas", s.replicas},
          {"port", s.port},
          {"from", s.from_run},
          {"model", s.model},
          {"readiness", ProbeJson(s.readiness, true)},
          {"liveness", s.liveness ? ProbeJson(*s.liveness, false) : json()},
          {"restart_backoff_initial_ms", s.restart_backoff_initial_ms},
          {"restart_backoff_max_ms", s.restart_backoff_max_ms},
          {"import_path", s.import_path}};
}

json ToJson(const RunSpec& spec) {
  json out = {
      {"shape", ShapeName(spec.shape)},
      {"name", spec.name},
      {"kind", WorkloadKindName(spec.kind)},
      {"entrypoint", spec.entrypoint},
      {"args", spec.args},
      {"ttl_seconds_after_finished", Opt(spec.ttl_seconds_after_finished)},
      {"max_runtime_ms", Opt(spec.max_runtime_ms)},
      {"resource_prefix", spec.resource_prefix},
      {"compute", ComputeJson(spec.compute)},
      {"runtime", RuntimeJson(spec.runtime)},
      {"policy", PolicyJson(spec.policy)},
      {"storage", StorageJson(spec.storage)},
      {"resilience", ResilienceJson(spec.resilience)},
      {"experiment",
       {{"project", spec.experiment.project},
        {"name", spec.experiment.name},
        {"group", spec.experiment.group}}},
      {"metrics",
       {{"history", spec.metrics.history},
        {"offload_enabled", spec.metrics.offload_enabled},
        {"offload_out", spec.metrics.offload_out}}},
      {"recorded_only", spec.recorded_only},
  };
  // The newer fields appear only when given, so that specs without them keep their config hash.
  if (!spec.metrics.offload_image.empty()) {
    out["metrics"]["offload_image"] = spec.metrics.offload_image;
  }
  if (!IsDefault(spec.execution)) out["execution"] = ExecutionJson(spec.execution);
  if (!spec.code_excludes.empty()) out["code_excludes"] = spec.code_excludes;
  if (!spec.source.image.empty() || !spec.source.path.empty())
    out["source"] = {{"image", spec.source.image}, {"path", spec.source.path}};
  if (spec.serve) out["serve"] = ServeJson(*spec.serve);
  if (!spec.overrides.empty()) {
    json& list = out["overrides"] = json::array();
    for (const Override& o : spec.overrides) list.push_back({{"path", o.path}, {"value", o.value}});
  }
  return out;
}

std::vector<Override> RecordedOverrides(const json& canonical) {
  std::vector<Override> out;
  auto it = canonical.is_object() ? canonical.find("overrides") : canonical.end();
  if (canonical.is_object() && it != canonical.end() && it->is_array()) {
    for (const json& o : *it) {
      if (!o.is_object() || !o.contains("path") || !o["path"].is_string() || !o.contains("value") ||
          !o["value"].is_string())
        continue;
      Override one;
      one.path = o["path"].get<std::string>();
      one.value = o["value"].get<std::string>();
      out.push_back(std::move(one));
    }
  }
  return out;
}

std::string ConfigHash(const RunSpec& spec) { return ConfigHash(ToJson(spec)); }

std::string ConfigHash(const json& canonical) { return ConfigHashOf(canonical); }

json JsonSchema() {
  json manifest =
      internal::SchemaForFields(internal::ManifestFields(), internal::ManifestRequired());
  manifest["title"] = "manifest shape (schema_version: 1)";
  json direct = internal::SchemaForFields(internal::DirectFields(), internal::DirectRequired());
  direct["title"] = "direct shape (engine: job|rayjob)";
  // name, engine and the entrypoint (or its alias `script`) may each be at the top or under run:.
  auto here_or_under_run = [](std::vector<std::string> names) {
    json any = json::array();
    for (const std::string& n : names) any.push_back({{"required", json::array({n})}});
    for (const std::string& n : names) {
      any.push_back({{"required", json::array({"run"})},
                     {"properties", {{"run", {{"required", json::array({n})}}}}}});
    }
    return json{{"anyOf", any}};
  };
  direct["allOf"] = json::array({here_or_under_run({"name"}), here_or_under_run({"engine"}),
                                 here_or_under_run({"entrypoint", "script"})});
  return {
      {"$schema", "https://json-schema.org/draft/2020-12/schema"},
      {"$id", "https://tau.dev/schemas/tau.yaml.json"},
      {"title", "tau.yaml"},
      {"description", "A tau run spec, in the manifest shape or the direct shape"},
      {"oneOf", json::array({manifest, direct})},
  };
}

}  // namespace tau::spec
