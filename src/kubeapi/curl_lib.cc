// libcurl through dlopen.
//
// Why not link it: every `tau` process (the CLI, each attempt's supervisor) must start in a few
// milliseconds, and the binary links only libc dynamically (see the top-level CMakeLists.txt).
// Linking libcurl would load about 20 shared libraries (OpenSSL, nghttp2, libssh2, kerberos, ...)
// into every process at ~1.5 ms each, though only the commands that talk to a cluster need it.
// <curl/curl.h> is used for the types and constants only; -lcurl is never on the link line.
#include <dlfcn.h>

#include <mutex>

#include <fmt/format.h>

#include "kubeapi/internal.h"

namespace tau::kubeapi {
namespace {

template <typename Fn>
bool Bind(void* lib, const char* name, Fn* fn, std::string* missing) {
  void* sym = ::dlsym(lib, name);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *fn = reinterpret_cast<Fn>(sym);
  return true;
}

Result<const CurlLib*> Load() {
  void* lib = ::dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return FailedPrecondition(fmt::format(
        "cannot load libcurl.so.4 ({}), which tau needs to talk to a Kubernetes API server; "
        "install libcurl4 (Debian/Ubuntu: apt-get install libcurl4; Fedora: dnf install "
        "libcurl)",
        why ? why : "unknown error"));
  }
  static CurlLib table;
  std::string missing;
  Bind(lib, "curl_global_init", &table.global_init, &missing);
  Bind(lib, "curl_easy_init", &table.easy_init, &missing);
  Bind(lib, "curl_easy_setopt", &table.easy_setopt, &missing);
  Bind(lib, "curl_easy_getinfo", &table.easy_getinfo, &missing);
  Bind(lib, "curl_easy_cleanup", &table.easy_cleanup, &missing);
  Bind(lib, "curl_easy_reset", &table.easy_reset, &missing);
  Bind(lib, "curl_easy_strerror", &table.easy_strerror, &missing);
  Bind(lib, "curl_slist_append", &table.slist_append, &missing);
  Bind(lib, "curl_slist_free_all", &table.slist_free_all, &missing);
  Bind(lib, "curl_multi_init", &table.multi_init, &missing);
  Bind(lib, "curl_multi_add_handle", &table.multi_add_handle, &missing);
  Bind(lib, "curl_multi_remove_handle", &table.multi_remove_handle, &missing);
  Bind(lib, "curl_multi_perform", &table.multi_perform, &missing);
  Bind(lib, "curl_multi_poll", &table.multi_poll, &missing);
  Bind(lib, "curl_multi_info_read", &table.multi_info_read, &missing);
  Bind(lib, "curl_multi_cleanup", &table.multi_cleanup, &missing);
  if (!missing.empty())
    return FailedPrecondition(fmt::format(
        "libcurl.so.4 lacks {}; tau needs libcurl 7.77 or newer (install a newer libcurl4)",
        missing));
  // Not thread-safe in old libcurls, hence inside the call_once.
  if (CURLcode rc = table.global_init(CURL_GLOBAL_ALL); rc != CURLE_OK)
    return Internal(fmt::format("curl_global_init failed: {}", table.easy_strerror(rc)));
  return static_cast<const CurlLib*>(&table);
}

}  // namespace

Result<const CurlLib*> LoadCurl() {
  static std::once_flag once;
  static Result<const CurlLib*>* loaded = nullptr;
  std::call_once(once, [] { loaded = new Result<const CurlLib*>(Load()); });
  return *loaded;
}

std::string QueryEscape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

}  // namespace tau::kubeapi
