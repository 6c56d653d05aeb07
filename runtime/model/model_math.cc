#include "runtime/model/model_math.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace strata {

std::vector<float> RopeInverseFrequencies(const Model& model) {
  // theta_i = pos * freq_scale * base^(-2i/rope_dim) / factor_i (factors: Llama 3.1).
  const HParams& hp = model.hparams();
  const int32_t half = hp.rope_dim / 2;
  std::vector<float> inv_freq(size_t(std::max(half, 0)));
  const float* factors =
      model.weights().rope_freqs.present() ? model.weights().rope_freqs.f32() : nullptr;
  for (int32_t i = 0; i < half; ++i) {
    double f = std::pow(double(hp.rope_base), -2.0 * i / hp.rope_dim) * hp.rope_freq_scale;
    if (factors) f /= factors[i];
    inv_freq[size_t(i)] = float(f);
  }
  return inv_freq;
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
