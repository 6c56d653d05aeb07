#include "storage/store_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "storage/aligned_buffer.h"

namespace strata::storage {
namespace {

constexpr char kMagic[16] = "STRATA-BLKSTORE";  // 15 characters and a NUL
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kMinHeaderSize = 4096;
constexpr uint32_t kMaxBlockSize = 65536;
constexpr size_t kHeaderBytesUsed = 68;  // fields below, the CRC last
constexpr uint32_t kFlagDevice = 1;
constexpr uint32_t kFlagTemporary = 2;  // OpenMode::kTemporary: removable once abandoned
// A .creating file older than this whose lock no process holds was left by a crash during
// creation (a live creator takes the lock right after making it).
constexpr int64_t kAbandonedCreatingSeconds = 60;
// Every store file is readable and writable by its owner only (see MakeOwnerOnly).
constexpr mode_t kStoreFileMode = 0600;

// CRC-32C (Castagnoli polynomial, reflected), bit by bit: it runs once per Open over 64 bytes.
uint32_t Crc32c(const uint8_t* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 15]);
  }
  return s;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return UINT64_MAX;  // unknown: let fallocate decide
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

// Full pread/pwrite of a small block, restarting after signals and short counts.
int FullIo(int fd, bool write, void* buf, size_t n, uint64_t off) {
  size_t done = 0;
  while (done < n) {
    char* p = static_cast<char*>(buf) + done;
    const ssize_t r = write ? pwrite(fd, p, n - done, static_cast<off_t>(off + done))
                            : pread(fd, p, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return write ? EIO : ENODATA;
    done += static_cast<size_t>(r);
  }
  return 0;
}

// Store files hold KV caches, which are as private as the prompts they were computed from,
// and their directory is often shared (/var/tmp by default). Creation asks for 0600 and
// this then makes the mode exactly that, whatever the umask or a default ACL of the directory
// left. A filesystem that cannot keep Unix modes (vfat, exfat) refuses the change; the store
// still works there, and `report` says the file may be readable by others.
void MakeOwnerOnly(int fd, const std::string& path, const StoreOptions& options) {
  struct stat st {};
  if (fstat(fd, &st) == 0 && (st.st_mode & 07777) == kStoreFileMode) return;
  if (fchmod(fd, kStoreFileMode) == 0) return;
  const int err = errno;
  if (fstat(fd, &st) == 0 && (st.st_mode & 077) == 0) return;  // still private to its owner
  const std::string msg = "cannot make " + Quote(path) + " readable by its owner only (fchmod " +
                          "0600: " + std::strerror(err) + ", errno " + std::to_string(err) +
                          "); other users may be able to read the KV cache it holds";
  if (options.report) {
    options.report(msg);
  } else {
    std::fprintf(stderr, "strata: %s\n", msg.c_str());
  }
}

}  // namespace

Status StoreFile::Open(const StoreOptions& options, std::unique_ptr<StoreFile>* out) {
  std::unique_ptr<StoreFile> f(new StoreFile());
  f->keep_ = options.keep_files;
  STRATA_RETURN_IF_ERROR(options.device.empty() ? f->OpenInDirectory(options)
                                                : f->OpenDevice(options));
  *out = std::move(f);
  return Status::OK();
}

StoreFile::~StoreFile() { Close(); }

void StoreFile::Close() {
  if (fd_ < 0) return;
  // A file made by a failed Open goes; an opened store's file goes unless kept; a file that
  // was there before a failed Open stays.
  const bool remove = !is_device_ && !unnamed_ && (opened_ ? !keep_ || temporary_ : created_);
  if (remove) {
    // Only unlink the path if it still names the file this store opened.
    struct stat st {};
    if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      unlink(path_.c_str());
    }
  }
  // Unlock explicitly: an io_uring that registered this file may hold the open file (and
  // with it the lock) for a moment after the ring is gone, as its teardown is asynchronous.
  flock(fd_, LOCK_UN);
  close(fd_);
  fd_ = -1;
}

Status StoreFile::OpenFd(int extra_flags, bool want_direct) {
  fd_ = open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | extra_flags, kStoreFileMode);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return Status::InvalidArgument(Quote(path_) +
                                     " is a symbolic link; the store does not "
                                     "follow links");
    }
    if (err == EACCES || err == EPERM || err == EROFS) {
      return Status::FromErrno(
          "storage directory " + Quote(directory_) + " is not writable (open " + Quote(path_) + ")",
          err);
    }
    return Status::FromErrno("open " + Quote(path_), err);
  }
  return TakeFd(want_direct);
}

