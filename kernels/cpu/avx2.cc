// AVX2 + FMA + F16C kernel table (x86-64 CPUs from 2013 on).
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {

const KernelTable* Avx2Kernels() {
  static const KernelTable table = [] {
    KernelTable t = ScalarKernels();
    t.isa = Isa::kAvx2;
    t.variant = "avx2";
    return t;
  }();
  return &table;
}

}  // namespace strata::kernels::cpu
