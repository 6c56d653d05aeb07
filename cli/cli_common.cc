#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/cli.h"

#include "platforms/cuda_device.h"
#include "platforms/platform.h"

namespace strata::cli {

int& ExitCode() {
  static int code = 0;
  return code;
}

void AddCommands(CLI::App* app) {
  AddRunCommand(app);
  AddInfoCommand(app);
  AddPerplexityCommand(app);
  AddBenchCommand(app);
  AddCalibrateCommand(app);
  AddConfigCommand(app);
  AddTuneCommand(app);
  AddServeCommand(app);
}

void AddCommonFlags(CLI::App* app, CommonFlags* f) {
  f->app = app;
  FlagModes& modes = FlagModes::Of(app);
  const std::string gen = FlagModes::kGeneral, gpu = "GPU (--device cuda)",
                    cpu = "CPU (without --device cuda)", disk = "Disk KV (--kv disk)";
  modes.Declare(gpu, "with --device cuda[:N] (or device: cuda in the config)",
                [f] { return f->cfg && f->cfg->engine.cuda_device >= 0; });
  modes.Declare(cpu, "on the CPU (not with --device cuda)",
                [f] { return f->cfg && f->cfg->engine.cuda_device < 0; });
  modes.Declare(disk, "with the disk KV policy (add --kv disk, or kv.policy: disk)",
                [f] { return f->cfg && f->cfg->engine.kv.policy == KvPolicyKind::kDisk; });
  f->model_opt = modes.Put(gen, app->add_option("-m,--model", f->model,
                                                "GGUF model file (default: the config's, else "
                                                "$STRATA_HOME/SmolLM2-135M-Instruct.Q4_1.gguf)"));
  modes.Put(gen,
            app->add_option("--config", f->config, "strata.yaml with settings; flags override it"));
  f->threads_opt =
      modes.Put(gen, app->add_option("-t,--threads", f->threads, "worker threads (0 = all cores)"));
  f->ctx_opt = modes.Put(
      gen, app->add_option("--ctx", f->ctx, "context length in tokens (0 = the model's)"));
  f->batch_opt =
      modes.Put(gen, app->add_option("--batch", f->batch, "most tokens per forward pass"));
  f->kv_opt = modes.Put(gen, app->add_option("--kv", f->kv, "KV policy: memory, disk"));
  f->device_opt =
      modes.Put(gen, app->add_option("--device", f->device,
                                     "cpu (default) or cuda[:N]: run the forward pass on a GPU"));
  f->gpu_weights_opt = modes.Put(
      gpu, app->add_option("--gpu-weights", f->gpu_weights,
                           "auto, device (copied into GPU memory) or mapped (read in place "
                           "from the model file, as an integrated GPU does)"));
  f->kv_dir_opt =
      modes.Put(disk, app->add_option("--kv-dir", f->kv_dir, "directory of the disk KV store"));
  f->kv_budget_opt = modes.Put(
      disk, app->add_option("--kv-budget", f->kv_budget, "disk KV memory per sequence in bytes"));
  modes.Put(cpu, app->add_flag("--no-repack", f->no_repack,
                               "read the weights in place from the file instead of a copy laid "
                               "out for the kernels (repack_weights: false)"));
}

Status ResolveConfig(const CommonFlags& f, Config* cfg, int32_t sequences, int32_t context_hint) {
  if (!f.config.empty()) STRATA_RETURN_IF_ERROR(LoadConfigFile(f.config, cfg));
  if (!cfg->tuned.empty()) {
    const int32_t ctx = f.ctx_opt->count() ? f.ctx
                        : context_hint > 0 ? context_hint
                                           : cfg->engine.n_ctx;
    STRATA_RETURN_IF_ERROR(SelectTuned(sequences, ctx, cfg));
  }
  if (f.threads_opt->count()) cfg->engine.n_threads = f.threads;
  if (f.ctx_opt->count()) cfg->engine.n_ctx = f.ctx;
  if (f.batch_opt->count()) cfg->engine.n_batch = f.batch;
  if (f.kv_opt->count())
    STRATA_RETURN_IF_ERROR(ParseKvPolicyKind(f.kv, &cfg->engine.kv.policy).WithContext("--kv"));
  if (f.device_opt->count())
    STRATA_RETURN_IF_ERROR(
        ParseComputeDevice(f.device, &cfg->engine.cuda_device).WithContext("--device"));
  // Every flag given must apply to what the config and the flags above run, before the
  // values of the flags that depend on it are read.
  f.cfg = cfg;
  const Status modes = FlagModes::Of(f.app).Check();
  f.cfg = nullptr;
  STRATA_RETURN_IF_ERROR(modes);
  if (f.no_repack) cfg->engine.repack_weights = false;
  if (f.kv_dir_opt->count()) cfg->engine.kv.disk.dir = f.kv_dir;
  if (f.gpu_weights_opt->count())
    STRATA_RETURN_IF_ERROR(
        ParseGpuWeights(f.gpu_weights, &cfg->engine.gpu.weights).WithContext("--gpu-weights"));
  if (f.kv_budget_opt->count()) {
    if (f.kv_budget < 0)
      return Status::InvalidArgument("--kv-budget: " + std::to_string(f.kv_budget) +
                                     " is negative (0 = 1/13 of the full cache)");
    cfg->engine.kv.disk.budget_bytes = f.kv_budget;
  }
  return Status::OK();
}

Status ResolveModelPath(const CommonFlags& f, const Config& cfg, std::string* path) {
  if (f.model_opt && f.model_opt->count() && f.model.empty())
    return Status::InvalidArgument("-m: the model path is empty");
  if (!f.model.empty()) {
    *path = f.model;
    return Status::OK();
  }
  if (!cfg.model.empty()) {
    *path = cfg.model;
    return Status::OK();
  }
  const char* home = std::getenv("STRATA_HOME");
  std::string dir = home && *home ? home
                                  : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") +
                                        "/.cache/strata";
  std::string def = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(def))
    return Status::NotFound("no model given (-m) and the default model " + def +
                            " is not there; run scripts/fetch_model.sh to fetch it");
  *path = def;
  return Status::OK();
}

