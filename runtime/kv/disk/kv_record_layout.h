// KvRecordLayout: where the disk-backed policy keeps each group of K/V on disk and how one
// record looks in memory.
//
// A record holds G consecutive tokens of one layer for all KV heads: K as G rows, then V as
// G rows, each row one token's n_head_kv * head_dim values in the record type (F16, or
// Q8_0 blocks of 32 values with one F16 scale: 34 bytes per 32 values instead of 64),
// padded to the device block, so a record in memory is one attention span as it is. On
// disk, each sequence slot owns one region; inside it each layer owns a run of max_groups
// records in group order. A layer's groups are therefore adjacent on disk, which lets
// adjacent selected groups be read in one request and a layer's whole prefix be read back
// in a few large ones.
//
// A plain value; any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "runtime/kv/kv_policy.h"

namespace strata {

struct KvRecordLayout {
  int32_t group_size = 0;  // G
  int32_t row = 0;         // n_head_kv * head_dim: values per token for K, and for V
  int32_t n_layer = 0;
  int32_t max_groups = 0;  // groups of a full context: ceil(n_ctx / G)
  kernels::KvType type = kernels::KvType::kF16;
  uint32_t row_bytes = 0;      // bytes of one token's K (or V) row in `type`
  uint32_t payload_bytes = 0;  // 2 * G * row_bytes
  uint32_t record_bytes = 0;   // payload rounded up to the block size

  // Q8_0 needs row % 32 == 0 (checked by PlanDiskKv, which names the setting).
  static KvRecordLayout Make(const KvShape& shape, int32_t group_size, uint32_t block_size,
                             kernels::KvType type);

  uint64_t layer_bytes() const { return uint64_t(max_groups) * record_bytes; }
  uint64_t sequence_bytes() const { return layer_bytes() * uint64_t(n_layer); }
  uint64_t Offset(int32_t seq_slot, int32_t layer, int32_t group) const {
    return uint64_t(seq_slot) * sequence_bytes() + uint64_t(layer) * layer_bytes() +
           uint64_t(group) * record_bytes;
  }
  // Token t (0 <= t < G) of a record starting at `record`.
  std::byte* KeyRow(void* record, int32_t t) const {
    return static_cast<std::byte*>(record) + size_t(t) * row_bytes;
  }
  std::byte* ValueRow(void* record, int32_t t) const {
    return static_cast<std::byte*>(record) + size_t(group_size + t) * row_bytes;
  }
  // Stores n tokens' K and V rows ([n][row] each) as tokens t0.. of a record, converting to
  // the record type.
  void PutF32(void* record, int32_t t0, const float* k, const float* v, int32_t n) const;
  void PutF16(void* record, int32_t t0, const uint16_t* k, const uint16_t* v, int32_t n) const;
  // Tokens t0.. of a record as F16 rows.
  void GetF16(const void* record, int32_t t0, int32_t n, uint16_t* k, uint16_t* v) const;
  // The keys of the first n tokens of a record as F32 rows ([n][row]).
  void GetKeysF32(const void* record, int32_t n, float* k) const;
  // The span of the first n_tokens tokens of a record holding group `group`.
  kernels::KvSpan Span(const void* record, int32_t group, int32_t n_tokens) const;
};
}  // namespace strata
