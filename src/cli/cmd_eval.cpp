// Placeholder registration; replaced by the module that owns 'eval'.
#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {
void add_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "(eval: not built yet)");
  sub->callback([] { lt::fail("'eval' is not implemented yet"); });
}
}  // namespace lt::cli
