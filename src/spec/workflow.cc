#include "spec/workflow.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"
#include "spec/spec.h"
#include "spec/yaml_file.h"

namespace tau::spec {
namespace {

constexpr const char* kConditionNames[] = {"succeeded", "finished"};

// Collects errors at their place in the file; the parse goes on, so all of them are said at once.
struct Errors {
  const std::string& file;
  std::vector<std::string> lines;
  void Add(int line, int column, const std::string& message) {
    lines.push_back(fmt::format("{}:{}:{}: error: {}", file, line, column, message));
  }
  void Add(const YAML::Mark& at, const std::string& message) {
    Add(at.line + 1, at.column + 1, message);
  }
  std::string Origin(const YAML::Mark& at) const {
    return fmt::format("{}:{}:{}", file, at.line + 1, at.column + 1);
  }
};

// One `set:` entry, PATH=VALUE written at `at`: checked as --set checks it.
void AddSet(const std::string& text, const YAML::Mark& at, const std::string& where, Errors* errors,
            WorkflowStage* out, StagePlaces* places) {
  auto parsed = ParseOverrides({text});
  if (!parsed.ok()) {
    std::string message = parsed.status().message();
    if (StartsWith(message, "--set ")) message = message.substr(6);
    errors->Add(at, where + ": " + message);
    return;
  }
  out->set.push_back(text);
  places->set_origins.push_back(errors->Origin(at));
}

std::optional<std::string> Scalar(const YAML::Node& v, const std::string& what, Errors* errors) {
  if (v.IsScalar() && !v.Scalar().empty()) return v.Scalar();
  errors->Add(v.Mark(), what + ": expected a string");
  return std::nullopt;
}

void ParseAfter(const YAML::Node& v, const std::string& where, Errors* errors, WorkflowStage* out) {
  if (!v.IsSequence()) {
    errors->Add(v.Mark(), where +
                              ": expected a list of stages ([train], or [{stage: train, "
                              "condition: finished}])");
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const YAML::Node item = v[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    StageDependency d;
    d.line = item.Mark().line + 1;
    d.column = item.Mark().column + 1;
    if (item.IsScalar()) {
      if (auto s = Scalar(item, at, errors)) d.stage = *s;
    } else if (item.IsMap()) {
      for (auto it = item.begin(); it != item.end(); ++it) {
        const std::string key = it->first.Scalar();
        const YAML::Node value = it->second;
        if (key == "stage") {
          if (auto s = Scalar(value, at + ".stage", errors)) d.stage = *s;
        } else if (key == "condition") {
          auto s = Scalar(value, at + ".condition", errors);
          if (!s) continue;
          if (auto c = ParseCondition(*s))
            d.condition = *c;
          else
            errors->Add(value.Mark(), at + ".condition: succeeded or finished, not '" + *s + "'");
        } else {
          errors->Add(it->first.Mark(), at + ": unknown field '" + key + "' (stage, condition)");
        }
      }
      if (!item["stage"]) errors->Add(item.Mark(), at + ": needs the stage it waits for");
    } else {
      errors->Add(item.Mark(), at + ": expected a stage's name or {stage, condition}");
    }
    out->after.push_back(std::move(d));
  }
}

void ParseSet(const YAML::Node& v, const std::string& where, Errors* errors, WorkflowStage* out,
              StagePlaces* places) {
  if (v.IsMap()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      // The key is a --set PATH: an '=' in it would move the split between path and value.
      if (key.Scalar().find('=') != std::string::npos) {
        errors->Add(key.Mark(), where + ": '" + key.Scalar() +
                                    "' is not a field path ('=' in it); write PATH: VALUE, such "
                                    "as compute.gpus: 2");
        continue;
      }
      if (!value.IsScalar()) {
        errors->Add(value.Mark(), where + "." + it->first.Scalar() + ": expected a scalar value");
        continue;
      }
      AddSet(it->first.Scalar() + "=" + value.Scalar(), value.Mark(), where, errors, out, places);
    }
    return;
  }
  if (v.IsSequence()) {
    for (size_t i = 0; i < v.size(); ++i) {
      const YAML::Node item = v[i];
      if (item.IsScalar() && item.Scalar().find('=') != std::string::npos)
        AddSet(item.Scalar(), item.Mark(), fmt::format("{}[{}]", where, i), errors, out, places);
      else
        errors->Add(item.Mark(), fmt::format("{}[{}]: expected PATH=VALUE", where, i));
    }
    return;
  }
  errors->Add(v.Mark(), where + ": expected {PATH: VALUE} or a list of PATH=VALUE");
}

void ParseStage(const YAML::Node& v, size_t index, Errors* errors, WorkflowStage* out,
                StagePlaces* places) {
  const std::string where = fmt::format("stages[{}]", index);
  out->line = v.Mark().line + 1;
  out->column = v.Mark().column + 1;
  if (!v.IsMap()) {
    errors->Add(v.Mark(), where + ": expected a mapping {name, spec, after?, set?}");
    return;
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string key = it->first.Scalar();
    const YAML::Node value = it->second;  // a copy: operator-> gives a temporary
    if (key == "name") {
      if (auto s = Scalar(value, where + ".name", errors)) out->name = *s;
    } else if (key == "spec") {
      if (auto s = Scalar(value, where + ".spec", errors)) out->spec = *s;
      places->spec_line = value.Mark().line + 1;
      places->spec_column = value.Mark().column + 1;
    } else if (key == "after") {
      ParseAfter(value, where + ".after", errors, out);
    } else if (key == "set") {
      ParseSet(value, where + ".set", errors, out, places);
    } else {
      errors->Add(it->first.Mark(),
                  where + ": unknown field '" + key + "' (name, spec, after, set)");
    }
  }
  if (!v["name"]) errors->Add(v.Mark(), where + ": needs a name");
  if (!v["spec"]) errors->Add(v.Mark(), where + ": needs a spec (the stage's tau.yaml)");
}

}  // namespace

const char* ConditionName(Condition c) { return kConditionNames[static_cast<int>(c)]; }

std::optional<Condition> ParseCondition(std::string_view name) {
  if (name == "succeeded") return Condition::kSucceeded;
  if (name == "finished") return Condition::kFinished;
  return std::nullopt;
}

bool IsWorkflowText(const std::string& text) {
  // Without the word, and without a backslash (a double-quoted escape could spell it), no YAML
  // value of this text is "workflow": no parse, which `tau run` pays for on every spec.
  if (text.find("workflow") == std::string::npos && text.find('\\') == std::string::npos)
    return false;
  try {
    YAML::Node root = YAML::Load(text);
    return root.IsMap() && root["kind"] && root["kind"].IsScalar() &&
           root["kind"].Scalar() == "workflow";
  } catch (const YAML::Exception&) {
    return false;
  }
}

Result<WorkflowFile> ParseWorkflow(const std::string& text, const std::string& file) {
  std::vector<StagePlaces> places;
  return ParseWorkflow(text, file, &places);
}

Result<WorkflowFile> ParseWorkflow(const std::string& text, const std::string& file,
                                   std::vector<StagePlaces>* places) {
  places->clear();
  // The run-spec reader's checks: text, syntax, and no key given twice anywhere.
  Result<YAML::Node> loaded = LoadStrictYaml(text, file, "workflow file");
  if (!loaded.ok()) return loaded.status();
  const YAML::Node root = *loaded;
  WorkflowFile out;
  out.file = file;
  Errors errors{file, {}};
  YAML::Node stages;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.Scalar();
    const YAML::Node v = it->second;
    if (key == "kind") {
      if (!v.IsScalar() || v.Scalar() != "workflow")
        errors.Add(v.Mark(), "kind: a workflow file has kind: workflow");
    } else if (key == "schema_version") {
      if (!v.IsScalar() || v.Scalar() != "1")
        errors.Add(v.Mark(), "schema_version: this tau reads workflow files of version 1");
    } else if (key == "name") {
      if (auto s = Scalar(v, "name", &errors)) {
        out.name = *s;
        if (!IsDns1123Label(out.name, 40))
          errors.Add(v.Mark(), "name: '" + out.name +
                                   "' is not a DNS-1123 label of at most 40 characters "
                                   "(lowercase letters, digits and '-')");
      }
    } else if (key == "stages") {
      stages = v;
    } else {
      errors.Add(it->first.Mark(),
                 "unknown field '" + key + "' (kind, schema_version, name, stages)");
    }
  }
  if (!root["name"]) errors.Add(root.Mark(), "name: missing; the workflow's runs are named by it");
  if (!stages || !stages.IsSequence() || stages.size() == 0) {
    errors.Add(stages ? stages.Mark() : root.Mark(),
               "stages: give a list of stages, each {name, spec, after?, set?}");
  } else {
    for (size_t i = 0; i < stages.size(); ++i) {
      WorkflowStage stage;
      places->emplace_back();
      ParseStage(stages[i], i, &errors, &stage, &places->back());
      out.stages.push_back(std::move(stage));
    }
    if (errors.lines.empty())
      for (const GraphProblem& p : CheckStageGraph(out.stages)) {
        const std::string message = GraphProblemPlace(p, "stages", "name") + ": " + p.message;
        if (p.part == GraphProblem::Part::kGraph) {
          errors.Add(stages.Mark(), message);
          continue;
        }
        const WorkflowStage& s = out.stages[p.stage];
        if (p.part == GraphProblem::Part::kDependency)
          errors.Add(s.after[p.dependency].line, s.after[p.dependency].column, message);
        else
          errors.Add(s.line, s.column, message);
      }
  }
  if (!errors.lines.empty()) return InvalidArgument(Join(errors.lines, "\n"));
  return out;
}

