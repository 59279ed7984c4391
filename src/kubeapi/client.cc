// The client's transport: one libcurl transfer per request, driven through a multi handle so a
// stream can be stopped from another thread within ~50 ms, on connections kept open between
// requests (a few idle handles, each with its multi's connection cache: no TCP and TLS handshake
// per request); retries with backoff; credentials.
#include <chrono>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/files.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "kubeapi/internal.h"

namespace tau::kubeapi {

namespace {
thread_local int64_t call_deadline_ms = 0;  // CallBudget's, monotonic; 0: none
thread_local const std::atomic<bool>* call_stop = nullptr;
}  // namespace

CallBudget::CallBudget(int64_t budget_ms, const std::atomic<bool>* stop)
    : saved_(call_deadline_ms), saved_stop_(call_stop) {
  int64_t deadline = MonotonicMillis() + std::max<int64_t>(budget_ms, 0);
  call_deadline_ms = saved_ == 0 ? deadline : std::min(saved_, deadline);
  if (stop != nullptr) call_stop = stop;
}
CallBudget::~CallBudget() {
  call_deadline_ms = saved_;
  call_stop = saved_stop_;
}
int64_t CallBudget::Deadline() { return call_deadline_ms; }
const std::atomic<bool>* CallBudget::Stop() { return call_stop; }

struct Client::Credentials {
  std::string token;
  std::string client_cert_data;
  std::string client_key_data;
  int64_t expires_ms = 0;
};

namespace {

constexpr size_t kMaxBodyBytes = 256 << 20;  // a List of many large objects; more is a bug
constexpr int64_t kTokenFileRereadMs = 60000;

struct TransferContext {
  const CurlLib* curl;
  CURL* easy;
  std::string* body;
  std::string* retry_after;
  size_t* streamed_bytes;
  const std::function<bool(std::string_view)>* on_data;
  const std::atomic<bool>* stop;
  bool status_checked = false;
  bool streaming = false;
  bool consumer_done = false;
};

size_t OnWrite(char* data, size_t size, size_t count, void* user) {
  auto* ctx = static_cast<TransferContext*>(user);
  size_t len = size * count;
  if (ctx->on_data != nullptr && !ctx->status_checked) {
    long code = 0;
    ctx->curl->easy_getinfo(ctx->easy, CURLINFO_RESPONSE_CODE, &code);
    ctx->streaming = code == 200;  // an error answer is collected whole, to be reported
    ctx->status_checked = true;
  }
  if (ctx->streaming) {
    *ctx->streamed_bytes += len;
    if (!(*ctx->on_data)(std::string_view(data, len))) {
      ctx->consumer_done = true;
      return 0;  // makes libcurl end the transfer
    }
    return len;
  }
  if (ctx->body->size() + len > kMaxBodyBytes) return 0;
  ctx->body->append(data, len);
  return len;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* ctx = static_cast<TransferContext*>(user);
  std::string_view line(data, size * count);
  constexpr std::string_view kName = "retry-after:";
  if (line.size() > kName.size()) {
    bool match = true;
    for (size_t i = 0; i < kName.size() && match; ++i)
      match = std::tolower(static_cast<unsigned char>(line[i])) == kName[i];
    if (match) {
      std::string value(line.substr(kName.size()));
      while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())))
        value.pop_back();
      while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front())))
        value.erase(0, 1);
      *ctx->retry_after = value;
    }
  }
  return size * count;
}

// libcurl calls this while a transfer makes progress; a non-zero answer aborts it.
int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* ctx = static_cast<TransferContext*>(user);
  return ctx->stop != nullptr && ctx->stop->load() ? 1 : 0;
}

bool RetryableCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
      return true;
    default:
      return false;
  }
}

