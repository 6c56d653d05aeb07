#include "storage/aligned_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace strata::storage {
namespace {

// Below this, malloc-family memory is fine; above it mmap returns the pages to the OS on free
// and hands them out zeroed without a memset pass.
constexpr size_t kMmapThreshold = size_t{1} << 20;

bool RoundUp(size_t size, size_t alignment, size_t* out) {
  if (size > SIZE_MAX - (alignment - 1)) return false;
  *out = (size + alignment - 1) & ~(alignment - 1);
  return true;
}

}  // namespace

Status AlignedBuffer::Allocate(size_t size, size_t alignment, AlignedBuffer* out) {
  if (alignment == 0 || !std::has_single_bit(alignment)) {
    return Status::InvalidArgument("buffer alignment " + std::to_string(alignment) +
                                   " is not a power of two");
  }
  if (size == 0) return Status::InvalidArgument("buffer size is 0");
  size_t rounded = 0;
  if (!RoundUp(size, alignment, &rounded)) {
    return Status::InvalidArgument("buffer size " + std::to_string(size) + " overflows");
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  AlignedBuffer b;
  b.size_ = rounded;
  b.alignment_ = alignment;
  if (rounded >= kMmapThreshold && alignment <= page) {
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return Status::ResourceExhausted("cannot map " + std::to_string(rounded) +
                                       " bytes for an aligned buffer: " + std::strerror(err));
    }
    b.data_ = static_cast<std::byte*>(p);
    b.mapped_ = true;
  } else {
    void* p = std::aligned_alloc(alignment, rounded);
    if (p == nullptr) {
      return Status::ResourceExhausted("cannot allocate " + std::to_string(rounded) +
                                       " bytes aligned to " + std::to_string(alignment));
    }
    std::memset(p, 0, rounded);
    b.data_ = static_cast<std::byte*>(p);
  }
  *out = std::move(b);
  return Status::OK();
}

AlignedBuffer::~AlignedBuffer() { Release(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), alignment_(other.alignment_), mapped_(other.mapped_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    size_ = other.size_;
    alignment_ = other.alignment_;
    mapped_ = other.mapped_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void AlignedBuffer::Release() {
  if (data_ == nullptr) return;
  if (mapped_) {
    munmap(data_, size_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
}

BufferPool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), data_(other.data_), index_(other.index_) {
  other.pool_ = nullptr;
  other.data_ = nullptr;
}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = other.pool_;
    data_ = other.data_;
    index_ = other.index_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
  }
  return *this;
}

size_t BufferPool::Lease::size() const { return pool_ ? pool_->buffer_size() : 0; }

void BufferPool::Lease::Reset() {
  if (pool_ != nullptr) pool_->Return(index_);
  pool_ = nullptr;
  data_ = nullptr;
}

Status BufferPool::Create(size_t buffer_size, size_t count, size_t alignment,
                          std::unique_ptr<BufferPool>* out) {
  if (count == 0) return Status::InvalidArgument("buffer pool with 0 buffers");
  if (alignment == 0 || !std::has_single_bit(alignment)) {
    return Status::InvalidArgument("buffer pool alignment " + std::to_string(alignment) +
                                   " is not a power of two");
  }
  if (buffer_size == 0) return Status::InvalidArgument("buffer pool with 0-byte buffers");
  size_t slot = 0;
  if (!RoundUp(buffer_size, alignment, &slot) || slot > SIZE_MAX / count) {
    return Status::InvalidArgument("buffer pool of " + std::to_string(count) + " x " +
                                   std::to_string(buffer_size) + " bytes overflows");
  }
  std::unique_ptr<BufferPool> pool(new BufferPool());
  STRATA_RETURN_IF_ERROR(AlignedBuffer::Allocate(slot * count, alignment, &pool->arena_));
  pool->buffer_size_ = slot;
  pool->count_ = count;
  pool->free_.reserve(count);
  for (size_t i = count; i > 0; --i) pool->free_.push_back(i - 1);
  *out = std::move(pool);
  return Status::OK();
}

BufferPool::~BufferPool() {
  // A lease outliving its pool would write into freed memory later; fail loudly here instead.
  if (outstanding_ != 0) {
    std::fprintf(stderr, "strata storage: BufferPool destroyed with %zu buffers still leased\n",
                 outstanding_);
    std::abort();
  }
}

BufferPool::Lease BufferPool::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return Lease();
  const size_t i = free_.back();
  free_.pop_back();
  ++outstanding_;
  return Lease(this, slot(i), i);
}

size_t BufferPool::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

void BufferPool::Return(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(index);
  --outstanding_;
}

}  // namespace strata::storage
