// Bad input around the store's file: missing or unwritable directory, full disk, files that
// belong to something else, a second store on the same file, damaged headers. Each is a clear
// error and nothing that was there before is changed or deleted.
#include "storage/store_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <vector>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"
#include "tests/storage/storage_test_util.h"
#include "tests/testing/file_modes.h"

namespace strata::storage {
namespace {

using testing::FillPattern;
using testing::MatchesPattern;
using testing::ReadWholeFile;
using testing::TempDir;
using testing::WriteWholeFile;

constexpr uint64_t kCapacity = 1 << 20;

StoreOptions Options(const std::string& dir) {
  return testing::SmallStore(dir, kCapacity, BackendKind::kAuto);
}

Status OpenWith(const StoreOptions& o, std::unique_ptr<BlockStore>* store) {
  return BlockStore::Open(o, store);
}

TEST(StoreFileTest, MissingDirectoryIsNotFoundAndNamed) {
  TempDir dir;
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(Options(dir.path() + "/nope"), &store);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find(dir.path() + "/nope"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.ToString();
}

TEST(StoreFileTest, DirectoryThatIsAFileIsRefused) {
  TempDir dir;
  WriteWholeFile(dir.path() + "/plain", "x");
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(Options(dir.path() + "/plain"), &store);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("is not a directory"), std::string::npos) << s.ToString();
}

// Runs in a child process, dropping root first where needed, since root may write anywhere.
void OpenInReadOnlyDirectory(const std::string& dir) {
  if (geteuid() == 0 && setresuid(65534, 65534, 65534) != 0) std::_Exit(2);
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(Options(dir), &store);
  if (s.ok() || s.message().find("not writable") == std::string::npos ||
      s.message().find(dir) == std::string::npos) {
    std::fprintf(stderr, "unexpected: %s\n", s.ToString().c_str());
    std::_Exit(3);
  }
  std::_Exit(0);
}

TEST(StoreFileDeathTest, UnwritableDirectoryIsAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir parent;
  chmod(parent.path().c_str(), 0755);  // the unprivileged child must reach the directory
  const std::string dir = parent.path() + "/ro";
  ASSERT_EQ(mkdir(dir.c_str(), 0555), 0);
  EXPECT_EXIT(OpenInReadOnlyDirectory(dir), ::testing::ExitedWithCode(0), "");
  chmod(dir.c_str(), 0755);
}

TEST(StoreFileTest, FullDiskIsFoundAtOpenAndLeavesNothingBehind) {
  TempDir dir;
  struct statvfs vfs {};
  ASSERT_EQ(statvfs(dir.path().c_str(), &vfs), 0);
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  StoreOptions o = Options(dir.path());
  o.capacity = free_bytes + (uint64_t{1} << 30);  // 1 GiB more than there is
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(o, &store);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("not enough space"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(dir.path()), std::string::npos) << s.ToString();
  EXPECT_EQ(dir.Listing(), "");
}

TEST(StoreFileTest, ForeignFileIsNeverTouched) {
  TempDir dir;
  const std::string path = dir.path() + "/blocks.strata";
  std::string content(10000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7);
  for (const std::string& c : {std::string(""), std::string("hello"), content}) {
    WriteWholeFile(path, c);
    struct stat before {};
    ASSERT_EQ(stat(path.c_str(), &before), 0);
    for (OpenMode mode : {OpenMode::kCreate, OpenMode::kOpenExisting, OpenMode::kOpenOrCreate}) {
      StoreOptions o = Options(dir.path());
      o.mode = mode;
      std::unique_ptr<BlockStore> store;
      const Status s = OpenWith(o, &store);
      EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
      EXPECT_EQ(ReadWholeFile(path), c);
    }
    struct stat after {};
    ASSERT_EQ(stat(path.c_str(), &after), 0);
    EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
    EXPECT_EQ(after.st_ino, before.st_ino);
  }
  EXPECT_EQ(dir.Listing(), "blocks.strata ");
}

TEST(StoreFileTest, ForeignFileSaysWhyItIsNotOurs) {
  TempDir dir;
  WriteWholeFile(dir.path() + "/blocks.strata", std::string(8192, 'z'));
  StoreOptions o = Options(dir.path());
  o.mode = OpenMode::kOpenOrCreate;
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(o, &store);
  EXPECT_NE(s.message().find("not a Strata block store"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("refusing to touch it"), std::string::npos) << s.ToString();
}

TEST(StoreFileTest, SymlinkIsNotFollowed) {
  TempDir dir;
  WriteWholeFile(dir.path() + "/target", "precious");
  ASSERT_EQ(symlink((dir.path() + "/target").c_str(), (dir.path() + "/blocks.strata").c_str()), 0);
  StoreOptions o = Options(dir.path());
  o.mode = OpenMode::kOpenOrCreate;
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(o, &store);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  EXPECT_EQ(ReadWholeFile(dir.path() + "/target"), "precious");
}

TEST(StoreFileTest, FileIsDeletedOnCloseUnlessKept) {
  TempDir dir;
  {
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(Options(dir.path()), &store).ok());
    EXPECT_EQ(dir.Listing(), "blocks.strata ");
  }
  EXPECT_EQ(dir.Listing(), "");

  StoreOptions keep = Options(dir.path());
  keep.keep_files = true;
  std::string id;
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(8192, 4096, &buf).ok());
  {
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(keep, &store).ok());
    id = store->store_id();
    FillPattern(buf.data(), 8192, 5, 5);
    ASSERT_TRUE(store->Write(8192, buf.data(), 8192).ok());
  }
  EXPECT_EQ(dir.Listing(), "blocks.strata ");
  // Reopened: same store, same data; closing without keep_files deletes it.
  StoreOptions reopen = Options(dir.path());
  reopen.mode = OpenMode::kOpenExisting;
  reopen.capacity = 0;
  {
    std::unique_ptr<BlockStore> store;
    const Status s = OpenWith(reopen, &store);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(store->store_id(), id);
    EXPECT_EQ(store->capacity(), kCapacity);
    std::memset(buf.data(), 0, 8192);
    ASSERT_TRUE(store->Read(8192, buf.data(), 8192).ok());
    EXPECT_TRUE(MatchesPattern(buf.data(), 8192, 5, 5));
  }
  EXPECT_EQ(dir.Listing(), "");
}

