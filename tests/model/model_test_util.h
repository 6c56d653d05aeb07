// Helpers shared by the model tests: where the real model lives, temporary files.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "common/status.h"

namespace strata::testing_model {

// $STRATA_TEST_MODEL, else $STRATA_HOME (or ~/.cache/strata)/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string RealModelPath() {
  if (const char* p = std::getenv("STRATA_TEST_MODEL"); p != nullptr && *p) return p;
  std::string home;
  if (const char* h = std::getenv("STRATA_HOME"); h != nullptr && *h) {
    home = h;
  } else {
    const char* user_home = std::getenv("HOME");
    home = std::string(user_home ? user_home : "") + "/.cache/strata";
  }
  return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool FileExists(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f != nullptr) std::fclose(f);
  return f != nullptr;
}

// Fails the calling test (never skips) when the real model is missing.
#define STRATA_MODEL_REQUIRE_REAL(path_var)                              \
  const std::string path_var = ::strata::testing_model::RealModelPath(); \
  ASSERT_TRUE(::strata::testing_model::FileExists(path_var))             \
      << "real model not found at " << path_var                          \
      << "; run scripts/fetch_model.sh (or set STRATA_TEST_MODEL to the .gguf file)"

// A path under the test temp dir that is removed when the object goes away.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_(::testing::TempDir() + "strata_model_" + std::to_string(::getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

#define STRATA_ASSERT_OK(expr)             \
  do {                                     \
    ::strata::Status s_ = (expr);          \
    ASSERT_TRUE(s_.ok()) << s_.ToString(); \
  } while (0)

}  // namespace strata::testing_model
