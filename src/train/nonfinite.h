// Non-finite steps: a non-finite gradient norm (the CPU optimizer skips the update) or a non-finite loss (with a
// finite norm the update was already applied). Where the non-finite value first appears, worked out only for such a
// step, the messages that say so, and the count of consecutive non-finite steps that stops training
// (max_skipped_steps). Internal to src/train (trainer.cpp); docs/training.md, "Non-finite loss or gradients".
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace lt {
class HostState;
struct ModelLayout;
}  // namespace lt

namespace lt::train {

// A parameter tensor holding non-finite values in the host copy of the weights.
struct NonFiniteParameter {
  std::string name;  // full HF name, e.g. model.layers.3.mlp.down_proj.weight
  int64_t nan = 0, inf = 0, numel = 0;
};

// The first tensor in layout order (embedding, layers, head) whose exact fp32 master holds a NaN or an infinity, or
// nullopt. Reads the masters on `threads` threads (0: all cores); tensors after a bad one are not read to the end.
std::optional<NonFiniteParameter> first_nonfinite_parameter(const HostState& st, const ModelLayout& layout,
                                                            int threads);

// The tensor holding the largest finite magnitude of the exact fp32 masters (layout order breaks ties), for a step
// whose gradients are all zero: weights so large that the softmax saturates train nothing, silently.
struct LargestParameter {
  std::string name;
  float max_abs = 0;
};
LargestParameter largest_parameter(const HostState& st, const ModelLayout& layout, int threads);

// What one non-finite step is traced back to.
struct NonFiniteStep {
  int64_t step = 0;  // the trainer's global step
  double grad_norm = 0, loss = 0;
  bool skipped = false;  // the optimizer skipped the update (non-finite norm)
  std::optional<NonFiniteParameter> parameter;  // non-finite weights (the step's forward read them)
  std::vector<int> units;  // units whose gradient's sum of squares is non-finite (optim::CpuAdamW::nonfinite_units)
};

// Where the non-finite value first appears: the parameter, else the unit first in backward order whose gradient is
// non-finite, with whether the forward (non-finite loss) or the backward produced it, else the forward (a non-finite
// loss with finite gradients).
std::string first_nonfinite_text(const NonFiniteStep& s, const ModelLayout& layout);

// The line printed for a non-finite step, e.g. "step 7: non-finite gradient norm (nan); loss nan (non-finite);
// first non-finite: parameter model.layers.3.mlp.down_proj.weight (NaN in the weights: 1 of 65536 values); update
// skipped (1 in a row; max_skipped_steps 3)".
std::string nonfinite_step_message(const NonFiniteStep& s, const ModelLayout& layout, int64_t in_a_row,
                                   int64_t max_skipped_steps);

// Consecutive non-finite steps. The one that makes max_skipped_steps of them in a row stops training
// (max_skipped_steps 0 or 1: the first one).
class NonFiniteStreak {
 public:
  explicit NonFiniteStreak(int64_t max_skipped_steps) : max_(max_skipped_steps) {}
  void record(int64_t step, bool nonfinite, bool skipped);
  int64_t length() const { return length_; }        // non-finite steps in a row up to the last recorded one
  int64_t first_step() const { return first_; }      // of them (valid when length() > 0)
  bool all_skipped() const { return skipped_ == length_; }  // every one had a non-finite gradient norm
  // The streak has reached max(max_skipped_steps, 1) steps: training must stop.
  bool reached_limit() const { return length_ >= (max_ > 0 ? max_ : 1); }

 private:
  int64_t max_ = 0, length_ = 0, first_ = 0, skipped_ = 0;
};

// The error that stops training after non-finite steps.
struct NonFiniteStop {
  int64_t step = 0;               // the last step run
  int64_t first_step = 0;         // the first of the consecutive skipped steps
  int64_t max_skipped_steps = 0;
  bool run_ended = false;         // the run reached its last step inside a streak shorter than the limit
  bool all_skipped = true;        // every step of the streak had a non-finite gradient norm (else some a loss only)
  std::string first_nonfinite;    // first_nonfinite_text of the streak's first step
  bool in_weights = false;        // it is a parameter
  double learning_rate = 0;
  bool gpu = false;               // trained on a GPU backend
  std::string weights_source;     // where the run's weights were loaded from (model_name_or_path or the checkpoint)
  std::string last_checkpoint;    // the last good checkpoint ("" none)
  bool checkpoint_has_them = false;  // the non-finite weights came from last_checkpoint (resumed, non-finite since)
  std::string resume_command;     // resumes from it
};
std::string nonfinite_stop_message(const NonFiniteStop& s);
// The shorter message of a data-parallel rank other than 0 (rank 0's says where the values first appeared).
std::string nonfinite_peer_stop_message(const NonFiniteStop& s);

// The error of that stop. Every data-parallel rank throws it after the same step, so none aborts the communicator
// (a peer still leaving the last collective would report the abort instead of its own message): the trainer ends its
// session first and then rethrows it.
class NonFiniteStopped : public Error {
 public:
  using Error::Error;
};

}  // namespace lt::train
