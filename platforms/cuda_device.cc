// The CUDA implementation of CudaDevice (built only with the CUDA toolkit).
#include "platforms/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cublas_loader.h"
#include "kernels/cuda/cuda_kernels.h"

namespace strata {
namespace {

Status CudaError(cudaError_t e, const std::string& what) {
  return Status::IOError("cuda: " + what + ": " + cudaGetErrorName(e) + " (" +
                         cudaGetErrorString(e) + ")");
}
#define STRATA_CUDA_RETURN(call, what)                     \
  do {                                                     \
    cudaError_t err_ = (call);                             \
    if (err_ != cudaSuccess) return CudaError(err_, what); \
  } while (0)

constexpr size_t kRingBytes = size_t(16) << 20;

class CudaEventImpl final : public CudaDevice::Event {
 public:
  explicit CudaEventImpl(cudaEvent_t e) : e_(e) {}
  ~CudaEventImpl() override { cudaEventDestroy(e_); }
  bool Done() override { return cudaEventQuery(e_) != cudaErrorNotReady; }
  Status Wait() override {
    STRATA_CUDA_RETURN(cudaEventSynchronize(e_), "waiting for a transfer");
    return Status::OK();
  }

 private:
  cudaEvent_t e_;
};

class CudaDeviceImpl;

class CudaGraphImpl final : public CudaDevice::Graph {
 public:
  CudaGraphImpl(cudaGraph_t g, cudaGraphExec_t e, cudaStream_t s) : g_(g), e_(e), s_(s) {}
  ~CudaGraphImpl() override {
    cudaGraphExecDestroy(e_);
    cudaGraphDestroy(g_);
  }
  Status Launch() override {
    STRATA_CUDA_RETURN(cudaGraphLaunch(e_, s_), "launching a captured graph");
    return Status::OK();
  }

 private:
  cudaGraph_t g_;
  cudaGraphExec_t e_;
  cudaStream_t s_;
};

// MemAvailable of /proc/meminfo in bytes (0 when unreadable).
uint64_t SystemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// GPU memory as a fast tier. StoreF16 calls are queued and launched as one kernel by
// FlushStores: a batch of 32 sequences appends 64 rows per layer, and a launch each would
// cost more than the attention that reads them.
class DeviceTierMemory final : public TierMemory {
 public:
  explicit DeviceTierMemory(CudaDeviceImpl* d) : d_(d) {}
  const char* name() const override;
  bool device() const override { return true; }
  Status Allocate(size_t bytes, size_t alignment, TierArena* out) override;
  void StoreF16(uint16_t* dst, const float* src, int64_t n) override {
    if (n > 0) pending_.push_back({dst, src, n});
  }
  void Copy(void* dst, const void* src, size_t n) override;

  std::vector<kernels::cuda::StoreF16Op> pending_;
  Status deferred_;  // a failure of Copy, reported by the next FlushStores
  std::shared_ptr<std::atomic<uint64_t>> bytes_ = std::make_shared<std::atomic<uint64_t>>(0);

 private:
  CudaDeviceImpl* d_;
};

class CudaDeviceImpl final : public CudaDevice {
 public:
  ~CudaDeviceImpl() override {
    cudaSetDevice(ordinal_);
    for (auto& s : streams_)
      if (s) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    for (auto& r : rings_) {
      if (r.host) cudaFreeHost(r.host);
      if (r.dev) cudaFree(r.dev);
    }
    if (after_compute_) cudaEventDestroy(after_compute_);
    if (blas_) kernels::cuda::Cublas(nullptr)->destroy(static_cast<cublasHandle_t>(blas_));
  }

  Status Init(int ordinal) {
    ordinal_ = ordinal;
    STRATA_CUDA_RETURN(cudaSetDevice(ordinal), "selecting device " + std::to_string(ordinal));
    cudaDeviceProp prop;
    STRATA_CUDA_RETURN(cudaGetDeviceProperties(&prop, ordinal), "reading device properties");
    name_ = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ")";
    integrated_ = prop.integrated != 0;
    for (auto& s : streams_)
      STRATA_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
    for (auto& r : rings_) {
      STRATA_CUDA_RETURN(cudaHostAlloc(&r.host, kRingBytes, cudaHostAllocDefault),
                         "allocating the pinned staging ring");
      STRATA_CUDA_RETURN(cudaMalloc(&r.dev, kRingBytes), "allocating the device staging ring");
    }
    STRATA_CUDA_RETURN(cudaEventCreateWithFlags(&after_compute_, cudaEventDisableTiming),
                       "creating an event");
    return Status::OK();
  }

