// Internals shared by the client's .cc files: the libcurl function table and small helpers.
#pragma once

#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "kubeapi/kubeapi.h"

namespace tau::kubeapi {

// The libcurl entry points tau uses, resolved with dlsym.
struct CurlLib {
  CURLcode (*global_init)(long flags);
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL* handle, CURLoption option, ...);
  CURLcode (*easy_getinfo)(CURL* handle, CURLINFO info, ...);
  void (*easy_cleanup)(CURL* handle);
  void (*easy_reset)(CURL* handle);
  const char* (*easy_strerror)(CURLcode code);
  curl_slist* (*slist_append)(curl_slist* list, const char* text);
  void (*slist_free_all)(curl_slist* list);
  CURLM* (*multi_init)();
  CURLMcode (*multi_add_handle)(CURLM* multi, CURL* handle);
  CURLMcode (*multi_remove_handle)(CURLM* multi, CURL* handle);
  CURLMcode (*multi_perform)(CURLM* multi, int* running);
  CURLMcode (*multi_poll)(CURLM* multi, curl_waitfd* extra, unsigned extra_count, int timeout_ms,
                          int* ret);
  CURLMsg* (*multi_info_read)(CURLM* multi, int* left);
  CURLMcode (*multi_cleanup)(CURLM* multi);
};

struct Client::Request {
  std::string method;
  std::string path;  // with the query
  std::string body;
  std::string content_type;  // "" : no body
  bool streaming = false;    // no request_timeout_ms
  // A stream's own deadline (a watch: its timeoutSeconds and a margin, so that a watch the server
  // or a proxy holds open without a word is given up); 0: none (a pod's log may be silent for
  // days).
  int64_t stream_timeout_ms = 0;
};

struct Client::Transfer {
  int http_status = 0;
  std::string body;         // the whole body, or an error body of a stream
  std::string retry_after;  // the Retry-After header
  size_t streamed_bytes = 0;
  bool stopped = false;  // `stop` or the consumer ended it
};

// Loads libcurl.so.4 once; later calls return the same table or the same error.
Result<const CurlLib*> LoadCurl();

// Percent-encodes a query value (RFC 3986 unreserved characters stay).
std::string QueryEscape(std::string_view s);

// "Failure" Status objects carry message, reason and code; returns "" when `body` is not one.
std::string StatusMessage(const std::string& body, std::string* reason);

// Maps an HTTP error to a Status (see kubeapi.h), with `what` ("GET /api/v1/...") in front.
Status HttpError(int http_status, const std::string& what, const std::string& body);

}  // namespace tau::kubeapi

namespace tau::kubeapi {

// What an exec credential plugin returned (ExecCredential status).
struct ExecCredential {
  std::string token;
  std::string client_cert_data;  // PEM
  std::string client_key_data;   // PEM
  int64_t expires_ms = 0;        // 0: does not expire (cached until a 401)
};

// Runs the plugin with its args and env (plus KUBERNETES_EXEC_INFO) and parses its stdout.
Result<ExecCredential> RunExecPlugin(const ExecConfig& exec);
// Parses an ExecCredential JSON document.
Result<ExecCredential> ParseExecCredential(const std::string& text);

}  // namespace tau::kubeapi
