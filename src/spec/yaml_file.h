// The strict reading every YAML file tau reads gets, for the files that are not run specs (workflow
// and sweep files): the run-spec reader's text checks and its YAML loading, and no key given twice
// in any mapping. A file kind's own reader then reads the fields of the node it returns.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace tau::spec {

// `text` (a file called `file`, a `kind` such as "workflow file") as one YAML mapping: its size,
// encoding, control characters, lone CRs, unclosed quotes, tabs in indentation, syntax errors, a
// second document, a top level that is no mapping, and a key given twice anywhere (at the second,
// naming the first) are errors, every one as "FILE:LINE:COL: error: ...".
Result<YAML::Node> LoadStrictYaml(std::string_view text, const std::string& file,
                                  std::string_view kind);

}  // namespace tau::spec
