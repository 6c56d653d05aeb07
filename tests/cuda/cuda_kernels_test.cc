// The CUDA kernels against the CPU kernels (the scalar reference and what dispatch picked):
// matmul, RMSNorm, RoPE, SwiGLU, the batched F16 stores and extent copies, and attention
// over spans, including masking, GQA, several sequences in one launch, and results that do
// not depend on which other tokens share the launch. Skipped, saying so, where this process
// sees no CUDA device (CI has none); built only with the CUDA toolkit.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "platforms/cuda_device.h"

namespace strata {
namespace {

namespace kc = kernels::cuda;
using Stream = CudaDevice::Stream;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDevice::Count() == 0) {
      GTEST_SKIP() << "no CUDA device visible: GPU kernels not run";
    }
    Status s = CudaDevice::Open(0, &d_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    stream_ = d_->stream(Stream::kCompute);
  }
  void TearDown() override {
    for (void* p : allocs_) d_->Free(p);
  }
  template <typename T>
  T* Up(const std::vector<T>& h) {
    void* p = nullptr;
    EXPECT_TRUE(d_->Malloc(std::max<size_t>(h.size(), 1) * sizeof(T), &p).ok());
    allocs_.push_back(p);
    if (!h.empty()) {
      EXPECT_TRUE(d_->CopyToDevice(p, h.data(), h.size() * sizeof(T)).ok());
    }
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Down(const T* dev, size_t n) {
    std::vector<T> h(n);
    EXPECT_TRUE(d_->Synchronize(Stream::kCompute).ok());
    EXPECT_TRUE(d_->CopyToHostAsync(h.data(), dev, n * sizeof(T), Stream::kCompute).ok());
    EXPECT_TRUE(d_->Synchronize(Stream::kCompute).ok());
    return h;
  }
  std::vector<float> Random(size_t n, float scale = 1.f) {
    std::normal_distribution<float> nd(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng_);
    return v;
  }
  std::vector<uint16_t> ToF16(const std::vector<float>& f) {
    std::vector<uint16_t> h(f.size());
    kernels::F32ToF16Row(f.data(), h.data(), int64_t(f.size()));
    return h;
  }
  std::vector<float> ToF32(const std::vector<uint16_t>& h) {
    std::vector<float> f(h.size());
    kernels::F16ToF32Row(h.data(), f.data(), int64_t(h.size()));
    return f;
  }

  // Random F16 K and V for each sequence's spans of the given sizes (rows of `row` values,
  // positions from 0 in order), on the host and on the device.
  void RaggedSpans(const std::vector<std::vector<int32_t>>& span_sizes, int32_t row,
                   std::vector<std::vector<uint16_t>>* store,
                   std::vector<std::vector<kernels::KvSpan>>* host,
                   std::vector<std::vector<kernels::KvSpan>>* dev) {
    host->assign(span_sizes.size(), {});
    dev->assign(span_sizes.size(), {});
    for (size_t s = 0; s < span_sizes.size(); ++s) {
      int32_t pos = 0;
      for (int32_t n : span_sizes[s]) {
        store->push_back(ToF16(Random(size_t(2 * n * row))));
        const auto& h = store->back();
        const uint16_t* dk = Up(h);
        (*host)[s].push_back({h.data(), h.data() + size_t(n) * row, n, pos, row});
        (*dev)[s].push_back({dk, dk + size_t(n) * row, n, pos, row});
        pos += n;
      }
    }
  }
  void CheckAttention(int32_t n_kv, int32_t n_rep, int32_t hd);
  void CheckTiledAttention(int32_t n_kv, int32_t n_rep, int32_t hd);

  std::shared_ptr<CudaDevice> d_;
  void* stream_ = nullptr;
  std::vector<void*> allocs_;
  std::mt19937 rng_{7};
};

TEST_F(CudaKernelsTest, MatmulMatchesDoubleReferenceAndIgnoresBatchSize) {
  const int64_t rows = 77, k = 200;  // ragged rows per block, k a multiple of 8 only
  const auto w16 = ToF16(Random(size_t(rows * k)));
  const auto w = ToF32(w16);
  for (int64_t n : {1, 5, 8, 19}) {
    const auto x = Random(size_t(n * k));
    const uint16_t* dw = Up(w16);
    const float* dx = Up(x);
    float* dy = Up(std::vector<float>(size_t(n * rows)));
    kc::MatmulF16(dw, rows, k, dx, n, dy, stream_);
    const auto y = Down(dy, size_t(n * rows));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0;
        for (int64_t j = 0; j < k; ++j) ref += double(w[size_t(r * k + j)]) * x[size_t(t * k + j)];
        ASSERT_NEAR(y[size_t(t * rows + r)], ref, 1e-4 * (1 + std::abs(ref))) << n << " " << t;
      }
    // Token 0 alone gives the same bits as token 0 among n.
    float* d1 = Up(std::vector<float>(size_t(rows)));
    kc::MatmulF16(dw, rows, k, dx, 1, d1, stream_);
    const auto y1 = Down(d1, size_t(rows));
    EXPECT_EQ(0, std::memcmp(y1.data(), y.data(), size_t(rows) * sizeof(float))) << n;
  }
}

