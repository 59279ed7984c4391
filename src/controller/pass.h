// A feature of the decision loop as a pass (DuckDB's optimizer passes; Kueue's watchers): one
// class with its own state and its own test, run from the controller's one ordered list, told of
// the runs that enter the loop and of the runs that end instead of being called from Finish.
// Internal to the controller; everything here runs on the decision thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/active_run.h"
#include "store/store.h"

namespace tau::server {

// What a pass sees of the loop.
class PassHost {
 public:
  virtual ~PassHost() = default;
  virtual std::map<std::string, ActiveRun>& active() = 0;
  virtual int64_t Now() = 0;
  // The engine's view of the run is to be brought up to date this pass (it may enter its queue).
  virtual void EngineChanged(const std::string& run) = 0;
  virtual store::Store* store() = 0;
  // Where a run's checkpoints ("checkpoint") or outputs ("output") go.
  virtual std::string StorageDir(const store::RunRecord& run, const std::string& role) const = 0;
  // Ends a run that has no attempt running (as the controller's Finish: metered, released, its
  // passes told).
  virtual void EndRun(ActiveRun& run, store::RunState state, const std::string& reason,
                      const std::string& message, store::Batch* batch) = 0;
};

class RunPass {
 public:
  virtual ~RunPass() = default;
  virtual const char* Name() const = 0;
  // A run entered the loop: submitted, or recovered after a restart (recovered runs come in
  // submission order, after the runs that hold quota or run).
  virtual void RunAdded(ActiveRun&, bool recovered) {}
  // A run ended: `r` holds its final state.
  virtual void RunEnded(const store::RunRecord& r) {}
  // Its step of each pass (after the inbox's news, before the engine is synced and the backend
  // schedules), in the list's order.
  virtual void Apply(store::Batch*) {}
  // Whether it has work for a pass at once (the loop does not sleep).
  virtual bool Busy() const { return false; }
  // Why a run this pass holds back waits, as PendingInfo says it (null: it holds nothing of it).
  virtual nlohmann::json Pending(const ActiveRun&) { return nullptr; }
};

}  // namespace tau::server
