// GgufFile: a read-only, memory-mapped GGUF (v2/v3) file.
//
// Open validates the header, every metadata entry and every tensor (type, shape, offset,
// alignment, extent within the file) and refuses anything inconsistent with an error that
// names the file and the field. Tensor data is not copied: Tensor::data points into the
// mapping, which lives as long as the GgufFile. Immutable; safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/status.h"
#include "kernels/types.h"

namespace strata {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", ... as the GGUF spec names the types; "unknown" otherwise.
const char* GgufValueTypeName(GgufValueType t);
// Bytes of one value of a fixed-size type; 0 for string and array.
size_t GgufValueTypeSize(GgufValueType t);

struct GgufValue {
  GgufValueType type = GgufValueType::kUint32;
  GgufValueType elem_type = GgufValueType::kUint32;  // for arrays
  // Scalars are widened: integers to int64/uint64, floats to double. Arrays of strings
  // hold std::string_view into the mapping; numeric arrays point into the mapping.
  std::variant<uint64_t, int64_t, double, bool, std::string_view> scalar;
  const uint8_t* array_data = nullptr;  // numeric arrays: raw little-endian elements
  uint64_t array_len = 0;
  std::vector<std::string_view> strings;  // string arrays
};

struct GgufTensor {
  std::string name;
  kernels::DType type;
  int32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous dimension
  uint64_t offset = 0;           // from the start of the data section
  uint64_t nbytes = 0;
  const void* data = nullptr;  // into the mapping
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
 public:
  static Status Open(const std::string& path, std::unique_ptr<GgufFile>* out);
  // Same validation on a buffer the caller keeps alive (fuzzing, tests).
  static Status FromMemory(const void* data, size_t size, std::unique_ptr<GgufFile>* out);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint32_t alignment() const { return alignment_; }      // general.alignment, default 32
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  // The whole file as mapped (or the caller's buffer): tensors' data point into it.
  const void* base() const { return base_; }

  // Drops the mapped pages wholly inside [p, p + n) from this process's resident memory;
  // a later read maps them from the file again. Does nothing for FromMemory buffers.
  void ReleasePages(const void* p, size_t n) const;

  const GgufValue* Find(std::string_view key) const;
  // Typed getters: NotFound when absent, InvalidArgument naming key and actual type when
  // the type does not fit (any integer type converts if the value is in range).
  Status GetString(std::string_view key, std::string* out) const;
  Status GetU32(std::string_view key, uint32_t* out) const;
  Status GetF32(std::string_view key, float* out) const;
  Status GetBool(std::string_view key, bool* out) const;
  Status GetU64(std::string_view key, uint64_t* out) const;
  // Array getters: NotFound when absent, InvalidArgument when the key is not an array of a
  // fitting element type. Numeric arrays of any integer type convert if every value fits.
  Status GetStringArray(std::string_view key, const std::vector<std::string_view>** out) const;
  Status GetI32Array(std::string_view key, std::vector<int32_t>* out) const;
  Status GetF32Array(std::string_view key, std::vector<float>* out) const;
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }

  const GgufTensor* FindTensor(std::string_view name) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

 private:
  GgufFile() = default;
  Status Parse();
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensor> tensors_;
  // Built once parsing is done (the views point at the keys/names held above).
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace strata