TEST_F(CudaKernelsTest, MatmulPartsGiveEachPartsBitsInOneLaunch) {
  // Q, K, V-like parts of different heights (ragged blocks), and an empty one.
  const int64_t k = 96;
  const int64_t rows[] = {77, 13, 0, 24};
  for (int n_parts : {2, 3}) {
    const int64_t* r = n_parts == 2 ? rows + 2 : rows;
    for (int64_t n : {1, 5, 19}) {
      const auto x = Random(size_t(n * k));
      const float* dx = Up(x);
      kc::MatmulPart parts[kc::kMaxMatmulParts];
      for (int i = 0; i < n_parts; ++i) {
        const uint16_t* dw = Up(ToF16(Random(size_t(std::max<int64_t>(r[i], 1) * k))));
        parts[i] = {dw, r[i], Up(std::vector<float>(size_t(std::max<int64_t>(n * r[i], 1))))};
      }
      kc::MatmulF16Parts(parts, n_parts, k, dx, n, stream_);
      for (int i = 0; i < n_parts; ++i) {
        if (r[i] == 0) continue;
        float* alone = Up(std::vector<float>(size_t(n * r[i])));
        kc::MatmulF16(parts[i].w, r[i], k, dx, n, alone, stream_);
        const auto a = Down(alone, size_t(n * r[i]));
        const auto b = Down(parts[i].y, size_t(n * r[i]));
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << n_parts << " parts, part " << i << ", " << n << " tokens";
      }
    }
  }
}

TEST_F(CudaKernelsTest, FusedAddNormAndJointRopeGiveTheSeparateKernelsBits) {
  const int64_t n_tok = 5, n = 576;
  const auto x = Random(size_t(n_tok * n), 2.f), d = Random(size_t(n_tok * n)),
             w = Random(size_t(n));
  const float* dw = Up(w);
  // Add then RmsNormRows, against the fused kernel writing over d (as the forward pass does).
  float* x1 = Up(x);
  float* y1 = Up(std::vector<float>(x.size()));
  kc::Add(x1, Up(d), n_tok * n, stream_);
  kc::RmsNormRows(x1, dw, y1, n_tok, n, 1e-5f, stream_);
  float* x2 = Up(x);
  float* d2 = Up(d);
  kc::AddRmsNormRows(x2, d2, dw, d2, n_tok, n, 1e-5f, stream_);
  EXPECT_EQ(Down(x1, x.size()), Down(x2, x.size()));
  EXPECT_EQ(Down(y1, x.size()), Down(d2, x.size()));

  // RoPE of q (9 heads) and k (3 heads) apart and together.
  const int hd = 64, qh = 9, kh = 3;
  const std::vector<int32_t> pos = {0, 1, 17, 300, 8191};
  std::vector<float> inv(size_t(hd / 2));
  for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / hd));
  const int32_t* dp = Up(pos);
  const float* di = Up(inv);
  const auto q = Random(size_t(n_tok * qh * hd)), k = Random(size_t(n_tok * kh * hd));
  for (auto layout : {kernels::RopeLayout::kNormal, kernels::RopeLayout::kNeox}) {
    float *qa = Up(q), *ka = Up(k), *qb = Up(q), *kb = Up(k);
    kc::RopeRows(qa, n_tok, qh * hd, qh, hd, hd, dp, di, layout, stream_);
    kc::RopeRows(ka, n_tok, kh * hd, kh, hd, hd, dp, di, layout, stream_);
    kc::RopeQk(qb, qh * hd, qh, kb, kh * hd, kh, n_tok, hd, hd, dp, di, layout, stream_);
    EXPECT_EQ(Down(qa, q.size()), Down(qb, q.size()));
    EXPECT_EQ(Down(ka, k.size()), Down(kb, k.size()));
  }
}

