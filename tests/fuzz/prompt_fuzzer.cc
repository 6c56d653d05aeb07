// libFuzzer target: the prompt and chat-line paths of `strata run`. The first input byte
// picks the byte limit; the rest is the text. It is read as a regular file and as a pipe
// through ReadTextStream (a text within the limit comes back whole, a longer one is refused
// and nothing kept), split into chat lines by ReadLineBounded (no line kept past the limit),
// and each line is sent through Session::Chat of a tiny synthetic model with a 64-token
// context: a line it cannot take (invalid UTF-8, too long) is refused and the conversation
// goes on; nothing else may fail.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/file.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic_model.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "prompt_fuzzer: %s\n", what);
  std::abort();
}

struct Tiny {
  std::unique_ptr<strata::Model> model;
  std::unique_ptr<strata::Engine> engine;
};

Tiny* MakeTiny() {
  strata::SyntheticModelSpec spec;
  spec.n_layer = 1;
  spec.n_embd = 32;
  spec.n_ff = 32;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  char path[] = "/tmp/prompt_fuzzer_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) Fail("mkstemp");
  close(fd);
  auto* t = new Tiny;
  if (!strata::WriteSyntheticModel(spec, path).ok() || !strata::Model::Load(path, &t->model).ok())
    Fail("the synthetic model");
  unlink(path);  // mapped: the file can go
  strata::EngineOptions o;
  o.n_threads = 1;
  o.n_ctx = 64;
  if (!strata::Engine::Create(*t->model, o, &t->engine).ok()) Fail("the engine");
  return t;
}

void CheckRead(const strata::Status& s, const std::string& got, const std::string& text,
               uint64_t limit) {
  if (text.size() <= limit) {
    if (!s.ok() || got != text) Fail("a text within the limit did not come back whole");
  } else if (s.code() != strata::Status::Code::kResourceExhausted || !got.empty()) {
    Fail("a text over the limit was not refused");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Tiny* tiny = MakeTiny();
  if (size == 0) return 0;
  const uint64_t limit = uint64_t(data[0]) * 16 + 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  // As a regular file.
  const int mem = memfd_create("prompt", MFD_CLOEXEC);
  if (mem < 0 || write(mem, text.data(), text.size()) != ssize_t(text.size()) ||
      lseek(mem, 0, SEEK_SET) != 0)
    Fail("memfd");
  std::string got;
  CheckRead(strata::ReadTextStream(mem, "memfd", limit, &got), got, text, limit);
  close(mem);

  // As a pipe, written from another thread while it is read.
  int p[2];
  if (pipe(p) != 0) Fail("pipe");
  std::thread writer([&] {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t w = write(p[1], text.data() + done, text.size() - done);
      if (w <= 0) break;  // the reader stopped at the limit and closed its end
      done += size_t(w);
    }
    close(p[1]);
  });
  CheckRead(strata::ReadTextStream(p[0], "pipe", limit, &got), got, text, limit);
  close(p[0]);
  writer.join();

  // As chat lines.
  std::istringstream in(text);
  std::unique_ptr<strata::Session> session;
  if (!strata::Session::Create(tiny->engine.get(), &session).ok()) Fail("session");
  strata::GenerateParams g;
  g.max_tokens = 2;
  g.sampling.temperature = 0;
  std::string line;
  bool too_long = false;
  size_t pos = 0;
  while (strata::ReadLineBounded(in, limit, &line, &too_long)) {
    if (line.size() > limit) Fail("a line kept past the limit");
    const size_t end = text.find('\n', pos);
    const std::string whole = text.substr(pos, end == std::string::npos ? end : end - pos);
    if (too_long != (whole.size() > limit) || whole.compare(0, line.size(), line) != 0)
      Fail("a line is not the text's");
    pos = end == std::string::npos ? text.size() : end + 1;
    if (too_long) continue;
    const strata::Status s = session->Chat(line, g, nullptr, nullptr, nullptr);
    if (!s.ok() && s.code() != strata::Status::Code::kInvalidArgument &&
        s.code() != strata::Status::Code::kOutOfRange)
      Fail(("a chat line failed the run: " + s.ToString()).c_str());
  }
  return 0;
}