int32_t ContextOf(const Config& cfg, const Model& model) {
  if (cfg.engine.n_ctx > 0) return cfg.engine.n_ctx;
  return model.hparams().n_ctx_train > 0 ? model.hparams().n_ctx_train : 4096;
}

uint64_t TextByteLimit(const Model& model, int64_t tokens) {
  const Tokenizer& tok = model.tokenizer();
  uint64_t longest = 1;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    longest = std::max<uint64_t>(longest, tok.TokenBytes(id, true).size());
  return uint64_t(std::max<int64_t>(tokens, 1)) * longest;
}

Status CheckConfig(const Config& cfg, const Model& model) {
  STRATA_RETURN_IF_ERROR(ValidateEngineOptions(cfg.engine, model.hparams()));
  const int32_t train = model.hparams().n_ctx_train;
  if (train > 0 && cfg.engine.n_ctx > train)
    std::fprintf(stderr,
                 "strata: warning: a context of %d tokens is beyond the %d this model was "
                 "trained on; its output past %d tokens is unreliable\n",
                 cfg.engine.n_ctx, train, train);
  if (cfg.tuned.empty()) return Status::OK();
  const TuneProvenance& p = cfg.provenance;
  if (!p.model_identity.empty() && p.model_identity != model.identity_hex())
    std::fprintf(stderr,
                 "strata: warning: %s was tuned for another model (identity %s, %s); this one "
                 "is %s: its settings may not suit it (run strata tune again)\n",
                 cfg.source.c_str(), p.model_identity.c_str(), p.model_path.c_str(),
                 model.identity_hex().c_str());
  PlatformInfo platform;
  if (!p.machine.empty() && DetectPlatform(&platform).ok()) {
    const std::string here = MachineFingerprint(platform, BlockDeviceOf(cfg.engine.kv.disk.dir));
    if (here != p.machine)
      std::fprintf(stderr,
                   "strata: warning: %s was tuned on another machine or KV device (%s); this is "
                   "%s: its speed figures may not hold (run strata tune again)\n",
                   cfg.source.c_str(), p.machine.c_str(), here.c_str());
  }
  return Status::OK();
}

Status LoadModel(const std::string& path, std::unique_ptr<Model>* model) {
  return Model::Load(path, model);
}

Status LoadConfiguredModel(const CommonFlags& f, const Config& cfg, std::string* path,
                           std::unique_ptr<Model>* model) {
  STRATA_RETURN_IF_ERROR(ResolveModelPath(f, cfg, path));
  STRATA_RETURN_IF_ERROR(LoadModel(*path, model));
  return CheckConfig(cfg, **model);
}

