// A CudaDevice stand-in for tests on machines without a GPU: its "GPU memory" is host memory
// and its streams run every copy at once, so the host side of GPU code (tiers, staging,
// views) can be checked anywhere.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "platforms/cuda_device.h"

namespace strata::testing {

// It records the order of some calls (o: copy ordered after compute, c: copy kernel, e: event)
// so tests can check the ordering of transfers.
class HostBackedDevice final : public CudaDevice {
 public:
  const std::string& name() const override { return name_; }
  void* stream(Stream) const override { return nullptr; }
  TierMemory* memory() override { return HostMemory(); }
  Status FlushStores() override { return Status::OK(); }
  Status Malloc(size_t bytes, void** out) override {
    *out = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return Status::OK();
  }
  void Free(void* p) override { std::free(p); }
  Status HostAlloc(size_t bytes, void** host, void** device) override {
    ++host_allocs;
    host_bytes += bytes;
    *host = *device = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return Status::OK();
  }
  void HostFree(void* host) override { std::free(host); }
  Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes, Stream) override {
    return CopyToDevice(dst, src, bytes);
  }
  Status CopyToHostAsync(void* dst, const void* src, size_t bytes, Stream) override {
    return CopyToDevice(dst, src, bytes);
  }
  Status CopyOnDeviceAsync(void* dst, const void* src, size_t bytes, Stream) override {
    return CopyToDevice(dst, src, bytes);
  }
  Status Upload(const void*, size_t, Stream, void**) override {
    return Status::Internal("not used by the tier");
  }
  Status Synchronize(Stream) override { return Status::OK(); }
  Status CheckLaunch(const char*) override { return Status::OK(); }
  void OrderCopyAfterCompute() override { calls += 'o'; }
  Status CopyExtents(std::span<const kernels::cuda::CopyOp> ops, Stream s) override {
    if (s != Stream::kCopy) return Status::Internal("a transfer on the compute stream");
    calls += 'c';
    for (const auto& op : ops) {
      if (op.bytes % 16 != 0) return Status::Internal("a copy of a length the kernel refuses");
      std::memcpy(op.dst, op.src, op.bytes);
    }
    return Status::OK();
  }
  class DoneEvent final : public Event {
   public:
    bool Done() override { return true; }
    Status Wait() override { return Status::OK(); }
  };
  Status Record(Stream, std::unique_ptr<Event>* out) override {
    calls += 'e';
    *out = std::make_unique<DoneEvent>();
    return Status::OK();
  }
  Status ExpandQ8_0(const void* src, int64_t n_rows, int64_t n, uint16_t* dst) override {
    std::vector<float> row(static_cast<size_t>(n));
    const auto* s = static_cast<const uint8_t*>(src);
    for (int64_t r = 0; r < n_rows; ++r) {
      kernels::DequantizeRow(kernels::DType::kQ8_0, s + r * kernels::Q8_0RowBytes(n), row.data(),
                             n);
      kernels::F32ToF16Row(row.data(), dst + r * n, n);
    }
    return Status::OK();
  }

  std::string calls;  // o: ordered after compute, c: copy kernel, e: event
  int host_allocs = 0;
  size_t host_bytes = 0;

 private:
  std::string name_ = "cuda:test (host-backed)";
};

// Host memory that claims to be a device's: what a policy may not pair with a CPU-side tier.
class FakeDeviceTier final : public TierMemory {
 public:
  const char* name() const override { return "fake device"; }
  bool device() const override { return true; }
  Status Allocate(size_t bytes, size_t alignment, TierArena* out) override {
    return HostMemory()->Allocate(bytes, alignment, out);
  }
  void StoreF16(uint16_t* dst, const float* src, int64_t n) override {
    HostMemory()->StoreF16(dst, src, n);
  }
  void Copy(void* dst, const void* src, size_t n) override { HostMemory()->Copy(dst, src, n); }
};

}  // namespace strata::testing
