#include "runtime/kv/disk/adapters.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/file.h"
#include "runtime/model/model.h"

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'K', 'V', 'A', 'D', 'P'};
constexpr uint32_t kVersion = 3;
constexpr uint32_t kOldestVersion = 2;  // no attention profile
constexpr uint32_t kMaxProfilePoints = 256;
// Far above any real model; keeps a damaged count from asking for gigabytes.
constexpr uint32_t kMaxDim = 1 << 16;
constexpr uint32_t kMaxSets = 64;
constexpr uint32_t kMaxNote = 1 << 16;

// FNV-1a 64 (the public FNV reference's offset basis and prime).
uint64_t Fnv64(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

class Writer {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  template <class T>
  void Put(T v) {
    Bytes(&v, sizeof v);  // the project targets little-endian hosts (x86-64, aarch64)
  }
  std::vector<uint8_t>& buf() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  Reader(const std::vector<uint8_t>& b, size_t end, const std::string& path)
      : b_(b), end_(end), path_(path) {}
  template <class T>
  Status Get(const char* field, T* v) {
    return Bytes(field, v, sizeof *v);
  }
  Status Bytes(const char* field, void* p, size_t n) {
    if (end_ - pos_ < n)
      return Status::Corruption("adapters " + path_ + ": file ends inside '" + field +
                                "' at byte " + std::to_string(pos_) + " (truncated?)");
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return Status::OK();
  }
  size_t pos() const { return pos_; }
  size_t left() const { return end_ - pos_; }

 private:
  const std::vector<uint8_t>& b_;
  const size_t end_;
  const std::string& path_;
  size_t pos_ = 0;
};

Status CheckDim(const std::string& path, const char* field, uint32_t v) {
  if (v == 0 || v > kMaxDim)
    return Status::Corruption("adapters " + path + ": " + field + " = " + std::to_string(v) +
                              " is out of range [1, " + std::to_string(kMaxDim) + "]");
  return Status::OK();
}

Status ReadProfile(Reader& r, const std::string& path, uint32_t n_layer, AttentionProfile* p) {
  uint32_t points = 0;
  STRATA_RETURN_IF_ERROR(r.Get("profile points", &points));
  if (points > kMaxProfilePoints)
    return Status::Corruption("adapters " + path + ": profile points " + std::to_string(points) +
                              " exceeds " + std::to_string(kMaxProfilePoints));
  if (points == 0) return Status::OK();
  p->tokens.resize(points);
  for (uint32_t i = 0; i < points; ++i) {
    uint32_t t = 0;
    STRATA_RETURN_IF_ERROR(r.Get("profile tokens", &t));
    if ((i == 0 && t != 0) || (i > 0 && t <= uint32_t(p->tokens[i - 1])) || t > kMaxDim * 16u)
      return Status::Corruption("adapters " + path + ": profile token count " + std::to_string(t) +
                                " at point " + std::to_string(i) + " is not ascending from 0");
    p->tokens[i] = int32_t(t);
  }
  // Allocations follow the file's own counts only when the file holds what they promise.
  if (uint64_t(n_layer) * points * sizeof(float) > r.left())
    return Status::Corruption("adapters " + path + ": the attention profile promises " +
                              std::to_string(uint64_t(n_layer) * points) +
                              " values; the file ends before that");
  p->error.assign(n_layer, std::vector<float>(points));
  for (uint32_t l = 0; l < n_layer; ++l) {
    std::vector<float>& m = p->error[l];
    STRATA_RETURN_IF_ERROR(r.Bytes("profile", m.data(), m.size() * sizeof(float)));
    for (float v : m)
      if (!(v >= 0.0f && v <= AttentionProfile::kMaxError))
        return Status::Corruption("adapters " + path + ": attention profile of layer " +
                                  std::to_string(l) + " holds " + std::to_string(v) +
                                  ", outside [0, " +
                                  std::to_string(int(AttentionProfile::kMaxError)) + "]");
  }
  return Status::OK();
}

}  // namespace

Status RankForRatio(int32_t row, int32_t ratio, int32_t* rank) {
  if (ratio < 1 || ratio > row)
    return Status::OutOfRange("key compression ratio " + std::to_string(ratio) +
                              " is out of range [1, " + std::to_string(row) +
                              "] (n_head_kv*head_dim of the model)");
  *rank = std::max(1, row / ratio);
  return Status::OK();
}