// "512M", "2G", "1.5GiB", "1048576": bytes. K, M, G and T are powers of 1024, with or
// without "iB" (any case); the number is read digit by digit, so a large one is exact.
Status ParseByteSize(const std::string& flag, const std::string& text, int64_t* out) {
  const std::string what = flag + ": '" + text + "'";
  if (text.empty()) return Status::InvalidArgument(flag + ": empty; give a size such as 512M");
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  using Wide = unsigned __int128;
  constexpr Wide kMax = Wide(INT64_MAX);
  size_t i = 0;
  Wide whole = 0, frac = 0, scale = 1;
  bool too_large = false;
  for (; i < text.size() && digit(text[i]); ++i) {
    whole = whole * 10 + Wide(text[i] - '0');
    too_large = too_large || whole > kMax;
    if (too_large) whole = kMax + 1;
  }
  if (i == 0)
    return Status::InvalidArgument(what + " is not a number (give a size such as 512M or 2G)");
  if (i < text.size() && text[i] == '.') {
    const size_t first = ++i;
    for (; i < text.size() && digit(text[i]); ++i)
      if (scale < Wide(1000000000000000000ull)) {  // digits past 18 cannot move a byte
        frac = frac * 10 + Wide(text[i] - '0');
        scale *= 10;
      }
    if (i == first)
      return Status::InvalidArgument(what + " is not a number (give a size such as 1.5G)");
  }
  std::string unit = text.substr(i);
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  for (const auto& [name, bits] :
       {std::pair<const char*, int>{"k", 10}, {"m", 20}, {"g", 30}, {"t", 40}})
    if (unit == name || unit == std::string(name) + "ib") shift = bits;
  if (shift < 0)
    return Status::InvalidArgument(what + ": unknown suffix '" + text.substr(i) +
                                   "' (use K, M, G or T)");
  const Wide bytes = too_large ? kMax + 1 : (whole << shift) + (frac << shift) / scale;
  if (bytes > kMax)
    return Status::InvalidArgument(what + " is too large (at most " + std::to_string(INT64_MAX) +
                                   " bytes)");
  *out = int64_t(bytes);
  return Status::OK();
}

int ReportError(const char* cmd, const Status& s) {
  std::fprintf(stderr, "strata %s: %s\n", cmd, s.ToString().c_str());
  switch (s.code()) {
    case Status::Code::kInvalidArgument:
    case Status::Code::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

nlohmann::json StatsJson(const GenerationStats& s) {
  nlohmann::json j;
  j["prompt_tokens"] = s.prompt_tokens;
  j["generated_tokens"] = s.generated_tokens;
  j["prefill_seconds"] = s.prefill_seconds;
  j["decode_seconds"] = s.decode_seconds;
  j["sample_seconds"] = s.sample_seconds;
  j["prefill_tokens_per_second"] =
      s.prefill_seconds > 0 ? double(s.prompt_tokens) / s.prefill_seconds : 0;
  j["decode_tokens_per_second"] =
      s.decode_seconds > 0 ? double(s.decode_tokens) / s.decode_seconds : 0;
  j["peak_rss_bytes"] = s.peak_rss_bytes;
  j["forward_seconds"] = {{"matmul", s.forward.matmul},
                          {"attention", s.forward.attention},
                          {"kv", s.forward.kv},
                          {"other", s.forward.other}};
  j["kv"] = {{"resident_bytes", s.kv.resident_bytes},
             {"peak_resident_bytes", s.kv.peak_resident_bytes},
             {"bytes_read", s.kv.bytes_read},
             {"bytes_written", s.kv.bytes_written},
             {"reads_issued", s.kv.reads_issued},
             {"groups_selected", s.kv.groups_selected},
             {"reuse_hits", s.kv.reuse_hits},
             {"resident_attended", s.kv.resident_attended},
             {"read_through_groups", s.kv.read_through_groups},
             {"io_wait_seconds", s.kv.io_wait_seconds},
             {"predict_seconds", s.kv.predict_seconds},
             {"budget_bytes", s.kv.budget_bytes},
             {"peak_sequence_resident_bytes", s.kv.peak_sequence_resident_bytes},
             {"peak_staging_bytes", s.kv.peak_staging_bytes},
             {"steps", s.kv.steps},
             {"step_seconds", s.kv.step_seconds},
             {"write_requests", s.kv.write_requests}};
  // Per pass averages: what one decode step moved and waited for.
  if (s.kv.steps > 0) {
    const double n = double(s.kv.steps);
    j["kv"]["per_step"] = {
        {"bytes_read", double(s.kv.bytes_read) / n},
        {"reads_issued", double(s.kv.reads_issued) / n},
        {"reuse_hits", double(s.kv.reuse_hits) / n},
        {"io_wait_seconds", s.kv.io_wait_seconds / n},
        {"compute_seconds", (s.kv.step_seconds - s.kv.io_wait_seconds - s.kv.predict_seconds) / n}};
  }
  return j;
}

}  // namespace strata::cli
