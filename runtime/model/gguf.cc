#include "runtime/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_set>

#include "common/file.h"

namespace strata {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
// The spec caps keys at 65535 bytes and tensor names at 64 bytes (GGML's name buffer).
constexpr uint64_t kMaxKeyBytes = 65535;
constexpr uint64_t kMaxTensorNameBytes = 64;
constexpr uint32_t kMaxDims = 4;
// String values are bounded only by the file (checked separately, with a clearer message).
constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kDefaultAlignment = 32;
// Smallest encodings, used to bound counts by the bytes left before allocating anything:
// a KV pair is a key length (8), a type (4) and at least one byte of value; a tensor info
// is a name length (8), n_dims (4), one dim (8), a type (4) and an offset (8).
constexpr uint64_t kMinKvBytes = 13;
constexpr uint64_t kMinTensorInfoBytes = 32;

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Reads little-endian fields from the mapped bytes with bounds checks; every error names
// the file, the field being read, its offset and how many bytes were left.
class Reader {
 public:
  Reader(const uint8_t* base, uint64_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const uint8_t* here() const { return base_ + pos_; }

  Status Need(uint64_t n, const std::string& what) const {
    if (n > left()) {
      return Status::Corruption(path_ + ": truncated: " + what + " at offset " +
                                std::to_string(pos_) + " needs " + std::to_string(n) + " bytes, " +
                                std::to_string(left()) + " left");
    }
    return Status::OK();
  }
  template <typename T>
  Status Read(T* v, const std::string& what) {
    STRATA_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(v, here(), sizeof(T));
    pos_ += sizeof(T);
    return Status::OK();
  }
  Status Skip(uint64_t n, const std::string& what) {
    STRATA_RETURN_IF_ERROR(Need(n, what));
    pos_ += n;
    return Status::OK();
  }
  // A GGUF string: uint64 length then bytes (no terminator).
  Status ReadString(std::string_view* s, const std::string& what, uint64_t max_len) {
    uint64_t len = 0;
    STRATA_RETURN_IF_ERROR(Read(&len, what + " length"));
    if (len > max_len) {
      return Status::Corruption(path_ + ": " + what + " length " + std::to_string(len) +
                                " exceeds the limit " + std::to_string(max_len));
    }
    if (len > left()) {
      return Status::Corruption(path_ + ": " + what + " length " + std::to_string(len) +
                                " runs past the end of the file (" + std::to_string(left()) +
                                " bytes left at offset " + std::to_string(pos_) + ")");
    }
    *s = std::string_view(reinterpret_cast<const char*>(here()), len);
    pos_ += len;
    return Status::OK();
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

bool IsKnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

// Reads one scalar of fixed-size type t into the widened variant.
Status ReadScalar(Reader* r, GgufValueType t, GgufValue* v, const std::string& what,
                  const std::string& path) {
  switch (t) {
#define STRATA_GGUF_INT(kind, ctype, wide)     \
  case GgufValueType::kind: {                  \
    ctype x{};                                 \
    STRATA_RETURN_IF_ERROR(r->Read(&x, what)); \
    v->scalar = static_cast<wide>(x);          \
    return Status::OK();                       \
  }
    STRATA_GGUF_INT(kUint8, uint8_t, uint64_t)
    STRATA_GGUF_INT(kUint16, uint16_t, uint64_t)
    STRATA_GGUF_INT(kUint32, uint32_t, uint64_t)
    STRATA_GGUF_INT(kUint64, uint64_t, uint64_t)
    STRATA_GGUF_INT(kInt8, int8_t, int64_t)
    STRATA_GGUF_INT(kInt16, int16_t, int64_t)
    STRATA_GGUF_INT(kInt32, int32_t, int64_t)
    STRATA_GGUF_INT(kInt64, int64_t, int64_t)
    STRATA_GGUF_INT(kFloat32, float, double)
    STRATA_GGUF_INT(kFloat64, double, double)
#undef STRATA_GGUF_INT
    case GgufValueType::kBool: {
      uint8_t b = 0;
      STRATA_RETURN_IF_ERROR(r->Read(&b, what));
      if (b > 1) {
        return Status::Corruption(path + ": " + what + ": bool value " + std::to_string(b) +
                                  " is neither 0 nor 1");
      }
      v->scalar = b != 0;
      return Status::OK();
    }
    default:
      return Status::Internal(path + ": " + what + ": not a fixed-size type");
  }
}

}  // namespace

const char* GgufValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

size_t GgufValueTypeSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

GgufFile::~GgufFile() {
  if (mapped_) munmap(const_cast<uint8_t*>(base_), size_);
}

void GgufFile::ReleasePages(const void* p, size_t n) const {
  if (!mapped_ || n == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  // Advice only: if the kernel declines, the pages stay resident and nothing else changes.
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

Status GgufFile::Open(const std::string& path, std::unique_ptr<GgufFile>* out) {
  // A FIFO or a device named as the model is refused at once, never waited on.
  int fd = -1;
  uint64_t size = 0;
  STRATA_RETURN_IF_ERROR(OpenRegularFile(path, "model", &fd, &size));
  if (size == 0) {
    ::close(fd);
    return Status::Corruption(path + ": empty file (a GGUF file starts with a 24-byte header)");
  }
  struct stat st {};
  st.st_size = static_cast<off_t>(size);
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (p == MAP_FAILED) return Status::FromErrno("mmap " + path, err);
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = static_cast<uint64_t>(st.st_size);
  f->mapped_ = true;
  STRATA_RETURN_IF_ERROR(f->Parse());
  *out = std::move(f);
  return Status::OK();
}

Status GgufFile::FromMemory(const void* data, size_t size, std::unique_ptr<GgufFile>* out) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = "<memory>";
  f->base_ = static_cast<const uint8_t*>(data);
  f->size_ = size;
  STRATA_RETURN_IF_ERROR(f->Parse());
  *out = std::move(f);
  return Status::OK();
}

Status GgufFile::Parse() {
  Reader r(base_, size_, path_);
  uint32_t magic = 0;
  STRATA_RETURN_IF_ERROR(r.Read(&magic, "header magic"));
  if (magic != kMagic) {
    return Status::Corruption(path_ + ": not a GGUF file: magic " + Hex(magic) + " (expected " +
                              Hex(kMagic) + ", \"GGUF\")");
  }
  STRATA_RETURN_IF_ERROR(r.Read(&version_, "header version"));
  if (version_ == 0x02000000u || version_ == 0x03000000u) {
    return Status::NotSupported(path_ + ": header version " + Hex(version_) +
                                " is a big-endian GGUF file, which is not supported");
  }
  if (version_ != 2 && version_ != 3) {
    return Status::NotSupported(path_ + ": header version " + std::to_string(version_) +
                                " is not supported (versions 2 and 3 are)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  STRATA_RETURN_IF_ERROR(r.Read(&n_tensors, "header tensor_count"));
  STRATA_RETURN_IF_ERROR(r.Read(&n_kv, "header metadata_kv_count"));
  if (n_kv > r.left() / kMinKvBytes) {
    return Status::Corruption(path_ + ": header metadata_kv_count " + std::to_string(n_kv) +
                              " cannot fit in the " + std::to_string(r.left()) +
                              " bytes left (limit " + std::to_string(r.left() / kMinKvBytes) + ")");
  }

  kv_.reserve(n_kv);
  std::unordered_set<std::string_view> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string idx = "metadata entry " + std::to_string(i);
    std::string_view key;
    STRATA_RETURN_IF_ERROR(r.ReadString(&key, idx + " key", kMaxKeyBytes));
    if (key.empty()) return Status::Corruption(path_ + ": " + idx + ": empty key");
    // The spec makes keys ASCII; anything else is damage (and unprintable in messages).
    for (size_t c = 0; c < key.size(); ++c) {
      const auto ch = static_cast<unsigned char>(key[c]);
      if (ch < 0x20 || ch > 0x7E) {
        return Status::Corruption(path_ + ": " + idx + ": key byte " + std::to_string(c) + " is " +
                                  Hex(ch) + ", not printable ASCII");
      }
    }
    const std::string what = "metadata '" + std::string(key) + "'";
    if (!keys.insert(key).second) {
      return Status::Corruption(path_ + ": " + what + " appears twice");
    }
    uint32_t raw_type = 0;
    STRATA_RETURN_IF_ERROR(r.Read(&raw_type, what + " value type"));
    if (!IsKnownType(raw_type)) {
      return Status::Corruption(path_ + ": " + what + ": unknown value type " +
                                std::to_string(raw_type) + " (known: 0..12)");
    }
    GgufValue v;
    v.type = static_cast<GgufValueType>(raw_type);
    if (v.type == GgufValueType::kString) {
      std::string_view s;
      STRATA_RETURN_IF_ERROR(r.ReadString(&s, what + " string", kNoLimit));
      v.scalar = s;
    } else if (v.type == GgufValueType::kArray) {
      uint32_t raw_elem = 0;
      STRATA_RETURN_IF_ERROR(r.Read(&raw_elem, what + " array element type"));
      if (!IsKnownType(raw_elem)) {
        return Status::Corruption(path_ + ": " + what + ": unknown array element type " +
                                  std::to_string(raw_elem) + " (known: 0..12)");
      }
      v.elem_type = static_cast<GgufValueType>(raw_elem);
      if (v.elem_type == GgufValueType::kArray) {
        return Status::NotSupported(path_ + ": " + what + ": arrays of arrays are not supported");
      }
      STRATA_RETURN_IF_ERROR(r.Read(&v.array_len, what + " array length"));
      const uint64_t elem_size = GgufValueTypeSize(v.elem_type);
      // Strings take at least their 8-byte length each.
      const uint64_t min_elem = elem_size ? elem_size : 8;
      if (v.array_len > r.left() / min_elem) {
        return Status::Corruption(
            path_ + ": " + what + ": array length " + std::to_string(v.array_len) + " of " +
            GgufValueTypeName(v.elem_type) + " cannot fit in the " + std::to_string(r.left()) +
            " bytes left (limit " + std::to_string(r.left() / min_elem) + ")");
      }
      if (v.elem_type == GgufValueType::kString) {
        v.strings.reserve(v.array_len);
        for (uint64_t j = 0; j < v.array_len; ++j) {
          std::string_view s;
          STRATA_RETURN_IF_ERROR(
              r.ReadString(&s, what + " element " + std::to_string(j), kNoLimit));
          v.strings.push_back(s);
        }
      } else {
        v.array_data = r.here();
        if (v.elem_type == GgufValueType::kBool) {
          for (uint64_t j = 0; j < v.array_len; ++j) {
            if (v.array_data[j] > 1) {
              return Status::Corruption(path_ + ": " + what + " element " + std::to_string(j) +
                                        ": bool value " + std::to_string(v.array_data[j]) +
                                        " is neither 0 nor 1");
            }
          }
        }
        STRATA_RETURN_IF_ERROR(r.Skip(v.array_len * elem_size, what + " array data"));
      }
    } else {
      STRATA_RETURN_IF_ERROR(ReadScalar(&r, v.type, &v, what, path_));
    }
    kv_.emplace_back(std::string(key), std::move(v));
  }

  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = Find("general.alignment")) {
    if (a->type != GgufValueType::kUint32) {
      return Status::Corruption(path_ + ": metadata 'general.alignment' has type " +
                                GgufValueTypeName(a->type) + " (uint32 expected)");
    }
    const uint64_t al = std::get<uint64_t>(a->scalar);
    if (al == 0 || (al & (al - 1)) != 0) {
      return Status::Corruption(path_ + ": metadata 'general.alignment' value " +
                                std::to_string(al) + " is not a power of two");
    }
    alignment_ = static_cast<uint32_t>(al);
  }

  if (n_tensors > r.left() / kMinTensorInfoBytes) {
    return Status::Corruption(path_ + ": header tensor_count " + std::to_string(n_tensors) +
                              " cannot fit in the " + std::to_string(r.left()) +
                              " bytes left (limit " +
                              std::to_string(r.left() / kMinTensorInfoBytes) + ")");
  }
  tensors_.reserve(n_tensors);
  std::unordered_set<std::string_view> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string idx = "tensor info " + std::to_string(i);
    std::string_view name;
    STRATA_RETURN_IF_ERROR(r.ReadString(&name, idx + " name", kMaxTensorNameBytes));
    if (name.empty()) return Status::Corruption(path_ + ": " + idx + ": empty tensor name");
    const std::string what = "tensor '" + std::string(name) + "'";
    if (!names.insert(name).second) {
      return Status::Corruption(path_ + ": " + what + " appears twice");
    }
    GgufTensor t;
    t.name = std::string(name);
    uint32_t n_dims = 0;
    STRATA_RETURN_IF_ERROR(r.Read(&n_dims, what + " n_dims"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return Status::Corruption(path_ + ": " + what + ": n_dims " + std::to_string(n_dims) +
                                " is outside 1.." + std::to_string(kMaxDims));
    }
    t.n_dims = static_cast<int32_t>(n_dims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      STRATA_RETURN_IF_ERROR(r.Read(&ne, what + " ne[" + std::to_string(d) + "]"));
      const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      if (ne == 0 || ne > limit) {
        return Status::Corruption(path_ + ": " + what + ": ne[" + std::to_string(d) + "] = " +
                                  std::to_string(ne) + " is outside 1.." + std::to_string(limit));
      }
      if (n_elements > limit / ne) {
        return Status::Corruption(path_ + ": " + what + ": element count overflows at ne[" +
                                  std::to_string(d) + "] = " + std::to_string(ne) + " (limit " +
                                  std::to_string(limit) + " elements)");
      }
      n_elements *= ne;
      t.ne[d] = static_cast<int64_t>(ne);
    }
    uint32_t raw_type = 0;
    STRATA_RETURN_IF_ERROR(r.Read(&raw_type, what + " type"));
    const kernels::TypeInfo* info = kernels::FindTypeInfo(raw_type);
    if (info == nullptr) {
      return Status::NotSupported(path_ + ": " + what + ": unknown tensor type " +
                                  std::to_string(raw_type));
    }
    t.type = info->type;
    if (t.ne[0] % info->block_elems != 0) {
      return Status::Corruption(path_ + ": " + what + ": ne[0] = " + std::to_string(t.ne[0]) +
                                " is not a whole number of " + info->name + " blocks (" +
                                std::to_string(info->block_elems) + " values each)");
    }
    const uint64_t row_bytes =
        static_cast<uint64_t>(t.ne[0] / info->block_elems) * info->block_bytes;
    const uint64_t rows = n_elements / static_cast<uint64_t>(t.ne[0]);
    if (row_bytes != 0 && rows > std::numeric_limits<uint64_t>::max() / row_bytes) {
      return Status::Corruption(path_ + ": " + what + ": byte size overflows");
    }
    t.nbytes = row_bytes * rows;
    STRATA_RETURN_IF_ERROR(r.Read(&t.offset, what + " offset"));
    if (t.offset % alignment_ != 0) {
      return Status::Corruption(path_ + ": " + what + ": offset " + std::to_string(t.offset) +
                                " is not a multiple of the alignment " +
                                std::to_string(alignment_));
    }
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the infos.
  const uint64_t end_of_infos = r.pos();
  data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > size_) {
    return Status::Corruption(
        path_ + ": data section at offset " + std::to_string(data_offset_) + " (infos end at " +
        std::to_string(end_of_infos) + ", aligned to " + std::to_string(alignment_) +
        ") starts past the end of the file (size " + std::to_string(size_) + ")");
  }
  const uint64_t data_size = tensors_.empty() ? 0 : size_ - data_offset_;
  for (GgufTensor& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return Status::Corruption(path_ + ": tensor '" + t.name + "': data at offset " +
                                std::to_string(t.offset) + " + " + std::to_string(t.nbytes) +
                                " bytes runs past the end of the data section (" +
                                std::to_string(data_size) + " bytes)");
    }
    t.data = base_ + data_offset_ + t.offset;
  }
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensor& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  // Zero-size tensors cannot exist (every ne > 0), so equal offsets always overlap.
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor* a = by_offset[i - 1];
    const GgufTensor* b = by_offset[i];
    if (a->offset + a->nbytes > b->offset) {
      return Status::Corruption(path_ + ": tensor '" + a->name + "' (offset " +
                                std::to_string(a->offset) + ", " + std::to_string(a->nbytes) +
                                " bytes) overlaps tensor '" + b->name + "' (offset " +
                                std::to_string(b->offset) + ")");
    }
  }
  for (size_t i = 0; i < kv_.size(); ++i) kv_index_.emplace(kv_[i].first, i);
  for (size_t i = 0; i < tensors_.size(); ++i) tensor_index_.emplace(tensors_[i].name, i);
  return Status::OK();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  if (kv_index_.empty()) {  // still parsing
    for (const auto& [k, v] : kv_) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace strata
