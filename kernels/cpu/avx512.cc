// AVX-512 (F, BW, VL, DQ, VNNI, VBMI) kernel table.
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {

const KernelTable* Avx512Kernels() {
  static const KernelTable table = [] {
    KernelTable t = ScalarKernels();
    t.isa = Isa::kAvx512;
    t.variant = "avx512";
    return t;
  }();
  return &table;
}

}  // namespace strata::kernels::cpu
