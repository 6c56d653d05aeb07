// bench_kv_speed: decode speed at a long context for (a) full KV in RAM, (b) the disk-backed
// sparse policy, (c) a FlexGen-style baseline that reads every layer's whole KV back from
// disk each step, (d) token-level selection (G = 1), at several batch sizes, in one run.
//
// Each sequence's context is a window of the second half of the evaluation text (`--text`,
// required; the tables in docs/experiments use tinyshakespeare), its prefix computed once
// with full KV, cached, and appended to each policy; then `--warmup` and `--steps`
// teacher-forced decode passes of one token per sequence run, and the timed ones are
// reported: tokens/s, step time and its split (I/O wait that compute did not hide,
// prediction, attention, matmuls), bytes and requests read, the reuse ratio, and resident KV
// memory per sequence. With --fio, the read submissions of (b) are replayed on the store
// with nothing else running and compared with fio at the same block size and queue depth on
// the same file. --emmc repeats the disk modes with the store's eMMC emulation (labelled in
// every row).
//
//   bench_kv_speed --text tinyshakespeare.txt --batch 1,8 --fio
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/kv/kv_bench_util.h"
#include "bench/storage/fio_runner.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/disk/disk_kv.h"
#include "storage/io_batch.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model, text, cache = "/var/tmp/strata-kvcap";
  std::string kv_dir = "/var/tmp", json;
  std::string spec_b = "budget_bytes=1/13";  // the defaults otherwise (G auto, sigma 4, Q4 summary)
  // FlexGen keeps its offloaded KV in FP16 by default: the baseline reloads F16 records
  // (--spec-c "...,record_type=q8_0" measures it with (b)'s Q8_0 records, half the bytes).
  std::string spec_c =
      "group_size=4,ratio=16,budget_bytes=1/13,experimental.reload_all=true,record_type=f16";
  std::string spec_d = "group_size=1,budget_bytes=1/13";
  std::string modes = "abcd";
  std::vector<int32_t> batches = {1, 8};
  int32_t ctx = 8192, steps = 32, warmup = 4, threads = 2, repeats = 1;
  bool fio = false, emmc = false;
  double fio_seconds = 3;
};

struct Row {
  std::string mode, label;
  int32_t batch = 0;
  double tok_s = 0, step_ms = 0, wait_ms = 0, predict_ms = 0, attn_ms = 0, matmul_ms = 0;
  double read_kib = 0, reads = 0, reuse = 0, req_kib = 0;
  uint64_t resident = 0, budget = 0;
  std::string note;
};

struct Trace {
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> submissions;
  bool on = false;
};

