// GgufWriter: builds a little-endian GGUF v3 (or v2) file: metadata of every type, tensors
// of any type kernels/types.h knows, padded to the alignment. Tensors are either copied in
// (AddTensor) or made when the file is written (AddTensorGenerated), one at a time, so a
// file larger than memory (an 8B model in F16) can be written by a machine that holds one
// tensor of it.
//
// For tests and tools (synthetic models, corrupted files, the tuner's fixtures); it is not
// on the inference path. Serialize can report where each structural field landed so a test
// can corrupt one precisely. Not thread-safe; use one writer per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/types.h"
#include "runtime/model/gguf.h"

namespace strata {

// Byte offsets of the fields of a serialized file, in writing order.
struct GgufLayout {
  struct Kv {
    uint64_t key_at;    // the key's uint64 length
    uint64_t type_at;   // the uint32 value type
    uint64_t value_at;  // the value (for arrays: the element type, then the length)
  };
  struct TensorInfo {
    uint64_t name_at;    // the name's uint64 length
    uint64_t n_dims_at;  // uint32
    uint64_t dims_at;    // n_dims x uint64
    uint64_t type_at;    // uint32
    uint64_t offset_at;  // uint64, relative to the data section
  };
  uint64_t version_at = 4;
  uint64_t tensor_count_at = 8;
  uint64_t kv_count_at = 16;
  std::vector<Kv> kvs;
  std::vector<TensorInfo> tensors;
  uint64_t infos_end = 0;    // first byte after the last tensor info
  uint64_t data_offset = 0;  // start of the data section (aligned)
};

class GgufWriter {
 public:
  // alignment must be a power of two; anything but 32 is also written as general.alignment.
  explicit GgufWriter(uint32_t alignment = 32);

  void set_version(uint32_t v) { version_ = v; }
  uint32_t alignment() const { return alignment_; }

  // Scalars. A key added twice keeps both entries (tests use that for duplicates).
  void AddU8(std::string_view key, uint8_t v);
  void AddI8(std::string_view key, int8_t v);
  void AddU16(std::string_view key, uint16_t v);
  void AddI16(std::string_view key, int16_t v);
  void AddU32(std::string_view key, uint32_t v);
  void AddI32(std::string_view key, int32_t v);
  void AddU64(std::string_view key, uint64_t v);
  void AddI64(std::string_view key, int64_t v);
  void AddF32(std::string_view key, float v);
  void AddF64(std::string_view key, double v);
  void AddBool(std::string_view key, bool v);
  void AddString(std::string_view key, std::string_view v);
  // Arrays. AddArray takes `n` raw little-endian elements of a fixed-size type.
  void AddStringArray(std::string_view key, const std::vector<std::string>& v);
  void AddArray(std::string_view key, GgufValueType elem, const void* data, size_t n);
  void AddI32Array(std::string_view key, std::span<const int32_t> v);
  void AddU32Array(std::string_view key, std::span<const uint32_t> v);
  void AddF32Array(std::string_view key, std::span<const float> v);

  // Copies `data`, which must hold exactly the tensor's bytes (RowBytes(type, ne[0]) times
  // the product of the other dims). ne has 1..4 entries, ne[0] first (contiguous).
  Status AddTensor(std::string_view name, kernels::DType type, std::vector<int64_t> ne,
                   std::span<const uint8_t> data);
  // Fills the tensor's bytes (exactly as many as AddTensor would take) when the file is
  // written. Generators run at every Serialize or WriteFile, in the order the tensors were
  // added, one at a time; each sees a buffer of the tensor's size.
  using TensorFill = std::function<Status(std::span<uint8_t> out)>;
  Status AddTensorGenerated(std::string_view name, kernels::DType type, std::vector<int64_t> ne,
                            TensorFill fill);
  // F32 convenience: converts to `type` when it is F32, F16 or BF16.
  Status AddTensorF32(std::string_view name, kernels::DType type, std::vector<int64_t> ne,
                      std::span<const float> values);

  // The whole file in memory; empty when a generator failed.
  std::vector<uint8_t> Serialize(GgufLayout* layout = nullptr) const;
  // Streams the file to a sibling temporary and renames it to `path`, so a reader never
  // sees a half-written model and a failure leaves no partial file behind.
  Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    GgufValueType type;
    std::vector<uint8_t> value;  // encoded value (for arrays: elem type, length, elements)
  };
  struct Tensor {
    std::string name;
    kernels::DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;  // or, when `fill` is set, made at write time
    uint64_t bytes = 0;
    TensorFill fill;
  };
  void AddScalar(std::string_view key, GgufValueType t, const void* p, size_t n);
  // The tensor's byte count, or an error naming what is wrong with its shape.
  static Status TensorBytes(std::string_view name, kernels::DType type,
                            const std::vector<int64_t>& ne, uint64_t* bytes);
  // Hands the file to `sink` in order: the header and infos, then each tensor's bytes and
  // padding.
  Status Emit(const std::function<Status(std::span<const uint8_t>)>& sink,
              GgufLayout* layout) const;

  uint32_t version_ = 3;
  uint32_t alignment_;
  std::vector<Entry> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace strata
