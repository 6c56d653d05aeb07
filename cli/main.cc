// The `strata` command: run (generate or chat), info, perplexity, bench, calibrate, config,
// tune.
#include <CLI/CLI.hpp>

#include "cli/cli.h"

int main(int argc, char** argv) {
  CLI::App app{"strata: LLM runtime for devices whose memory cannot hold the KV cache"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  strata::cli::AddCommands(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return strata::cli::ExitCode();
}