Status RunMode(const Model& model, const Flags& f, char mode, bool emmc, int32_t batch,
               const std::vector<KvCapture>& caps, const std::vector<std::vector<int32_t>>& wins,
               Row* row, Trace* trace, std::vector<std::string>* fio_lines) {
  EngineOptions eo;
  eo.n_threads = f.threads;
  eo.n_ctx = f.ctx;
  eo.n_batch = 512;
  eo.max_sequences = batch;
  const int64_t full_cache = model.hparams().kv_bytes_per_token_f16() * f.ctx;
  row->mode = std::string(1, mode);
  row->batch = batch;
  if (mode != 'a') {
    DiskKvOptions base;
    base.dir = f.kv_dir;
    base.emulate_emmc = emmc;
    const std::string& spec = mode == 'b' ? f.spec_b : mode == 'c' ? f.spec_c : f.spec_d;
    eo.kv.policy = KvPolicyKind::kDisk;
    STRATA_RETURN_IF_ERROR(ParseDiskSpec(spec, base, f.ctx, full_cache, &eo.kv.disk));
    row->label = spec + (emmc ? " [eMMC EMULATED]" : "");
    if (trace->on)
      eo.kv.hooks.on_read_submit = [trace](int32_t, const storage::IoBatch& b) {
        std::vector<std::pair<uint64_t, uint32_t>> s;
        for (size_t i = 0; i < b.size(); ++i)
          s.push_back({b.request(i).offset, b.request(i).length});
        trace->submissions.push_back(std::move(s));
      };
  } else {
    row->label = "full KV in RAM (memory policy)";
  }
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, &e));
  const int32_t prefix = f.ctx - f.steps - f.warmup;
  std::vector<SeqId> seqs(static_cast<size_t>(batch));
  for (int32_t i = 0; i < batch; ++i) {
    STRATA_RETURN_IF_ERROR(e->NewSequence(&seqs[size_t(i)]));
    STRATA_RETURN_IF_ERROR(ReplayPrefix(e->kv(), seqs[size_t(i)], caps[size_t(i)], prefix));
  }
  std::vector<float> logits;
  ForwardBatch b;
  KvCounters c0;
  ForwardTimes t0;
  Clock::time_point start;
  for (int32_t step = 0; step < f.warmup + f.steps; ++step) {
    if (step == f.warmup) {
      c0 = e->kv().counters();
      t0 = e->forward_times();
      start = Clock::now();
      trace->submissions.clear();
    }
    b.Clear();
    for (int32_t i = 0; i < batch; ++i)
      b.Add(seqs[size_t(i)], prefix + step,
            std::span<const int32_t>(&wins[size_t(i)][size_t(prefix + step)], 1));
    STRATA_RETURN_IF_ERROR(e->Evaluate(b, &logits));
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const KvCounters c = e->kv().counters();
  const ForwardTimes& t = e->forward_times();
  const double n = f.steps;
  row->tok_s = batch * n / secs;
  row->step_ms = 1e3 * secs / n;
  row->wait_ms = 1e3 * (c.io_wait_seconds - c0.io_wait_seconds) / n;
  row->predict_ms = 1e3 * (c.predict_seconds - c0.predict_seconds) / n;
  row->attn_ms = 1e3 * (t.attention - t0.attention) / n;
  row->matmul_ms = 1e3 * (t.matmul - t0.matmul) / n;
  row->read_kib = double(c.bytes_read - c0.bytes_read) / 1024 / n;
  row->reads = double(c.reads_issued - c0.reads_issued) / n;
  row->req_kib = c.reads_issued > c0.reads_issued ? double(c.bytes_read - c0.bytes_read) / 1024 /
                                                        double(c.reads_issued - c0.reads_issued)
                                                  : 0;
  const double sel = double(c.groups_selected - c0.groups_selected);
  row->reuse = sel > 0 ? double(c.reuse_hits - c0.reuse_hits) / sel : 0;
  row->resident = c.peak_sequence_resident_bytes;
  row->budget = c.budget_bytes;
  if (mode == 'a') row->resident = c.peak_resident_bytes / uint64_t(batch);

  if (trace->on && f.fio && !trace->submissions.empty()) {
    // Replay (b)'s read submissions alone, then fio at the same block and depth.
    auto& kv = static_cast<DiskKv&>(e->kv());
    storage::BlockStore& store = kv.store_for_benchmarks();
    uint64_t max_bytes = 0, requests = 0, bytes = 0;
    for (const auto& s : trace->submissions) {
      uint64_t sb = 0;
      for (const auto& [off, len] : s) sb += len;
      max_bytes = std::max(max_bytes, sb);
      requests += s.size();
      bytes += sb;
    }
    storage::AlignedBuffer buf;
    STRATA_RETURN_IF_ERROR(storage::AlignedBuffer::Allocate(max_bytes, store.block_size(), &buf));
    storage::IoBatch io;
    const auto r0 = Clock::now();
    for (const auto& s : trace->submissions) {
      io.Clear();
      uint64_t at = 0;
      for (const auto& [off, len] : s) {
        io.AddRead(off, buf.data() + at, len);
        at += len;
      }
      STRATA_RETURN_IF_ERROR(store.Submit(io));
      STRATA_RETURN_IF_ERROR(store.Wait(io));
    }
    const double rs = std::chrono::duration<double>(Clock::now() - r0).count();
    const double depth = double(requests) / double(trace->submissions.size());
    const uint32_t record = kv.plan().layout.record_bytes;
    char line[400];
    std::snprintf(line, sizeof line,
                  "(b) batch %d%s: %zu read submissions, mean depth %.1f, mean request %.1f KiB "
                  "(records of %u B coalesced); replayed alone on the store: %.0f IOPS, %.1f MB/s",
                  batch, emmc ? " [eMMC EMULATED]" : "", trace->submissions.size(), depth,
                  double(bytes) / double(requests) / 1024, record, double(requests) / rs,
                  double(bytes) / rs / 1e6);
    fio_lines->push_back(line);
    if (!emmc) {
      for (uint32_t bs :
           {record, uint32_t(std::lround(double(bytes) / double(requests) / store.block_size())) *
                        store.block_size()}) {
        FioJob job;
        job.file = store.path();
        job.offset = store.data_offset_in_file();
        job.size = store.capacity();
        job.block = std::max(bs, store.block_size());
        // A batch's submission can be deeper than the store's queue; both sides then run at
        // the store's queue depth, the most the store keeps in flight.
        job.depth = std::clamp<uint32_t>(uint32_t(std::lround(depth)), 1, store.queue_depth());
        job.seconds = f.fio_seconds;
        ReadPoint fio;
        STRATA_RETURN_IF_ERROR(RunFio(job, &fio));
        ReadPoint mine;
        STRATA_RETURN_IF_ERROR(
            storage::RunStoreRandomRead(store, job.block, job.depth, f.fio_seconds, 7, &mine));
        std::snprintf(line, sizeof line,
                      "    bs %u depth %u: fio %.0f IOPS (%.1f MB/s), store random reads %.0f IOPS "
                      "= %.0f%% of fio; trace replay at mean request %.1f KiB = %.0f%% of fio's "
                      "IOPS at bs %u",
                      job.block, job.depth, fio.iops, fio.mb_per_s, mine.iops,
                      100 * mine.iops / fio.iops, double(bytes) / double(requests) / 1024,
                      100 * (double(requests) / rs) / fio.iops, job.block);
        fio_lines->push_back(line);
        // The command on a line of its own: it is longer than any fixed buffer should be.
        fio_lines->push_back("      " + FioCommand(job));
      }
    }
  }
  return Status::OK();
}

