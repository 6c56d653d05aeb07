// Runs fio as a subprocess on the benchmark's own store file with the same block size, queue
// depth, O_DIRECT and duration, so its numbers are the reference the store is held to.
//
// Single-threaded; fio must be on PATH (Debian package `fio`).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "storage/random_read.h"

namespace strata::bench {

using storage::ReadPoint;

struct FioJob {
  std::string file;
  uint64_t offset = 0;  // where the store's data starts (its header precedes it)
  uint64_t size = 0;    // the store's data capacity
  uint32_t block = 0;
  uint32_t depth = 0;
  double seconds = 0;
};

// The exact command line, as printed with the results.
std::string FioCommand(const FioJob& job);
// "fio-3.33", or an error when fio cannot be run.
Status FioVersion(std::string* version);
Status RunFio(const FioJob& job, ReadPoint* out);

}  // namespace strata::bench
