// Aligned memory for direct I/O: AlignedBuffer (one owned allocation) and BufferPool (an arena
// cut into equal buffers, handed out and returned without touching the allocator).
//
// O_DIRECT needs buffer addresses aligned to the device's logical block size
// (BlockStore::block_size()); the KV layer's reuse and preload buffers come from a BufferPool,
// whose whole arena can be registered with a store (BlockStore::RegisterBuffers) so the
// io_uring backend uses fixed buffers for it.
//
// Threads: AlignedBuffer is thread-compatible. BufferPool::Acquire/Release and the Lease
// destructor may be called from any thread; the pool must outlive every lease.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/status.h"

namespace strata::storage {

// A range of memory, e.g. a pool's arena handed to BlockStore::RegisterBuffers.
struct MemoryRegion {
  void* base = nullptr;
  size_t length = 0;
};

class AlignedBuffer {
 public:
  // size is rounded up to a multiple of alignment (a power of two); the memory is zeroed.
  static Status Allocate(size_t size, size_t alignment, AlignedBuffer* out);

  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  size_t alignment() const { return alignment_; }
  std::span<std::byte> span() const { return {data_, size_}; }
  MemoryRegion region() const { return {data_, size_}; }

 private:
  void Release();
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 0;
  bool mapped_ = false;  // large buffers come from mmap so they go back to the OS on free
};

class BufferPool {
 public:
  // A leased buffer; returns itself to the pool when destroyed. Empty when the pool had none.
  class Lease {
   public:
    Lease() = default;
    ~Lease() { Reset(); }
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    explicit operator bool() const { return pool_ != nullptr; }
    std::byte* data() const { return data_; }
    size_t size() const;
    size_t index() const { return index_; }  // stable slot number inside the pool
    void Reset();

   private:
    friend class BufferPool;
    Lease(BufferPool* pool, std::byte* data, size_t index)
        : pool_(pool), data_(data), index_(index) {}
    BufferPool* pool_ = nullptr;
    std::byte* data_ = nullptr;
    size_t index_ = 0;
  };

  // count buffers of buffer_size bytes (rounded up to alignment), alignment a power of two.
  static Status Create(size_t buffer_size, size_t count, size_t alignment,
                       std::unique_ptr<BufferPool>* out);
  ~BufferPool();

  // Non-blocking: an empty lease when every buffer is out.
  Lease Acquire();
  size_t buffer_size() const { return buffer_size_; }
  size_t capacity() const { return count_; }
  size_t available() const;
  // Slot i's memory, for callers that manage slots themselves (e.g. a fixed slot table).
  std::byte* slot(size_t i) const { return arena_.data() + i * buffer_size_; }
  MemoryRegion region() const { return arena_.region(); }

 private:
  BufferPool() = default;
  void Return(size_t index);

  AlignedBuffer arena_;
  size_t buffer_size_ = 0;
  size_t count_ = 0;
  mutable std::mutex mu_;
  std::vector<size_t> free_;  // LIFO so a hot buffer is reused while still in cache
  size_t outstanding_ = 0;
};

}  // namespace strata::storage