// Seconds from a Retry-After header, or from an API Status's details.retryAfterSeconds.
int RetryAfterMs(const std::string& header, const std::string& body) {
  if (!header.empty() && std::isdigit(static_cast<unsigned char>(header[0])))
    return std::atoi(header.c_str()) * 1000;
  nlohmann::json status = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (status.is_object() && status.contains("details") && status["details"].is_object()) {
    const nlohmann::json& seconds = status["details"].value("retryAfterSeconds", nlohmann::json());
    if (seconds.is_number_integer()) return seconds.get<int>() * 1000;
  }
  return 0;
}

int BackoffMs(const ClientOptions& options, int attempt, int retry_after_ms) {
  int64_t base = options.initial_backoff_ms;
  for (int i = 1; i < attempt && base < options.max_backoff_ms; ++i) base *= 2;
  base = std::min<int64_t>(base, options.max_backoff_ms);
  // Jitter in [base/2, base]: many clients retrying after one outage do not arrive together.
  thread_local std::mt19937 rng(std::random_device{}());
  int64_t wait = base / 2 + std::uniform_int_distribution<int64_t>(0, base - base / 2)(rng);
  wait = std::max<int64_t>(wait, retry_after_ms);
  return static_cast<int>(std::min<int64_t>(wait, options.max_backoff_ms));
}

curl_blob Blob(const std::string& data) {
  return curl_blob{const_cast<char*>(data.data()), data.size(), CURL_BLOB_COPY};
}

}  // namespace

// An easy handle stays in its own multi handle's connection cache between transfers: added
// again, it finds the connection the last request left open.
struct Client::Handle {
  CURL* easy = nullptr;
  CURLM* multi = nullptr;
};

namespace {
constexpr size_t kIdleHandles = 8;  // kept open for later requests; more concurrent ones close

// "https://HOST:PORT" -> HOST (brackets kept for IPv6) and PORT (443 when not given).
void SplitServer(const std::string& server, std::string* host, std::string* port) {
  std::string rest = server.substr(server.find("://") + 3);
  size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']', colon) == std::string::npos) {
    *host = rest.substr(0, colon);
    *port = rest.substr(colon + 1);
  } else {
    *host = rest;
    *port = StartsWith(server, "https://") ? "443" : "80";
  }
}
}  // namespace

Client::Client(ClusterConfig config, ClientOptions options)
    : config_(std::move(config)), options_(std::move(options)) {}

Client::~Client() {
  Result<const CurlLib*> curl = LoadCurl();
  MutexLock lock(&mu_);
  for (Handle* h : idle_) {
    if (curl.ok()) {
      (*curl)->multi_cleanup(h->multi);
      (*curl)->easy_cleanup(h->easy);
    }
    delete h;
  }
}

Client::Handle* Client::TakeHandle() {
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      Handle* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  Result<const CurlLib*> curl = LoadCurl();
  if (!curl.ok()) return nullptr;
  auto* h = new Handle{(*curl)->easy_init(), (*curl)->multi_init()};
  if (h->easy == nullptr || h->multi == nullptr) {
    if (h->multi != nullptr) (*curl)->multi_cleanup(h->multi);
    if (h->easy != nullptr) (*curl)->easy_cleanup(h->easy);
    delete h;
    return nullptr;
  }
  return h;
}

void Client::GiveBack(Handle* h, bool performed) {
  const CurlLib* curl = *LoadCurl();  // loaded: the handle came from it
  long opened = 0;
  if (performed && curl->easy_getinfo(h->easy, CURLINFO_NUM_CONNECTS, &opened) == CURLE_OK)
    connections_opened_ += opened;
  // Options go (they point at this request's buffers); the connection stays in the multi.
  curl->easy_reset(h->easy);
  {
    MutexLock lock(&mu_);
    if (idle_.size() < kIdleHandles) {
      idle_.push_back(h);
      return;
    }
  }
  curl->multi_cleanup(h->multi);
  curl->easy_cleanup(h->easy);
  delete h;
}

