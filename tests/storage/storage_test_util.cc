#include "tests/storage/storage_test_util.h"

#include <ftw.h>
#include <liburing.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace strata::storage::testing {
namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) { return remove(path); }

uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

TempDir::TempDir(const std::string& parent) {
  std::string base = parent;
  if (base.empty()) {
    const char* t = std::getenv("TMPDIR");
    base = (t != nullptr && *t != '\0') ? t : "/tmp";
  }
  std::string tmpl = base + "/strata-storage-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + base);
  path_ = buf.data();
}

TempDir::~TempDir() { nftw(path_.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS); }

std::string TempDir::Listing() const {
  std::vector<std::string> names;
  if (DIR* d = opendir(path_.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += n + " ";
  return out;
}

void FillPattern(void* p, size_t n, uint64_t key, uint64_t generation) {
  auto* bytes = static_cast<unsigned char*>(p);
  uint64_t state = Mix(key * 0x100000001B3ull ^ generation);
  for (size_t i = 0; i < n; i += 8) {
    state = Mix(state);
    std::memcpy(bytes + i, &state, std::min<size_t>(8, n - i));
  }
}

bool MatchesPattern(const void* p, size_t n, uint64_t key, uint64_t generation) {
  std::vector<unsigned char> expect(n);
  FillPattern(expect.data(), n, key, generation);
  return std::memcmp(expect.data(), p, n) == 0;
}

std::string UringRefusal() {
  io_uring ring;
  const int r = io_uring_queue_init(4, &ring, 0);
  if (r < 0) return std::string("io_uring_setup: ") + std::strerror(-r);
  io_uring_queue_exit(&ring);
  return "";
}

StoreOptions SmallStore(const std::string& dir, uint64_t capacity, BackendKind backend) {
  StoreOptions o;
  o.directory = dir;
  o.capacity = capacity;
  o.backend = backend;
  o.queue_depth = 16;
  o.report = [](std::string_view) {};
  return o;
}

std::string BackendParamName(const ::testing::TestParamInfo<BackendKind>& param) {
  return param.param == BackendKind::kUring ? "IoUring" : "PreadPool";
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteWholeFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

}  // namespace strata::storage::testing
