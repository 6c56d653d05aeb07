// KvRecordLayout: where the disk-backed policy keeps each group of K/V on disk and how one
// record looks in memory.
//
// A record holds G consecutive tokens of one layer for all KV heads: K as [G][row] F16, then
// V as [G][row] F16, padded to the device block, so a record in memory is one attention span
// as it is. On disk, each sequence slot owns one region; inside it each layer owns a run of
// max_groups records in group order. A layer's groups are therefore adjacent on disk, which
// lets adjacent selected groups be read in one request and a layer's whole prefix be read
// back in a few large ones.
//
// A plain value; any thread.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"
#include "runtime/kv/kv_policy.h"

namespace strata {

struct KvRecordLayout {
  int32_t group_size = 0;  // G
  int32_t row = 0;         // n_head_kv * head_dim (F16 values per token for K, and for V)
  int32_t n_layer = 0;
  int32_t max_groups = 0;      // groups of a full context: ceil(n_ctx / G)
  uint32_t payload_bytes = 0;  // 2 * G * row * 2
  uint32_t record_bytes = 0;   // payload rounded up to the block size

  static KvRecordLayout Make(const KvShape& shape, int32_t group_size, uint32_t block_size);

  uint64_t layer_bytes() const { return uint64_t(max_groups) * record_bytes; }
  uint64_t sequence_bytes() const { return layer_bytes() * uint64_t(n_layer); }
  uint64_t Offset(int32_t seq_slot, int32_t layer, int32_t group) const {
    return uint64_t(seq_slot) * sequence_bytes() + uint64_t(layer) * layer_bytes() +
           uint64_t(group) * record_bytes;
  }
  // Token t (0 <= t < G) of a record starting at `record`.
  uint16_t* KeyRow(void* record, int32_t t) const {
    return static_cast<uint16_t*>(record) + size_t(t) * row;
  }
  uint16_t* ValueRow(void* record, int32_t t) const {
    return static_cast<uint16_t*>(record) + size_t(group_size + t) * row;
  }
  // The span of the first n_tokens tokens of a record holding group `group`.
  kernels::KvSpan Span(const void* record, int32_t group, int32_t n_tokens) const {
    const auto* k = static_cast<const uint16_t*>(record);
    return kernels::KvSpan{k, k + size_t(group_size) * row, n_tokens, group * group_size, row};
  }
};

}  // namespace strata