Status StoreFile::TakeFd(bool want_direct) {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return Status::FromErrno("fstat " + Quote(path_), errno);
  if (!is_device_ && !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(Quote(path_) + " is not a regular file; refusing to use it");
  }
  if (is_device_ && !S_ISBLK(st.st_mode)) {
    return Status::InvalidArgument(Quote(path_) + " is not a block device");
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      return Status::InvalidArgument(Quote(path_) + " is in use by another store (flock held)");
    }
    return Status::FromErrno("flock " + Quote(path_), err);
  }
  if (!want_direct) return Status::OK();
  if (ForcedFallback() == "direct") {
    direct_refusal_ = "O_DIRECT refused (forced by STRATA_STORAGE_FORCE_FALLBACK=direct)";
    return Status::OK();
  }
  // Setting O_DIRECT afterwards, rather than at open, keeps a refusal from leaving a created
  // file behind on filesystems that check only after creating it.
  const int fl = fcntl(fd_, F_GETFL);
  if (fl >= 0 && fcntl(fd_, F_SETFL, fl | O_DIRECT) == 0) {
    direct_io_ = true;
  } else {
    const int err = errno;
    direct_refusal_ = "O_DIRECT refused by the filesystem of " + Quote(path_) + ": " +
                      std::strerror(err) + " (errno " + std::to_string(err) + ")";
  }
  return Status::OK();
}

