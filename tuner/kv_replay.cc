#include "tuner/kv_replay.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/file.h"
#include "runtime/engine/engine.h"
#include "tuner/work_file.h"

namespace strata {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'K', 'V', 'C', 'A', 'P'};

uint64_t Fnv64(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  return Fnv1a64(p, n, h);
}

// A capture's checksum, after its data: FNV-1a's step over 8 bytes at a time, seeded with
// the capture's key. A capture is tens of megabytes that a tune reads back often; a byte at
// a time would cost several times the read.
uint64_t CaptureSum(uint64_t key, const std::vector<uint16_t>& data) {
  const auto* b = reinterpret_cast<const uint8_t*>(data.data());
  const size_t n = data.size() * sizeof(uint16_t);
  uint64_t h = key ^ 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  return Fnv1a64(b + i, n - i, h);
}

}  // namespace

Status EvaluationTokens(const Model& model, const std::string& text_path, double skip_fraction,
                        std::vector<int32_t>* out) {
  std::string all;
  STRATA_RETURN_IF_ERROR(ReadRegularFile(text_path, "text", kMaxTextBytes, &all));
  size_t start = size_t(double(all.size()) * skip_fraction);
  while (start > 0 && start < all.size() && all[start - 1] != '\n') --start;
  return model.tokenizer().Encode(std::string_view(all).substr(start), false, false, out);
}

uint64_t FullKvBytes(const HParams& hp, int32_t context) {
  return uint64_t(hp.n_layer) * uint64_t(context) * uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim) *
         2 * sizeof(uint16_t);
}

Status CaptureKv(const Model& model, std::span<const int32_t> tokens, int32_t threads,
                 int32_t n_ctx, KvCapture* out, std::unique_ptr<Engine>* engine, SeqId* seq_out) {
  const HParams& hp = model.hparams();
  KvCapture cap;
  cap.n_layer = hp.n_layer;
  cap.row = hp.n_head_kv * hp.head_dim;
  cap.n_tokens = int32_t(tokens.size());
  EngineOptions eo;
  eo.n_threads = threads;
  eo.n_ctx = std::max(n_ctx, cap.n_tokens);
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(Engine::Create(model, eo, &e));
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  std::vector<float> logits;
  STRATA_RETURN_IF_ERROR(e->Prefill(seq, tokens, &logits));
  const size_t n = size_t(cap.n_tokens) * cap.row;
  cap.data.resize(size_t(cap.n_layer) * 2 * n);
  for (int32_t l = 0; l < cap.n_layer; ++l) {
    std::span<const kernels::KvSpan> view;
    STRATA_RETURN_IF_ERROR(e->kv().View(l, seq, &view));
    if (view.size() != 1 || view[0].n_tokens != cap.n_tokens || view[0].stride != cap.row)
      return Status::Internal("capture: the memory policy's view is not one full span");
    std::copy(view[0].k, view[0].k + n, cap.data.begin() + ptrdiff_t(2 * l * n));
    std::copy(view[0].v, view[0].v + n, cap.data.begin() + ptrdiff_t((2 * l + 1) * n));
  }
  *out = std::move(cap);
  if (engine) {
    *engine = std::move(e);
    *seq_out = seq;
  }
  return Status::OK();
}

