#include "runtime/search/beam_search.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#include "platforms/cuda_device.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/tree/cuda_disk_tier.h"
#include "runtime/kv/tree/cuda_host_tier.h"
#include "runtime/model/chat_template.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// SplitMix64's finalizer: beam identities and seeds that differ in one bit differ
// everywhere, so children of one beam draw unrelated random streams.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t ChildId(uint64_t parent, uint64_t j) { return Mix(parent ^ Mix(j + 1)); }

int32_t Blocks(int64_t tokens, int32_t b) { return int32_t((tokens + b - 1) / b); }

// Largest number of blocks the tree can hold at once: the prompt, every beam's own
// blocks (a partial tail each, plus the block a copy on write adds), and with speculation
// every beam's speculative child (up to a step of its own blocks and a copied tail).
int64_t MaxTreeBlocks(const BeamSearchParams& p, int32_t prompt_tokens) {
  const int64_t spec = p.speculate > 0 ? Blocks(p.step_tokens, p.block_tokens) + 2 : 0;
  return Blocks(prompt_tokens, p.block_tokens) + 1 +
         int64_t(p.n_beams) * (Blocks(p.max_tokens, p.block_tokens) + 2 + spec);
}

// The slow tier's alignment the block layout is computed for: a multiple of every common
// logical block size, so direct I/O works on 512-byte and 4 KiB devices alike.
constexpr uint32_t kSlowAlignment = 4096;

struct Beam {
  uint64_t id = 0, parent_id = 0;
  SeqId seq = -1;
  std::vector<int32_t> tokens;   // generated, EOS excluded
  std::vector<int32_t> history;  // prompt + tokens: the repetition penalty's window
  std::vector<int32_t> step_tokens;
  std::vector<float> step_logprobs;
  std::string step_text;
  std::shared_ptr<const std::vector<float>> logits;  // for the next token, between steps
  const float* row = nullptr;  // for the next token, inside a step (the last pass's output)
  std::unique_ptr<Sampler> sampler;
  int32_t first_rank = 0;  // greedy: the step's first token is the first_rank-th best
  double score_sum = 0;
  int32_t steps = 0;
  bool step_done = false, finished = false;
  // A first child generated ahead while its parent's step was still being scored; once its
  // parent is selected it is an ordinary beam whose step began early (carried).
  bool speculative = false, carried = false;
  BeamStop stop = BeamStop::kMaxTokens;
  double score() const { return steps ? score_sum / steps : 0.0; }
};

// The rank-th best token of a row (ties to the lower id).
int32_t RankedToken(const float* logits, int32_t n_vocab, int32_t rank) {
  std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) ids[size_t(i)] = i;
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::nth_element(ids.begin(), ids.begin() + rank, ids.end(), better);
  return ids[size_t(rank)];
}

class Search {
 public:
  Search(const Model& model, const BeamSearchParams& p, Verifier* verifier, BeamSearchStats* st)
      : model_(model),
        tok_(model.tokenizer()),
        p_(p),
        verifier_(verifier),
        st_(*st),
        n_vocab_(model.hparams().n_vocab) {}
  ~Search() { ReleaseAll(); }

  Status Setup(int32_t prompt_tokens);
  // The block store as a slow tier of slow_bytes (slow_dir, slow_disk), in a file of that name.
  Status OpenDiskTier(uint64_t slow_bytes, const char* file_name,
                      std::unique_ptr<SlowTier>* out) const;
  Status Run(std::span<const int32_t> prompt, std::vector<BeamResult>* results);
  void ReleaseAll();
  PrefixTreeKv* kv() const { return kv_; }
  PrefixTreeKv* verifier_kv() const { return vkv_; }
  uint64_t pool_peak_bytes() const { return pool_ ? pool_->pool_peak_bytes() : 0; }

 private:
  // Tokens the beams generated in this step: what the verifier scores.
  int64_t StepTokens() const {
    int64_t n = 0;
    for (const auto& b : beams_) n += int64_t(b->step_tokens.size());
    return n;
  }
  // The beams' prefix-tree paths, and the blocks the step adds to each (RunStep's plan input).
  Status StepWork(std::vector<BeamWork>* work) const;
  // With a shared budget: moves the two trees' limits for the phase about to run.
  Status Split(bool generator_runs, std::span<const BeamWork> work);
  // The running model's limit in blocks, in [lo, hi], the cost model's choice.
  int32_t ChooseLimit(bool generator_runs, std::span<const BeamWork> work, int32_t lo,
                      int32_t hi) const;
  // A pass of n tokens: fixed + per_token * n, fitted on the generator's passes so far.
  struct PassCost {
    double fixed = 0, per_token = 0;
    double Pass(int64_t n) const { return fixed + per_token * double(n); }
  };
  PassCost GeneratorPassCost() const;
  double IoSecondsPerBlock() const;
  Status RunStep();
  Status RunGroup(const std::vector<Beam*>& group);
  // Forks b's first child and lets it generate in the slot b frees (speculative extension),
  // when b is among the most promising beams and the fast tier can hold the child's blocks.
  Status Speculate(Beam& b, std::vector<Beam*>* active);
  Status ScoreStep(int32_t step);
  Status Select(std::vector<BeamResult>* results, bool last_step);
  std::unique_ptr<Beam> NewChild(const Beam& parent, int32_t j);
  void Finish(Beam& b, std::vector<BeamResult>* results);

