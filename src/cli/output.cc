#include "cli/output.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/json_text.h"

namespace tau::cli {

namespace {
constexpr Format kFormats[] = {Format::kTable, Format::kWide, Format::kName, Format::kJson,
                               Format::kYaml};
}  // namespace

const char* FormatName(Format format) {
  switch (format) {
    case Format::kTable:
      return "table";
    case Format::kWide:
      return "wide";
    case Format::kName:
      return "name";
    case Format::kJson:
      return "json";
    case Format::kYaml:
      return "yaml";
  }
  return "table";
}

bool ParseFormat(const std::string& text, Format* out) {
  for (Format f : kFormats) {
    if (text == FormatName(f)) {
      *out = f;
      return true;
    }
  }
  return false;
}

int PrintData(const nlohmann::json& value, Format format) {
  if (format == Format::kYaml)
    PrintYaml(value);
  else
    PrintJson(value);
  return 0;
}

std::string HumanQuantity(const std::string& quantity) {
  static constexpr const char* kUnits[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  constexpr size_t kCount = sizeof kUnits / sizeof kUnits[0];
  if (quantity.size() < 3) return quantity;
  const std::string suffix = quantity.substr(quantity.size() - 2);
  size_t unit = 0;
  while (unit < kCount && suffix != kUnits[unit]) ++unit;
  if (unit == kCount) return quantity;
  const std::string digits = quantity.substr(0, quantity.size() - 2);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return quantity;
  double value = std::stod(digits);
  if (value < 1024) return quantity;
  while (value >= 1024 && unit + 1 < kCount) {
    value /= 1024;
    ++unit;
  }
  std::string text = fmt::format("{:.1f}", value);
  if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) text.resize(text.size() - 2);
  return text + kUnits[unit];
}

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < header.size(); ++i) {
      const std::string& cell = i < row.size() ? row[i] : "";
      line += i + 1 == header.size() ? cell : fmt::format("{:<{}}   ", cell, width[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::puts(line.c_str());
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

void PrintJson(const nlohmann::json& value) { std::puts(JsonText(value, 2).c_str()); }

static void EmitYaml(YAML::Emitter& out, const nlohmann::json& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (auto& [k, item] : v.items()) {
      out << YAML::Key << k << YAML::Value;
      EmitYaml(out, item);
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& item : v) EmitYaml(out, item);
    out << YAML::EndSeq;
  } else if (v.is_string()) {
    out << YAML::DoubleQuoted << v.get<std::string>();
  } else if (v.is_null()) {
    out << YAML::Null;
  } else {
    out << JsonText(v);
  }
}

void PrintYaml(const nlohmann::json& value) {
  YAML::Emitter out;
  EmitYaml(out, value);
  std::puts(out.c_str());
}

bool StdoutIsTerminal() { return ::isatty(STDOUT_FILENO) == 1; }
bool StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

std::string Age(const nlohmann::json& t) { return t.is_string() ? Age(t.get<std::string>()) : ""; }

std::string Age(const std::string& t) {
  auto ms = ParseRfc3339(t);
  if (!ms.ok()) return "";
  int64_t s = (NowMillis() - *ms) / 1000;
  if (s < 0) s = 0;
  if (s < 60) return fmt::format("{}s ago", s);
  if (s < 3600) return fmt::format("{}m ago", s / 60);
  if (s < 86400) return fmt::format("{}h ago", s / 3600);
  return fmt::format("{}d ago", s / 86400);
}

std::string Cell(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>().empty() ? "-" : v.get<std::string>();
  return JsonText(v);
}

std::string Cell(const std::string& v) { return v.empty() ? "-" : v; }

std::string Cell(const std::optional<int>& v) { return v ? std::to_string(*v) : "-"; }

}  // namespace tau::cli
