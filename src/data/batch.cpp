#include "data/batch.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/rng.h"

namespace lt::data {

RowBuilder::RowBuilder(int64_t batch, int64_t seq, bool pack, int32_t pad_id) : pack_(pack), pad_id_(pad_id) {
  LT_CHECK(batch >= 1 && seq >= 2, "batch: expected batch >= 1 and seq >= 2, got {} x {}", batch, seq);
  b_.batch = batch;
  b_.seq = seq;
  const auto n = static_cast<size_t>(batch * seq);
  b_.input_ids.assign(n, pad_id);
  b_.labels.assign(n, kIgnoreLabel);
  b_.positions.assign(n, 0);
  b_.segments.assign(n, 0);
}

bool RowBuilder::try_add(const Sample& s) {
  const auto len = static_cast<int64_t>(s.ids.size());
  LT_CHECK(len <= b_.seq, "batch: a sample of {} tokens does not fit seq={} (set cutoff_len <= seq)", len, b_.seq);
  if (full() || len == 0) return false;
  if (col_ > 0 && (!pack_ || col_ + len > b_.seq)) return false;
  const int64_t base = row_ * b_.seq + col_;
  for (int64_t t = 0; t < len; ++t) {
    b_.input_ids[base + t] = s.ids[t];
    b_.labels[base + t] = s.labels[t];
    b_.positions[base + t] = static_cast<int32_t>(t);
    b_.segments[base + t] = seg_;
  }
  b_.n_loss_tokens += s.n_loss();
  b_.n_real_tokens += len;
  b_.n_samples += 1;
  col_ += len;
  ++seg_;
  return true;
}

void RowBuilder::close_row() {
  if (full()) return;
  // Padding is its own segment with its own positions: real tokens never attend to it.
  const int64_t base = row_ * b_.seq;
  for (int64_t t = col_; t < b_.seq; ++t) {
    b_.positions[base + t] = static_cast<int32_t>(t - col_);
    b_.segments[base + t] = seg_;
  }
  ++row_;
  col_ = 0;
  seg_ = 0;
}

Batch RowBuilder::finish() {
  while (!full()) close_row();
  return std::move(b_);
}

nlohmann::json DataPosition::to_json() const { return {{"epoch", epoch}, {"index", index}}; }

DataPosition DataPosition::from_json(const nlohmann::json& j) {
  DataPosition p;
  for (const char* k : {"epoch", "index"}) {
    LT_CHECK(j.is_object() && j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 0,
             "data position: field '{}': expected an integer >= 0, got {}", k,
             j.is_object() && j.contains(k) ? j[k].dump() : std::string("nothing"));
  }
  p.epoch = j["epoch"].get<int64_t>();
  p.index = j["index"].get<int64_t>();
  return p;
}

DataLoader::DataLoader(const std::vector<Sample>* samples, LoaderOptions opt) : samples_(samples), opt_(opt) {
  LT_CHECK(samples_ && !samples_->empty(), "data loader: no samples");
  for (const auto& s : *samples_)
    LT_CHECK(static_cast<int64_t>(s.ids.size()) <= opt_.seq && !s.ids.empty(),
             "data loader: a sample has {} tokens; expected 1..seq={}", s.ids.size(), opt_.seq);
  // Rows of one epoch, on epoch 0's order.
  const auto& ord = order();
  if (!opt_.packing) {
    rows_per_epoch_ = static_cast<int64_t>(ord.size());
  } else {
    int64_t col = 0;
    rows_per_epoch_ = 0;
    for (int64_t i : ord) {
      const auto len = static_cast<int64_t>((*samples_)[i].ids.size());
      if (col == 0 || col + len > opt_.seq) {
        ++rows_per_epoch_;
        col = 0;
      }
      col += len;
    }
  }
}

const std::vector<int64_t>& DataLoader::order() {
  if (order_epoch_ != build_.epoch) {
    const auto n = static_cast<int64_t>(samples_->size());
    if (opt_.shuffle) {
      order_ = permutation(n, splitmix64(opt_.seed * 0x9E3779B97F4A7C15ull + uint64_t(build_.epoch)));
    } else {
      order_.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order_[i] = i;
    }
    order_epoch_ = build_.epoch;
  }
  return order_;
}

void DataLoader::restore(const DataPosition& p) {
  LT_CHECK(p.index >= 0 && p.index <= static_cast<int64_t>(samples_->size()) && p.epoch >= 0,
           "data position: index {} out of range 0..{} (was the checkpoint made with a different data set?)", p.index,
           samples_->size());
  pos_ = build_ = p;
  ahead_.clear();
}

double DataLoader::epoch_progress() const {
  return double(pos_.epoch) + double(pos_.index) / double(samples_->size());
}

Batch DataLoader::build() {
  RowBuilder rb(opt_.batch, opt_.seq, opt_.packing, opt_.pad_id);
  const auto n = static_cast<int64_t>(samples_->size());
  while (!rb.full()) {
    if (build_.index >= n) {
      ++build_.epoch;
      build_.index = 0;
    }
    const Sample& s = (*samples_)[order()[build_.index]];
    if (rb.try_add(s)) {
      ++build_.index;
    } else {
      rb.close_row();
    }
  }
  return rb.finish();
}

Batch DataLoader::next() {
  if (ahead_.empty()) {
    Batch b = build();
    pos_ = build_;
    return b;
  }
  Ahead a = std::move(ahead_.front());
  ahead_.pop_front();
  pos_ = a.after;
  return std::move(a.batch);
}

std::vector<Batch> DataLoader::peek(int64_t k) {
  while (int64_t(ahead_.size()) < k) {
    Batch b = build();
    ahead_.push_back({std::move(b), build_});
  }
  std::vector<Batch> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(ahead_[size_t(i)].batch);
  return out;
}

std::vector<Batch> make_batches(const std::vector<Sample>& samples, int64_t batch, int64_t seq, bool packing,
                                int32_t pad_id) {
  std::vector<Batch> out;
  for (const auto& s : samples) LT_CHECK(!s.ids.empty(), "make_batches: empty sample");
  size_t i = 0;
  while (i < samples.size()) {
    RowBuilder rb(batch, seq, packing, pad_id);
    while (i < samples.size() && !rb.full()) {
      if (rb.try_add(samples[i])) ++i;
      else rb.close_row();
    }
    out.push_back(rb.finish());
  }
  return out;
}

}  // namespace lt::data