TEST(StoreFileTest, CreateRefusesAnExistingStoreAndOpenOrCreateReusesIt) {
  TempDir dir;
  StoreOptions o = Options(dir.path());
  o.keep_files = true;
  std::unique_ptr<BlockStore> first;
  ASSERT_TRUE(OpenWith(o, &first).ok());
  const std::string id = first->store_id();
  first.reset();
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(o, &store);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("already exists"), std::string::npos) << s.ToString();
  o.mode = OpenMode::kOpenOrCreate;
  o.keep_files = false;
  ASSERT_TRUE(OpenWith(o, &store).ok());
  EXPECT_EQ(store->store_id(), id);
  store.reset();
  EXPECT_EQ(dir.Listing(), "");
}

TEST(StoreFileTest, TwoStoresCannotShareAFile) {
  TempDir dir;
  StoreOptions o = Options(dir.path());
  std::unique_ptr<BlockStore> first;
  ASSERT_TRUE(OpenWith(o, &first).ok());
  o.mode = OpenMode::kOpenExisting;
  std::unique_ptr<BlockStore> second;
  const Status s = OpenWith(o, &second);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("in use by another store"), std::string::npos) << s.ToString();
  EXPECT_EQ(dir.Listing(), "blocks.strata ");  // the failed open deleted nothing
}

TEST(StoreFileTest, DamagedHeaderIsCorruption) {
  TempDir dir;
  StoreOptions o = Options(dir.path());
  o.keep_files = true;
  {
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(o, &store).ok());
  }
  const std::string path = dir.path() + "/blocks.strata";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x5a');  // inside the capacity field
  }
  o.mode = OpenMode::kOpenExisting;
  std::unique_ptr<BlockStore> store;
  const Status s = OpenWith(o, &store);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("CRC"), std::string::npos) << s.ToString();
  EXPECT_EQ(dir.Listing(), "blocks.strata ");
}

