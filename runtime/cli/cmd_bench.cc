// strata bench: prompt processing and generation speed in the manner of llama-bench.
//
// pp: one forward pass over N prompt tokens from an empty context; tg: N single-token
// forward passes from an empty context. No sampling in either (the peer is measured the
// same way by bench/compare_llamacpp.py). Prints a table, or JSON with --json.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "runtime/cli/cli.h"

namespace strata::cli {
namespace {

struct BenchFlags {
  CommonFlags common;
  int32_t pp = 512;
  int32_t tg = 128;
  int32_t reps = 3;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

Status Bench(const BenchFlags& f) {
  Config cfg;
  STRATA_RETURN_IF_ERROR(ResolveConfig(f.common, &cfg));
  if (f.pp < 0 || f.tg < 0 || f.reps < 1)
    return Status::InvalidArgument("--pp and --tg must be >= 0 and --reps >= 1");
  std::string path;
  STRATA_RETURN_IF_ERROR(ResolveModelPath(f.common, cfg, &path));
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadModel(path, &model));
  if (!f.common.ctx_opt->count()) cfg.engine.n_ctx = std::max(f.pp, 1) + f.tg;
  if (!f.common.batch_opt->count()) cfg.engine.n_batch = std::max(f.pp, 1);
  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(*model, cfg.engine, &engine));
  const int32_t n_vocab = model->hparams().n_vocab;
  std::mt19937 rng(42);
  std::vector<int32_t> prompt(f.pp);
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(n_vocab));

  std::vector<double> pp_tps, tg_tps;
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
      const auto a = Clock::now();
      STRATA_RETURN_IF_ERROR(engine->Prefill(seq, prompt, &logits));
      pp_tps.push_back(f.pp / std::chrono::duration<double>(Clock::now() - a).count());
      STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
    }
    if (f.tg > 0) {
      SeqId seq;
      STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
      int32_t tok = 1;
      const auto a = Clock::now();
      for (int32_t i = 0; i < f.tg; ++i) {
        batch.Clear();
        batch.Add(seq, i, {&tok, 1});
        STRATA_RETURN_IF_ERROR(engine->Evaluate(batch, &logits));
        tok = int32_t((tok * 7919 + i) % n_vocab);  // any token: no sampling, like llama-bench
      }
      tg_tps.push_back(f.tg / std::chrono::duration<double>(Clock::now() - a).count());
      STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const int64_t rss = PeakRssBytes();
  if (f.json) {
    nlohmann::json j{{"model", path},
                     {"threads", engine->options().n_threads},
                     {"pp", f.pp},
                     {"tg", f.tg},
                     {"reps", f.reps},
                     {"pp_tokens_per_second", median(pp_tps)},
                     {"tg_tokens_per_second", median(tg_tps)},
                     {"pp_runs", pp_tps},
                     {"tg_runs", tg_tps},
                     {"peak_rss_bytes", rss},
                     {"kernels", kernels::IsaName(kernels::ActiveIsa())}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s, %d threads, kernels %s, median of %d runs\n", path.c_str(),
                engine->options().n_threads, kernels::IsaName(kernels::ActiveIsa()), f.reps);
    std::printf("| test  | tokens/s |\n|-------|----------|\n");
    if (f.pp > 0) std::printf("| pp%-3d | %8.2f |\n", f.pp, median(pp_tps));
    if (f.tg > 0) std::printf("| tg%-3d | %8.2f |\n", f.tg, median(tg_tps));
    std::printf("peak RSS %.1f MiB\n", rss / 1048576.0);
  }
  return Status::OK();
}

}  // namespace

void AddBenchCommand(CLI::App* app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app->add_subcommand("bench", "prompt-processing and generation speed");
  AddCommonFlags(cmd, &f->common);
  cmd->add_option("--pp", f->pp, "prompt tokens per pp run (0 = skip)");
  cmd->add_option("--tg", f->tg, "generated tokens per tg run (0 = skip)");
  cmd->add_option("--reps", f->reps, "repetitions (the median is reported)");
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->callback([f] {
    Status s = Bench(*f);
    if (!s.ok()) ExitCode() = ReportError("bench", s);
  });
}

}  // namespace strata::cli
