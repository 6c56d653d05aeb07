// StoreOptions: everything BlockStore::Open needs to know, with defaults that suit the KV
// cache on a local NVMe/eMMC disk. Validate() checks ranges and names the bad field.
//
// Environment seam, read by Open (for CI and tests of the fallback path):
//   STRATA_STORAGE_FORCE_FALLBACK=io_uring  treat io_uring as refused (EPERM), as under seccomp
//   STRATA_STORAGE_FORCE_FALLBACK=direct    treat O_DIRECT as refused (EINVAL), as on old tmpfs
//   STRATA_STORAGE_FORCE_FALLBACK=tmpfile   treat O_TMPFILE as refused, as on filesystems
//                                           without it (temporary stores then get a name)
// Either way the store falls back to the pread pool and reports the reason once.
//
// Threads: a plain value; fill it on one thread before Open.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "storage/slow_disk.h"

namespace strata::storage {

class FaultInjector;

enum class OpenMode : uint8_t {
  kCreate,        // make a new store file; fail if the path exists
  kOpenExisting,  // reopen a kept store file; fail if missing or not ours
  kOpenOrCreate,  // reopen it if it is ours, create it if missing, never touch anything else
  // A store for this process alone (a KV cache): a new file that cannot outlive the process.
  // It is made without a name (O_TMPFILE) where the filesystem allows, so nothing remains
  // whatever ends the process, SIGKILL included. Elsewhere it is named `file_name`-<random
  // id>.strata, holds an exclusive lock while open and is removed at Close; a later
  // temporary store in the same directory removes such a file when no process holds its
  // lock any more (a crash left it) and says so through `report`. Names carry no PID, so
  // runs in different PID namespaces never collide. keep_files does not apply.
  kTemporary,
};

enum class BackendKind : uint8_t {
  kAuto,        // io_uring with O_DIRECT; the pread pool where either is refused
  kUring,       // io_uring or an error
  kThreadPool,  // the pread/pwrite pool even where io_uring works (benchmarks, tests)
};

struct StoreOptions {
  // Where the store lives: a file in `directory` (which must exist and be writable) ...
  std::string directory;
  std::string file_name = "blocks.strata";  // kTemporary: the prefix of a fallback name
  // ... or a whole block device. The device must already carry a store header, unless
  // claim_device allows the store to write one (destroying what the device held).
  std::string device;
  bool claim_device = false;

  OpenMode mode = OpenMode::kCreate;
  // Bytes of data area; required when creating. When reopening, 0 or the stored capacity.
  uint64_t capacity = 0;
  // fallocate the whole data area at creation, so a full disk is found at Open, not mid-run.
  bool preallocate = true;
  // Leave the file behind on Close (it is deleted otherwise). Devices are never deleted.
  bool keep_files = false;
  // Request alignment in bytes: 0 uses the device's logical block size for direct I/O;
  // otherwise a power of two at least that large and at most 64 KiB.
  uint32_t block_size = 0;
  // false: page-cache I/O through the pread pool (never O_DIRECT).
  bool direct_io = true;

  BackendKind backend = BackendKind::kAuto;
  // Most requests in the backend at once; more wait in the store and start as slots free up.
  uint32_t queue_depth = 64;
  bool sq_poll = false;  // io_uring only: a kernel thread polls submissions (costs a CPU)
  uint32_t sq_poll_idle_ms = 100;
  bool register_file = true;  // io_uring only: fixed file
  // pread pool size; 0: queue_depth (at most 256).
  uint32_t fallback_threads = 0;

  // A request still in flight after this long is taken as lost (a device or kernel that
  // stopped answering): the waiter gets an IOError naming it instead of waiting forever,
  // and the store takes no more requests. Zero: wait forever.
  std::chrono::milliseconds io_timeout{60'000};

  SlowDiskOptions slow_disk;              // off by default
  std::shared_ptr<FaultInjector> faults;  // tests only; null: none

  // Receives one-line notices (the fallback reason, once per store). Null: stderr.
  std::function<void(std::string_view)> report;

  Status Validate() const;
};

// Internal: the value of STRATA_STORAGE_FORCE_FALLBACK, empty when unset.
std::string ForcedFallback();

}  // namespace strata::storage
