// Files of the tuner's work directory (tuner/quality.h, tuner/kv_replay.h): captures of the
// model's K/V and results measured on the evaluation text, which are the model's activations
// on that text. They are created readable and writable by their owner only (0600, the
// directory 0700), whatever the umask, and a file rewritten whole goes through a temporary
// file renamed over it, so a reader finds the old content or the new, never a mix.
//
// Threads: any (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

// FNV-1a 64 of n bytes from `h` on: what a work file's record carries to tell a whole
// record from one cut short or altered.
uint64_t Fnv1a64(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// Creates `dir` (and its missing parents, those with the usual mode) with mode 0700 when it
// does not exist; an existing one is left as it is.
Status MakeWorkDir(const std::string& dir);

// Writes the parts, in order, to path + ".tmp" (mode 0600) and renames it to `path`;
// `sync`: flushed to the device before the rename. The temporary file is removed on failure.
Status ReplaceWorkFile(const std::string& path, std::span<const std::string_view> parts, bool sync);

// Appends `data` to `path`, created with mode 0600 when missing (an existing file is set to
// 0600: files of older versions were created with the umask's mode).
Status AppendWorkFile(const std::string& path, std::string_view data);

}  // namespace strata