std::string Mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", double(b) / (1 << 20));
  return s;
}

Status Main(Flags& f, const std::string& command) {
  if (f.text.empty())
    return Status::InvalidArgument(
        "--text FILE is required: the evaluation text, whose second half the windows come from "
        "(the tables in docs/experiments use tinyshakespeare.txt)");
  if (f.model.empty()) {
    const char* home = std::getenv("HOME");
    f.model = std::string(home ? home : ".") + "/.cache/strata/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(Model::Load(f.model, &model));
  std::vector<int32_t> tokens;
  STRATA_RETURN_IF_ERROR(EvaluationTokens(*model, f.text, 0.5, &tokens));
  const int32_t max_batch = *std::max_element(f.batches.begin(), f.batches.end());
  const int32_t prefix = f.ctx - f.steps - f.warmup;
  std::vector<KvCapture> caps(static_cast<size_t>(max_batch));
  std::vector<std::vector<int32_t>> wins(static_cast<size_t>(max_batch));
  for (int32_t i = 0; i < max_batch; ++i) {
    if (int64_t(i + 1) * f.ctx > int64_t(tokens.size()))
      return Status::InvalidArgument("the evaluation text is too short for " +
                                     std::to_string(max_batch) + " windows");
    wins[size_t(i)].assign(tokens.begin() + int64_t(i) * f.ctx,
                           tokens.begin() + int64_t(i + 1) * f.ctx);
    bool computed = false;
    // All but the last token of the window: the same capture serves bench_kv_quality.
    STRATA_RETURN_IF_ERROR(
        LoadOrCapture(*model, std::span<const int32_t>(wins[size_t(i)].data(), size_t(f.ctx - 1)),
                      f.cache, f.threads, &caps[size_t(i)], &computed));
    std::fprintf(stderr, "window %d: prefix of %d tokens %s\n", i, prefix,
                 computed ? "computed" : "from cache");
  }
  // Every repeat runs every row once, in the same order, so the rows of one repeat saw the
  // same machine conditions; fio is compared on the first repeat only.
  std::vector<std::vector<Row>> reps(size_t(std::max(f.repeats, 1)));
  std::vector<std::string> fio_lines;
  for (size_t rep = 0; rep < reps.size(); ++rep) {
    Flags fr = f;
    fr.fio = f.fio && rep == 0;
    for (bool emmc : {false, true}) {
      if (emmc && !f.emmc) continue;
      for (int32_t batch : f.batches) {
        for (char mode : f.modes) {
          if (emmc && mode == 'a') continue;
          Row r;
          Trace trace;
          trace.on = mode == 'b' && rep == 0;
          std::fprintf(stderr, "repeat %zu: running (%c) batch %d%s\n", rep + 1, mode, batch,
                       emmc ? " eMMC" : "");
          STRATA_RETURN_IF_ERROR(
              RunMode(*model, fr, mode, emmc, batch, caps, wins, &r, &trace, &fio_lines));
          reps[rep].push_back(r);
        }
      }
    }
  }
  // The table shows, for each row, the repeat with the median step time.
  std::vector<Row> rows;
  for (size_t i = 0; i < reps[0].size(); ++i) {
    std::vector<const Row*> v;
    for (const auto& rep : reps) v.push_back(&rep[i]);
    std::sort(v.begin(), v.end(),
              [](const Row* x, const Row* y) { return x->step_ms < y->step_ms; });
    rows.push_back(*v[v.size() / 2]);
  }
  std::printf(
      "%s\nmodel %s, context %d (prefix %d + %d warm-up + %d timed decode steps), %d "
      "threads, windows of the second half of %s; %zu repeat(s), each row the repeat with "
      "the median step time\n",
      command.c_str(), f.model.c_str(), f.ctx, prefix, f.warmup, f.steps, f.threads, f.text.c_str(),
      reps.size());
  std::printf("%-4s %-46s %5s %8s %8s %8s %8s %7s %8s %9s %7s %7s %6s %9s\n", "mode",
              "configuration", "batch", "tok/s", "step ms", "wait ms", "wait %", "pred ms",
              "attn ms", "read KiB", "reads", "req KiB", "reuse", "KV MiB/seq");
  for (const Row& r : rows) {
    std::printf(
        "(%s)  %-46s %5d %8.2f %8.2f %8.2f %7.1f%% %7.2f %8.2f %9.1f %7.1f %7.1f %5.1f%% %9s\n",
        r.mode.c_str(), r.label.c_str(), r.batch, r.tok_s, r.step_ms, r.wait_ms,
        100 * r.wait_ms / r.step_ms, r.predict_ms, r.attn_ms, r.read_kib, r.reads, r.req_kib,
        100 * r.reuse, Mib(r.resident).c_str());
  }
  // The disk policy's speed over each other mode's ((b) over (a), (c) and (d)), per batch and
  // disk (real or emulated eMMC): the median over repeats of each repeat's own ratio, with the
  // range.
  for (bool emmc : {false, true}) {
    if (emmc && !f.emmc) continue;
    for (int32_t batch : f.batches) {
      auto find = [&](const std::vector<Row>& rs, char m) -> const Row* {
        for (const Row& r : rs)
          if (r.mode[0] == m && r.batch == batch &&
              (m == 'a' || (r.label.find("EMULATED") != std::string::npos) == emmc))
            return &r;
        return nullptr;
      };
      if (!find(reps[0], 'b')) continue;
      std::printf("batch %d%s:", batch, emmc ? " [eMMC EMULATED]" : "");
      auto ratio = [&](char m, const char* what) {
        std::vector<double> v;
        for (const auto& rep : reps)
          if (const Row* o = find(rep, m)) v.push_back(find(rep, 'b')->tok_s / o->tok_s);
        if (v.empty()) return;
        std::sort(v.begin(), v.end());
        std::printf(" (b)/(%c) = %.2fx", m, v[v.size() / 2]);
        if (v.size() > 1) std::printf(" [%.2f-%.2f]", v.front(), v.back());
        std::printf("%s;", what);
      };
      if (const Row* a = find(reps[0], 'a'); a && !emmc) {
        std::printf(" KV memory of (b) = %.3f of (a)'s;",
                    double(find(reps[0], 'b')->resident) / double(a->resident));
        ratio('a', "");
      }
      ratio('c', "");
      ratio('d', "");
      std::printf("\n");
    }
  }
  for (const std::string& l : fio_lines) std::printf("%s\n", l.c_str());
  return Status::OK();
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::Flags f;
  CLI::App app{"bench_kv_speed: decode speed of full KV, the disk policy and two baselines"};
  app.add_option("-m,--model", f.model, "GGUF model (default: ~/.cache/strata/SmolLM2...)");
  app.add_option("--text", f.text, "evaluation text, required (its second half is used)");
  app.add_option("--ctx", f.ctx, "context length");
  app.add_option("--batch", f.batches, "batch sizes")->delimiter(',');
  app.add_option("--steps", f.steps, "timed decode steps");
  app.add_option("--repeats", f.repeats, "runs of every row, interleaved; medians reported")
      ->check(CLI::Range(1, 50));
  app.add_option("--warmup", f.warmup, "untimed decode steps first");
  app.add_option("--modes", f.modes, "any of a b c d, e.g. abcd or b,d")
      ->check([](const std::string& m) -> std::string {
        for (char c : m)
          if (!std::strchr("abcd, ", c))
            return "mode '" + std::string(1, c) + "' in '" + m + "' is not one of a b c d";
        return "";
      })
      ->transform([](std::string m) {
        std::erase_if(m, [](char c) { return c == ',' || c == ' '; });
        return m;
      });
  app.add_option("--spec-b", f.spec_b, "disk policy settings of (b)");
  app.add_option("--spec-c", f.spec_c, "settings of the reload baseline (c)");
  app.add_option("--spec-d", f.spec_d, "settings of token-level selection (d)");
  app.add_option("--cache", f.cache, "directory for cached prefix KV");
  app.add_option("--kv-dir", f.kv_dir, "directory for the disk KV stores");
  app.add_option("-t,--threads", f.threads, "worker threads");
  app.add_flag("--fio", f.fio, "compare (b)'s reads with fio (Debian package fio)");
  app.add_option("--fio-seconds", f.fio_seconds, "seconds per fio / store measurement");
  app.add_flag("--emmc", f.emmc, "repeat the disk modes with the store's eMMC emulation");
  CLI11_PARSE(app, argc, argv);
  strata::Status st = strata::bench::Main(f, strata::bench::CommandLine(argc, argv));
  if (!st.ok()) {
    std::fprintf(stderr, "bench_kv_speed: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
