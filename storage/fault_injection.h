// FaultInjector: the test double's control panel. Give one to StoreOptions::faults and the
// store runs its real backend underneath, but requests that match a rule fail with an errno
// (EIO, ENOSPC, ...), transfer fewer bytes than asked, or complete late. The store's own error
// handling (short-transfer completion, error messages, cancellation) runs exactly as it would
// for a real device, and its callers cannot tell the difference.
//
// Rules speak the store's data offsets (what BlockStore callers pass), not file offsets.
// Threads: Add/Clear/fired from any thread, also while I/O runs; a rule added mid-run applies
// to requests submitted after it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "storage/io_backend.h"

namespace strata::storage {

enum class FaultKind : uint8_t {
  kError,          // complete with -error without touching the file
  kShortTransfer,  // transfer only short_bytes (the store must finish or report it)
  kDelay,          // run normally, report the completion `delay` later
};

struct FaultRule {
  FaultKind kind = FaultKind::kError;
  std::optional<IoKind> only;  // reads or writes only; both when empty
  // A request fires the rule when [offset, offset + length) overlaps [range_begin, range_end).
  uint64_t range_begin = 0;
  uint64_t range_end = UINT64_MAX;
  uint32_t skip = 0;                  // matching requests let through before the rule starts firing
  uint32_t times = 1;                 // how often it fires; 0: every matching request from then on
  int error = 5;                      // kError: the errno (EIO by default)
  uint32_t short_bytes = 0;           // kShortTransfer: bytes transferred (< length)
  std::chrono::nanoseconds delay{0};  // kDelay

  static FaultRule Eio(std::optional<IoKind> only = std::nullopt);
  static FaultRule NoSpace();  // ENOSPC on writes
  static FaultRule Short(uint32_t bytes, std::optional<IoKind> only = std::nullopt);
  static FaultRule Delay(std::chrono::nanoseconds delay);
};

class FaultInjector {
 public:
  void Add(const FaultRule& rule);
  void Clear();
  uint64_t fired() const;

  // Internal (fault-injecting backend): the first rule a request fires, counting it as fired.
  std::optional<FaultRule> Match(IoKind kind, uint64_t offset, uint32_t length);

 private:
  struct Armed {
    FaultRule rule;
    uint32_t seen = 0;   // matching requests so far
    uint32_t fired = 0;  // times fired so far
  };
  mutable std::mutex mu_;
  std::vector<Armed> rules_;
  uint64_t fired_ = 0;
};

// Wraps inner so requests go through injector. data_origin is the file offset of the store's
// data offset 0; block_size decides whether a short transfer can be run for real (aligned) or
// must be reported over a full one (unaligned counts cannot be issued with O_DIRECT).
std::unique_ptr<IoBackend> WrapWithFaults(std::unique_ptr<IoBackend> inner,
                                          std::shared_ptr<FaultInjector> injector,
                                          uint64_t data_origin, uint32_t block_size);

}  // namespace strata::storage