TEST(StoreFileTest, TruncatedStoreIsCorruptionAndCapacityMismatchIsRefused) {
  TempDir dir;
  StoreOptions o = Options(dir.path());
  o.keep_files = true;
  {
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(o, &store).ok());
  }
  const std::string path = dir.path() + "/blocks.strata";
  o.mode = OpenMode::kOpenExisting;
  o.capacity = 2 * kCapacity;
  std::unique_ptr<BlockStore> store;
  Status s = OpenWith(o, &store);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("capacity"), std::string::npos) << s.ToString();
  ASSERT_EQ(truncate(path.c_str(), 8192), 0);
  o.capacity = 0;
  s = OpenWith(o, &store);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
}

TEST(StoreFileTest, CloseDoesNotDeleteAFileThatReplacedOurs) {
  TempDir dir;
  std::unique_ptr<BlockStore> store;
  ASSERT_TRUE(OpenWith(Options(dir.path()), &store).ok());
  const std::string path = store->path();
  WriteWholeFile(dir.path() + "/other", "someone else's");
  ASSERT_EQ(rename((dir.path() + "/other").c_str(), path.c_str()), 0);
  store.reset();
  EXPECT_EQ(ReadWholeFile(path), "someone else's");
}

TEST(StoreFileTest, OptionsAreCheckedWithTheFieldNamed) {
  TempDir dir;
  struct Case {
    void (*edit)(StoreOptions&);
    const char* says;
  };
  const Case cases[] = {
      {[](StoreOptions& o) { o.directory.clear(); }, "directory"},
      {[](StoreOptions& o) { o.file_name = "a/b"; }, "file_name"},
      {[](StoreOptions& o) { o.file_name = ".."; }, "file_name"},
      {[](StoreOptions& o) { o.capacity = 0; }, "capacity"},
      {[](StoreOptions& o) { o.block_size = 3000; }, "block_size"},
      {[](StoreOptions& o) { o.queue_depth = 0; }, "queue_depth"},
      {[](StoreOptions& o) { o.device = "/dev/null"; }, "either directory or device"},
      {[](StoreOptions& o) {
         o.slow_disk.enabled = true;
         o.slow_disk.bandwidth_bytes_per_second = -1;
       },
       "bandwidth"},
      {[](StoreOptions& o) {
         o.slow_disk.enabled = true;
         o.slow_disk.requests_per_second = 0.5;
       },
       "requests_per_second 0.5"},
      {[](StoreOptions& o) {
         o.slow_disk.enabled = true;
         o.slow_disk.requests_per_second = -3;
       },
       "requests_per_second"},
  };
  for (const Case& c : cases) {
    StoreOptions o = Options(dir.path());
    c.edit(o);
    std::unique_ptr<BlockStore> store;
    const Status s = OpenWith(o, &store);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(dir.Listing(), "");
}

TEST(StoreFileTest, LargerBlockSizeIsHonouredAndEnforced) {
  TempDir dir;
  StoreOptions o = Options(dir.path());
  o.block_size = 8192;
  std::unique_ptr<BlockStore> store;
  ASSERT_TRUE(OpenWith(o, &store).ok());
  EXPECT_EQ(store->block_size(), 8192u);
  AlignedBuffer buf;
  ASSERT_TRUE(AlignedBuffer::Allocate(16384, 8192, &buf).ok());
  EXPECT_EQ(store->Read(4096, buf.data(), 8192).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(store->Read(8192, buf.data(), 8192).ok());
}

// ---- Temporary stores (KV caches): nothing may outlive the process -----------------------

// Sets STRATA_STORAGE_FORCE_FALLBACK for the scope (the named fallback of kTemporary).
class ScopedForce {
 public:
  explicit ScopedForce(const char* what) { setenv("STRATA_STORAGE_FORCE_FALLBACK", what, 1); }
  ~ScopedForce() { unsetenv("STRATA_STORAGE_FORCE_FALLBACK"); }
};

StoreOptions TemporaryOptions(const std::string& dir, std::vector<std::string>* reports) {
  StoreOptions o = Options(dir);
  o.mode = OpenMode::kTemporary;
  o.file_name = "kv";
  o.report = [reports](std::string_view m) { reports->push_back(std::string(m)); };
  return o;
}

TEST(StoreFileTest, ATemporaryStoreHasNoNameAndWorks) {
  TempDir dir;
  std::vector<std::string> reports;
  std::unique_ptr<BlockStore> store;
  ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &store).ok());
  EXPECT_TRUE(store->unnamed());
  EXPECT_EQ(dir.Listing(), "");  // no name in the directory while it is open
  EXPECT_NE(store->path().find("unnamed"), std::string::npos) << store->path();
  AlignedBuffer b;
  ASSERT_TRUE(AlignedBuffer::Allocate(4096, 4096, &b).ok());
  FillPattern(b.data(), 4096, 3, 1);
  IoBatch w;
  w.AddWrite(0, b.data(), 4096, 0);
  ASSERT_TRUE(store->Submit(w).ok());
  ASSERT_TRUE(store->Wait(w).ok());
  std::memset(b.data(), 0, 4096);
  IoBatch r;
  r.AddRead(0, b.data(), 4096, 0);
  ASSERT_TRUE(store->Submit(r).ok());
  ASSERT_TRUE(store->Wait(r).ok());
  EXPECT_TRUE(MatchesPattern(b.data(), 4096, 3, 1));
  store.reset();
  EXPECT_EQ(dir.Listing(), "");
}

