// The server's own Prometheus metrics: counters and histograms kept in memory (they start from zero
// when the server starts, which Prometheus's rate() handles), rendered in the text exposition
// format together with gauges computed at scrape time (runs, queues, GPUs).
//
// Label values come from small closed sets (states, failure classes, queue names, route patterns):
// never run names, so series stay few however many runs pass through.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace tau::server {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Metrics {
 public:
  Metrics();

  // Adds `delta` to a counter (declared in metrics.cc with its help text).
  void Count(const std::string& name, const Labels& labels, double delta = 1);
  // Records one observation in a histogram (in seconds).
  void Observe(const std::string& name, const Labels& labels, double seconds);

  // Counters and histograms in the text format, each family with # HELP and # TYPE.
  std::string Render() const;

 private:
  struct Histogram {
    std::vector<uint64_t> buckets;  // cumulative counts are computed at render time
    uint64_t count = 0;
    double sum = 0;
  };
  struct Family {
    std::string help;
    bool histogram = false;
    std::vector<double> bounds;  // histograms: bucket upper bounds, ascending
    std::map<Labels, double> counters;
    std::map<Labels, Histogram> histograms;
  };
  mutable Mutex mu_;
  std::map<std::string, Family> families_ TAU_GUARDED_BY(mu_);
};

// One gauge family in the text format: "# HELP", "# TYPE name gauge" and a line per sample.
std::string RenderGauge(const std::string& name, const std::string& help,
                        const std::vector<std::pair<Labels, double>>& samples);

// A label value escaped for the text format (backslash, quote, newline).
std::string EscapeLabelValue(const std::string& value);

}  // namespace tau::server
