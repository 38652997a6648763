// Model directories in the HF layout:
//   config.json, generation_config.json,
//   model.safetensors                      (one file), or
//   model-00001-of-0000N.safetensors ... + model.safetensors.index.json
//     {"metadata": {"total_size": bytes}, "weight_map": {"<tensor>": "<shard file>"}}
// Loading converts BF16/F16/F32 to fp32 into the per-unit flat buffers of param_layout.h, checking
// that every tensor is present with the right shape and that there are no unexpected extras.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/units.h"
#include "io/safetensors.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "model/weights.h"

namespace lt {

// Parses model.safetensors.index.json text into (tensor, shard file) pairs. Shard names must be plain
// file names (no '/', not "." or ".."); metadata.total_size, if present, a non-negative integer.
std::vector<std::pair<std::string, std::string>> parse_safetensors_index(const std::string& text,
                                                                        const std::string& source);

// All tensors of a directory (single file or sharded through the index), or of one .safetensors file.
class TensorStore {
 public:
  explicit TensorStore(const std::filesystem::path& dir_or_file);
  struct Ref {
    const SafetensorsFile* file = nullptr;
    const StTensor* tensor = nullptr;
  };
  const Ref* find(const std::string& name) const;   // nullptr if absent
  std::vector<std::string> names() const;           // sorted
  size_t size() const { return refs_.size(); }
  // Reads a tensor as fp32 (out: numel floats); throws if absent or not a float dtype.
  void read_f32(const std::string& name, float* out) const;
  const std::filesystem::path& source() const { return source_; }

 private:
  std::filesystem::path source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Ref> refs_;
};

// Loads weights of `c` from dir into unit buffers (units[i] has layout.units[i].numel floats; padding
// is zeroed). Every expected tensor must be present with its exact shape (tied models may omit
// lm_head.weight; if present it is ignored); any other tensor is an error (rotary inv_freq buffers
// are ignored, and so are pass-through tensors). Errors name the file, tensor, expected vs actual shape.
void load_weights(const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
                  const std::vector<float*>& units, int threads = 0);
// The same, a piece of a unit at a time through one buffer of the largest piece: `sink(u, offset, n, values)` receives
// elements [offset, offset + n) of unit u, the pieces of a unit in order and at most piece(u) elements each, so that
// no fp32 copy of the model, nor of its largest unit (the 27B shape's embedding: 5 GiB), is held.
using UnitSink = std::function<void(int64_t unit, int64_t offset, int64_t n, const float* values)>;
using PieceSize = std::function<int64_t(int64_t unit)>;
void load_weights(const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
                  const UnitSink& sink, const PieceSize& piece, int threads = 0);
// config.json + weights.
ModelWeights load_model(const std::filesystem::path& dir, int threads = 0);

struct SaveOptions {
  DType dtype = DType::BF16;          // F32 or BF16
  int64_t max_shard_bytes = 5 * GiB;  // a shard closes before it would exceed this (a bigger tensor gets its own)
  // A model directory whose pass-through tensors (passthrough_tensor()) are copied unchanged, bytes and
  // dtype, into the output, so that it loads in transformers as the class it came from. Empty: none.
  std::filesystem::path passthrough_from;
};

// Tensors of a checkpoint that lazytrain loads past without training and writes back unchanged:
// Qwen3.5/3.6's vision tower (model.visual.*) and multi-token-prediction layers (mtp.*).
bool passthrough_tensor(const ModelConfig& c, const std::string& name);
// Writes config.json, generation_config.json and the weights (HF names; tied models omit lm_head.weight).
// Earlier model*.safetensors files and the index in dir are removed first so that no stale shard remains.
void save_model(const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
                const std::vector<const float*>& units, const SaveOptions& opt = {});
// The same with values read in pieces: `read(u, offset, n, dst)` writes unit u's elements [offset,
// offset + n) as fp32 to dst (masters stored in another form are rebuilt piece by piece).
using UnitReader = std::function<void(int64_t unit, int64_t offset, int64_t n, float* dst)>;
void save_model(const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
                const UnitReader& read, const SaveOptions& opt = {});
void save_model(const std::filesystem::path& dir, const ModelWeights& w, const SaveOptions& opt = {});

}  // namespace lt
