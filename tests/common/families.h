// The real tokenizer families (tests/fixtures/families, made by tools/make_tokenizer_fixtures2.py):
// their directories and the HF expectations of cases.jsonl, shared by tests/data and tests/cli.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "repo_path.h"

namespace lt::testing {

inline const std::string kFamiliesDir = repo_root().string() + "/tests/fixtures/families/";

// Family names (directory names), sorted.
inline std::vector<std::string> families() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kFamiliesDir))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The family's cases of one kind ("text" or "chat"); ordered_json keeps message keys in file order.
inline std::vector<nlohmann::ordered_json> family_cases(const std::string& fam, const std::string& kind) {
  std::ifstream f(kFamiliesDir + fam + "/cases.jsonl");
  std::vector<nlohmann::ordered_json> out;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::ordered_json::parse(line);
    if (j["kind"] == kind) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace lt::testing