double AttentionProfile::Error(int32_t layer, double t) const {
  const std::vector<float>& m = error[size_t(layer)];
  if (t <= tokens.front()) return m.front();
  for (size_t i = 1; i < tokens.size(); ++i)
    if (t <= tokens[i]) {
      const double f = (t - tokens[i - 1]) / double(tokens[i] - tokens[i - 1]);
      return m[i - 1] + f * (m[i] - m[i - 1]);
    }
  return m.back();
}

double AttentionProfile::Drop(int32_t layer, double t0, double t1) const {
  const std::vector<float>& m = error[size_t(layer)];
  double d = 0;
  for (size_t i = 1; i < tokens.size(); ++i) {
    const double lo = std::max(t0, double(tokens[i - 1])), hi = std::min(t1, double(tokens[i]));
    if (hi > lo) d += (hi - lo) * ((double(m[i - 1]) - m[i]) / (tokens[i] - tokens[i - 1]));
  }
  return d;
}

std::vector<int32_t> AttentionProfile::DefaultTokens() {
  return {0, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096};
}

const AdapterSet* Adapters::Find(int32_t ratio) const {
  for (const AdapterSet& s : sets)
    if (s.ratio == ratio) return &s;
  return nullptr;
}

std::string Adapters::RatioList() const {
  std::string out;
  for (const AdapterSet& s : sets) out += (out.empty() ? "" : ", ") + std::to_string(s.ratio);
  return out;
}

Status Adapters::Write(const std::string& path) const {
  Writer w;
  w.Bytes(kMagic, sizeof kMagic);
  w.Put<uint32_t>(kVersion);
  w.Put<uint64_t>(model_identity);
  w.Put<uint32_t>(uint32_t(n_layer));
  w.Put<uint32_t>(uint32_t(n_head_kv));
  w.Put<uint32_t>(uint32_t(head_dim));
  w.Put<uint64_t>(calibration_tokens);
  w.Put<uint32_t>(uint32_t(note.size()));
  w.Bytes(note.data(), note.size());
  w.Put<uint32_t>(uint32_t(sets.size()));
  for (const AdapterSet& s : sets) {
    w.Put<uint32_t>(uint32_t(s.ratio));
    w.Put<uint32_t>(uint32_t(s.rank));
    w.Put<uint32_t>(s.queries.empty() ? 0u : 1u);
  }
  const size_t per_layer_row = size_t(row());
  for (const AdapterSet& s : sets) {
    if (int32_t(s.layers.size()) != n_layer ||
        (!s.queries.empty() && int32_t(s.queries.size()) != n_layer))
      return Status::Internal("adapters: set for ratio " + std::to_string(s.ratio) + " has " +
                              std::to_string(s.layers.size()) + " layers, expected " +
                              std::to_string(n_layer));
    for (int32_t l = 0; l < n_layer; ++l) {
      for (const auto* m :
           {&s.layers[size_t(l)], s.queries.empty() ? nullptr : &s.queries[size_t(l)]}) {
        if (!m) continue;
        if (m->size() != per_layer_row * size_t(s.rank))
          return Status::Internal("adapters: a layer matrix has the wrong size");
        w.Bytes(m->data(), m->size() * sizeof(float));
      }
    }
  }
  w.Put<uint32_t>(uint32_t(profile.tokens.size()));
  for (int32_t t : profile.tokens) w.Put<uint32_t>(uint32_t(t));
  if (!profile.empty()) {
    if (int32_t(profile.error.size()) != n_layer)
      return Status::Internal("adapters: attention profile has the wrong layer count");
    for (const std::vector<float>& m : profile.error) {
      if (m.size() != profile.tokens.size())
        return Status::Internal("adapters: attention profile has the wrong point count");
      w.Bytes(m.data(), m.size() * sizeof(float));
    }
  }
  const uint64_t sum = Fnv64(w.buf().data(), w.buf().size());
  w.Put<uint64_t>(sum);

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::FromErrno("adapters: creating " + tmp, errno);
    out.write(reinterpret_cast<const char*>(w.buf().data()), std::streamsize(w.buf().size()));
    out.flush();
    if (!out) return Status::FromErrno("adapters: writing " + tmp, errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::FromErrno("adapters: renaming " + tmp + " to " + path, err);
  }
  return Status::OK();
}

