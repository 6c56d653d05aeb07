// AVX-512 (F, BW, VL, DQ, VNNI, VBMI) kernel table: matmul per weight format (the
// avx512_matmul_*.cc files), attention (avx512_attention.cc), element-wise ops here.
#include "kernels/cpu/avx512_internal.h"
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {
namespace {

void Matmul(const MatmulArgs& a, int64_t rb, int64_t re) {
  switch (a.wtype) {
    case DType::kQ4_0:
      return Avx512MatmulQ4_0(a, rb, re);
    case DType::kQ4_1:
      return Avx512MatmulQ4_1(a, rb, re);
    case DType::kQ8_0:
      return Avx512MatmulQ8_0(a, rb, re);
    case DType::kQ4_K:
      return Avx512MatmulQ4_K(a, rb, re);
    case DType::kQ6_K:
      return Avx512MatmulQ6_K(a, rb, re);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return Avx512MatmulFloat(a, rb, re);
    default:
      return ScalarKernels().matmul(a, rb, re);
  }
}

}  // namespace

const KernelTable* Avx512Kernels() {
  static const KernelTable table = [] {
    KernelTable t = ScalarKernels();
    t.isa = Isa::kAvx512;
    t.variant = "avx512";
    t.matmul = Matmul;
    t.matvec_f16 = Avx512MatVecF16;
    return t;
  }();
  return &table;
}

}  // namespace strata::kernels::cpu
