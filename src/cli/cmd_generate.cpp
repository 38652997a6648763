// Placeholder registration; replaced by the module that owns 'generate'.
#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {
void add_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "(generate: not built yet)");
  sub->callback([] { lt::fail("'generate' is not implemented yet"); });
}
}  // namespace lt::cli
