// What the C API's translation units share: the handle structs behind strata.h's opaque types
// and the thread-local last-error message. Internal to libstrata; never installed.
#pragma once

#include <memory>
#include <string>

#include "runtime/engine/engine.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "strata/strata.h"

struct strata_model {
  std::unique_ptr<strata::Model> model;
};
struct strata_engine {
  std::unique_ptr<strata::Engine> engine;
};
struct strata_session {
  std::unique_ptr<strata::Session> session;
  strata::GenerationStats stats;
  strata::StopReason stop = strata::StopReason::kNone;
};

namespace strata::api {
// Sets what strata_last_error() returns on this thread.
void SetLastError(std::string message);

// The argument rules of strata.h ("Arguments"), one implementation for every entry point.
// Each returns STRATA_OK, or sets the last error to a message that names the function `fn`
// and the argument (and its count) and returns STRATA_ERR_INVALID_ARGUMENT.
//
// A pointer the function cannot do without: a handle, an input, an out parameter.
strata_status CheckRequired(const char* fn, const char* name, const void* ptr);
// An array and its element count: NULL only with a count of 0; a count above PTRDIFF_MAX is
// a negative number converted to size_t and is refused whatever the pointer.
strata_status CheckArray(const char* fn, const char* name, const void* ptr, const char* count_name,
                         size_t count);
// An array of strings and its count, as CheckArray, and no element NULL.
strata_status CheckStrings(const char* fn, const char* name, const char* const* ptr,
                           const char* count_name, size_t count);
// The pointer/count pairs inside strata_generate_params (NULL params: the defaults, fine).
strata_status CheckGenerateParams(const char* fn, const strata_generate_params* params);
}  // namespace strata::api

// Returns from the calling entry point when a check fails.
#define STRATA_C_CHECK(check)                                                    \
  do {                                                                           \
    if (const strata_status check_status_ = (check); check_status_ != STRATA_OK) \
      return check_status_;                                                      \
  } while (0)
// The usual forms, naming the argument as it is spelled in the call.
#define STRATA_C_REQUIRE_ARG(ptr) STRATA_C_CHECK(::strata::api::CheckRequired(__func__, #ptr, ptr))
#define STRATA_C_CHECK_ARRAY(ptr, count) \
  STRATA_C_CHECK(::strata::api::CheckArray(__func__, #ptr, ptr, #count, count))
#define STRATA_C_CHECK_STRINGS(ptr, count) \
  STRATA_C_CHECK(::strata::api::CheckStrings(__func__, #ptr, ptr, #count, count))
