#include "tuner/work_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace strata {
namespace {

constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

// Writes all of `data` to fd, through short writes and interruptions.
bool WriteAll(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    done += size_t(w);
  }
  return true;
}

}  // namespace

uint64_t Fnv1a64(const void* p, size_t n, uint64_t h) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

Status MakeWorkDir(const std::string& dir) {
  std::filesystem::path d(dir);
  if (!d.has_filename() && d.has_parent_path()) d = d.parent_path();  // "work/"
  std::error_code ec;
  if (std::filesystem::is_directory(d, ec)) return Status::OK();
  if (d.has_parent_path()) {
    std::filesystem::create_directories(d.parent_path(), ec);
    if (ec)
      return Status::IOError("tune: cannot create the work directory " + dir + ": " + ec.message());
  }
  if (::mkdir(d.c_str(), kDirMode) != 0 && errno != EEXIST)
    return Status::FromErrno("tune: cannot create the work directory " + dir, errno);
  if (!std::filesystem::is_directory(d, ec))
    return Status::InvalidArgument("tune: the work directory " + dir + " is not a directory");
  return Status::OK();
}

Status ReplaceWorkFile(const std::string& path, std::span<const std::string_view> parts,
                       bool sync) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, kFileMode);
  if (fd < 0) return Status::FromErrno("tune: creating " + tmp, errno);
  // A stale temporary file of another version keeps its mode through O_TRUNC.
  bool ok = ::fchmod(fd, kFileMode) == 0;
  for (std::string_view part : parts) ok = ok && WriteAll(fd, part);
  if (ok && sync) ok = ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;
  if (!ok || !closed) {
    ::unlink(tmp.c_str());
    return Status::FromErrno("tune: writing " + tmp, ok ? errno : err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("tune: renaming " + tmp + " to " + path, e);
  }
  return Status::OK();
}

Status AppendWorkFile(const std::string& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, kFileMode);
  if (fd < 0) return Status::FromErrno("tune: appending to " + path, errno);
  const bool ok = ::fchmod(fd, kFileMode) == 0 && WriteAll(fd, data);
  const int err = errno;
  const bool closed = ::close(fd) == 0;
  if (!ok || !closed) return Status::FromErrno("tune: writing " + path, ok ? errno : err);
  return Status::OK();
}

}  // namespace strata
