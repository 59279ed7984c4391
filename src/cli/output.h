// Output formats shared by the commands: aligned tables for people, JSON and YAML for scripts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tau::cli {

enum class Format { kTable, kJson, kYaml };

// Parses -o values: table|json|yaml. Returns false for anything else.
bool ParseFormat(const std::string& text, Format* out);

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);
void PrintJson(const nlohmann::json& value);
void PrintYaml(const nlohmann::json& value);

bool StdoutIsTerminal();
bool StderrIsTerminal();

// "3s ago", "2h ago"; "" for null.
std::string Age(const nlohmann::json& rfc3339);
std::string Age(const std::string& rfc3339);
// A JSON value as a short cell: strings bare, null and "" as "-".
std::string Cell(const nlohmann::json& value);
std::string Cell(const std::string& value);
std::string Cell(const std::optional<int>& value);

}  // namespace tau::cli
