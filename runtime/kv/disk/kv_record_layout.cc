#include "runtime/kv/disk/kv_record_layout.h"

#include <cstring>
#include <vector>

namespace strata {

KvRecordLayout KvRecordLayout::Make(const KvShape& shape, int32_t group_size, uint32_t block_size,
                                    kernels::KvType type) {
  KvRecordLayout l;
  l.group_size = group_size;
  l.row = shape.row();
  l.n_layer = shape.n_layer;
  l.max_groups = (shape.n_ctx + group_size - 1) / group_size;
  l.type = type;
  l.row_bytes =
      type == kernels::KvType::kQ8_0 ? uint32_t(kernels::Q8_0RowBytes(l.row)) : uint32_t(l.row) * 2;
  l.payload_bytes = uint32_t(2) * uint32_t(group_size) * l.row_bytes;
  l.record_bytes = (l.payload_bytes + block_size - 1) / block_size * block_size;
  return l;
}

void KvRecordLayout::PutF32(void* record, int32_t t0, const float* k, const float* v,
                            int32_t n) const {
  for (int32_t i = 0; i < n; ++i) {
    const float* ks = k + size_t(i) * row;
    const float* vs = v + size_t(i) * row;
    if (type == kernels::KvType::kQ8_0) {
      kernels::QuantizeRow(kernels::DType::kQ8_0, ks, KeyRow(record, t0 + i), row);
      kernels::QuantizeRow(kernels::DType::kQ8_0, vs, ValueRow(record, t0 + i), row);
    } else {
      kernels::F32ToF16Row(ks, reinterpret_cast<uint16_t*>(KeyRow(record, t0 + i)), row);
      kernels::F32ToF16Row(vs, reinterpret_cast<uint16_t*>(ValueRow(record, t0 + i)), row);
    }
  }
}

void KvRecordLayout::PutF16(void* record, int32_t t0, const uint16_t* k, const uint16_t* v,
                            int32_t n) const {
  if (type == kernels::KvType::kF16) {
    std::memcpy(KeyRow(record, t0), k, size_t(n) * row_bytes);
    std::memcpy(ValueRow(record, t0), v, size_t(n) * row_bytes);
    return;
  }
  // One token at a time through a row buffer of the calling thread: prefill fills every
  // record of a pass this way, so nothing is allocated per record.
  thread_local std::vector<float> f;
  f.resize(2 * size_t(row));
  for (int32_t i = 0; i < n; ++i) {
    kernels::F16ToF32Row(k + size_t(i) * row, f.data(), row);
    kernels::F16ToF32Row(v + size_t(i) * row, f.data() + row, row);
    PutF32(record, t0 + i, f.data(), f.data() + row, 1);
  }
}

void KvRecordLayout::GetF16(const void* record, int32_t t0, int32_t n, uint16_t* k,
                            uint16_t* v) const {
  void* r = const_cast<void*>(record);
  if (type == kernels::KvType::kF16) {
    std::memcpy(k, KeyRow(r, t0), size_t(n) * row_bytes);
    std::memcpy(v, ValueRow(r, t0), size_t(n) * row_bytes);
    return;
  }
  thread_local std::vector<float> f;
  f.resize(size_t(row));
  for (int32_t i = 0; i < n; ++i) {
    kernels::DequantizeRow(kernels::DType::kQ8_0, KeyRow(r, t0 + i), f.data(), row);
    kernels::F32ToF16Row(f.data(), k + size_t(i) * row, row);
    kernels::DequantizeRow(kernels::DType::kQ8_0, ValueRow(r, t0 + i), f.data(), row);
    kernels::F32ToF16Row(f.data(), v + size_t(i) * row, row);
  }
}

void KvRecordLayout::GetKeysF32(const void* record, int32_t n, float* k) const {
  void* r = const_cast<void*>(record);
  for (int32_t i = 0; i < n; ++i) {
    if (type == kernels::KvType::kQ8_0)
      kernels::DequantizeRow(kernels::DType::kQ8_0, KeyRow(r, i), k + size_t(i) * row, row);
    else
      kernels::F16ToF32Row(reinterpret_cast<const uint16_t*>(KeyRow(r, i)), k + size_t(i) * row,
                           row);
  }
}

kernels::KvSpan KvRecordLayout::Span(const void* record, int32_t group, int32_t n_tokens) const {
  const int32_t pos0 = group * group_size;
  if (type == kernels::KvType::kQ8_0) {
    const auto* k = static_cast<const uint8_t*>(record);
    return kernels::KvSpan{nullptr,
                           nullptr,
                           n_tokens,
                           pos0,
                           int32_t(row_bytes),
                           kernels::KvType::kQ8_0,
                           k,
                           k + size_t(group_size) * row_bytes};
  }
  const auto* k = static_cast<const uint16_t*>(record);
  return kernels::KvSpan{k, k + size_t(group_size) * row, n_tokens, pos0, row};
}

}  // namespace strata