TEST_F(CudaKernelsTest, NormRopeSwiGluAddMatchTheCpuKernels) {
  const int64_t n_tok = 3, heads = 4, hd = 64, n = heads * hd;
  auto x = Random(size_t(n_tok * n), 2.f);
  const auto w = Random(size_t(n));
  float* dx = Up(x);
  float* dy = Up(std::vector<float>(x.size()));
  kc::RmsNormRows(dx, Up(w), dy, n_tok, n, 1e-5f, stream_);
  auto y = Down(dy, x.size());
  for (int64_t t = 0; t < n_tok; ++t) {
    std::vector<float> ref(static_cast<size_t>(n));
    kernels::RmsNorm(x.data() + t * n, w.data(), ref.data(), n, 1e-5f);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[size_t(t * n + i)], ref[size_t(i)], 1e-4);
  }

  for (auto layout : {kernels::RopeLayout::kNormal, kernels::RopeLayout::kNeox}) {
    const std::vector<int32_t> pos = {0, 17, 4095};
    std::vector<float> inv(size_t(hd / 2));
    for (int64_t i = 0; i < hd / 2; ++i)
      inv[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(hd)));
    float* dr = Up(x);
    kc::RopeRows(dr, n_tok, n, int(heads), int(hd), int(hd), Up(pos), Up(inv), layout, stream_);
    const auto r = Down(dr, x.size());
    for (int64_t t = 0; t < n_tok; ++t) {
      std::vector<float> cs(static_cast<size_t>(hd));
      std::vector<float> ref(x.begin() + t * n, x.begin() + (t + 1) * n);
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double a = double(pos[size_t(t)]) * inv[size_t(i)];
        cs[size_t(2 * i)] = float(std::cos(a));
        cs[size_t(2 * i + 1)] = float(std::sin(a));
      }
      kernels::RopeApply(ref.data(), int(heads), int(hd), int(hd), cs.data(), layout);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(r[size_t(t * n + i)], ref[size_t(i)], 1e-4);
    }
  }

  const auto up = Random(x.size());
  float* dg = Up(x);
  kc::SwiGlu(dg, Up(up), int64_t(x.size()), stream_);
  const auto g = Down(dg, x.size());
  std::vector<float> ref(x.size());
  kernels::SwiGlu(x.data(), up.data(), ref.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(g[i], ref[i], 1e-5 * (1 + std::abs(ref[i])));

  float* da = Up(x);
  kc::Add(da, Up(up), int64_t(x.size()), stream_);
  const auto a = Down(da, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(a[i], x[i] + up[i]);
}

TEST_F(CudaKernelsTest, BatchedStoresAndExtentCopiesLandWhereTheySay) {
  const auto src = Random(10000);
  const float* ds = Up(src);
  uint16_t* dst = Up(std::vector<uint16_t>(20000, 0));
  std::vector<kc::StoreF16Op> ops = {
      {dst + 5, ds, 3}, {dst + 100, ds + 10, 9000}, {dst + 19990, ds + 9990, 10}};
  void* dops = nullptr;
  ASSERT_TRUE(d_->Upload(ops.data(), ops.size() * sizeof(ops[0]), Stream::kCompute, &dops).ok());
  kc::StoreF16(static_cast<const kc::StoreF16Op*>(dops), 3, 9000, stream_);
  const auto got = Down(dst, 20000);
  std::vector<uint16_t> want(20000, 0);
  for (const auto& op : ops)
    kernels::F32ToF16Row(src.data() + (op.src - ds), want.data() + (op.dst - dst), op.n);
  EXPECT_EQ(got, want);

  // Extents between pinned host memory (through its device alias) and device memory.
  void *host = nullptr, *alias = nullptr;
  ASSERT_TRUE(d_->HostAlloc(1 << 20, &host, &alias).ok());
  auto* hb = static_cast<uint8_t*>(host);
  for (int i = 0; i < (1 << 20); ++i) hb[i] = uint8_t(i * 7 + 3);
  uint8_t* dev = Up(std::vector<uint8_t>(1 << 20, 0));
  std::vector<kc::CopyOp> cops = {{dev, static_cast<uint8_t*>(alias) + 4096, 40960},
                                  {dev + 65536, static_cast<uint8_t*>(alias) + 512 * 1024, 16},
                                  {dev + 131072, alias, 300000 / 16 * 16}};
  ASSERT_TRUE(d_->CopyExtents(cops, Stream::kCompute).ok());
  const auto back = Down(dev, 1 << 20);
  EXPECT_EQ(0, std::memcmp(back.data(), hb + 4096, 40960));
  EXPECT_EQ(0, std::memcmp(back.data() + 65536, hb + 512 * 1024, 16));
  EXPECT_EQ(0, std::memcmp(back.data() + 131072, hb, 300000 / 16 * 16));
  EXPECT_EQ(back[40960], 0);  // nothing past an extent
  d_->HostFree(host);
}

// The CPU kernel's attention of each token (query heads of q, [token][q_dim]) over its
// sequence's spans: the reference the GPU kernels are held to.
std::vector<float> CpuAttention(const std::vector<float>& q,
                                const std::vector<std::vector<kernels::KvSpan>>& host_spans,
                                const std::vector<int32_t>& tok_seq,
                                const std::vector<int32_t>& tok_pos, int32_t n_kv, int32_t n_rep,
                                int32_t hd) {
  const int32_t q_dim = n_kv * n_rep * hd;
  std::vector<float> ref(q.size());
  std::vector<float> scratch(kernels::AttentionScratchFloats(1, n_rep, hd));
  for (size_t t = 0; t < tok_seq.size(); ++t) {
    const auto& spans = host_spans[size_t(tok_seq[t])];
    for (int32_t h = 0; h < n_kv; ++h) {
      kernels::AttentionArgs a{};
      a.q = q.data() + t * q_dim + size_t(h) * n_rep * hd;
      a.n_q = 1;
      a.q_stride = q_dim;
      a.q_pos0 = tok_pos[t];
      a.n_rep = n_rep;
      a.head_dim = hd;
      a.kv_head = h;
      a.spans = spans.data();
      a.n_spans = int32_t(spans.size());
      a.scale = 1.0f / std::sqrt(float(hd));
      a.out = ref.data() + t * q_dim + size_t(h) * n_rep * hd;
      a.out_stride = q_dim;
      a.scratch = scratch.data();
      kernels::AttentionOverSpans(a);
    }
  }
  return ref;
}

// Two sequences; sequence 0 has 3 query tokens (a causal prefill tail) over 427 keys (more
// than the 8 key splits x 32 take in one round), sequence 1 one query over 40; spans of
// ragged sizes, out of position order, the last holding keys after the queries (masked).
void CudaKernelsTest::CheckAttention(int32_t n_kv, int32_t n_rep, int32_t hd) {
  SCOPED_TRACE("KV heads " + std::to_string(n_kv) + ", GQA " + std::to_string(n_rep) +
               ", head dim " + std::to_string(hd));
  const int32_t row = n_kv * hd, q_dim = n_kv * n_rep * hd;
  const std::vector<std::vector<int32_t>> span_sizes = {{16, 16, 5, 40, 200, 150}, {7, 33}};
  std::vector<std::vector<uint16_t>> kv_store;
  std::vector<std::vector<kernels::KvSpan>> host_spans, dev_spans;
  RaggedSpans(span_sizes, row, &kv_store, &host_spans, &dev_spans);
  std::reverse(host_spans[0].begin(), host_spans[0].end());
  std::reverse(dev_spans[0].begin(), dev_spans[0].end());
  const std::vector<int32_t> tok_seq = {0, 0, 0, 1}, tok_pos = {420, 421, 422, 39};
  const auto q = Random(size_t(4 * q_dim));
  std::vector<kernels::KvSpan> all(dev_spans[0]);
  all.insert(all.end(), dev_spans[1].begin(), dev_spans[1].end());
  const std::vector<int32_t> begin = {0, int32_t(dev_spans[0].size()), int32_t(all.size())};
  float* dout = Up(std::vector<float>(q.size()));
  const float scale = 1.0f / std::sqrt(float(hd));
  kc::AttentionBatch ab{Up(q), dout,        4,           n_kv,      n_rep,  hd,
                        scale, Up(tok_seq), Up(tok_pos), Up(begin), Up(all)};
  kc::Attention(ab, stream_);
  ASSERT_TRUE(d_->CheckLaunch("attention").ok());
  const auto out = Down(dout, q.size());

  const std::vector<float> ref = CpuAttention(q, host_spans, tok_seq, tok_pos, n_kv, n_rep, hd);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-4) << i;

  // The tiled kernel on the same batch: one tile holding both sequences' tokens.
  {
    SCOPED_TRACE("tiled");
    float* dout_t = Up(std::vector<float>(q.size(), 777.f));
    kc::AttentionBatch tiled = ab;
    tiled.out = dout_t;
    ASSERT_TRUE(kc::AttentionTiled(tiled, stream_));
    ASSERT_TRUE(d_->CheckLaunch("tiled attention").ok());
    const auto out_t = Down(dout_t, q.size());
    for (size_t i = 0; i < out_t.size(); ++i) ASSERT_NEAR(out_t[i], ref[i], 2e-4) << i;
  }

  // Token 3 (sequence 1) alone in a launch: the same bits.
  const std::vector<int32_t> seq1 = {1}, pos1 = {39};
  SCOPED_TRACE("alone in a launch");
  float* dout1 = Up(std::vector<float>(size_t(q_dim)));
  kc::AttentionBatch one = ab;
  one.q = ab.q + 3 * q_dim;
  one.out = dout1;
  one.n_tok = 1;
  one.tok_seq = Up(seq1);
  one.tok_pos = Up(pos1);
  kc::Attention(one, stream_);
  const auto out1 = Down(dout1, size_t(q_dim));
  EXPECT_EQ(0, std::memcmp(out1.data(), out.data() + 3 * q_dim, size_t(q_dim) * sizeof(float)));

  // Chunked, as decode-sized batches run: sequence 0's 427 keys in two chunks of 256 agree
  // with the CPU; sequence 1's 40 keys fit one chunk and give the unchunked bits; the empty
  // chunks of the longest chunk count change nothing.
  for (int32_t n_chunks : {2, 5}) {
    SCOPED_TRACE("chunked in " + std::to_string(n_chunks));
    kc::AttentionBatch ch = ab;
    float* dout2 = Up(std::vector<float>(q.size(), 777.f));
    ch.out = dout2;
    ch.chunk_keys = kc::kAttentionChunkKeys;
    ch.n_chunks = n_chunks;
    ch.partial = Up(std::vector<float>(size_t(4 * n_kv * n_rep * n_chunks * (hd + 2))));
    kc::Attention(ch, stream_);
    ASSERT_TRUE(d_->CheckLaunch("chunked attention").ok());
    const auto out2 = Down(dout2, q.size());
    for (size_t i = 0; i < out2.size(); ++i) ASSERT_NEAR(out2[i], ref[i], 2e-4) << i;
    EXPECT_EQ(0, std::memcmp(out2.data() + 3 * q_dim, out.data() + 3 * q_dim,
                             size_t(q_dim) * sizeof(float)));
  }
}

