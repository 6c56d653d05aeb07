// Helpers for tests of file permissions: a scoped umask, and the modes of the files this
// process holds open in a directory, found through /proc/self/fd so that files made without
// a name (O_TMPFILE) count too.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace strata::testing {

// Sets the process's umask for one scope.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(umask(mask)) {}
  ~ScopedUmask() { umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

// A mode as people write it ("0600"), so that failed comparisons read well.
inline std::string OctalMode(mode_t mode) {
  char s[16];
  std::snprintf(s, sizeof(s), "0%03o", unsigned(mode));
  return s;
}

// The permission bits (07777) of every regular file open in this process whose path lies
// directly in `dir`, named or not ("dir/#123 (deleted)" for an O_TMPFILE file), each as
// stat() of /proc/self/fd/N sees it.
inline std::vector<mode_t> ModesOfOpenFilesIn(const std::string& dir) {
  std::vector<mode_t> modes;
  char real[PATH_MAX];
  if (realpath(dir.c_str(), real) == nullptr) return modes;
  const std::string prefix = std::string(real) + "/";
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return modes;
  while (const dirent* e = readdir(fds)) {
    if (e->d_name[0] == '.') continue;
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    char target[PATH_MAX];
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    const std::string t(target);
    if (t.compare(0, prefix.size(), prefix) != 0) continue;
    if (t.find('/', prefix.size()) != std::string::npos) continue;  // in a subdirectory
    struct stat st {};
    if (stat(link.c_str(), &st) == 0 && S_ISREG(st.st_mode)) modes.push_back(st.st_mode & 07777);
  }
  closedir(fds);
  return modes;
}

}  // namespace strata::testing
