// Kubernetes rendering of a service (`kind: service`, docs/serving.md): an apps/v1 Deployment of
// its replicas behind a v1 Service, or a ray.io/v1 RayService, labelled for Kueue. Pure, like
// kube.h's rendering of runs, whose pod and cluster shapes it shares (docs/kubernetes.md,
// "Services").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/code_file.h"
#include "common/status.h"
#include "policy/policy.h"
#include "spec/spec.h"

namespace tau::kube {

// A service's objects and replica pods (RenderService) carry tau.dev/service instead of
// tau.dev/run and tau.dev/attempt, so that nothing that watches runs' pods and objects takes a
// replica for an attempt; tau.dev/revision says which deploy of the service made them.
inline constexpr const char* kLabelService = "tau.dev/service";
inline constexpr const char* kAnnotationRevision = "tau.dev/revision";
// The trained run a service serves (ServiceRenderOptions::model_run).
inline constexpr const char* kAnnotationModelRun = "tau.dev/model-run";
// Where a service's replicas find the model they serve (read-only; $TAU_SERVE_MODEL).
inline constexpr const char* kModelDir = "/tau/model";
// The container port of a service's replica (a Deployment's pod), named so that probes and the
// Service can refer to it whatever its number.
inline constexpr const char* kServicePortName = "http";
// The port of the Service in front of a Deployment's replicas.
inline constexpr int kServiceFrontPort = 80;

struct ServiceRenderOptions {
  std::string service_name;    // the service's name (DNS label; "" : the spec's); objects are
                               // named from it ([resource_naming.prefix-]NAME)
  int64_t revision = 1;        // recorded as the annotation tau.dev/revision
  std::string namespace_name;  // "" : the workspace's namespace
  std::string default_image;   // as RenderOptions::default_image
  std::vector<CodeFile> code;  // shipped inline, as for runs (same limit and init container)
  // The model the replicas serve (Serve::from_run): the trained run's name and, when known, the
  // path of its newest complete checkpoint (or its output directory) on the workspace's
  // checkpoint/output storage; mounted read-only, its path in $TAU_SERVE_MODEL.
  //   model_run ""      : serve.from_run, else no model
  //   model_path ""     : the run's directory of its kind (serve.model: MOUNT/RUN/checkpoints or
  //                       MOUNT/RUN/output) on the storage this service mounts for that role
  //   model_path "/..." : a path as pods see it, under one of the workspace's storage volumes
  //   model_path "a/b"  : relative to the mount of that role's storage
  std::string model_run, model_path;
  std::string installation;  // as RenderOptions::installation
};

// A service (spec.serve set, `kind: service`) as Kubernetes objects, in apply order:
//   run.workload_kind job     a v1 Service (ClusterIP, port 80 to the replicas' `http` port) and
//                             an apps/v1 Deployment of serve.replicas pods, each built as a
//                             one-worker Job's pod is, with $PORT, probes and Kueue's labels
//                             (Kueue's pod integration admits each replica)
//   run.workload_kind rayjob  a ray.io/v1 RayService: serve.import_path as the one Ray Serve
//                             application, on a cluster shaped as a RayJob's (KubeRay's Service
//                             NAME-serve-svc is its endpoint, on serve.port)
// `resolved` must come from policy::Resolve(spec, platform, ...). InvalidArgument names the field
// and what to do when the service cannot be rendered (as RenderRun's, plus a service's own: no
// serve section, several workers per replica, a rayjob service without serve.import_path, a
// model that is not on the workspace's storage).
Result<std::vector<nlohmann::json>> RenderService(const spec::RunSpec& spec,
                                                  const policy::ResolvedRun& resolved,
                                                  const policy::Platform& platform,
                                                  const ServiceRenderOptions& options);

}  // namespace tau::kube
