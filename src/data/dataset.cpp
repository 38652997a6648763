#include "data/dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/rng.h"
#include "data/synth_math.h"

namespace lt::data {

using json = nlohmann::json;

RecordFormat parse_record_format(const std::string& name) {
  if (name.empty() || name == "auto") return RecordFormat::Auto;
  if (name == "query_response" || name == "metamath") return RecordFormat::QueryResponse;
  if (name == "alpaca") return RecordFormat::Alpaca;
  if (name == "messages" || name == "sharegpt") return RecordFormat::Messages;
  if (name == "text") return RecordFormat::Text;
  fail("dataset format: unknown '{}'; choices: auto, query_response, alpaca, messages, text", name);
}

std::string Record::reference() const {
  for (auto it = messages.rbegin(); it != messages.rend(); ++it)
    if (it->role == "assistant") return it->content;
  return {};
}

std::vector<Message> Record::prompt_messages() const {
  std::vector<Message> m = messages;
  if (!m.empty() && m.back().role == "assistant") m.pop_back();
  return m;
}

namespace {

std::string str_field(const json& j, const char* name, const std::string& where, bool required = true) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    LT_CHECK(!required, "{}: missing field '{}'", where, name);
    return {};
  }
  LT_CHECK(it->is_string(), "{}: field '{}': expected a string, got {}", where, name, it->type_name());
  return it->get<std::string>();
}

RecordFormat detect(const json& j, const std::string& where) {
  if (j.contains("messages")) return RecordFormat::Messages;
  if (j.contains("query") || j.contains("response")) return RecordFormat::QueryResponse;
  if (j.contains("instruction") || j.contains("output")) return RecordFormat::Alpaca;
  if (j.contains("text")) return RecordFormat::Text;
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  fail("{}: cannot tell the record format from its keys ({}); expected query/response, "
       "instruction/input/output, messages or text",
       where, keys.empty() ? "none" : keys);
}

}  // namespace

Record parse_record(const json& j, RecordFormat format, const std::string& where) {
  LT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
  if (format == RecordFormat::Auto) format = detect(j, where);
  Record r;
  switch (format) {
    case RecordFormat::QueryResponse: {
      r.messages = {{"user", str_field(j, "query", where)}, {"assistant", str_field(j, "response", where)}};
      break;
    }
    case RecordFormat::Alpaca: {
      const std::string sys = str_field(j, "system", where, false);
      std::string user = str_field(j, "instruction", where);
      const std::string input = str_field(j, "input", where, false);
      if (!input.empty()) user += "\n\n" + input;
      if (!sys.empty()) r.messages.push_back({"system", sys});
      r.messages.push_back({"user", user});
      r.messages.push_back({"assistant", str_field(j, "output", where)});
      break;
    }
    case RecordFormat::Messages: {
      auto mit = j.find("messages");
      LT_CHECK(mit != j.end(), "{}: missing field 'messages'", where);
      const json& m = *mit;
      LT_CHECK(m.is_array() && !m.empty(), "{}: field 'messages': expected a non-empty array, got {}", where,
               m.is_array() ? "an empty array" : m.type_name());
      for (size_t i = 0; i < m.size(); ++i) {
        const std::string w = fmt::format("{}: messages[{}]", where, i);
        LT_CHECK(m[i].is_object(), "{}: expected an object, got {}", w, m[i].type_name());
        Message msg{str_field(m[i], "role", w), str_field(m[i], "content", w)};
        LT_CHECK(msg.role == "system" || msg.role == "user" || msg.role == "assistant",
                 "{}: role: expected system, user or assistant, got '{}'", w, msg.role);
        r.messages.push_back(std::move(msg));
      }
      bool has_asst = false;
      for (const auto& msg : r.messages) has_asst |= msg.role == "assistant";
      LT_CHECK(has_asst, "{}: messages: no assistant message (nothing to train on)", where);
      break;
    }
    case RecordFormat::Text: {
      r.text = str_field(j, "text", where);
      r.is_text = true;
      break;
    }
    case RecordFormat::Auto: break;
  }
  return r;
}

