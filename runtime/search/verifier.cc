#include "runtime/search/verifier.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "kernels/kernels.h"

namespace strata {

Status Verifier::Begin(std::span<const int32_t>, uint64_t) { return Status::OK(); }
void Verifier::Forget(uint64_t) {}
void Verifier::End() {}
uint64_t Verifier::KvBlockBytes(int32_t, uint32_t) const { return 0; }
Status Verifier::PlaceKv(const FastTier*, int32_t, int32_t, const SlowTierFactory&) {
  return Status::OK();
}

double TokenLogProb(const float* logits, int32_t n_vocab, int32_t token,
                    std::vector<float>* scratch) {
  scratch->assign(logits, logits + n_vocab);
  kernels::SoftmaxInPlace(scratch->data(), n_vocab);
  // A probability that underflowed is as unlikely as the format can say.
  return std::log(std::max(double((*scratch)[size_t(token)]), 1e-45));
}

Status MeanLogProbVerifier::ScoreStep(std::span<const StepCandidate> cands,
                                      std::vector<double>* scores) {
  scores->assign(cands.size(), 0.0);
  for (size_t i = 0; i < cands.size(); ++i) {
    const auto& lp = cands[i].step_logprobs;
    if (lp.empty()) continue;
    double s = 0;
    for (float x : lp) s += x;
    (*scores)[i] = s / double(lp.size());
  }
  return Status::OK();
}

Status CallbackVerifier::ScoreStep(std::span<const StepCandidate> cands,
                                   std::vector<double>* scores) {
  scores->assign(cands.size(), 0.0);
  for (size_t i = 0; i < cands.size(); ++i) {
    STRATA_RETURN_IF_ERROR(fn_(cands[i], &(*scores)[i]));
    if (!std::isfinite((*scores)[i]))
      return Status::InvalidArgument("scorer: beam " + std::to_string(cands[i].beam_id) +
                                     " at step " + std::to_string(cands[i].step) +
                                     " got a score that is not a finite number");
  }
  return Status::OK();
}

ModelVerifier::~ModelVerifier() { End(); }

Status ModelVerifier::Load(const std::string& path, const Model& generator, int32_t n_threads,
                           size_t prompt_tokens, int32_t max_tokens, int32_t max_beams,
                           std::unique_ptr<Model>* scorer, std::unique_ptr<ModelVerifier>* out) {
  STRATA_RETURN_IF_ERROR(Model::Load(path, scorer));
  return Create(**scorer, generator, n_threads, int32_t(prompt_tokens) + max_tokens + 1, max_beams,
                out);
}

Status ModelVerifier::Create(const Model& scorer, const Model& generator, int32_t n_threads,
                             int32_t n_ctx, int32_t max_beams,
                             std::unique_ptr<ModelVerifier>* out) {
  const Tokenizer& a = scorer.tokenizer();
  const Tokenizer& b = generator.tokenizer();
  if (a.n_vocab() != b.n_vocab())
    return Status::InvalidArgument("scorer model: its vocabulary has " +
                                   std::to_string(a.n_vocab()) + " tokens, the generator's " +
                                   std::to_string(b.n_vocab()) + "; a scorer must share it");
  for (int32_t i = 0; i < a.n_vocab(); ++i)
    if (a.TokenBytes(i, true) != b.TokenBytes(i, true))
      return Status::InvalidArgument("scorer model: token " + std::to_string(i) +
                                     " differs from the generator's; a scorer must share the "
                                     "vocabulary");
  std::unique_ptr<ModelVerifier> v(new ModelVerifier());
  v->n_vocab_ = a.n_vocab();
  v->scorer_ = &scorer;
  v->n_threads_ = n_threads;
  v->n_ctx_ = n_ctx;
  v->max_beams_ = max_beams;
  STRATA_RETURN_IF_ERROR(v->PlaceKv(nullptr, 0, PrefixTreeKvOptions().block_tokens, {}));
  *out = std::move(v);
  return Status::OK();
}

// Sequences the tree may hold: every beam, its children while they are scored, and a path
// with its child's tokens generated ahead per beam.
int32_t ModelVerifier::MaxSequences() const { return 3 * max_beams_ + 2; }

int64_t ModelVerifier::MaxBlocks(int32_t block_tokens) const {
  return int64_t(MaxSequences()) * ((n_ctx_ + block_tokens - 1) / block_tokens + 1);
}

uint64_t ModelVerifier::KvBlockBytes(int32_t block_tokens, uint32_t alignment) const {
  const HParams& hp = scorer_->hparams();
  return PrefixTreeKv::BlockBytes({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx_}, block_tokens,
                                  alignment);
}

Status ModelVerifier::PlaceKv(const FastTier* shared, int32_t limit_blocks, int32_t block_tokens,
                              const SlowTierFactory& make_slow) {
  End();
  PrefixTreeKvOptions ko;
  ko.block_tokens = block_tokens;
  ko.max_sequences = MaxSequences();
  ko.max_blocks = MaxBlocks(block_tokens);
  std::unique_ptr<SlowTier> slow;
  if (shared) {
    ko.share_fast = shared;
    ko.fast_budget_bytes = uint64_t(std::max(limit_blocks, 0)) * shared->buffer_bytes();
    STRATA_RETURN_IF_ERROR(
        make_slow(uint64_t(ko.max_blocks) * KvBlockBytes(block_tokens, 4096), &slow));
  } else {
    if (!shared_ && engine_) return Status::OK();  // already in its own memory
    // Every path fits: the scorer's KV stays in RAM, shared between a beam and its children.
    const uint64_t own_block = KvBlockBytes(block_tokens, 64);
    ko.fast_budget_bytes = uint64_t(ko.max_blocks) * own_block;
    std::unique_ptr<RamSlowTier> ram;
    STRATA_RETURN_IF_ERROR(RamSlowTier::Create(uint64_t(ko.max_blocks) * own_block, &ram));
    slow = std::move(ram);
  }
  shared_ = shared != nullptr;
  return Build(ko, std::move(slow));
}

Status ModelVerifier::Build(const PrefixTreeKvOptions& ko, std::unique_ptr<SlowTier> slow) {
  engine_.reset();
  kv_ = nullptr;
  const HParams& hp = scorer_->hparams();
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx_};
  std::unique_ptr<PrefixTreeKv> kv;
  STRATA_RETURN_IF_ERROR(PrefixTreeKv::Create(shape, ko, std::move(slow), &kv));
  kv_ = kv.get();
  EngineOptions eo;
  eo.n_threads = n_threads_;
  eo.n_batch = 512;
  eo.max_sequences = ko.max_sequences;
  // A step scored with the tokens generated ahead of it must get the bits it gets alone.
  eo.pass_invariant = true;
  return Engine::Create(*scorer_, eo, std::move(kv), &engine_).WithContext("scorer model");
}

