// The pread/pwrite thread-pool backend: the fallback where io_uring is refused (ENOSYS on old
// kernels or qemu-user, EPERM under seccomp or io_uring_disabled) or O_DIRECT is refused.
// Each worker runs one blocking pread/pwrite at a time, so N workers keep up to N requests
// at the device; a thread waiting in Reap with nothing else running runs a queued request
// itself instead of sleeping, which saves two wake-ups per request at queue depth 1.
//
// Internal to storage/. Threads: see io_backend.h; the workers are private.
#pragma once

#include <memory>

#include "common/status.h"
#include "storage/io_backend.h"

namespace strata::storage {

Status CreateThreadPoolBackend(int fd, unsigned threads, std::unique_ptr<IoBackend>* out);

}  // namespace strata::storage