std::vector<Record> read_jsonl(const std::string& path, const ReadOptions& opt, ReadStats* stats) {
  std::ifstream f(path);
  LT_CHECK(f.good(), "dataset: cannot open '{}'", path);
  ReadStats local;
  ReadStats& st = stats ? *stats : local;
  st = ReadStats{};
  std::vector<Record> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (opt.stop_requested && lineno % kStopCheckLines == 0 && opt.stop_requested())
      throw StopRequested(fmt::format("while reading {} (line {})", path, lineno));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++st.lines;
    const std::string where = fmt::format("{}:{}", path, lineno);
    try {
      json j;
      try {
        j = json::parse(line);
      } catch (const json::parse_error& e) {
        fail("{}: invalid JSON: {}", where, e.what());
      }
      Record r = parse_record(j, opt.format, where);
      r.line = lineno;
      out.push_back(std::move(r));
      ++st.records;
      if (opt.max_samples > 0 && st.records >= opt.max_samples) break;
    } catch (const std::exception& e) {  // lt::Error, or a JSON type error not caught above
      const std::string msg = dynamic_cast<const Error*>(&e) ? e.what() : fmt::format("{}: {}", where, e.what());
      if (opt.malformed_fatal) fail("{} (malformed records are fatal: set on_malformed=skip to skip them)", msg);
      ++st.malformed;
      if (static_cast<int>(st.first_errors.size()) < opt.max_reported) {
        st.first_errors.push_back(msg);
        log_warn("skipping malformed record: {}", msg);
      }
    }
  }
  if (st.malformed > 0)
    log_warn("{}: skipped {} malformed record(s) of {} ({} reported above)", path, st.malformed, st.lines,
             st.first_errors.size());
  LT_CHECK(!out.empty(), "dataset '{}': no valid records ({} lines, {} malformed)", path, st.lines, st.malformed);
  return out;
}

std::vector<Record> load_records(const std::string& spec, const ReadOptions& opt, ReadStats* stats) {
  if (is_builtin_math(spec)) {
    auto r = builtin_math_records(spec, opt.max_samples, opt.seed);
    if (stats) *stats = ReadStats{static_cast<int64_t>(r.size()), static_cast<int64_t>(r.size()), 0, {}};
    return r;
  }
  LT_CHECK(spec.rfind("builtin:", 0) != 0, "dataset: unknown builtin '{}'; choices: builtin:math, builtin:math-test", spec);
  return read_jsonl(spec, opt, stats);
}

void write_jsonl(const std::string& path, const std::vector<Record>& records) {
  std::ofstream f(path);
  LT_CHECK(f.good(), "dataset: cannot write '{}'", path);
  for (const auto& r : records) {
    json j;
    if (r.is_text) {
      j["text"] = r.text;
    } else if (r.messages.size() == 2 && r.messages[0].role == "user" && r.messages[1].role == "assistant") {
      j["query"] = r.messages[0].content;
      j["response"] = r.messages[1].content;
    } else {
      j["messages"] = json::array();
      for (const auto& m : r.messages) j["messages"].push_back({{"role", m.role}, {"content", m.content}});
    }
    f << j.dump() << '\n';
  }
  LT_CHECK(f.good(), "dataset: write to '{}' failed", path);
}

void split_train_val(std::vector<Record> all, double val_size, uint64_t seed, std::vector<Record>& train,
                     std::vector<Record>& val) {
  LT_CHECK(val_size >= 0, "val_size: expected >= 0, got {}", val_size);
  const auto n = static_cast<int64_t>(all.size());
  int64_t n_val = val_size < 1.0 ? static_cast<int64_t>(val_size * double(n) + 0.5) : static_cast<int64_t>(val_size);
  if (val_size > 0 && n_val == 0) n_val = 1;
  LT_CHECK(n_val < n || n == 0, "val_size {} leaves no training records (of {})", val_size, n);
  std::vector<char> is_val(static_cast<size_t>(n), 0);
  const auto perm = permutation(n, splitmix64(seed ^ 0x76616C73706C6974ull));
  for (int64_t i = 0; i < n_val; ++i) is_val[perm[i]] = 1;
  train.clear();
  val.clear();
  for (int64_t i = 0; i < n; ++i) (is_val[i] ? val : train).push_back(std::move(all[i]));
}

}  // namespace lt::data
