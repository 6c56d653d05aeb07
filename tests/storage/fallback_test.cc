// The pread fallback is taken, works, and is reported once when io_uring or O_DIRECT is
// refused: through the environment seam, and for real by a seccomp filter that makes
// io_uring_setup fail with EPERM (Docker's default profile) or ENOSYS (old kernels,
// qemu-user) in a child process.
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"
#include "tests/storage/storage_test_util.h"

namespace strata::storage {
namespace {

using testing::FillPattern;
using testing::MatchesPattern;
using testing::TempDir;

constexpr uint64_t kCapacity = 1 << 20;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

struct Opened {
  std::unique_ptr<BlockStore> store;
  std::vector<std::string> reports;
  Status status;
};

std::unique_ptr<Opened> OpenAuto(const std::string& dir) {
  auto out = std::make_unique<Opened>();
  StoreOptions o = testing::SmallStore(dir, kCapacity, BackendKind::kAuto);
  Opened* raw = out.get();
  o.report = [raw](std::string_view line) { raw->reports.emplace_back(line); };
  out->status = BlockStore::Open(o, &out->store);
  return out;
}

// Round trip that proves the store is usable.
bool RoundTrip(BlockStore& store) {
  AlignedBuffer a, b;
  if (!AlignedBuffer::Allocate(8192, 4096, &a).ok() ||
      !AlignedBuffer::Allocate(8192, 4096, &b).ok()) {
    return false;
  }
  FillPattern(a.data(), 8192, 77, 3);
  return store.Write(4096, a.data(), 8192).ok() && store.Read(4096, b.data(), 8192).ok() &&
         MatchesPattern(b.data(), 8192, 77, 3);
}

TEST(FallbackTest, ForcedIoUringRefusalFallsBackAndReportsOnce) {
  ScopedEnv env("STRATA_STORAGE_FORCE_FALLBACK", "io_uring");
  TempDir dir;
  auto o = OpenAuto(dir.path());
  ASSERT_TRUE(o->status.ok()) << o->status.ToString();
  EXPECT_FALSE(o->store->uses_io_uring());
  EXPECT_TRUE(o->store->direct_io());
  EXPECT_NE(o->store->fallback_reason().find("io_uring"), std::string::npos);
  EXPECT_NE(o->store->fallback_reason().find("errno 1"), std::string::npos)
      << o->store->fallback_reason();
  ASSERT_EQ(o->reports.size(), 1u);
  EXPECT_NE(o->reports[0].find(o->store->fallback_reason()), std::string::npos);
  EXPECT_NE(o->reports[0].find("pread/pwrite pool"), std::string::npos) << o->reports[0];
  EXPECT_TRUE(RoundTrip(*o->store));
  EXPECT_EQ(o->reports.size(), 1u);  // once, not per request
  EXPECT_EQ(o->store->counters().fallback_reason, o->store->fallback_reason());
}

TEST(FallbackTest, ForcedRefusalMakesAnExplicitIoUringStoreFail) {
  ScopedEnv env("STRATA_STORAGE_FORCE_FALLBACK", "io_uring");
  TempDir dir;
  std::unique_ptr<BlockStore> store;
  const Status s =
      BlockStore::Open(testing::SmallStore(dir.path(), kCapacity, BackendKind::kUring), &store);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("io_uring"), std::string::npos) << s.ToString();
  EXPECT_EQ(dir.Listing(), "");  // the half-made store is gone
}

TEST(FallbackTest, ForcedDirectIoRefusalUsesThePageCacheThroughThePool) {
  ScopedEnv env("STRATA_STORAGE_FORCE_FALLBACK", "direct");
  TempDir dir;
  auto o = OpenAuto(dir.path());
  ASSERT_TRUE(o->status.ok()) << o->status.ToString();
  EXPECT_FALSE(o->store->uses_io_uring());
  EXPECT_FALSE(o->store->direct_io());
  EXPECT_NE(o->store->fallback_reason().find("O_DIRECT"), std::string::npos);
  ASSERT_EQ(o->reports.size(), 1u);
  EXPECT_TRUE(RoundTrip(*o->store));
}

TEST(FallbackTest, UnknownForceValueIsAnError) {
  ScopedEnv env("STRATA_STORAGE_FORCE_FALLBACK", "iouring");
  TempDir dir;
  auto o = OpenAuto(dir.path());
  EXPECT_EQ(o->status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(o->status.message().find("iouring"), std::string::npos);
}

TEST(FallbackTest, TmpfsWorksAndSaysWhetherItUsesDirectIo) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm (tmpfs) here";
  TempDir dir("/dev/shm");
  auto o = OpenAuto(dir.path());
  ASSERT_TRUE(o->status.ok()) << o->status.ToString();
  // Kernels before 6.6 refuse O_DIRECT on tmpfs: then the pool must be used and said so.
  if (o->store->direct_io()) {
    const bool uring = testing::UringRefusal().empty();
    EXPECT_EQ(o->store->uses_io_uring(), uring);
    EXPECT_EQ(o->store->fallback_reason().empty(), uring) << o->store->fallback_reason();
    EXPECT_EQ(o->reports.size(), uring ? 0u : 1u);
  } else {
    EXPECT_FALSE(o->store->uses_io_uring());
    EXPECT_NE(o->store->fallback_reason().find("O_DIRECT"), std::string::npos);
    EXPECT_EQ(o->reports.size(), 1u);
  }
  EXPECT_TRUE(RoundTrip(*o->store));
}

// Makes io_uring_setup fail with `err` for this process and its future threads.
bool RefuseIoUringSetup(int err) {
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
  return false;
#endif
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K,
               SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Runs in a forked child: exits 0 when the store fell back for the expected reason.
void OpenUnderSeccomp(int err, const char* expect) {
  if (!RefuseIoUringSetup(err)) {
    std::fprintf(stderr, "could not install the seccomp filter\n");
    std::_Exit(2);
  }
  TempDir dir;
  auto o = OpenAuto(dir.path());
  if (!o->status.ok()) {
    std::fprintf(stderr, "open failed: %s\n", o->status.ToString().c_str());
    std::_Exit(3);
  }
  const std::string& why = o->store->fallback_reason();
  if (o->store->uses_io_uring() || why.find("io_uring_setup") == std::string::npos ||
      why.find(expect) == std::string::npos || o->reports.size() != 1 || !RoundTrip(*o->store)) {
    std::fprintf(stderr, "unexpected: uring=%d reason='%s' reports=%zu\n",
                 o->store->uses_io_uring(), why.c_str(), o->reports.size());
    std::_Exit(4);
  }
  o.reset();
  std::_Exit(0);
}

TEST(FallbackDeathTest, SeccompEpermOnIoUringSetupFallsBack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(OpenUnderSeccomp(EPERM, "errno 1)"), ::testing::ExitedWithCode(0), "");
}

TEST(FallbackDeathTest, EnosysOnIoUringSetupFallsBack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(OpenUnderSeccomp(ENOSYS, "errno 38)"), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace strata::storage
