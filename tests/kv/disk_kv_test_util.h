// Helpers for the disk KV tests: a synthetic model on disk, adapters for it made without
// calibration (orthonormal columns of the identity), a temporary KV directory, and engines
// with the memory or the disk policy over the same model.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/kv/disk/adapters.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic_model.h"

namespace strata::testing {

// mkdtemp under the test temp dir; removed with its contents on destruction.
class KvTempDir {
 public:
  KvTempDir();
  ~KvTempDir();
  KvTempDir(const KvTempDir&) = delete;
  KvTempDir& operator=(const KvTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A loaded synthetic model written under dir (name chooses the file).
Status LoadSyntheticModel(const SyntheticModelSpec& spec, const std::string& dir,
                          const std::string& name, std::unique_ptr<Model>* out);

// Adapters for `model` at the given ratios whose matrices are the first rank columns of a
// permuted identity (orthonormal, deterministic), written to path.
Status WriteIdentityAdapters(const Model& model, const std::vector<int32_t>& ratios,
                             const std::string& path);

// Engine options for the disk policy over dir with the given adapters; everything else at
// its defaults (tests override fields).
EngineOptions DiskEngineOptions(const std::string& dir, const std::string& adapters, int32_t n_ctx);

// Tokens 0..n-1 of a fixed pseudo-random sequence inside the model's vocabulary.
std::vector<int32_t> TestTokens(int32_t n, int32_t n_vocab, uint32_t seed);

// Prefills prompt (in passes of the engine's batch), then feeds `decode` one token per
// pass; returns the logits of the prompt's last token and of every decode pass.
Status RunTeacherForced(Engine& engine, SeqId seq, const std::vector<int32_t>& prompt,
                        const std::vector<int32_t>& decode, std::vector<std::vector<float>>* out);

// max |a - b| over all rows, relative to the largest |b|.
double MaxRelativeDiff(const std::vector<std::vector<float>>& a,
                       const std::vector<std::vector<float>>& b);

}  // namespace strata::testing
