// Shared pieces of the `strata` command's subcommands: finding the model, layering
// strata.yaml under command-line flags, and printing errors.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "cli/flag_modes.h"
#include "common/status.h"
#include "runtime/config/config.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"

namespace strata::cli {

// Flags every subcommand that runs the model accepts, applied over the config file.
struct CommonFlags {
  std::string model;
  std::string config;
  int32_t threads = 0;
  int32_t ctx = 0;
  int32_t batch = 0;
  std::string kv;
  std::string device;
  std::string gpu_weights;
  std::string kv_dir;
  int64_t kv_budget = 0;
  CLI::Option* model_opt = nullptr;  // -m given (perhaps as ""): not the default model
  CLI::Option* threads_opt = nullptr;
  CLI::Option* ctx_opt = nullptr;
  CLI::Option* batch_opt = nullptr;
  CLI::Option* kv_opt = nullptr;
  CLI::Option* device_opt = nullptr;
  CLI::Option* gpu_weights_opt = nullptr;
  CLI::Option* kv_dir_opt = nullptr;
  CLI::Option* kv_budget_opt = nullptr;
  bool no_repack = false;
  CLI::App* app = nullptr;              // the subcommand, whose FlagModes ResolveConfig checks
  mutable const Config* cfg = nullptr;  // the resolved config, while ResolveConfig checks modes
};
// Also declares the modes of the common flags (GPU, CPU, disk KV) on `app`.
void AddCommonFlags(CLI::App* app, CommonFlags* f);
// Loads the config file (if any), applies its tuned entry nearest to `sequences` decoded
// together and the context (--ctx, else context_hint when > 0, else the config's), then the
// flags given on the command line. Flags that do not apply to the configured KV policy are
// errors, and so is every flag of the subcommand whose mode does not apply (FlagModes).
Status ResolveConfig(const CommonFlags& f, Config* cfg, int32_t sequences = 1,
                     int32_t context_hint = 0);
// Refuses engine settings out of range for `model` first, then warns on stderr: a context
// beyond what the model was trained on; tuned settings measured on another model or another
// machine.
Status CheckConfig(const Config& cfg, const Model& model);
// The context a run of `cfg` gets: the configured one, else the model's.
int32_t ContextOf(const Config& cfg, const Model& model);
// The most bytes of text that can fit in `tokens` tokens: no token stands for more bytes than
// the vocabulary's longest, so a longer text cannot fit. Prompts, system prompts and chat
// lines are refused beyond it before they are held in memory whole, which bounds what a
// prompt source (an endless pipe, /dev/zero) can cost by the context, not by the source.
uint64_t TextByteLimit(const Model& model, int64_t tokens);
// The model path: -m, else the config's `model`, else the default model in $STRATA_HOME.
Status ResolveModelPath(const CommonFlags& f, const Config& cfg, std::string* path);
Status LoadModel(const std::string& path, std::unique_ptr<Model>* model);
// What run, serve, bench and perplexity start with: the model the flags and the config name
// (ResolveModelPath), loaded, and the config checked against it (CheckConfig).
Status LoadConfiguredModel(const CommonFlags& f, const Config& cfg, std::string* path,
                           std::unique_ptr<Model>* model);

// "512M", "2G", "1.5GiB", "1048576": bytes (0 allowed). K, M, G and T are powers of 1024,
// with or without "iB" (any case). Errors name the flag, the text and what is wrong (not a
// number, an unknown suffix, too large).
Status ParseByteSize(const std::string& flag, const std::string& text, int64_t* out);

// Prints "strata <cmd>: <message>" to stderr and returns the exit code for `s`.
int ReportError(const char* cmd, const Status& s);

nlohmann::json StatsJson(const GenerationStats& s);

// The exit code main returns, set by the subcommand that ran.
int& ExitCode();

// Every subcommand, as the `strata` command has them.
void AddCommands(CLI::App* app);
void AddRunCommand(CLI::App* app);
void AddInfoCommand(CLI::App* app);
void AddPerplexityCommand(CLI::App* app);
void AddBenchCommand(CLI::App* app);
void AddCalibrateCommand(CLI::App* app);
void AddConfigCommand(CLI::App* app);
void AddTuneCommand(CLI::App* app);
void AddServeCommand(CLI::App* app);

}  // namespace strata::cli
