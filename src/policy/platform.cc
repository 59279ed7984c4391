// ParsePlatform. The admission sections (flavors, cohorts, queues, fair_sharing) are read by the
// admission module's own loader, so that platform.yaml and `tau admission simulate` files can
// never disagree about them; this file reads the rest with the strict Reader, adds the checks the
// simulator does not make (name syntax, resource names), and checks every cross-reference.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <set>
#include <tuple>

#include "admission/simulate.h"
#include "common/strings.h"
#include "common/yaml_text.h"
#include "policy/policy.h"
#include "policy/reader.h"

namespace tau::policy {

using internal::Describe;
using internal::Entry;
using internal::Fields;
using internal::Hint;
using internal::Pos;
using internal::ShortDuration;

namespace {

// A name used elsewhere in the file, checked once every section has been read.
struct Ref {
  Pos pos;
  std::string path;
  std::string kind;  // "queue", "priority class", ...
  std::string name;
};

bool IsCleanAbsolutePath(std::string_view p) {
  if (p.empty() || p[0] != '/') return false;
  for (const std::string& part : Split(p.substr(1), '/')) {
    if (part == "..") return false;
  }
  return true;
}

class PlatformParser {
 public:
  PlatformParser(std::string_view text, std::string_view file)
      : text_(text), file_(file), r_(std::string(file)) {}

  PlatformOutcome Run() {
    PlatformOutcome out;
    Parse();
    out.diagnostics = std::move(r_.diagnostics());
    std::stable_sort(out.diagnostics.begin(), out.diagnostics.end(),
                     [](const Diagnostic& a, const Diagnostic& b) {
                       return std::tie(a.line, a.column) < std::tie(b.line, b.column);
                     });
    if (out.diagnostics.empty()) out.platform = std::move(p_);
    return out;
  }

 private:
  void Parse() {
    if (text_.size() > kMaxPlatformBytes) {
      r_.Error({1, 1}, fmt::format("the platform file is larger than {} bytes", kMaxPlatformBytes));
      return;
    }
    // The text checks every YAML file gets (common/yaml_text.h), UTF-16 first.
    if (std::optional<TextProblem> wrong = WrongEncoding(text_)) {
      r_.Error({wrong->line, wrong->column}, wrong->message);
      return;
    }
    // yaml-cpp passes bytes through unchecked, and names that are not UTF-8 cannot be printed as
    // JSON (`tau platform show -o json`: nlohmann throws). Found by fuzz/platform_fuzz.cc.
    if (size_t bad = FindInvalidUtf8(text_); bad != std::string_view::npos) {
      auto [line, column] = LineColumnAt(text_, bad);
      r_.Error({line, column},
               fmt::format("invalid UTF-8 byte 0x{:02x}: the platform file must be UTF-8 text",
                           static_cast<unsigned char>(text_[bad])));
      return;
    }
    normalized_ = std::string(text_);
    NormalizeLineBreaks(&normalized_);
    text_ = normalized_;  // what the admission section is read from too
    const YamlOpenings open = FindUnclosed(text_);
    if (open.quote) {
      r_.Error({open.quote->line, open.quote->column}, open.quote->message);
      return;
    }
    YAML::Node root;
    try {
      root = YAML::Load(normalized_);
    } catch (const YAML::Exception& e) {
      if (auto flow = UnclosedFlow(open, e.msg, e.mark.line + 1, e.mark.column + 1))
        r_.Error({flow->line, flow->column}, flow->message);
      else if (auto likely = LikelyCause(text_, e.msg, e.mark.line + 1))
        r_.Error({e.mark.line + 1, e.mark.column + 1},
                 fmt::format("{}\n{}:{}:{}: note: {}", e.msg, file_, likely->line, likely->column,
                             likely->message));
      else
        r_.Error({e.mark.line + 1, e.mark.column + 1}, e.msg);
      return;
    } catch (const std::exception& e) {
      r_.Error({1, 1}, e.what());
      return;
    }
    if (!root.IsDefined() || root.IsNull()) {
      r_.Error({1, 1}, "the platform file is empty");
      return;
    }
    Fields top;
    std::vector<std::string> sections(std::begin(admission::kAdmissionSections),
                                      std::end(admission::kAdmissionSections));
    sections.insert(sections.end(), std::begin(admission::kPlatformPolicySections),
                    std::end(admission::kPlatformPolicySections));
    if (!r_.Map(root, "", {1, 1}, sections, {"queues", "workspaces"}, &top)) {
      return;
    }
    try {
      Admission(root, top);
      if (auto it = top.find("node_labels"); it != top.end()) NodeLabelsSection(it->second);
      if (auto it = top.find("topology"); it != top.end()) TopologySection(it->second);
      if (auto it = top.find("schema_version"); it != top.end()) {
        (void)r_.Int(it->second, 1, 1);  // only version 1 exists; the value needs no keeping
      }
      if (auto it = top.find("priorities"); it != top.end()) Priorities(it->second);
      if (auto it = top.find("storage"); it != top.end()) StorageSection(it->second);
      if (auto it = top.find("compute_profiles"); it != top.end()) Profiles(it->second);
      if (auto it = top.find("workspaces"); it != top.end()) Workspaces(it->second);
      if (auto it = top.find("defaults"); it != top.end()) DefaultsSection(it->second);
      if (auto it = top.find("access"); it != top.end()) AccessSection(it->second);
      if (auto it = top.find("users"); it != top.end()) Users(it->second);
      if (auto it = top.find("budgets"); it != top.end()) Budgets(it->second);
      if (auto it = top.find("costs"); it != top.end()) CostsSection(it->second);
      CheckRefs();
      CheckBudgetUsers();
      CheckBudgetCosts();
    } catch (const std::exception& e) {
      // yaml-cpp throws on odd documents (an alias of a key, say); never let that escape.
      r_.Error({1, 1}, fmt::format("reading the platform file: {}", e.what()));
    }
  }

  // ---- admission sections -------------------------------------------------------------------

