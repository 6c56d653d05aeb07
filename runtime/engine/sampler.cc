#include "runtime/engine/sampler.h"

#include <cstdint>

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace strata {

Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](const char* name, double v, const char* limit) {
    return Status::InvalidArgument(std::string("sampling.") + name + ": " + std::to_string(v) +
                                   " is out of range " + limit);
  };
  if (!(p.temperature >= 0.f && p.temperature <= 100.f))
    return bad("temperature", p.temperature, "[0, 100]");
  if (p.top_k < 0) return bad("top_k", p.top_k, "[0, n_vocab] (0 = off)");
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) return bad("top_p", p.top_p, "(0, 1]");
  if (!(p.min_p >= 0.f && p.min_p < 1.f)) return bad("min_p", p.min_p, "[0, 1)");
  if (!(p.repeat_penalty > 0.f && p.repeat_penalty <= 10.f))
    return bad("repeat_penalty", p.repeat_penalty, "(0, 10]");
  if (p.repeat_last_n < 0) return bad("repeat_last_n", p.repeat_last_n, "[0, context]");
  if (p.seed > uint64_t(INT64_MAX))
    return Status::InvalidArgument("sampling.seed: " + std::to_string(p.seed) +
                                   " is out of range [0, " + std::to_string(INT64_MAX) + "]");
  return Status::OK();
}

int32_t ArgMax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : p_(params), n_vocab_(n_vocab), rng_(params.seed) {}

int32_t Sampler::Sample(const float* logits, std::span<const int32_t> history) {
  cand_.resize(n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) cand_[i] = {i, logits[i]};

  // Repetition penalty: each distinct recent token once (as in the CTRL paper: divide a
  // positive logit, multiply a negative one).
  if (p_.repeat_penalty != 1.f && p_.repeat_last_n > 0 && !history.empty()) {
    size_t n = std::min<size_t>(history.size(), size_t(p_.repeat_last_n));
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab_) continue;
      float& l = cand_[id].logit;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
  }

  if (p_.temperature <= 0.f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab_; ++i)
      if (cand_[i].logit > cand_[best].logit) best = i;
    last_p_ = 1.f;
    return best;
  }

  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    // One pass keeping the k best in a small sorted array: almost every logit loses to the
    // current k-th best at the first comparison, so this costs ~n comparisons, where a
    // partial sort of the whole vocabulary costs ~n log k.
    const size_t k = size_t(p_.top_k);
    top_.assign(cand_.begin(), cand_.begin() + k);
    std::sort(top_.begin(), top_.end(), by_logit);
    for (size_t i = k; i < n; ++i) {
      if (!by_logit(cand_[i], top_[k - 1])) continue;
      size_t j = k - 1;
      while (j > 0 && by_logit(cand_[i], top_[j - 1])) {
        top_[j] = top_[j - 1];
        --j;
      }
      top_[j] = cand_[i];
    }
    std::copy(top_.begin(), top_.end(), cand_.begin());
    n = k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }

  // Softmax with temperature over the (sorted) survivors.
  probs_.resize(n);
  const float mx = cand_[0].logit / p_.temperature;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp(cand_[i].logit / p_.temperature - mx);
    sum += probs_[i];
  }
  for (size_t i = 0; i < n; ++i) probs_[i] = float(probs_[i] / sum);

  // Top-p: the smallest prefix whose mass reaches p (at least one token).
  if (p_.top_p < 1.f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs_[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  // Min-p: drop tokens less likely than min_p times the most likely one.
  if (p_.min_p > 0.f) {
    const float floor = p_.min_p * probs_[0];
    size_t keep = 1;
    while (keep < n && probs_[keep] >= floor) ++keep;
    n = keep;
  }

  double total = 0;
  for (size_t i = 0; i < n; ++i) total += probs_[i];
  // A uniform draw in [0, total) from the top 53 bits of the generator: identical on every
  // platform for a given seed (std distributions are not specified bit-for-bit).
  const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  size_t pick = n - 1;
  for (size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (u < acc) {
      pick = i;
      break;
    }
  }
  last_p_ = float(probs_[pick] / total);
  return cand_[pick].id;
}

}  // namespace strata
