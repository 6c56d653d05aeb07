// bench_kv_quality: the disk-backed sparse KV policy against full KV in RAM, on text the
// adapters were not calibrated on.
//
// For each window of `--window` tokens of the evaluation text (`--text`, required: after its
// first `--skip` share, half by default; the tables in docs/experiments use tinyshakespeare,
// whose start the adapters were calibrated on), the first window-scored-1 tokens are the
// prefix (computed once with full KV and cached, then appended to every policy), and the last
// `--scored` tokens are predicted by teacher-forced decoding, one token per pass, with full KV
// and with each configuration of the policy. It prints perplexity of both, the change, and
// top-1 next-token agreement, per configuration, aggregated over windows; agreement also where
// the reference's top two logits are clear of a near-tie ("clear agr") and where the full-KV
// runs decoded and prefilled agree with each other ("stable agr"), the positions on which
// agreement is not a matter of rounding. Results go to a JSON-lines file as each (window,
// configuration) finishes; a rerun skips what is there, so a long run can be stopped and
// resumed, or split over machines.
//
//   bench_kv_quality --text tinyshakespeare.txt --results quality.jsonl
//   bench_kv_quality ... --configs "budget_bytes=1/13;group_size=1,budget_bytes=1/13"
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/kv/kv_bench_util.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/disk/disk_kv.h"
#include "tuner/quality.h"

namespace strata::bench {
namespace {

struct Flags {
  std::string model, text, cache = "/var/tmp/strata-kvcap";
  std::string kv_dir = "/var/tmp", results = "bench_kv_quality.jsonl", configs = "grid";
  int32_t windows = 16, window = 8192, scored = 1024, threads = 2;
  double skip = 0.5;
  bool table_only = false;
};

// The grid around the default plan (G = 5 and sigma = 4 by block fill and budget): each row
// changes one setting, G = 1, 4, 8 or sigma = 8, 16, 32, at budgets of 1/13 and 1/34 of the
// full cache, the plan choosing M, C and T for it; then what the sink, a recent window and
// the scoring rule buy at 1/13. docs/experiments/group-size.md and disk-kv-quality.md have
// the numbers.
std::vector<std::pair<std::string, std::string>> GridConfigs() {
  std::vector<std::pair<std::string, std::string>> c;
  for (const char* b : {"1/13", "1/34"}) {
    const std::string budget = std::string("budget_bytes=") + b;
    c.push_back({"", budget});
    for (int g : {1, 4, 8}) c.push_back({"", "group_size=" + std::to_string(g) + "," + budget});
    for (int s : {8, 16, 32}) c.push_back({"", "ratio=" + std::to_string(s) + "," + budget});
  }
  c.push_back({"", "experimental.sink_groups=0,budget_bytes=1/13"});
  c.push_back({"", "experimental.recent_groups=8,budget_bytes=1/13"});
  c.push_back({"", "experimental.scoring=sum,budget_bytes=1/13"});
  for (auto& [label, spec] : c) label = spec;
  return c;
}

// Results-file keys of the two full-KV runs of a window (see RunFull).
constexpr const char* kRefKey = "full-decode";
constexpr const char* kPrefillKey = "full-prefill";

struct Score {
  double nll = 0;
  int32_t n = 0, agree = 0;
  std::vector<int32_t> argmax;
  std::vector<float> margin;  // best logit minus the second best
};

// A position whose reference logits have their best two closer than this is a near-tie:
// which of the two wins is decided by rounding (see the prefill-vs-decode line of the table:
// two full-KV runs that differ only in summation order disagree on ~4% of positions).
constexpr float kClearMargin = 0.5f;

void Accumulate(const float* logits, int32_t n_vocab, int32_t target, Score* s) {
  const PositionScore p = ScorePosition(logits, n_vocab, target);
  s->nll += p.nll;
  s->argmax.push_back(p.argmax);
  s->margin.push_back(p.margin);
  ++s->n;
}
// Decodes the scored tokens of `win` one per pass, teacher-forced, after a replayed prefix.
Status DecodeScored(Engine* e, SeqId seq, const Flags& f, const std::vector<int32_t>& win,
                    int32_t n_vocab, Score* s) {
  const int32_t prefix = f.window - f.scored - 1;
  std::vector<float> logits;
  ForwardBatch b;
  for (int32_t i = 0; i < f.scored; ++i) {
    b.Clear();
    b.Add(seq, prefix + i, std::span<const int32_t>(&win[size_t(prefix + i)], 1));
    STRATA_RETURN_IF_ERROR(e->Evaluate(b, &logits));
    Accumulate(logits.data(), n_vocab, win[size_t(prefix + i + 1)], s);
  }
  return Status::OK();
}

// Full KV in RAM (the memory policy). The reference decodes the scored tokens one per pass,
// teacher-forced, exactly as RunPolicy does, so the two differ only in the KV policy;
// `prefill` instead computes them in one pass (a batched forward: other matmul and attention
// paths, so other rounding), kept to show how much of a policy's disagreement that alone
// would account for.
Status RunFull(const Model& model, const Flags& f, const KvCapture& cap,
               const std::vector<int32_t>& win, bool prefill, Score* s) {
  EngineOptions eo;
  eo.n_threads = f.threads;
  eo.n_ctx = f.window;
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, &e));
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  const int32_t prefix = f.window - f.scored - 1;
  STRATA_RETURN_IF_ERROR(ReplayPrefix(e->kv(), seq, cap, prefix));
  const int32_t n_vocab = model.hparams().n_vocab;
  if (!prefill) return DecodeScored(e.get(), seq, f, win, n_vocab, s);
  std::vector<float> logits;
  STRATA_RETURN_IF_ERROR(e->Prefill(
      seq, std::span<const int32_t>(win.data() + prefix, size_t(f.scored)), &logits, true));
  for (int32_t i = 0; i < f.scored; ++i)
    Accumulate(logits.data() + size_t(i) * n_vocab, n_vocab, win[size_t(prefix + i + 1)], s);
  return Status::OK();
}

