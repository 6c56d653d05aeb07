// Opening input files the way every reader of user-named files must: without blocking on a
// FIFO or a device, refusing anything but a regular file with a message that names the file
// and says what it is instead, and with a size limit checked before anything is read.
//
// Threads: any.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

// Opens `path` read-only (close-on-exec); *fd and *size receive the descriptor and the file's
// size. `what` names the file's role in messages ("model", "config file"). A directory, FIFO,
// socket or device is InvalidArgument ("config file '/dev/zero' is a character device, not a
// regular file"); a missing file NotFound.
Status OpenRegularFile(const std::string& path, const char* what, int* fd, uint64_t* size);

// The whole content of a regular file of at most max_bytes (ResourceExhausted above it, with
// the size and the limit).
Status ReadRegularFile(const std::string& path, const char* what, uint64_t max_bytes,
                       std::string* out);

}  // namespace strata