  // A flavor's node labels become a nodeSelector on the cluster: Kubernetes refuses a key or value
  // that is not a label's, so they are refused here, where the platform team can fix them.
  void FlavorLabels(const YAML::Node& root) {
    const YAML::Node flavors = root["flavors"];
    if (!flavors.IsDefined() || !flavors.IsSequence()) return;
    for (size_t i = 0; i < flavors.size(); ++i) {
      const YAML::Node labels = flavors[i].IsMap() ? flavors[i]["node_labels"] : YAML::Node();
      if (!labels.IsDefined() || !labels.IsMap()) continue;
      for (const auto& label : labels) {
        if (!label.first.IsScalar() || !label.second.IsScalar()) continue;
        const std::string key = label.first.Scalar(), value = label.second.Scalar();
        const std::string path = fmt::format("flavors[{}].node_labels", i);
        if (!IsLabelKey(key)) {
          r_.Error({label.first.Mark().line + 1, label.first.Mark().column + 1},
                   fmt::format("{}: '{}' is not a Kubernetes label key ([PREFIX/]NAME: at most 63 "
                               "letters, digits, '-', '_' or '.', a letter or digit at both ends)",
                               path, key));
        } else if (!IsLabelValue(value)) {
          r_.Error({label.second.Mark().line + 1, label.second.Mark().column + 1},
                   fmt::format("{}.{}: '{}' is not a Kubernetes label value (at most 63 letters, "
                               "digits, '-', '_' or '.', a letter or digit at both ends)",
                               path, key, value));
        }
      }
    }
  }

  void Admission(const YAML::Node& root, const Fields& top) {
    // Only const access below: a non-const operator[] would add the keys it looks up.
    std::vector<admission::Diagnostic> diags;
    Result<admission::Config> config = admission::ParseAdmissionConfig(text_, "", &diags);
    for (const admission::Diagnostic& d : diags) r_.Error({d.line, d.column}, d.message);
    FlavorLabels(root);
    if (config.ok()) {
      p_.admission = std::move(*config);
    } else {
      // The section has errors of its own; the names it declares still count for references, so
      // one mistake in a queue gives one error, not one more per workspace that names the queue.
      for (const char* section : {"queues", "flavors"}) {
        const YAML::Node list = root[section];
        if (!list.IsDefined() || !list.IsSequence()) continue;
        for (const auto& item : list) {
          if (!item.IsMap()) continue;
          const YAML::Node name = item["name"];
          if (name.IsDefined() && name.IsScalar())
            declared_[section == std::string("queues") ? "queue" : "flavor"].push_back(
                name.Scalar());
        }
      }
    }
    NameChecks(root["flavors"], "flavors");
    NameChecks(root["cohorts"], "cohorts");
    NameChecks(root["queues"], "queues");
    if (!diags.empty() || r_.diagnostics().size() != 0) return;
    // What the loader cannot see: the engine's own checks (every flavor covering its group's
    // resources, limits only where Kueue allows them, ...).
    Result<admission::Engine> engine = admission::Engine::Create(p_.admission);
    if (!engine.ok()) {
      auto q = top.find("queues");
      r_.Error(q == top.end() ? Pos{1, 1} : q->second.key_pos,
               fmt::format("queues: {}", engine.status().message()));
    }
  }

  // Kubernetes object names and resource names inside an admission section. Shapes the loader
  // already refused are skipped here.
  void NameChecks(const YAML::Node& list, const std::string& section) {
    if (!list.IsDefined() || !list.IsSequence()) return;
    size_t i = 0;
    for (const auto& element : list) {
      YAML::Node item = element;
      std::string path = fmt::format("{}[{}]", section, i++);
      if (!item.IsMap()) continue;
      YAML::Node name = item["name"];
      if (name.IsDefined() && name.IsScalar() && !IsDns1123Label(name.Scalar())) {
        r_.Error(internal::PosOf(name),
                 fmt::format("{}.name: '{}' is not a valid name (lowercase letters, digits and "
                             "'-', at most 63 characters)",
                             path, name.Scalar()));
      }
      YAML::Node groups = item["resource_groups"];
      if (!groups.IsDefined() || !groups.IsSequence()) continue;
      for (const auto& g : groups) {
        YAML::Node group = g;
        if (!group.IsMap()) continue;
        YAML::Node covered = group["covered_resources"];
        if (!covered.IsDefined() || !covered.IsSequence()) continue;
        for (const auto& res : covered) {
          YAML::Node resource = res;
          if (resource.IsScalar() && !internal::IsResourceName(resource.Scalar())) {
            r_.Error(internal::PosOf(resource),
                     fmt::format("{}: '{}' is not a Kubernetes resource name (such as cpu, "
                                 "memory, nvidia.com/gpu)",
                                 path, resource.Scalar()));
          }
        }
      }
    }
  }

  // ---- common helpers -----------------------------------------------------------------------

  // Reads `name` of a list item: a DNS-1123 label, unique within `seen`.
  std::optional<std::string> Name(const Fields& f, std::map<std::string, int>* seen,
                                  const std::string& what) {
    auto it = f.find("name");
    if (it == f.end()) return std::nullopt;
    std::optional<std::string> name = r_.Str(it->second);
    if (!name) return std::nullopt;
    if (!IsDns1123Label(*name)) {
      r_.Error(it->second.pos, fmt::format("{}: '{}' is not a valid name (lowercase letters, "
                                           "digits and '-', at most 63 characters)",
                                           it->second.path, *name));
      return std::nullopt;
    }
    if (auto dup = seen->find(*name); dup != seen->end()) {
      r_.Error(it->second.pos, fmt::format("{} '{}' is defined twice (first on line {})", what,
                                           *name, dup->second));
      return std::nullopt;
    }
    (*seen)[*name] = it->second.pos.line;
    return name;
  }

  std::string OptStr(const Fields& f, const std::string& key) {
    auto it = f.find(key);
    if (it == f.end()) return "";
    return r_.Str(it->second).value_or("");
  }

  // A reference to a named object, checked in CheckRefs.
  std::string RefField(const Fields& f, const std::string& key, const std::string& kind) {
    auto it = f.find(key);
    if (it == f.end()) return "";
    std::optional<std::string> s = r_.Str(it->second);
    if (!s) return "";
    refs_.push_back(Ref{it->second.pos, it->second.path, kind, *s});
    return *s;
  }

