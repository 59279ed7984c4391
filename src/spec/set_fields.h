// spec::SetFields: a spec's fields named as `tau run --set` takes them (tau compare's names).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spec/spec.h"

namespace tau::spec {

// The fields a spec's YAML gives, with `overrides` applied, each as `tau run --set NAME=VALUE`
// takes it: NAME in the file's own shape (compute.gpus, runtime.env.LR, run.args,
// storage.image_assets[0].image), VALUE as --set reads it (a list of values or a mapping that is
// a field's whole value in flow style: [a, b], {K: v}). Empty when the text is not a spec.
std::vector<std::pair<std::string, std::string>> SetFields(std::string_view text,
                                                           const std::vector<Override>& overrides);

}  // namespace tau::spec
