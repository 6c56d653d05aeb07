// What the C API's translation units share: the handle structs behind strata.h's opaque types
// and the thread-local last-error message. Internal to libstrata; never installed.
#pragma once

#include <memory>
#include <string>

#include "runtime/engine/engine.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"

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
}  // namespace strata::api
