#include "runtime/kv/tree/cuda_disk_tier.h"

#include <iterator>
#include <list>
#include <map>
#include <vector>

namespace strata {
namespace {

uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

class CudaDiskTier;

// One Read or Write. A read's stages are disk -> staging, then staging -> GPU; a write's the
// reverse. Advance() moves it on as far as its stages have finished (or, blocking, to the end).
class StagedTransfer final : public TierTransfer {
 public:
  StagedTransfer(CudaDiskTier* tier, bool read) : tier_(tier), read_(read) {}
  ~StagedTransfer() override { (void)Wait(); }
  bool Done() override {
    Advance(false);
    return stage_ == Stage::kDone;
  }
  Status Wait() override {
    Advance(true);
    return result_;
  }

  void Advance(bool block);
  // Starts the first stage; on failure the transfer is finished with that error.
  void Start();

  uint64_t staging_offset = 0, staging_bytes = 0;
  std::vector<TierExtent> disk;               // the extents, on staging host memory
  std::vector<kernels::cuda::CopyOp> copies;  // between staging and GPU memory
  std::list<StagedTransfer*>::iterator live;  // the tier's list of unfinished transfers

 private:
  enum class Stage { kDisk, kCopy, kDone };
  Status StartCopy();
  void Finish(Status s);

  CudaDiskTier* tier_;
  const bool read_;
  Stage stage_ = Stage::kDone;
  std::unique_ptr<TierTransfer> io_;
  std::unique_ptr<CudaDevice::Event> copied_;
  Status result_;
};

class CudaDiskTier final : public SlowTier {
 public:
  CudaDiskTier(std::shared_ptr<CudaDevice> d, std::unique_ptr<SlowTier> inner)
      : d_(std::move(d)), inner_(std::move(inner)) {}
  ~CudaDiskTier() override {
    while (!live_.empty()) live_.front()->Advance(true);
    d_->HostFree(host_);
  }
  Status Init(uint64_t staging_bytes) {
    staging_bytes_ = RoundUp(std::max<uint64_t>(staging_bytes, 1), inner_->alignment());
    STRATA_RETURN_IF_ERROR(d_->HostAlloc(staging_bytes_, &host_, &alias_));
    free_[0] = staging_bytes_;
    return Status::OK();
  }

