// CudaDevice: one CUDA GPU as Strata uses it — two streams, device and pinned host memory,
// events, and small per-pass uploads — behind an interface that exists in every build.
//
// A build without the CUDA toolkit (or configured with -DSTRATA_CUDA=OFF) still has this
// header: Open fails with a message that says so and Count() is 0, so the engine, the beam
// search and the command line can offer a `cuda` backend and refuse it clearly.
//
// Streams: the compute stream runs the forward pass, in the order the engine enqueues it; the
// copy stream runs slow-tier transfers (pinned host <-> device). OrderCopyAfterCompute makes
// the copy stream wait for everything enqueued on the compute stream so far, so a transfer
// never reads a buffer before the kernel writing it ran, nor overwrites one a queued kernel
// still reads.
//
// Threads: one thread (the engine's) at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/cuda_kernels.h"
#include "platforms/tier_memory.h"

namespace strata {

// "cpu" -> -1, "cuda" -> 0, "cuda:N" -> N (the form config files and flags use).
Status ParseComputeDevice(const std::string& text, int32_t* cuda_device);
std::string ComputeDeviceName(int32_t cuda_device);

class CudaDevice {
 public:
  enum class Stream { kCompute, kCopy };

  // Devices visible to this process (0 in a build without CUDA or on a machine without a GPU).
  static int Count();
  // Opens device `ordinal`; NotSupported when the build has no CUDA support or no such
  // device exists (the message says which).
  static Status Open(int ordinal, std::shared_ptr<CudaDevice>* out);
  virtual ~CudaDevice() = default;

  virtual const std::string& name() const = 0;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
  virtual void* stream(Stream s) const = 0;     // a cudaStream_t
  // GPU memory as a fast tier (StoreF16 is deferred until FlushStores).
  virtual TierMemory* memory() = 0;
  // Launches the StoreF16 calls made since the last flush, on the compute stream, in one
  // kernel.
  virtual Status FlushStores() = 0;

  virtual Status Malloc(size_t bytes, void** out) = 0;
  virtual void Free(void* p) = 0;
  // Pinned host memory the GPU can read and write through *device (zero-copy).
  virtual Status HostAlloc(size_t bytes, void** host, void** device) = 0;
  virtual void HostFree(void* host) = 0;
  // Blocking copy host -> device (weights at start-up).
  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Enqueued copies on a stream; `host` must stay valid (and, for uploads, unchanged) until
  // the stream reaches the copy.
  virtual Status CopyToDeviceAsync(void* dst, const void* host, size_t bytes, Stream s) = 0;
  virtual Status CopyToHostAsync(void* host, const void* src, size_t bytes, Stream s) = 0;
  virtual Status CopyOnDeviceAsync(void* dst, const void* src, size_t bytes, Stream s) = 0;
  // Copies `bytes` of host data into a staging ring and enqueues its upload on stream s;
  // *device receives where the kernels of that stream will find it (16-byte aligned). The
  // ring wraps by waiting for the stream.
  virtual Status Upload(const void* data, size_t bytes, Stream s, void** device) = 0;
  // Waits for everything enqueued on the stream; reports any kernel or copy failure.
  virtual Status Synchronize(Stream s) = 0;
  // Reports a launch failure of the last kernel enqueued (a cheap check, no wait).
  virtual Status CheckLaunch(const char* what) = 0;
  virtual void OrderCopyAfterCompute() = 0;
  // Enqueues one kernel on stream s that performs every copy of `ops` (device pointers or
  // the device aliases of pinned host memory); the list itself is uploaded first.
  virtual Status CopyExtents(std::span<const kernels::cuda::CopyOp> ops, Stream s) = 0;

  // The capabilities below have defaults that say "not supported", so a stand-in for a
  // device (the host-backed ones of the tests) implements only what it uses.

  // The device's cuBLAS handle, bound to the compute stream (created on first use).
  virtual Status Blas(void** handle) { return Unsupported(handle, "cuBLAS"); }
  // Whether the GPU shares the host's RAM (an integrated GPU: Jetson-class boards). Such a
  // GPU reads pinned host memory at full speed, so weights and KV are best kept where the
  // CPU can read them too, once.
  virtual bool integrated() const { return false; }
  // Memory this process can still place on the device. On an integrated GPU the CUDA
  // figure counts memory the OS would have to reclaim from caches it cannot drop for a
  // pinned allocation, so the smaller of it and the system's MemAvailable is reported.
  virtual Status FreeMemory(uint64_t* free_bytes, uint64_t* total_bytes) {
    *free_bytes = *total_bytes = 0;
    return Status::NotSupported(name() + ": no free-memory query");
  }
  // Device memory allocated through this device (Malloc and memory()) and not freed.
  virtual uint64_t allocated_bytes() const { return 0; }
  // Pins `bytes` of existing host memory at p (e.g. the model file's mapping) and maps it
  // into the device's address space: *device receives the address kernels use. read_only
  // allows a read-only mapping. UnmapHost undoes it.
  virtual Status MapHost(const void* p, size_t bytes, bool read_only, const void** device);
  virtual void UnmapHost(const void* /*p*/) {}
  // Hands over the StoreF16 calls queued since the last flush instead of launching them (a
  // captured graph launches them from a list of its own).
  virtual Status TakeStores(std::vector<kernels::cuda::StoreF16Op>* ops);

  // Enqueues on the compute stream the expansion of n_rows Q8_0 rows of n values (device
  // memory at src) into F16 rows at dst (KV records for attention).
  virtual Status ExpandQ8_0(const void* src, int64_t n_rows, int64_t n, uint16_t* dst);

  // A captured sequence of compute-stream work that can be launched again and again.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual Status Launch() = 0;
  };
  // Everything enqueued on the compute stream between BeginCapture and EndCapture is
  // recorded, not run. No synchronizing call may come in between.
  virtual Status BeginCapture() { return Status::NotSupported(name() + ": no graph capture"); }
  virtual Status EndCapture(std::unique_ptr<Graph>* out);

  // Events mark a point of a stream: a transfer's end.
  class Event {
   public:
    virtual ~Event() = default;
    virtual bool Done() = 0;
    virtual Status Wait() = 0;
  };
  virtual Status Record(Stream s, std::unique_ptr<Event>* out) = 0;

 private:
  Status Unsupported(void** out, const char* what) const {
    *out = nullptr;
    return Status::NotSupported(name() + ": no " + what);
  }
};

}  // namespace strata
