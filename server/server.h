// `strata serve`'s HTTP front: an OpenAI-compatible API (chat and text completions, streamed
// or whole; the model list; health; Prometheus metrics) over cpp-httplib, feeding the
// continuous-batching Scheduler. HTTP threads parse, render the chat template, tokenize and
// validate; only the scheduler thread touches the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "runtime/engine/engine.h"

namespace strata::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0: any free port (port() says which)
  std::string api_key;       // non-empty: all but /health need "Authorization: Bearer KEY"
  int32_t slots = 4;         // requests served at once (engine sequences)
  int32_t max_waiting = 64;  // requests waiting for a slot before 503
  size_t max_body_bytes = size_t(8) << 20;
  // A client that sends or reads nothing for this long is dropped; keep-alive connections
  // idle for keep_alive_s are closed (which also bounds how long shutdown waits for them).
  int timeout_s = 60;
  int keep_alive_s = 2;
  std::string model_path;   // /v1/models lists its file name without ".gguf"
  GenerateParams defaults;  // what a request that sets no sampling field gets
};

class Server {
 public:
  // `engine` must allow options.slots sequences; it is driven by the scheduler thread from
  // Run until Run returns.
  Server(Engine* engine, ServerOptions options);
  ~Server();

  // Binds the listening socket; after it, port() is the bound port.
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop(); returns once the scheduler and every HTTP thread have ended.
  Status Run();
  // Refuses new requests, ends the running ones (streams get an error event) and makes Run
  // return. Thread-safe and idempotent. A Stop that races Run's start of listening can be
  // missed by the HTTP library: a caller that must not hang repeats it until Run returns.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = -1;
};

}  // namespace strata::server
