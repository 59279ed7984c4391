// One file of a run's code directory, as the CLI walks it, the API carries it, the server stores
// it in a snapshot and the Kubernetes backend inlines it into a run's objects.
#pragma once

#include <cstdint>
#include <string>

namespace tau {

struct CodeFile {
  std::string path;  // relative to the code directory, '/'-separated, no '..', no leading '/'
  int mode = 0644;
  std::string data;
};

// One file of a code manifest: what `tau run` sends instead of the file, so that the server is
// sent only the contents (blobs, by sha256) it does not hold.
struct CodeManifestEntry {
  std::string path;  // as CodeFile::path
  int mode = 0644;
  int64_t size = 0;
  std::string sha256;  // of the content, lowercase hex
};

}  // namespace tau
