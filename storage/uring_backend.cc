#include "storage/uring_backend.h"

#include <liburing.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::storage {
namespace {

// user_data of the ring's own cancel requests; store tokens are slot numbers, far below it.
constexpr uint64_t kCancelToken = UINT64_MAX;
// Completions taken from the ring per peek.
constexpr unsigned kPeekBatch = 128;
// io_uring_submit can transiently refuse (EAGAIN: no memory for requests now, EBUSY: completion
// backlog, EINTR); beyond this many tries the ring is treated as broken.
constexpr int kSubmitRetries = 1000;

class UringBackend final : public IoBackend {
 public:
  UringBackend() = default;
  ~UringBackend() override {
    if (!initialized_) return;
    if (fixed_buffers_ > 0) io_uring_unregister_buffers(&ring_);
    if (fixed_file_) io_uring_unregister_files(&ring_);
    io_uring_queue_exit(&ring_);
  }

  Status Init(int fd, const UringConfig& config);

  std::string Describe() const override;
  void Submit(std::span<const BackendOp> ops) override;
  size_t Reap(std::span<BackendResult> out, size_t min_results,
              std::chrono::nanoseconds max_wait) override;
  void CancelAll() override;
  Status RegisterBuffers(std::span<const MemoryRegion> regions) override;

 private:
  size_t Peek(std::span<BackendResult> out);
  int WaitForCompletions(unsigned count, std::chrono::nanoseconds max_wait);
  // Hands every prepared SQE to the kernel; on a hard failure fails the last `prepared` ops.
  void Flush(std::span<const BackendOp> prepared);
  void FailOps(std::span<const BackendOp> ops, int err);
  size_t TakeFailed(std::span<BackendResult> out);

  io_uring ring_{};
  bool initialized_ = false;
  int fd_ = -1;
  bool fixed_file_ = false;
  bool sq_poll_ = false;
  bool ext_arg_ = false;  // the kernel takes a timeout with IORING_ENTER_EXT_ARG (5.11+)
  uint32_t depth_ = 0;
  size_t fixed_buffers_ = 0;
  int broken_errno_ = 0;  // set once submission failed for good; later ops fail with it

