#include "runtime/model/model_math.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace strata {

std::vector<float> RopeInverseFrequencies(const Model& model) {
  return RopeInverseFrequencies(model.hparams(), model.weights().rope_freqs.present()
                                                     ? model.weights().rope_freqs.f32()
                                                     : nullptr);
}

std::vector<float> RopeInverseFrequencies(const HParams& hp, const float* factors) {
  // theta_i = pos * freq_scale * base^(-2i/rope_dim) / factor_i (factors: Llama 3.1).
  const int32_t half = hp.rope_dim / 2;
  std::vector<float> inv_freq(size_t(std::max(half, 0)));
  // YaRN: pair i keeps its original frequency where it turns more than beta_fast times over
  // the original context, takes the interpolated one where it turns fewer than beta_slow
  // times, and a linear mix between. The pair that turns n times has index
  // rope_dim * ln(orig_ctx / (2 pi n)) / (2 ln base).
  double low = 0, high = 0;
  if (hp.rope_yarn) {
    auto pair_of = [&](double turns) {
      return hp.rope_dim * std::log(double(hp.rope_orig_ctx) / (turns * 2.0 * M_PI)) /
             (2.0 * std::log(double(hp.rope_base)));
    };
    low = std::max(0.0, std::floor(pair_of(hp.rope_yarn_beta_fast)));
    high = std::min(double(hp.rope_dim - 1), std::ceil(pair_of(hp.rope_yarn_beta_slow)));
  }
  for (int32_t i = 0; i < half; ++i) {
    const double original = std::pow(double(hp.rope_base), -2.0 * i / hp.rope_dim);
    double f = original * hp.rope_freq_scale;
    if (hp.rope_yarn) {
      const double y = (double(i) - low) / std::max(0.001, high - low);
      const double keep = 1.0 - std::clamp(y, 0.0, 1.0);  // 1: the original frequency
      f = f * (1.0 - keep) + original * keep;
    }
    if (factors) f /= factors[i];
    inv_freq[size_t(i)] = float(f);
  }
  return inv_freq;
}

float AttentionScale(const HParams& hp) {
  return hp.rope_attn_factor * hp.rope_attn_factor / std::sqrt(float(hp.head_dim));
}

void RopeCosSin(const std::vector<float>& inv_freq, int32_t pos, float* cos_sin) {
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const double a = double(pos) * inv_freq[j];
    cos_sin[2 * j] = float(std::cos(a));
    cos_sin[2 * j + 1] = float(std::sin(a));
  }
}

void FinishQkv(const HParams& hp, const LayerWeights& L, const float* cos_sin, float* q, float* k,
               float* v) {
  const int32_t hd = hp.head_dim;
  const int64_t q_dim = int64_t(hp.n_head) * hd, kv_dim = int64_t(hp.n_head_kv) * hd;
  if (hp.has_qkv_bias) {
    kernels::Add(q, L.bq.f32(), q_dim);
    if (k) kernels::Add(k, L.bk.f32(), kv_dim);
    if (v) kernels::Add(v, L.bv.f32(), kv_dim);
  }
  if (hp.has_qk_norm) {
    for (int32_t h = 0; h < hp.n_head; ++h)
      kernels::RmsNorm(q + h * hd, L.q_norm.f32(), q + h * hd, hd, hp.rms_eps);
    if (k)
      for (int32_t h = 0; h < hp.n_head_kv; ++h)
        kernels::RmsNorm(k + h * hd, L.k_norm.f32(), k + h * hd, hd, hp.rms_eps);
  }
  kernels::RopeApply(q, hp.n_head, hd, hp.rope_dim, cos_sin, hp.rope_layout);
  if (k) kernels::RopeApply(k, hp.n_head_kv, hd, hp.rope_dim, cos_sin, hp.rope_layout);
}

}  // namespace strata
