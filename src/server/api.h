// The REST API (v1) over the controller and the store. Every answer is JSON; errors are
// {"error": {"code": "...", "message": "..."}} with a matching HTTP status.
#pragma once

#include "health/health.h"
#include "server/controller.h"
#include "server/http.h"
#include "store/store.h"

namespace tau::server {

void RegisterApi(HttpServer* http, Controller* controller, store::Store* store,
                 health::GpuMonitor* monitor);

}  // namespace tau::server