  const std::string& name() const override { return name_; }
  void* stream(Stream s) const override { return streams_[int(s)]; }
  TierMemory* memory() override { return &memory_; }

  Status FlushStores() override {
    if (!memory_.deferred_.ok()) {
      Status s = memory_.deferred_;
      memory_.deferred_ = Status::OK();
      memory_.pending_.clear();
      return s;
    }
    if (memory_.pending_.empty()) return Status::OK();
    int64_t max_n = 0;
    for (const auto& op : memory_.pending_) max_n = std::max(max_n, op.n);
    void* ops = nullptr;
    const size_t bytes = memory_.pending_.size() * sizeof(kernels::cuda::StoreF16Op);
    STRATA_RETURN_IF_ERROR(Upload(memory_.pending_.data(), bytes, Stream::kCompute, &ops));
    kernels::cuda::StoreF16(static_cast<const kernels::cuda::StoreF16Op*>(ops),
                            int32_t(memory_.pending_.size()), max_n, stream(Stream::kCompute));
    memory_.pending_.clear();
    return CheckLaunch("storing K/V rows");
  }

  Status Malloc(size_t bytes, void** out) override {
    STRATA_CUDA_RETURN(cudaMalloc(out, std::max<size_t>(bytes, 1)),
                       "allocating " + std::to_string(bytes) + " bytes of device memory");
    sizes_[*out] = bytes;
    allocated_ += bytes;
    return Status::OK();
  }
  void Free(void* p) override {
    if (!p) return;
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      allocated_ -= it->second;
      sizes_.erase(it);
    }
    cudaFree(p);
  }
  uint64_t allocated_bytes() const override { return allocated_ + memory_.bytes_->load(); }