Status ModelVerifier::Begin(std::span<const int32_t> prompt, uint64_t root_id) {
  End();
  ahead_counters_ = {};
  Held h;
  STRATA_RETURN_IF_ERROR(engine_->NewSequence(&h.seq));
  Status s = engine_->Prefill(h.seq, prompt, &h.next_logits);
  if (!s.ok()) {
    (void)engine_->RemoveSequence(h.seq);
    return s.WithContext("scorer model");
  }
  held_[root_id] = std::move(h);
  return Status::OK();
}

Status ModelVerifier::ScoreStep(std::span<const StepCandidate> cands, std::vector<double>* scores) {
  scores->assign(cands.size(), 0.0);
  const size_t n_cands = cands.size();
  // Each candidate continues its parent's sequence with the step's tokens and then the
  // tokens its first child generated ahead; a step that begins with what its parent's pass
  // ran ahead continues from there. Row p of a candidate's tokens predicts token p + 1.
  std::vector<Held> fresh(n_cands), ahead_held(n_cands);
  std::vector<std::vector<int32_t>> run(n_cands);
  std::vector<double> sum(n_cands, 0.0), ahead_sum(n_cands, 0.0);
  std::vector<size_t> done(n_cands, 0);
  auto drop_fresh = [&] {
    for (std::vector<Held>* v : {&fresh, &ahead_held})
      for (Held& h : *v)
        if (h.seq >= 0) (void)engine_->RemoveSequence(h.seq);
  };
  auto steps = [&](size_t i) { return cands[i].step_tokens.size(); };
  auto aheads = [&](size_t i) { return steps(i) ? cands[i].ahead.size() : size_t(0); };
  for (size_t i = 0; i < n_cands; ++i) {
    const StepCandidate& c = cands[i];
    run[i].assign(c.step_tokens.begin(), c.step_tokens.end());
    run[i].insert(run[i].end(), c.ahead.begin(), c.ahead.begin() + ptrdiff_t(aheads(i)));
    auto it = held_.find(c.parent_id);
    auto ah = ahead_.find(c.parent_id);
    const bool take =
        ah != ahead_.end() && ah->second.tokens.size() <= steps(i) &&
        std::equal(ah->second.tokens.begin(), ah->second.tokens.end(), c.step_tokens.begin());
    Status s;
    if (it == held_.end()) {
      s = Status::Internal("scorer model: no state for the parent of beam " +
                           std::to_string(c.beam_id));
    } else if (take) {
      s = engine_->kv().ForkSequence(ah->second.held.seq, &fresh[i].seq);
      sum[i] = ah->second.sum;
      done[i] = ah->second.tokens.size();
      const std::vector<float>& after = ah->second.held.next_logits;
      if (done[i] == steps(i))
        fresh[i].next_logits = after;
      else
        sum[i] += TokenLogProb(after.data(), n_vocab_, c.step_tokens[done[i]], &scratch_);
      ahead_counters_.reused += int64_t(done[i]);
    } else {
      s = engine_->kv().ForkSequence(it->second.seq, &fresh[i].seq);
      if (steps(i))
        sum[i] = TokenLogProb(it->second.next_logits.data(), n_vocab_, c.step_tokens[0], &scratch_);
    }
    if (!s.ok()) {
      drop_fresh();
      return s;
    }
    if (done[i] == steps(i) && aheads(i))
      ahead_sum[i] = TokenLogProb(fresh[i].next_logits.data(), n_vocab_, c.ahead[0], &scratch_);
  }
  // Passes of at most max_tokens tokens; a long step is split across passes.
  const size_t limit = size_t(engine_->options().n_batch);
  ForwardBatch batch;
  std::vector<float> logits;
  size_t next = 0;
  while (next < n_cands) {
    batch.Clear();
    std::vector<std::pair<size_t, size_t>> pieces;  // candidate, tokens
    size_t used = 0;
    // In a shared fast tier a pass's working set (the paths and the blocks it adds) must fit
    // the tree's limit too; blocks shared by siblings count once.
    std::set<PrefixTreeKv::BlockId> paths;
    int32_t added = 0;
    std::vector<PrefixTreeKv::BlockId> path;
    for (size_t i = next; i < n_cands && used < limit; ++i) {
      const size_t left = run[i].size() - done[i];
      if (left == 0) continue;
      size_t n = std::min(left, limit - used);
      if (shared_) {
        Status s = kv_->Path(fresh[i].seq, &path);
        if (!s.ok()) {
          drop_fresh();
          return s;
        }
        int32_t extra = 0;
        for (PrefixTreeKv::BlockId b : path) extra += paths.count(b) ? 0 : 1;
        auto fits = [&](size_t tokens) {
          // One more block for the copy that keeps the step's end apart from the ahead path.
          const int32_t keep_apart = aheads(i) ? 1 : 0;
          return int32_t(paths.size()) + extra + added + keep_apart +
                     kv_->NewBlocksFor(fresh[i].seq, int32_t(tokens)) <=
                 kv_->fast_capacity_blocks();
        };
        if (!fits(n) && !pieces.empty()) break;
        while (n > 1 && !fits(n)) n /= 2;  // alone: as much of the step as fits
        paths.insert(path.begin(), path.end());
        added += kv_->NewBlocksFor(fresh[i].seq, int32_t(n));
      }
      batch.Add(fresh[i].seq, engine_->kv().Length(fresh[i].seq),
                std::span<const int32_t>(run[i]).subspan(done[i], n), /*all_logits=*/true);
      pieces.push_back({i, n});
      used += n;
    }
    if (pieces.empty()) break;
    Status s = engine_->Evaluate(batch, &logits);
    if (!s.ok()) {
      drop_fresh();
      return s.WithContext("scorer model");
    }
    size_t row = 0;
    for (auto [i, n] : pieces) {
      const size_t S = steps(i), total = run[i].size();
      for (size_t t = 0; t < n; ++t, ++row) {
        const float* r = logits.data() + row * size_t(n_vocab_);
        const size_t p = done[i] + t + 1;  // the token this row predicts
        if (p < S) {
          sum[i] += TokenLogProb(r, n_vocab_, run[i][p], &scratch_);
        } else if (p == S) {
          fresh[i].next_logits.assign(r, r + n_vocab_);
          if (p < total) ahead_sum[i] = TokenLogProb(r, n_vocab_, run[i][p], &scratch_);
        } else if (p < total) {
          ahead_sum[i] += TokenLogProb(r, n_vocab_, run[i][p], &scratch_);
        } else {
          ahead_held[i].next_logits.assign(r, r + n_vocab_);
        }
      }
      done[i] += n;
    }
    while (next < n_cands && done[next] == run[next].size()) ++next;
  }
  // A candidate that ran tokens ahead: the ahead path keeps them, its own sequence ends
  // with the step.
  for (size_t i = 0; i < n_cands; ++i) {
    if (!aheads(i)) continue;
    Status s = engine_->kv().ForkSequence(fresh[i].seq, &ahead_held[i].seq);
    if (s.ok())
      s = kv_->Truncate(fresh[i].seq, engine_->kv().Length(fresh[i].seq) - int32_t(aheads(i)));
    if (!s.ok()) {
      drop_fresh();
      return s.WithContext("scorer model");
    }
  }
  for (size_t i = 0; i < n_cands; ++i) {
    const size_t n = steps(i);
    (*scores)[i] = n ? sum[i] / double(n) : 0.0;
    auto old = held_.find(cands[i].beam_id);
    if (old != held_.end()) {
      (void)engine_->RemoveSequence(old->second.seq);
      held_.erase(old);
    }
    held_[cands[i].beam_id] = std::move(fresh[i]);
    DropAhead(cands[i].beam_id);
    if (!aheads(i)) continue;
    Ahead& a = ahead_[cands[i].beam_id];
    a.held = std::move(ahead_held[i]);
    a.tokens.assign(cands[i].ahead.begin(), cands[i].ahead.end());
    a.sum = ahead_sum[i];
    ahead_counters_.run += int64_t(a.tokens.size());
  }
  return Status::OK();
}

void ModelVerifier::DropAhead(uint64_t beam_id) {
  auto it = ahead_.find(beam_id);
  if (it == ahead_.end()) return;
  (void)engine_->RemoveSequence(it->second.held.seq);
  ahead_.erase(it);
}

void ModelVerifier::Forget(uint64_t beam_id) {
  DropAhead(beam_id);
  auto it = held_.find(beam_id);
  if (it == held_.end()) return;
  (void)engine_->RemoveSequence(it->second.seq);
  held_.erase(it);
}

void ModelVerifier::End() {
  for (auto& [id, h] : held_) (void)engine_->RemoveSequence(h.seq);
  held_.clear();
  for (auto& [id, a] : ahead_) (void)engine_->RemoveSequence(a.held.seq);
  ahead_.clear();
}

}  // namespace strata
