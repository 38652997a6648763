// Placeholder registration; replaced by the module that owns 'train'.
#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {
void add_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "(train: not built yet)");
  sub->callback([] { lt::fail("'train' is not implemented yet"); });
}
}  // namespace lt::cli