  template <typename Fn>
  void EachItem(const Entry& e, const std::vector<std::string>& allowed,
                const std::vector<std::string>& required, Fn fn) {
    std::optional<std::vector<Entry>> items = r_.Items(e);
    if (!items) return;
    for (const Entry& item : *items) {
      Fields f;
      if (r_.Map(item.value, item.path, item.pos, allowed, required, &f)) fn(item, f);
    }
  }

  // ---- policy sections ----------------------------------------------------------------------

  // `node_labels: tau` (the default), `node_labels: taugrid` (TauGrid's keys, for clusters labelled
  // the TauGrid way), or the keys themselves: {gpu_class: KEY, gpu_series: KEY}.
  void NodeLabelsSection(const Entry& e) {
    if (e.value.IsScalar()) {
      std::optional<std::string> preset = r_.Str(e);
      if (!preset) return;
      if (*preset == "tau") {
        p_.node_labels = NodeLabels{};
      } else if (*preset == "taugrid") {
        p_.node_labels = NodeLabels{kTauGridGpuClassLabel, kTauGridGpuSeriesLabel};
      } else {
        r_.Error(e.pos, fmt::format("{}: '{}' is not a label preset: write tau ({}, {}), taugrid "
                                    "({}, {}) or a mapping {{gpu_class: KEY, gpu_series: KEY}}",
                                    e.path, *preset, kGpuClassLabel, kGpuSeriesLabel,
                                    kTauGridGpuClassLabel, kTauGridGpuSeriesLabel));
      }
      return;
    }
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"gpu_class", "gpu_series"}, {}, &f)) return;
    for (auto [key, out] : {std::pair{"gpu_class", &p_.node_labels.gpu_class},
                            std::pair{"gpu_series", &p_.node_labels.gpu_series}}) {
      auto it = f.find(key);
      if (it == f.end()) continue;
      std::optional<std::string> label = r_.Str(it->second);
      if (!label) continue;
      if (!IsLabelKey(*label)) {
        r_.Error(it->second.pos,
                 fmt::format("{}: '{}' is not a Kubernetes label key ([PREFIX/]NAME)",
                             it->second.path, *label));
        continue;
      }
      *out = *label;
    }
  }

  // `topology: [{level: LEVEL, node_label: KEY}, ...]`, broadest level first, as Kueue's
  // Topology lists them.
  void TopologySection(const Entry& e) {
    const std::vector<std::string>& names = TopologyLevelNames();
    int last_rank = -1;
    EachItem(
        e, {"level", "node_label"}, {"level", "node_label"}, [&](const Entry&, const Fields& f) {
          const Entry& level = f.at("level");
          const Entry& label = f.at("node_label");
          TopologyLevel t;
          t.level = OptStr(f, "level");
          t.node_label = OptStr(f, "node_label");
          auto at = std::find(names.begin(), names.end(), t.level);
          if (at == names.end()) {
            r_.Error(
                level.pos,
                fmt::format("{}: '{}' is not a topology level; write one of {} (broadest first)",
                            level.path, t.level, Join(names, ", ")));
            return;
          }
          const int rank = static_cast<int>(at - names.begin());
          if (rank <= last_rank) {
            r_.Error(level.pos, fmt::format("{}: '{}' comes after a narrower or equal level; list "
                                            "the levels broadest first ({})",
                                            level.path, t.level, Join(names, ", ")));
            return;
          }
          last_rank = rank;
          if (!IsLabelKey(t.node_label)) {
            r_.Error(label.pos,
                     fmt::format("{}: '{}' is not a Kubernetes label key ([PREFIX/]NAME)",
                                 label.path, t.node_label));
            return;
          }
          // Kueue honours taints only when the hostname is the lowest level, and allows it nowhere
          // else.
          if (t.node_label == "kubernetes.io/hostname" && t.level != "host") {
            r_.Error(label.pos, fmt::format("{}: kubernetes.io/hostname names the host level only",
                                            label.path));
            return;
          }
          p_.topology.push_back(std::move(t));
        });
  }

  void Priorities(const Entry& e) {
    EachItem(
        e, {"name", "value", "description"}, {"name", "value"}, [&](const Entry&, const Fields& f) {
          PriorityClass pc;
          std::optional<std::string> name = Name(f, &priority_names_, "priority class");
          if (auto it = f.find("value"); it != f.end()) {
            pc.value = static_cast<int32_t>(r_.Int(it->second, INT32_MIN, INT32_MAX).value_or(0));
          }
          pc.description = OptStr(f, "description");
          if (!name) return;
          pc.name = *name;
          p_.priorities.push_back(std::move(pc));
        });
  }

  void StorageSection(const Entry& e) {
    EachItem(
        e, {"name", "host_path", "pvc", "mount_path", "read_only"}, {"name", "mount_path"},
        [&](const Entry& item, const Fields& f) {
          StorageVolume v;
          std::optional<std::string> name = Name(f, &storage_names_, "storage volume");
          auto path_field = [&](const char* key, std::string* out) {
            auto it = f.find(key);
            if (it == f.end()) return;
            std::optional<std::string> s = r_.Str(it->second);
            if (s && !IsCleanAbsolutePath(*s)) {
              r_.Error(it->second.pos, fmt::format("{}: '{}' must be an absolute path without '..'",
                                                   it->second.path, *s));
            } else if (s) {
              *out = *s;
            }
          };
          path_field("host_path", &v.host_path);
          path_field("mount_path", &v.mount_path);
          if (auto it = f.find("pvc"); it != f.end()) {
            std::optional<std::string> s = r_.Str(it->second);
            if (s && !IsDnsSubdomain(*s)) {
              r_.Error(it->second.pos, fmt::format("{}: '{}' is not a valid PersistentVolumeClaim "
                                                   "name",
                                                   it->second.path, *s));
            } else if (s) {
              v.pvc = *s;
            }
          }
          if (!f.count("host_path") && !f.count("pvc")) {
            r_.Error(item.pos, fmt::format("{}: give host_path (local backend), pvc (Kubernetes) "
                                           "or both",
                                           item.path));
          }
          if (auto it = f.find("read_only"); it != f.end()) {
            v.read_only = r_.Bool(it->second).value_or(false);
          }
          if (!name) return;
          v.name = *name;
          p_.storage.push_back(std::move(v));
        });
  }

  void Profiles(const Entry& e) {
    EachItem(e, {"name", "description", "gpus", "cpus", "memory", "flavor", "gpu_class"}, {"name"},
             [&](const Entry&, const Fields& f) {
               ComputeProfile cp;
               std::optional<std::string> name = Name(f, &profile_names_, "compute profile");
               cp.description = OptStr(f, "description");
               if (auto it = f.find("gpus"); it != f.end()) {
                 if (auto n = r_.Int(it->second, 0, spec::kMaxGpusPerWorker)) {
                   cp.gpus = static_cast<int>(*n);
                 }
               }
               if (auto it = f.find("cpus"); it != f.end()) cp.cpus = r_.Qty(it->second, false);
               if (auto it = f.find("memory"); it != f.end()) cp.memory = r_.Qty(it->second, true);
               cp.flavor = RefField(f, "flavor", "flavor");
               if (auto it = f.find("gpu_class"); it != f.end()) {
                 if (auto s = r_.Str(it->second)) {
                   cp.gpu_class = *s;
                   gpu_class_refs_.push_back({it->second.pos, it->second.path, cp.flavor, *s});
                 }
               }
               if (!name) return;
               cp.name = *name;
               p_.compute_profiles.push_back(std::move(cp));
             });
  }

  void Workspaces(const Entry& e) {
    EachItem(e,
             {"name", "description", "members", "viewers", "default_queue", "default_priority",
              "default_profile", "default_output", "default_checkpoint", "allowed_images", "limits",
              "storage", "run_users", "lanes", "webhooks", "allowed_webhooks", "fair_sharing"},
             {"name", "members"}, [&](const Entry& item, const Fields& f) {
               Workspace w;
               std::optional<std::string> name = Name(f, &workspace_names_, "workspace");
               w.description = OptStr(f, "description");
               if (auto it = f.find("members"); it != f.end()) Members(it->second, &w.members);
               if (auto it = f.find("viewers"); it != f.end()) Members(it->second, &w.viewers);
               w.default_queue = RefField(f, "default_queue", "queue");
               w.default_priority = RefField(f, "default_priority", "priority class");
               w.default_profile = RefField(f, "default_profile", "compute profile");
               if (auto it = f.find("allowed_images"); it != f.end()) {
                 if (auto list = r_.StrList(it->second)) {
                   for (const Entry& i : *list) w.allowed_images.push_back(i.value.Scalar());
                 }
               }
               if (auto it = f.find("limits"); it != f.end()) Limits(it->second, &w.limits);
               std::vector<std::pair<Entry, std::string>> storage_refs;
               if (auto it = f.find("storage"); it != f.end()) {
                 if (auto list = r_.StrList(it->second)) {
                   std::set<std::string> seen;
                   for (const Entry& i : *list) {
                     const std::string& s = i.value.Scalar();
                     if (!seen.insert(s).second) {
                       r_.Error(i.pos, fmt::format("{}: '{}' is listed twice", i.path, s));
                     }
                     refs_.push_back(Ref{i.pos, i.path, "storage volume", s});
                     w.storage.push_back(s);
                   }
                 }
               }
               if (auto it = f.find("run_users"); it != f.end()) RunUsers(it->second, &w.run_users);
               if (auto it = f.find("lanes"); it != f.end()) Lanes(it->second, &w.lanes);
               if (auto it = f.find("webhooks"); it != f.end()) Webhooks(it->second, &w.webhooks);
               if (auto it = f.find("allowed_webhooks"); it != f.end()) {
                 if (auto list = r_.StrList(it->second))
                   for (const Entry& i : *list) {
                     const std::string& pattern = i.value.Scalar();
                     if (!StartsWith(pattern, "http://") && !StartsWith(pattern, "https://"))
                       r_.Error(i.pos, fmt::format("{}: '{}' must start with http:// or https:// "
                                                   "(a glob pattern of receiver URLs)",
                                                   i.path, pattern));
                     w.allowed_webhooks.push_back(pattern);
                   }
               }
               if (auto it = f.find("fair_sharing"); it != f.end())
                 FairSharingWeight(it->second, &w.fair_sharing_weight);
               for (const char* key : {"default_output", "default_checkpoint"}) {
                 std::string s = RefField(f, key, "storage volume");
                 if (s.empty()) continue;
                 const Entry& at = f.at(key);
                 if (std::find(w.storage.begin(), w.storage.end(), s) == w.storage.end()) {
                   r_.Error(at.pos, fmt::format("{}: storage volume '{}' is not in the workspace's "
                                                "storage list",
                                                at.path, s));
                 }
                 writable_refs_.push_back(Ref{at.pos, at.path, "storage volume", s});
                 (std::string_view(key) == "default_output" ? w.default_output
                                                            : w.default_checkpoint) = s;
               }
               if (!name) return;
               w.name = *name;
               p_.workspaces.push_back(std::move(w));
             });
  }

  // A workspace's `fair_sharing: {weight: W}`: the weight of its LocalQueues under admission
  // fair sharing (their usage is divided by it).
  void FairSharingWeight(const Entry& e, double* out) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"weight"}, {"weight"}, &f)) return;
    if (auto v = NonNegative(f.at("weight"), "a weight of 0 or more (e.g. 2)")) *out = *v;
  }

  // A plain decimal number of 0 or more; `what` says what was expected when it is not one.
  std::optional<double> NonNegative(const Entry& e, const char* what) {
    const std::string text = e.value.IsScalar() ? e.value.Scalar() : "";
    char* end = nullptr;
    const double v = text.empty() ? -1 : std::strtod(text.c_str(), &end);
    if (e.value.Tag() == "!" || text.empty() || end != text.c_str() + text.size() ||
        !std::isfinite(v) || v < 0 ||
        text.find_first_not_of("0123456789.eE+-") != std::string::npos) {
      r_.Error(e.pos, fmt::format("{}: expected {}, got {}", e.path, what, Describe(e.value)));
      return std::nullopt;
    }
    return v;
  }

  void Webhooks(const Entry& e, std::vector<Webhook>* out) {
    EachItem(
        e, {"url", "secret", "events"}, {"url", "secret"}, [&](const Entry& item, const Fields& f) {
          Webhook w;
          w.line = item.pos.line;
          w.column = item.pos.column;
          if (auto it = f.find("url"); it != f.end())
            if (auto url = r_.Str(it->second)) {
              w.url = *url;
              if (std::string why = spec::WebhookUrlProblem(*url); !why.empty())
                r_.Error(it->second.pos, fmt::format("{}: '{}' {}", it->second.path, *url, why));
            }
          if (auto it = f.find("secret"); it != f.end())
            if (auto secret = r_.Str(it->second)) w.secret = *secret;
          if (auto it = f.find("events"); it != f.end()) {
            auto list = r_.StrList(it->second);
            if (list && list->empty())
              r_.Error(it->second.pos,
                       fmt::format("{}: names no event kind, so the receiver would get nothing; "
                                   "list the kinds it takes ({}), or leave events out for all",
                                   it->second.path, Join(spec::WebhookEventKinds(), ", ")));
            if (list)
              for (const Entry& kind : *list) {
                const std::string& k = kind.value.Scalar();
                const auto& kinds = spec::WebhookEventKinds();
                if (std::find(kinds.begin(), kinds.end(), k) == kinds.end())
                  r_.Unknown(kind.pos, kind.path, "event kind", k, kinds);
                else
                  w.events.push_back(k);
              }
          } else {
            w.events = spec::WebhookEventKinds();
          }
          out->push_back(std::move(w));
        });
  }

  // TauGrid's lanes: lane name -> queue (policy.lane in a run picks the queue).
  void Lanes(const Entry& e, std::map<std::string, std::string>* out) {
    Fields f;
    if (!e.value.IsMap()) {
      r_.Error(e.pos, fmt::format("{}: must be a mapping of lane name to queue, such as "
                                  "{{training: research}}, not {}",
                                  e.path, internal::Describe(e.value)));
      return;
    }
    for (const auto& kv : e.value) {
      Entry item{kv.second, e.path + "." + kv.first.Scalar(), internal::PosOf(kv.first),
                 internal::PosOf(kv.second)};
      std::optional<std::string> queue = r_.Str(item);
      if (!queue) continue;
      refs_.push_back(Ref{item.pos, item.path, "queue", *queue});
      (*out)[kv.first.Scalar()] = *queue;
    }
  }

  // A pool of system accounts: POSIX user names, none in two pools (two workspaces sharing one
  // would let their runs touch each other's files), never root.
  void RunUsers(const Entry& e, std::vector<std::string>* out) {
    std::optional<std::vector<Entry>> list = r_.StrList(e);
    if (!list) return;
    for (const Entry& i : *list) {
      const std::string& u = i.value.Scalar();
      bool ok = !u.empty() && u.size() <= 32 && (std::islower(u[0]) || u[0] == '_');
      for (char c : u) ok = ok && (std::islower(c) || std::isdigit(c) || c == '_' || c == '-');
      if (!ok) {
        r_.Error(i.pos, fmt::format("{}: '{}' is not a system user name (lowercase letters, "
                                    "digits, '_' and '-', at most 32)",
                                    i.path, u));
        continue;
      }
      if (u == "root") {
        r_.Error(i.pos, fmt::format("{}: runs never run as root for a token user", i.path));
        continue;
      }
      if (auto [it, fresh] = run_user_places_.emplace(u, i.path); !fresh) {
        r_.Error(i.pos, fmt::format("{}: '{}' is already in {}: a system user serves one "
                                    "workspace, or its runs could touch the other's files",
                                    i.path, u, it->second));
        continue;
      }
      out->push_back(u);
    }
  }

  void Members(const Entry& e, std::vector<std::string>* out) {
    std::optional<std::vector<Entry>> list = r_.StrList(e);
    if (!list) return;
    if (list->empty()) {
      r_.Error(e.pos, fmt::format("{}: must not be empty (use \"*\" for everyone)", e.path));
    }
    for (const Entry& i : *list) {
      const std::string& m = i.value.Scalar();
      bool ok = m == kEveryone;
      if (!ok && StartsWith(m, "group:")) {
        ok = m.size() > 6 && m.find_first_of(" \t:", 6) == std::string::npos;
      } else if (!ok) {
        ok = m.find_first_of(" \t:*") == std::string::npos;
      }
      if (!ok) {
        r_.Error(i.pos, fmt::format("{}: '{}' is not a member (a user name, \"group:NAME\" or "
                                    "\"*\")",
                                    i.path, m));
        continue;
      }
      out->push_back(m);
    }
  }

  // User names follow the machine's account names (dots and underscores allowed), unique.
  std::optional<std::string> UserName(const Fields& f) {
    const Entry& e = f.at("name");
    std::optional<std::string> name = r_.Str(e);
    if (!name) return std::nullopt;
    if (name->empty() || name->size() > 256 || name->find_first_of(" \t:*/") != std::string::npos) {
      r_.Error(e.pos, fmt::format("{}: '{}' is not a user name", e.path, *name));
      return std::nullopt;
    }
    if (auto dup = user_names_.find(*name); dup != user_names_.end()) {
      r_.Error(e.pos,
               fmt::format("user '{}' is defined twice (first on line {})", *name, dup->second));
      return std::nullopt;
    }
    user_names_[*name] = e.pos.line;
    return name;
  }

  void AccessSection(const Entry& e) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"admins", "viewers"}, {}, &f)) return;
    if (auto it = f.find("admins"); it != f.end()) Members(it->second, &p_.access.admins);
    if (auto it = f.find("viewers"); it != f.end()) Members(it->second, &p_.access.viewers);
  }

  void Users(const Entry& e) {
    EachItem(e, {"name", "groups", "token_sha256"}, {"name"},
             [&](const Entry& item, const Fields& f) {
               User u;
               std::optional<std::string> name = UserName(f);
               if (auto it = f.find("groups"); it != f.end()) {
                 if (auto list = r_.StrList(it->second)) {
                   for (const Entry& i : *list) {
                     const std::string& g = i.value.Scalar();
                     if (g.empty() || g.find_first_of(" \t:*") != std::string::npos) {
                       r_.Error(i.pos, fmt::format("{}: '{}' is not a group name", i.path, g));
                       continue;
                     }
                     u.groups.push_back(g);
                   }
                 }
               }
               if (auto it = f.find("token_sha256"); it != f.end()) {
                 if (auto list = r_.StrList(it->second)) {
                   for (const Entry& i : *list) {
                     const std::string& h = i.value.Scalar();
                     if (h.size() != 64 ||
                         h.find_first_not_of("0123456789abcdef") != std::string::npos) {
                       r_.Error(i.pos, fmt::format("{}: a token digest is 64 lowercase hex "
                                                   "characters (`tau admin token hash` prints "
                                                   "one)",
                                                   i.path));
                       continue;
                     }
                     u.token_sha256.push_back(h);
                   }
                 }
               }
               if (!name) return;
               u.name = *name;
               p_.users.push_back(std::move(u));
             });
  }

  // ---- budgets (docs/budgets.md) --------------------------------------------------------------

  // A number of hours (an integer or a decimal), not negative; of money when `money`.
  std::optional<double> Hours(const Entry& e, bool money = false) {
    const std::string text = e.value.IsScalar() ? e.value.Scalar() : "";
    char* end = nullptr;
    const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
    const bool number = e.value.IsScalar() && e.value.Tag() != "!" && !text.empty() &&
                        end == text.c_str() + text.size() && std::isfinite(v) &&
                        text.find_first_not_of("0123456789.eE+-") == std::string::npos;
    if (!number) {
      r_.Error(e.pos, fmt::format("{}: expected {}, got {}", e.path,
                                  money ? "an amount in the platform's currency (e.g. 5000)"
                                        : "a number of hours (e.g. 400 or 0.5)",
                                  Describe(e.value)));
      return std::nullopt;
    }
    if (v < 0) {
      r_.Error(e.pos, fmt::format("{}: {} is negative; a budget is {} or more", e.path, text,
                                  money ? "0" : "0 hours"));
      return std::nullopt;
    }
    return v;
  }

  // costs: {currency, flavors: {FLAVOR: {gpu_hour, cpu_hour}}}
  void CostsSection(const Entry& e) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"currency", "flavors"}, {"currency", "flavors"}, &f))
      return;
    if (auto it = f.find("currency"); it != f.end())
      if (auto c = r_.Str(it->second)) p_.costs.currency = *c;
    auto it = f.find("flavors");
    if (it == f.end()) return;
    const Entry& flavors = it->second;
    if (!flavors.value.IsMap()) {
      r_.Error(flavors.pos,
               fmt::format("{}: must be a mapping of flavor name to its rates, such as "
                           "{{a100: {{gpu_hour: 2.5, cpu_hour: 0.04}}}}, not {}",
                           flavors.path, Describe(flavors.value)));
      return;
    }
    for (const auto& kv : flavors.value) {
      const std::string name = kv.first.Scalar();
      Entry item{kv.second, flavors.path + "." + name, internal::PosOf(kv.first),
                 internal::PosOf(kv.second)};
      refs_.push_back(Ref{item.key_pos, item.path, "flavor", name});
      Fields rates;
      if (!r_.Map(item.value, item.path, item.pos, {"gpu_hour", "cpu_hour"}, {}, &rates)) continue;
      FlavorCost cost;
      for (auto [key, field] :
           {std::pair{"gpu_hour", &cost.gpu_hour}, {"cpu_hour", &cost.cpu_hour}})
        if (auto rate = rates.find(key); rate != rates.end()) {
          if (auto v = NonNegative(rate->second, "a rate of 0 or more (e.g. 2.5)")) *field = *v;
        }
      p_.costs.flavors[name] = cost;
    }
  }

  void Budgets(const Entry& e) {
    EachItem(
        e,
        {"name", "workspace", "user", "queue", "gpu_hours", "cpu_hours", "cost", "period", "window",
         "warn_at", "on_exceed"},
        {}, [&](const Entry& item, const Fields& f) {
          Budget b;
          b.line = item.pos.line;
          b.column = item.pos.column;
          b.name = OptStr(f, "name");
          b.workspace = RefField(f, "workspace", "workspace");
          b.queue = RefField(f, "queue", "queue");
          if (auto it = f.find("user"); it != f.end()) {
            if (auto u = r_.Str(it->second)) {
              b.user = *u;
              if (b.workspace.empty())
                r_.Error(
                    it->second.pos,
                    fmt::format("{}: a user's budget is within a workspace: give workspace too",
                                it->second.path));
              else if (*u != kEveryone)
                budget_users_.push_back({it->second.pos, it->second.path, b.workspace, *u});
            }
          }
          // Of two keys that exclude each other, the error is at the second one in the file.
          auto second_of = [&](const char* a, const char* b) {
            const Pos& pa = f.at(a).key_pos;
            const Pos& pb = f.at(b).key_pos;
            return std::tie(pa.line, pa.column) > std::tie(pb.line, pb.column) ? f.at(a) : f.at(b);
          };
          if (f.count("workspace") && f.count("queue")) {
            const auto& at = second_of("workspace", "queue");
            r_.Error(at.key_pos,
                     fmt::format("{}: a budget is of a workspace (with a user, or '*' for "
                                 "each of its users) or of a queue: give workspace or "
                                 "queue, not both",
                                 at.path));
          } else if (!f.count("workspace") && !f.count("queue")) {
            r_.Error(item.pos,
                     fmt::format("{}: a budget is of a workspace (with a user, or '*' for "
                                 "each of its users) or of a queue: give workspace or "
                                 "queue",
                                 item.path));
          }
          for (const char* key : {"gpu_hours", "cpu_hours"})
            if (auto it = f.find(key); it != f.end())
              (std::string(key) == "gpu_hours" ? b.gpu_hours : b.cpu_hours) = Hours(it->second);
          if (auto it = f.find("cost"); it != f.end()) {
            b.cost = Hours(it->second, /*money=*/true);
            cost_budgets_.push_back({it->second.pos, it->second.path});
          }
          if (!f.count("gpu_hours") && !f.count("cpu_hours") && !f.count("cost"))
            r_.Error(item.pos,
                     fmt::format("{}: give gpu_hours (or cpu_hours, or cost): what the budget "
                                 "allows",
                                 item.path));
          auto period = f.find("period");
          auto window = f.find("window");
          if (period != f.end()) {
            if (auto v = r_.Str(period->second)) {
              if (*v != "day" && *v != "week" && *v != "month")
                r_.Error(period->second.pos,
                         fmt::format("{}: '{}' is not a period: day, week (from Monday) or month "
                                     "(calendar, UTC){}",
                                     period->second.path, *v, Hint(*v, {"day", "week", "month"})));
              b.period = *v;
            }
          }
          if (window != f.end()) {
            const std::string text =
                window->second.value.IsScalar() ? window->second.value.Scalar() : "";
            // Days as well as Go's units: "30d".
            if (text.size() > 1 && text.back() == 'd' &&
                text.find_first_not_of("0123456789") == text.size() - 1 && text.size() < 8) {
              b.window_ms = std::stoll(text.substr(0, text.size() - 1)) * 86'400'000;
            } else if (auto ms = r_.DurationMs(window->second)) {
              b.window_ms = *ms;
            }
            if (b.window_ms != 0 && b.window_ms < 3'600'000)
              r_.Error(
                  window->second.pos,
                  fmt::format("{}: a rolling window is at least 1h (usage is kept by the hour)",
                              window->second.path));
          }
          if (period != f.end() && window != f.end()) {
            const auto& at = second_of("period", "window");
            r_.Error(at.key_pos, fmt::format("{}: give period (day, week, month) or window (e.g. "
                                             "30d), not both",
                                             at.path));
          } else if (period == f.end() && window == f.end()) {
            r_.Error(item.pos, fmt::format("{}: give period (day, week, month) or window (e.g. "
                                           "30d), one of them",
                                           item.path));
          }
          if (auto it = f.find("warn_at"); it != f.end()) {
            if (auto v = Hours(it->second)) {
              if (*v <= 0 || *v > 1)
                r_.Error(it->second.pos,
                         fmt::format("{}: the share of the budget that warns, above 0 and at most "
                                     "1 (e.g. 0.8)",
                                     it->second.path));
              b.warn_at = *v;
            }
          }
          if (auto it = f.find("on_exceed"); it != f.end()) {
            if (auto v = r_.Str(it->second)) {
              if (*v != "wait" && *v != "refuse")
                r_.Error(it->second.pos,
                         fmt::format("{}: '{}': wait (a run waits until the budget has room) or "
                                     "refuse (also refuse, at submission, a run whose max_runtime "
                                     "cannot fit what is left){}",
                                     it->second.path, *v, Hint(*v, {"wait", "refuse"})));
              b.on_exceed = *v;
            }
          }
          p_.budgets.push_back(std::move(b));
        });
  }

  // A budget in money needs the rates that price what was held.
  void CheckBudgetCosts() {
    if (p_.costs.flavors.empty()) {
      for (const auto& [pos, path] : cost_budgets_)
        r_.Error(pos, fmt::format("{}: the platform has no costs to price it with; give costs: "
                                  "{{currency, flavors: {{FLAVOR: {{gpu_hour, cpu_hour}}}}}}",
                                  path));
      return;
    }
    for (Budget& b : p_.budgets)
      if (b.cost) b.currency = p_.costs.currency;
  }

  // A budget's user must be able to submit to its workspace: one the platform knows (users) or
  // one the workspace names. A workspace open to groups or everyone may have any user.
  void CheckBudgetUsers() {
    for (const BudgetUser& u : budget_users_) {
      const Workspace* w = p_.FindWorkspace(u.workspace);
      if (w == nullptr) continue;  // reported as an unknown workspace
      bool open = false, named = p_.FindUser(u.user) != nullptr;
      for (const std::vector<std::string>* list : {&w->members, &w->viewers})
        for (const std::string& m : *list) {
          if (m == kEveryone || StartsWith(m, "group:")) open = true;
          if (m == u.user) named = true;
        }
      if (open || named) continue;
      std::vector<std::string> known = w->members;
      for (const User& user : p_.users) known.push_back(user.name);
      r_.Error(u.pos,
               fmt::format("{}: unknown user '{}': not a member of workspace '{}' nor one of "
                           "the platform's users{}",
                           u.path, u.user, u.workspace, Hint(u.user, known)));
    }
  }

  void Limits(const Entry& e, WorkspaceLimits* limits) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos,
                {"max_gpus_per_run", "max_runtime", "max_workers", "max_log_bytes",
                 "max_metric_points", "max_metric_series", "idle", "stall"},
                {}, &f)) {
      return;
    }
    if (auto it = f.find("max_gpus_per_run"); it != f.end()) {
      if (auto n = r_.Int(it->second, 0, 1'000'000))
        limits->max_gpus_per_run = static_cast<int>(*n);
    }
    if (auto it = f.find("max_workers"); it != f.end()) {
      if (auto n = r_.Int(it->second, 1, spec::kMaxWorkers))
        limits->max_workers = static_cast<int>(*n);
    }
    if (auto it = f.find("max_runtime"); it != f.end()) {
      limits->max_runtime_ms = r_.DurationMs(it->second);
    }
    if (auto it = f.find("max_log_bytes"); it != f.end()) {
      // At least a page a worker: a smaller cap would keep nothing worth reading.
      if (auto q = r_.Qty(it->second, true)) {
        if (q->CeilUnits() < 4096) {
          r_.Error(it->second.pos, fmt::format("{}: {} is below the smallest log cap, 4Ki",
                                               it->second.path, it->second.value.Scalar()));
        } else {
          limits->max_log_bytes = q->CeilUnits();
        }
      }
    }
    if (auto it = f.find("max_metric_points"); it != f.end()) {
      if (auto n = r_.Int(it->second, 1, int64_t{1} << 40)) limits->max_metric_points = *n;
    }
    if (auto it = f.find("max_metric_series"); it != f.end()) {
      if (auto n = r_.Int(it->second, 1, 1'000'000)) limits->max_metric_series = *n;
    }
    if (auto it = f.find("idle"); it != f.end()) limits->idle = Idle(it->second);
    if (auto it = f.find("stall"); it != f.end()) limits->stall = Stall(it->second);
  }

  // A guardrail's duration: at least a second (GPU samples and progress are read about that
  // often).
  std::optional<int64_t> GuardDuration(const Entry& e) {
    std::optional<int64_t> ms = r_.DurationMs(e);
    if (ms && *ms < 1000) {
      r_.Error(e.pos, fmt::format("{}: {} is under a second; a guardrail waits 1s or more", e.path,
                                  e.value.Scalar()));
      return std::nullopt;
    }
    return ms;
  }

  // stop_after, when given, comes after the warning (`after`, at `after_path`).
  void CheckStopAfter(const Fields& f, int64_t after, const std::string& after_name,
                      std::optional<int64_t>* stop) {
    auto it = f.find("stop_after");
    if (it == f.end()) return;
    *stop = GuardDuration(it->second);
    if (*stop && **stop < after)
      r_.Error(it->second.pos,
               fmt::format("{}: {} comes before {} ({}); a run is stopped only after it was told",
                           it->second.path, it->second.value.Scalar(), after_name,
                           ShortDuration(after)));
  }

  std::optional<IdleLimit> Idle(const Entry& e) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"gpu_util_below", "warn_after", "stop_after"},
                {"warn_after"}, &f))
      return std::nullopt;
    IdleLimit idle;
    if (auto below = f.find("gpu_util_below"); below != f.end()) {
      auto pct = r_.Int(below->second, 1, 100);
      if (!pct) return std::nullopt;
      idle.gpu_util_below_pct = static_cast<int>(*pct);
    }
    auto it = f.find("warn_after");  // Map has said it is missing
    auto warn = it == f.end() ? std::nullopt : GuardDuration(it->second);
    if (!warn) return std::nullopt;
    idle.warn_after_ms = *warn;
    CheckStopAfter(f, idle.warn_after_ms, "warn_after", &idle.stop_after_ms);
    return idle;
  }

  std::optional<StallLimit> Stall(const Entry& e) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"after", "stop_after"}, {"after"}, &f))
      return std::nullopt;
    StallLimit stall;
    auto it = f.find("after");  // Map has said it is missing
    auto after = it == f.end() ? std::nullopt : GuardDuration(it->second);
    if (!after) return std::nullopt;
    stall.after_ms = *after;
    CheckStopAfter(f, stall.after_ms, "after", &stall.stop_after_ms);
    return stall;
  }

  void DefaultsSection(const Entry& e) {
    Fields f;
    if (!r_.Map(e.value, e.path, e.pos, {"workspace", "queue", "priority", "cpus", "memory"}, {},
                &f)) {
      return;
    }
    p_.defaults.workspace = RefField(f, "workspace", "workspace");
    p_.defaults.queue = RefField(f, "queue", "queue");
    p_.defaults.priority = RefField(f, "priority", "priority class");
    if (auto it = f.find("cpus"); it != f.end()) p_.defaults.cpus = r_.Qty(it->second, false);
    if (auto it = f.find("memory"); it != f.end()) p_.defaults.memory = r_.Qty(it->second, true);
  }

  // ---- cross-references ---------------------------------------------------------------------

  void CheckRefs() {
    std::map<std::string, std::vector<std::string>> known = declared_;
    for (const auto& q : p_.admission.queues) known["queue"].push_back(q.name);
    for (const auto& fl : p_.admission.flavors) known["flavor"].push_back(fl.name);
    for (const auto& [n, line] : priority_names_) known["priority class"].push_back(n);
    for (const auto& [n, line] : profile_names_) known["compute profile"].push_back(n);
    for (const auto& [n, line] : storage_names_) known["storage volume"].push_back(n);
    for (const auto& [n, line] : workspace_names_) known["workspace"].push_back(n);
    for (const Ref& ref : refs_) {
      const std::vector<std::string>& names = known[ref.kind];
      if (std::find(names.begin(), names.end(), ref.name) == names.end()) {
        r_.Unknown(ref.pos, ref.path, ref.kind, ref.name, names);
      }
    }
    for (const Ref& ref : writable_refs_) {
      const StorageVolume* v = p_.FindStorage(ref.name);
      if (v != nullptr && v->read_only) {
        r_.Error(ref.pos, fmt::format("{}: storage volume '{}' is read-only; outputs and "
                                      "checkpoints need a writable volume",
                                      ref.path, ref.name));
      }
    }
    // gpu_class refs carry the profile's flavor in `kind`.
    const std::string& class_label = p_.node_labels.gpu_class;
    for (const Ref& ref : gpu_class_refs_) {
      if (!ref.kind.empty()) {
        // A pinned flavor: its own label must agree (an unknown flavor is reported above).
        const admission::ResourceFlavor* f = p_.FindFlavor(ref.kind);
        if (f == nullptr) continue;
        auto label = f->node_labels.find(class_label);
        if (label == f->node_labels.end()) {
          r_.Error(ref.pos, fmt::format("{}: flavor '{}' has no {} label, so it has no GPU class "
                                        "'{}'",
                                        ref.path, ref.kind, class_label, ref.name));
        } else if (label->second != ref.name) {
          r_.Error(ref.pos, fmt::format("{}: flavor '{}' has {}={}, not '{}'", ref.path, ref.kind,
                                        class_label, label->second, ref.name));
        }
        continue;
      }
      std::vector<std::string> classes;
      for (const auto& fl : p_.admission.flavors) {
        auto label = fl.node_labels.find(class_label);
        if (label != fl.node_labels.end()) classes.push_back(label->second);
      }
      if (std::find(classes.begin(), classes.end(), ref.name) == classes.end()) {
        r_.Error(ref.pos, fmt::format("{}: no flavor has the node label {}={}{}", ref.path,
                                      class_label, ref.name, internal::Hint(ref.name, classes)));
      }
    }
  }

  std::string_view text_;
  std::string normalized_;  // the text with its line breaks made LF
  std::string file_;
  internal::Reader r_;
  Platform p_;
  std::vector<Ref> refs_;
  struct BudgetUser {
    Pos pos;
    std::string path, workspace, user;
  };
  std::vector<BudgetUser> budget_users_;
  std::vector<std::pair<internal::Pos, std::string>> cost_budgets_;  // where each `cost` is
  // Names declared by an admission section that failed to load (see Admission).
  std::map<std::string, std::vector<std::string>> declared_;
  std::vector<Ref> writable_refs_;
  std::vector<Ref> gpu_class_refs_;
  std::map<std::string, std::string> run_user_places_;  // system user -> the pool's path
  std::map<std::string, int> priority_names_, profile_names_, storage_names_, workspace_names_,
      user_names_;
};

}  // namespace

PlatformOutcome ParsePlatform(std::string_view text, std::string_view filename) {
  return PlatformParser(text, filename).Run();
}

}  // namespace tau::policy