TEST(StoreFileTest, WithoutOTmpfileATemporaryStoreIsNamedRandomlyAndRemovedAtClose) {
  TempDir dir;
  ScopedForce force("tmpfile");
  std::vector<std::string> reports;
  std::unique_ptr<BlockStore> a, b;
  ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &a).ok());
  ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &b).ok());
  EXPECT_FALSE(a->unnamed());
  // Two live stores: two names, neither removed by the other (each holds its lock).
  const std::string listing = dir.Listing();  // names, each followed by a space
  EXPECT_EQ(std::count(listing.begin(), listing.end(), ' '), 2) << listing;
  EXPECT_NE(a->path(), b->path());
  EXPECT_EQ(a->path().find(std::to_string(getpid())), std::string::npos) << a->path();
  EXPECT_TRUE(reports.empty());
  a.reset();
  b.reset();
  EXPECT_EQ(dir.Listing(), "");
}

// A child opens a temporary store and dies by SIGKILL, the way a crash ends a run.
void OpenAndDie(const std::string& dir) {
  std::vector<std::string> reports;
  std::unique_ptr<BlockStore> store;
  if (!OpenWith(TemporaryOptions(dir, &reports), &store).ok()) std::_Exit(3);
  raise(SIGKILL);
}

TEST(StoreFileTest, AKilledRunLeavesNothingOrItsFileIsRemovedByTheNextRun) {
  for (const char* force : {"", "tmpfile"}) {
    SCOPED_TRACE(std::string("forced fallback: '") + force + "'");
    TempDir dir;
    ScopedForce f(force);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) OpenAndDie(dir.path());
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    // Unnamed: nothing at all. Named: the dead run's file, until the next store comes.
    std::string left = dir.Listing();
    EXPECT_EQ(left.empty(), *force == '\0') << left;
    if (!left.empty()) {
      left.pop_back();  // the listing's trailing space
      // The dead process's io_uring may hold the file (and its lock) a moment longer: its
      // teardown is asynchronous. A later run finds it free.
      const int fd = open((dir.path() + "/" + left).c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      for (int i = 0; i < 500 && flock(fd, LOCK_EX | LOCK_NB) != 0; ++i) usleep(10000);
      flock(fd, LOCK_UN);
      close(fd);
    }
    // A file of someone else's with a name like ours but no store header stays.
    WriteWholeFile(dir.path() + "/kv-0123456789abcdef0123456789abcdef.strata", "not a store");
    std::vector<std::string> reports;
    std::unique_ptr<BlockStore> next;
    ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &next).ok());
    if (*force != '\0') {
      ASSERT_EQ(reports.size(), 1u);
      EXPECT_NE(reports[0].find(left), std::string::npos) << reports[0];
      EXPECT_NE(reports[0].find("left behind"), std::string::npos) << reports[0];
    } else {
      EXPECT_TRUE(reports.empty());
    }
    next.reset();
    EXPECT_EQ(dir.Listing(), "kv-0123456789abcdef0123456789abcdef.strata ");
  }
}

