#include "tests/kv/disk_kv_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include <gtest/gtest.h>

namespace strata::testing {

KvTempDir::KvTempDir() {
  std::string tmpl = ::testing::TempDir() + "strata_kv_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  path_ = tmpl;
}

KvTempDir::~KvTempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Status LoadSyntheticModel(const SyntheticModelSpec& spec, const std::string& dir,
                          const std::string& name, std::unique_ptr<Model>* out) {
  const std::string path = dir + "/" + name + ".gguf";
  STRATA_RETURN_IF_ERROR(WriteSyntheticModel(spec, path));
  return Model::Load(path, out);
}

Status WriteIdentityAdapters(const Model& model, const std::vector<int32_t>& ratios,
                             const std::string& path) {
  const HParams& hp = model.hparams();
  Adapters a;
  a.model_identity = model.identity();
  a.n_layer = hp.n_layer;
  a.n_head_kv = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.calibration_tokens = 0;
  a.note = "test: identity columns";
  const int32_t row = a.row();
  for (int32_t ratio : ratios) {
    AdapterSet set;
    set.ratio = ratio;
    STRATA_RETURN_IF_ERROR(RankForRatio(row, ratio, &set.rank));
    for (int32_t l = 0; l < hp.n_layer; ++l) {
      std::vector<float> m(size_t(row) * set.rank, 0.0f);
      // Column j keeps key dimension (j * 7 + l) mod row: spread over heads and layers.
      std::vector<int32_t> used;
      for (int32_t j = 0; j < set.rank; ++j) {
        int32_t i = (j * 7 + l) % row;
        while (std::find(used.begin(), used.end(), i) != used.end()) i = (i + 1) % row;
        used.push_back(i);
        m[size_t(i) * set.rank + j] = 1.0f;
      }
      set.layers.push_back(std::move(m));
    }
    a.sets.push_back(std::move(set));
  }
  return a.Write(path);
}

EngineOptions DiskEngineOptions(const std::string& dir, const std::string& adapters,
                                int32_t n_ctx) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = n_ctx;
  o.n_batch = 32;
  o.kv.policy = KvPolicyKind::kDisk;
  o.kv.disk.dir = dir;
  o.kv.disk.adapters = adapters;
  o.kv.disk.ratio = 4;
  // Per-token summary rows unless a test asks for per-group ones (auto would take them
  // wherever a test sets few slots).
  o.kv.disk.group_summary = AutoSwitch::kOff;
  o.kv.disk.budget_bytes = int64_t(1) << 30;
  return o;
}

std::vector<int32_t> TestTokens(int32_t n, int32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(n_vocab));
  return t;
}

Status RunTeacherForced(Engine& engine, SeqId seq, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& decode, std::vector<std::vector<float>>* out) {
  out->clear();
  std::vector<float> logits;
  STRATA_RETURN_IF_ERROR(engine.Prefill(seq, prompt, &logits));
  out->push_back(logits);
  ForwardBatch b;
  for (int32_t tok : decode) {
    b.Clear();
    b.Add(seq, engine.kv().Length(seq), std::span<const int32_t>(&tok, 1));
    STRATA_RETURN_IF_ERROR(engine.Evaluate(b, &logits));
    out->push_back(logits);
  }
  return Status::OK();
}

double MaxRelativeDiff(const std::vector<std::vector<float>>& a,
                       const std::vector<std::vector<float>>& b) {
  double max_diff = 0, max_ref = 0;
  for (size_t r = 0; r < std::min(a.size(), b.size()); ++r)
    for (size_t i = 0; i < std::min(a[r].size(), b[r].size()); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(a[r][i] - b[r][i])));
      max_ref = std::max(max_ref, double(std::fabs(b[r][i])));
    }
  return a.size() == b.size() ? max_diff / std::max(max_ref, 1e-30) : 1e30;
}

}  // namespace strata::testing