Status RunPolicy(const Model& model, const Flags& f, const DiskKvOptions& d, const KvCapture& cap,
                 const std::vector<int32_t>& win, const std::vector<int32_t>& ref_argmax, Score* s,
                 nlohmann::json* info) {
  EngineOptions eo;
  eo.n_threads = f.threads;
  eo.n_ctx = f.window;
  eo.kv.policy = KvPolicyKind::kDisk;
  eo.kv.disk = d;
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, &e));
  auto& kv = static_cast<DiskKv&>(e->kv());
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  const int32_t prefix = f.window - f.scored - 1;
  STRATA_RETURN_IF_ERROR(ReplayPrefix(kv, seq, cap, prefix));
  const KvCounters c0 = kv.counters();
  const auto t0 = std::chrono::steady_clock::now();
  STRATA_RETURN_IF_ERROR(DecodeScored(e.get(), seq, f, win, model.hparams().n_vocab, s));
  for (int32_t i = 0; i < f.scored; ++i) s->agree += s->argmax[size_t(i)] == ref_argmax[size_t(i)];
  const KvCounters c = kv.counters();
  (*info)["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (*info)["M"] = kv.plan().groups_per_step;
  (*info)["C"] = kv.plan().reuse_slots;
  (*info)["T"] = kv.plan().transient_groups;
  (*info)["budget"] = kv.plan().budget_bytes;
  (*info)["plan_bytes"] = kv.plan().total_bytes();
  (*info)["peak_sequence_resident"] = c.peak_sequence_resident_bytes;
  (*info)["groups_selected"] = c.groups_selected - c0.groups_selected;
  (*info)["reuse_hits"] = c.reuse_hits - c0.reuse_hits;
  (*info)["resident_attended"] = c.resident_attended - c0.resident_attended;
  (*info)["read_through"] = c.read_through_groups - c0.read_through_groups;
  return Status::OK();
}

