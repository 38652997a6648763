// Placeholder registration; replaced by the module that owns 'plan'.
#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {
void add_plan(CLI::App& app) {
  auto* sub = app.add_subcommand("plan", "(plan: not built yet)");
  sub->callback([] { lt::fail("'plan' is not implemented yet"); });
}
}  // namespace lt::cli