Status StoreFile::SettleBlockSize(uint32_t requested, bool may_probe) {
  uint32_t block = 0;
  if (!direct_io_) {
    block = 512;  // page-cache I/O takes any alignment; 512 keeps the rules the same everywhere
  } else if (is_device_) {
    int lbs = 0;
    if (ioctl(fd_, BLKSSZGET, &lbs) != 0 || lbs <= 0) {
      return Status::FromErrno("ioctl(BLKSSZGET) on " + Quote(path_), errno);
    }
    block = static_cast<uint32_t>(lbs);
  } else {
    struct statx sx {};
    if (statx(fd_, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) != 0) {
      if (sx.stx_dio_offset_align == 0) {
        direct_refusal_ = "the filesystem of " + Quote(path_) + " reports no direct I/O (statx)";
      } else {
        block = std::max(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
      }
    } else if (!may_probe) {
      // A reopened store keeps the block size it was made with; probing would write into it.
      block = 512;
    } else {
      // Kernels before 6.1 (or filesystems that do not say): probe with writes into a new
      // file's first blocks, rewritten afterwards. Writes, because reads of holes and
      // unwritten extents skip the alignment check.
      AlignedBuffer probe;
      STRATA_RETURN_IF_ERROR(AlignedBuffer::Allocate(2 * kMinHeaderSize, kMinHeaderSize, &probe));
      for (uint32_t candidate : {512u, 4096u}) {
        // An address aligned to `candidate` but not to twice it.
        if (pwrite(fd_, probe.data() + candidate, candidate, candidate) ==
            static_cast<ssize_t>(candidate)) {
          block = candidate;
          break;
        }
      }
      if (block == 0) {
        direct_refusal_ =
            "O_DIRECT writes on " + Quote(path_) + " fail at 512- and 4096-byte alignment";
      }
    }
    if (block == 0) {
      const int fl = fcntl(fd_, F_GETFL);
      if (fl >= 0) fcntl(fd_, F_SETFL, fl & ~O_DIRECT);
      direct_io_ = false;
      block = 512;
    }
  }
  block = std::max(block, requested);
  if (block > kMaxBlockSize) {
    return Status::NotSupported("block size " + std::to_string(block) + " of " + Quote(path_) +
                                " is above " + std::to_string(kMaxBlockSize));
  }
  block_size_ = block;
  header_size_ = std::max(kMinHeaderSize, block_size_);
  return Status::OK();
}

Status StoreFile::WriteHeader() {
  AlignedBuffer buf;
  STRATA_RETURN_IF_ERROR(AlignedBuffer::Allocate(header_size_, kMinHeaderSize, &buf));
  uint8_t* p = reinterpret_cast<uint8_t*>(buf.data());
  std::memcpy(p, kMagic, sizeof(kMagic));
  Put32(p + 16, kFormatVersion);
  Put32(p + 20, static_cast<uint32_t>(header_size_));
  Put64(p + 24, capacity_);
  Put32(p + 32, block_size_);
  Put32(p + 36, (is_device_ ? kFlagDevice : 0) | (temporary_ ? kFlagTemporary : 0));
  std::memcpy(p + 40, id_bytes_, 16);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  Put64(p + 56,
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
  Put32(p + 64, Crc32c(p, 64));
  const int err = FullIo(fd_, true, p, header_size_, 0);
  if (err != 0) return Status::FromErrno("write store header of " + Quote(path_), err);
  if (fdatasync(fd_) != 0) return Status::FromErrno("fdatasync " + Quote(path_), errno);
  return Status::OK();
}

Status StoreFile::ReadHeader(std::string* why_not_ours, bool* ours) {
  *ours = false;
  AlignedBuffer buf;
  STRATA_RETURN_IF_ERROR(AlignedBuffer::Allocate(kMinHeaderSize, kMinHeaderSize, &buf));
  int err = FullIo(fd_, false, buf.data(), kMinHeaderSize, 0);
  if (err == EINVAL && direct_io_) {
    // Direct reads refused on this file after all: read through the page cache instead.
    const int fl = fcntl(fd_, F_GETFL);
    if (fl >= 0) fcntl(fd_, F_SETFL, fl & ~O_DIRECT);
    direct_io_ = false;
    direct_refusal_ = "O_DIRECT reads of " + Quote(path_) + " fail with EINVAL";
    err = FullIo(fd_, false, buf.data(), kMinHeaderSize, 0);
  }
  if (err == ENODATA) {
    *why_not_ours = "it is smaller than a store header";
    return Status::OK();
  }
  if (err != 0) return Status::FromErrno("read store header of " + Quote(path_), err);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(buf.data());
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    *why_not_ours = "it has no store header at offset 0";
    return Status::OK();
  }
  if (Get32(p + 64) != Crc32c(p, 64)) {
    return Status::Corruption("store header of " + Quote(path_) + " is damaged (CRC mismatch)");
  }
  if (Get32(p + 16) != kFormatVersion) {
    return Status::NotSupported("store header of " + Quote(path_) + " has format version " +
                                std::to_string(Get32(p + 16)) + "; this build reads version " +
                                std::to_string(kFormatVersion));
  }
  const uint32_t header_size = Get32(p + 20);
  const uint32_t block = Get32(p + 32);
  if (header_size < kMinHeaderSize || block == 0 || block > kMaxBlockSize ||
      header_size % block != 0) {
    return Status::Corruption("store header of " + Quote(path_) + " holds header size " +
                              std::to_string(header_size) + " and block size " +
                              std::to_string(block) + ", which do not fit together");
  }
  header_size_ = header_size;
  block_size_ = block;
  capacity_ = Get64(p + 24);
  std::memcpy(id_bytes_, p + 40, 16);
  store_id_ = Hex(id_bytes_, 16);
  static_assert(kHeaderBytesUsed == 68);
  *ours = true;
  return Status::OK();
}

Status StoreFile::OpenInDirectory(const StoreOptions& options) {
  directory_ = options.directory;
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
  struct stat st {};
  if (stat(directory_.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::NotFound("storage directory " + Quote(directory_) + " does not exist");
    }
    return Status::FromErrno("storage directory " + Quote(directory_), err);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("storage directory " + Quote(directory_) +
                                   " is not a directory");
  }
  if (access(directory_.c_str(), W_OK | X_OK) != 0) {
    return Status::FromErrno("storage directory " + Quote(directory_) + " is not writable", errno);
  }
  if (options.mode == OpenMode::kTemporary) {
    RemoveAbandoned(options);
    return CreateTemporary(options);
  }
  path_ = directory_ + "/" + options.file_name;
  struct stat existing {};
  const bool exists = lstat(path_.c_str(), &existing) == 0;
  if (!exists && errno != ENOENT) return Status::FromErrno("lstat " + Quote(path_), errno);
  if (exists) {
    if (options.mode == OpenMode::kCreate) {
      return Status::InvalidArgument(Quote(path_) +
                                     " already exists; left untouched (reopen "
                                     "a kept store with OpenMode::kOpenExisting)");
    }
    return OpenExisting(options, false);
  }
  if (options.mode == OpenMode::kOpenExisting) {
    return Status::NotFound("store file " + Quote(path_) + " does not exist");
  }
  return CreateNew(options);
}

Status StoreFile::OpenExisting(const StoreOptions& options, bool allow_claim) {
  STRATA_RETURN_IF_ERROR(OpenFd(is_device_ ? O_EXCL : 0, options.direct_io));
  std::string why_not_ours;
  bool ours = false;
  STRATA_RETURN_IF_ERROR(ReadHeader(&why_not_ours, &ours));
  if (!ours) {
    if (!allow_claim) {
      const std::string hint = is_device_ ? "; set claim_device to let the store overwrite it"
                                          : "; refusing to touch it";
      return Status::InvalidArgument(Quote(path_) + " is not a Strata block store (" +
                                     why_not_ours + ")" + hint);
    }
    return Status::OK();  // the caller claims the device
  }
  // A kept store made before files were private (or chmod-ed since) becomes private too; a
  // device node's mode is the administrator's, and a file of another user's is left as it is.
  if (!is_device_) {
    struct stat own {};
    if (fstat(fd_, &own) == 0 && own.st_uid == geteuid()) MakeOwnerOnly(fd_, path_, options);
  }
  if (options.capacity != 0 && options.capacity != capacity_) {
    return Status::InvalidArgument("store " + Quote(path_) + " holds " + std::to_string(capacity_) +
                                   " bytes but capacity " + std::to_string(options.capacity) +
                                   " was asked for");
  }
  uint64_t size = 0;
  if (is_device_) {
    if (ioctl(fd_, BLKGETSIZE64, &size) != 0) {
      return Status::FromErrno("ioctl(BLKGETSIZE64) on " + Quote(path_), errno);
    }
  } else {
    struct stat st {};
    if (fstat(fd_, &st) != 0) return Status::FromErrno("fstat " + Quote(path_), errno);
    size = static_cast<uint64_t>(st.st_size);
  }
  if (size < header_size_ + capacity_) {
    return Status::Corruption("store " + Quote(path_) + " is truncated: " + std::to_string(size) +
                              " bytes, its header promises " +
                              std::to_string(header_size_ + capacity_));
  }
  // The device may demand more alignment than when the file was made (e.g. moved disks).
  const uint32_t recorded = block_size_;
  const uint64_t header = header_size_;
  STRATA_RETURN_IF_ERROR(SettleBlockSize(std::max(recorded, options.block_size), false));
  if (header % block_size_ != 0) {
    return Status::NotSupported("store " + Quote(path_) + " was made for " +
                                std::to_string(recorded) + "-byte blocks; this device needs " +
                                std::to_string(block_size_));
  }
  header_size_ = header;
  return Status::OK();
}

Status StoreFile::CreateNew(const StoreOptions& options) {
  if (getrandom(id_bytes_, sizeof(id_bytes_), 0) != static_cast<ssize_t>(sizeof(id_bytes_))) {
    return Status::FromErrno("getrandom for a store id", errno);
  }
  store_id_ = Hex(id_bytes_, 16);
  const std::string final_path = path_;
  path_ = directory_ + "/." + options.file_name + "." + store_id_.substr(0, 12) + ".creating";
  Status s = OpenFd(O_CREAT | O_EXCL, options.direct_io);
  if (fd_ >= 0) created_ = true;  // from here on, failures delete the temporary file
  auto fail = [&](Status st) {
    Close();
    path_ = final_path;
    return st;
  };
  if (!s.ok()) return fail(s);
  MakeOwnerOnly(fd_, path_, options);
  s = FillNew(options);
  if (!s.ok()) return fail(s);
  // No-replace rename: the final name appears complete or not at all, and never over a file
  // that showed up meanwhile.
  if (renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EINVAL || err == ENOSYS) {
      // Filesystems without RENAME_NOREPLACE: link() also refuses to replace.
      err = link(path_.c_str(), final_path.c_str()) == 0 ? 0 : errno;
      if (err == 0) unlink(path_.c_str());
    }
    if (err == EEXIST) {
      return fail(Status::InvalidArgument(Quote(final_path) +
                                          " appeared while the store was being created; left "
                                          "untouched"));
    }
    if (err != 0) return fail(Status::FromErrno("rename to " + Quote(final_path), err));
  }
  path_ = final_path;
  const int dfd = open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return Status::OK();
}

