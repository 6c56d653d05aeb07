// NEON matmul with the Armv8.2 dot-product extension (SDOT: 16 int8 products into four
// int32 lanes per instruction). This file alone is compiled with +dotprod and is only
// called after the HWCAP check in dispatch.cc.
#include <arm_neon.h>

#include "kernels/cpu/arm/neon_internal.h"
#include "kernels/cpu/arm/neon_matmul_impl.h"

namespace strata::kernels::cpu {
namespace {

struct SdotDot {
  static STRATA_INLINE int32x4_t Dot(int32x4_t acc, int8x16_t a, int8x16_t b) {
    return vdotq_s32(acc, a, b);
  }
};

}  // namespace

void NeonMatmulQuantizedDotprod(const MatmulArgs& a, int64_t rb, int64_t re) {
  MatmulQuantizedNeon<SdotDot>(a, rb, re);
}

}  // namespace strata::kernels::cpu
