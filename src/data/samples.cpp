#include "data/samples.h"

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

std::vector<Sample> tokenize_records(const std::vector<Record>& records, const ChatTemplate& tmpl,
                                     const TokenizeOptions& opt, TokenizeStats* stats) {
  LT_CHECK(opt.cutoff_len >= 2, "cutoff_len: expected >= 2, got {}", opt.cutoff_len);
  TokenizeStats local;
  TokenizeStats& st = stats ? *stats : local;
  st = TokenizeStats{};
  std::vector<Sample> out;
  out.reserve(records.size());
  for (const auto& r : records) {
    Sample s = make_sample(r.is_text ? tmpl.encode_text(r.text) : tmpl.encode(r.messages, opt.train_on_inputs));
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
    out.push_back(std::move(s));
  }
  st.samples = static_cast<int64_t>(out.size());
  if (st.truncated || st.skipped_long || st.skipped_no_loss)
    log_info("data: {} samples kept; {} truncated, {} skipped as longer than cutoff_len={}, {} skipped without loss tokens",
             st.samples, st.truncated, st.skipped_long, opt.cutoff_len, st.skipped_no_loss);
  LT_CHECK(!out.empty(), "data: no usable samples ({} records; {} too long, {} without loss tokens)", records.size(),
           st.skipped_long, st.skipped_no_loss);
  return out;
}

}  // namespace lt::data