Status StoreFile::FillNew(const StoreOptions& options) {
  capacity_ = options.capacity;
  // Size the header for the probe first: block size and header size are settled on the real file.
  if (ftruncate(fd_, 2 * kMinHeaderSize) != 0) {
    return Status::FromErrno("ftruncate " + Quote(path_), errno);
  }
  STRATA_RETURN_IF_ERROR(SettleBlockSize(options.block_size, true));
  const uint64_t total = header_size_ + capacity_;
  // Checked before fallocate, which on ext4 first takes every free block it can and only then
  // fails: other processes sharing the disk would see it full for that moment.
  const uint64_t free_bytes = FreeBytes(directory_);
  if (options.preallocate && total > free_bytes) {
    return Status::ResourceExhausted("not enough space in " + Quote(directory_) +
                                     " for a store of " + std::to_string(total) + " bytes (" +
                                     std::to_string(free_bytes) + " bytes free)");
  }
  if (options.preallocate) {
    int err = 0;
    do {
      err = fallocate(fd_, 0, 0, static_cast<off_t>(total)) == 0 ? 0 : errno;
    } while (err == EINTR);
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
      return Status::ResourceExhausted(
          "not enough space in " + Quote(directory_) + " for a store of " + std::to_string(total) +
          " bytes (" + std::to_string(FreeBytes(directory_)) +
          " bytes free): " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
    }
    if (err == EOPNOTSUPP) {
      // No preallocation on this filesystem: a sparse file; a full disk then shows up as
      // ENOSPC on the first write that needs space, reported like any other write error.
      if (ftruncate(fd_, static_cast<off_t>(total)) != 0) {
        return Status::FromErrno("ftruncate " + Quote(path_), errno);
      }
    } else if (err != 0) {
      return Status::FromErrno("fallocate " + std::to_string(total) + " bytes for " + Quote(path_),
                               err);
    }
  } else if (ftruncate(fd_, static_cast<off_t>(total)) != 0) {
    const int err = errno;
    if (err == EFBIG) {
      return Status::ResourceExhausted("a store of " + std::to_string(total) +
                                       " bytes is larger than " + Quote(directory_) + " allows");
    }
    return Status::FromErrno("ftruncate " + Quote(path_), err);
  }
  return WriteHeader();
}

