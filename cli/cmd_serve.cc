// strata serve: the OpenAI-compatible HTTP server (server/) over one engine.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cli/cli.h"
#include "common/file.h"
#include "server/server.h"

namespace strata::cli {
namespace {

struct ServeFlags {
  CommonFlags common;
  std::string host = "127.0.0.1";
  int port = 8080;
  int32_t parallel = 4;
  int32_t queue = 64;
  std::string api_key, api_key_file;
  CLI::Option *key_opt = nullptr, *key_file_opt = nullptr;
};

// The key file holds the key on its first line; a trailing newline (as `echo` writes) is not
// part of it.
Status ReadApiKey(const std::string& path, std::string* key) {
  STRATA_RETURN_IF_ERROR(ReadTextFile(path, "API key file", 4096, key));
  const size_t end = key->find_first_of("\r\n");
  if (end != std::string::npos) key->resize(end);
  if (key->empty()) return Status::InvalidArgument("API key file " + path + " holds no key");
  return Status::OK();
}

// The last SIGINT or SIGTERM received, 0 for none. The handler only records it: stopping the
// server joins threads and takes locks, which a handler may not do, so a watcher thread
// polls this. A handler rather than a blocked mask with sigwait, because threads started
// before the subcommand runs (a GPU runtime's) would not have the signals blocked and would
// take the default action, ending the process at once. A lock-free atomic rather than a
// volatile sig_atomic_t: it is read on another thread than the handler's (TSan says so).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free int");
extern "C" void OnStopSignal(int sig) { g_stop_signal.store(sig); }

// Routes SIGINT and SIGTERM to OnStopSignal for the guard's life.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa = {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

Status Serve(const ServeFlags& f) {
  if (f.parallel < 1 || f.parallel > 256)
    return Status::InvalidArgument("--parallel: " + std::to_string(f.parallel) +
                                   " is out of range [1, 256]");
  if (f.queue < 0 || f.queue > 4096)
    return Status::InvalidArgument("--queue: " + std::to_string(f.queue) +
                                   " is out of range [0, 4096]");
  if (f.port < 0 || f.port > 65535)
    return Status::InvalidArgument("--port: " + std::to_string(f.port) +
                                   " is out of range [0, 65535] (0 = any free port)");
  if (f.key_opt->count() && f.key_file_opt->count())
    return Status::InvalidArgument("--api-key and --api-key-file are alternatives: give one");
  std::string key = f.api_key;
  if (f.key_file_opt->count()) STRATA_RETURN_IF_ERROR(ReadApiKey(f.api_key_file, &key));
  if (f.key_opt->count() && key.empty())
    return Status::InvalidArgument("--api-key is empty: give a key, or leave the flag out");

  const StopSignals signals;
  // A client gone mid-write must fail that write, not end the process.
  signal(SIGPIPE, SIG_IGN);

  Config cfg;
  STRATA_RETURN_IF_ERROR(ResolveConfig(f.common, &cfg, f.parallel));
  cfg.engine.max_sequences = std::max(cfg.engine.max_sequences, f.parallel);
  std::string path;
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadConfiguredModel(f.common, cfg, &path, &model));

  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(*model, cfg.engine, &engine));
  // Every decoding slot is one row of the decode pass.
  if (f.parallel > engine->forward().max_tokens())
    return Status::InvalidArgument("--parallel: " + std::to_string(f.parallel) +
                                   " slots exceed the " +
                                   std::to_string(engine->forward().max_tokens()) +
                                   " tokens a forward pass takes (--batch, the KV policy's limit)");
  server::ServerOptions o;
  o.host = f.host;
  o.port = f.port;
  o.api_key = key;
  o.slots = f.parallel;
  o.max_waiting = f.queue;
  o.model_path = path;
  o.defaults = cfg.generate;
  server::Server server(engine.get(), o);
  STRATA_RETURN_IF_ERROR(server.Bind());
  std::fprintf(stderr, "strata serve: %s, %d slots, context %d; listening on http://%s:%d\n",
               path.c_str(), f.parallel, engine->options().n_ctx, f.host.c_str(), server.port());

  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    bool stopping = false;
    while (!finished.load()) {
      const int sig = g_stop_signal.load();
      if (sig != 0 && !stopping) {
        std::fprintf(stderr, "strata serve: %s: shutting down\n", strsignal(sig));
        stopping = true;
      }
      // Repeated until Run returns: a stop that races the listener's start is not lost.
      if (stopping) server.Stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const Status s = server.Run();
  finished.store(true);
  watcher.join();
  return s;
}

}  // namespace

void AddServeCommand(CLI::App* app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd =
      app->add_subcommand("serve", "serve the model over an OpenAI-compatible HTTP API");
  AddCommonFlags(cmd, &f->common);
  FlagModes& modes = FlagModes::Of(cmd);
  const std::string gen = FlagModes::kGeneral;
  modes.Put(gen, cmd->add_option("--host", f->host, "address to listen on")->capture_default_str());
  modes.Put(gen, cmd->add_option("--port", f->port, "TCP port; 0 = any free one (printed)")
                     ->capture_default_str());
  modes.Put(gen, cmd->add_option("--parallel", f->parallel,
                                 "requests decoded together (slots, each an engine sequence)")
                     ->capture_default_str());
  modes.Put(gen, cmd->add_option("--queue", f->queue,
                                 "requests that may wait for a slot; beyond them, 503")
                     ->capture_default_str());
  f->key_opt = modes.Put(
      gen,
      cmd->add_option("--api-key", f->api_key,
                      "require \"Authorization: Bearer KEY\" on all but /health (visible in ps: "
                      "prefer --api-key-file)"));
  f->key_file_opt = modes.Put(
      gen, cmd->add_option("--api-key-file", f->api_key_file, "read the API key from a file"));
  cmd->callback([f] {
    Status s = Serve(*f);
    if (!s.ok()) ExitCode() = ReportError("serve", s);
  });
}

}  // namespace strata::cli
