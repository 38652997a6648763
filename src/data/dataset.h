// JSONL datasets: {"query","response"} (MetaMathQA), alpaca {"instruction","input","output"[,"system"]},
// {"messages":[{"role","content"},...]} and {"text"} (pretraining). Malformed records are counted,
// the first few reported with line numbers, and skipped or fatal as configured.
// Built-in data sets: "builtin:math" (train split) and "builtin:math-test" (held-out split).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "data/chat_template.h"

namespace lt::data {

enum class RecordFormat { Auto, QueryResponse, Alpaca, Messages, Text };
// auto | query_response (alias metamath) | alpaca | messages (alias sharegpt) | text
RecordFormat parse_record_format(const std::string& name);

struct Record {
  std::vector<Message> messages;  // conversational records
  std::string text;               // {"text"} records
  bool is_text = false;
  int64_t line = 0;               // 1-based line in the source file (0 for generated records)

  // The reference answer of a conversational record: its last assistant message ("" if none).
  std::string reference() const;
  // The conversation without its final assistant message (the prompt for generation).
  std::vector<Message> prompt_messages() const;
};

// Thrown by data preparation when its stop_requested callback says so (a SIGINT/SIGTERM before training):
// the message says where it stopped.
class StopRequested : public Error {
 public:
  using Error::Error;
};

// Polled every few thousand lines or records; true stops the work with StopRequested. Empty: never.
using StopCheck = std::function<bool()>;

struct ReadOptions {
  RecordFormat format = RecordFormat::Auto;
  bool malformed_fatal = false;  // throw on the first malformed record instead of skipping it
  int64_t max_samples = 0;       // 0 = all (for builtin: how many records to generate)
  int max_reported = 5;          // how many malformed records are logged with their line numbers
  uint64_t seed = 42;            // builtin generators
  StopCheck stop_requested;      // checked every kStopCheckLines lines of a JSONL file
};
constexpr int64_t kStopCheckLines = 4096;

struct ReadStats {
  int64_t lines = 0;      // non-empty lines
  int64_t records = 0;    // accepted
  int64_t malformed = 0;  // skipped
  std::vector<std::string> first_errors;  // "file:line: why", up to max_reported
};

// Parses one JSON record; throws lt::Error naming `where` and the missing/invalid field.
Record parse_record(const nlohmann::json& j, RecordFormat format, const std::string& where);

// Reads a JSONL file, or generates a builtin:... data set.
std::vector<Record> load_records(const std::string& spec, const ReadOptions& opt, ReadStats* stats = nullptr);
std::vector<Record> read_jsonl(const std::string& path, const ReadOptions& opt, ReadStats* stats = nullptr);

// Writes records as JSONL ({"query","response"} for single-turn user/assistant records,
// {"messages"} for others, {"text"} for text).
void write_jsonl(const std::string& path, const std::vector<Record>& records);

// Deterministic train/validation split: val_size < 1 is a fraction, >= 1 a count (0: no split).
// The validation records are chosen by a seeded shuffle; both halves keep the file order.
void split_train_val(std::vector<Record> all, double val_size, uint64_t seed, std::vector<Record>& train,
                     std::vector<Record>& val);

}  // namespace lt::data