  Status Blas(void** handle) override {
    if (!blas_) {
      std::string why;
      const kernels::cuda::CublasApi* api = kernels::cuda::Cublas(&why);
      if (api == nullptr) return Status::IOError("cuda: " + why);
      cublasHandle_t h = nullptr;
      if (api->create(&h) != CUBLAS_STATUS_SUCCESS)
        return Status::IOError("cuda: cannot create a cuBLAS handle on " + name_);
      api->set_stream(h, S(Stream::kCompute));
      blas_ = h;
    }
    *handle = blas_;
    return Status::OK();
  }
  bool integrated() const override { return integrated_; }
  Status FreeMemory(uint64_t* free_bytes, uint64_t* total_bytes) override {
    size_t f = 0, t = 0;
    STRATA_CUDA_RETURN(cudaMemGetInfo(&f, &t), "reading the device's free memory");
    *free_bytes = f;
    *total_bytes = t;
    if (integrated_) {
      const uint64_t avail = SystemAvailableBytes();
      if (avail > 0) *free_bytes = std::min<uint64_t>(f, avail);
    }
    return Status::OK();
  }
  Status MapHost(const void* p, size_t bytes, bool read_only, const void** device) override {
    unsigned flags = cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : 0u);
    STRATA_CUDA_RETURN(cudaHostRegister(const_cast<void*>(p), bytes, flags),
                       "pinning " + std::to_string(bytes) + " bytes of host memory for the GPU");
    void* dev = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&dev, const_cast<void*>(p), 0);
    if (e != cudaSuccess) {
      cudaHostUnregister(const_cast<void*>(p));
      return CudaError(e, "mapping pinned host memory into the device's address space");
    }
    *device = dev;
    return Status::OK();
  }
  void UnmapHost(const void* p) override {
    if (p) cudaHostUnregister(const_cast<void*>(p));
  }
  Status TakeStores(std::vector<kernels::cuda::StoreF16Op>* ops) override {
    ops->clear();
    if (!memory_.deferred_.ok()) {
      Status s = memory_.deferred_;
      memory_.deferred_ = Status::OK();
      memory_.pending_.clear();
      return s;
    }
    ops->swap(memory_.pending_);
    return Status::OK();
  }
  Status ExpandQ8_0(const void* src, int64_t n_rows, int64_t n, uint16_t* dst) override {
    kernels::cuda::ExpandQ8_0Rows(static_cast<const uint8_t*>(src), n_rows, n, dst,
                                  S(Stream::kCompute));
    return CheckLaunch("expanding Q8_0 KV rows");
  }
  Status BeginCapture() override {
    STRATA_CUDA_RETURN(
        cudaStreamBeginCapture(S(Stream::kCompute), cudaStreamCaptureModeThreadLocal),
        "starting a graph capture");
    return Status::OK();
  }
  Status EndCapture(std::unique_ptr<Graph>* out) override {
    cudaGraph_t g = nullptr;
    STRATA_CUDA_RETURN(cudaStreamEndCapture(S(Stream::kCompute), &g), "ending a graph capture");
    cudaGraphExec_t e = nullptr;
    cudaError_t r = cudaGraphInstantiate(&e, g, 0);
    if (r != cudaSuccess) {
      cudaGraphDestroy(g);
      return CudaError(r, "instantiating a captured graph");
    }
    *out = std::make_unique<CudaGraphImpl>(g, e, S(Stream::kCompute));
    return Status::OK();
  }
  Status HostAlloc(size_t bytes, void** host, void** device) override {
    STRATA_CUDA_RETURN(cudaHostAlloc(host, std::max<size_t>(bytes, 1), cudaHostAllocMapped),
                       "allocating " + std::to_string(bytes) + " bytes of pinned host memory");
    cudaError_t e = cudaHostGetDevicePointer(device, *host, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(*host);
      return CudaError(e, "mapping pinned host memory into the device's address space");
    }
    return Status::OK();
  }
  void HostFree(void* host) override {
    if (host) cudaFreeHost(host);
  }
  Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    STRATA_CUDA_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "uploading");
    return Status::OK();
  }
  Status CopyToDeviceAsync(void* dst, const void* host, size_t bytes, Stream s) override {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, S(s)),
                       "enqueueing an upload");
    return Status::OK();
  }
  Status CopyToHostAsync(void* host, const void* src, size_t bytes, Stream s) override {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, S(s)),
                       "enqueueing a download");
    return Status::OK();
  }
  Status CopyOnDeviceAsync(void* dst, const void* src, size_t bytes, Stream s) override {
    STRATA_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(s)),
                       "enqueueing a device copy");
    return Status::OK();
  }
  Status Upload(const void* data, size_t bytes, Stream s, void** device) override {
    Ring& r = rings_[int(s)];
    const size_t need = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    if (need > kRingBytes)
      return Status::InvalidArgument("cuda: an upload of " + std::to_string(bytes) +
                                     " bytes exceeds the staging ring of " +
                                     std::to_string(kRingBytes) + " bytes");
    if (r.head + need > kRingBytes) {
      // Everything enqueued from the ring so far must have been copied before it is reused.
      STRATA_RETURN_IF_ERROR(Synchronize(s));
      r.head = 0;
    }
    std::memcpy(static_cast<char*>(r.host) + r.head, data, bytes);
    void* dst = static_cast<char*>(r.dev) + r.head;
    STRATA_RETURN_IF_ERROR(CopyToDeviceAsync(dst, static_cast<char*>(r.host) + r.head, bytes, s));
    r.head += need;
    *device = dst;
    return Status::OK();
  }
  Status Synchronize(Stream s) override {
    STRATA_CUDA_RETURN(cudaStreamSynchronize(S(s)), "running the GPU work");
    return Status::OK();
  }
  Status CheckLaunch(const char* what) override {
    STRATA_CUDA_RETURN(cudaGetLastError(), std::string("launching ") + what);
    return Status::OK();
  }
  void OrderCopyAfterCompute() override {
    cudaEventRecord(after_compute_, S(Stream::kCompute));
    cudaStreamWaitEvent(S(Stream::kCopy), after_compute_, 0);
  }
  Status CopyExtents(std::span<const kernels::cuda::CopyOp> ops, Stream s) override {
    if (ops.empty()) return Status::OK();
    uint64_t max_bytes = 0;
    for (const auto& op : ops) max_bytes = std::max(max_bytes, op.bytes);
    void* dev = nullptr;
    STRATA_RETURN_IF_ERROR(Upload(ops.data(), ops.size_bytes(), s, &dev));
    kernels::cuda::CopyExtents(static_cast<const kernels::cuda::CopyOp*>(dev), int32_t(ops.size()),
                               max_bytes, S(s));
    return CheckLaunch("copying extents");
  }
  Status Record(Stream s, std::unique_ptr<Event>* out) override {
    cudaEvent_t e;
    STRATA_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
    cudaError_t r = cudaEventRecord(e, S(s));
    if (r != cudaSuccess) {
      cudaEventDestroy(e);
      return CudaError(r, "recording an event");
    }
    *out = std::make_unique<CudaEventImpl>(e);
    return Status::OK();
  }

  cudaStream_t S(Stream s) const { return streams_[int(s)]; }

 private:
  struct Ring {
    void* host = nullptr;
    void* dev = nullptr;
    size_t head = 0;
  };
  int ordinal_ = 0;
  std::string name_;
  bool integrated_ = false;
  void* blas_ = nullptr;
  std::unordered_map<void*, size_t> sizes_;
  uint64_t allocated_ = 0;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  Ring rings_[2];
  cudaEvent_t after_compute_ = nullptr;
  DeviceTierMemory memory_{this};
  friend class DeviceTierMemory;
};

