// SlowTier: where KV blocks go when the fast tier is full, behind one small interface.
//
// The prefix-tree KV policy evicts whole blocks (or reads single layers of them) through
// this seam and never learns what sits behind it: the block store on disk here (O_DIRECT
// through io_uring or the pread pool), pinned host RAM on a desktop GPU, or plain RAM in
// tests (RamSlowTier). Offsets and lengths are multiples of alignment(), and buffers are
// aligned to it, because the disk tier needs that for direct I/O.
//
// Transfers are asynchronous: Read/Write start a set of extents and hand back a transfer
// whose Wait() blocks until all of them finished (the first error, naming the extent, is
// returned). Destroying an unfinished transfer waits for it, so a buffer is never written
// after its transfer is gone.
//
// Threads: one thread (the engine's) starts and waits transfers; the tier may complete them
// on its own threads. A tier must outlive its transfers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "storage/store_options.h"

namespace strata {

struct TierExtent {
  uint64_t offset = 0;
  void* buffer = nullptr;
  uint32_t length = 0;
};

class TierTransfer {
 public:
  virtual ~TierTransfer() = default;
  // True once every extent finished (successfully or not); never blocks.
  virtual bool Done() = 0;
  // Blocks until every extent finished; OK or the first failure.
  virtual Status Wait() = 0;
};

// A transfer that already ended with `status` (tiers that copy synchronously, and errors).
std::unique_ptr<TierTransfer> FinishedTransfer(Status status);

class SlowTier {
 public:
  virtual ~SlowTier() = default;
  // "block store io_uring qd=256 O_DIRECT /tmp/..." or "ram": for reports.
  virtual std::string Describe() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual uint32_t alignment() const = 0;
  virtual Status Read(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) = 0;
  virtual Status Write(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) = 0;
  // Lets the tier prepare `base` for repeated transfers (io_uring fixed buffers). Optional.
  virtual Status RegisterMemory(void* base, size_t length);
  // True when the extents' buffers may be GPU memory (a tier of pinned host RAM moved by the
  // GPU); the block store and RAM tiers copy with the CPU and need host buffers.
  virtual bool moves_device_memory() const { return false; }
};

// Host RAM as the slow tier: transfers are copies, finished when Read/Write return. Used by
// tests (faults can be injected by failing the n-th transfer) and where no disk is wanted.
class RamSlowTier final : public SlowTier {
 public:
  // alignment: what the tier reports (a power of two), e.g. the disk tier's, so that block
  // layouts and budgets come out the same on either.
  static Status Create(uint64_t capacity, std::unique_ptr<RamSlowTier>* out,
                       uint32_t alignment = 64);
  std::string Describe() const override { return "ram"; }
  uint64_t capacity() const override { return capacity_; }
  uint32_t alignment() const override { return alignment_; }
  Status Read(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override;
  Status Write(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override;
  // Test hook: the transfer that starts after `n` more transfers fails with an I/O error
  // (n < 0: never).
  void FailTransferAfter(int64_t n) { fail_after_ = n; }

 private:
  RamSlowTier() = default;
  Status Check(std::span<const TierExtent> extents, const char* op);
  uint64_t capacity_ = 0;
  uint32_t alignment_ = 64;
  std::unique_ptr<uint8_t[]> data_;
  int64_t fail_after_ = -1;
};

// Opens a block store (storage/) as the slow tier. options.capacity must hold every block
// the policy may write; the file is deleted when the tier is destroyed unless keep_files.
Status OpenBlockStoreTier(const storage::StoreOptions& options, std::unique_ptr<SlowTier>* out);

}  // namespace strata
