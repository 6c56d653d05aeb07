// Shared helpers for the kernel tests: deterministic random data, the list of ISAs this
// machine runs, and a scoped ISA switch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/kernel_table.h"
#include "kernels/kernels.h"

namespace strata::kernels::testing {

// STRATA_KERNEL_TESTS_QUICK=1 shrinks the sweeps (used under qemu, which is ~50x slower).
inline bool QuickMode() {
  const char* v = std::getenv("STRATA_KERNEL_TESTS_QUICK");
  return v != nullptr && *v != '\0' && *v != '0';
}

using Variant = const cpu::KernelTable*;

// Every kernel table this machine runs (scalar, AVX2, AVX-512, NEON with and without SDOT).
inline std::vector<Variant> AllVariants() { return cpu::RunnableTables(); }

// The SIMD tables only (what gets compared against the scalar reference).
inline std::vector<Variant> SimdVariants() {
  std::vector<Variant> out;
  for (Variant v : AllVariants()) {
    if (v->isa != Isa::kScalar) out.push_back(v);
  }
  return out;
}

// Makes a table active for the scope of a test.
class ScopedVariant {
 public:
  explicit ScopedVariant(Variant v) : saved_(cpu::ActiveTable()) { cpu::SetActiveTable(v); }
  ~ScopedVariant() { cpu::SetActiveTable(saved_); }

 private:
  Variant saved_;
};

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

inline std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  std::string name = info.param->variant;
  for (char& c : name) {
    if (c == '+') c = '_';
  }
  return name;
}

}  // namespace strata::kernels::testing
