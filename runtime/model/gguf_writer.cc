#include "runtime/model/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace strata {

namespace {

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

void PadTo(std::vector<uint8_t>* out, uint64_t alignment) {
  out->resize((out->size() + alignment - 1) / alignment * alignment, 0);
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) alignment_ = 32;
  if (alignment_ != 32) AddU32("general.alignment", alignment_);
}

void GgufWriter::AddScalar(std::string_view key, GgufValueType t, const void* p, size_t n) {
  Entry e{std::string(key), t, {}};
  e.value.resize(n);
  std::memcpy(e.value.data(), p, n);
  kvs_.push_back(std::move(e));
}

void GgufWriter::AddU8(std::string_view k, uint8_t v) {
  AddScalar(k, GgufValueType::kUint8, &v, 1);
}
void GgufWriter::AddI8(std::string_view k, int8_t v) { AddScalar(k, GgufValueType::kInt8, &v, 1); }
void GgufWriter::AddU16(std::string_view k, uint16_t v) {
  AddScalar(k, GgufValueType::kUint16, &v, 2);
}
void GgufWriter::AddI16(std::string_view k, int16_t v) {
  AddScalar(k, GgufValueType::kInt16, &v, 2);
}
void GgufWriter::AddU32(std::string_view k, uint32_t v) {
  AddScalar(k, GgufValueType::kUint32, &v, 4);
}
void GgufWriter::AddI32(std::string_view k, int32_t v) {
  AddScalar(k, GgufValueType::kInt32, &v, 4);
}
void GgufWriter::AddU64(std::string_view k, uint64_t v) {
  AddScalar(k, GgufValueType::kUint64, &v, 8);
}
void GgufWriter::AddI64(std::string_view k, int64_t v) {
  AddScalar(k, GgufValueType::kInt64, &v, 8);
}
void GgufWriter::AddF32(std::string_view k, float v) {
  AddScalar(k, GgufValueType::kFloat32, &v, 4);
}
void GgufWriter::AddF64(std::string_view k, double v) {
  AddScalar(k, GgufValueType::kFloat64, &v, 8);
}
void GgufWriter::AddBool(std::string_view k, bool v) {
  const uint8_t b = v ? 1 : 0;
  AddScalar(k, GgufValueType::kBool, &b, 1);
}

void GgufWriter::AddString(std::string_view key, std::string_view v) {
  Entry e{std::string(key), GgufValueType::kString, {}};
  PutString(&e.value, v);
  kvs_.push_back(std::move(e));
}

void GgufWriter::AddStringArray(std::string_view key, const std::vector<std::string>& v) {
  Entry e{std::string(key), GgufValueType::kArray, {}};
  Put<uint32_t>(&e.value, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&e.value, v.size());
  for (const std::string& s : v) PutString(&e.value, s);
  kvs_.push_back(std::move(e));
}

void GgufWriter::AddArray(std::string_view key, GgufValueType elem, const void* data, size_t n) {
  Entry e{std::string(key), GgufValueType::kArray, {}};
  Put<uint32_t>(&e.value, static_cast<uint32_t>(elem));
  Put<uint64_t>(&e.value, n);
  const size_t bytes = n * GgufValueTypeSize(elem);
  const auto* p = static_cast<const uint8_t*>(data);
  e.value.insert(e.value.end(), p, p + bytes);
  kvs_.push_back(std::move(e));
}

void GgufWriter::AddI32Array(std::string_view key, std::span<const int32_t> v) {
  AddArray(key, GgufValueType::kInt32, v.data(), v.size());
}
void GgufWriter::AddU32Array(std::string_view key, std::span<const uint32_t> v) {
  AddArray(key, GgufValueType::kUint32, v.data(), v.size());
}
void GgufWriter::AddF32Array(std::string_view key, std::span<const float> v) {
  AddArray(key, GgufValueType::kFloat32, v.data(), v.size());
}

Status GgufWriter::TensorBytes(std::string_view name, kernels::DType type,
                               const std::vector<int64_t>& ne, uint64_t* bytes) {
  const std::string what = "GgufWriter: tensor '" + std::string(name) + "'";
  if (ne.empty() || ne.size() > 4) {
    return Status::InvalidArgument(what + ": " + std::to_string(ne.size()) +
                                   " dims (1..4 allowed)");
  }
  const kernels::TypeInfo& info = kernels::GetTypeInfo(type);
  int64_t rows = 1;
  for (int64_t d : ne) {
    if (d <= 0) return Status::InvalidArgument(what + ": dim " + std::to_string(d) + " <= 0");
  }
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  if (ne[0] % info.block_elems != 0) {
    return Status::InvalidArgument(what + ": ne[0] = " + std::to_string(ne[0]) +
                                   " is not a multiple of the " + info.name + " block (" +
                                   std::to_string(info.block_elems) + ")");
  }
  *bytes = static_cast<uint64_t>(ne[0] / info.block_elems) * info.block_bytes *
           static_cast<uint64_t>(rows);
  return Status::OK();
}

