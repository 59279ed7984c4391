// The controller's evidence side (docs/evidence.md): metric collection and GPU samples of running
// attempts (from the decision thread), the record assembled from the store and the run's files, the
// final record saved by a thread of its own once a run has ended (so that hashing logs never holds
// up decisions), and retention.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "evidence/evidence.h"
#include "health/health.h"
#include "store/store.h"

namespace tau::server {

class EvidenceWorker {
 public:
  // Fills what the record says of where a run ran (host, OS, driver, Python and packages); the
  // backend knows. `prev` is the run's previous record, if any; `final_save` is set for the record
  // saved when the run ended.
  using DescribeRuntime =
      std::function<void(const store::RunRecord& r, bool final_save,
                         const evidence::RecordInput* prev, evidence::RuntimeInfo* rt)>;
  EvidenceWorker(std::string home, store::Store* store, Clock* clock, health::GpuInventory gpus,
                 DescribeRuntime describe);
  ~EvidenceWorker();

  void Start();
  // Saves the final records already handed off, then stops the worker thread.
  void Stop();

  // From the decision thread only.
  // Reads the attempt's new metric points into the run's evidence.
  void PollMetrics(const std::string& name, int attempt);
  // Polls the metrics of running attempts (every 2 s) and appends the GPU samples of the GPUs
  // they hold.
  void Tick(const std::vector<RunningAttempt>& running,
            const std::vector<std::vector<evidence::GpuSample>>& samples);
  // Gives an ended run's record (as the loop committed it) and its metrics collector to the
  // worker, which compacts the metrics and saves the final record.
  void HandOff(const std::string& name, store::RunRecord ended);

  // From any thread: these read the store and the run's files, never the loop's state.
  // The record: assembled now for a run that has not ended, else the one saved when it ended.
  Result<nlohmann::json> Record(const std::string& name);
  // What ExportBundle needs: the record's input and where the logs and metrics are.
  Status Sources(const std::string& name, evidence::RecordInput* input,
                 evidence::BundleSources* sources);
  // Prunes the logs and GPU samples of runs that ended longer ago than the policy keeps them; the
  // record keeps their hashes.
  Status ApplyRetention(const evidence::RetentionPolicy& policy, int64_t now_ms);

 private:
  void Work();
  Result<evidence::RecordInput> Assemble(const store::RunRecord& r,
                                         const evidence::MetricHistory& history,
                                         const evidence::MetricsStats& stats, bool final_save);
  // `ended`: the run's record as the loop committed it, when the caller has it (else it is read).
  Result<nlohmann::json> SaveFinal(const std::string& name,
                                   const evidence::MetricsCollector* collector,
                                   const store::RunRecord* ended = nullptr);
  std::string Dir(const std::string& name) const;

  const std::string home_;
  store::Store* const store_;
  Clock* const clock_;
  const health::GpuInventory gpus_;
  const DescribeRuntime describe_;

  struct FinalRecord {
    std::string name;
    std::unique_ptr<evidence::MetricsCollector> metrics;  // may be null
    store::RunRecord ended;                               // as committed by the loop
  };
  std::thread thread_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ TAU_GUARDED_BY(mu_) = false;
  std::deque<FinalRecord> queue_ TAU_GUARDED_BY(mu_);
  std::map<std::string, evidence::MetricsStats> metrics_stats_ TAU_GUARDED_BY(mu_);
  Mutex record_save_mu_;  // one writer of a record.json at a time (worker, API, retention)

  // Owned by the decision thread.
  std::map<std::string, std::unique_ptr<evidence::MetricsCollector>> collectors_;
  int64_t last_metrics_poll_ms_ = 0;
};

}  // namespace tau::server