Status StoreFile::CreateTemporary(const StoreOptions& options) {
  temporary_ = true;
  if (ForcedFallback() != "tmpfile") {
    fd_ = open(directory_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, kStoreFileMode);
    const int err = fd_ < 0 ? errno : 0;
    if (fd_ >= 0) {
      if (getrandom(id_bytes_, sizeof(id_bytes_), 0) != static_cast<ssize_t>(sizeof(id_bytes_))) {
        return Status::FromErrno("getrandom for a store id", errno);
      }
      store_id_ = Hex(id_bytes_, 16);
      path_ =
          directory_ + "/(unnamed " + options.file_name + " store " + store_id_.substr(0, 12) + ")";
      unnamed_ = true;
      created_ = true;
      // No other user can reach it while it has no name; private anyway, so that every store
      // file has one mode and one given a name later (linkat) stays private.
      MakeOwnerOnly(fd_, path_, options);
      Status s = TakeFd(options.direct_io);
      if (s.ok()) s = FillNew(options);
      if (!s.ok()) Close();  // an unnamed file vanishes with its descriptor
      return s;
    }
    // Filesystems without O_TMPFILE say EOPNOTSUPP (EISDIR or EINVAL on old kernels): fall
    // back to a name. Anything else (no permission, no space) is the answer.
    if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL) {
      return Status::FromErrno("storage directory " + Quote(directory_) +
                                   ": cannot make a temporary store file (O_TMPFILE)",
                               err);
    }
  }
  // A named file: prefix-<32 hex>.strata, the id random (no PID: namespaces reuse them).
  uint8_t name_id[16];
  if (getrandom(name_id, sizeof(name_id), 0) != static_cast<ssize_t>(sizeof(name_id))) {
    return Status::FromErrno("getrandom for a store name", errno);
  }
  StoreOptions named = options;
  named.file_name = options.file_name + "-" + Hex(name_id, 16) + ".strata";
  path_ = directory_ + "/" + named.file_name;
  return CreateNew(named);
}

