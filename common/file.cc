#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace strata {
const char* FileKindName(uint32_t mode) {
  const mode_t m = mode_t(mode);
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a plain file";
}

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
    return Status::InvalidArgument(name + " is " + FileKindName(st.st_mode) +
                                   ", not a regular file");
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

Status ReadTextStream(int fd, const std::string& name, uint64_t max_bytes, std::string* out,
                      bool* more) {
  out->clear();
  if (more) *more = false;
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::FromErrno(name, errno);
  const mode_t m = st.st_mode;
  const bool stream = S_ISREG(m) || S_ISFIFO(m) || S_ISSOCK(m) || (S_ISCHR(m) && isatty(fd));
  if (!stream)
    return Status::InvalidArgument(name + " is " + FileKindName(m) +
                                   ", not a regular file, a pipe or a terminal");
  const auto too_long = [&](const std::string& size) {
    return Status::ResourceExhausted(name + " holds " + size + " bytes; the limit is " +
                                     std::to_string(max_bytes) + " bytes");
  };
  if (!more && S_ISREG(m) && uint64_t(st.st_size) > max_bytes)
    return too_long(std::to_string(st.st_size));
  // Grown in steps, not reserved: a short prompt under a large limit costs its own size.
  const uint64_t cap = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  while (out->size() < cap) {
    const size_t old = out->size();
    const size_t want = size_t(std::min<uint64_t>(cap - old, std::max<size_t>(old, 64 << 10)));
    out->resize(old + want);
    ssize_t r;
    do {
      r = ::read(fd, out->data() + old, want);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
      const int err = errno;
      out->clear();
      return Status::FromErrno(name, err);
    }
    out->resize(old + size_t(r));
    if (r == 0) return Status::OK();
  }
  out->resize(max_bytes);
  if (more) {
    *more = true;
    return Status::OK();
  }
  out->clear();
  return too_long("more than " + std::to_string(max_bytes));
}

Status ReadTextFile(const std::string& path, const char* what, uint64_t max_bytes, std::string* out,
                    bool* more) {
  out->clear();
  const std::string name = std::string(what) + " '" + path + "'";
  if (path.empty()) return Status::InvalidArgument(std::string(what) + ": the path is empty");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(name + " does not exist");
    return Status::FromErrno(name, err);
  }
  const Status s = ReadTextStream(fd, name, max_bytes, out, more);
  ::close(fd);
  return s;
}

bool ReadLineBounded(std::istream& in, uint64_t max_bytes, std::string* line, bool* too_long) {
  line->clear();
  *too_long = false;
  bool any = false;
  for (int c; (c = in.get()) != std::char_traits<char>::eof();) {
    any = true;
    if (c == '\n') return true;
    if (line->size() < max_bytes)
      line->push_back(char(c));
    else
      *too_long = true;
  }
  return any;
}

}  // namespace strata
