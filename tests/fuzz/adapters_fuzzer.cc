// libFuzzer target: arbitrary bytes as a key-adapters file (runtime/kv/disk/adapters.h). Parsing
// must fail cleanly or give adapters whose every set has the promised shape; the checksum is
// checked on half the inputs and skipped on the other half, so the fields behind it are
// reached too.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/kv/disk/adapters.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool verify = (data[0] & 1) != 0;
  const std::vector<uint8_t> bytes(data + 1, data + size);
  strata::Adapters a;
  if (!strata::Adapters::Parse(bytes, "fuzz.adapters", &a, verify).ok()) return 0;
  const int64_t row = int64_t(a.n_head_kv) * a.head_dim;
  for (const strata::AdapterSet& set : a.sets) {
    if (set.rank <= 0 || set.rank > row || int64_t(set.layers.size()) != a.n_layer) {
      std::fprintf(stderr, "adapters_fuzzer: a parsed set has an inconsistent shape\n");
      std::abort();
    }
  }
  return 0;
}