Result<std::unique_ptr<Client>> Client::Create(ClusterConfig config, ClientOptions options) {
  TAU_RETURN_IF_ERROR(LoadCurl().status());
  if (!StartsWith(config.server, "https://") && !StartsWith(config.server, "http://"))
    return InvalidArgument(fmt::format(
        "Kubernetes API server '{}' must start with https:// (or http://)", config.server));
  // client-go leaves credentials out of plain-http requests; a token sent there could be read on
  // the way. Refused, so that the reason is said rather than a 401 from an unsent token.
  const bool credentials =
      !config.token.empty() || !config.token_file.empty() || !config.exec.command.empty();
  if (credentials && StartsWith(config.server, "http://"))
    return FailedPrecondition(fmt::format(
        "Kubernetes API server {}: plain http, and the kubeconfig's user has a token; Kubernetes "
        "clients send credentials over https only: use the server's https:// address",
        config.server));
  if (options.max_attempts < 1) options.max_attempts = 1;
  return std::unique_ptr<Client>(new Client(std::move(config), std::move(options)));
}

Result<Client::Credentials> Client::CurrentCredentials() {
  Credentials creds;
  creds.token = config_.token;
  creds.client_cert_data = config_.client_cert_data;
  creds.client_key_data = config_.client_key_data;
  MutexLock lock(&mu_);
  if (!config_.token_file.empty()) {
    // Service account tokens are rotated on disk; reread now and then, as client-go does.
    int64_t now = MonotonicMillis();
    if (file_token_.empty() || now - file_token_read_ms_ > kTokenFileRereadMs) {
      Result<std::string> text = ReadFile(config_.token_file);
      if (!text.ok()) return text.status().WithContext("reading the token file");
      file_token_ = *text;
      while (!file_token_.empty() && std::isspace(static_cast<unsigned char>(file_token_.back())))
        file_token_.pop_back();
      file_token_read_ms_ = now;
    }
    creds.token = file_token_;
  }
  if (!config_.exec.command.empty()) {
    if (exec_cache_ == nullptr ||
        (exec_cache_->expires_ms != 0 && NowMillis() >= exec_cache_->expires_ms)) {
      TAU_ASSIGN_OR_RETURN(ExecCredential cred, RunExecPlugin(config_.exec));
      exec_cache_ = std::make_unique<Credentials>(
          Credentials{cred.token, cred.client_cert_data, cred.client_key_data, cred.expires_ms});
    }
    if (!exec_cache_->token.empty()) creds.token = exec_cache_->token;
    if (!exec_cache_->client_cert_data.empty()) {
      creds.client_cert_data = exec_cache_->client_cert_data;
      creds.client_key_data = exec_cache_->client_key_data;
    }
  }
  return creds;
}

void Client::ForgetExecCredentials() {
  MutexLock lock(&mu_);
  exec_cache_.reset();
}

