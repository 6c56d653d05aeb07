// StoreFile: the file (or block device) under a BlockStore, and the proof that it is ours.
//
// A store file starts with a header block: a magic string, a format version, the data
// capacity, the block size, a random store id and a CRC-32C. The store only ever opens,
// writes or deletes a file that carries that header, so a path that names something else is
// refused untouched. A new file is built under a temporary name and moved into place with a
// no-replace rename, so the final path never holds a half-made store. An exclusive flock keeps
// two stores (in one process or several) off the same file. Data offset 0 lives right after
// the header, which is a multiple of the block size, so data requests keep their alignment.
// A store file holds a KV cache, so it is readable and writable by its owner only (0600),
// whatever the umask: when made, named or not, and when a kept one of the owner's is reopened.
//
// Internal to storage/ (BlockStore owns one). Threads: Open and the destructor on one thread;
// the accessors are constant after Open.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "storage/store_options.h"

namespace strata::storage {

class StoreFile {
 public:
  static Status Open(const StoreOptions& options, std::unique_ptr<StoreFile>* out);
  ~StoreFile();
  StoreFile(const StoreFile&) = delete;
  StoreFile& operator=(const StoreFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t data_origin() const { return header_size_; }
  uint32_t block_size() const { return block_size_; }
  bool direct_io() const { return direct_io_; }
  // Why O_DIRECT is off, when it was asked for and refused; empty otherwise.
  const std::string& direct_io_refusal() const { return direct_refusal_; }
  bool created() const { return created_; }
  // A temporary store made without a name (path() then describes it, names nothing).
  bool unnamed() const { return unnamed_; }
  bool is_device() const { return is_device_; }
  const std::string& store_id() const { return store_id_; }
  // Called once the whole store has opened: from then on Close deletes the file (new or
  // reopened) unless keep_files. Before it, Close deletes only a file this Open created.
  void MarkOpened() { opened_ = true; }
  // Closes the file, deleting it as MarkOpened describes.
  void Close();

 private:
  StoreFile() = default;
  Status OpenInDirectory(const StoreOptions& options);
  Status OpenDevice(const StoreOptions& options);
  Status CreateNew(const StoreOptions& options);
  // OpenMode::kTemporary: unnamed where the filesystem allows, else named by CreateNew.
  Status CreateTemporary(const StoreOptions& options);
  // Sizes, preallocates and writes the header of the new file open on fd_.
  Status FillNew(const StoreOptions& options);
  // Removes the temporary stores of `options.file_name` in the directory that no process
  // holds any more (see OpenMode::kTemporary).
  void RemoveAbandoned(const StoreOptions& options);
  Status OpenExisting(const StoreOptions& options, bool allow_claim);
  // Opens path_ (O_DIRECT when wanted and accepted) and takes the flock.
  Status OpenFd(int extra_flags, bool want_direct);
  // The rest of OpenFd for a descriptor already in fd_.
  Status TakeFd(bool want_direct);
  // Settles block_size_ (and direct_io_) for fd_ by asking the kernel or, where it cannot
  // say and may_probe allows, by probing writes at the start of a new file.
  Status SettleBlockSize(uint32_t requested, bool may_probe);
  Status ReadHeader(std::string* why_not_ours, bool* ours);
  Status WriteHeader();

  int fd_ = -1;
  std::string path_;
  std::string directory_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  uint64_t capacity_ = 0;
  uint64_t header_size_ = 0;
  uint32_t block_size_ = 0;
  bool direct_io_ = false;
  std::string direct_refusal_;
  bool created_ = false;
  bool opened_ = false;
  bool keep_ = false;
  bool is_device_ = false;
  bool temporary_ = false;
  bool unnamed_ = false;
  std::string store_id_;
  uint8_t id_bytes_[16] = {};
};

}  // namespace strata::storage
