#include <cstdio>

#include "backend/cpu/blas_setup.h"
#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // Re-executes once with OpenBLAS/OpenMP settings that must be in place before the libraries load.
  lt::cpu::ensure_cpu_runtime_env(argc, argv);
  CLI::App app{"lazytrain: train large language models on limited hardware"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lazytrain 0.1.0");
  lt::cli::add_model_info(app);
  lt::cli::add_profile(app);
  lt::cli::add_plan(app);
  lt::cli::add_train(app);
  lt::cli::add_eval(app);
  lt::cli::add_generate(app);
  lt::cli::add_launch(app);
  lt::cli::add_data(app);
  lt::cli::add_tokenize(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lt::Error& e) {
    std::fprintf(stderr, "lazytrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lazytrain: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
