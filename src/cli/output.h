// Output formats shared by the commands: aligned tables for people, JSON and YAML for scripts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tau::cli {

// The -o values, as kubectl users know them: a table for people (wide: with more columns), the
// names alone (one a line, for xargs), and the API's objects as JSON or YAML for scripts. Which of
// them a command takes is its own (commands.h: AddOutput); the rest it refuses.
enum class Format { kTable, kWide, kName, kJson, kYaml };

// "table", "wide", "name", "json", "yaml".
const char* FormatName(Format format);
// Parses an -o value. Returns false for anything else.
bool ParseFormat(const std::string& text, Format* out);
// JSON or YAML: the formats whose output is the API object itself.
inline bool IsData(Format f) { return f == Format::kJson || f == Format::kYaml; }
// `value` as JSON or YAML (IsData(format)); returns 0, for `return PrintData(...)`.
int PrintData(const nlohmann::json& value, Format format);

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);
void PrintJson(const nlohmann::json& value);
void PrintYaml(const nlohmann::json& value);

bool StdoutIsTerminal();
bool StderrIsTerminal();

// "3s ago", "2h ago"; "" for null.
std::string Age(const nlohmann::json& rfc3339);
std::string Age(const std::string& rfc3339);
// A Kubernetes quantity for people: a binary-suffixed one in its largest unit, one decimal at
// most ("24683584Ki" is "23.5Gi"); anything else as it is. JSON and YAML keep the exact value.
std::string HumanQuantity(const std::string& quantity);
// A JSON value as a short cell: strings bare, null and "" as "-".
std::string Cell(const nlohmann::json& value);
std::string Cell(const std::string& value);
std::string Cell(const std::optional<int>& value);

}  // namespace tau::cli