  const Model& model_;
  const Tokenizer& tok_;
  const BeamSearchParams& p_;
  Verifier* verifier_;
  BeamSearchStats& st_;
  const int32_t n_vocab_;
  std::unique_ptr<Engine> engine_;
  PrefixTreeKv* kv_ = nullptr;
  bool write_behind_ = false;
  // A budget shared with the verifier's KV: the pool (this client holds nothing), the
  // verifier's tree in it, and what each model keeps at least (one beam's working set).
  std::unique_ptr<FastTier> pool_;
  PrefixTreeKv* vkv_ = nullptr;
  int32_t min_blocks_ = 0;
  double weight_ratio_ = 1;  // the verifier's weight bytes over the generator's
  // Measured as the search runs, for the cost model: generator passes (tokens, seconds) and
  // the verifier's seconds per scored token beyond its passes' weight reads.
  std::vector<std::pair<int32_t, double>> gen_passes_;
  std::vector<double> ver_token_seconds_;
  int64_t phases_[2] = {0, 0};
  double share_sum_[2] = {0, 0};
  std::vector<std::unique_ptr<Beam>> beams_;
  // Speculative first children, by their parent's id; Select keeps those of selected parents.
  std::map<uint64_t, std::unique_ptr<Beam>> spec_;
  std::set<uint64_t> promising_;  // beams that may speculate in this step
  int32_t spec_limit_ = 0;        // speculative tokens a child generates at most, this step
  int64_t step_len_sum_ = 0, step_len_count_ = 0;  // scored steps' lengths, for the limit
  std::vector<int32_t> prompt_;
  int32_t step_ = 0;
  ForwardBatch batch_;
  std::vector<float> logits_;
  struct Pick {
    int32_t token;
    float logprob;
  };
  std::vector<Pick> picks_;                  // per active beam, one sampling round
  std::vector<std::vector<float>> scratch_;  // per pool worker
};

Status Search::Setup(int32_t prompt_tokens) {
  const HParams& hp = model_.hparams();
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, prompt_tokens + p_.max_tokens + 1};
  PrefixTreeKvOptions ko;
  ko.block_tokens = p_.block_tokens;
  ko.max_blocks = MaxTreeBlocks(p_, prompt_tokens);
  // Beams, their children while Select forks them, and speculative children.
  ko.max_sequences = (p_.speculate > 0 ? 3 : 2) * p_.n_beams + 2;
  ko.residency = p_.schedule == BeamSchedule::kTokenwise ? KvResidency::kLayerStreaming
                                                         : KvResidency::kWholeBlocks;
  // Overlapping the writes of blocks that filled with compute belongs to (d); the baseline
  // gets it too so that it is not slowed by writes the grouped schedules would hide.
  write_behind_ = p_.schedule == BeamSchedule::kBalanced || p_.schedule == BeamSchedule::kTokenwise;
  const uint64_t block_bytes = PrefixTreeKv::BlockBytes(shape, ko.block_tokens, kSlowAlignment);
  const uint64_t slow_bytes = uint64_t(ko.max_blocks) * block_bytes;
  ko.fast_budget_bytes =
      p_.fast_budget_bytes
          ? p_.fast_budget_bytes
          : uint64_t(ko.max_blocks + 2 * (ko.max_blocks / hp.n_layer + 1)) * block_bytes;
  // A scorer model's KV shares the budget (on the CPU; a GPU search's verifier runs on the
  // host with KV of its own): one pool of buffers as large as the larger model's blocks.
  const uint64_t verifier_block = p_.fast_budget_bytes && p_.cuda_device < 0
                                      ? verifier_->KvBlockBytes(p_.block_tokens, kSlowAlignment)
                                      : 0;
  if (verifier_block) {
    const uint64_t buf = std::max(block_bytes, verifier_block);
    min_blocks_ = Blocks(int64_t(prompt_tokens) + p_.max_tokens, p_.block_tokens) + 1;
    const uint64_t min = 2 * uint64_t(min_blocks_) * buf;
    if (p_.fast_budget_bytes < min)
      return Status::ResourceExhausted(
          "beam search: the fast-tier budget of " + std::to_string(p_.fast_budget_bytes) +
          " bytes holds the scorer model's KV too and must fit one beam's working set of each "
          "model (" +
          std::to_string(min_blocks_) + " blocks of " + std::to_string(buf) +
          " bytes each): the minimum is " + std::to_string(min) + " bytes");
    STRATA_RETURN_IF_ERROR(
        FastTier::Create(p_.fast_budget_bytes, buf, kSlowAlignment, INT32_MAX / 4, &pool_));
    ko.share_fast = pool_.get();
    ko.fast_budget_bytes = uint64_t(pool_->pool_buffers() - min_blocks_) * buf;
    weight_ratio_ =
        double(verifier_->weight_bytes()) / double(std::max<uint64_t>(1, model_.weight_bytes()));
  }
  std::unique_ptr<SlowTier> slow;
  std::shared_ptr<CudaDevice> gpu;
  if (p_.cuda_device >= 0) {
    STRATA_RETURN_IF_ERROR(CudaDevice::Open(p_.cuda_device, &gpu));
    ko.memory = gpu->memory();
    Status s;
    if (p_.gpu_slow_on_disk) {
      std::unique_ptr<SlowTier> disk;
      s = OpenDiskTier(slow_bytes, "strata-beams", &disk);
      // Staging holds what is in flight at once: a group's blocks, a layer of the streamed
      // ones, the writes behind them.
      if (s.ok())
        s = OpenCudaDiskTier(gpu, std::move(disk), std::min<uint64_t>(slow_bytes, 256ull << 20),
                             &slow);
    } else {
      s = OpenCudaHostTier(gpu, slow_bytes, kSlowAlignment, &slow);
    }
    if (!s.ok()) return s.WithContext("beam search slow tier");
  } else if (p_.slow_in_ram || p_.fast_budget_bytes == 0) {
    std::unique_ptr<RamSlowTier> ram;
    STRATA_RETURN_IF_ERROR(RamSlowTier::Create(slow_bytes, &ram, kSlowAlignment));
    slow = std::move(ram);
  } else {
    Status s = OpenDiskTier(slow_bytes, "strata-beams", &slow);
    if (!s.ok()) return s.WithContext("beam search slow tier");
  }
  std::unique_ptr<PrefixTreeKv> kv;
  STRATA_RETURN_IF_ERROR(PrefixTreeKv::Create(shape, ko, std::move(slow), &kv));
  kv_ = kv.get();
  // The verifier's slow tier is of the same kind as the generator's, in a file of its own.
  auto make_slow = [&](uint64_t bytes, std::unique_ptr<SlowTier>* out) -> Status {
    if (p_.slow_in_ram) {
      std::unique_ptr<RamSlowTier> ram;
      STRATA_RETURN_IF_ERROR(RamSlowTier::Create(bytes, &ram, kSlowAlignment));
      *out = std::move(ram);
      return Status::OK();
    }
    return OpenDiskTier(bytes, "strata-verifier", out).WithContext("scorer's slow tier");
  };
  STRATA_RETURN_IF_ERROR(verifier_->PlaceKv(pool_.get(), min_blocks_, p_.block_tokens, make_slow));
  vkv_ = pool_ ? verifier_->shared_kv() : nullptr;
  st_.shared_budget = vkv_ != nullptr;
  st_.slow_tier = kv->slow_tier_description();
  st_.fast_capacity_blocks = kv->fast_capacity_blocks();
  EngineOptions eo;
  eo.n_threads = p_.n_threads;
  eo.n_batch = std::max(512, 2 * p_.n_beams);
  eo.max_sequences = ko.max_sequences;
  eo.cuda = gpu;
  // Beams must not depend on how they are grouped: every pass takes the GPU's GEMV path.
  eo.gpu.batch_invariant = true;
  return Engine::Create(model_, eo, std::move(kv), &engine_);
}