Status LoadOrCapture(const Model& model, std::span<const int32_t> tokens,
                     const std::string& cache_dir, int32_t threads, KvCapture* out, bool* computed,
                     const std::function<void(const std::string&)>& log) {
  const HParams& hp = model.hparams();
  KvCapture cap;
  cap.n_layer = hp.n_layer;
  cap.row = hp.n_head_kv * hp.head_dim;
  cap.n_tokens = int32_t(tokens.size());
  const uint64_t key = Fnv64(tokens.data(), tokens.size_bytes(), model.identity());
  char name[64];
  std::snprintf(name, sizeof name, "/%016llx.kvcap", (unsigned long long)key);
  const std::string path = cache_dir + name;
  const size_t values = size_t(cap.n_layer) * 2 * cap.n_tokens * cap.row;
  *computed = false;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      char magic[8];
      uint64_t stored_key = 0, stored_sum = 0;
      bool whole = in.read(magic, 8) && std::equal(magic, magic + 8, kMagic) &&
                   in.read(reinterpret_cast<char*>(&stored_key), 8) && stored_key == key;
      if (whole) {
        cap.data.resize(values);
        whole =
            bool(in.read(reinterpret_cast<char*>(cap.data.data()), std::streamsize(values * 2)));
      }
      if (whole) {
        // The checksum after the data; captures written before it end with the data.
        if (in.read(reinterpret_cast<char*>(&stored_sum), 8))
          whole = in.peek() == std::ifstream::traits_type::eof() &&
                  stored_sum == CaptureSum(key, cap.data);
        else
          whole = in.gcount() == 0;
      }
      if (whole) {
        ::chmod(path.c_str(), 0600);  // older versions created it with the umask's mode
        *out = std::move(cap);
        return Status::OK();
      }
      if (log)
        log("work file " + path +
            " is cut short or damaged (its size or checksum does not match); computed again");
      cap.data.clear();
    }
  }
  STRATA_RETURN_IF_ERROR(CaptureKv(model, tokens, threads, 0, &cap));
  STRATA_RETURN_IF_ERROR(MakeWorkDir(cache_dir));
  const uint64_t sum = CaptureSum(key, cap.data);
  const std::string_view parts[] = {
      std::string_view(kMagic, 8), std::string_view(reinterpret_cast<const char*>(&key), 8),
      std::string_view(reinterpret_cast<const char*>(cap.data.data()), values * 2),
      std::string_view(reinterpret_cast<const char*>(&sum), 8)};
  STRATA_RETURN_IF_ERROR(ReplaceWorkFile(path, parts, /*sync=*/false).WithContext("capture"));
  *computed = true;
  *out = std::move(cap);
  return Status::OK();
}

Status CreateRunEngine(const Model& model, int32_t threads, int32_t n_ctx, int32_t max_sequences,
                       const DiskKvOptions* disk, std::unique_ptr<Engine>* out,
                       int32_t cuda_device) {
  EngineOptions eo;
  eo.cuda_device = cuda_device;
  eo.n_threads = threads;
  eo.n_ctx = n_ctx;
  eo.max_sequences = max_sequences;
  if (disk) {
    eo.kv.policy = KvPolicyKind::kDisk;
    eo.kv.disk = *disk;
  }
  return Engine::Create(model, eo, out);
}

Status ReplayPrefix(KvPolicy& kv, SeqId seq, const KvCapture& cap, int32_t n) {
  if (n > cap.n_tokens || kv.Length(seq) != 0)
    return Status::InvalidArgument("replay: prefix longer than the capture or sequence not empty");
  // In passes the policy can take (the disk policy stages a pass inside its budget).
  const int32_t most = std::max(1, kv.max_pass_tokens());
  std::vector<float> k, v;
  for (int32_t p0 = 0; p0 < n; p0 += most) {
    const int32_t m = std::min(most, n - p0);
    BatchSeq b{seq, p0, m};
    STRATA_RETURN_IF_ERROR(kv.BeginBatch({&b, 1}));
    k.resize(size_t(m) * cap.row);
    v.resize(size_t(m) * cap.row);
    for (int32_t l = 0; l < cap.n_layer; ++l) {
      kernels::F16ToF32Row(cap.k(l) + size_t(p0) * cap.row, k.data(), int64_t(k.size()));
      kernels::F16ToF32Row(cap.v(l) + size_t(p0) * cap.row, v.data(), int64_t(v.size()));
      Status st = kv.Append(l, seq, k.data(), v.data());
      if (!st.ok()) {
        kv.AbortBatch();
        return st;
      }
    }
    STRATA_RETURN_IF_ERROR(kv.EndBatch());
  }
  return Status::OK();
}

Status ReplayWindows(Engine& e, int32_t batch, int32_t windows, const WindowSource& source,
                     int32_t n, std::vector<SeqId>* seqs, std::vector<size_t>* begins) {
  seqs->assign(size_t(std::max(0, batch)), SeqId{});
  begins->assign(seqs->size(), 0);
  windows = std::max(1, std::min(batch, windows));
  for (int32_t w = 0; w < windows; ++w) {
    std::shared_ptr<const KvCapture> cap;
    size_t begin = 0;
    STRATA_RETURN_IF_ERROR(source(w, &cap, &begin));
    for (int32_t i = w; i < batch; i += windows) {
      (*begins)[size_t(i)] = begin;
      STRATA_RETURN_IF_ERROR(e.NewSequence(&(*seqs)[size_t(i)]));
      STRATA_RETURN_IF_ERROR(ReplayPrefix(e.kv(), (*seqs)[size_t(i)], *cap, n));
    }
  }
  return Status::OK();
}

}  // namespace strata
