// bench_beam_search: locality-aware beam scheduling against the token-by-token baseline.
//
// For every (beams, step length) it runs the same seeded step-wise beam search four ways,
// under a fast-tier budget that is a share (default 25%) of the KV the search needs (the
// prompt once plus every beam's generated tokens), with the block store on disk as the slow
// tier: (a) token by token with per-layer offloading and next-layer prefetch, (b) grouping
// for inter-token locality only, (c) plus prefix-aware grouping, (d) plus balanced groups and
// prefetch. It prints one table per configuration (bytes moved between the tiers, end-to-end
// time, rounds, stall time) and checks that all four return the same ranked beams.
//
//   bench_beam_search --text FILE --quick              # a smoke run, about a minute
//   bench_beam_search --text FILE --beams 16,32,64 --steps 32,64 --gen 512 --threads 2
//   bench_beam_search --text FILE --cuda 0 ...         # on a GPU, pinned host RAM as slow tier
//   bench_beam_search ... --cuda 0 --cuda-slow-disk    # on a GPU, the block store as slow tier
//
// The prompt is the start of --text (required). tuner/data/calibration.txt, the start of
// tinyshakespeare, gives the prompt of the tables in docs/experiments/beam-search.md.
//
// With --scorer-model a second GGUF scores each step and its KV shares the budget (which is
// then a share of both models' KV); --verifier-shares runs every schedule once per split
// (the scorer's fixed share, or auto for the cost model's).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/search/beam_search.h"

namespace strata::bench {
namespace {

struct Flags {
  std::string model;
  std::string text;  // the prompt source (required)
  std::string slow_dir;
  std::string json;
  std::vector<int32_t> beams = {16, 32, 64};
  std::vector<int32_t> steps = {32, 64};
  std::vector<std::string> schedules = {"a", "b", "c", "d"};
  int32_t prompt_tokens = 128;
  int32_t gen = 512;
  int32_t width = 2;
  int32_t threads = 2;
  double share = 0.25;
  double emulate_mbps = 0;
  std::vector<double> also_emulate_mbps;
  std::vector<int32_t> also_emulate_beams = {32};
  std::vector<int32_t> also_emulate_steps;          // empty: --steps
  std::vector<std::string> also_emulate_schedules;  // empty: --schedules
  uint64_t seed = 42;
  bool quick = false;
  std::string delimiter;        // steps end at this text (at most the step length); empty: fixed
  double speculate = 0;         // > 0: each grouped schedule again with speculative extension
  int32_t cuda_device = -1;     // >= 0: on this GPU, slow tier in pinned host RAM
  bool cuda_slow_disk = false;  // on the GPU, the block store (staged) as the slow tier
  std::string scorer_model;     // a second GGUF as the verifier
  std::vector<std::string> verifier_shares;  // with it: auto or shares in [0, 1]; default auto
};

struct Row {
  std::string schedule;
  BeamSearchStats st;
  double cpu_seconds = 0;  // this process, all threads: with wall time, shows contention
  bool same = true;
};

double LoadAverage() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : 0.0;
}

double CpuSeconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

std::string DefaultModel() {
  if (const char* p = std::getenv("STRATA_TEST_MODEL"); p && *p) return p;
  if (const char* h = std::getenv("STRATA_HOME"); h && *h)
    return std::string(h) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/strata/SmolLM2-135M-Instruct.Q4_1.gguf";
}

double MiB(uint64_t b) { return double(b) / (1 << 20); }

bool Same(const std::vector<BeamResult>& a, const std::vector<BeamResult>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].beam_id != b[i].beam_id || a[i].tokens != b[i].tokens || a[i].score != b[i].score)
      return false;
  return true;
}

