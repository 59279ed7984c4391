#include "server/web.h"

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tau::server {
namespace {

std::string ContentType(std::string_view path) {
  auto ends = [&](std::string_view ext) {
    return path.size() >= ext.size() && path.substr(path.size() - ext.size()) == ext;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".js") || ends(".mjs")) return "text/javascript; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".png")) return "image/png";
  if (ends(".json")) return "application/json";
  return "text/plain; charset=utf-8";
}

const WebAsset* Find(std::string_view path) {
  for (const WebAsset* a = kWebAssets; a->path != nullptr; ++a)
    if (path == a->path) return a;
  return nullptr;
}

void Serve(std::string_view path, http::HttpResponse& res) {
  const WebAsset* a = Find(path);
  if (a == nullptr) {
    res.status = 404;
    res.set_content(fmt::format("no such dashboard file: {}\n", path), "text/plain; charset=utf-8");
    return;
  }
  res.set_content(std::string(reinterpret_cast<const char*>(a->data), a->size),
                  ContentType(a->path));
}

}  // namespace

void RegisterWeb(SecureRouter* api) {
  // The dashboard is one page; its views are #/ routes, so only / serves HTML.
  api->Route("GET", "/", Access::kPublic,
             [](const http::HttpRequest&, http::HttpResponse& res) { Serve("index.html", res); });
  api->Route("GET", R"(/ui/([A-Za-z0-9._/-]+))", Access::kPublic,
             [](const http::HttpRequest& req, http::HttpResponse& res) {
               std::string path = req.matches[1];
               if (path.find("..") != std::string::npos)
                 path.clear();  // the table has no such names anyway
               Serve(path, res);
             });
}

}  // namespace tau::server