  // Ops that never reached the kernel, reported by the next Reap.
  std::mutex failed_mu_;
  std::vector<BackendResult> failed_;
  std::atomic<bool> has_failed_{false};
};

Status UringBackend::Init(int fd, const UringConfig& config) {
  fd_ = fd;
  sq_poll_ = config.sq_poll;
  io_uring_params params{};
  // A completion ring twice the submission ring: the store caps in-flight requests at the
  // queue depth, so the extra room only ever holds the ring's own cancel completions.
  params.flags = IORING_SETUP_CQSIZE;
  params.cq_entries = 2 * config.queue_depth;
  if (config.sq_poll) {
    params.flags |= IORING_SETUP_SQPOLL;
    params.sq_thread_idle = config.sq_poll_idle_ms;
  }
  int r = io_uring_queue_init_params(config.queue_depth, &ring_, &params);
  if (r < 0) {
    return Status::FromErrno("io_uring_setup(entries=" + std::to_string(config.queue_depth) +
                                 (config.sq_poll ? ", SQPOLL" : "") + ")",
                             -r);
  }
  initialized_ = true;
  depth_ = params.sq_entries;
  ext_arg_ = (params.features & IORING_FEAT_EXT_ARG) != 0;

  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  if (probe == nullptr) {
    return Status::NotSupported("io_uring: the kernel cannot report its opcodes (before 5.6)");
  }
  const bool has_ops = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                       io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
                       io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                       io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
  io_uring_free_probe(probe);
  if (!has_ops) {
    return Status::NotSupported("io_uring: the kernel lacks IORING_OP_READ/WRITE (before 5.6)");
  }
  if (config.register_file) {
    // A fixed file saves the per-request file table lookup and reference count.
    fixed_file_ = io_uring_register_files(&ring_, &fd_, 1) == 0;
  }
  return Status::OK();
}

std::string UringBackend::Describe() const {
  std::string d = "io_uring qd=" + std::to_string(depth_);
  if (fixed_file_) d += " fixed-file";
  if (fixed_buffers_ > 0) d += " fixed-buffers=" + std::to_string(fixed_buffers_);
  if (sq_poll_) d += " sqpoll";
  return d;
}

void UringBackend::Submit(std::span<const BackendOp> ops) {
  if (broken_errno_ != 0) {
    FailOps(ops, broken_errno_);
    return;
  }
  size_t prepared_from = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // Only reachable if the caller passes more ops than the ring holds: hand over what is
      // prepared and continue with a drained ring.
      Flush(ops.subspan(prepared_from, i - prepared_from));
      prepared_from = i;
      if (broken_errno_ != 0) {
        FailOps(ops.subspan(i), broken_errno_);
        return;
      }
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        FailOps(ops.subspan(i), EBUSY);
        return;
      }
    }
    const BackendOp& op = ops[i];
    const int fd = fixed_file_ ? 0 : fd_;
    if (op.kind == IoKind::kRead) {
      if (op.fixed_buffer >= 0) {
        io_uring_prep_read_fixed(sqe, fd, op.buffer, op.length, op.file_offset, op.fixed_buffer);
      } else {
        io_uring_prep_read(sqe, fd, op.buffer, op.length, op.file_offset);
      }
    } else {
      if (op.fixed_buffer >= 0) {
        io_uring_prep_write_fixed(sqe, fd, op.buffer, op.length, op.file_offset, op.fixed_buffer);
      } else {
        io_uring_prep_write(sqe, fd, op.buffer, op.length, op.file_offset);
      }
    }
    if (fixed_file_) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data64(sqe, op.token);
  }
  Flush(ops.subspan(prepared_from));
}

void UringBackend::Flush(std::span<const BackendOp> prepared) {
  int tries = 0;
  for (;;) {
    const int r = io_uring_submit(&ring_);
    // Without SQPOLL the kernel consumes the ring in the call; a request it rejects still
    // gets a completion carrying the error, so "consumed" means "will complete".
    if (r >= 0 && (sq_poll_ || io_uring_sq_ready(&ring_) == 0)) return;
    if (r >= 0 || r == -EINTR || r == -EAGAIN || r == -EBUSY) {
      if (++tries < kSubmitRetries) {
        sched_yield();
        continue;
      }
    }
    // The kernel keeps refusing: the ops still in the ring will never run. They are the
    // newest ones prepared, so fail that many from the end.
    broken_errno_ = r < 0 ? -r : EIO;
    const size_t stuck = std::min<size_t>(io_uring_sq_ready(&ring_), prepared.size());
    FailOps(prepared.subspan(prepared.size() - stuck), broken_errno_);
    return;
  }
}

void UringBackend::FailOps(std::span<const BackendOp> ops, int err) {
  if (ops.empty()) return;
  std::lock_guard<std::mutex> lock(failed_mu_);
  for (const BackendOp& op : ops) failed_.push_back(BackendResult{op.token, -err});
  has_failed_.store(true, std::memory_order_release);
}

size_t UringBackend::TakeFailed(std::span<BackendResult> out) {
  if (!has_failed_.load(std::memory_order_acquire)) return 0;
  std::lock_guard<std::mutex> lock(failed_mu_);
  const size_t n = std::min(out.size(), failed_.size());
  std::copy(failed_.end() - static_cast<ptrdiff_t>(n), failed_.end(), out.begin());
  failed_.resize(failed_.size() - n);
  has_failed_.store(!failed_.empty(), std::memory_order_release);
  return n;
}

