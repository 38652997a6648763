#include "data/prepare.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace lt::data {

PreparedData prepare_data(const DataConfig& cfg, const LoadedTokenizer& tok) {
  LT_CHECK(!cfg.dataset.empty(), "dataset: not set (a JSONL path, or builtin:math)");
  LT_CHECK(cfg.on_malformed == "skip" || cfg.on_malformed == "fatal",
           "on_malformed: unknown '{}'; choices: skip, fatal", cfg.on_malformed);
  PreparedData d{ChatTemplate::resolve(cfg.template_name, tok.tokenizer, tok.config), {}, {}, {}, {}, {}};
  ReadOptions ro;
  ro.format = parse_record_format(cfg.format);
  ro.malformed_fatal = cfg.on_malformed == "fatal";
  ro.max_samples = cfg.max_samples;
  ro.seed = cfg.seed;
  ro.stop_requested = cfg.stop_requested;
  const auto check_stop = [&](const char* before) {
    if (cfg.stop_requested && cfg.stop_requested()) throw StopRequested(fmt::format("before {}", before));
  };
  std::vector<Record> all = load_records(cfg.dataset, ro, &d.read);
  std::vector<Record> train, val;
  if (!cfg.eval_dataset.empty()) {
    train = std::move(all);
    ReadOptions vo = ro;
    vo.max_samples = 0;
    vo.seed = cfg.seed + 1;
    // A builtin eval set is sized like a validation split: val_size as a count, else 500 records.
    if (cfg.eval_dataset.rfind("builtin:", 0) == 0) vo.max_samples = cfg.val_size >= 1 ? int64_t(cfg.val_size) : 500;
    val = load_records(cfg.eval_dataset, vo);
  } else {
    split_train_val(std::move(all), cfg.val_size, cfg.seed, train, val);
  }
  check_stop("tokenising the records");
  TokenizeOptions to;
  to.cutoff_len = cfg.cutoff_len;
  to.overlong = parse_overlong(cfg.overlong);
  to.train_on_inputs = cfg.train_on_inputs;
  to.threads = cfg.threads;
  to.stop_requested = cfg.stop_requested;
  const auto t0 = std::chrono::steady_clock::now();
  d.train = tokenize_records(train, d.tmpl, to, &d.train_stats);
  if (!val.empty()) d.val = tokenize_records(val, d.tmpl, to, &d.val_stats);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("data: {} train samples ({} tokens, {} loss tokens), {} validation samples; template {}; tokenised in {:.2f} s",
           d.train.size(), d.train_stats.tokens, d.train_stats.loss_tokens, d.val.size(), template_name(d.tmpl.kind()),
           secs);
  return d;
}

}  // namespace lt::data