Status Search::OpenDiskTier(uint64_t slow_bytes, const char* file_name,
                            std::unique_ptr<SlowTier>* out) const {
  storage::StoreOptions so;
  const char* tmp = std::getenv("TMPDIR");
  so.directory = !p_.slow_dir.empty() ? p_.slow_dir : (tmp && *tmp ? tmp : "/tmp");
  // The slow tier is this process's alone: a temporary store (no file outlives it).
  so.mode = storage::OpenMode::kTemporary;
  so.file_name = file_name;
  so.capacity = slow_bytes;
  so.block_size = kSlowAlignment;
  // The baseline reads one layer of every block it streams per request (thousands per
  // pass at 64 beams); requests beyond the queue depth only start when the engine thread
  // reaps, which it does not do while a layer computes, so the depth must cover a layer.
  so.queue_depth = 4096;
  so.slow_disk = p_.slow_disk;
  so.report = [](std::string_view) {};  // the fallback reason shows in the description
  return OpenBlockStoreTier(so, out);
}

void Search::ReleaseAll() {
  for (auto& b : beams_)
    if (b->seq >= 0 && engine_) (void)engine_->RemoveSequence(b->seq);
  beams_.clear();
  for (auto& [id, c] : spec_)
    if (c->seq >= 0 && engine_) (void)engine_->RemoveSequence(c->seq);
  spec_.clear();
}

std::unique_ptr<Beam> Search::NewChild(const Beam& parent, int32_t j) {
  auto c = std::make_unique<Beam>();
  c->id = ChildId(parent.id, uint64_t(j));
  c->parent_id = parent.id;
  c->tokens = parent.tokens;
  c->history = parent.history;
  c->logits = parent.logits;
  c->first_rank = j;
  c->score_sum = parent.score_sum;
  c->steps = parent.steps;
  SamplingParams sp = p_.sampling;
  sp.seed = Mix(p_.sampling.seed ^ c->id);
  c->sampler = std::make_unique<Sampler>(sp, n_vocab_);
  return c;
}

Status Search::Run(std::span<const int32_t> prompt, std::vector<BeamResult>* results) {
  prompt_.assign(prompt.begin(), prompt.end());
  const auto t0 = Clock::now();
  Beam root;
  root.id = Mix(p_.sampling.seed ^ 0x726f6f74ull);  // "root"
  root.history = prompt_;
  STRATA_RETURN_IF_ERROR(engine_->NewSequence(&root.seq));
  {
    auto logits = std::make_shared<std::vector<float>>();
    Status s = engine_->Prefill(root.seq, prompt, logits.get());
    if (!s.ok()) {
      (void)engine_->RemoveSequence(root.seq);
      return s;
    }
    root.logits = std::move(logits);
  }
  st_.prefill_seconds = Since(t0);
  Status s = Split(/*generator_runs=*/false, {});
  if (s.ok()) s = verifier_->Begin(prompt, root.id);
  for (int32_t j = 0; s.ok() && j < p_.n_beams; ++j) {
    beams_.push_back(NewChild(root, j));
    s = engine_->kv().ForkSequence(root.seq, &beams_.back()->seq);
  }
  STRATA_RETURN_IF_ERROR(engine_->RemoveSequence(root.seq));
  STRATA_RETURN_IF_ERROR(s);

  for (step_ = 0; !beams_.empty(); ++step_) {
    st_.peak_shared_blocks = std::max(st_.peak_shared_blocks, kv_->tree_counters().shared_blocks);
    const auto tg = Clock::now();
    STRATA_RETURN_IF_ERROR(RunStep());
    st_.generator_seconds += Since(tg);
    if (vkv_) {
      std::vector<BeamWork> scored;
      STRATA_RETURN_IF_ERROR(StepWork(&scored));  // the paths now hold the step's tokens
      STRATA_RETURN_IF_ERROR(Split(/*generator_runs=*/false, scored));
    }
    const auto ts = Clock::now();
    const double stall0 = vkv_ ? vkv_->tree_counters().stall_seconds : 0;
    STRATA_RETURN_IF_ERROR(ScoreStep(step_));
    const double score_seconds = Since(ts);
    st_.score_seconds += score_seconds;
    if (vkv_) {
      // Seconds per scored token beyond the passes' weight reads and the waits for I/O (the
      // cost model prices those apart).
      const int64_t tokens = StepTokens();
      const double io = vkv_->tree_counters().stall_seconds - stall0;
      const double reads = double((tokens + 511) / 512) * GeneratorPassCost().fixed * weight_ratio_;
      if (tokens > 0)
        ver_token_seconds_.push_back(std::max(0.0, score_seconds - io - reads) / double(tokens));
    }
    ++st_.steps;
    STRATA_RETURN_IF_ERROR(Select(results, p_.max_steps > 0 && step_ + 1 >= p_.max_steps));
  }
  st_.seconds = Since(t0);
  for (const BeamResult& r : *results) st_.finished_tokens += int64_t(r.tokens.size());
  std::stable_sort(results->begin(), results->end(), [](const BeamResult& a, const BeamResult& b) {
    return a.score > b.score || (a.score == b.score && a.beam_id < b.beam_id);
  });
  return Status::OK();
}

