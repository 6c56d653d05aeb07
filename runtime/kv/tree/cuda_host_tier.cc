#include "runtime/kv/tree/cuda_host_tier.h"

#include <vector>

namespace strata {
namespace {

class EventTransfer final : public TierTransfer {
 public:
  explicit EventTransfer(std::unique_ptr<CudaDevice::Event> e) : e_(std::move(e)) {}
  ~EventTransfer() override { (void)Wait(); }
  bool Done() override { return !e_ || e_->Done(); }
  Status Wait() override {
    if (!e_) return result_;
    result_ = e_->Wait();
    e_.reset();
    return result_;
  }

 private:
  std::unique_ptr<CudaDevice::Event> e_;
  Status result_;
};

class CudaHostTier final : public SlowTier {
 public:
  CudaHostTier(std::shared_ptr<CudaDevice> d, uint64_t capacity, uint32_t alignment)
      : d_(std::move(d)), capacity_(capacity), alignment_(alignment) {}
  ~CudaHostTier() override {
    (void)d_->Synchronize(CudaDevice::Stream::kCopy);
    d_->HostFree(host_);
  }
  Status Init() { return d_->HostAlloc(capacity_, &host_, &alias_); }

  std::string Describe() const override { return "pinned host RAM via " + d_->name(); }
  uint64_t capacity() const override { return capacity_; }
  uint32_t alignment() const override { return alignment_; }
  bool moves_device_memory() const override { return true; }
  Status Read(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override {
    return Transfer(extents, true, out);
  }
  Status Write(std::span<const TierExtent> extents, std::unique_ptr<TierTransfer>* out) override {
    return Transfer(extents, false, out);
  }

 private:
  Status Transfer(std::span<const TierExtent> extents, bool read,
                  std::unique_ptr<TierTransfer>* out) {
    ops_.clear();
    for (const TierExtent& e : extents) {
      if (e.offset % alignment_ != 0 || e.length % alignment_ != 0 ||
          e.offset + e.length > capacity_ || e.offset + e.length < e.offset)
        return Status::InvalidArgument(
            std::string("pinned host tier: ") + (read ? "read" : "write") + " of " +
            std::to_string(e.length) + " bytes at offset " + std::to_string(e.offset) +
            " is not aligned to " + std::to_string(alignment_) + " or passes the capacity " +
            std::to_string(capacity_));
      char* host = static_cast<char*>(alias_) + e.offset;
      if (read)
        ops_.push_back({e.buffer, host, e.length});
      else
        ops_.push_back({host, e.buffer, e.length});
    }
    d_->OrderCopyAfterCompute();
    STRATA_RETURN_IF_ERROR(d_->CopyExtents(ops_, CudaDevice::Stream::kCopy));
    std::unique_ptr<CudaDevice::Event> ev;
    STRATA_RETURN_IF_ERROR(d_->Record(CudaDevice::Stream::kCopy, &ev));
    *out = std::make_unique<EventTransfer>(std::move(ev));
    return Status::OK();
  }

  std::shared_ptr<CudaDevice> d_;
  uint64_t capacity_;
  uint32_t alignment_;
  void* host_ = nullptr;
  void* alias_ = nullptr;
  std::vector<kernels::cuda::CopyOp> ops_;
};

}  // namespace

Status OpenCudaHostTier(std::shared_ptr<CudaDevice> device, uint64_t capacity, uint32_t alignment,
                        std::unique_ptr<SlowTier>* out) {
  if (!device) return Status::InvalidArgument("pinned host tier: no CUDA device");
  if (alignment < 16 || (alignment & (alignment - 1)) != 0)
    return Status::InvalidArgument("pinned host tier: alignment " + std::to_string(alignment) +
                                   " is not a power of two >= 16");
  auto t = std::make_unique<CudaHostTier>(std::move(device), capacity, alignment);
  STRATA_RETURN_IF_ERROR(t->Init());
  *out = std::move(t);
  return Status::OK();
}

}  // namespace strata
