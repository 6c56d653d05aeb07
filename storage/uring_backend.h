// The io_uring backend: O_DIRECT reads and writes on one file through a ring of a configured
// depth, with the file registered (fixed file) and, once the caller registers them, fixed
// buffers; a batch of requests costs one io_uring_enter, and reaping peeks the completion
// ring from user space, entering the kernel only to sleep.
//
// Internal to storage/: BlockStore::Open creates it, or falls back to the thread-pool backend
// with the returned error as the reason. Threads: see io_backend.h.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "storage/io_backend.h"

namespace strata::storage {

struct UringConfig {
  uint32_t queue_depth = 64;  // submission ring entries; the store never has more in flight
  bool sq_poll = false;       // a kernel thread polls the submission ring (costs a CPU)
  uint32_t sq_poll_idle_ms = 100;
  bool register_file = true;
};

// Fails (NotSupported or IOError, naming the call and errno) where the kernel refuses io_uring
// or lacks the opcodes the store needs; the message is the fallback reason the store reports.
Status CreateUringBackend(int fd, const UringConfig& config, std::unique_ptr<IoBackend>* out);

}  // namespace strata::storage