Status Search::StepWork(std::vector<BeamWork>* work) const {
  work->resize(beams_.size());
  for (size_t i = 0; i < beams_.size(); ++i) {
    const Beam& b = *beams_[i];
    STRATA_RETURN_IF_ERROR(kv_->Path(b.seq, &(*work)[i].path));
    const int32_t n = b.step_done
                          ? 0
                          : std::min<int32_t>(p_.step_tokens - int32_t(b.step_tokens.size()),
                                              p_.max_tokens - int32_t(b.tokens.size()));
    (*work)[i].new_blocks = kv_->NewBlocksFor(b.seq, n);
  }
  return Status::OK();
}

Search::PassCost Search::GeneratorPassCost() const {
  // Least squares of seconds on tokens over the passes so far. A GPU or a bandwidth-bound
  // CPU shows a large fixed part (the weights are read once a pass, whatever its tokens); a
  // compute-bound CPU a large part per token, plus the fixed one (on a CPU the weight reads
  // and the arithmetic add rather than overlap, so this is not a max).
  PassCost c;
  if (gen_passes_.empty()) return c;
  double sn = 0, st = 0, snn = 0, snt = 0;
  for (auto [n, t] : gen_passes_) {
    sn += n;
    st += t;
    snn += double(n) * n;
    snt += double(n) * t;
  }
  const double k = double(gen_passes_.size()), var = snn - sn * sn / k;
  c.per_token = var > 0 ? std::max(0.0, (snt - sn * st / k) / var) : 0.0;
  c.fixed = std::max(0.0, (st - c.per_token * sn) / k);
  return c;
}

double Search::IoSecondsPerBlock() const {
  // What a block moved has cost the engine thread so far (waits for reads and writes), over
  // both trees; before any, the emulated device's rate or none.
  const PrefixTreeCounters g = kv_->tree_counters(), v = vkv_->tree_counters();
  const uint64_t moved = g.blocks_loaded + g.blocks_written + v.blocks_loaded + v.blocks_written;
  if (moved > 0) return (g.stall_seconds + v.stall_seconds) / double(moved);
  if (p_.slow_disk.enabled && p_.slow_disk.bandwidth_bytes_per_second > 0)
    return double(pool_->buffer_bytes()) / p_.slow_disk.bandwidth_bytes_per_second;
  return 0.0;
}

