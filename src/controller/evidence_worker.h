// The controller's evidence side (docs/evidence.md): metric collection and GPU samples of running
// attempts, on a thread of their own (the decision thread only says which attempts run and which
// ended), the record assembled from the store and the run's files, the final record saved by
// another thread once a run has ended (so that hashing logs never holds up decisions), and
// retention.
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
#include "backend/inbox.h"
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
  // `post` hands a message to the decision thread (a run's MetricsLimited notice, MetricsDrained).
  using Post = std::function<void(InboxMessage)>;
  EvidenceWorker(std::string home, store::Store* store, Clock* clock, health::GpuInventory gpus,
                 DescribeRuntime describe, Post post);
  ~EvidenceWorker();

  void Start();
  // Reads the last points of the attempts that ended, saves the final records already handed off,
  // then stops the worker threads.
  void Stop();

  // From the decision thread only. Each is a few fields set under a lock: no I/O.
  // The attempts running now (their metrics are read every 2 s) and the GPU samples taken since
  // the last call (appended to the runs holding those GPUs).
  void Tick(const std::vector<RunningAttempt>& running,
            std::vector<std::vector<evidence::GpuSample>> samples);
  // The attempt's processes are gone: its metrics file is read to its end, as its points.
  void AttemptEnded(const std::string& name, int attempt);
  // True until an ended attempt's points are all read: the run's next attempt must not start
  // before (it appends to the same file). A MetricsDrained message says when it is over.
  bool Draining(const std::string& name);
  // Gives an ended run's record (as the loop committed it) to the worker, which reads what is
  // left of its metrics, compacts them and saves the final record.
  void HandOff(const std::string& name, store::RunRecord ended);

  // From any thread: these read the store and the run's files, never the loop's state.
  // The record: assembled now for a run that has not ended, else the one saved when it ended.
  Result<nlohmann::json> Record(const std::string& name);
  // What ExportBundle needs: the record's input and where the logs and metrics are.
  Status Sources(const std::string& name, evidence::RecordInput* input,
                 evidence::BundleSources* sources);
  // Prunes the logs and GPU samples of runs that ended longer ago than the policy keeps them; the
  // record keeps their hashes. Reads only the runs due (the store's queue), kRetentionBatch at a
  // time.
  Status ApplyRetention(const evidence::RetentionPolicy& policy, int64_t now_ms);
  static constexpr int64_t kRetentionBatch = 64;
  // The ingestion totals of a run's metrics (refused points included): the metrics thread's while
  // it reads them, else the ones it saved.
  Result<evidence::MetricsStats> MetricsStats(const std::string& name);

 private:
  void Work();
  void MetricsWork();
  // One bounded read of the run's metrics file as points of `attempt`; true when more is there.
  // `r`: the run's record when the caller has it (else it is read to open the collector).
  bool PollOnce(const std::string& name, int attempt, const store::RunRecord* r);
  void AppendSamples(const std::vector<RunningAttempt>& running,
                     const std::vector<std::vector<evidence::GpuSample>>& samples);
  // The metrics of a run without a collector: the saved totals and a summary of the file.
  evidence::MetricsInfo MetricsOf(const std::string& name);
  Result<evidence::RecordInput> Assemble(const store::RunRecord& r, evidence::MetricsInfo metrics,
                                         bool final_save);
  // A workflow stage's upstream runs, from its last UpstreamReady event, each checkpoint digested
  // once (`before`: the lineage a former record of the run computed).
  std::vector<evidence::LineageEntry> Lineage(const std::vector<store::Event>& events,
                                              const std::vector<evidence::LineageEntry>* before);
  // `metrics`: what the collector's compaction found (else the file is summarised now).
  // `ended`: the run's record as the loop committed it, when the caller has it (else it is read).
  Result<nlohmann::json> SaveFinal(const std::string& name, const evidence::MetricsInfo* metrics,
                                   const store::RunRecord* ended = nullptr);
  std::string Dir(const std::string& name) const;
  // Prunes `kind` of one ended run: its record says so first, then the files go. When it was
  // pruned (now, or before, as its record says); nullopt while it has no final record.
  Result<std::optional<int64_t>> PruneRun(const std::string& name, store::PruneKind kind,
                                          int64_t now_ms);

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
  const Post post_;
  std::thread thread_;          // final records
  std::thread metrics_thread_;  // metrics and GPU samples
  Mutex mu_;
  CondVar cv_;                                       // the final records' thread waits on it
  CondVar metrics_cv_;                               // the metrics thread waits on it
  bool stopping_ TAU_GUARDED_BY(mu_) = false;        // the metrics thread: finish, then stop
  bool final_stopping_ TAU_GUARDED_BY(mu_) = false;  // the final records' thread
  bool metrics_kick_ TAU_GUARDED_BY(mu_) = false;    // something for the metrics thread now
  std::deque<FinalRecord> queue_ TAU_GUARDED_BY(mu_);
  std::map<std::string, evidence::MetricsStats> metrics_stats_ TAU_GUARDED_BY(mu_);
  std::vector<RunningAttempt> running_ TAU_GUARDED_BY(mu_);
  std::map<std::string, int> ended_ TAU_GUARDED_BY(mu_);  // run -> attempt whose points are read
  std::deque<std::pair<std::string, store::RunRecord>> ending_ TAU_GUARDED_BY(mu_);
  std::deque<std::vector<evidence::GpuSample>> samples_ TAU_GUARDED_BY(mu_);
  Mutex record_save_mu_;  // one writer of a record.json at a time (worker, API, retention)

  // Owned by the metrics thread.
  struct Collector {
    std::unique_ptr<evidence::MetricsCollector> collector;
    bool told_points = false, told_series = false;  // MetricsLimited posted (or was, before)
    std::string workspace;
    int64_t max_points = 0, max_series = 0;  // the run's limits, for its notice
    // The spec's metrics.history globs and the output directory they are relative to.
    std::vector<std::string> history;
    std::string output_dir;
    bool told_history_cap = false;  // the run's globs matched more than kMaxHistoryFiles
  };
  // Files of one run's metrics.history followed at once; more are left out (and said once).
  static constexpr size_t kMaxHistoryFiles = 64;
  // Polls the files matching the run's metrics.history globs; true when one has more to read.
  bool PollHistory(const std::string& name, Collector& c, int attempt);
  std::map<std::string, Collector> collectors_;
};

}  // namespace tau::server
