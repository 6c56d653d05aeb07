#include "cli/cmd_run_beams.h"

#include <cstdio>

#include "cli/cli.h"
#include "platforms/cuda_device.h"
#include "runtime/search/beam_search.h"

namespace strata::cli {

void AddBeamFlags(CLI::App* cmd, BeamFlags* f, const CommonFlags* common) {
  FlagModes& modes = FlagModes::Of(cmd);
  const std::string beam = "Beam search (--beams)",
                    slow = "Beam search's slow tier (--beam-budget)",
                    slow_gpu = "Beam search's slow tier on a GPU",
                    shared = "Beam search with a scorer in the budget";
  const auto budget = [f] { return BeamSearchRequested(*f) && !f->budget.empty(); };
  modes.Declare(beam, "with --beams N", [f] { return BeamSearchRequested(*f); });
  modes.Declare(slow,
                "with --beams N and --beam-budget (the slow tier holds what the budget "
                "does not)",
                budget);
  modes.Declare(slow_gpu,
                "with --beams N, --beam-budget and a GPU (--beam-device or --device cuda)",
                [f, common, budget] {
                  int32_t dev = common->cfg ? common->cfg->engine.cuda_device : -1;
                  if (f->device_opt->count() && !ParseComputeDevice(f->device, &dev).ok())
                    return true;  // the bad device is reported when the search starts
                  return budget() && dev >= 0;
                });
  modes.Declare(shared, "with --beams N, --scorer-model and --beam-budget",
                [f, budget] { return budget() && !f->scorer_model.empty(); });
  f->beams_opt =
      modes.Put(FlagModes::kGeneral,
                cmd->add_option("--beams", f->beams,
                                "step-wise beam search: beams generating in every step"));
  modes.Put(beam, cmd->add_option("--beam-width", f->width,
                                  "children of each kept beam (beams / width kept)"));
  modes.Put(beam, cmd->add_option("--step-tokens", f->step_tokens,
                                  "tokens per step (the most, with a delimiter)"));
  modes.Put(beam, cmd->add_option("--step-delimiter", f->delimiter,
                                  "a step ends after the token that completes this text (e.g. "
                                  "$'\\n\\n')"));
  modes.Put(beam, cmd->add_option("--max-steps", f->max_steps,
                                  "steps at most (0: until every beam ended)"));
  modes.Put(beam, cmd->add_option("--beam-budget", f->budget,
                                  "fast-tier KV bytes for the search, K/M/G suffixes (default: "
                                  "all in memory)"));
  modes.Put(beam, cmd->add_option("--beam-schedule", f->schedule,
                                  "balanced (default), prefix, grouped or tokenwise (the "
                                  "baseline)"));
  modes.Put(beam,
            cmd->add_option("--speculate", f->speculate,
                            "speculative beam extension: a beam that ends its step early goes "
                            "on as its first child for this share of the mean step length (0.5 "
                            "when given alone); the results do not change")
                ->expected(0, 1)
                ->default_str("0.5"));
  modes.Put(beam, cmd->add_option("--scorer-model", f->scorer_model,
                                  "GGUF model scoring each step (default: the generator's mean "
                                  "log-probability)"));
  modes.Put(shared, cmd->add_option("--verifier-share", f->verifier_share,
                                    "the budget holds both models' KV: auto (default: a cost "
                                    "model splits it before each phase) or the scorer's fixed "
                                    "share in [0, 1] (0.5: even)"));
  modes.Put(slow,
            cmd->add_option("--beam-slow-dir", f->slow_dir, "directory of the slow tier's file"));
  modes.Put(slow, cmd->add_flag("--beam-slow-ram", f->slow_ram,
                                "keep the slow tier in host RAM instead"));
  modes.Put(slow_gpu, cmd->add_flag("--beam-slow-disk", f->slow_disk,
                                    "the slow tier is the block store in --beam-slow-dir, staged "
                                    "through pinned host RAM, instead of pinned host RAM"));
  f->device_opt = modes.Put(
      beam, cmd->add_option("--beam-device", f->device,
                            "cpu or cuda[:N] (default: --device): KV in GPU memory, slow tier "
                            "in pinned host RAM"));
}

bool BeamSearchRequested(const BeamFlags& f) { return f.beams_opt && f.beams_opt->count() > 0; }

Status RunBeamSearchCommand(const BeamFlags& f, const Config& cfg, const Model& model,
                            const std::string& prompt, bool chat, bool stats) {
  if (prompt.empty()) return Status::InvalidArgument("--beams needs a prompt (-p, -f or stdin)");
  BeamSearchParams p;
  p.n_beams = f.beams;
  p.beam_width = f.width;
  p.step_tokens = f.step_tokens;
  p.step_delimiter = f.delimiter;
  p.max_steps = f.max_steps;
  p.sampling = cfg.generate.sampling;
  p.ignore_eos = cfg.generate.ignore_eos;
  p.n_threads = cfg.engine.n_threads;
  p.slow_dir = f.slow_dir;
  p.slow_in_ram = f.slow_ram;
  p.gpu_slow_on_disk = f.slow_disk;
  p.speculate = f.speculate;
  STRATA_RETURN_IF_ERROR(
      ParseVerifierShare(f.verifier_share, &p.verifier_share).WithContext("--verifier-share"));
  // --beam-device, else the engine's device (--device or the config's `device`).
  p.cuda_device = cfg.engine.cuda_device;
  if (f.device_opt && f.device_opt->count())
    STRATA_RETURN_IF_ERROR(
        ParseComputeDevice(f.device, &p.cuda_device).WithContext("--beam-device"));
  if (!f.budget.empty()) {
    int64_t budget = 0;
    STRATA_RETURN_IF_ERROR(ParseByteSize("--beam-budget", f.budget, &budget));
    p.fast_budget_bytes = uint64_t(budget);
  }
  STRATA_RETURN_IF_ERROR(ParseBeamSchedule(f.schedule, &p.schedule).WithContext("--beam-schedule"));
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(EncodeBeamPrompt(model, prompt, chat, &ids));
  // -n 0 means "until the context is full" for plain generation; here, the model's context.
  p.max_tokens = cfg.generate.max_tokens > 0
                     ? cfg.generate.max_tokens
                     : std::max(1, model.hparams().n_ctx_train - int32_t(ids.size()));

  std::unique_ptr<Model> scorer;
  std::unique_ptr<ModelVerifier> verifier;
  if (!f.scorer_model.empty())
    STRATA_RETURN_IF_ERROR(ModelVerifier::Load(f.scorer_model, model, p.n_threads, ids.size(),
                                               p.max_tokens, p.n_beams, &scorer, &verifier));
  std::vector<BeamResult> results;
  BeamSearchStats st;
  STRATA_RETURN_IF_ERROR(RunBeamSearch(model, ids, p, verifier.get(), &results, &st));
  for (size_t i = 0; i < results.size(); ++i) {
    const BeamResult& r = results[i];
    std::printf("--- beam %zu of %zu: score %.4f, %d steps, %zu tokens, %s ---\n%s\n", i + 1,
                results.size(), r.score, r.steps, r.tokens.size(), BeamStopName(r.stop),
                r.text.c_str());
  }
  if (stats) {
    nlohmann::json j;
    j["beams"] = p.n_beams;
    j["beam_width"] = p.beam_width;
    j["step_tokens"] = p.step_tokens;
    j["schedule"] = BeamScheduleName(p.schedule);
    j["verifier"] = st.verifier;
    j["threads"] = p.n_threads;
    j["prompt_tokens"] = st.prompt_tokens;
    j["steps"] = st.steps;
    j["rounds"] = st.rounds;
    j["generated_tokens"] = st.generated_tokens;
    j["finished_tokens"] = st.finished_tokens;
    j["goodput_tokens_per_second"] = st.seconds > 0 ? double(st.finished_tokens) / st.seconds : 0;
    j["speculate"] = p.speculate;
    j["speculative_tokens"] = st.speculative_tokens;
    j["speculative_tokens_kept"] = st.speculative_tokens_kept;
    j["verifier_ahead_tokens"] = st.verifier_ahead_tokens;
    j["verifier_ahead_reused"] = st.verifier_ahead_reused;
    j["idle_slot_share"] =
        st.slot_passes > 0 ? double(st.idle_slot_passes) / double(st.slot_passes) : 0;
    j["forward_passes"] = st.forward_passes;
    j["seconds"] = st.seconds;
    j["prefill_seconds"] = st.prefill_seconds;
    j["score_seconds"] = st.score_seconds;
    j["bytes_read"] = st.kv.bytes_read;
    j["bytes_written"] = st.kv.bytes_written;
    j["bytes_moved"] = st.kv.bytes_read + st.kv.bytes_written;
    j["blocks_shared_peak"] = st.peak_shared_blocks;
    j["blocks_loaded"] = st.kv.blocks_loaded;
    j["blocks_prefetched"] = st.kv.blocks_prefetched;
    j["blocks_written"] = st.kv.blocks_written;
    j["layer_reads"] = st.kv.layer_reads;
    j["cow_copies"] = st.kv.cow_copies;
    j["stall_seconds"] = st.kv.stall_seconds;
    j["block_bytes"] = st.kv.block_bytes;
    j["peak_tree_bytes"] = st.peak_tree_bytes;
    j["fast_budget_bytes"] = st.kv.fast_budget_bytes;
    j["peak_fast_bytes"] = st.kv.peak_fast_bytes;
    j["slow_tier"] = st.slow_tier;
    if (st.shared_budget) {
      j["verifier_share"] = f.verifier_share;
      j["generator_phase_share"] = st.generator_phase_share;
      j["verifier_phase_share"] = st.verifier_phase_share;
      j["peak_fast_bytes_both"] = st.peak_fast_bytes_total;
      j["verifier_bytes_read"] = st.verifier_kv.bytes_read;
      j["verifier_bytes_written"] = st.verifier_kv.bytes_written;
      j["verifier_peak_fast_bytes"] = st.verifier_kv.peak_fast_bytes;
    }
    std::fprintf(stderr, "%s\n", j.dump(2).c_str());
  }
  return Status::OK();
}

}  // namespace strata::cli
