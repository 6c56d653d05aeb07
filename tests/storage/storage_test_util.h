// Helpers shared by the storage tests: a temporary directory under $TMPDIR, deterministic
// byte patterns that name the block and generation they were written for, and whether this
// machine lets a process use io_uring at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "storage/block_store.h"

namespace strata::storage::testing {

// mkdtemp under $TMPDIR (or /tmp); removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Names of the entries in the directory, sorted.
  std::string Listing() const;

 private:
  std::string path_;
};

// Fills/checks n bytes with a pattern derived from (key, generation): a read that returns
// another block's bytes, an older generation or zeros fails the check.
void FillPattern(void* p, size_t n, uint64_t key, uint64_t generation);
bool MatchesPattern(const void* p, size_t n, uint64_t key, uint64_t generation);

// "" when io_uring_setup works in this process; otherwise why not (e.g. seccomp in CI).
std::string UringRefusal();

// Options for a small store in dir with the given backend and the report line captured.
StoreOptions SmallStore(const std::string& dir, uint64_t capacity, BackendKind backend);

// Test-name suffix for suites parameterized by backend.
std::string BackendParamName(const ::testing::TestParamInfo<BackendKind>& param);

std::string ReadWholeFile(const std::string& path);
void WriteWholeFile(const std::string& path, const std::string& content);

}  // namespace strata::storage::testing
