#include "common/layout.h"

namespace tau::layout {

std::string StoreFile(const std::string& home) { return home + "/tau.db"; }
std::string SocketPath(const std::string& home) { return home + "/tau.sock"; }
std::string LockFile(const std::string& home) { return home + "/server.lock"; }
std::string PidFile(const std::string& home) { return home + "/server.pid"; }
std::string ServerLog(const std::string& home) { return home + "/server.log"; }
std::string PlatformFile(const std::string& home) { return home + "/platform.yaml"; }
std::string SnapshotsDir(const std::string& home) { return home + "/snapshots"; }
std::string BlobsDir(const std::string& home) { return home + "/blobs"; }
std::string VenvsDir(const std::string& home) { return home + "/venvs"; }
std::string VenvsDir(const std::string& home, unsigned uid) {
  return VenvsDir(home) + "/uid-" + std::to_string(uid);
}
std::string PythonHookDir(const std::string& home) { return home + "/python"; }
std::string RunsDir(const std::string& home) { return home + "/runs"; }
std::string RunDir(const std::string& home, const std::string& run) {
  return RunsDir(home) + "/" + run;
}
std::string WorkDir(const std::string& run_dir) { return run_dir + "/work"; }
std::string AttemptDir(const std::string& home, const std::string& run, int attempt) {
  return RunDir(home, run) + "/attempts/" + std::to_string(attempt);
}
std::string EvidenceDir(const std::string& home, const std::string& run) {
  return RunDir(home, run) + "/evidence";
}
std::string ServiceDir(const std::string& home, const std::string& service) {
  return home + "/services/" + service;
}
std::string ServiceLogsDir(const std::string& home, const std::string& service) {
  return ServiceDir(home, service) + "/logs";
}
std::string MetricsFile(const std::string& dir) { return dir + "/metrics.jsonl"; }

}  // namespace tau::layout
