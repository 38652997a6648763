// Each subcommand of `lazytrain` lives in its own cmd_<name>.cpp and registers
// itself on the CLI11 app here. The callback runs the command; errors are lt::Error.
#pragma once
#include <CLI/CLI.hpp>

namespace lt::cli {
void add_model_info(CLI::App& app);  // cmd_model_info.cpp
void add_profile(CLI::App& app);     // cmd_profile.cpp
void add_plan(CLI::App& app);        // cmd_plan.cpp
void add_train(CLI::App& app);       // cmd_train.cpp
void add_eval(CLI::App& app);        // cmd_eval.cpp
void add_generate(CLI::App& app);    // cmd_generate.cpp
void add_launch(CLI::App& app);      // cmd_launch.cpp
void add_data(CLI::App& app);        // cmd_data.cpp
void add_tokenize(CLI::App& app);    // cmd_tokenize.cpp
}  // namespace lt::cli
