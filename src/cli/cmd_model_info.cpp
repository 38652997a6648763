// Placeholder registration; replaced by the module that owns 'model-info'.
#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {
void add_model_info(CLI::App& app) {
  auto* sub = app.add_subcommand("model-info", "(model-info: not built yet)");
  sub->callback([] { lt::fail("'model-info' is not implemented yet"); });
}
}  // namespace lt::cli