TEST_F(CudaKernelsTest, AttentionOverSpansMatchesTheCpuKernel) {
  CheckAttention(3, 3, 64);   // SmolLM2's shape
  CheckAttention(2, 1, 32);   // no GQA, one dimension per lane
  CheckAttention(2, 4, 96);   // a head dimension the lanes do not divide evenly
  CheckAttention(1, 8, 128);  // two splits per query head
  CheckAttention(1, 16, 64);  // the most query heads per KV head, one split
}

// A prefill-sized batch: sequence 0's 150 query tokens (positions 250..399) after 250 cached
// keys, in ragged spans, then sequence 1's 37 tokens from position 0, so tiles straddle the
// two; the tiled kernel against the CPU's attention, and each row independent of its tile
// (a pass of sequence 1 alone gives its rows' bits).
void CudaKernelsTest::CheckTiledAttention(int32_t n_kv, int32_t n_rep, int32_t hd) {
  SCOPED_TRACE("tiled: KV heads " + std::to_string(n_kv) + ", GQA " + std::to_string(n_rep) +
               ", head dim " + std::to_string(hd));
  const int32_t row = n_kv * hd, q_dim = n_kv * n_rep * hd;
  const std::vector<std::vector<int32_t>> span_sizes = {{64, 3, 183, 100, 50}, {37}};
  std::vector<std::vector<uint16_t>> kv_store;
  std::vector<std::vector<kernels::KvSpan>> host_spans, dev_spans;
  RaggedSpans(span_sizes, row, &kv_store, &host_spans, &dev_spans);
  std::vector<int32_t> tok_seq, tok_pos;
  for (int32_t p = 250; p < 400; ++p) tok_seq.push_back(0), tok_pos.push_back(p);
  for (int32_t p = 0; p < 37; ++p) tok_seq.push_back(1), tok_pos.push_back(p);
  const int32_t n_tok = int32_t(tok_seq.size());
  const auto q = Random(size_t(n_tok) * q_dim);
  std::vector<kernels::KvSpan> all(dev_spans[0]);
  all.insert(all.end(), dev_spans[1].begin(), dev_spans[1].end());
  const std::vector<int32_t> begin = {0, int32_t(dev_spans[0].size()), int32_t(all.size())};
  float* dout = Up(std::vector<float>(q.size(), 777.f));
  const float scale = 1.0f / std::sqrt(float(hd));
  kc::AttentionBatch ab{Up(q), dout,        n_tok,       n_kv,      n_rep,  hd,
                        scale, Up(tok_seq), Up(tok_pos), Up(begin), Up(all)};
  ASSERT_TRUE(kc::AttentionTiled(ab, stream_));
  ASSERT_TRUE(d_->CheckLaunch("tiled attention").ok());
  const auto out = Down(dout, q.size());
  const std::vector<float> ref = CpuAttention(q, host_spans, tok_seq, tok_pos, n_kv, n_rep, hd);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-4) << i;

  const std::vector<int32_t> seq1(37, 1), pos1(tok_pos.end() - 37, tok_pos.end());
  float* dout1 = Up(std::vector<float>(size_t(37) * q_dim));
  kc::AttentionBatch one = ab;
  one.q = ab.q + size_t(150) * q_dim;
  one.out = dout1;
  one.n_tok = 37;
  one.tok_seq = Up(seq1);
  one.tok_pos = Up(pos1);
  ASSERT_TRUE(kc::AttentionTiled(one, stream_));
  const auto out1 = Down(dout1, size_t(37) * q_dim);
  EXPECT_EQ(
      0, std::memcmp(out1.data(), out.data() + size_t(150) * q_dim, out1.size() * sizeof(float)));
}

