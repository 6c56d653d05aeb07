#include "storage/io_batch.h"

#include "storage/block_store.h"

namespace strata::storage {

IoBatch::~IoBatch() {
  // A store never outlives its in-flight batches' completion (Close drains), so a pending
  // batch still has a live store to wait on.
  if (!done() && store_ != nullptr) (void)store_->Wait(*this);
}

void IoBatch::AddRead(uint64_t offset, void* buffer, uint32_t length, uint64_t tag) {
  requests_.push_back(IoRequest{IoKind::kRead, length, offset, buffer, tag});
}

void IoBatch::AddWrite(uint64_t offset, const void* buffer, uint32_t length, uint64_t tag) {
  // The store only reads a write's buffer; the cast lets one request type serve both kinds.
  requests_.push_back(IoRequest{IoKind::kWrite, length, offset, const_cast<void*>(buffer), tag});
}

void IoBatch::Clear() {
  requests_.clear();
  statuses_.clear();
}

void IoBatch::reserve(size_t n) {
  requests_.reserve(n);
  statuses_.reserve(n);
}

Status IoBatch::FirstError() const {
  for (const Status& s : statuses_) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

size_t IoBatch::failed_count() const {
  size_t n = 0;
  for (const Status& s : statuses_) n += s.ok() ? 0 : 1;
  return n;
}

}  // namespace strata::storage
