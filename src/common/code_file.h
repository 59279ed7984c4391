// One file of a run's code directory, as the CLI walks it, the API carries it, the server stores
// it in a snapshot and the Kubernetes backend inlines it into a run's objects.
#pragma once

#include <string>

namespace tau {

struct CodeFile {
  std::string path;  // relative to the code directory, '/'-separated, no '..', no leading '/'
  int mode = 0644;
  std::string data;
};

}  // namespace tau