TEST_F(CudaKernelsTest, TiledPrefillAttentionMatchesTheCpuKernel) {
  CheckTiledAttention(3, 3, 64);   // SmolLM2's shape
  CheckTiledAttention(8, 4, 128);  // Llama-3.1-8B's
  CheckTiledAttention(2, 6, 128);  // Qwen2.5-1.5B's GQA
  CheckTiledAttention(2, 1, 32);   // no GQA, one dimension per lane
  CheckTiledAttention(2, 4, 96);   // a head dimension the lanes do not divide evenly
  CheckTiledAttention(1, 16, 64);  // the most query heads per KV head
  // Beyond the kernel's shapes: nothing launched, the caller falls back.
  kc::AttentionBatch wide{};
  wide.head_dim = 256;
  wide.n_rep = 1;
  wide.n_tok = 1;
  EXPECT_FALSE(kc::AttentionTiled(wide, stream_));
}

// ---- Quantized weights ------------------------------------------------------------------

// Rows of type t with Gaussian values (kernels::QuantizeRow).
std::vector<uint8_t> QuantRows(kernels::DType t, int64_t rows, int64_t k, std::mt19937* rng) {
  std::normal_distribution<float> nd(0.f, 0.05f);
  const size_t rb = kernels::RowBytes(t, k);
  std::vector<uint8_t> w(rb * size_t(rows));
  std::vector<float> v(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& f : v) f = nd(*rng);
    EXPECT_TRUE(kernels::QuantizeRow(t, v.data(), w.data() + rb * size_t(r), k));
  }
  return w;
}

// What the GPU's GEMV computes for one output, on the host: lane i sums units i, i + 32, ...
// with the block math of quant_blocks.h, then the warp's butterfly reduction.
template <class B>
float HostGemvOutput(const uint8_t* row, int64_t k, const int8_t* xq, const kc::q::ActScale* xs) {
  float lane[32] = {};
  for (int l = 0; l < 32; ++l)
    for (int64_t u = l; u < k / B::kUnit; u += 32)
      B::template Dot<1>(row, u, xq, xs, k, 1, &lane[l]);
  for (int off = 16; off > 0; off >>= 1) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
    std::memcpy(lane, next, sizeof(lane));
  }
  return lane[0];
}

