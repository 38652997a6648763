// The keys of a training config and where each lives in TrainConfig's sections (the table is in
// config_sections.cpp): parsing, the dump and validation (config.cpp) walk this one table. Internal to src/train.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "train/config.h"

namespace lt::train {

// A key whose value is parsed from its text (the enums of config_choices.h, device_update_layers).
struct TextSlot {
  std::function<std::string()> text;  // the value as the config file writes it
  // Sets the value from `text`; throws lt::Error naming `source` (file and line, or the command line), the key, the
  // value and what the key accepts.
  std::function<void(const std::string& text, const std::string& source)> parse;
};

using Slot = std::variant<std::string*, int64_t*, double*, bool*, TextSlot>;

struct Field {
  const char* key;
  std::function<Slot(TrainConfig&)> slot;  // the member of a config that holds this key
};

// One row per key, in documentation order.
const std::vector<Field>& config_fields();

// The slot of a key in a const config, for reading only.
inline Slot read_slot(const Field& f, const TrainConfig& c) { return f.slot(const_cast<TrainConfig&>(c)); }

}  // namespace lt::train