namespace {

// What a file name says of its maker: a temporary store of `prefix` (prefix-<32 hex>.strata),
// a KV file of an earlier version (prefix-<pid>-<n>[-probe].strata or .kv, never kept), or
// neither.
enum class NameKind { kOther, kTemporary, kEarlier };
NameKind KindOfName(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() + 1 || name.compare(0, prefix.size(), prefix) != 0 ||
      name[prefix.size()] != '-')
    return NameKind::kOther;
  std::string rest = name.substr(prefix.size() + 1);
  for (const std::string ext : {".strata", ".kv"}) {
    if (rest.size() <= ext.size() || rest.compare(rest.size() - ext.size(), ext.size(), ext) != 0)
      continue;
    rest.resize(rest.size() - ext.size());
    if (ext == ".strata" && rest.size() == 32 &&
        rest.find_first_not_of("0123456789abcdef") == std::string::npos)
      return NameKind::kTemporary;
    if (rest.size() > 6 && rest.compare(rest.size() - 6, 6, "-probe") == 0)
      rest.resize(rest.size() - 6);
    const size_t dash = rest.find('-');
    const bool pid_n = dash != std::string::npos && dash > 0 && dash + 1 < rest.size() &&
                       rest.find_first_not_of("0123456789-") == std::string::npos &&
                       rest.find('-', dash + 1) == std::string::npos;
    return pid_n ? NameKind::kEarlier : NameKind::kOther;
  }
  return NameKind::kOther;
}

}  // namespace

void StoreFile::RemoveAbandoned(const StoreOptions& options) {
  DIR* dir = opendir(directory_.c_str());
  if (dir == nullptr) return;
  struct Candidate {
    std::string name;
    NameKind kind;
    bool creating;  // .<name>.<12 hex>.creating: a creation that a crash interrupted
  };
  std::vector<Candidate> found;
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    std::string base = name;
    bool creating = false;
    if (name.size() > 23 && name[0] == '.' && name.compare(name.size() - 9, 9, ".creating") == 0) {
      base = name.substr(1, name.size() - 1 - 9 - 13);
      creating = true;
    }
    const NameKind kind = KindOfName(base, options.file_name);
    if (kind != NameKind::kOther) found.push_back({name, kind, creating});
  }
  closedir(dir);
  for (const Candidate& c : found) {
    const std::string path = directory_ + "/" + c.name;
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    // A live store holds the lock: only files nobody holds are candidates.
    struct stat st {};
    bool remove = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (remove && c.creating) {
      remove = time(nullptr) - st.st_mtime > kAbandonedCreatingSeconds;
    } else if (remove) {
      // A sound store header, marked temporary (or under an earlier version's KV name).
      uint8_t h[kHeaderBytesUsed];
      remove = pread(fd, h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
               std::memcmp(h, kMagic, sizeof(kMagic)) == 0 && Get32(h + 64) == Crc32c(h, 64) &&
               ((Get32(h + 36) & kFlagTemporary) != 0 || c.kind == NameKind::kEarlier);
    }
    struct stat now {};
    if (remove && lstat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev &&
        now.st_ino == st.st_ino && unlink(path.c_str()) == 0) {
      const std::string msg = "removed " + Quote(path) + " (" + std::to_string(st.st_size) +
                              " bytes): a store file a run left behind when it ended without "
                              "removing it";
      if (options.report) {
        options.report(msg);
      } else {
        std::fprintf(stderr, "strata: %s\n", msg.c_str());
      }
    }
    flock(fd, LOCK_UN);
    close(fd);
  }
}

Status StoreFile::OpenDevice(const StoreOptions& options) {
  is_device_ = true;
  path_ = options.device;
  directory_ = options.device;
  STRATA_RETURN_IF_ERROR(OpenExisting(options, options.claim_device));
  if (!store_id_.empty()) return Status::OK();  // it carried our header
  // Claiming: the caller allowed overwriting the device with a new store.
  if (getrandom(id_bytes_, sizeof(id_bytes_), 0) != static_cast<ssize_t>(sizeof(id_bytes_))) {
    return Status::FromErrno("getrandom for a store id", errno);
  }
  store_id_ = Hex(id_bytes_, 16);
  STRATA_RETURN_IF_ERROR(SettleBlockSize(options.block_size, true));
  uint64_t size = 0;
  if (ioctl(fd_, BLKGETSIZE64, &size) != 0) {
    return Status::FromErrno("ioctl(BLKGETSIZE64) on " + Quote(path_), errno);
  }
  if (size <= header_size_) {
    return Status::OutOfRange("device " + Quote(path_) + " holds only " + std::to_string(size) +
                              " bytes");
  }
  const uint64_t room = (size - header_size_) / block_size_ * block_size_;
  capacity_ = options.capacity == 0 ? room : options.capacity;
  if (capacity_ > room) {
    return Status::OutOfRange("capacity " + std::to_string(capacity_) + " does not fit on " +
                              Quote(path_) + " (" + std::to_string(room) + " bytes of room)");
  }
  return WriteHeader();
}

}  // namespace strata::storage
