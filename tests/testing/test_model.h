// Helpers shared by the test suites: where the real model lives, temporary files, status
// assertions.
//
// The real model (SmolLM2-135M-Instruct Q4_1) is found through $STRATA_TEST_MODEL, else
// $STRATA_HOME or ~/.cache/strata. When it is missing the test FAILS (it must not skip: CI
// fetches the model first) and says how to fetch it.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "common/status.h"

namespace strata::testing {

inline std::string RealModelPath() {
  if (const char* p = std::getenv("STRATA_TEST_MODEL"); p && *p) return p;
  std::string home;
  if (const char* h = std::getenv("STRATA_HOME"); h && *h) {
    home = h;
  } else {
    const char* u = std::getenv("HOME");
    home = std::string(u ? u : ".") + "/.cache/strata";
  }
  return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Source tree root (for fixtures); tests/CMakeLists.txt defines it for every test.
inline std::string SourceDir() { return STRATA_SOURCE_DIR; }

// A path under the test temp dir that is removed when the object goes away.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_(::testing::TempDir() + "strata_" + std::to_string(::getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace strata::testing

// Fails the current test (fatally) when the real model is not present.
#define STRATA_REQUIRE_REAL_MODEL(path_var)                        \
  const std::string path_var = ::strata::testing::RealModelPath(); \
  ASSERT_TRUE(std::filesystem::exists(path_var))                   \
      << "the real model " << path_var                             \
      << " is missing: run scripts/fetch_model.sh (or set STRATA_TEST_MODEL)"

#define STRATA_ASSERT_OK(expr)             \
  do {                                     \
    ::strata::Status s_ = (expr);          \
    ASSERT_TRUE(s_.ok()) << s_.ToString(); \
  } while (0)