std::vector<GraphProblem> CheckStageGraph(const std::vector<WorkflowStage>& stages) {
  using Part = GraphProblem::Part;
  std::vector<GraphProblem> problems;
  if (stages.size() > kMaxWorkflowStages) {
    problems.push_back({Part::kGraph, 0, 0,
                        fmt::format("a workflow has at most {} stages; this one has {}",
                                    kMaxWorkflowStages, stages.size())});
    return problems;
  }
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string& name = stages[i].name;
    if (!IsDns1123Label(name, kMaxStageNameLength))
      problems.push_back({Part::kName, i, 0,
                          fmt::format("'{}' is not a DNS-1123 label of at most {} characters "
                                      "(lowercase letters, digits and '-')",
                                      name, kMaxStageNameLength)});
    else if (!index.emplace(name, i).second)
      problems.push_back(
          {Part::kName, i, 0, fmt::format("stage '{}' is already stage {}", name, index[name])});
  }
  std::vector<std::string> names;
  for (const auto& [n, at] : index) names.push_back(n);
  for (size_t i = 0; i < stages.size(); ++i) {
    std::set<std::string> named;
    for (size_t d = 0; d < stages[i].after.size(); ++d) {
      const std::string& up = stages[i].after[d].stage;
      if (up == stages[i].name) {
        problems.push_back(
            {Part::kDependency, i, d, fmt::format("stage '{}' cannot wait for itself", up)});
      } else if (!index.count(up)) {
        const std::string close = ClosestMatch(up, names);
        problems.push_back({Part::kDependency, i, d,
                            fmt::format("no stage is named '{}'{} (stages: {})", up,
                                        close.empty() ? "" : " (did you mean '" + close + "'?)",
                                        Join(names, ", "))});
      } else if (!named.insert(up).second) {
        problems.push_back({Part::kDependency, i, d, fmt::format("'{}' is named twice", up)});
      }
    }
  }
  if (!problems.empty()) return problems;
  // A cycle: depth first, and the path from where the walk entered it back to itself.
  enum { kNew, kOpen, kDone };
  std::vector<int> mark(stages.size(), kNew);
  std::vector<size_t> path;
  std::function<bool(size_t)> visit = [&](size_t i) {
    mark[i] = kOpen;
    path.push_back(i);
    for (const StageDependency& d : stages[i].after) {
      const size_t up = index.at(d.stage);
      if (mark[up] == kOpen) {
        std::vector<std::string> cycle;
        for (auto it = std::find(path.begin(), path.end(), up); it != path.end(); ++it)
          cycle.push_back(stages[*it].name);
        cycle.push_back(stages[up].name);
        problems.push_back({Part::kStage, up, 0,
                            fmt::format("the stages wait for each other in a cycle ({}); a "
                                        "workflow's stages must form no cycle",
                                        Join(cycle, " <- "))});
        return true;
      }
      if (mark[up] == kNew && visit(up)) return true;
    }
    path.pop_back();
    mark[i] = kDone;
    return false;
  };
  for (size_t i = 0; i < stages.size(); ++i)
    if (mark[i] == kNew && visit(i)) break;
  return problems;
}

std::string GraphProblemPlace(const GraphProblem& p, std::string_view items,
                              std::string_view name_field) {
  switch (p.part) {
    case GraphProblem::Part::kGraph:
      return std::string(items);
    case GraphProblem::Part::kStage:
      return fmt::format("{}[{}]", items, p.stage);
    case GraphProblem::Part::kName:
      return fmt::format("{}[{}].{}", items, p.stage, name_field);
    case GraphProblem::Part::kDependency:
      return fmt::format("{}[{}].after[{}]", items, p.stage, p.dependency);
  }
  return std::string(items);
}

std::string StageEnvName(std::string_view stage) {
  std::string out;
  for (char c : stage) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

}  // namespace tau::spec