// Positions whose reference margin is at least kClearMargin, and of those, how many have
// the same top-1 in `other`.
void CountClear(const nlohmann::json& ref, const nlohmann::json& other, double* clear,
                double* same) {
  if (!ref.contains("margin") || !other.contains("argmax")) return;
  const auto margin = ref["margin"].get<std::vector<float>>();
  const auto a = ref["argmax"].get<std::vector<int32_t>>();
  const auto b = other["argmax"].get<std::vector<int32_t>>();
  for (size_t i = 0; i < std::min({margin.size(), a.size(), b.size()}); ++i) {
    if (margin[i] < kClearMargin) continue;
    *clear += 1;
    *same += a[i] == b[i];
  }
}

// Positions where the two full-KV runs (decoded, and prefilled) pick the same top-1, and
// of those, how many `other` picks too: agreement where the metric itself is stable.
void CountStable(const nlohmann::json& ref, const nlohmann::json& prefill,
                 const nlohmann::json& other, double* stable, double* same) {
  if (!ref.contains("argmax") || !prefill.contains("argmax") || !other.contains("argmax")) return;
  const auto a = ref["argmax"].get<std::vector<int32_t>>();
  const auto p = prefill["argmax"].get<std::vector<int32_t>>();
  const auto b = other["argmax"].get<std::vector<int32_t>>();
  for (size_t i = 0; i < std::min({a.size(), p.size(), b.size()}); ++i) {
    if (a[i] != p[i]) continue;
    *stable += 1;
    *same += a[i] == b[i];
  }
}

