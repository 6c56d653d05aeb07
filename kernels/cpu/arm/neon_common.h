// Vector helpers for the NEON kernel files (internal; aarch64 only).
#pragma once

#include <arm_neon.h>

namespace strata::kernels::cpu {
namespace {

// e^x for 4 floats: the range reduction and polynomial of the x86 versions, 2^n built in
// the exponent field; x below -87 (and -inf) gives exactly 0.
inline float32x4_t Exp4(float32x4_t x) {
  const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(-87.f));
  x = vmaxq_f32(x, vdupq_n_f32(-87.f));
  x = vminq_f32(x, vdupq_n_f32(88.f));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_n_f32(x, n, 0.693359375f);
  r = vfmsq_n_f32(r, n, -2.12194440e-4f);
  float32x4_t p = vdupq_n_f32(1.f / 720);
  p = vfmaq_f32(vdupq_n_f32(1.f / 120), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 24), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 6), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t v = vmulq_f32(p, vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), tiny));
}

inline float32x4_t LoadF16x4(const uint16_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

}  // namespace
}  // namespace strata::kernels::cpu