void PrintTable(int32_t beams, int32_t step, uint64_t need, uint64_t unshared, uint64_t budget,
                const std::vector<Row>& rows) {
  std::printf(
      "\n%d beams (width 2, %d kept), step %d tokens: KV the search needs %.1f MiB "
      "(prefix tree at its largest; %.1f MiB if beams shared only the prompt), "
      "fast-tier budget %.1f MiB; machine load average now %.1f\n",
      beams, beams / 2, step, MiB(need), MiB(unshared), MiB(budget), LoadAverage());
  std::printf(
      "| schedule           | rounds | read MiB | written MiB | moved MiB | moved vs (a) | time s "
      "| "
      "speedup vs (a) | stall s | cpu s | cpu+stall s | speedup (cpu+stall) | peak fast MiB | "
      "goodput tok/s | idle slots | speculated, kept | same result |\n");
  std::printf(
      "|--------------------|-------:|---------:|------------:|----------:|-------------:|-------:|"
      "---------------:|--------:|------:|------------:|--------------------:|--------------:|"
      "--------------:|-----------:|-----------------:|-------------|\n");
  const Row* a = nullptr;
  for (const Row& r : rows)
    if (r.schedule == "tokenwise") a = &r;
  for (const Row& r : rows) {
    // With a scorer sharing the budget, both trees' traffic and their peak together.
    PrefixTreeCounters k = r.st.kv;
    if (r.st.shared_budget) {
      k.bytes_read += r.st.verifier_kv.bytes_read;
      k.bytes_written += r.st.verifier_kv.bytes_written;
      k.stall_seconds += r.st.verifier_kv.stall_seconds;
      k.peak_fast_bytes = r.st.peak_fast_bytes_total;
    }
    const double moved = double(k.bytes_read + k.bytes_written);
    // With one compute thread, CPU time plus the engine thread's I/O wait is the run's time
    // on a dedicated core: wall time on a shared machine also counts other jobs' turns.
    const double dedicated = r.cpu_seconds + k.stall_seconds;
    char vs[32] = "-", sp[32] = "-", sd[32] = "-";
    if (a && &r != a) {
      const double am = double(a->st.kv.bytes_read + a->st.kv.bytes_written);
      if (am > 0) std::snprintf(vs, sizeof(vs), "%.1f%% fewer", 100.0 * (1.0 - moved / am));
      if (r.st.seconds > 0) std::snprintf(sp, sizeof(sp), "%.2fx", a->st.seconds / r.st.seconds);
      if (dedicated > 0)
        std::snprintf(sd, sizeof(sd), "%.2fx",
                      (a->cpu_seconds + a->st.kv.stall_seconds) / dedicated);
    }
    const double goodput = r.st.seconds > 0 ? double(r.st.finished_tokens) / r.st.seconds : 0;
    const double idle =
        r.st.slot_passes > 0 ? 100.0 * double(r.st.idle_slot_passes) / double(r.st.slot_passes) : 0;
    std::printf(
        "| %-18s | %6lld | %8.1f | %11.1f | %9.1f | %12s | %6.1f | %14s | %7.2f | %5.1f | %11.1f | "
        "%19s | %13.1f | %13.1f | %9.1f%% | %7lld, %6lld | %-11s |\n",
        r.schedule.c_str(), (long long)r.st.rounds, MiB(k.bytes_read), MiB(k.bytes_written),
        moved / (1 << 20), vs, r.st.seconds, sp, k.stall_seconds, r.cpu_seconds, dedicated, sd,
        MiB(k.peak_fast_bytes), goodput, idle, (long long)r.st.speculative_tokens,
        (long long)r.st.speculative_tokens_kept, r.same ? "yes" : "NO");
  }
  std::fflush(stdout);
}

