// strata bench: prompt processing and generation speed in the manner of llama-bench.
//
// pp: one forward pass over N prompt tokens from an empty context; tg: N single-token
// forward passes from an empty context. No sampling in either (the peer is measured the
// same way by bench/compare_llamacpp.py). Prints a table, or JSON with --json.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/cli.h"

namespace strata::cli {
namespace {

struct BenchFlags {
  CommonFlags common;
  int32_t pp = 512;
  int32_t tg = 128;
  int32_t reps = 3;
  int32_t depth = 0;  // tokens already in each sequence before pp and tg (llama-bench -d)
  int32_t seqs = 1;   // sequences decoded together in tg
  bool json = false;
};

using Clock = std::chrono::steady_clock;

Status Bench(const BenchFlags& f) {
  Config cfg;
  STRATA_RETURN_IF_ERROR(ResolveConfig(f.common, &cfg, std::max(1, f.seqs),
                                       std::max(0, f.depth + std::max(f.pp, 1) + f.tg)));
  if (f.pp < 0 || f.tg < 0 || f.reps < 1 || f.depth < 0 || f.seqs < 1 || f.seqs > 4096)
    return Status::InvalidArgument(
        "--pp, --tg and --depth must be >= 0, --reps >= 1 and --seqs in [1, 4096]");
  std::string path;
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadConfiguredModel(f.common, cfg, &path, &model));
  if (!f.common.ctx_opt->count()) cfg.engine.n_ctx = f.depth + std::max(f.pp, 1) + f.tg;
  // The context before the runs is prefilled in passes of 512, like llama-bench's batch.
  if (!f.common.batch_opt->count())
    cfg.engine.n_batch = std::max({f.pp, f.seqs, f.depth > 0 ? 512 : 1});
  cfg.engine.max_sequences = std::max(cfg.engine.max_sequences, f.seqs);
  // On a GPU, what the device had free before the engine existed tells what it took (the
  // CUDA context, created when the device opens, is not counted).
  uint64_t gpu_free0 = 0, gpu_total = 0;
  if (cfg.engine.cuda_device >= 0) {
    STRATA_RETURN_IF_ERROR(CudaDevice::Open(cfg.engine.cuda_device, &cfg.engine.cuda));
    STRATA_RETURN_IF_ERROR(cfg.engine.cuda->FreeMemory(&gpu_free0, &gpu_total));
  }
  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(*model, cfg.engine, &engine));
  const int32_t n_vocab = model->hparams().n_vocab;
  std::mt19937 rng(42);
  std::vector<int32_t> prompt(f.pp), context(f.depth);
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(n_vocab));
  for (int32_t& t : context) t = int32_t(rng() % uint32_t(n_vocab));

  std::vector<double> pp_tps, tg_tps;
  ForwardTimes tg_times;
  double tg_predict = 0, tg_io_wait = 0;  // the KV policy's own clocks over the tg runs
  std::vector<float> logits;
  ForwardBatch batch;
  // One warm-up pass so first-touch page faults of weights do not count.
  {
    SeqId seq;
    STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
    const int32_t t0 = 1;
    batch.Clear();
    batch.Add(seq, 0, {&t0, 1});
    STRATA_RETURN_IF_ERROR(engine->Evaluate(batch, &logits));
    STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
  }
  for (int32_t r = 0; r < f.reps; ++r) {
    if (f.pp > 0) {
      SeqId seq;
      STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
      if (f.depth > 0) STRATA_RETURN_IF_ERROR(engine->Prefill(seq, context, &logits));
      const auto a = Clock::now();
      STRATA_RETURN_IF_ERROR(engine->Prefill(seq, prompt, &logits));
      pp_tps.push_back(f.pp / std::chrono::duration<double>(Clock::now() - a).count());
      STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
    }
    if (f.tg > 0) {
      std::vector<SeqId> seqs(size_t(f.seqs));
      for (SeqId& seq : seqs) {
        STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
        if (f.depth > 0) STRATA_RETURN_IF_ERROR(engine->Prefill(seq, context, &logits));
      }
      int32_t tok = 1;
      const ForwardTimes t_before = engine->forward().times();
      const KvCounters c_before = engine->kv().counters();
      const auto a = Clock::now();
      for (int32_t i = 0; i < f.tg; ++i) {
        batch.Clear();
        for (size_t j = 0; j < seqs.size(); ++j) {
          const int32_t t = int32_t((tok + 31 * j) % uint32_t(n_vocab));
          batch.Add(seqs[j], f.depth + i, {&t, 1});
        }
        STRATA_RETURN_IF_ERROR(engine->Evaluate(batch, &logits));
        tok = int32_t((tok * 7919 + i) % n_vocab);  // any token: no sampling, like llama-bench
      }
      tg_tps.push_back(double(f.tg) * f.seqs /
                       std::chrono::duration<double>(Clock::now() - a).count());
      // Where the decode time went, by the forward pass's own clocks.
      const ForwardTimes& t_after = engine->forward().times();
      tg_times.matmul += t_after.matmul - t_before.matmul;
      tg_times.attention += t_after.attention - t_before.attention;
      tg_times.kv += t_after.kv - t_before.kv;
      tg_times.other += t_after.other - t_before.other;
      tg_times.kv_prepare += t_after.kv_prepare - t_before.kv_prepare;
      const KvCounters c_after = engine->kv().counters();
      tg_predict += c_after.predict_seconds - c_before.predict_seconds;
      tg_io_wait += c_after.io_wait_seconds - c_before.io_wait_seconds;
      for (SeqId seq : seqs) STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const int64_t rss = PeakRssBytes();
  const KvCounters kv = engine->kv().counters();
  uint64_t gpu_used = 0;
  if (cfg.engine.cuda) {
    uint64_t free1 = 0, total1 = 0;
    STRATA_RETURN_IF_ERROR(cfg.engine.cuda->FreeMemory(&free1, &total1));
    gpu_used = gpu_free0 > free1 ? gpu_free0 - free1 : 0;
  }
  // Weight bytes one decode step streams: every matrix and the output head, but of the
  // token embedding only the rows looked up (nothing, when it is not also the head).
  const ModelWeights& w = model->weights();
  const uint64_t embd_bytes = uint64_t(w.tok_embd.row_bytes) * uint64_t(w.tok_embd.rows);
  const uint64_t decode_weight_bytes =
      model->weight_bytes() - (model->hparams().tied_output ? 0 : embd_bytes);
  if (f.json) {
    nlohmann::json j{{"model", path},
                     {"decode_weight_bytes", decode_weight_bytes},
                     {"threads", engine->options().n_threads},
                     {"pp", f.pp},
                     {"tg", f.tg},
                     {"reps", f.reps},
                     {"depth", f.depth},
                     {"seqs", f.seqs},
                     {"kv", KvPolicyKindName(cfg.engine.kv.policy)},
                     {"pp_tokens_per_second", median(pp_tps)},
                     {"tg_tokens_per_second", median(tg_tps)},
                     {"pp_runs", pp_tps},
                     {"tg_runs", tg_tps},
                     {"peak_rss_bytes", rss},
                     {"backend", engine->forward().description()},
                     {"gpu_bytes_taken", gpu_used},
                     {"gpu_bytes_forward", engine->forward().device_bytes()},
                     {"kv_bytes_read", kv.bytes_read},
                     {"kv_reads_issued", kv.reads_issued},
                     {"kv_reuse_hits", kv.reuse_hits},
                     {"kv_groups_selected", kv.groups_selected},
                     {"kv_io_wait_seconds", kv.io_wait_seconds},
                     {"kv_budget_bytes", kv.budget_bytes},
                     {"kv_peak_staging_bytes", kv.peak_staging_bytes},
                     {"tg_seconds_by_part",
                      {{"matmul", tg_times.matmul},
                       {"attention", tg_times.attention},
                       {"kv", tg_times.kv},
                       {"kv_prepare", tg_times.kv_prepare},
                       {"kv_predict", tg_predict},
                       {"kv_io_wait", tg_io_wait},
                       {"other", tg_times.other}}},
                     {"kernels", kernels::IsaName(kernels::ActiveIsa())}};
    if (!cfg.tuned_choice.empty()) j["tuned"] = cfg.tuned_choice;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s, %d threads, kernels %s, median of %d runs\n", path.c_str(),
                engine->options().n_threads, kernels::IsaName(kernels::ActiveIsa()), f.reps);
    std::printf("| test  | tokens/s |\n|-------|----------|\n");
    if (f.pp > 0) std::printf("| pp%-3d | %8.2f |\n", f.pp, median(pp_tps));
    if (f.tg > 0) std::printf("| tg%-3d | %8.2f |\n", f.tg, median(tg_tps));
    std::printf("peak RSS %.1f MiB\n", double(rss) / 1048576.0);
    if (!cfg.tuned_choice.empty()) std::printf("tuned entry: %s\n", cfg.tuned_choice.c_str());
    if (cfg.engine.cuda)
      std::printf("%s; GPU memory taken %.1f MiB\n", engine->forward().description().c_str(),
                  double(gpu_used) / 1048576.0);
  }
  return Status::OK();
}

}  // namespace

void AddBenchCommand(CLI::App* app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app->add_subcommand("bench", "prompt-processing and generation speed");
  FlagModes& modes = FlagModes::Of(cmd);
  AddCommonFlags(cmd, &f->common);
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--pp", f->pp, "prompt tokens per pp run (0 = skip)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--tg", f->tg, "generated tokens per tg run (0 = skip)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--reps", f->reps, "repetitions (the median is reported)"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("-d,--depth", f->depth,
                      "tokens already in the context before each pp and tg run (llama-bench -d)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--seqs", f->seqs, "sequences decoded together in the tg runs"));
  modes.Put(FlagModes::kGeneral, cmd->add_flag("--json", f->json, "print JSON"));
  cmd->callback([f] {
    Status s = Bench(*f);
    if (!s.ok()) ExitCode() = ReportError("bench", s);
  });
}

}  // namespace strata::cli
