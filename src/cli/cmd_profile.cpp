// Placeholder registration; replaced by the module that owns 'profile'.
#include "cli/commands.h"
#include "core/error.h"

namespace lt::cli {
void add_profile(CLI::App& app) {
  auto* sub = app.add_subcommand("profile", "(profile: not built yet)");
  sub->callback([] { lt::fail("'profile' is not implemented yet"); });
}
}  // namespace lt::cli