std::string Percent(double num, double den) {
  if (den <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f%%", 100 * num / den);
  return buf;
}

void PrintTable(const Flags& f, const std::vector<std::pair<std::string, std::string>>& configs,
                const std::map<std::pair<int, std::string>, nlohmann::json>& done) {
  std::printf("\n%-44s %5s %6s %8s %9s %9s %8s %9s %9s %10s %6s %7s\n", "configuration", "M", "C",
              "KV MiB", "ppl full", "ppl kv", "d ppl", "top-1 agr", "clear agr", "stable agr",
              "reuse", "windows");
  for (const auto& [label, spec] : configs) {
    double nll_full = 0, nll = 0, agree = 0, n = 0, sel = 0, hits = 0, clear = 0, same = 0;
    double stable = 0, stable_same = 0;
    int windows = 0;
    std::string m = "-", c = "-", refused;
    double kv_mib = 0;
    for (int w = 0; w < f.windows; ++w) {
      auto it = done.find({w, label});
      auto ref = done.find({w, kRefKey});
      if (it == done.end() || ref == done.end()) continue;
      if (it->second.contains("refused")) {
        refused = it->second["refused"];
        continue;
      }
      nll_full += ref->second["nll"].get<double>();
      nll += it->second["nll"].get<double>();
      agree += it->second["agree"].get<double>();
      n += it->second["n"].get<double>();
      sel += it->second["groups_selected"].get<double>();
      hits += it->second["reuse_hits"].get<double>();
      CountClear(ref->second, it->second, &clear, &same);
      if (auto pre = done.find({w, kPrefillKey}); pre != done.end())
        CountStable(ref->second, pre->second, it->second, &stable, &stable_same);
      m = std::to_string(it->second["M"].get<int>());
      c = std::to_string(it->second["C"].get<int>());
      kv_mib = std::max(kv_mib, it->second["peak_sequence_resident"].get<double>() / (1 << 20));
      ++windows;
    }
    if (windows == 0) {
      std::printf("%-44s %s\n", label.c_str(),
                  refused.empty() ? "(not run)" : ("refused: " + refused).c_str());
      continue;
    }
    const double pf = std::exp(nll_full / n), pk = std::exp(nll / n);
    std::printf("%-44s %5s %6s %8.2f %9.3f %9.3f %+7.2f%% %8.2f%% %9s %10s %5.1f%% %7d\n",
                label.c_str(), m.c_str(), c.c_str(), kv_mib, pf, pk, 100 * (pk / pf - 1),
                100 * agree / n, Percent(same, clear).c_str(), Percent(stable_same, stable).c_str(),
                100 * hits / std::max(sel, 1.0), windows);
  }
  // The reference decodes one token per pass like the policies; a batched prefill of the
  // same tokens rounds differently, and this is how far apart the two full-KV runs are.
  double nll_d = 0, nll_p = 0, same = 0, n = 0, clear = 0, clear_same = 0, ref_clear = 0;
  int windows = 0;
  for (int w = 0; w < f.windows; ++w) {
    auto d = done.find({w, kRefKey}), p = done.find({w, kPrefillKey});
    if (d == done.end() || p == done.end()) continue;
    const auto ad = d->second["argmax"].get<std::vector<int32_t>>();
    const auto ap = p->second["argmax"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < std::min(ad.size(), ap.size()); ++i) same += ad[i] == ap[i];
    CountClear(d->second, p->second, &clear, &clear_same);
    if (d->second.contains("margin"))
      for (float m : d->second["margin"].get<std::vector<float>>()) ref_clear += m >= kClearMargin;
    nll_d += d->second["nll"].get<double>();
    nll_p += p->second["nll"].get<double>();
    n += d->second["n"].get<double>();
    ++windows;
  }
  if (windows > 0)
    std::printf(
        "full KV, scored tokens in one prefill pass instead of decoded one by one: ppl %.3f vs "
        "%.3f (%+.2f%%), top-1 agreement %.2f%%, %s where the reference's best two logits are "
        ">= %.1f apart (%s of positions; 'clear agr' above); 'stable agr' counts only the "
        "positions where these two runs agree (%d windows)\n",
        std::exp(nll_p / n), std::exp(nll_d / n), 100 * (std::exp((nll_p - nll_d) / n) - 1),
        100 * same / n, Percent(clear_same, clear).c_str(), double(kClearMargin),
        Percent(ref_clear, n).c_str(), windows);
}

Status Main(Flags& f, const std::string& command) {
  if (f.text.empty() && !f.table_only)
    return Status::InvalidArgument(
        "--text FILE is required: the evaluation text, whose part after --skip the windows come "
        "from (the tables in docs/experiments use tinyshakespeare.txt)");
  if (f.model.empty()) {
    const char* home = std::getenv("HOME");
    f.model = std::string(home ? home : ".") + "/.cache/strata/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(Model::Load(f.model, &model));
  std::vector<std::pair<std::string, std::string>> configs;
  if (f.configs == "grid") {
    configs = GridConfigs();
  } else {
    std::stringstream ss(f.configs);
    std::string spec;
    while (std::getline(ss, spec, ';'))
      if (!spec.empty()) configs.push_back({spec, spec});
  }
  std::map<std::pair<int, std::string>, nlohmann::json> done;
  {
    std::ifstream in(f.results);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("window")) continue;
      done[{j["window"].get<int>(), j["config"].get<std::string>()}] = j;
    }
  }
  std::printf(
      "%s\nmodel %s (%s), windows of %d tokens from the text after its first %.0f%% "
      "(%s), last %d scored; adapters calibrated on the first half\n",
      command.c_str(), f.model.c_str(), model->identity_hex().c_str(), f.window, f.skip * 100,
      f.text.c_str(), f.scored);
  if (f.table_only) {
    PrintTable(f, configs, done);
    return Status::OK();
  }
  std::vector<int32_t> tokens;
  STRATA_RETURN_IF_ERROR(EvaluationTokens(*model, f.text, f.skip, &tokens));
  if (int64_t(tokens.size()) < int64_t(f.windows) * f.window)
    return Status::InvalidArgument("the evaluation text has " + std::to_string(tokens.size()) +
                                   " tokens, fewer than " + std::to_string(f.windows) +
                                   " windows of " + std::to_string(f.window));
  std::ofstream out(f.results, std::ios::app);
  const int64_t full_cache = model->hparams().kv_bytes_per_token_f16() * f.window;
  DiskKvOptions base;
  base.dir = f.kv_dir;
  for (int w = 0; w < f.windows; ++w) {
    const std::vector<int32_t> win(tokens.begin() + int64_t(w) * f.window,
                                   tokens.begin() + int64_t(w + 1) * f.window);
    bool need = !done.count({w, kRefKey}) || !done.count({w, kPrefillKey});
    for (const auto& cfg : configs) need |= !done.count({w, cfg.first});
    if (!need) continue;
    KvCapture cap;
    bool computed = false;
    // All but the last token of the window (prefix plus the scored part), so the capture
    // also serves bench_kv_speed's longer prefixes.
    STRATA_RETURN_IF_ERROR(LoadOrCapture(*model,
                                         std::span<const int32_t>(win.data(), size_t(f.window - 1)),
                                         f.cache, f.threads, &cap, &computed));
    std::fprintf(stderr, "window %d: prefix %s\n", w, computed ? "computed" : "from cache");
    for (bool prefill : {false, true}) {
      const char* key = prefill ? kPrefillKey : kRefKey;
      if (done.count({w, key})) continue;
      Score s;
      STRATA_RETURN_IF_ERROR(RunFull(*model, f, cap, win, prefill, &s));
      nlohmann::json j = {{"window", w}, {"config", key},      {"nll", s.nll},
                          {"n", s.n},    {"argmax", s.argmax}, {"margin", s.margin}};
      out << j.dump() << "\n" << std::flush;
      done[{w, key}] = j;
    }
    const auto ref_argmax = done[{w, kRefKey}]["argmax"].get<std::vector<int32_t>>();
    for (const auto& [label, spec] : configs) {
      if (done.count({w, label})) continue;
      DiskKvOptions d;
      STRATA_RETURN_IF_ERROR(ParseDiskSpec(spec, base, f.window, full_cache, &d));
      Score s;
      nlohmann::json j = {{"window", w}, {"config", label}};
      Status st = RunPolicy(*model, f, d, cap, win, ref_argmax, &s, &j);
      if (st.code() == Status::Code::kResourceExhausted) {
        j["refused"] = st.message();
      } else {
        STRATA_RETURN_IF_ERROR(st);
        j["nll"] = s.nll;
        j["n"] = s.n;
        j["agree"] = s.agree;
        j["argmax"] = s.argmax;
        std::fprintf(stderr, "window %d %s: ppl %.3f agree %.1f%% (%.0f s)\n", w, label.c_str(),
                     std::exp(s.nll / s.n), 100.0 * s.agree / s.n, j["seconds"].get<double>());
      }
      out << j.dump() << "\n" << std::flush;
      done[{w, label}] = j;
    }
  }
  PrintTable(f, configs, done);
  return Status::OK();
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::Flags f;
  CLI::App app{"bench_kv_quality: disk KV policy vs full KV, perplexity and top-1 agreement"};
  app.add_option("-m,--model", f.model, "GGUF model (default: ~/.cache/strata/SmolLM2...)");
  app.add_option("--text", f.text, "evaluation text, required (but for --table-only)");
  app.add_option("--skip", f.skip, "leading fraction of the text not used (calibration part)");
  app.add_option("--windows", f.windows, "windows evaluated");
  app.add_option("--window", f.window, "tokens per window (the context)");
  app.add_option("--scored", f.scored, "last tokens of each window scored by decoding");
  app.add_option("--cache", f.cache, "directory for cached prefix KV");
  app.add_option("--kv-dir", f.kv_dir, "directory for the disk KV store");
  app.add_option("--results", f.results, "JSON-lines results file (appended, resumable)");
  app.add_option("--configs", f.configs,
                 "'grid' (G and sigma around the default) or specs separated by ';'");
  app.add_option("-t,--threads", f.threads, "worker threads");
  app.add_flag("--table-only", f.table_only, "print the table from the results file");
  CLI11_PARSE(app, argc, argv);
  strata::Status st = strata::bench::Main(f, strata::bench::CommandLine(argc, argv));
  if (!st.ok()) {
    std::fprintf(stderr, "bench_kv_quality: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