int Run(Flags& f) {
  if (f.quick) {
    // Small enough for a minute; at this size the baseline's fixed residency (every beam's
    // last block, two staging areas) is a large share of the KV, hence the larger budget.
    f.beams = {8};
    f.steps = {16};
    f.gen = 128;
    f.prompt_tokens = 64;
    f.share = 0.6;
  }
  if (f.text.empty()) {
    std::fprintf(stderr,
                 "bench_beam_search: --text FILE is required: the prompt source, whose start is "
                 "the prompt (tuner/data/calibration.txt gives the tables' prompt)\n");
    return 1;
  }
  if (f.model.empty()) f.model = DefaultModel();
  std::unique_ptr<Model> model;
  Status s = Model::Load(f.model, &model);
  if (!s.ok()) {
    std::fprintf(stderr, "bench_beam_search: %s\n", s.ToString().c_str());
    return 1;
  }
  std::ifstream in(f.text);
  if (!in) {
    std::fprintf(stderr, "bench_beam_search: cannot read the prompt text %s\n", f.text.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int32_t> prompt;
  s = model->tokenizer().Encode(ss.str().substr(0, 8192), true, false, &prompt);
  if (!s.ok() || int32_t(prompt.size()) < f.prompt_tokens) {
    std::fprintf(stderr, "bench_beam_search: the prompt text is too short\n");
    return 1;
  }
  prompt.resize(size_t(f.prompt_tokens));
  std::unique_ptr<Model> scorer_model;
  std::unique_ptr<ModelVerifier> scorer;
  std::vector<float> shares;  // the verifier's share per run; < 0: the cost model's
  if (!f.scorer_model.empty()) {
    int32_t most = 0;
    for (int32_t b : f.beams) most = std::max(most, b);
    for (int32_t b : f.also_emulate_beams) most = std::max(most, b);
    s = Model::Load(f.scorer_model, &scorer_model);
    if (s.ok())
      s = ModelVerifier::Create(*scorer_model, *model, f.threads, f.prompt_tokens + f.gen + 1, most,
                                &scorer);
    if (!s.ok()) {
      std::fprintf(stderr, "bench_beam_search: %s\n", s.ToString().c_str());
      return 1;
    }
    if (f.verifier_shares.empty()) f.verifier_shares = {"auto"};
    for (const std::string& v : f.verifier_shares) {
      float x = 0;
      s = ParseVerifierShare(v, &x);
      if (!s.ok()) {
        std::fprintf(stderr, "bench_beam_search: --verifier-shares: %s\n", s.message().c_str());
        return 1;
      }
      shares.push_back(x);
    }
  } else {
    shares = {-1.f};
  }

  std::vector<BeamSchedule> scheds;
  auto parse_schedules = [&](const std::vector<std::string>& names) {
    scheds.clear();
    for (const std::string& n : names) {
      BeamSchedule b;
      Status ps = ParseBeamSchedule(n, &b);
      if (!ps.ok()) {
        std::fprintf(stderr, "bench_beam_search: %s\n", ps.message().c_str());
        return false;
      }
      scheds.push_back(b);
    }
    return true;
  };
  if (!parse_schedules(f.schedules)) return 1;
  std::printf(
      "model %s, %d threads, prompt %d tokens, %d generated tokens per path, beam width "
      "%d, sampling temperature 0.8 seed %llu, fast-tier budget %.0f%% of the KV the "
      "search needs\n",
      f.model.c_str(), f.threads, f.prompt_tokens, f.gen, f.width, (unsigned long long)f.seed,
      f.share * 100);
  nlohmann::json out = nlohmann::json::array();
  bool all_same = true, failed = false;
  // The KV the search needs is the prefix tree at its largest, which only a run can tell
  // (selection decides how much beams share); results are identical under every budget, so
  // a first run with everything in the fast tier measures it and is the reference the four
  // schedules are checked against. An emulated pass reuses it.
  std::map<std::pair<int32_t, int32_t>, Row> reference;
  std::map<std::pair<int32_t, int32_t>, std::vector<BeamResult>> reference_results;
  auto run_config = [&](int32_t beams, int32_t step, double emulate_mbps) -> bool {
    BeamSearchParams p;
    p.n_beams = beams;
    p.beam_width = f.width;
    p.step_tokens = step;
    p.max_tokens = f.gen;
    p.ignore_eos = true;  // every path runs to its full length, so schedules compare like for like
    p.step_delimiter = f.delimiter;
    p.sampling.temperature = 0.8f;
    p.sampling.seed = f.seed;
    p.n_threads = f.threads;
    p.slow_dir = f.slow_dir;
    p.cuda_device = f.cuda_device;
    p.gpu_slow_on_disk = f.cuda_slow_disk;
    if (emulate_mbps > 0) {
      p.slow_disk.enabled = true;
      p.slow_disk.bandwidth_bytes_per_second = emulate_mbps * 1e6;
    }
    std::vector<Row> rows;
    auto run = [&](const std::string& label, std::vector<BeamResult>* res) {
      Row r;
      r.schedule = label;
      const double cpu0 = CpuSeconds();
      Status rs = RunBeamSearch(*model, prompt, p, scorer.get(), res, &r.st);
      r.cpu_seconds = CpuSeconds() - cpu0;
      if (!rs.ok()) {
        std::printf("(%d beams, step %d, %s failed: %s)\n", beams, step, label.c_str(),
                    rs.ToString().c_str());
        failed = true;
        return label != "all fits";  // without the reference the configuration cannot go on
      }
      const auto& ref = reference_results[{beams, step}];
      r.same = ref.empty() || Same(ref, *res);
      all_same = all_same && r.same;
      rows.push_back(r);
      out.push_back({{"beams", beams},
                     {"step", step},
                     {"schedule", r.schedule},
                     {"emulated_mbps", emulate_mbps},
                     {"rounds", r.st.rounds},
                     {"bytes_read", r.st.kv.bytes_read},
                     {"bytes_written", r.st.kv.bytes_written},
                     {"seconds", r.st.seconds},
                     {"cpu_seconds", r.cpu_seconds},
                     {"stall_seconds", r.st.kv.stall_seconds},
                     {"generated_tokens", r.st.generated_tokens},
                     {"peak_fast_bytes", r.st.kv.peak_fast_bytes},
                     {"fast_budget_bytes", r.st.kv.fast_budget_bytes},
                     {"peak_tree_bytes", r.st.peak_tree_bytes},
                     {"blocks_prefetched", r.st.kv.blocks_prefetched},
                     {"peak_shared_blocks", r.st.peak_shared_blocks},
                     {"finished_tokens", r.st.finished_tokens},
                     {"slot_passes", r.st.slot_passes},
                     {"idle_slot_passes", r.st.idle_slot_passes},
                     {"speculative_tokens", r.st.speculative_tokens},
                     {"speculative_tokens_kept", r.st.speculative_tokens_kept},
                     {"verifier_ahead_tokens", r.st.verifier_ahead_tokens},
                     {"verifier_ahead_reused", r.st.verifier_ahead_reused},
                     {"verifier_share", p.verifier_share},
                     {"generator_phase_share", r.st.generator_phase_share},
                     {"verifier_phase_share", r.st.verifier_phase_share},
                     {"verifier_bytes_read", r.st.verifier_kv.bytes_read},
                     {"verifier_bytes_written", r.st.verifier_kv.bytes_written},
                     {"peak_fast_bytes_both", r.st.peak_fast_bytes_total},
                     {"generator_seconds", r.st.generator_seconds},
                     {"score_seconds", r.st.score_seconds},
                     {"same_results", r.same}});
      return true;
    };
    const auto key = std::make_pair(beams, step);
    if (!reference.count(key)) {
      p.fast_budget_bytes = 0;
      p.schedule = BeamSchedule::kBalanced;
      std::vector<BeamResult> res;
      if (!run("all fits", &res)) return false;
      reference[key] = rows.back();
      reference_results[key] = res;
    } else {
      rows.push_back(reference[key]);
    }
    uint64_t need = reference[key].st.peak_tree_bytes;
    if (scorer) {
      // The scorer's tree has the generator's shape of paths: its blocks scale the need.
      const uint64_t gb = reference[key].st.kv.block_bytes;
      need += uint64_t(double(need) * double(scorer->KvBlockBytes(16, 4096)) / double(gb));
    }
    p.fast_budget_bytes = uint64_t(double(need) * f.share);
    // Where beams share so much that the share is less than one beam's path, no grouped
    // schedule can run: every schedule gets the smallest budget a grouped one runs with.
    BeamSearchParams grouped = p;
    grouped.schedule = BeamSchedule::kBalanced;
    const uint64_t floor = MinFastBudgetBytes(grouped, model->hparams(), int32_t(prompt.size()));
    if (p.fast_budget_bytes < floor) {
      std::printf(
          "(%d beams, step %d: %.0f%% of the tree, %.1f MiB, is less than one beam's "
          "working set; the budget is raised to that minimum, %.1f MiB = %.1f%%)\n",
          beams, step, f.share * 100, MiB(p.fast_budget_bytes), MiB(floor),
          100.0 * double(floor) / double(need));
      p.fast_budget_bytes = floor;
    }
    if (scorer) {
      const uint64_t both =
          2 * (floor / (reference[key].st.kv.block_bytes)) *
          std::max<uint64_t>(reference[key].st.kv.block_bytes, scorer->KvBlockBytes(16, 4096));
      p.fast_budget_bytes = std::max(p.fast_budget_bytes, both);
    }
    for (BeamSchedule b : scheds)
      for (float share : shares) {
        p.schedule = b;
        p.verifier_share = share;
        char split[32] = "";
        if (scorer && share < 0) std::snprintf(split, sizeof(split), " v=auto");
        if (scorer && share >= 0) std::snprintf(split, sizeof(split), " v=%.2f", double(share));
        std::vector<BeamResult> res;
        if (!run(BeamScheduleName(b) + std::string(split), &res)) return false;
        if (rows.size() == 2) std::printf("slow tier: %s\n", rows[1].st.slow_tier.c_str());
        if (f.speculate > 0 && b != BeamSchedule::kTokenwise) {
          p.speculate = float(f.speculate);
          if (!run(BeamScheduleName(b) + std::string(split) + "+spec", &res)) return false;
          p.speculate = 0;
        }
      }
    PrintTable(beams, step, need, SearchKvBytes(p, model->hparams(), int32_t(prompt.size())),
               p.fast_budget_bytes, rows);
    return true;
  };
  for (int32_t beams : f.beams)
    for (int32_t step : f.steps)
      if (!run_config(beams, step, f.emulate_mbps)) return 1;
  if (!f.also_emulate_mbps.empty()) {
    if (!f.also_emulate_schedules.empty() && !parse_schedules(f.also_emulate_schedules)) return 1;
    for (double mbps : f.also_emulate_mbps) {
      std::printf(
          "\nSlow tier emulating a %.0f MB/s device (the block store's slow-disk "
          "emulation; compute unchanged):\n",
          mbps);
      for (int32_t beams : f.also_emulate_beams)
        for (int32_t step : f.also_emulate_steps.empty() ? f.steps : f.also_emulate_steps)
          if (!run_config(beams, step, mbps)) return 1;
    }
  }
  if (!f.json.empty()) {
    std::ofstream js(f.json);
    js << out.dump(2) << "\n";
  }
  if (!all_same) {
    std::fprintf(stderr, "bench_beam_search: the schedules returned different results\n");
    return 2;
  }
  return failed ? 3 : 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::Flags f;
  CLI::App app{"bench_beam_search: locality-aware beam scheduling vs token-by-token offloading"};
  app.add_option("-m,--model", f.model, "GGUF model (default: the test model)");
  app.add_option("--text", f.text, "prompt source text, required (its start is the prompt)");
  app.add_option("--slow-dir", f.slow_dir, "directory of the slow-tier block store file");
  app.add_option("--beams", f.beams, "beams per step, comma separated")->delimiter(',');
  app.add_option("--steps", f.steps, "step lengths in tokens, comma separated")->delimiter(',');
  app.add_option("--schedules", f.schedules, "any of a,b,c,d")->delimiter(',');
  app.add_option("--prompt-tokens", f.prompt_tokens, "prompt length");
  app.add_option("--gen", f.gen, "generated tokens per path");
  app.add_option("--width", f.width, "beam width");
  app.add_option("-t,--threads", f.threads, "compute threads");
  app.add_option("--budget-share", f.share, "fast-tier budget as a share of the KV needed");
  app.add_option("--emulate-mbps", f.emulate_mbps, "slow-disk emulation bandwidth (MB/s)");
  app.add_option("--also-emulate-mbps", f.also_emulate_mbps,
                 "afterwards, rerun some configurations with these emulated bandwidths (MB/s)")
      ->delimiter(',');
  app.add_option("--also-emulate-beams", f.also_emulate_beams, "beam counts for that pass")
      ->delimiter(',');
  app.add_option("--also-emulate-steps", f.also_emulate_steps, "step lengths for that pass")
      ->delimiter(',');
  app.add_option("--also-emulate-schedules", f.also_emulate_schedules, "schedules for that pass")
      ->delimiter(',');
  app.add_option("--seed", f.seed, "search seed");
  app.add_option("--step-delimiter", f.delimiter,
                 "steps end after the token completing this text (e.g. $'\\n'); default: fixed");
  app.add_option("--speculate", f.speculate,
                 "also run each grouped schedule with speculative beam extension at this share "
                 "of the mean step length");
  app.add_option("--json", f.json, "write the rows as JSON");
  app.add_option("--scorer-model", f.scorer_model,
                 "a second GGUF scoring each step; its KV shares the budget");
  app.add_option("--verifier-shares", f.verifier_shares,
                 "with --scorer-model: the scorer's share of the budget per run, auto or in "
                 "[0, 1], comma separated (default auto)")
      ->delimiter(',');
  app.add_flag("--quick", f.quick, "smoke run: 8 beams, steps of 16, 128 tokens, budget 60%");
  app.add_option("--cuda", f.cuda_device,
                 "run on this CUDA GPU (KV in its memory, slow tier in pinned host RAM)");
  app.add_flag("--cuda-slow-disk", f.cuda_slow_disk,
               "on the GPU, the slow tier is the block store in --slow-dir, staged through "
               "pinned host RAM (a Jetson's NVMe) instead of pinned host RAM");
  CLI11_PARSE(app, argc, argv);
  return strata::bench::Run(f);
}