  std::string Describe() const override {
    return inner_->Describe() + ", staged through " + std::to_string(staging_bytes_ >> 20) +
           " MiB of pinned host RAM into " + d_->name();
  }
  uint64_t capacity() const override { return inner_->capacity(); }
  uint32_t alignment() const override { return inner_->alignment(); }
  bool moves_device_memory() const override { return true; }
  Status Read(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override {
    return Start(extents, true, out);
  }
  Status Write(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override {
    return Start(extents, false, out);
  }

  CudaDevice* device() const { return d_.get(); }
  SlowTier* inner() const { return inner_.get(); }
  // A finished transfer gives its staging back and leaves the list of those in flight.
  void Release(StagedTransfer* t) {
    live_.erase(t->live);
    Unreserve(t->staging_offset, t->staging_bytes);
  }

 private:
  Status Start(std::span<const TierExtent> extents, bool read, std::unique_ptr<TierTransfer>* out);
  // Staging for `bytes`, finishing older transfers (oldest first) until a range is free.
  Status Reserve(uint64_t bytes, uint64_t* offset);
  void Unreserve(uint64_t offset, uint64_t bytes);

  std::shared_ptr<CudaDevice> d_;
  std::unique_ptr<SlowTier> inner_;
  uint64_t staging_bytes_ = 0;
  void* host_ = nullptr;
  void* alias_ = nullptr;
  std::map<uint64_t, uint64_t> free_;  // staging offset -> free bytes there
  std::list<StagedTransfer*> live_;    // oldest first
};

void StagedTransfer::Start() {
  if (read_) {
    Status s = tier_->inner()->Read(disk, &io_);
    stage_ = Stage::kDisk;
    if (!s.ok()) Finish(s);
  } else {
    Status s = StartCopy();
    stage_ = Stage::kCopy;
    if (!s.ok()) Finish(s);
  }
}

Status StagedTransfer::StartCopy() {
  CudaDevice* d = tier_->device();
  d->OrderCopyAfterCompute();
  STRATA_RETURN_IF_ERROR(d->CopyExtents(copies, CudaDevice::Stream::kCopy));
  return d->Record(CudaDevice::Stream::kCopy, &copied_);
}

void StagedTransfer::Finish(Status s) {
  io_.reset();
  copied_.reset();
  if (!s.ok() && result_.ok())
    result_ = s.WithContext(std::string("disk tier behind ") + tier_->device()->name() + ": " +
                            (read_ ? "read" : "write"));
  stage_ = Stage::kDone;
  tier_->Release(this);
}

void StagedTransfer::Advance(bool block) {
  while (stage_ != Stage::kDone) {
    if (stage_ == Stage::kDisk) {
      if (!block && !io_->Done()) return;
      Status s = io_->Wait();
      io_.reset();
      if (!s.ok() || !read_) {
        Finish(s);
        return;
      }
      s = StartCopy();
      stage_ = Stage::kCopy;
      if (!s.ok()) {
        Finish(s);
        return;
      }
    } else {
      if (!block && !copied_->Done()) return;
      Status s = copied_->Wait();
      copied_.reset();
      if (!s.ok() || read_) {
        Finish(s);
        return;
      }
      s = tier_->inner()->Write(disk, &io_);
      stage_ = Stage::kDisk;
      if (!s.ok()) {
        Finish(s);
        return;
      }
    }
  }
}

Status CudaDiskTier::Reserve(uint64_t bytes, uint64_t* offset) {
  for (;;) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      *offset = it->first;
      if (it->second > bytes) free_[it->first + bytes] = it->second - bytes;
      free_.erase(it);
      return Status::OK();
    }
    if (live_.empty())
      return Status::Internal("disk tier: " + std::to_string(bytes) +
                              " bytes of staging are not free with no transfer in flight");
    live_.front()->Advance(true);  // finishing releases its staging and leaves the list
  }
}

void CudaDiskTier::Unreserve(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  auto it = free_.emplace(offset, bytes).first;
  if (auto next = std::next(it); next != free_.end() && offset + bytes == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

Status CudaDiskTier::Start(std::span<const TierExtent> extents, bool read,
                           std::unique_ptr<TierTransfer>* out) {
  const uint64_t a = inner_->alignment();
  uint64_t total = 0;
  for (const TierExtent& e : extents) {
    if (e.offset % a != 0 || e.length % a != 0)
      return Status::InvalidArgument("disk tier behind " + d_->name() + ": " +
                                     (read ? "read" : "write") + " of " + std::to_string(e.length) +
                                     " bytes at offset " + std::to_string(e.offset) +
                                     " is not aligned to " + std::to_string(a));
    if (e.length > staging_bytes_)
      return Status::InvalidArgument("disk tier behind " + d_->name() + ": an extent of " +
                                     std::to_string(e.length) + " bytes is larger than the " +
                                     std::to_string(staging_bytes_) + " bytes of staging");
    total += e.length;
  }
  if (total > staging_bytes_) {
    // More than the whole staging region: in pieces that fit, each finished before the next.
    size_t begin = 0;
    while (begin < extents.size()) {
      size_t end = begin;
      uint64_t bytes = 0;
      while (end < extents.size() && bytes + extents[end].length <= staging_bytes_)
        bytes += extents[end++].length;
      std::unique_ptr<TierTransfer> piece;
      STRATA_RETURN_IF_ERROR(Start(extents.subspan(begin, end - begin), read, &piece));
      Status s = piece->Wait();
      if (!s.ok()) {
        *out = FinishedTransfer(s);
        return Status::OK();
      }
      begin = end;
    }
    *out = FinishedTransfer(Status::OK());
    return Status::OK();
  }
  auto t = std::make_unique<StagedTransfer>(this, read);
  if (total > 0) STRATA_RETURN_IF_ERROR(Reserve(total, &t->staging_offset));
  t->staging_bytes = total;
  t->live = live_.insert(live_.end(), t.get());
  uint64_t at = t->staging_offset;
  for (const TierExtent& e : extents) {
    char* host = static_cast<char*>(host_) + at;
    char* dev = static_cast<char*>(alias_) + at;
    t->disk.push_back({e.offset, host, e.length});
    if (read)
      t->copies.push_back({e.buffer, dev, e.length});
    else
      t->copies.push_back({dev, e.buffer, e.length});
    at += e.length;
  }
  t->Start();
  *out = std::move(t);
  return Status::OK();
}

}  // namespace

Status OpenCudaDiskTier(std::shared_ptr<CudaDevice> device, std::unique_ptr<SlowTier> inner,
                        uint64_t staging_bytes, std::unique_ptr<SlowTier>* out) {
  if (!device) return Status::InvalidArgument("disk tier: no CUDA device");
  if (!inner) return Status::InvalidArgument("disk tier: no inner tier");
  if (inner->moves_device_memory())
    return Status::InvalidArgument("disk tier: the inner tier (" + inner->Describe() +
                                   ") already moves GPU memory");
  auto t = std::make_unique<CudaDiskTier>(std::move(device), std::move(inner));
  STRATA_RETURN_IF_ERROR(t->Init(staging_bytes));
  *out = std::move(t);
  return Status::OK();
}

}  // namespace strata
