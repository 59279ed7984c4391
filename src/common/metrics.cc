#include "common/metrics.h"
#include "common/mutex.h"

#include <cmath>

#include <fmt/format.h>

namespace tau::server {
namespace {

// Seconds: from a fast API call to a days-long run.
const std::vector<double> kLatencyBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                            0.1,    0.25,  0.5,    1,     2.5,  5,     10};
const std::vector<double> kWaitBounds = {0.01, 0.1,  1,     10,    60,    300,
                                         900,  3600, 14400, 43200, 86400, 259200};

std::string LabelText(const Labels& labels, const std::string& extra_name = "",
                      const std::string& extra_value = "") {
  std::string out;
  auto add = [&](const std::string& k, const std::string& v) {
    out += out.empty() ? "{" : ",";
    out += k + "=\"" + EscapeLabelValue(v) + "\"";
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (!extra_name.empty()) add(extra_name, extra_value);
  return out.empty() ? out : out + "}";
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

Metrics::Metrics() {
  MutexLock lock(&mu_);  // no one else sees it yet; the analysis wants it held all the same
  auto counter = [&](const char* name, const char* help)
                     TAU_REQUIRES(mu_) { families_[name].help = help; };
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& bounds)
                       TAU_REQUIRES(mu_) {
                         Family& f = families_[name];
                         f.help = help;
                         f.histogram = true;
                         f.bounds = bounds;
                       };
  counter("tau_attempts_total", "Attempts that ended, by failure class (Succeeded included).");
  counter("tau_preemptions_total", "Runs preempted by the admission engine, by queue and reason.");
  counter("tau_runs_submitted_total", "Runs accepted at submission, by workspace and queue.");
  counter("tau_code_blobs_uploaded_total",
          "Code file contents (blobs) uploaded and stored; one the server held already is not "
          "counted.");
  counter("tau_code_missing_checks_total",
          "Manifests checked for the blobs the server lacks without submitting (POST "
          "/api/v1/code/missing); tau run submits first and is told them only when some are.");
  counter("tau_code_blob_bytes_uploaded_total",
          "Bytes of the blobs counted in "
          "tau_code_blobs_uploaded_total.");
  counter("tau_http_refused_total",
          "API requests refused (401, 403, 429, 503) by status and route pattern; each is counted, "
          "the audit trail holds a sample.");
  counter("tau_http_connections_refused_total",
          "Connections or requests refused or cut off by a limit, by reason (connection_limit, "
          "peer_connection_limit, unproven_connection_limit, identity_connection_limit, "
          "header_deadline, body_deadline, body_budget).");
  counter("tau_serve_requests_total",
          "Requests through a service's endpoint (/serve/NAME/), by service and status class "
          "(2xx, 4xx, 5xx; error: no replica answered).");
  counter("tau_serve_retries_total",
          "Requests sent again to another replica after the first one failed, by service.");
  counter("tau_webhook_deliveries_total",
          "Webhook deliveries by workspace and result (delivered; failed: a try that will be "
          "repeated; dropped: given up after a day, or pushed out of a full queue).");
  counter("tau_serve_replica_restarts_total",
          "Replica attempts that ended and were restarted, by service and failure class.");
  histogram("tau_serve_request_duration_seconds",
            "Time from a request reaching a service's endpoint to its replica's whole answer, by "
            "service.",
            kLatencyBounds);
  histogram("tau_admission_wait_seconds",
            "Time from entering the queue to being admitted and placed, by queue.", kWaitBounds);
  histogram("tau_run_duration_seconds", "Time from a run's first start to its end, by final state.",
            kWaitBounds);
  histogram("tau_http_request_duration_seconds",
            "API request handling time by method and route pattern (streams: until headers).",
            kLatencyBounds);
  histogram("tau_store_commit_duration_seconds",
            "Time to commit one batch of state changes to the store (fsync included).",
            kLatencyBounds);
}

void Metrics::Count(const std::string& name, const Labels& labels, double delta) {
  MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.histogram) return;  // undeclared: a programming error
  it->second.counters[labels] += delta;
}

void Metrics::Observe(const std::string& name, const Labels& labels, double seconds) {
  MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end() || !it->second.histogram) return;
  Family& f = it->second;
  Histogram& h = f.histograms[labels];
  if (h.buckets.empty()) h.buckets.assign(f.bounds.size(), 0);
  for (size_t i = 0; i < f.bounds.size(); ++i)
    if (seconds <= f.bounds[i]) {
      ++h.buckets[i];
      break;
    }
  ++h.count;
  h.sum += seconds;
}

std::string Metrics::Render() const {
  MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, f.help, name,
                       f.histogram ? "histogram" : "counter");
    if (!f.histogram) {
      for (const auto& [labels, v] : f.counters)
        out += fmt::format("{}{} {}\n", name, LabelText(labels), Number(v));
      continue;
    }
    for (const auto& [labels, h] : f.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < f.bounds.size(); ++i) {
        cumulative += h.buckets[i];
        out += fmt::format("{}_bucket{} {}\n", name, LabelText(labels, "le", Number(f.bounds[i])),
                           cumulative);
      }
      out += fmt::format("{}_bucket{} {}\n", name, LabelText(labels, "le", "+Inf"), h.count);
      out += fmt::format("{}_sum{} {}\n", name, LabelText(labels), Number(h.sum));
      out += fmt::format("{}_count{} {}\n", name, LabelText(labels), h.count);
    }
  }
  return out;
}

std::string RenderGauge(const std::string& name, const std::string& help,
                        const std::vector<std::pair<Labels, double>>& samples) {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, help, name);
  for (const auto& [labels, v] : samples)
    out += fmt::format("{}{} {}\n", name, LabelText(labels), Number(v));
  return out;
}

}  // namespace tau::server
