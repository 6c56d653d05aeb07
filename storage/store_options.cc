#include "storage/store_options.h"

#include <bit>
#include <cstdlib>

namespace strata::storage {

Status StoreOptions::Validate() const {
  const bool use_device = !device.empty();
  if (!use_device && directory.empty()) {
    return Status::InvalidArgument("StoreOptions: set directory (or device)");
  }
  if (use_device && !directory.empty()) {
    return Status::InvalidArgument("StoreOptions: set either directory or device, not both");
  }
  if (!use_device) {
    if (file_name.empty() || file_name == "." || file_name == ".." ||
        file_name.find('/') != std::string::npos) {
      return Status::InvalidArgument("StoreOptions.file_name '" + file_name +
                                     "' must be a plain file name (no '/', not '.' or '..')");
    }
    // The temporary name used while creating adds about 30 characters.
    if (file_name.size() > 200) {
      return Status::InvalidArgument("StoreOptions.file_name is " +
                                     std::to_string(file_name.size()) +
                                     " characters long; the limit is 200");
    }
  }
  if ((mode == OpenMode::kCreate || mode == OpenMode::kTemporary) && capacity == 0 && !use_device) {
    return Status::InvalidArgument("StoreOptions.capacity is 0; a new store needs its size");
  }
  if (mode == OpenMode::kTemporary && use_device) {
    return Status::InvalidArgument(
        "StoreOptions: a temporary store lives in a directory, not on "
        "a device");
  }
  if (block_size != 0 && (!std::has_single_bit(block_size) || block_size > 65536)) {
    return Status::InvalidArgument("StoreOptions.block_size " + std::to_string(block_size) +
                                   " must be 0 or a power of two up to 65536");
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::InvalidArgument("StoreOptions.queue_depth " + std::to_string(queue_depth) +
                                   " is outside [1, 4096]");
  }
  if (fallback_threads > 1024) {
    return Status::InvalidArgument("StoreOptions.fallback_threads " +
                                   std::to_string(fallback_threads) + " is above 1024");
  }
  if (sq_poll && sq_poll_idle_ms == 0) {
    return Status::InvalidArgument("StoreOptions.sq_poll_idle_ms must be > 0 with sq_poll");
  }
  if (io_timeout.count() < 0) {
    return Status::InvalidArgument("StoreOptions.io_timeout " + std::to_string(io_timeout.count()) +
                                   " ms is negative");
  }
  STRATA_RETURN_IF_ERROR(slow_disk.Validate());
  return Status::OK();
}

std::string ForcedFallback() {
  const char* v = std::getenv("STRATA_STORAGE_FORCE_FALLBACK");
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace strata::storage