template <class B>
void CheckQuantMatmul(CudaKernelsTest* self, kernels::DType t, int64_t k, std::mt19937* rng,
                      std::shared_ptr<CudaDevice> d, void* stream,
                      const std::function<void*(size_t)>& alloc) {
  const int64_t rows = 37;  // ragged against the kernel's rows per block
  const std::vector<uint8_t> w = QuantRows(t, rows, k, rng);
  const size_t rb = kernels::RowBytes(t, k);
  auto* dw = static_cast<uint8_t*>(alloc(w.size()));
  ASSERT_TRUE(d->CopyToDevice(dw, w.data(), w.size()).ok());
  const int64_t n_max = 40;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n_max * k));
  for (float& f : x) f = nd(*rng);
  auto* dx = static_cast<float*>(alloc(x.size() * 4));
  ASSERT_TRUE(d->CopyToDevice(dx, x.data(), x.size() * 4).ok());
  auto* dq = static_cast<int8_t*>(alloc(size_t(n_max * k)));
  auto* ds = static_cast<kc::q::ActScale*>(alloc(size_t(n_max * k / 32) * sizeof(kc::q::ActScale)));
  kc::QuantizeActivations(dx, n_max, k, {dq, ds}, stream);
  // The GPU's quantized activations are the host quantizer's, bit for bit.
  std::vector<int8_t> xq(size_t(n_max * k)), hq(size_t(n_max * k));
  std::vector<kc::q::ActScale> xs(size_t(n_max * k / 32)), hs(xs.size());
  ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
  ASSERT_TRUE(d->CopyToHostAsync(xq.data(), dq, xq.size(), CudaDevice::Stream::kCompute).ok());
  ASSERT_TRUE(d->CopyToHostAsync(xs.data(), ds, xs.size() * sizeof(kc::q::ActScale),
                                 CudaDevice::Stream::kCompute)
                  .ok());
  ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
  for (int64_t b = 0; b < n_max * k / 32; ++b)
    kc::q::QuantizeActBlock(x.data() + b * 32, hq.data() + b * 32, &hs[size_t(b)]);
  ASSERT_EQ(xq, hq) << kernels::TypeName(t);
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(xs[i].d, hs[i].d) << i;
    ASSERT_EQ(xs[i].s, hs[i].s) << i;
  }
  std::vector<float> alone;  // token 0..n-1 each computed alone
  int64_t exact = 0, total = 0;
  for (int64_t n : {1, 2, 3, 5, 8, 13, 40}) {
    auto* dy = static_cast<float*>(alloc(size_t(n * rows) * 4));
    const kc::QMatmulPart part{dw, rows, dy};
    kc::QMatmulParts(t, &part, 1, k, dq, ds, n, stream);
    std::vector<float> y(size_t(n * rows));
    ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
    ASSERT_TRUE(d->CopyToHostAsync(y.data(), dy, y.size() * 4, CudaDevice::Stream::kCompute).ok());
    ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
    for (int64_t tok = 0; tok < n; ++tok)
      for (int64_t r = 0; r < rows; ++r) {
        const float ref = HostGemvOutput<B>(w.data() + rb * size_t(r), k, xq.data() + tok * k,
                                            xs.data() + tok * (k / 32));
        const float got = y[size_t(tok * rows + r)];
        ASSERT_NEAR(got, ref, 1e-5f * (1.f + std::fabs(ref)))
            << kernels::TypeName(t) << " n " << n << " token " << tok << " row " << r;
        exact += got == ref;
        ++total;
      }
    // Each token's outputs are the same bits whatever the batch around it.
    if (n == 1) {
      alone.resize(size_t(n_max * rows));
    }
    for (int64_t tok = 0; tok < n; ++tok) {
      const kc::QMatmulPart one{dw, rows, dy};
      kc::QMatmulParts(t, &one, 1, k, dq + tok * k, ds + tok * (k / 32), 1, stream);
      std::vector<float> y1(static_cast<size_t>(rows));
      ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
      ASSERT_TRUE(
          d->CopyToHostAsync(y1.data(), dy, y1.size() * 4, CudaDevice::Stream::kCompute).ok());
      ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + tok * rows, size_t(rows) * 4))
          << kernels::TypeName(t) << " token " << tok << " of " << n;
    }
  }
  std::printf("%s k=%lld: %lld of %lld GEMV outputs bit-identical to the host emulation\n",
              kernels::TypeName(t), (long long)k, (long long)exact, (long long)total);
  // Dequantization to F16 (the cuBLAS path) against the host decoder, rows [3, rows).
  auto* dh = static_cast<uint16_t*>(alloc(size_t((rows - 3) * k) * 2));
  kc::DequantizeF16(t, dw, 3, rows, k, dh, stream);
  std::vector<uint16_t> h(size_t((rows - 3) * k));
  ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
  ASSERT_TRUE(d->CopyToHostAsync(h.data(), dh, h.size() * 2, CudaDevice::Stream::kCompute).ok());
  ASSERT_TRUE(d->Synchronize(CudaDevice::Stream::kCompute).ok());
  std::vector<float> ref(static_cast<size_t>(k));
  for (int64_t r = 3; r < rows; ++r) {
    kernels::DequantizeRow(t, w.data() + rb * size_t(r), ref.data(), k);
    for (int64_t i = 0; i < k; ++i) {
      const float got = kernels::F16ToF32(h[size_t((r - 3) * k + i)]);
      ASSERT_NEAR(got, ref[size_t(i)], std::fabs(ref[size_t(i)]) * 1e-3f + 1e-7f)
          << kernels::TypeName(t) << " row " << r << " value " << i;
    }
  }
  (void)self;
}

