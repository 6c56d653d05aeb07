// Helpers for tests that need the real model (SmolLM2-135M-Instruct Q4_1) or temp files.
//
// The real model is found through $STRATA_TEST_MODEL, else $STRATA_HOME or
// ~/.cache/strata. When it is missing the test FAILS (it must not skip: CI fetches the
// model first) and says how to fetch it.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

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

// Source tree root (for fixtures), set by CMake.
inline std::string SourceDir() { return STRATA_SOURCE_DIR; }

}  // namespace strata::testing

// Fails the current test (fatally) when the real model is not present.
#define STRATA_REQUIRE_REAL_MODEL(path_var)                        \
  const std::string path_var = ::strata::testing::RealModelPath(); \
  ASSERT_TRUE(std::filesystem::exists(path_var))                   \
      << "the real model " << path_var                             \
      << " is missing: run scripts/fetch_model.sh (or set STRATA_TEST_MODEL)"
