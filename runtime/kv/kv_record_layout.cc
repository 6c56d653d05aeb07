#include "runtime/kv/kv_record_layout.h"

namespace strata {

KvRecordLayout KvRecordLayout::Make(const KvShape& shape, int32_t group_size, uint32_t block_size) {
  KvRecordLayout l;
  l.group_size = group_size;
  l.row = shape.row();
  l.n_layer = shape.n_layer;
  l.max_groups = (shape.n_ctx + group_size - 1) / group_size;
  l.payload_bytes = uint32_t(2) * uint32_t(group_size) * uint32_t(l.row) * 2;
  l.record_bytes = (l.payload_bytes + block_size - 1) / block_size * block_size;
  return l;
}

}  // namespace strata