TEST_F(CudaKernelsTest, QuantizedMatmulsFollowTheBlockMathAndIgnoreTheBatch) {
  auto alloc = [this](size_t bytes) -> void* {
    void* p = nullptr;
    EXPECT_TRUE(d_->Malloc(bytes, &p).ok());
    allocs_.push_back(p);
    return p;
  };
  using namespace kernels;
  for (int64_t k : {int64_t(576), int64_t(4096), int64_t(14336)}) {
    CheckQuantMatmul<kc::q::Q4_0>(this, DType::kQ4_0, k, &rng_, d_, stream_, alloc);
    CheckQuantMatmul<kc::q::Q4_1>(this, DType::kQ4_1, k, &rng_, d_, stream_, alloc);
    CheckQuantMatmul<kc::q::Q8_0>(this, DType::kQ8_0, k, &rng_, d_, stream_, alloc);
  }
  for (int64_t k : {int64_t(256), int64_t(14336)}) {
    CheckQuantMatmul<kc::q::Q4_K>(this, DType::kQ4_K, k, &rng_, d_, stream_, alloc);
    CheckQuantMatmul<kc::q::Q6_K>(this, DType::kQ6_K, k, &rng_, d_, stream_, alloc);
  }
}

// The GEMV's grid is what the GPU holds at once, each warp walking groups of 1, 2 or 4 rows a
// grid apart across the parts' boundaries: with more rows than that (three parts, one empty,
// odd row counts so groups straddle parts and the last one is short, whole and partial token
// chunks), every output is still its own row's dot product (the host emulation's, within its
// rounding), and the same bits whatever the rows a warp takes.
TEST_F(CudaKernelsTest, QuantizedMatmulRowsBeyondOneWaveAndAcrossPartsAreTheirOwn) {
  using kernels::DType;
  const int64_t k = 256, max_tok = 11;
  const int64_t rows[3] = {9001, 0, 7003};
  std::vector<std::vector<uint8_t>> w(3);
  for (int i = 0; i < 3; ++i)
    w[size_t(i)] = QuantRows(DType::kQ4_0, std::max<int64_t>(rows[i], 1), k, &rng_);
  const auto x = Random(size_t(max_tok * k));
  std::vector<int8_t> xq(x.size());
  std::vector<kc::q::ActScale> xs(x.size() / 32);
  for (size_t b = 0; b < xs.size(); ++b)
    kc::q::QuantizeActBlock(x.data() + b * 32, xq.data() + b * 32, &xs[b]);
  const size_t rb = kernels::RowBytes(DType::kQ4_0, k);
  const int restore = kc::SetGemvRowsPerWarp(1);
  for (int64_t n_tok : {1, 2, 3, 11}) {
    std::vector<float> first[3];
    for (int per_warp : {1, 2, 4}) {
      kc::SetGemvRowsPerWarp(per_warp);
      kc::QMatmulPart parts[3];
      for (int i = 0; i < 3; ++i)
        parts[i] = {Up(w[size_t(i)]), rows[i], Up(std::vector<float>(size_t(n_tok * rows[i]) + 1))};
      kc::QMatmulParts(DType::kQ4_0, parts, 3, k, Up(xq), Up(xs), n_tok, stream_);
      int64_t bad = 0, differ = 0;
      for (int i = 0; i < 3; ++i) {
        const auto y = Down(parts[i].y, size_t(n_tok * rows[i]));
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t r = 0; r < rows[i]; ++r) {
            const float ref =
                HostGemvOutput<kc::q::Q4_0>(w[size_t(i)].data() + rb * size_t(r), k,
                                            xq.data() + t * k, xs.data() + t * (k / 32));
            bad += std::fabs(y[size_t(t * rows[i] + r)] - ref) > 1e-5f * (1.f + std::fabs(ref));
          }
        if (per_warp == 1)
          first[i] = y;
        else
          differ += std::memcmp(first[i].data(), y.data(), y.size() * sizeof(float)) != 0;
      }
      EXPECT_EQ(bad, 0) << "outputs other than their row's own dot product, " << per_warp
                        << " rows a warp, " << n_tok << " tokens";
      EXPECT_EQ(differ, 0) << "parts whose outputs change with " << per_warp << " rows a warp, "
                           << n_tok << " tokens";
    }
  }
  kc::SetGemvRowsPerWarp(restore);
}

TEST_F(CudaKernelsTest, NormAndSwiGluQuantizeTheirOutputLikeTheHost) {
  const int64_t rows = 3, n = 1024;
  const auto x = Random(size_t(rows * n));
  const auto wn = Random(size_t(n));
  float* dx = Up(x);
  const float* dw = Up(wn);
  float* dy = Up(std::vector<float>(size_t(rows * n)));
  int8_t* dq = Up(std::vector<int8_t>(size_t(rows * n)));
  auto* ds = Up(std::vector<kc::q::ActScale>(size_t(rows * n / 32)));
  // The quantized blocks of the float output y, as the host quantizer makes them.
  auto check = [&](const char* what) {
    const auto y = Down(dy, size_t(rows * n));
    const auto q = Down(dq, size_t(rows * n));
    const auto s = Down(ds, size_t(rows * n / 32));
    int64_t bad = 0;
    for (int64_t b = 0; b < rows * n / 32; ++b) {
      int8_t hq[32];
      kc::q::ActScale hs;
      kc::q::QuantizeActBlock(y.data() + b * 32, hq, &hs);
      bad += std::memcmp(hq, q.data() + b * 32, 32) != 0 || hs.d != s[size_t(b)].d ||
             hs.s != s[size_t(b)].s;
    }
    EXPECT_EQ(bad, 0) << what << ": blocks quantized otherwise than by the host";
    return y;
  };
  // The quantized output does not change the float one.
  kc::RmsNormRows(dx, dw, dy, rows, n, 1e-5f, stream_);
  const auto plain = Down(dy, size_t(rows * n));
  kc::RmsNormRows(dx, dw, dy, rows, n, 1e-5f, stream_, {dq, ds});
  EXPECT_EQ(check("norm"), plain);
  float* dg = Up(x);
  const float* du = Up(Random(size_t(rows * n)));
  kc::SwiGlu(dg, du, rows * n, stream_);
  const auto plain_g = Down(dg, size_t(rows * n));
  float* dg2 = Up(x);
  kc::SwiGlu(dg2, du, rows * n, stream_, {dq, ds});
  ASSERT_TRUE(d_->CopyOnDeviceAsync(dy, dg2, size_t(rows * n) * 4, Stream::kCompute).ok());
  EXPECT_EQ(check("swiglu"), plain_g);
}

