#include "runtime/kv/tree/slow_tier.h"

#include <cstring>
#include <new>
#include <vector>

#include "storage/block_store.h"

namespace strata {

Status SlowTier::RegisterMemory(void*, size_t) { return Status::OK(); }

namespace {

// A RAM transfer has already happened when it is handed out.
class EndedTransfer final : public TierTransfer {
 public:
  explicit EndedTransfer(Status s) : status_(std::move(s)) {}
  bool Done() override { return true; }
  Status Wait() override { return status_; }

 private:
  Status status_;
};

class StoreTransfer final : public TierTransfer {
 public:
  explicit StoreTransfer(storage::BlockStore* store) : store_(store) {}
  ~StoreTransfer() override {
    if (!batch_.done()) (void)store_->Wait(batch_);
  }
  storage::IoBatch& batch() { return batch_; }
  bool Done() override {
    if (!batch_.done()) store_->Poll();
    return batch_.done();
  }
  Status Wait() override { return store_->Wait(batch_); }

 private:
  storage::BlockStore* store_;
  storage::IoBatch batch_;
};

class BlockStoreTier final : public SlowTier {
 public:
  explicit BlockStoreTier(std::unique_ptr<storage::BlockStore> store) : store_(std::move(store)) {}
  std::string Describe() const override {
    std::string d = "block store " + store_->path() + " (" + store_->backend_name() +
                    (store_->direct_io() ? ", O_DIRECT" : ", page cache") + ")";
    const storage::CountersSnapshot c = store_->counters();
    if (!c.emulation.empty()) d += " [" + c.emulation + "]";
    return d;
  }
  uint64_t capacity() const override { return store_->capacity(); }
  uint32_t alignment() const override { return store_->block_size(); }
  Status Read(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override {
    return Start(storage::IoKind::kRead, extents, out);
  }
  Status Write(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override {
    return Start(storage::IoKind::kWrite, extents, out);
  }
  Status RegisterMemory(void* base, size_t length) override {
    const storage::MemoryRegion r{base, length};
    return store_->RegisterBuffers({&r, 1});
  }

 private:
  Status Start(storage::IoKind kind, std::span<const TierExtent> extents,
               std::unique_ptr<TierTransfer>* out) {
    auto t = std::make_unique<StoreTransfer>(store_.get());
    t->batch().reserve(extents.size());
    for (const TierExtent& e : extents) {
      if (kind == storage::IoKind::kRead)
        t->batch().AddRead(e.offset, e.buffer, e.length);
      else
        t->batch().AddWrite(e.offset, e.buffer, e.length);
    }
    if (!extents.empty()) STRATA_RETURN_IF_ERROR(store_->Submit(t->batch()));
    *out = std::move(t);
    return Status::OK();
  }

  std::unique_ptr<storage::BlockStore> store_;
};

}  // namespace

std::unique_ptr<TierTransfer> FinishedTransfer(Status status) {
  return std::make_unique<EndedTransfer>(std::move(status));
}

Status RamSlowTier::Create(uint64_t capacity, std::unique_ptr<RamSlowTier>* out,
                           uint32_t alignment) {
  if (capacity == 0) return Status::InvalidArgument("RAM slow tier: capacity is 0");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    return Status::InvalidArgument("RAM slow tier: alignment " + std::to_string(alignment) +
                                   " is not a power of two");
  std::unique_ptr<RamSlowTier> t(new RamSlowTier());
  t->data_.reset(new (std::nothrow) uint8_t[capacity]);
  if (!t->data_)
    return Status::ResourceExhausted("RAM slow tier: cannot allocate " + std::to_string(capacity) +
                                     " bytes");
  t->capacity_ = capacity;
  t->alignment_ = alignment;
  *out = std::move(t);
  return Status::OK();
}

Status RamSlowTier::Check(std::span<const TierExtent> extents, const char* op) {
  if (fail_after_ == 0) {
    fail_after_ = -1;
    return Status::IOError(std::string("RAM slow tier: injected failure of a ") + op);
  }
  if (fail_after_ > 0) --fail_after_;
  for (const TierExtent& e : extents) {
    if (e.offset > capacity_ || e.length > capacity_ - e.offset)
      return Status::OutOfRange(std::string("RAM slow tier: ") + op + " of " +
                                std::to_string(e.length) + " bytes at " + std::to_string(e.offset) +
                                " is past the capacity " + std::to_string(capacity_));
  }
  return Status::OK();
}

Status RamSlowTier::Read(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) {
  Status s = Check(extents, "read");
  if (s.ok())
    for (const TierExtent& e : extents) std::memcpy(e.buffer, data_.get() + e.offset, e.length);
  *out = FinishedTransfer(s);
  return Status::OK();
}

Status RamSlowTier::Write(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) {
  Status s = Check(extents, "write");
  if (s.ok())
    for (const TierExtent& e : extents) std::memcpy(data_.get() + e.offset, e.buffer, e.length);
  *out = FinishedTransfer(s);
  return Status::OK();
}

Status OpenBlockStoreTier(const storage::StoreOptions& options, std::unique_ptr<SlowTier>* out) {
  std::unique_ptr<storage::BlockStore> store;
  STRATA_RETURN_IF_ERROR(storage::BlockStore::Open(options, &store));
  *out = std::make_unique<BlockStoreTier>(std::move(store));
  return Status::OK();
}

}  // namespace strata