TEST(StoreFileTest, AKeptStoreWithATemporaryLookingNameIsNotRemoved) {
  TempDir dir;
  StoreOptions keep = Options(dir.path());
  keep.file_name = "kv-123-4.strata";  // an earlier version's KV name, but kept on purpose
  keep.keep_files = true;
  {
    std::unique_ptr<BlockStore> s;
    ASSERT_TRUE(OpenWith(keep, &s).ok());
    // Held open: a temporary store beside it must not touch it.
    std::vector<std::string> reports;
    std::unique_ptr<BlockStore> t;
    ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &t).ok());
    EXPECT_TRUE(reports.empty());
  }
  EXPECT_EQ(dir.Listing(), "kv-123-4.strata ");
}

// ---- File modes: a store holds a KV cache, readable by its owner only --------------------

using strata::testing::ModesOfOpenFilesIn;
using strata::testing::OctalMode;
using strata::testing::ScopedUmask;

std::string ModeOfPath(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? OctalMode(st.st_mode & 07777) : "(no file)";
}

// 0 and 022 would leave a file created 0644 readable by everyone; 0277 would leave one
// created 0600 without its owner's write bit.
constexpr mode_t kUmasks[] = {0, 022, 0277};

TEST(StoreFileTest, AnUnnamedTemporaryStoreIsOwnerOnlyWhateverTheUmask) {
  for (const mode_t mask : kUmasks) {
    SCOPED_TRACE("umask " + OctalMode(mask));
    TempDir dir;
    ScopedUmask um(mask);
    std::vector<std::string> reports;
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &store).ok());
    if (!store->unnamed())
      GTEST_SKIP() << "the filesystem of " << dir.path() << " has no O_TMPFILE";
    const std::vector<mode_t> modes = ModesOfOpenFilesIn(dir.path());
    ASSERT_EQ(modes.size(), 1u);
    EXPECT_EQ(OctalMode(modes[0]), "0600");
    EXPECT_TRUE(reports.empty());
  }
}

TEST(StoreFileTest, ANamedTemporaryStoreIsOwnerOnlyWhateverTheUmask) {
  for (const mode_t mask : kUmasks) {
    SCOPED_TRACE("umask " + OctalMode(mask));
    TempDir dir;
    ScopedForce force("tmpfile");
    ScopedUmask um(mask);
    std::vector<std::string> reports;
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(TemporaryOptions(dir.path(), &reports), &store).ok());
    ASSERT_FALSE(store->unnamed());
    EXPECT_EQ(ModeOfPath(store->path()), "0600") << store->path();
    const std::vector<mode_t> modes = ModesOfOpenFilesIn(dir.path());
    ASSERT_EQ(modes.size(), 1u);
    EXPECT_EQ(OctalMode(modes[0]), "0600");
    EXPECT_TRUE(reports.empty());
  }
}

TEST(StoreFileTest, ACreatedStoreIsOwnerOnlyWhateverTheUmask) {
  for (const mode_t mask : kUmasks) {
    SCOPED_TRACE("umask " + OctalMode(mask));
    TempDir dir;
    ScopedUmask um(mask);
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(Options(dir.path()), &store).ok());
    EXPECT_EQ(ModeOfPath(dir.path() + "/blocks.strata"), "0600");
  }
}

TEST(StoreFileTest, AReopenedKeptStoreBecomesOwnerOnly) {
  TempDir dir;
  StoreOptions keep = Options(dir.path());
  keep.keep_files = true;
  const std::string path = dir.path() + "/blocks.strata";
  {
    std::unique_ptr<BlockStore> store;
    ASSERT_TRUE(OpenWith(keep, &store).ok());
  }
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);  // as an earlier version made it
  keep.mode = OpenMode::kOpenExisting;
  keep.capacity = 0;
  std::unique_ptr<BlockStore> store;
  ASSERT_TRUE(OpenWith(keep, &store).ok());
  EXPECT_EQ(ModeOfPath(path), "0600");
  store.reset();
  // A file that is not a store is refused untouched, its mode included.
  WriteWholeFile(dir.path() + "/other", std::string(8192, 'x'));
  ASSERT_EQ(chmod((dir.path() + "/other").c_str(), 0644), 0);
  keep.file_name = "other";
  EXPECT_FALSE(OpenWith(keep, &store).ok());
  EXPECT_EQ(ModeOfPath(dir.path() + "/other"), "0644");
}

}  // namespace
}  // namespace strata::storage
