#include "tests/engine/reference_forward.h"

#include <cmath>

#include "kernels/kernels.h"

namespace strata::testing {
namespace {

using Mat = std::vector<float>;  // row-major [rows][cols]

Mat Dequant(const TensorRef& t) {
  Mat m(size_t(t.rows) * t.cols);
  for (int64_t r = 0; r < t.rows; ++r)
    kernels::DequantizeRow(t.type, static_cast<const uint8_t*>(t.data) + r * t.row_bytes,
                           m.data() + r * t.cols, t.cols);
  return m;
}

std::vector<double> MatVec(const Mat& w, int64_t rows, int64_t cols, const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += double(w[r * cols + c]) * x[c];
    y[r] = s;
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x, const float* w, size_t off, size_t n,
                         float eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[off + i] * inv * (w ? w[i] : 1.0f);
  return y;
}

void Rope(std::vector<double>& v, int n_heads, const HParams& hp, const float* factors, int pos) {
  const int hd = hp.head_dim, rd = hp.rope_dim;
  for (int h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * hd;
    for (int i = 0; i < rd / 2; ++i) {
      const double base_freq = std::pow(double(hp.rope_base), -2.0 * i / rd);
      double freq = hp.rope_freq_scale * base_freq;
      if (hp.rope_yarn) {
        // YaRN (Peng et al. 2023, "by parts"): the wavelength of pair i is 2 pi / base_freq;
        // r = original context / wavelength counts its turns. Pairs with r > beta_fast keep
        // base_freq, r < beta_slow are interpolated, linear in the pair index between the
        // (rounded outward) indices where r crosses beta_fast and beta_slow.
        auto index_at = [&](double turns) {
          return rd * std::log(hp.rope_orig_ctx / (turns * 2 * M_PI)) /
                 (2 * std::log(double(hp.rope_base)));
        };
        const double lo = std::max(0.0, std::floor(index_at(hp.rope_yarn_beta_fast)));
        const double hi = std::min(rd - 1.0, std::ceil(index_at(hp.rope_yarn_beta_slow)));
        double gamma = (i - lo) / std::max(hi - lo, 0.001);
        gamma = gamma < 0 ? 0 : gamma > 1 ? 1 : gamma;
        freq = gamma * freq + (1 - gamma) * base_freq;
      }
      double theta = pos * freq;
      if (factors) theta /= factors[i];
      const double c = std::cos(theta), s = std::sin(theta);
      const int a = hp.rope_layout == kernels::RopeLayout::kNeox ? i : 2 * i;
      const int b = hp.rope_layout == kernels::RopeLayout::kNeox ? i + rd / 2 : 2 * i + 1;
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * c - x1 * s;
      x[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

std::vector<std::vector<float>> ReferenceLogits(const Model& model,
                                                const std::vector<int32_t>& tokens) {
  const HParams& hp = model.hparams();
  const ModelWeights& W = model.weights();
  const int n = int(tokens.size()), E = hp.n_embd, hd = hp.head_dim;
  const int qd = hp.n_head * hd, kd = hp.n_head_kv * hd;
  const float* factors = W.rope_freqs.present() ? W.rope_freqs.f32() : nullptr;
  const Mat emb = Dequant(W.tok_embd);
  std::vector<std::vector<double>> x(n, std::vector<double>(E));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < E; ++i) x[t][i] = emb[size_t(tokens[t]) * E + i];

  for (const LayerWeights& L : W.layers) {
    const Mat wq = Dequant(L.wq), wk = Dequant(L.wk), wv = Dequant(L.wv), wo = Dequant(L.wo);
    const Mat wg = Dequant(L.w_gate), wu = Dequant(L.w_up), wd = Dequant(L.w_down);
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      auto xn = Norm(x[t], L.attn_norm.f32(), 0, E, hp.rms_eps);
      q[t] = MatVec(wq, qd, E, xn);
      k[t] = MatVec(wk, kd, E, xn);
      v[t] = MatVec(wv, kd, E, xn);
      if (hp.has_qkv_bias) {
        for (int i = 0; i < qd; ++i) q[t][i] += L.bq.f32()[i];
        for (int i = 0; i < kd; ++i) k[t][i] += L.bk.f32()[i], v[t][i] += L.bv.f32()[i];
      }
      if (hp.has_qk_norm) {
        for (int h = 0; h < hp.n_head; ++h) {
          auto y = Norm(q[t], L.q_norm.f32(), size_t(h) * hd, hd, hp.rms_eps);
          std::copy(y.begin(), y.end(), q[t].begin() + h * hd);
        }
        for (int h = 0; h < hp.n_head_kv; ++h) {
          auto y = Norm(k[t], L.k_norm.f32(), size_t(h) * hd, hd, hp.rms_eps);
          std::copy(y.begin(), y.end(), k[t].begin() + h * hd);
        }
      }
      Rope(q[t], hp.n_head, hp, factors, t);
      Rope(k[t], hp.n_head_kv, hp, factors, t);
      // KV caches hold F16 by design; round like they do so the comparison stays tight.
      for (int i = 0; i < kd; ++i) {
        k[t][i] = kernels::F16ToF32(kernels::F32ToF16(float(k[t][i])));
        v[t][i] = kernels::F16ToF32(kernels::F32ToF16(float(v[t][i])));
      }
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> attn(qd, 0.0);
      for (int h = 0; h < hp.n_head; ++h) {
        const int g = h / hp.n_rep();
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int d = 0; d < hd; ++d) s += q[t][h * hd + d] * k[j][g * hd + d];
          // YaRN scales q and k by its attention factor (1 for other models).
          sc[j] = s * hp.rope_attn_factor * hp.rope_attn_factor / std::sqrt(double(hd));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (double& s : sc) z += (s = std::exp(s - mx));
        for (int j = 0; j <= t; ++j)
          for (int d = 0; d < hd; ++d) attn[h * hd + d] += sc[j] / z * v[j][g * hd + d];
      }
      auto o = MatVec(wo, E, qd, attn);
      for (int i = 0; i < E; ++i) x[t][i] += o[i];
      auto xn = Norm(x[t], L.ffn_norm.f32(), 0, E, hp.rms_eps);
      auto gate = MatVec(wg, hp.n_ff, E, xn), up = MatVec(wu, hp.n_ff, E, xn);
      for (int i = 0; i < hp.n_ff; ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      auto dn = MatVec(wd, E, hp.n_ff, gate);
      for (int i = 0; i < E; ++i) x[t][i] += dn[i];
    }
  }
  const Mat out = Dequant(W.output);
  std::vector<std::vector<float>> logits(n);
  for (int t = 0; t < n; ++t) {
    auto xn = Norm(x[t], W.output_norm.f32(), 0, E, hp.rms_eps);
    auto l = MatVec(out, hp.n_vocab, E, xn);
    logits[t].assign(l.begin(), l.end());
  }
  return logits;
}

}  // namespace strata::testing
