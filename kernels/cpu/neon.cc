// NEON kernel table (every Armv8-A CPU), with SDOT matmul when the CPU has dotprod.
#include "kernels/cpu/kernel_table.h"

namespace strata::kernels::cpu {

const KernelTable* NeonKernels(bool dotprod) {
  static const KernelTable plain = [] {
    KernelTable t = ScalarKernels();
    t.isa = Isa::kNeon;
    t.variant = "neon";
    return t;
  }();
  static const KernelTable with_dot = [] {
    KernelTable t = plain;
    t.variant = "neon+dotprod";
    return t;
  }();
  return dotprod ? &with_dot : &plain;
}

}  // namespace strata::kernels::cpu
