// The TauGrid compatibility table (docs/taugrid-compat.md), generated from the field trees' own
// annotations, so a field cannot be added without saying what each backend does with it.
#include <fmt/format.h>

#include <map>
#include <set>

#include "common/strings.h"
#include "spec/spec.h"
#include "spec/walk.h"

namespace tau::spec {
namespace {

struct Row {
  std::set<std::string> shapes;
  std::string local, kube;
  bool tau_extension = false;
};

// Table cells hold no '|' and no line breaks.
std::string Cell(std::string text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '\n') {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

void Collect(const std::vector<internal::FieldDef>& fields, const std::string& prefix,
             const char* shape, std::map<std::string, Row>* rows,
             std::vector<std::string>* unannotated) {
  for (const internal::FieldDef& f : fields) {
    std::string path = prefix.empty() ? f.name : prefix + "." + f.name;
    if (f.local.empty() || f.kube.empty()) unannotated->push_back(std::string(shape) + " " + path);
    if (f.kind == internal::Kind::kObject) {
      Collect(f.children, path, shape, rows, unannotated);
      continue;
    }
    Row& row = (*rows)[path];
    if (!row.shapes.empty() && (row.local != f.local || row.kube != f.kube)) {
      row.local += fmt::format(" ({}: {})", shape, f.local);
      row.kube += fmt::format(" ({}: {})", shape, f.kube);
    } else if (row.shapes.empty()) {
      row.local = f.local;
      row.kube = f.kube;
    }
    row.shapes.insert(shape);
    row.tau_extension = row.tau_extension || f.tau_extension;
    if (f.kind == internal::Kind::kObjectList) {
      Collect(f.children, path + "[]", shape, rows, unannotated);
    }
  }
}

}  // namespace

std::vector<std::string> UnannotatedFields() {
  std::map<std::string, Row> rows;
  std::vector<std::string> missing;
  Collect(internal::ManifestFields(), "", "manifest", &rows, &missing);
  Collect(internal::DirectFields(), "", "direct", &rows, &missing);
  return missing;
}

std::string CompatibilityTable() {
  std::map<std::string, Row> rows;
  std::vector<std::string> missing;
  Collect(internal::ManifestFields(), "", "manifest", &rows, &missing);
  Collect(internal::DirectFields(), "", "direct", &rows, &missing);
  std::string out = "| field | shapes | local backend | Kubernetes backend |\n|---|---|---|---|\n";
  for (const auto& [path, row] : rows) {
    std::vector<std::string> shapes(row.shapes.rbegin(), row.shapes.rend());  // manifest, direct
    out += fmt::format("| `{}`{} | {} | {} | {} |\n", path,
                       row.tau_extension ? " (tau extension)" : "", Join(shapes, ", "),
                       Cell(row.local), Cell(row.kube));
  }
  return out;
}

}  // namespace tau::spec