std::string Adapters::DefaultPath(const std::string& model_path) {
  const std::string ext = ".gguf";
  if (model_path.size() > ext.size() &&
      model_path.compare(model_path.size() - ext.size(), ext.size(), ext) == 0)
    return model_path.substr(0, model_path.size() - ext.size()) + ".adapters";
  return model_path + ".adapters";
}

Status Adapters::Read(const std::string& path, Adapters* out) {
  std::string s;
  const Status rs = ReadRegularFile(path, "adapters file", kMaxFileBytes, &s);
  if (rs.code() == Status::Code::kNotFound)
    return Status::NotFound("adapters file " + path +
                            " does not exist; make it with `strata calibrate -m MODEL --text "
                            "FILE --ratios 4,8,16,32 -o " +
                            path + "`");
  STRATA_RETURN_IF_ERROR(rs);
  return Parse(std::vector<uint8_t>(s.begin(), s.end()), path, out);
}

Status Adapters::Parse(const std::vector<uint8_t>& b, const std::string& path, Adapters* out,
                       bool verify_checksum) {
  if (b.size() < sizeof kMagic + sizeof(uint64_t))
    return Status::Corruption("adapters " + path + ": " + std::to_string(b.size()) +
                              " bytes is too short to be an adapters file");
  if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0)
    return Status::Corruption("adapters " + path +
                              ": not an adapters file (magic is not STRKVADP)");
  const size_t body = b.size() - sizeof(uint64_t);
  uint64_t stored = 0;
  std::memcpy(&stored, b.data() + body, sizeof stored);
  const uint64_t actual = Fnv64(b.data(), body);
  if (verify_checksum && stored != actual) {
    char msg[160];
    std::snprintf(msg, sizeof msg, ": checksum mismatch (stored %016llx, computed %016llx)",
                  (unsigned long long)stored, (unsigned long long)actual);
    return Status::Corruption("adapters " + path + msg + ": the file is damaged");
  }

  Reader r(b, body, path);
  Adapters a;
  char magic[8];
  STRATA_RETURN_IF_ERROR(r.Bytes("magic", magic, sizeof magic));
  uint32_t version = 0, n_layer = 0, n_head_kv = 0, head_dim = 0, note_len = 0, n_sets = 0;
  STRATA_RETURN_IF_ERROR(r.Get("version", &version));
  if (version < kOldestVersion || version > kVersion)
    return Status::Corruption("adapters " + path + ": version " + std::to_string(version) +
                              " is not a supported version (" + std::to_string(kOldestVersion) +
                              " to " + std::to_string(kVersion) + ")");
  STRATA_RETURN_IF_ERROR(r.Get("model identity", &a.model_identity));
  STRATA_RETURN_IF_ERROR(r.Get("n_layer", &n_layer));
  STRATA_RETURN_IF_ERROR(r.Get("n_head_kv", &n_head_kv));
  STRATA_RETURN_IF_ERROR(r.Get("head_dim", &head_dim));
  STRATA_RETURN_IF_ERROR(CheckDim(path, "n_layer", n_layer));
  STRATA_RETURN_IF_ERROR(CheckDim(path, "n_head_kv", n_head_kv));
  STRATA_RETURN_IF_ERROR(CheckDim(path, "head_dim", head_dim));
  STRATA_RETURN_IF_ERROR(r.Get("calibration tokens", &a.calibration_tokens));
  STRATA_RETURN_IF_ERROR(r.Get("note length", &note_len));
  if (note_len > kMaxNote)
    return Status::Corruption("adapters " + path + ": note length " + std::to_string(note_len) +
                              " exceeds " + std::to_string(kMaxNote));
  a.note.resize(note_len);
  STRATA_RETURN_IF_ERROR(r.Bytes("note", a.note.data(), note_len));
  STRATA_RETURN_IF_ERROR(r.Get("set count", &n_sets));
  if (n_sets == 0 || n_sets > kMaxSets)
    return Status::Corruption("adapters " + path + ": set count " + std::to_string(n_sets) +
                              " is out of range [1, " + std::to_string(kMaxSets) + "]");
  a.n_layer = int32_t(n_layer);
  a.n_head_kv = int32_t(n_head_kv);
  a.head_dim = int32_t(head_dim);
  const uint64_t row = uint64_t(n_head_kv) * head_dim;
  a.sets.resize(n_sets);
  std::vector<uint32_t> has_queries(n_sets);
  for (uint32_t si = 0; si < n_sets; ++si) {
    AdapterSet& set = a.sets[si];
    uint32_t ratio = 0, rank = 0;
    STRATA_RETURN_IF_ERROR(r.Get("ratio", &ratio));
    STRATA_RETURN_IF_ERROR(r.Get("rank", &rank));
    STRATA_RETURN_IF_ERROR(r.Get("has B", &has_queries[si]));
    if (has_queries[si] > 1)
      return Status::Corruption("adapters " + path + ": 'has B' flag " +
                                std::to_string(has_queries[si]) + " is not 0 or 1");
    if (rank == 0 || rank > row || ratio == 0 || ratio > row)
      return Status::Corruption("adapters " + path + ": ratio " + std::to_string(ratio) +
                                " with rank " + std::to_string(rank) + " does not fit row " +
                                std::to_string(row));
    set.ratio = int32_t(ratio);
    set.rank = int32_t(rank);
  }
  // The matrices the header promises must fit in what is left of the file before any of
  // them is allocated. Dimensions at their limits multiply past 64 bits, so the sum is
  // checked for overflow: a wrapped total could otherwise look small enough to allocate.
  uint64_t promised = 0;
  bool overflow = false;
  for (uint32_t si = 0; si < n_sets && !overflow; ++si) {
    uint64_t bytes = (1 + has_queries[si]) * uint64_t(n_layer) * sizeof(float);
    overflow = __builtin_mul_overflow(bytes, row, &bytes) ||
               __builtin_mul_overflow(bytes, uint64_t(a.sets[si].rank), &bytes) ||
               __builtin_add_overflow(promised, bytes, &promised);
  }
  if (overflow || promised > r.left())
    return Status::Corruption(
        "adapters " + path + ": the header promises " +
        (overflow ? std::string("more than 2^64") : std::to_string(promised)) +
        " bytes of matrices; the file has " + std::to_string(r.left()) +
        " left (truncated or damaged)");
  for (uint32_t si = 0; si < n_sets; ++si) {
    AdapterSet& set = a.sets[si];
    set.layers.resize(n_layer);
    if (has_queries[si]) set.queries.resize(n_layer);
    for (uint32_t l = 0; l < n_layer; ++l) {
      for (auto* m : {&set.layers[l], has_queries[si] ? &set.queries[l] : nullptr}) {
        if (!m) continue;
        m->resize(size_t(row) * set.rank);
        STRATA_RETURN_IF_ERROR(r.Bytes("matrix", m->data(), m->size() * sizeof(float)));
        for (float v : *m)
          if (!std::isfinite(v))
            return Status::Corruption("adapters " + path + ": a matrix of ratio " +
                                      std::to_string(set.ratio) + " holds a non-finite value");
      }
    }
  }
  if (version >= 3) STRATA_RETURN_IF_ERROR(ReadProfile(r, path, n_layer, &a.profile));
  if (r.pos() != body)
    return Status::Corruption("adapters " + path + ": " + std::to_string(body - r.pos()) +
                              " unexpected bytes after the " +
                              (version >= 3 ? "attention profile" : "matrices"));
  *out = std::move(a);
  return Status::OK();
}

Status Adapters::CheckModel(const Model& model, const std::string& path) const {
  const HParams& hp = model.hparams();
  if (model_identity != model.identity()) {
    char msg[200];
    std::snprintf(msg, sizeof msg, " were made for model identity %016llx, not for %s (%s)",
                  (unsigned long long)model_identity, model.path().c_str(),
                  model.identity_hex().c_str());
    return Status::InvalidArgument("adapters " + path + msg +
                                   "; run `strata calibrate` for this model");
  }
  if (n_layer != hp.n_layer || n_head_kv != hp.n_head_kv || head_dim != hp.head_dim)
    return Status::InvalidArgument(
        "adapters " + path + " are shaped for " + std::to_string(n_layer) + " layers x " +
        std::to_string(n_head_kv) + " KV heads x " + std::to_string(head_dim) +
        " dims, the model has " + std::to_string(hp.n_layer) + " x " +
        std::to_string(hp.n_head_kv) + " x " + std::to_string(hp.head_dim));
  return Status::OK();
}

}  // namespace strata