Status Client::Perform(const Request& request, Transfer* transfer,
                       const std::function<bool(std::string_view)>* on_data,
                       const std::atomic<bool>* stop) {
  TAU_ASSIGN_OR_RETURN(const CurlLib* curl, LoadCurl());
  TAU_ASSIGN_OR_RETURN(Credentials creds, CurrentCredentials());
  Handle* handle = TakeHandle();
  if (handle == nullptr) return Internal("curl_easy_init failed");
  struct Lease {
    Client* client;
    Handle* handle;
    bool performed = false;
    ~Lease() { client->GiveBack(handle, performed); }
  } lease{this, handle};
  CURL* easy = handle->easy;
  CURLM* multi = handle->multi;
  TransferContext ctx{curl,
                      easy,
                      &transfer->body,
                      &transfer->retry_after,
                      &transfer->streamed_bytes,
                      on_data,
                      stop,
                      false,
                      false,
                      false};
  std::string url = config_.server + request.path;
  curl_slist* connect_to = nullptr;
  if (!config_.tls_server_name.empty() && StartsWith(config_.server, "https://")) {
    // The certificate is checked against (and SNI names) tls-server-name, while the connection
    // goes to the server's own address.
    std::string host, port;
    SplitServer(config_.server, &host, &port);
    url = fmt::format("https://{}:{}{}", config_.tls_server_name, port, request.path);
    connect_to = curl->slist_append(
        nullptr, fmt::format("{}:{}:{}:{}", config_.tls_server_name, port, host, port).c_str());
    curl->easy_setopt(easy, CURLOPT_CONNECT_TO, connect_to);
  }
  struct FreeList {
    const CurlLib* curl;
    curl_slist* list;
    ~FreeList() {
      if (list != nullptr) curl->slist_free_all(list);
    }
  } free_connect_to{curl, connect_to};
  curl->easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl->easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl->easy_setopt(easy, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl->easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                    static_cast<long>(options_.connect_timeout_ms));
  int64_t timeout_ms = request.streaming ? request.stream_timeout_ms : options_.request_timeout_ms;
  if (!request.streaming && call_deadline_ms != 0) {
    int64_t left = call_deadline_ms - MonotonicMillis();
    if (left <= 0) {
      return Unavailable(
          fmt::format("{} {}: the call's time budget ran out", request.method, request.path));
    }
    timeout_ms = std::min(timeout_ms, left);
  }
  if (timeout_ms > 0) curl->easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl->easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl->easy_setopt(easy, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl->easy_setopt(easy, CURLOPT_WRITEDATA, &ctx);
  curl->easy_setopt(easy, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl->easy_setopt(easy, CURLOPT_HEADERDATA, &ctx);
  curl->easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
  curl->easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl->easy_setopt(easy, CURLOPT_XFERINFODATA, &ctx);
  if (request.method == "GET") {
    curl->easy_setopt(easy, CURLOPT_HTTPGET, 1L);
  } else {
    curl->easy_setopt(easy, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    if (!request.content_type.empty()) {
      curl->easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE,
                        static_cast<curl_off_t>(request.body.size()));
      curl->easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, request.body.c_str());
    }
  }
  // TLS. Certificates given as data go to libcurl as blobs: no temporary files with keys in them.
  if (!config_.ca_data.empty()) {
    curl_blob blob = Blob(config_.ca_data);
    curl->easy_setopt(easy, CURLOPT_CAINFO_BLOB, &blob);
  } else if (!config_.ca_file.empty()) {
    curl->easy_setopt(easy, CURLOPT_CAINFO, config_.ca_file.c_str());
  }
  if (config_.insecure_skip_tls_verify) {
    curl->easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L);
    curl->easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!creds.client_cert_data.empty()) {
    curl_blob cert = Blob(creds.client_cert_data);
    curl_blob key = Blob(creds.client_key_data);
    curl->easy_setopt(easy, CURLOPT_SSLCERTTYPE, "PEM");
    curl->easy_setopt(easy, CURLOPT_SSLCERT_BLOB, &cert);
    curl->easy_setopt(easy, CURLOPT_SSLKEYTYPE, "PEM");
    curl->easy_setopt(easy, CURLOPT_SSLKEY_BLOB, &key);
  } else if (!config_.client_cert_file.empty()) {
    curl->easy_setopt(easy, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
    curl->easy_setopt(easy, CURLOPT_SSLKEY, config_.client_key_file.c_str());
  }
  curl_slist* headers = curl->slist_append(nullptr, "Accept: application/json");
  headers = curl->slist_append(headers, "Expect:");  // no 100-continue round trip
  if (!request.content_type.empty())
    headers = curl->slist_append(headers, ("Content-Type: " + request.content_type).c_str());
  if (!creds.token.empty())
    headers = curl->slist_append(headers, ("Authorization: Bearer " + creds.token).c_str());
  curl->easy_setopt(easy, CURLOPT_HTTPHEADER, headers);

  // The multi interface instead of curl_easy_perform, which waits up to a second between checks
  // of the progress callback: a watch must stop promptly when asked.
  curl->multi_add_handle(multi, easy);
  lease.performed = true;
  int running = 1;
  bool abandoned = false;  // the CallBudget's stop flag was raised
  while (running > 0) {
    if (curl->multi_perform(multi, &running) != CURLM_OK) break;
    if (running == 0) break;
    if (stop != nullptr && stop->load()) {
      transfer->stopped = true;
      break;
    }
    if (!request.streaming && call_stop != nullptr && call_stop->load()) {
      abandoned = true;
      break;
    }
    curl->multi_poll(multi, nullptr, 0, 50, nullptr);
  }
  CURLcode result = CURLE_OK;
  int left = 0;
  while (CURLMsg* msg = curl->multi_info_read(multi, &left))
    if (msg->msg == CURLMSG_DONE) result = msg->data.result;
  long code = 0;
  curl->easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
  transfer->http_status = static_cast<int>(code);
  curl->multi_remove_handle(multi, easy);
  curl->slist_free_all(headers);

  if (abandoned)
    return Unavailable(fmt::format("{} {}: abandoned (stopping)", request.method, request.path));
  if (transfer->stopped || ctx.consumer_done || result == CURLE_ABORTED_BY_CALLBACK) {
    transfer->stopped = true;
    return Status::Ok();
  }
  if (result != CURLE_OK) {
    std::string text = fmt::format("{} {}{}: {}", request.method, config_.server, request.path,
                                   curl->easy_strerror(result));
    return Status(
        RetryableCurlError(result) ? StatusCode::kUnavailable : StatusCode::kFailedPrecondition,
        text);
  }
  return Status::Ok();
}

Status Client::Exchange(const Request& request, Transfer* transfer,
                        const std::function<bool(std::string_view)>* on_data,
                        const std::atomic<bool>* stop) {
  const std::string what = fmt::format("{} {}", request.method, request.path);
  bool refreshed_credentials = false;
  for (int attempt = 1;; ++attempt) {
    *transfer = Transfer();
    Status status = Perform(request, transfer, on_data, stop);
    if (transfer->stopped) return Status::Ok();
    bool retryable = false;
    if (!status.ok()) {
      // A stream that already delivered data is not replayed: the caller resumes it (a watch
      // from its last resourceVersion).
      retryable = status.code() == StatusCode::kUnavailable && transfer->streamed_bytes == 0;
    } else if (transfer->http_status >= 200 && transfer->http_status < 300) {
      return Status::Ok();
    } else if (transfer->http_status == 401 && !config_.exec.command.empty() &&
               !refreshed_credentials) {
      // The plugin's token may have been revoked or expired early: run it again, once.
      ForgetExecCredentials();
      refreshed_credentials = true;
      --attempt;
      continue;
    } else {
      status = HttpError(transfer->http_status, what, transfer->body);
      retryable = transfer->http_status == 429 || transfer->http_status >= 500;
    }
    if (!retryable) return status;
    if (attempt >= options_.max_attempts)
      return Status(status.code(),
                    fmt::format("{} (gave up after {} attempts)", status.message(), attempt));
    int wait_ms = BackoffMs(options_, attempt, RetryAfterMs(transfer->retry_after, transfer->body));
    if (!request.streaming && call_deadline_ms != 0 &&
        MonotonicMillis() + wait_ms >= call_deadline_ms)
      return Unavailable(
          fmt::format("{} (gave up after {} attempts: the call's time budget ran out)",
                      status.message(), attempt));
    for (int waited = 0; waited < wait_ms; waited += 10) {
      if (stop != nullptr && stop->load()) return Status::Ok();
      if (!request.streaming && call_stop != nullptr && call_stop->load())
        return Unavailable(fmt::format("{} (abandoned: stopping)", status.message()));
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10, wait_ms - waited)));
    }
  }
}

Result<nlohmann::json> Client::Call(const Request& request) {
  Transfer transfer;
  TAU_RETURN_IF_ERROR(Exchange(request, &transfer, nullptr, nullptr));
  nlohmann::json doc = nlohmann::json::parse(transfer.body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return Internal(fmt::format("{} {}: the answer is not JSON", request.method, request.path));
  return doc;
}

}  // namespace tau::kubeapi
