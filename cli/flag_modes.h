// One rule for the `strata` command's flags: each belongs to a mode of its subcommand (plain
// generation, chat, beam search, the disk KV policy, a GPU, ...), shown as a group in --help,
// and a flag given while its mode does not apply is an error naming the flag and what it needs,
// never silently ignored. Every flag must be put in a declared mode; one that is not makes
// Check() fail, and a test walks every flag of every subcommand, so a new flag cannot be
// added without saying when it applies.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::cli {

class FlagModes {
 public:
  // The group of flags that apply whenever the subcommand runs.
  static constexpr const char* kGeneral = "General";

  // The modes of `cmd`, made on first use (with kGeneral declared).
  static FlagModes& Of(CLI::App* cmd);
  // Nullptr for a subcommand that declared none.
  static const FlagModes* Find(const CLI::App* cmd);

  // A mode named `group` (its --help heading). `needs` says what turns it on, as the error
  // words it ("with --beams N"); `applies` is asked after the flags and the config file are
  // resolved.
  void Declare(const std::string& group, const std::string& needs, std::function<bool()> applies);
  // Puts `opt` in the declared `group`; returns it for chaining.
  CLI::Option* Put(const std::string& group, CLI::Option* opt);

  // InvalidArgument for the first flag given whose mode does not apply; Internal for a flag
  // in no declared mode.
  Status Check() const;

  struct Mode {
    std::string group, needs;
    std::function<bool()> applies;
  };
  // The mode `opt` belongs to, or nullptr.
  const Mode* ModeOf(const CLI::Option* opt) const;

 private:
  explicit FlagModes(CLI::App* cmd);
  CLI::App* cmd_;
  std::vector<Mode> modes_;
};

}  // namespace strata::cli
