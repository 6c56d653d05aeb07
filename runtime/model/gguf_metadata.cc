// Typed access to GGUF metadata (GgufFile's getters), kept apart from the parser.
#include <cstring>
#include <limits>
#include <string>

#include "runtime/model/gguf.h"

namespace strata {

namespace {

Status TypeMismatch(const std::string& path, std::string_view key, const GgufValue& v,
                    const char* wanted) {
  std::string actual = GgufValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) {
    actual = std::string("array of ") + GgufValueTypeName(v.elem_type);
  }
  return Status::InvalidArgument(path + ": metadata '" + std::string(key) + "' has type " + actual +
                                 " (" + wanted + " expected)");
}

Status Missing(const std::string& path, std::string_view key) {
  return Status::NotFound(path + ": metadata '" + std::string(key) + "' is missing");
}

bool IsInteger(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// Reads element i of a numeric array (unaligned little-endian) widened to int64/double.
template <typename T>
T LoadAt(const uint8_t* p, uint64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// Integer element i as a (value, is_negative) pair that covers all of uint64 and int64.
bool ArrayIntAt(const GgufValue& v, uint64_t i, uint64_t* mag, bool* negative) {
  int64_t s = 0;
  *negative = false;
  switch (v.elem_type) {
    case GgufValueType::kUint8:
      *mag = LoadAt<uint8_t>(v.array_data, i);
      return true;
    case GgufValueType::kUint16:
      *mag = LoadAt<uint16_t>(v.array_data, i);
      return true;
    case GgufValueType::kUint32:
      *mag = LoadAt<uint32_t>(v.array_data, i);
      return true;
    case GgufValueType::kUint64:
      *mag = LoadAt<uint64_t>(v.array_data, i);
      return true;
    case GgufValueType::kInt8:
      s = LoadAt<int8_t>(v.array_data, i);
      break;
    case GgufValueType::kInt16:
      s = LoadAt<int16_t>(v.array_data, i);
      break;
    case GgufValueType::kInt32:
      s = LoadAt<int32_t>(v.array_data, i);
      break;
    case GgufValueType::kInt64:
      s = LoadAt<int64_t>(v.array_data, i);
      break;
    default:
      return false;
  }
  *negative = s < 0;
  *mag = s < 0 ? static_cast<uint64_t>(-(s + 1)) + 1 : static_cast<uint64_t>(s);
  return true;
}

}  // namespace

Status GgufFile::GetString(std::string_view key, std::string* out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufValueType::kString) return TypeMismatch(path_, key, *v, "string");
  *out = std::string(std::get<std::string_view>(v->scalar));
  return Status::OK();
}

Status GgufFile::GetU64(std::string_view key, uint64_t* out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (!IsInteger(v->type)) return TypeMismatch(path_, key, *v, "an integer");
  if (const int64_t* s = std::get_if<int64_t>(&v->scalar)) {
    if (*s < 0) {
      return Status::InvalidArgument(path_ + ": metadata '" + std::string(key) + "' value " +
                                     std::to_string(*s) + " is negative");
    }
    *out = static_cast<uint64_t>(*s);
  } else {
    *out = std::get<uint64_t>(v->scalar);
  }
  return Status::OK();
}

Status GgufFile::GetU32(std::string_view key, uint32_t* out) const {
  uint64_t u = 0;
  STRATA_RETURN_IF_ERROR(GetU64(key, &u));
  if (u > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument(path_ + ": metadata '" + std::string(key) + "' value " +
                                   std::to_string(u) + " exceeds the uint32 limit");
  }
  *out = static_cast<uint32_t>(u);
  return Status::OK();
}

Status GgufFile::GetF32(std::string_view key, float* out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type == GgufValueType::kFloat32 || v->type == GgufValueType::kFloat64) {
    *out = static_cast<float>(std::get<double>(v->scalar));
  } else if (IsInteger(v->type)) {
    if (const int64_t* s = std::get_if<int64_t>(&v->scalar)) {
      *out = static_cast<float>(*s);
    } else {
      *out = static_cast<float>(std::get<uint64_t>(v->scalar));
    }
  } else {
    return TypeMismatch(path_, key, *v, "a number");
  }
  return Status::OK();
}

Status GgufFile::GetBool(std::string_view key, bool* out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufValueType::kBool) return TypeMismatch(path_, key, *v, "bool");
  *out = std::get<bool>(v->scalar);
  return Status::OK();
}

Status GgufFile::GetStringArray(std::string_view key,
                                const std::vector<std::string_view>** out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString) {
    return TypeMismatch(path_, key, *v, "array of string");
  }
  *out = &v->strings;
  return Status::OK();
}

Status GgufFile::GetI32Array(std::string_view key, std::vector<int32_t>* out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufValueType::kArray || !IsInteger(v->elem_type)) {
    return TypeMismatch(path_, key, *v, "array of integers");
  }
  out->resize(v->array_len);
  for (uint64_t i = 0; i < v->array_len; ++i) {
    uint64_t mag = 0;
    bool neg = false;
    ArrayIntAt(*v, i, &mag, &neg);
    const uint64_t limit = neg ? uint64_t{1} << 31 : (uint64_t{1} << 31) - 1;
    if (mag > limit) {
      return Status::InvalidArgument(path_ + ": metadata '" + std::string(key) + "' element " +
                                     std::to_string(i) + " does not fit in int32");
    }
    (*out)[i] = neg ? static_cast<int32_t>(-static_cast<int64_t>(mag)) : static_cast<int32_t>(mag);
  }
  return Status::OK();
}

Status GgufFile::GetF32Array(std::string_view key, std::vector<float>* out) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (v->type != GgufValueType::kArray ||
      (v->elem_type != GgufValueType::kFloat32 && v->elem_type != GgufValueType::kFloat64)) {
    return TypeMismatch(path_, key, *v, "array of float32");
  }
  out->resize(v->array_len);
  for (uint64_t i = 0; i < v->array_len; ++i) {
    (*out)[i] = v->elem_type == GgufValueType::kFloat32
                    ? LoadAt<float>(v->array_data, i)
                    : static_cast<float>(LoadAt<double>(v->array_data, i));
  }
  return Status::OK();
}

}  // namespace strata
