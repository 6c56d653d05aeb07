// libFuzzer target: arbitrary bytes as a block-store file reopened with kOpenExisting (the
// header a store checks before it touches a file). Opening must fail cleanly, never crash,
// and never change or delete the file; a store that opens must read its first block.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"

namespace {

const std::string& Dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/strata_store_fuzz_XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) std::abort();
    return std::string(d);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = Dir() + "/fuzz.strata";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  if (size > 0 && write(fd, data, size) != ssize_t(size)) std::abort();
  close(fd);
  strata::storage::StoreOptions o;
  o.directory = Dir();
  o.file_name = "fuzz.strata";
  o.mode = strata::storage::OpenMode::kOpenExisting;
  o.keep_files = true;
  o.direct_io = false;
  o.backend = strata::storage::BackendKind::kThreadPool;
  o.queue_depth = 4;
  o.report = [](std::string_view) {};
  std::unique_ptr<strata::storage::BlockStore> store;
  if (strata::storage::BlockStore::Open(o, &store).ok()) {
    strata::storage::AlignedBuffer b;
    const uint32_t block = store->block_size();
    if (store->capacity() >= block &&
        strata::storage::AlignedBuffer::Allocate(block, 4096, &b).ok()) {
      strata::storage::IoBatch r;
      r.AddRead(0, b.data(), block, 0);
      if (store->Submit(r).ok()) (void)store->Wait(r);
    }
    store.reset();
  }
  // The file is still there, unchanged in size: a store never deletes what it did not make.
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || uint64_t(st.st_size) != size) {
    std::fprintf(stderr, "store_header_fuzzer: the input file was changed or removed\n");
    std::abort();
  }
  return 0;
}