const char* DeviceTierMemory::name() const { return d_->name().c_str(); }

Status DeviceTierMemory::Allocate(size_t bytes, size_t alignment, TierArena* out) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096)
    return Status::InvalidArgument("device memory: alignment " + std::to_string(alignment) +
                                   " is not a power of two up to 4096");
  // cudaMalloc promises 256 bytes of alignment; a larger one comes from allocating that much
  // more and starting inside. Counted apart from Malloc's allocations: an arena may outlive
  // the device object.
  const size_t extra = alignment > 256 ? alignment : 0;
  const size_t total = std::max<size_t>(bytes, 1) + extra;
  void* base = nullptr;
  cudaError_t e = cudaMalloc(&base, total);
  if (e != cudaSuccess)
    return CudaError(e, "allocating " + std::to_string(bytes) + " bytes of device memory");
  e = cudaMemset(base, 0, total);
  if (e != cudaSuccess) {
    cudaFree(base);
    return CudaError(e, "clearing device memory");
  }
  const uintptr_t at =
      (reinterpret_cast<uintptr_t>(base) + alignment - 1) & ~uintptr_t(alignment - 1);
  std::shared_ptr<std::atomic<uint64_t>> counter = bytes_;
  *counter += total;
  *out = TierArena(reinterpret_cast<std::byte*>(at), [counter, total, base](std::byte*) {
    cudaFree(base);
    *counter -= total;
  });
  return Status::OK();
}

void DeviceTierMemory::Copy(void* dst, const void* src, size_t n) {
  // Stores queued before the copy must land first: the copy may read them.
  Status s = d_->FlushStores();
  if (s.ok()) s = d_->CopyOnDeviceAsync(dst, src, n, CudaDevice::Stream::kCompute);
  if (!s.ok() && deferred_.ok()) deferred_ = s;
}

}  // namespace

int CudaDevice::Count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

Status CudaDevice::Open(int ordinal, std::shared_ptr<CudaDevice>* out) {
  const int n = Count();
  if (n == 0) return Status::NotSupported("cuda: no CUDA device is visible to this process");
  if (ordinal < 0 || ordinal >= n)
    return Status::InvalidArgument("cuda: device " + std::to_string(ordinal) +
                                   " does not exist (devices 0.." + std::to_string(n - 1) + ")");
  auto d = std::make_shared<CudaDeviceImpl>();
  STRATA_RETURN_IF_ERROR(d->Init(ordinal));
  *out = std::move(d);
  return Status::OK();
}

}  // namespace strata
