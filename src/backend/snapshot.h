// Code snapshots: the files of a run's code directory as they were at submission, stored once per
// content digest under $TAU_HOME/snapshots/<sha256>, their files read-only (0444, 0555) and linked
// to the blob store's. Later edits of the user's files never change a queued run.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/code_file.h"
#include "common/limits.h"
#include "common/status.h"

namespace tau::server {

struct Snapshot {
  std::string digest;  // sha256 over the sorted (path, mode, sha256 of content) list
  std::string dir;
  nlohmann::json files;  // [{"path","size","sha256","mode"}]
};

// A code path is plain and relative: not empty or absolute, no '.', '..' or '//' parts, within the
// length limits. The error says which rule it breaks.
Status CheckCodePath(const std::string& path);

// Whether `text` is a sha256 digest as blobs are named: 64 lowercase hex digits.
bool IsSha256Hex(std::string_view text);

// A manifest checked as a snapshot would be: every path, the file count and the declared total
// size within the limits, no path twice, no file that is also a directory; sorted by path, with
// the snapshot's digest. Nothing is read: the sizes are the client's word until the blobs come.
struct Manifest {
  std::vector<CodeManifestEntry> files;
  std::string digest;
};
Result<Manifest> CheckManifest(std::vector<CodeManifestEntry> files);

// The blob store ($TAU_HOME/blobs): each code file's content once, named by its sha256, read-only
// (0444), shared by every user's snapshots (it is content-addressed: a blob says nothing of whose
// code it is). A blob no snapshot links to (link count 1) is garbage once a day old.
//
// Stores `data` as blob `sha256` after checking that it is that content and within the per-run
// limit; written beside, fsynced and renamed into place. True when it was not stored before.
Result<bool> StoreBlob(const std::string& blobs_root, const std::string& sha256,
                       std::string_view data);
// The digests of `manifest`'s blobs that are not stored, each once; none when its snapshot is
// stored already (then nothing needs uploading).
std::vector<std::string> MissingBlobs(const std::string& snapshots_root,
                                      const std::string& blobs_root, const Manifest& manifest);
// Removes the blobs no snapshot links to that are older than `min_age_s`; returns how many, and
// adds the digests of those removed to `removed` when it is given.
int RemoveUnreferencedBlobs(const std::string& blobs_root, int64_t min_age_s,
                            std::vector<std::string>* removed = nullptr);

// Assembles the snapshot of `manifest` from the blob store (a file is a hard link to its blob, or
// a read-only copy of it when its mode differs), unless it is stored already. FailedPrecondition
// names a blob that is missing or whose size is not the manifest's.
Result<Snapshot> StoreSnapshot(const std::string& snapshots_root, const std::string& blobs_root,
                               const Manifest& manifest);
// The same from the files themselves (an inline submission): their blobs are stored first.
Result<Snapshot> StoreSnapshot(const std::string& snapshots_root, const std::string& blobs_root,
                               std::vector<CodeFile> files);

// The files of a stored snapshot (the Kubernetes backend ships them inside the run's object).
Result<std::vector<CodeFile>> ReadSnapshot(const std::string& snapshot_dir);

}  // namespace tau::server