TEST_F(CudaKernelsTest, CublasGemmWritesItsRowsOfTheOutputOnly) {
  void* blas = nullptr;
  ASSERT_TRUE(d_->Blas(&blas).ok());
  const int64_t rows = 96, k = 512, n = 40;
  const auto w16 = ToF16(Random(size_t(rows * k)));
  const auto x16 = ToF16(Random(size_t(n * k)));
  const auto w = ToF32(w16), x = ToF32(x16);
  const uint16_t* dw = Up(w16);
  const uint16_t* dx = Up(x16);
  std::vector<float> poison(size_t(n * rows), 12345.f);
  float* dy = Up(poison);
  // Rows [32, 96) only, as a chunk of a larger matrix.
  ASSERT_TRUE(kc::GemmF16(blas, dw + 32 * k, rows - 32, k, dx, n, dy + 32, rows));
  const auto y = Down(dy, size_t(n * rows));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      if (r < 32) {
        ASSERT_EQ(y[size_t(t * rows + r)], 12345.f) << t << " " << r;
        continue;
      }
      double ref = 0, mag = 0;
      for (int64_t j = 0; j < k; ++j) {
        ref += double(w[size_t(r * k + j)]) * x[size_t(t * k + j)];
        mag += std::fabs(double(w[size_t(r * k + j)]) * x[size_t(t * k + j)]);
      }
      ASSERT_NEAR(y[size_t(t * rows + r)], ref, 1e-5 * mag + 1e-6) << t << " " << r;
    }
}

TEST_F(CudaKernelsTest, Q8RowExpansionAndTheTailEstimateMatchTheHost) {
  const int64_t rows = 7, n = 64;
  const auto f = Random(size_t(rows * n));
  std::vector<uint8_t> q(size_t(rows * kernels::Q8_0RowBytes(n)));
  for (int64_t r = 0; r < rows; ++r)
    ASSERT_TRUE(kernels::QuantizeRow(kernels::DType::kQ8_0, f.data() + r * n,
                                     q.data() + r * kernels::Q8_0RowBytes(n), n));
  const uint8_t* dq = Up(q);
  uint16_t* dh = Up(std::vector<uint16_t>(size_t(rows * n)));
  kc::ExpandQ8_0Rows(dq, rows, n, dh, stream_);
  const auto h = Down(dh, size_t(rows * n));
  std::vector<float> row(static_cast<size_t>(n));
  std::vector<uint16_t> want(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    kernels::DequantizeRow(kernels::DType::kQ8_0, q.data() + r * kernels::Q8_0RowBytes(n),
                           row.data(), n);
    kernels::F32ToF16Row(row.data(), want.data(), n);
    ASSERT_EQ(0, std::memcmp(want.data(), h.data() + r * n, size_t(n) * 2)) << r;
  }
  // Tail: 4 query heads over 2 KV heads of 32 dims; head 1's ratio 0 leaves it alone.
  const int hd = 32, n_head = 4, n_rep = 2;
  const auto o = Random(size_t(n_head * hd));
  const std::vector<float> ratio = {0.5f, 0.0f, 2.0f, 0.25f};
  const auto mean = Random(size_t(2 * hd));
  float* d_o = Up(o);
  kc::AttendTail(d_o, Up(ratio), Up(mean), n_head, n_rep, hd, stream_);
  const auto got = Down(d_o, o.size());
  for (int h2 = 0; h2 < n_head; ++h2)
    for (int i = 0; i < hd; ++i) {
      const float r = ratio[size_t(h2)];
      const float want_v = r == 0.0f
                               ? o[size_t(h2 * hd + i)]
                               : (o[size_t(h2 * hd + i)] + r * mean[size_t(h2 / n_rep * hd + i)]) *
                                     (1.0f / (1.0f + r));
      ASSERT_EQ(got[size_t(h2 * hd + i)], want_v) << h2 << " " << i;
    }
}

TEST_F(CudaKernelsTest, DeviceMemoryHonoursAlignmentsAboveCudaMallocs) {
  // Odd-sized allocations first, so cudaMalloc's next addresses are only 256-aligned.
  for (size_t n : {size_t(4000), size_t(1000), size_t(300)}) {
    void* p = nullptr;
    ASSERT_TRUE(d_->Malloc(n, &p).ok());
    allocs_.push_back(p);
  }
  for (int i = 0; i < 8; ++i) {
    TierArena a;
    ASSERT_TRUE(d_->memory()->Allocate(size_t(1000 + 700 * i), 4096, &a).ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 4096, 0u) << i;
  }
}

}  // namespace
}  // namespace strata
