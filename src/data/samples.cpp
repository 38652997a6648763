#include "data/samples.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace lt::data {

int64_t Sample::n_loss() const {
  int64_t n = 0;
  for (size_t t = 1; t < labels.size(); ++t) n += labels[t] != kIgnoreLabel;
  return n;
}

Overlong parse_overlong(const std::string& name) {
  if (name == "truncate") return Overlong::Truncate;
  if (name == "skip") return Overlong::Skip;
  fail("overlong: unknown policy '{}'; choices: truncate, skip", name);
}

Sample make_sample(const Encoded& e) {
  LT_CHECK(e.ids.size() == e.loss.size(), "internal: {} ids but {} loss flags", e.ids.size(), e.loss.size());
  Sample s;
  s.ids = e.ids;
  s.labels.resize(e.ids.size());
  for (size_t t = 0; t < e.ids.size(); ++t) s.labels[t] = e.loss[t] ? e.ids[t] : kIgnoreLabel;
  return s;
}

namespace {
int encode_threads(int requested, size_t n_records) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t want = requested > 0 ? size_t(requested) : cores;
  return int(std::clamp<size_t>(std::min(want, (n_records + 63) / 64), 1, want));  // >= 64 records each
}

// Encodes every record (no cutoff policy yet) into out[i], with `threads` workers taking blocks of
// records in increasing order. On errors: every block before the failing one is finished, and the
// error of the lowest failing record is rethrown, so the outcome is the single-thread one.
void encode_all(const std::vector<Record>& records, const ChatTemplate& tmpl, bool train_on_inputs, int threads,
                const StopCheck& stop_requested, std::vector<Sample>& out) {
  out.assign(records.size(), Sample{});
  auto encode_one = [&](size_t i) {
    const Record& r = records[i];
    out[i] = make_sample(r.is_text ? tmpl.encode_text(r.text) : tmpl.encode(r.messages, train_on_inputs));
  };
  constexpr size_t kBlock = 64;
  std::atomic<bool> stopped{false};
  // Polled once per block; the first true is kept so that every thread stops.
  auto stop_now = [&] {
    if (stopped.load(std::memory_order_relaxed)) return true;
    if (stop_requested && stop_requested()) stopped = true;
    return stopped.load(std::memory_order_relaxed);
  };
  auto stop_error = [&] {
    return StopRequested(fmt::format("while tokenising {} records", records.size()));
  };
  if (threads <= 1) {
    for (size_t i = 0; i < records.size(); ++i) {
      if (i % kBlock == 0 && stop_now()) throw stop_error();
      encode_one(i);
    }
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t err_at = SIZE_MAX;
  std::exception_ptr err;
  auto worker = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      if (stop_now()) return;
      const size_t b = next.fetch_add(kBlock);
      if (b >= records.size()) return;
      const size_t e = std::min(records.size(), b + kBlock);
      for (size_t i = b; i < e; ++i) {
        try {
          encode_one(i);
        } catch (...) {
          std::lock_guard<std::mutex> lk(mu);
          if (i < err_at) err_at = i, err = std::current_exception();
          failed = true;
          break;
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (stopped) throw stop_error();
  if (err) std::rethrow_exception(err);
}
}  // namespace

std::vector<Sample> tokenize_records(const std::vector<Record>& records, const ChatTemplate& tmpl,
                                     const TokenizeOptions& opt, TokenizeStats* stats) {
  LT_CHECK(opt.cutoff_len >= 2, "cutoff_len: expected >= 2, got {}", opt.cutoff_len);
  TokenizeStats local;
  TokenizeStats& st = stats ? *stats : local;
  st = TokenizeStats{};
  std::vector<Sample> out;
  encode_all(records, tmpl, opt.train_on_inputs, encode_threads(opt.threads, records.size()), opt.stop_requested, out);
  // The cutoff policy and the stats, in record order.
  size_t kept = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    Sample s = std::move(out[i]);
    if (static_cast<int64_t>(s.ids.size()) > opt.cutoff_len) {
      if (opt.overlong == Overlong::Skip) {
        ++st.skipped_long;
        continue;
      }
      s.ids.resize(opt.cutoff_len);
      s.labels.resize(opt.cutoff_len);
      ++st.truncated;
    }
    const int64_t nl = s.n_loss();
    if (nl == 0) {
      ++st.skipped_no_loss;
      continue;
    }
    st.tokens += static_cast<int64_t>(s.ids.size());
    st.loss_tokens += nl;
    out[kept++] = std::move(s);
  }
  out.resize(kept);
  st.samples = static_cast<int64_t>(out.size());
  if (st.truncated || st.skipped_long || st.skipped_no_loss)
    log_info("data: {} samples kept; {} truncated, {} skipped as longer than cutoff_len={}, {} skipped without loss tokens",
             st.samples, st.truncated, st.skipped_long, opt.cutoff_len, st.skipped_no_loss);
  LT_CHECK(!out.empty(), "data: no usable samples ({} records; {} too long, {} without loss tokens)", records.size(),
           st.skipped_long, st.skipped_no_loss);
  return out;
}

}  // namespace lt::data
