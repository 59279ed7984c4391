// RenderRun: a resolved run as a Job or a RayJob (render_job.cc, render_rayjob.cc), after the
// checks and common parts of render_pod.cc.
#include "kube/internal.h"

namespace tau::kube {

using nlohmann::json;

Result<std::vector<nlohmann::json>> RenderRun(const spec::RunSpec& spec,
                                              const policy::ResolvedRun& resolved,
                                              const policy::Platform& platform,
                                              const RenderOptions& options) {
  TAU_ASSIGN_OR_RETURN(internal::RunContext ctx,
                       internal::MakeContext(spec, resolved, platform, options));
  if (spec.kind == spec::WorkloadKind::kRayJob)
    return std::vector<json>{internal::RenderRayJob(ctx)};
  return internal::RenderJob(ctx);
}

}  // namespace tau::kube
