// Shared helpers for the kernel tests: deterministic random data, the list of ISAs this
// machine runs, and a scoped ISA switch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/kernels.h"

namespace strata::kernels::testing {

// STRATA_KERNEL_TESTS_QUICK=1 shrinks the sweeps (used under qemu, which is ~50x slower).
inline bool QuickMode() {
  const char* v = std::getenv("STRATA_KERNEL_TESTS_QUICK");
  return v != nullptr && *v != '\0' && *v != '0';
}

inline std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kNeon}) {
    if (IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

// The SIMD ISAs only (what gets compared against the scalar reference).
inline std::vector<Isa> SimdIsas() {
  std::vector<Isa> out;
  for (Isa isa : SupportedIsas()) {
    if (isa != Isa::kScalar) out.push_back(isa);
  }
  return out;
}

class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : saved_(ActiveIsa()) { ok_ = ForceIsa(isa); }
  ~ScopedIsa() { ForceIsa(saved_); }
  bool ok() const { return ok_; }

 private:
  Isa saved_;
  bool ok_;
};

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

inline std::vector<float> GaussianFloats(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

inline std::vector<uint16_t> ToF16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToF16(v[i]);
  return out;
}

inline std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return IsaName(info.param);
}

}  // namespace strata::kernels::testing
