// The store on a raw block device (a loop device over a temporary file): a device without a
// store header is refused untouched unless claim_device is set; a claimed device reopens as
// the same store; devices are never deleted. Needs root and /dev/loop-control (the 2-core
// AMD EPYC, Zen 4 class, it was written on has both); elsewhere it says why it cannot run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "storage/aligned_buffer.h"
#include "storage/block_store.h"
#include "tests/storage/storage_test_util.h"

namespace strata::storage {
namespace {

using testing::FillPattern;
using testing::MatchesPattern;
using testing::ReadWholeFile;
using testing::TempDir;
using testing::WriteWholeFile;

constexpr size_t kDeviceBytes = 8 << 20;

// A loop device over a file, detached on destruction.
class LoopDevice {
 public:
  explicit LoopDevice(const std::string& backing) {
    const int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) {
      why_not_ = std::string("/dev/loop-control: ") + std::strerror(errno);
      return;
    }
    const int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    close(ctl);
    if (n < 0) {
      why_not_ = std::string("LOOP_CTL_GET_FREE: ") + std::strerror(errno);
      return;
    }
    path_ = "/dev/loop" + std::to_string(n);
    const int file = open(backing.c_str(), O_RDWR | O_CLOEXEC);
    fd_ = open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (file < 0 || fd_ < 0 || ioctl(fd_, LOOP_SET_FD, file) != 0) {
      why_not_ = "attaching " + path_ + ": " + std::strerror(errno);
      if (file >= 0) close(file);
      if (fd_ >= 0) close(fd_);
      fd_ = -1;
      return;
    }
    close(file);
  }
  ~LoopDevice() {
    if (fd_ >= 0) {
      ioctl(fd_, LOOP_CLR_FD, 0);
      close(fd_);
    }
  }
  bool ok() const { return fd_ >= 0; }
  const std::string& why_not() const { return why_not_; }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
  std::string why_not_;
};

StoreOptions DeviceOptions(const std::string& device) {
  StoreOptions o = testing::SmallStore("", 0, BackendKind::kAuto);
  o.directory.clear();
  o.device = device;
  o.mode = OpenMode::kOpenExisting;
  return o;
}

TEST(BlockDeviceTest, UnclaimedDeviceIsRefusedUntouchedAndClaimedOneReopens) {
  if (geteuid() != 0) GTEST_SKIP() << "loop devices need root";
  TempDir dir;
  const std::string backing = dir.path() + "/disk.img";
  std::string original(kDeviceBytes, '\0');
  for (size_t i = 0; i < original.size(); ++i) original[i] = static_cast<char>(i * 13 + 1);
  WriteWholeFile(backing, original);
  std::string id;
  {
    LoopDevice loop(backing);
    if (!loop.ok()) GTEST_SKIP() << "no loop device here: " << loop.why_not();
    std::unique_ptr<BlockStore> store;
    Status s = BlockStore::Open(DeviceOptions(loop.path()), &store);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("claim_device"), std::string::npos) << s.ToString();
    ASSERT_EQ(ReadWholeFile(backing), original);  // not a byte changed

    StoreOptions claim = DeviceOptions(loop.path());
    claim.claim_device = true;
    s = BlockStore::Open(claim, &store);
    ASSERT_TRUE(s.ok()) << s.ToString();
    id = store->store_id();
    EXPECT_EQ(store->capacity() + store->data_offset_in_file(), kDeviceBytes);
    AlignedBuffer buf;
    ASSERT_TRUE(AlignedBuffer::Allocate(65536, 4096, &buf).ok());
    FillPattern(buf.data(), 65536, 9, 9);
    ASSERT_TRUE(store->Write(store->capacity() - 65536, buf.data(), 65536).ok());
    store.reset();

    // Reopened without claiming: it is ours now, with the data still there.
    s = BlockStore::Open(DeviceOptions(loop.path()), &store);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(store->store_id(), id);
    std::memset(buf.data(), 0, 65536);
    ASSERT_TRUE(store->Read(store->capacity() - 65536, buf.data(), 65536).ok());
    EXPECT_TRUE(MatchesPattern(buf.data(), 65536, 9, 9));
  }
  EXPECT_EQ(ReadWholeFile(backing).size(), kDeviceBytes);  // a device is never deleted
}

}  // namespace
}  // namespace strata::storage
