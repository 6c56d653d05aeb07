// `strata run --beams N ...`: step-wise beam search from the run command's prompt, printing
// the ranked beams (and, with --stats, the search's counters as JSON on stderr).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/status.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"

namespace strata::cli {

struct BeamFlags {
  int32_t beams = 0;  // 0: no beam search
  int32_t width = 2;
  int32_t step_tokens = 32;
  std::string delimiter;
  int32_t max_steps = 0;
  std::string budget;  // fast-tier KV bytes, with an optional K/M/G suffix (binary)
  std::string schedule = "balanced";
  std::string scorer_model;
  std::string slow_dir;
  bool slow_ram = false;
  bool slow_disk = false;  // on a GPU: the block store (staged) instead of pinned host RAM
  std::string device;      // cpu, cuda or cuda:N; default: the engine's device
  float speculate = 0.0f;  // speculative beam extension: share of the mean step length
  std::string verifier_share = "auto";  // of a shared budget: auto or a share in [0, 1]
  CLI::Option* beams_opt = nullptr;
  CLI::Option* device_opt = nullptr;
};

// Declares the beam search's modes on `cmd` (whether a GPU applies is read from `common`'s
// resolved config).
struct CommonFlags;
void AddBeamFlags(CLI::App* cmd, BeamFlags* f, const CommonFlags* common);
bool BeamSearchRequested(const BeamFlags& f);
// cfg supplies threads and the generation flags (-n, sampling, --ignore-eos).
Status RunBeamSearchCommand(const BeamFlags& f, const Config& cfg, const Model& model,
                            const std::string& prompt, bool chat, bool stats);

}  // namespace strata::cli
