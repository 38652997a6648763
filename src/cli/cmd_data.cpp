// `lazytrain data math --split train|test --n N --seed S --out FILE [--options "ops=+-&max=199"]`:
// writes records of the built-in synthetic math data set (data/synth_math.h) as JSONL, the same records
// `dataset: builtin:math[-test]` gives the trainer and eval for that seed.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/synth_math.h"

namespace lt::cli {

void add_data(CLI::App& app) {
  auto* sub = app.add_subcommand("data", "Write built-in data sets as JSONL");
  sub->require_subcommand(1);
  auto* math = sub->add_subcommand("math", "Synthetic math records ({query, response}) of the train or test split");
  struct Opts {
    std::string split = "train", out, options;
    int64_t n = 0;
    uint64_t seed = 42;
  };
  auto o = std::make_shared<Opts>();
  math->add_option("--split", o->split, "train | test (test problems never appear in train)")
      ->check(CLI::IsMember({"train", "test"}));
  math->add_option("--n", o->n, "records to write (0 = the whole split)")->check(CLI::NonNegativeNumber);
  math->add_option("--seed", o->seed, "seed of the record order");
  math->add_option("--options", o->options, "builtin:math keys, e.g. \"ops=+-&max=199&style=steps&test_percent=10\"");
  math->add_option("--out", o->out, "output JSONL file")->required();
  math->callback([o] {
    std::string spec = o->split == "test" ? "builtin:math-test" : "builtin:math";
    if (!o->options.empty()) spec += "?" + o->options;
    const auto records = data::builtin_math_records(spec, o->n, o->seed);
    data::write_jsonl(o->out, records);
    std::printf("wrote %zu records of %s (seed %llu) to %s\n", records.size(), spec.c_str(),
                (unsigned long long)o->seed, o->out.c_str());
  });
}

}  // namespace lt::cli