int32_t Search::ChooseLimit(bool generator_runs, std::span<const BeamWork> work, int32_t lo,
                            int32_t hi) const {
  const int32_t n = pool_->pool_buffers();
  const double io = IoSecondsPerBlock();
  const double len = step_len_count_ > 0 ? double(step_len_sum_) / double(step_len_count_)
                                         : double(p_.step_tokens);
  std::vector<int32_t> all(work.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
  const int32_t need = WorkingSetBlocks(work, all);
  std::vector<int32_t> cands = {lo, hi, std::clamp(n / 2, lo, hi), std::clamp(need, lo, hi)};
  for (int32_t k = 1; k < 16; ++k) cands.push_back(lo + (hi - lo) * k / 16);
  const int64_t tokens = StepTokens();
  double ver_tok = 0;
  if (!ver_token_seconds_.empty()) {
    std::vector<double> v = ver_token_seconds_;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    ver_tok = v[v.size() / 2];
  }
  const int32_t gen_held = kv_->fast_blocks_in_use(), ver_held = vkv_->fast_blocks_in_use();
  const PassCost gen = GeneratorPassCost();
  // The verifier's passes read its weights once each; its tokens cost what scoring measured.
  const PassCost ver{gen.fixed * weight_ratio_, ver_tok};
  // A group runs until its longest step ends: passes a group so far, or a full step.
  const double passes_a_group =
      st_.rounds > 0 ? double(st_.forward_passes) / double(st_.rounds) : double(p_.step_tokens);
  int32_t best = hi;
  double best_t = 0;
  bool have = false;
  for (int32_t q : cands) {
    double t = 0;
    if (generator_runs) {
      // Each group's passes (the fixed part) and every beam's tokens; the blocks the groups
      // load beyond what stays resident; the verifier's blocks pushed out, written and read
      // back later.
      StepPlan plan;
      if (!PlanStep(work, q, p_.schedule, step_ % 2 == 1, &plan).ok()) continue;
      int64_t blocks = 0;
      for (const BeamGroup& g : plan.groups) {
        t += passes_a_group * gen.fixed + len * gen.per_token * double(g.beams.size());
        blocks += g.blocks;
      }
      t += io * double(std::max<int64_t>(0, blocks - std::min(q, gen_held)));
      t += 2 * io * double(std::max(0, ver_held - (n - q)));
    } else {
      // A prefill of the step's tokens in passes of at most 512 tokens whose working sets fit
      // q; the paths it loads; the generator's blocks pushed out, written and read back.
      const int64_t passes =
          std::max<int64_t>(std::max<int64_t>(1, (tokens + 511) / 512), (need + q - 1) / q);
      t += double(passes) * ver.fixed + double(tokens) * ver.per_token;
      t += io * double(std::max(0, need - std::min(q, ver_held)));
      t += 2 * io * double(std::max(0, gen_held - (n - q)));
    }
    if (!have || t < best_t) {
      best = q;
      best_t = t;
      have = true;
    }
  }
  return best;
}

Status Search::Split(bool generator_runs, std::span<const BeamWork> work) {
  if (!vkv_) return Status::OK();
  const int32_t n = pool_->pool_buffers();
  int32_t run;  // the running model's limit
  if (p_.verifier_share >= 0.f) {
    // A fixed split holds in both phases: each side keeps room for one beam.
    const int32_t v = std::clamp(int32_t(std::lround(double(p_.verifier_share) * n)), min_blocks_,
                                 n - min_blocks_);
    run = generator_runs ? n - v : v;
  } else {
    // The idle model needs no buffer until it runs again (its blocks wait in its slow
    // tier), so the running one may take all but one.
    run = ChooseLimit(generator_runs, work, min_blocks_, n - 1);
  }
  PrefixTreeKv* running = generator_runs ? kv_ : vkv_;
  PrefixTreeKv* idle = generator_runs ? vkv_ : kv_;
  // The idle model gives its buffers back first; the running one then grows into them.
  STRATA_RETURN_IF_ERROR(idle->SetFastLimit(n - run));
  STRATA_RETURN_IF_ERROR(running->SetFastLimit(run));
  const int k = generator_runs ? 0 : 1;
  ++phases_[k];
  share_sum_[k] += double(run) / double(n);
  st_.generator_phase_share = phases_[0] ? share_sum_[0] / double(phases_[0]) : 0;
  st_.verifier_phase_share = phases_[1] ? share_sum_[1] / double(phases_[1]) : 0;
  return Status::OK();
}

Status Search::RunStep() {
  std::vector<BeamWork> work;
  for (size_t i = 0; i < beams_.size(); ++i) {
    Beam& b = *beams_[i];
    if (b.carried) {
      b.carried = false;  // its step began speculatively in the last one
    } else {
      b.step_done = false;
      b.step_tokens.clear();
      b.step_logprobs.clear();
      b.step_text.clear();
    }
  }
  STRATA_RETURN_IF_ERROR(StepWork(&work));
  STRATA_RETURN_IF_ERROR(Split(/*generator_runs=*/true, work));
  const int32_t capacity = kv_->fast_capacity_blocks();
  if (p_.speculate > 0) {
    // The most promising beams by the verifier so far (their mean step score; at the first
    // step every beam), as many as will be kept, may speculate; each for a share of the
    // mean step length.
    std::vector<const Beam*> order;
    for (const auto& b : beams_) order.push_back(b.get());
    std::stable_sort(order.begin(), order.end(), [](const Beam* a, const Beam* b) {
      return a->score() > b->score() || (a->score() == b->score() && a->id < b->id);
    });
    const size_t keep = step_ == 0 ? order.size() : size_t(p_.n_beams / p_.beam_width);
    promising_.clear();
    for (size_t i = 0; i < order.size() && i < keep; ++i) promising_.insert(order[i]->id);
    const double mean = step_len_count_ > 0 ? double(step_len_sum_) / double(step_len_count_)
                                            : double(p_.step_tokens);
    spec_limit_ = std::max(1, int32_t(std::lround(double(p_.speculate) * mean)));
  }
  StepPlan plan;
  STRATA_RETURN_IF_ERROR(PlanStep(work, capacity, p_.schedule, step_ % 2 == 1, &plan));
  const bool pressure = plan.total_blocks > capacity;
  st_.rounds += int64_t(plan.groups.size());
  st_.max_step_rounds = std::max(st_.max_step_rounds, int32_t(plan.groups.size()));
  const bool pin = p_.schedule != BeamSchedule::kTokenwise;
  auto seqs_of = [&](const BeamGroup& g) {
    std::vector<SeqId> s;
    for (int32_t i : g.beams) s.push_back(beams_[size_t(i)]->seq);
    return s;
  };
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const BeamGroup& group = plan.groups[g];
    // Writing filled blocks ahead pays when they will be evicted: in every group but a
    // grouped step's last, whose blocks stay for the next step (or are pruned unwritten).
    kv_->set_write_behind(write_behind_ && pressure &&
                          (p_.schedule == BeamSchedule::kTokenwise || g + 1 < plan.groups.size()));
    if (pin) {
      int32_t reserve = 0;
      for (int32_t i : group.beams) reserve += work[size_t(i)].new_blocks;
      STRATA_RETURN_IF_ERROR(kv_->Pin(seqs_of(group), reserve));
      if (p_.schedule == BeamSchedule::kBalanced && g + 1 < plan.groups.size()) {
        int32_t started = 0;
        STRATA_RETURN_IF_ERROR(kv_->Prefetch(seqs_of(plan.groups[g + 1]), capacity, &started));
      }
    }
    std::vector<Beam*> members;
    for (int32_t i : group.beams) members.push_back(beams_[size_t(i)].get());
    Status s = RunGroup(members);
    if (pin) kv_->Unpin();
    STRATA_RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

Status Search::RunGroup(const std::vector<Beam*>& group) {
  std::vector<Beam*> active, eval, ended;
  for (Beam* b : group)
    if (!b->step_done) active.push_back(b);  // a carried child may have ended its step already
  std::vector<int32_t> next;
  while (!active.empty()) {
    eval.clear();
    next.clear();
    // Each beam's choice and its log-probability depend on that beam alone (its own logits,
    // history and sampler), so they are computed on the pool's threads: over a 49K-token
    // vocabulary they cost more than a GPU pass of a small model.
    picks_.resize(active.size());
    scratch_.resize(size_t(engine_->pool().size()));
    auto pick = [&](int64_t i, int worker) {
      Beam* b = active[size_t(i)];
      const float* row = b->row ? b->row : b->logits->data();
      int32_t t;
      if (p_.sampling.temperature <= 0.f && b->step_tokens.empty() && b->first_rank > 0)
        t = RankedToken(row, n_vocab_, std::min(b->first_rank, n_vocab_ - 1));
      else
        t = b->sampler->Sample(row, b->history);
      picks_[size_t(i)] = {t, float(TokenLogProb(row, n_vocab_, t, &scratch_[size_t(worker)]))};
    };
    if (active.size() > 1)
      engine_->pool().Run(int64_t(active.size()), pick);
    else
      pick(0, 0);
    for (size_t i = 0; i < active.size(); ++i) {
      Beam* b = active[i];
      const int32_t t = picks_[i].token;
      b->step_tokens.push_back(t);
      b->step_logprobs.push_back(picks_[i].logprob);
      if (b->speculative) ++st_.speculative_tokens;
      if (!p_.ignore_eos && tok_.IsEndOfGeneration(t)) {
        b->step_done = b->finished = true;
        b->stop = BeamStop::kEndOfGeneration;
        continue;
      }
      b->tokens.push_back(t);
      b->history.push_back(t);
      b->step_text += tok_.TokenBytes(t);
      if (int32_t(b->tokens.size()) >= p_.max_tokens) {
        b->step_done = b->finished = true;
        b->stop = BeamStop::kMaxTokens;
        continue;
      }
      if (int32_t(b->step_tokens.size()) >= p_.step_tokens ||
          (!p_.step_delimiter.empty() && b->step_text.find(p_.step_delimiter) != std::string::npos))
        b->step_done = true;
      eval.push_back(b);  // the next token (or the children's first) needs its logits
      next.push_back(t);
    }
    if (eval.empty()) break;
    batch_.Clear();
    for (size_t i = 0; i < eval.size(); ++i)
      batch_.Add(eval[i]->seq, kv_->Length(eval[i]->seq), {&next[i], 1});
    const auto tp = Clock::now();
    STRATA_RETURN_IF_ERROR(engine_->Evaluate(batch_, &logits_));
    if (vkv_ && gen_passes_.size() < 4096) gen_passes_.push_back({int32_t(eval.size()), Since(tp)});
    ++st_.forward_passes;
    st_.generated_tokens += int64_t(eval.size());
    st_.slot_passes += int64_t(group.size());
    st_.idle_slot_passes += std::max<int64_t>(0, int64_t(group.size()) - int64_t(eval.size()));
    active.clear();
    ended.clear();
    for (size_t i = 0; i < eval.size(); ++i) {
      // Rows stay valid until the next pass, which comes after every active beam sampled;
      // only a beam's last row of the step is kept, for its children.
      Beam* b = eval[i];
      b->row = logits_.data() + i * size_t(n_vocab_);
      if (b->step_done) {
        b->logits = std::make_shared<const std::vector<float>>(b->row, b->row + n_vocab_);
        b->row = nullptr;
        if (!b->speculative) ended.push_back(b);
      } else {
        active.push_back(b);
      }
    }
    // A beam that ended its step while others of its group go on leaves a slot idle until
    // the longest ends: its first child may begin the next step there. Speculation stops at
    // its share of a step, or when no beam of this step is left to wait for.
    const bool waiting =
        std::any_of(active.begin(), active.end(), [](const Beam* b) { return !b->speculative; });
    if (p_.speculate > 0 && waiting)
      for (Beam* b : ended) STRATA_RETURN_IF_ERROR(Speculate(*b, &active));
    std::erase_if(active, [&](Beam* b) {
      if (!b->speculative || (waiting && int32_t(b->step_tokens.size()) < spec_limit_))
        return false;
      if (b->row) {
        b->logits = std::make_shared<const std::vector<float>>(b->row, b->row + n_vocab_);
        b->row = nullptr;
      }
      return true;
    });
  }
  return Status::OK();
}

Status Search::Speculate(Beam& b, std::vector<Beam*>* active) {
  if (b.finished || !promising_.count(b.id) || spec_.count(b.id)) return Status::OK();
  std::unique_ptr<Beam> c = NewChild(b, 0);
  c->speculative = true;
  STRATA_RETURN_IF_ERROR(engine_->kv().ForkSequence(b.seq, &c->seq));
  // Only buffers the group does not need: a child that does not fit is not started.
  const int32_t n = std::min(spec_limit_, p_.max_tokens - int32_t(b.tokens.size()));
  if (!kv_->ReserveMore(kv_->NewBlocksFor(c->seq, n))) return engine_->RemoveSequence(c->seq);
  active->push_back(c.get());
  spec_[b.id] = std::move(c);
  return Status::OK();
}

Status Search::ScoreStep(int32_t step) {
  std::vector<std::string> texts(beams_.size());
  std::vector<StepCandidate> cands(beams_.size());
  for (size_t i = 0; i < beams_.size(); ++i) {
    const Beam& b = *beams_[i];
    texts[i] = tok_.Decode(b.tokens);
    StepCandidate& c = cands[i];
    c.beam_id = b.id;
    c.parent_id = b.parent_id;
    c.step = step;
    c.prompt = prompt_;
    // tokens holds this step's tokens too, except an ending EOS.
    const bool eos = b.finished && b.stop == BeamStop::kEndOfGeneration;
    const size_t in_tokens = b.step_tokens.size() - (eos ? 1 : 0);
    c.path_tokens = std::span<const int32_t>(b.tokens).first(b.tokens.size() - in_tokens);
    c.step_tokens = b.step_tokens;
    c.step_logprobs = b.step_logprobs;
    c.text = texts[i];
    c.final = b.finished;
    // Its first child's tokens generated ahead, verified in the same pass where the
    // verifier can (they are kept if the beam is selected).
    auto spec = spec_.find(b.id);
    if (!b.finished && spec != spec_.end()) c.ahead = spec->second->step_tokens;
  }
  std::vector<double> scores;
  STRATA_RETURN_IF_ERROR(verifier_->ScoreStep(cands, &scores));
  if (scores.size() != beams_.size())
    return Status::Internal("verifier '" + std::string(verifier_->name()) + "' returned " +
                            std::to_string(scores.size()) + " scores for " +
                            std::to_string(beams_.size()) + " beams");
  for (size_t i = 0; i < beams_.size(); ++i)
    if (!std::isfinite(scores[i]))
      return Status::InvalidArgument(
          "verifier '" + std::string(verifier_->name()) + "': beam " +
          std::to_string(beams_[i]->id) + " at step " + std::to_string(step) +
          " got a score that is not a finite number (" + std::to_string(scores[i]) + ")");
  for (size_t i = 0; i < beams_.size(); ++i) {
    beams_[i]->score_sum += scores[i];
    ++beams_[i]->steps;
    step_len_sum_ += int64_t(beams_[i]->step_tokens.size());
    ++step_len_count_;
  }
  std::vector<uint64_t> parents;
  for (const auto& b : beams_) parents.push_back(b->parent_id);
  std::sort(parents.begin(), parents.end());
  parents.erase(std::unique(parents.begin(), parents.end()), parents.end());
  for (uint64_t id : parents) verifier_->Forget(id);
  return Status::OK();
}

void Search::Finish(Beam& b, std::vector<BeamResult>* results) {
  BeamResult r;
  r.beam_id = b.id;
  r.tokens = b.tokens;
  r.text = tok_.Decode(b.tokens);
  r.score = b.score();
  r.steps = b.steps;
  r.stop = b.stop;
  results->push_back(std::move(r));
  verifier_->Forget(b.id);
}

Status Search::Select(std::vector<BeamResult>* results, bool last_step) {
  std::vector<std::unique_ptr<Beam>> open;
  Status first;
  auto drop = [&](Beam& b) {
    Status s = engine_->RemoveSequence(b.seq);
    b.seq = -1;
    if (first.ok() && !s.ok()) first = s;
  };
  for (auto& b : beams_) {
    if (b->finished || last_step) {
      if (!b->finished) b->stop = BeamStop::kStepLimit;
      Finish(*b, results);
      drop(*b);
    } else {
      open.push_back(std::move(b));
    }
  }
  beams_.clear();
  STRATA_RETURN_IF_ERROR(first);
  std::stable_sort(open.begin(), open.end(), [](const auto& a, const auto& b) {
    const double sa = a->score(), sb = b->score();
    return sa > sb || (sa == sb && a->id < b->id);
  });
  const size_t keep = std::min(open.size(), size_t(p_.n_beams / p_.beam_width));
  Status s;
  for (size_t k = 0; k < open.size(); ++k) {
    Beam& parent = *open[k];
    for (int32_t j = 0; k < keep && s.ok() && j < p_.beam_width; ++j) {
      auto spec = j == 0 ? spec_.find(parent.id) : spec_.end();
      if (spec != spec_.end()) {
        // The first child generated ahead exactly as it would now: it keeps those tokens.
        std::unique_ptr<Beam> c = std::move(spec->second);
        spec_.erase(spec);
        c->speculative = false;
        c->carried = true;
        c->score_sum = parent.score_sum;  // forked before the parent's step was scored
        c->steps = parent.steps;
        st_.speculative_tokens_kept += int64_t(c->step_tokens.size());
        beams_.push_back(std::move(c));
        continue;
      }
      beams_.push_back(NewChild(parent, j));
      s = engine_->kv().ForkSequence(parent.seq, &beams_.back()->seq);
    }
    if (k >= keep) verifier_->Forget(parent.id);
    drop(parent);
  }
  // Speculation for beams that finished or were not selected is dropped.
  for (auto& [id, c] : spec_) drop(*c);
  spec_.clear();
  STRATA_RETURN_IF_ERROR(s);
  return first;
}

}  // namespace

const char* BeamStopName(BeamStop s) {
  switch (s) {
    case BeamStop::kEndOfGeneration:
      return "eos";
    case BeamStop::kMaxTokens:
      return "max_tokens";
    case BeamStop::kStepLimit:
      return "step_limit";
  }
  return "?";
}

uint64_t MinFastBudgetBytes(const BeamSearchParams& p, const HParams& hp, int32_t prompt_tokens) {
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, 1};
  const uint64_t bb = PrefixTreeKv::BlockBytes(shape, std::max(1, p.block_tokens), kSlowAlignment);
  const int64_t one_beam =
      Blocks(int64_t(prompt_tokens) + p.max_tokens, std::max(1, p.block_tokens)) + 1;
  if (p.schedule != BeamSchedule::kTokenwise) return uint64_t(one_beam) * bb;
  // Token by token, every beam's last block stays resident (and, when steps or the prompt
  // end inside a block, the copy a fork's first write makes), plus two staging areas of at
  // least a block each. How much more staging takes depends on how far the tree grows
  // beyond the budget, which only the run shows: a pass that needs more says so.
  const bool copies = prompt_tokens % p.block_tokens != 0 || p.step_tokens % p.block_tokens != 0 ||
                      !p.step_delimiter.empty();
  const int64_t tails = int64_t(p.n_beams) * (copies ? 2 : 1);
  // The prompt's prefill adds all its blocks in one pass.
  const int64_t prefill = Blocks(prompt_tokens, p.block_tokens) + 1;
  return uint64_t(std::max<int64_t>(prefill, tails) + 2) * bb;
}

