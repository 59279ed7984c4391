// The dashboard (web/, embedded at build time) and the live-update stream it and the CLI use.
#pragma once

#include <cstddef>

#include "controller/controller.h"
#include "http/http.h"
#include "server/authz.h"
#include "store/store.h"

namespace tau::server {

struct WebAsset {
  const char* path;  // relative to web/, e.g. "app.js"; nullptr ends the table
  const unsigned char* data;
  size_t size;
  const char* etag;  // quoted, from the file's SHA-256
};
extern const WebAsset kWebAssets[];  // generated: build/.../web_assets.cc

// GET / (the single-page dashboard) and GET /ui/FILE (its scripts, styles and vendored uPlot).
// Public: the files hold no data; the page signs in (a token) before it calls the API.
void RegisterWeb(SecureRouter* api);

// GET /api/v1/events: server-sent events of run and queue changes (see docs/dashboard.md).
// Only runs and queue entries the caller may read.
void RegisterEventsApi(SecureRouter* api, Controller* controller, store::Store* store);

}  // namespace tau::server
