#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace strata {
namespace {

const char* KindOf(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a plain file";
}

}  // namespace

Status OpenRegularFile(const std::string& path, const char* what, int* fd, uint64_t* size) {
  *fd = -1;
  *size = 0;
  const std::string name = std::string(what) + " '" + path + "'";
  if (path.empty()) return Status::InvalidArgument(std::string(what) + ": the path is empty");
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused right after).
  const int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(name + " does not exist");
    return Status::FromErrno(name, err);
  }
  struct stat st {};
  if (fstat(f, &st) != 0) {
    const int err = errno;
    ::close(f);
    return Status::FromErrno(name, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(f);
    return Status::InvalidArgument(name + " is " + KindOf(st.st_mode) + ", not a regular file");
  }
  const int fl = fcntl(f, F_GETFL);
  if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
  *fd = f;
  *size = static_cast<uint64_t>(st.st_size);
  return Status::OK();
}

Status ReadRegularFile(const std::string& path, const char* what, uint64_t max_bytes,
                       std::string* out) {
  out->clear();
  int fd = -1;
  uint64_t size = 0;
  STRATA_RETURN_IF_ERROR(OpenRegularFile(path, what, &fd, &size));
  if (size > max_bytes) {
    ::close(fd);
    return Status::ResourceExhausted(std::string(what) + " '" + path + "' is " +
                                     std::to_string(size) + " bytes; the limit is " +
                                     std::to_string(max_bytes));
  }
  out->resize(size);
  uint64_t done = 0;
  while (done < size) {
    const ssize_t r = ::read(fd, out->data() + done, size - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // shrank meanwhile: what was there
    done += uint64_t(r);
  }
  out->resize(done);
  ::close(fd);
  return Status::OK();
}

}  // namespace strata
