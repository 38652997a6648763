// The string-valued keys of a training config that take one of a fixed set of names, as enums. parse_config
// (config.h) parses each once; a value outside the set is an error naming the file, the key, the value and the
// names it accepts. choices(E{}) lists an enum's names in the order messages show them; name_of gives the YAML name.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace lt::train {

enum class OnMalformed { Skip, Fatal };                  // on_malformed
enum class OverlongPolicy { Truncate, Skip };            // overlong
enum class LrSchedulerType { Constant, Linear, Cosine }; // lr_scheduler_type (all with warmup)
enum class OptimizerType { AdamW, AdamW8bit, Hybrid };   // optimizer
enum class MasterWeights { Fp32, Bf16Sr, Auto };         // master_weights
enum class GradientHome { Host, Device, Auto };          // gradients
enum class GradientDtype { Fp32, Bf16, Auto };           // gradient_dtype
enum class EmbeddingUpdate { Host, Device, Auto };       // embedding_update
enum class HeadGradient { Full, Slices, Auto };          // head_gradient
enum class OptimizerNvme { None, Auto, All };            // optimizer_nvme
enum class BackendKind { Auto, Cpu, Cuda };              // backend
enum class SaveDtype { Bf16, Fp32 };                     // save_dtype

template <class E>
struct Choice {
  E value;
  const char* name;
};

constexpr std::array<Choice<OnMalformed>, 2> choices(OnMalformed) {
  return {{{OnMalformed::Skip, "skip"}, {OnMalformed::Fatal, "fatal"}}};
}
constexpr std::array<Choice<OverlongPolicy>, 2> choices(OverlongPolicy) {
  return {{{OverlongPolicy::Truncate, "truncate"}, {OverlongPolicy::Skip, "skip"}}};
}
constexpr std::array<Choice<LrSchedulerType>, 3> choices(LrSchedulerType) {
  return {{{LrSchedulerType::Constant, "constant"}, {LrSchedulerType::Linear, "linear"},
           {LrSchedulerType::Cosine, "cosine"}}};
}
constexpr std::array<Choice<OptimizerType>, 3> choices(OptimizerType) {
  return {{{OptimizerType::AdamW, "adamw"}, {OptimizerType::AdamW8bit, "adamw8bit"}, {OptimizerType::Hybrid, "hybrid"}}};
}
constexpr std::array<Choice<MasterWeights>, 3> choices(MasterWeights) {
  return {{{MasterWeights::Fp32, "fp32"}, {MasterWeights::Bf16Sr, "bf16-sr"}, {MasterWeights::Auto, "auto"}}};
}
constexpr std::array<Choice<GradientHome>, 3> choices(GradientHome) {
  return {{{GradientHome::Host, "host"}, {GradientHome::Device, "device"}, {GradientHome::Auto, "auto"}}};
}
constexpr std::array<Choice<GradientDtype>, 3> choices(GradientDtype) {
  return {{{GradientDtype::Fp32, "fp32"}, {GradientDtype::Bf16, "bf16"}, {GradientDtype::Auto, "auto"}}};
}
constexpr std::array<Choice<EmbeddingUpdate>, 3> choices(EmbeddingUpdate) {
  return {{{EmbeddingUpdate::Host, "host"}, {EmbeddingUpdate::Device, "device"}, {EmbeddingUpdate::Auto, "auto"}}};
}
constexpr std::array<Choice<HeadGradient>, 3> choices(HeadGradient) {
  return {{{HeadGradient::Full, "full"}, {HeadGradient::Slices, "slices"}, {HeadGradient::Auto, "auto"}}};
}
constexpr std::array<Choice<OptimizerNvme>, 3> choices(OptimizerNvme) {
  return {{{OptimizerNvme::None, "none"}, {OptimizerNvme::Auto, "auto"}, {OptimizerNvme::All, "all"}}};
}
constexpr std::array<Choice<BackendKind>, 3> choices(BackendKind) {
  return {{{BackendKind::Auto, "auto"}, {BackendKind::Cpu, "cpu"}, {BackendKind::Cuda, "cuda"}}};
}
constexpr std::array<Choice<SaveDtype>, 2> choices(SaveDtype) {
  return {{{SaveDtype::Bf16, "bf16"}, {SaveDtype::Fp32, "fp32"}}};
}

// The YAML name of a value ("bf16-sr").
template <class E>
const char* name_of(E v) {
  for (const auto& c : choices(E{}))
    if (c.value == v) return c.name;
  return "?";
}

// Every name of E, in order.
template <class E>
std::vector<std::string> choice_names() {
  std::vector<std::string> out;
  for (const auto& c : choices(E{})) out.push_back(c.name);
  return out;
}

// The value named `name`; false when none is.
template <class E>
bool choice_of(const std::string& name, E& out) {
  for (const auto& c : choices(E{}))
    if (name == c.name) {
      out = c.value;
      return true;
    }
  return false;
}

}  // namespace lt::train