size_t UringBackend::Peek(std::span<BackendResult> out) {
  size_t n = 0;
  io_uring_cqe* cqes[kPeekBatch];
  while (n < out.size()) {
    const unsigned want = static_cast<unsigned>(std::min<size_t>(kPeekBatch, out.size() - n));
    const unsigned got = io_uring_peek_batch_cqe(&ring_, cqes, want);
    if (got == 0) break;
    for (unsigned i = 0; i < got; ++i) {
      const uint64_t token = io_uring_cqe_get_data64(cqes[i]);
      if (token == kCancelToken) continue;
      out[n++] = BackendResult{token, cqes[i]->res};
    }
    io_uring_cq_advance(&ring_, got);
  }
  return n;
}

int UringBackend::WaitForCompletions(unsigned count, std::chrono::nanoseconds max_wait) {
  if (max_wait == kWaitForever) {
    return io_uring_enter(ring_.ring_fd, 0, count, IORING_ENTER_GETEVENTS, nullptr);
  }
  if (ext_arg_) {
    __kernel_timespec ts{};
    ts.tv_sec = max_wait.count() / 1'000'000'000;
    ts.tv_nsec = max_wait.count() % 1'000'000'000;
    io_uring_getevents_arg arg{};
    arg.ts = reinterpret_cast<uint64_t>(&ts);
    const long r = syscall(__NR_io_uring_enter, ring_.ring_fd, 0, count,
                           IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof(arg));
    return r < 0 ? -errno : static_cast<int>(r);
  }
  // Kernels before 5.11 take no timeout without a timeout request in the ring, which would
  // race with submitters; a short sleep keeps such waits bounded instead.
  std::this_thread::sleep_for(std::min(max_wait, std::chrono::nanoseconds(100'000)));
  return -ETIME;
}

size_t UringBackend::Reap(std::span<BackendResult> out, size_t min_results,
                          std::chrono::nanoseconds max_wait) {
  size_t n = TakeFailed(out);
  n += Peek(out.subspan(n));
  const auto start = std::chrono::steady_clock::now();
  while (n < min_results && n < out.size()) {
    std::chrono::nanoseconds left = kWaitForever;
    if (max_wait != kWaitForever) {
      left = max_wait - (std::chrono::steady_clock::now() - start);
      if (left <= std::chrono::nanoseconds::zero()) break;
    }
    const int r = WaitForCompletions(static_cast<unsigned>(min_results - n), left);
    n += TakeFailed(out.subspan(n));
    n += Peek(out.subspan(n));
    if (r == -ETIME) break;
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) break;
  }
  return n;
}

void UringBackend::CancelAll() {
  if (broken_errno_ != 0) return;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return;
  // Disk reads already at the device cannot be pulled back; this stops what is still queued
  // in io_uring (kernels before 5.19 answer -EINVAL and everything simply completes).
  io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
  io_uring_sqe_set_data64(sqe, kCancelToken);
  io_uring_submit(&ring_);
}

Status UringBackend::RegisterBuffers(std::span<const MemoryRegion> regions) {
  if (fixed_buffers_ > 0) {
    io_uring_unregister_buffers(&ring_);
    fixed_buffers_ = 0;
  }
  if (regions.empty()) return Status::OK();
  std::vector<iovec> iov(regions.size());
  size_t total = 0;
  for (size_t i = 0; i < regions.size(); ++i) {
    iov[i].iov_base = regions[i].base;
    iov[i].iov_len = regions[i].length;
    total += regions[i].length;
  }
  const int r = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
  if (r < 0) {
    return Status::FromErrno("io_uring_register_buffers(" + std::to_string(regions.size()) +
                                 " regions, " + std::to_string(total) + " bytes)",
                             -r);
  }
  fixed_buffers_ = regions.size();
  return Status::OK();
}

}  // namespace

Status CreateUringBackend(int fd, const UringConfig& config, std::unique_ptr<IoBackend>* out) {
  auto backend = std::make_unique<UringBackend>();
  STRATA_RETURN_IF_ERROR(backend->Init(fd, config));
  *out = std::move(backend);
  return Status::OK();
}

}  // namespace strata::storage
