// Where things live under TAU_HOME, in one place (as LevelDB's db/filename.h does for a
// database's files). Every path the server and the CLI build under the home directory comes from
// here; the names are part of an installed server's state and never change:
//
//   HOME/tau.db                      the store (SQLite)
//   HOME/tau.sock                    the API's Unix socket (unless --socket says otherwise)
//   HOME/server.lock                 held by the one server of this home
//   HOME/server.pid                  the running server's pid
//   HOME/server.log                  the output of a server the CLI started
//   HOME/platform.yaml               the applied platform
//   HOME/snapshots/SHA256            code snapshots, one per content digest
//   HOME/blobs/SHA256                code file contents, one per digest (snapshots link them)
//   HOME/venvs[/uid-UID]             the virtualenv cache (per submitter when runs run as them)
//   HOME/python/sitecustomize.py     the Python hook of stalled runs' stack dumps (runtime.h)
//   HOME/runs/RUN                    one run
//   HOME/runs/RUN/work               its working directory
//   HOME/runs/RUN/metrics.jsonl      the metrics its workload writes
//   HOME/runs/RUN/attempts/N         one attempt (logs/rank-R.log, config.json, shim.log)
//   HOME/runs/RUN/evidence           its evidence (record.json, metrics.jsonl, ...; evidence.h)
#pragma once

#include <string>

namespace tau::layout {

std::string StoreFile(const std::string& home);
std::string SocketPath(const std::string& home);
std::string LockFile(const std::string& home);
std::string PidFile(const std::string& home);
std::string ServerLog(const std::string& home);
std::string PlatformFile(const std::string& home);
std::string SnapshotsDir(const std::string& home);
std::string BlobsDir(const std::string& home);
std::string VenvsDir(const std::string& home);
std::string VenvsDir(const std::string& home, unsigned uid);
std::string PythonHookDir(const std::string& home);
std::string RunsDir(const std::string& home);
std::string RunDir(const std::string& home, const std::string& run);
std::string WorkDir(const std::string& run_dir);
std::string AttemptDir(const std::string& home, const std::string& run, int attempt);
std::string EvidenceDir(const std::string& home, const std::string& run);
// HOME/services/NAME: what the server keeps of a service beside its record, and in its logs/ the
// kept logs of its replica pods on Kubernetes (POD.log; on the local backend replicas are runs,
// with their runs' logs).
std::string ServiceDir(const std::string& home, const std::string& service);
std::string ServiceLogsDir(const std::string& home, const std::string& service);
// DIR/metrics.jsonl: in a run's directory, what its workload writes; in its evidence directory,
// the points collected from it.
std::string MetricsFile(const std::string& dir);

}  // namespace tau::layout
