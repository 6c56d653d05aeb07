// Opening input files the way every reader of user-named files must: without blocking on a
// FIFO or a device, refusing anything but a regular file with a message that names the file
// and says what it is instead, and with a size limit checked before anything is read.
//
// Threads: any.
#pragma once

#include <cstdint>
#include <istream>
#include <string>

#include "common/status.h"

namespace strata {

// The most a calibration or evaluation text may hold: far beyond what a tune or a calibration
// reads, and a bound on what a wrong path (a disk image, a log) can cost in memory.
constexpr uint64_t kMaxTextBytes = uint64_t(256) << 20;

// What a stat mode names, for messages: "a directory", "a FIFO", "a character device", ...
const char* FileKindName(uint32_t mode);

// Opens `path` read-only (close-on-exec); *fd and *size receive the descriptor and the file's
// size. `what` names the file's role in messages ("model", "config file"). A directory, FIFO,
// socket or device is InvalidArgument ("config file '/dev/zero' is a character device, not a
// regular file"); a missing file NotFound.
Status OpenRegularFile(const std::string& path, const char* what, int* fd, uint64_t* size);

// The whole content of a regular file of at most max_bytes (ResourceExhausted above it, with
// the size and the limit).
Status ReadRegularFile(const std::string& path, const char* what, uint64_t max_bytes,
                       std::string* out);

// Text a person hands a command as a stream (a prompt from -f or stdin): a regular file, a
// pipe or socket, or a terminal, read to its end but never past max_bytes. Anything else (a
// directory, /dev/zero, a block device) is InvalidArgument naming `name` and what it is; more
// than max_bytes is ResourceExhausted naming the limit, found by reading at most one byte past
// it, so an endless pipe costs max_bytes of memory and no more. `name` is the source's role
// and path ("prompt file 'a.txt'", "stdin"). The descriptor stays open. With `more` given,
// a longer source is no error: *out holds its first max_bytes and *more says so.
Status ReadTextStream(int fd, const std::string& name, uint64_t max_bytes, std::string* out,
                      bool* more = nullptr);

// Opens `path` (a named pipe waits for its writer, as a pipe would) and reads it as above.
Status ReadTextFile(const std::string& path, const char* what, uint64_t max_bytes, std::string* out,
                    bool* more = nullptr);

// One line of `in` without its newline, keeping at most max_bytes of it: the rest of a longer
// line is read and dropped (so the next call starts at the next line) and *too_long is set.
// False at the end of the input with nothing read.
bool ReadLineBounded(std::istream& in, uint64_t max_bytes, std::string* line, bool* too_long);

}  // namespace strata
