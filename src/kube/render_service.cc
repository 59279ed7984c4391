// RenderService: a service (`kind: service`) as Kubernetes objects. A `job` service is a Deployment
// of replicas, each pod built as a one-worker Job's pod is (render_job.cc's WorkerPodSpec), behind
// a ClusterIP Service; Kueue admits each replica through its pod integration. A `rayjob` service
// is a KubeRay RayService: one Ray Serve application on a cluster shaped as a RayJob's
// (render_rayjob.cc's RayClusterSpec); Kueue admits the RayCluster KubeRay makes for it.
#include <fmt/format.h>

#include <algorithm>

#include "common/strings.h"
#include "kube/internal.h"
#include "kube/service.h"

namespace tau::kube {
namespace {

using internal::RunContext;
using nlohmann::json;

// Kubernetes counts probe times in whole seconds: rounded up, at least `min`.
int64_t Seconds(int64_t ms, int64_t min) { return std::max(min, (ms + 999) / 1000); }

// A Probe as a container's readinessProbe or livenessProbe, against the replica's named port.
json ProbeJson(const spec::Probe& p, bool liveness) {
  json probe = json::object();
  if (!p.http_path.empty()) {
    probe["httpGet"] = {{"path", p.http_path}, {"port", kServicePortName}, {"scheme", "HTTP"}};
  } else {
    probe["tcpSocket"] = {{"port", kServicePortName}};
  }
  probe["initialDelaySeconds"] = Seconds(p.initial_delay_ms, 0);
  probe["periodSeconds"] = Seconds(p.period_ms, 1);
  probe["timeoutSeconds"] = Seconds(p.timeout_ms, 1);
  probe["failureThreshold"] = std::max(1, p.failure_threshold);
  // The API server refuses a liveness probe whose successThreshold is not 1: one answer proves a
  // replica alive.
  probe["successThreshold"] = liveness ? 1 : std::max(1, p.success_threshold);
  return probe;
}

// The replicas' pods are selected by the service's name alone: a Deployment's selector cannot
// change, and every other label may (the queue, the priority, the installation).
json Selector(const RunContext& ctx) { return {{kLabelService, ctx.run_name}}; }

std::vector<json> RenderDeployment(const RunContext& ctx, const spec::Serve& serve) {
  const policy::ResolvedRun& run = *ctx.run;
  json pod = internal::WorkerPodSpec(ctx, internal::WorkerCommand(ctx, {}),
                                     {{{"name", "PORT"}, {"value", std::to_string(serve.port)}}});
  // A replica that stops is started again; tau's own retry policy is for runs.
  pod["restartPolicy"] = "Always";
  json& container = pod["containers"][0];
  container["ports"] = json::array(
      {{{"name", kServicePortName}, {"containerPort", serve.port}, {"protocol", "TCP"}}});
  container["readinessProbe"] = ProbeJson(serve.readiness, false);
  if (serve.liveness) container["livenessProbe"] = ProbeJson(*serve.liveness, true);

  // Kueue's pod integration admits each replica (a pod group of one) from the queue its pod names;
  // the Deployment carries the same labels, which newer Kueue copies into the template itself.
  json meta = internal::WorkerTemplateMeta(ctx);
  meta["labels"][kKueueQueueLabel] = run.queue;
  if (!run.priority_class.empty()) meta["labels"][kKueuePriorityLabel] = run.priority_class;
  // A new revision rolls the replicas over, even when nothing else of the pod changed.
  meta["annotations"][kAnnotationRevision] = std::to_string(ctx.service->revision);

  // The Service goes first: the cluster's DNS name and the Service's variables in the pods'
  // environment exist for the replicas from their first start (the kubelet gives a pod the
  // variables of the Services that exist when it starts), and a Service without ready pods has no
  // endpoints, so nothing reaches a replica before its readiness probe passes.
  json service = {{"apiVersion", "v1"},
                  {"kind", "Service"},
                  {"metadata", internal::ObjectMeta(ctx, false)},
                  {"spec",
                   {{"type", "ClusterIP"},
                    {"selector", Selector(ctx)},
                    {"ports",
                     {{{"name", kServicePortName},
                       {"port", kServiceFrontPort},
                       {"targetPort", kServicePortName},
                       {"protocol", "TCP"}}}}}}};
  json deployment = {{"apiVersion", "apps/v1"},
                     {"kind", "Deployment"},
                     {"metadata", internal::ObjectMeta(ctx, true)},
                     {"spec",
                      {{"replicas", serve.replicas},
                       {"selector", {{"matchLabels", Selector(ctx)}}},
                       {"template", {{"metadata", meta}, {"spec", pod}}}}}};
  return {service, deployment};
}

json RenderRayService(const RunContext& ctx, const spec::Serve& serve) {
  // Ray Serve's config takes only remote URIs as a runtime env's working_dir, so the code is not
  // shipped through it: the setup container unpacks it into every pod and the pods' PYTHONPATH
  // holds it, as for a RayJob's workers.
  json app = {{"name", ctx.run_name}, {"import_path", serve.import_path}, {"route_prefix", "/"}};
  if (json env = internal::RayRuntimeEnv(ctx); !env.empty()) app["runtime_env"] = env;
  json config = {{"applications", json::array({app})},
                 {"http_options", {{"host", "0.0.0.0"}, {"port", serve.port}}}};
  return {{"apiVersion", "ray.io/v1"},
          {"kind", "RayService"},
          // KubeRay copies the RayService's labels to the RayCluster it makes, which Kueue admits
          // from the queue they name.
          {"metadata", internal::ObjectMeta(ctx, true)},
          {"spec",
           {{"serveConfigV2", ToYaml(config)},
            {"rayClusterConfig", internal::RayClusterSpec(ctx, false, serve.port)}}}};
}

}  // namespace

Result<std::vector<nlohmann::json>> RenderService(const spec::RunSpec& spec,
                                                  const policy::ResolvedRun& resolved,
                                                  const policy::Platform& platform,
                                                  const ServiceRenderOptions& options) {
  if (!spec.serve) {
    return InvalidArgument(
        "serve: the spec is not a service; a service says `kind: service` and has a serve "
        "section (replicas, port, readiness), and a run is rendered with RenderRun");
  }
  const spec::Serve& serve = *spec.serve;
  std::vector<std::string> errors;
  if (serve.port < 1 || serve.port > 65535) {
    errors.push_back(fmt::format(
        "serve.port: {} is not a port; give the port the program listens on (1-65535, as $PORT)",
        serve.port));
  }
  if (serve.replicas < 0) {
    errors.push_back(fmt::format("serve.replicas: {} replicas; give 0 or more", serve.replicas));
  }
  if (spec.kind == spec::WorkloadKind::kJob) {
    if (resolved.workers > 1) {
      errors.push_back(fmt::format(
          "compute.workers: a service's replica is one pod, and this one asks for {} workers; "
          "remove compute.workers (or execution.nodes) and give serve.replicas for more copies",
          resolved.workers));
    }
    if (spec.execution.launcher == "torchrun") {
      errors.push_back(
          "execution.launcher: a service's replica runs its entrypoint as one process, not "
          "under torchrun; remove execution.launcher (the process sees all of its pod's GPUs)");
    }
  } else if (serve.import_path.empty()) {
    errors.push_back(
        "serve.import_path: a rayjob service runs as a Ray Serve application, which Ray imports "
        "by its import path; write serve.import_path: MODULE:APP (e.g. serve_app:app, the bound "
        "application `app` of serve_app.py in the code directory), or use "
        "run.workload_kind: job to run the entrypoint as the server");
  }

  RenderOptions run_options;
  run_options.run_name = options.service_name;
  run_options.namespace_name = options.namespace_name;
  run_options.default_image = options.default_image;
  run_options.code = options.code;
  run_options.installation = options.installation;
  auto ctx = internal::MakeContext(spec, resolved, platform, run_options, &options);
  if (!ctx.ok()) errors.push_back(ctx.status().message());
  if (!errors.empty()) return InvalidArgument(Join(errors, "\n"));

  if (spec.kind == spec::WorkloadKind::kRayJob)
    return std::vector<json>{RenderRayService(*ctx, serve)};
  return RenderDeployment(*ctx, serve);
}

}  // namespace tau::kube