uint64_t SearchKvBytes(const BeamSearchParams& p, const HParams& hp, int32_t prompt_tokens) {
  return uint64_t(hp.kv_bytes_per_token_f16()) *
         (uint64_t(prompt_tokens) + uint64_t(p.n_beams) * uint64_t(p.max_tokens));
}

Status ParseVerifierShare(const std::string& text, float* out) {
  if (text == "auto") {
    *out = -1.f;
    return Status::OK();
  }
  char* end = nullptr;
  const float share = std::strtof(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(share >= 0.f && share <= 1.f))
    return Status::InvalidArgument("verifier share: '" + text +
                                   "' is neither auto nor a share in [0, 1]");
  *out = share;
  return Status::OK();
}

Status ValidateBeamSearchParams(const BeamSearchParams& p, const HParams& hp,
                                int32_t prompt_tokens) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("beam search: " + what);
  };
  if (p.n_beams < 1 || p.n_beams > 1024)
    return bad("beams: " + std::to_string(p.n_beams) + " is out of range [1, 1024]");
  if (p.beam_width < 1 || p.beam_width > p.n_beams || p.n_beams % p.beam_width != 0)
    return bad("beam width: " + std::to_string(p.beam_width) + " must be in [1, " +
               std::to_string(p.n_beams) + "] and divide the " + std::to_string(p.n_beams) +
               " beams (beams / width are kept each step)");
  if (p.step_tokens < 1 || p.step_tokens > 4096)
    return bad("step tokens: " + std::to_string(p.step_tokens) + " is out of range [1, 4096]");
  if (p.block_tokens < 1 || p.block_tokens > 1024)
    return bad("block tokens: " + std::to_string(p.block_tokens) + " is out of range [1, 1024]");
  if (p.max_steps < 0) return bad("max steps: " + std::to_string(p.max_steps) + " is negative");
  if (!(p.speculate >= 0.f && p.speculate <= 1.f))
    return bad("speculate: " + std::to_string(p.speculate) +
               " is out of range [0, 1] (a share of the mean step length)");
  if (!(p.verifier_share <= 1.f))
    return bad("verifier share: " + std::to_string(p.verifier_share) +
               " is out of range [0, 1] (or negative: chosen per phase by the cost model)");
  if (p.speculate > 0.f && p.schedule == BeamSchedule::kTokenwise)
    return bad(
        "speculate needs a grouped schedule (grouped, prefix or balanced): the "
        "token-by-token schedule streams every block each pass and has no group to pin "
        "the speculative children in");
  if (prompt_tokens < 1) return bad("the prompt has no tokens");
  const int64_t limit = hp.n_ctx_train > 0 ? hp.n_ctx_train : (int64_t(1) << 20);
  if (p.max_tokens < 1 || int64_t(prompt_tokens) + p.max_tokens > limit)
    return bad("max tokens: " + std::to_string(p.max_tokens) + " is out of range [1, " +
               std::to_string(std::max<int64_t>(0, limit - prompt_tokens)) + "] (the prompt's " +
               std::to_string(prompt_tokens) + " tokens + max tokens must fit the model's " +
               "context of " + std::to_string(limit) + ")");
  if (p.sampling.temperature <= 0.f && p.n_beams > hp.n_vocab)
    return bad("greedy search starts its " + std::to_string(p.n_beams) +
               " beams with distinct tokens, the vocabulary has " + std::to_string(hp.n_vocab));
  STRATA_RETURN_IF_ERROR(ValidateSamplingParams(p.sampling));
  if (p.slow_disk.enabled) STRATA_RETURN_IF_ERROR(p.slow_disk.Validate());
  if (p.slow_in_ram && p.gpu_slow_on_disk)
    return bad("the slow tier is asked to be both host RAM and the disk");
  const uint64_t min = MinFastBudgetBytes(p, hp, prompt_tokens);
  if (p.fast_budget_bytes != 0 && p.fast_budget_bytes < min)
    return Status::ResourceExhausted(
        "beam search: the fast-tier budget of " + std::to_string(p.fast_budget_bytes) +
        " bytes is smaller than " +
        (p.schedule == BeamSchedule::kTokenwise
             ? std::string("what the token-by-token schedule keeps resident at least (every "
                           "beam's last block and two layer-staging areas)")
             : std::string("one beam's working set (" + std::to_string(prompt_tokens) +
                           " prompt + " + std::to_string(p.max_tokens) + " generated tokens)")) +
        ": the minimum is " + std::to_string(min) + " bytes");
  return Status::OK();
}

