// Micro-batches for the executor, built from tokenised samples by padding (one sample per row) or
// packing (consecutive samples share a row without cross-contamination: each sample is its own
// segment with positions restarting at 0; padding at the end of a row is one more segment).
// Field conventions match model/sequence.h's SeqGeometry.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/samples.h"
#include "model/sequence.h"

namespace lt::data {

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids;  // [batch*seq], padding = pad id
  std::vector<int32_t> labels;     // [batch*seq], HF convention (unshifted), -100 = no loss
  std::vector<int32_t> positions;  // [batch*seq], RoPE positions, restarting at 0 for each segment
  std::vector<int32_t> segments;   // [batch*seq], segment id within the row (0, 1, ...)
  int64_t n_loss_tokens = 0;       // targets that carry loss after shifting (the loss denominator)
  int64_t n_real_tokens = 0;       // non-padding tokens
  int64_t n_samples = 0;

  int64_t tokens() const { return batch * seq; }
  SeqGeometry geometry() const { return {batch, seq, positions.data(), segments.data()}; }
};

// Fills rows of `seq` tokens. pack=false: one sample per row; pack=true: as many consecutive
// samples as fit. Samples must be at most `seq` tokens.
class RowBuilder {
 public:
  RowBuilder(int64_t batch, int64_t seq, bool pack, int32_t pad_id);
  Batch& batch() { return b_; }
  // Adds the sample to the current row if it fits (and, when not packing, the row is empty);
  // returns false otherwise (then call close_row()).
  bool try_add(const Sample& s);
  void close_row();  // pads the current row; starts the next
  bool full() const { return row_ == b_.batch; }
  bool row_empty() const { return col_ == 0; }
  Batch finish();  // closes the current row and pads remaining rows with empty ones

 private:
  Batch b_;
  bool pack_;
  int32_t pad_id_;
  int64_t row_ = 0, col_ = 0;
  int32_t seg_ = 0;
};

// Where the loader is in the stream: sample `index` of epoch `epoch`'s order is next.
struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;
  nlohmann::json to_json() const;
  static DataPosition from_json(const nlohmann::json& j);  // error names the missing field
  bool operator==(const DataPosition&) const = default;
};

struct LoaderOptions {
  int64_t batch = 1;   // rows per micro-batch
  int64_t seq = 1024;  // tokens per row (>= the longest sample: use cutoff_len)
  bool packing = false;
  bool shuffle = true;  // a new seeded order each epoch
  uint64_t seed = 42;
  int32_t pad_id = 0;
};

// An endless stream of full micro-batches: samples are taken in stream order, the stream being the
// concatenation of each epoch's seeded order (so the last batch of an epoch continues into the next).
// Batches depend only on (samples, options, position): restoring a saved position resumes exactly.
class DataLoader {
 public:
  DataLoader(const std::vector<Sample>* samples, LoaderOptions opt);
  Batch next();
  // The next k batches next() would return, without advancing (the trainer's look-ahead at the next step's tokens);
  // they are kept, so next() returns them without building them again.
  std::vector<Batch> peek(int64_t k);
  DataPosition position() const { return pos_; }
  void restore(const DataPosition& p);
  // Epochs done, fractional (epoch + index / n).
  double epoch_progress() const;
  // Rows one epoch fills (exact for padding; for packing, computed on epoch 0's order).
  int64_t rows_per_epoch() const { return rows_per_epoch_; }
  // Micro-batches per epoch: ceil(rows_per_epoch / batch).
  int64_t batches_per_epoch() const { return (rows_per_epoch_ + opt_.batch - 1) / opt_.batch; }

 private:
  const std::vector<int64_t>& order();  // of build_'s epoch
  Batch build();                          // the batch at build_, which it advances
  const std::vector<Sample>* samples_;
  LoaderOptions opt_;
  DataPosition pos_;    // after the last batch next() returned (what checkpoints record)
  DataPosition build_;  // after the last batch built (peeked batches are ahead of pos_)
  struct Ahead {
    Batch batch;
    DataPosition after;
  };
  std::deque<Ahead> ahead_;  // peeked, not yet returned
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  int64_t rows_per_epoch_ = 0;
};

// All samples in order, once (for evaluation loss): full micro-batches, the last one completed with
// empty rows (all labels -100).
std::vector<Batch> make_batches(const std::vector<Sample>& samples, int64_t batch, int64_t seq, bool packing,
                                int32_t pad_id);

}  // namespace lt::data