Status GgufWriter::AddTensor(std::string_view name, kernels::DType type, std::vector<int64_t> ne,
                             std::span<const uint8_t> data) {
  uint64_t want = 0;
  STRATA_RETURN_IF_ERROR(TensorBytes(name, type, ne, &want));
  if (data.size() != want) {
    return Status::InvalidArgument("GgufWriter: tensor '" + std::string(name) +
                                   "': " + std::to_string(data.size()) + " bytes given, " +
                                   std::to_string(want) + " expected");
  }
  tensors_.push_back({std::string(name), type, std::move(ne),
                      std::vector<uint8_t>(data.begin(), data.end()), want, nullptr});
  return Status::OK();
}

Status GgufWriter::AddTensorGenerated(std::string_view name, kernels::DType type,
                                      std::vector<int64_t> ne, TensorFill fill) {
  uint64_t bytes = 0;
  STRATA_RETURN_IF_ERROR(TensorBytes(name, type, ne, &bytes));
  if (!fill)
    return Status::InvalidArgument("GgufWriter: tensor '" + std::string(name) +
                                   "' has no generator");
  tensors_.push_back({std::string(name), type, std::move(ne), {}, bytes, std::move(fill)});
  return Status::OK();
}

Status GgufWriter::AddTensorF32(std::string_view name, kernels::DType type, std::vector<int64_t> ne,
                                std::span<const float> values) {
  std::vector<uint8_t> bytes;
  switch (type) {
    case kernels::DType::kF32:
      bytes.resize(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
      break;
    case kernels::DType::kF16:
    case kernels::DType::kBF16:
      bytes.resize(values.size() * 2);
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t h = type == kernels::DType::kF16 ? kernels::F32ToF16(values[i])
                                                        : kernels::F32ToBF16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
      break;
    default:
      return Status::InvalidArgument("GgufWriter: tensor '" + std::string(name) +
                                     "': AddTensorF32 cannot convert to " +
                                     kernels::TypeName(type));
  }
  return AddTensor(name, type, std::move(ne), bytes);
}

Status GgufWriter::Emit(const std::function<Status(std::span<const uint8_t>)>& sink,
                        GgufLayout* layout) const {
  GgufLayout l;
  std::vector<uint8_t> out;
  Put<uint32_t>(&out, 0x46554747);  // "GGUF"
  Put<uint32_t>(&out, version_);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kvs_.size());
  for (const Entry& e : kvs_) {
    GgufLayout::Kv k;
    k.key_at = out.size();
    PutString(&out, e.key);
    k.type_at = out.size();
    Put<uint32_t>(&out, static_cast<uint32_t>(e.type));
    k.value_at = out.size();
    out.insert(out.end(), e.value.begin(), e.value.end());
    l.kvs.push_back(k);
  }
  // Tensor data offsets: each tensor starts on an aligned boundary of the data section.
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const Tensor& t : tensors_) {
    offsets.push_back(next);
    next = (next + t.bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    GgufLayout::TensorInfo ti;
    ti.name_at = out.size();
    PutString(&out, t.name);
    ti.n_dims_at = out.size();
    Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    ti.dims_at = out.size();
    for (int64_t d : t.ne) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    ti.type_at = out.size();
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    ti.offset_at = out.size();
    Put<uint64_t>(&out, offsets[i]);
    l.tensors.push_back(ti);
  }
  l.infos_end = out.size();
  PadTo(&out, alignment_);
  l.data_offset = out.size();
  STRATA_RETURN_IF_ERROR(sink(out));
  std::vector<uint8_t> made;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const Tensor& t : tensors_) {
    std::span<const uint8_t> bytes(t.data);
    if (t.fill) {
      made.assign(t.bytes, 0);
      STRATA_RETURN_IF_ERROR(t.fill(std::span<uint8_t>(made)));
      bytes = made;
    }
    STRATA_RETURN_IF_ERROR(sink(bytes));
    const uint64_t pad = (alignment_ - t.bytes % alignment_) % alignment_;
    STRATA_RETURN_IF_ERROR(sink(std::span<const uint8_t>(zeros.data(), pad)));
  }
  if (layout != nullptr) *layout = std::move(l);
  return Status::OK();
}

std::vector<uint8_t> GgufWriter::Serialize(GgufLayout* layout) const {
  std::vector<uint8_t> out;
  const Status st = Emit(
      [&out](std::span<const uint8_t> b) {
        out.insert(out.end(), b.begin(), b.end());
        return Status::OK();
      },
      layout);
  if (!st.ok()) return {};
  return out;
}

Status GgufWriter::WriteFile(const std::string& path) const {
  // Write a sibling temp file and rename it, so a reader never sees a half-written model.
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return Status::FromErrno("GgufWriter: open " + tmp, errno);
  Status st = Emit(
      [f, &tmp](std::span<const uint8_t> b) {
        if (!b.empty() && std::fwrite(b.data(), 1, b.size(), f) != b.size())
          return Status::FromErrno("GgufWriter: write " + tmp, errno);
        return Status::OK();
      },
      nullptr);
  if (std::fclose(f) != 0 && st.ok()) st = Status::FromErrno("GgufWriter: write " + tmp, errno);
  if (!st.ok()) {
    std::remove(tmp.c_str());
    return st;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::FromErrno("GgufWriter: rename " + tmp + " to " + path, err);
  }
  return Status::OK();
}

}  // namespace strata