Status EncodeBeamPrompt(const Model& model, std::string_view text, bool chat,
                        std::vector<int32_t>* out) {
  if (!chat) return model.tokenizer().Encode(text, true, /*parse_special=*/true, out);
  if (model.chat_template() == ChatTemplateKind::kNone)
    return Status::NotSupported(
        "chat: the model has no chat template this build knows "
        "(supported: ChatML, Llama 3, Llama 2); use a plain prompt");
  const std::string rendered =
      ApplyChatTemplate(model.chat_template(), {{"user", std::string(text)}},
                        /*add_generation_prompt=*/true, model.default_system_prompt());
  return model.tokenizer().Encode(rendered, true, /*parse_special=*/true, out);
}

Status RunBeamSearch(const Model& model, std::span<const int32_t> prompt, const BeamSearchParams& p,
                     Verifier* verifier, std::vector<BeamResult>* results, BeamSearchStats* stats) {
  BeamSearchStats local;
  BeamSearchStats& st = stats ? *stats : local;
  st = BeamSearchStats();
  results->clear();
  st.prompt_tokens = int32_t(prompt.size());
  STRATA_RETURN_IF_ERROR(ValidateBeamSearchParams(p, model.hparams(), int32_t(prompt.size())));
  for (int32_t t : prompt)
    if (t < 0 || t >= model.hparams().n_vocab)
      return Status::InvalidArgument("beam search: prompt token " + std::to_string(t) +
                                     " is outside the vocabulary");
  MeanLogProbVerifier builtin;
  Verifier* v = verifier ? verifier : &builtin;
  st.verifier = v->name();
  Search search(model, p, v, &st);
  Status s = search.Setup(int32_t(prompt.size()));
  if (s.ok()) s = search.Run(prompt, results);
  const VerifierAheadCounters ahead = v->ahead_counters();
  st.verifier_ahead_tokens = ahead.run;
  st.verifier_ahead_reused = ahead.reused;
  v->End();
  search.ReleaseAll();
  if (PrefixTreeKv* kv = search.kv()) {
    st.kv = kv->tree_counters();
    st.peak_tree_bytes = st.kv.peak_live_blocks * st.kv.block_bytes;
    Status inv = kv->CheckInvariants();
    if (s.ok() && !inv.ok()) s = inv;
    if (s.ok() && st.kv.live_blocks != 0)
      s = Status::Internal("beam search: " + std::to_string(st.kv.live_blocks) +
                           " KV blocks left after the search");
  }
  if (PrefixTreeKv* vkv = search.verifier_kv()) {
    st.verifier_kv = vkv->tree_counters();
    st.peak_fast_bytes_total = search.pool_peak_bytes();
    Status inv = vkv->CheckInvariants();
    if (s.ok() && !inv.ok()) s = inv.WithContext("scorer model");
    if (s.ok() && st.verifier_kv.live_blocks != 0)
      s = Status::Internal("beam search: " + std::to_string(st.verifier_kv.live_blocks) +
                           " of the scorer's KV blocks left after the search");
  }
  if (!s.ok()) results->clear();
  return s;
}

}  // namespace strata
