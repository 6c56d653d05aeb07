#include "runtime/kv/device_view_kv.h"

#include <algorithm>
#include <cstring>

namespace strata {
namespace {

// Bytes of one span's K (or V) rows as gathered: contiguous rows in the span's own type.
size_t RowBytesOf(const kernels::KvSpan& sp, int32_t row) {
  return sp.type == kernels::KvType::kQ8_0 ? size_t(kernels::Q8_0RowBytes(row))
                                           : size_t(row) * sizeof(uint16_t);
}

// Copies n rows of row_bytes that lie `stride_bytes` apart into dst, contiguous.
void GatherRows(const std::byte* src, size_t stride_bytes, int32_t n, size_t row_bytes, char* dst) {
  if (stride_bytes == row_bytes) {
    std::memcpy(dst, src, size_t(n) * row_bytes);
    return;
  }
  for (int32_t t = 0; t < n; ++t)
    std::memcpy(dst + size_t(t) * row_bytes, src + size_t(t) * stride_bytes, row_bytes);
}

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }
size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

DeviceViewKv::DeviceViewKv(std::unique_ptr<KvPolicy> host, std::shared_ptr<CudaDevice> device)
    : host_(std::move(host)), d_(std::move(device)) {}

DeviceViewKv::~DeviceViewKv() {
  (void)d_->Synchronize(CudaDevice::Stream::kCompute);
  for (Half& h : halves_) {
    d_->HostFree(h.host);
    d_->Free(h.dev);
  }
  for (auto& [host, dev] : retired_) {
    d_->HostFree(host);
    d_->Free(dev);
  }
}

Status DeviceViewKv::Create(std::unique_ptr<KvPolicy> host, std::shared_ptr<CudaDevice> device,
                            std::unique_ptr<DeviceViewKv>* out) {
  if (!host || !device) return Status::InvalidArgument("device view: no policy or no device");
  if (host->device_memory())
    return Status::InvalidArgument(std::string("device view: KV policy '") + host->name() +
                                   "' already keeps its KV in GPU memory");
  out->reset(new DeviceViewKv(std::move(host), std::move(device)));
  return Status::OK();
}

Status DeviceViewKv::BeginBatch(std::span<const BatchSeq> batch) {
  STRATA_RETURN_IF_ERROR(host_->BeginBatch(batch));
  batch_seqs_.clear();
  for (const BatchSeq& b : batch) batch_seqs_.push_back(b.seq);
  views_.resize(batch_seqs_.size());
  layer_ = -1;
  return Status::OK();
}

Status DeviceViewKv::Reserve(Half& h, size_t bytes) {
  if (h.used + bytes <= h.capacity) return Status::OK();
  // Views of this layer already handed out point into the current buffers: retire them
  // (freed when the pass ends) rather than free them under a queued kernel.
  if (h.host) retired_.push_back({h.host, h.dev});
  const size_t cap = Align256(std::max(h.capacity * 2, bytes));
  h.host = nullptr;
  h.dev = nullptr;
  h.capacity = 0;
  h.used = 0;
  void* alias = nullptr;
  void* host = nullptr;
  STRATA_RETURN_IF_ERROR(d_->HostAlloc(cap, &host, &alias));
  void* dev = nullptr;
  Status st = d_->Malloc(cap, &dev);
  if (!st.ok()) {
    d_->HostFree(host);
    return st;
  }
  h.host = static_cast<char*>(host);
  h.dev = static_cast<char*>(dev);
  h.capacity = cap;
  staging_peak_ = std::max<uint64_t>(staging_peak_, halves_[0].capacity + halves_[1].capacity);
  return Status::OK();
}

Status DeviceViewKv::View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) {
  size_t slot = 0;
  while (slot < batch_seqs_.size() && batch_seqs_[slot] != seq) ++slot;
  if (slot == batch_seqs_.size())
    return Status::InvalidArgument("device view: sequence " + std::to_string(seq) +
                                   " is not in the pass");
  std::span<const kernels::KvSpan> hv;
  STRATA_RETURN_IF_ERROR(host_->View(layer, seq, &hv));
  // A view the host hands out in windows (its staging bounded by its budget) is gathered
  // whole here: each window's bytes are copied before the next one is asked for.
  KvWindowedView* windows = host_->windowed_view();
  const int32_t more = windows ? windows->MoreWindows(layer, seq) : 0;
  Half& h = halves_[layer % 2];
  if (layer != layer_) {
    // This half last served layer - 2: wait until its upload left the host buffer.
    if (h.uploaded) STRATA_RETURN_IF_ERROR(h.uploaded->Wait());
    h.uploaded.reset();
    h.used = 0;
    layer_ = layer;
  }
  std::vector<kernels::KvSpan>& dv = views_[slot];
  dv.clear();
  for (int32_t w = 0; w <= more; ++w) {
    if (w > 0) STRATA_RETURN_IF_ERROR(windows->NextWindow(layer, seq, &hv));
    STRATA_RETURN_IF_ERROR(Gather(h, hv, &dv));
  }
  *out = dv;
  return Status::OK();
}

Status DeviceViewKv::Gather(Half& h, std::span<const kernels::KvSpan> hv,
                            std::vector<kernels::KvSpan>* dv) {
  const int32_t row = host_->shape().row();
  const size_t f16_row = size_t(row) * sizeof(uint16_t);
  // Raw bytes (as the host holds them) and the F16 expansions of the Q8_0 ones. An F16 span
  // starts on 16 bytes (attention reads its rows in 16-byte pieces) even where Q8_0 rows
  // before it end elsewhere (a Q8_0 row of 192 values is 204 bytes); Q8_0 spans stay packed
  // so that adjacent ones expand in one launch.
  size_t raw = 0, expanded = 0;
  for (const kernels::KvSpan& sp : hv) {
    if (sp.type != kernels::KvType::kQ8_0) raw = Align16(raw);
    raw += 2 * size_t(sp.n_tokens) * RowBytesOf(sp, row);
    if (sp.type == kernels::KvType::kQ8_0) expanded += 2 * size_t(sp.n_tokens) * f16_row;
  }
  STRATA_RETURN_IF_ERROR(Reserve(h, Align256(raw) + expanded));
  const size_t base = h.used;
  const size_t exp_base = base + Align256(raw);
  size_t at = base, exp_at = exp_base;
  // Q8_0 spans are expanded in runs of adjacent ones (one launch per run).
  size_t run_raw = 0, run_rows = 0;
  std::vector<std::pair<size_t, size_t>> runs;  // (raw offset, rows) of each Q8_0 run
  for (const kernels::KvSpan& sp : hv) {
    const size_t rb = RowBytesOf(sp, row);
    const size_t n = size_t(sp.n_tokens);
    kernels::KvSpan d;
    d.n_tokens = sp.n_tokens;
    d.pos0 = sp.pos0;
    d.stride = row;
    d.type = kernels::KvType::kF16;
    if (sp.type == kernels::KvType::kQ8_0) {
      GatherRows(reinterpret_cast<const std::byte*>(sp.qk), size_t(sp.stride), sp.n_tokens, rb,
                 h.host + at);
      GatherRows(reinterpret_cast<const std::byte*>(sp.qv), size_t(sp.stride), sp.n_tokens, rb,
                 h.host + at + n * rb);
      if (run_rows == 0) run_raw = at;
      run_rows += 2 * n;
      d.k = reinterpret_cast<const uint16_t*>(h.dev + exp_at);
      d.v = reinterpret_cast<const uint16_t*>(h.dev + exp_at + n * f16_row);
      exp_at += 2 * n * f16_row;
    } else {
      if (run_rows > 0) runs.push_back({run_raw, run_rows});
      run_rows = 0;
      at = base + Align16(at - base);
      const size_t stride = size_t(sp.stride) * sizeof(uint16_t);
      GatherRows(reinterpret_cast<const std::byte*>(sp.k), stride, sp.n_tokens, rb, h.host + at);
      GatherRows(reinterpret_cast<const std::byte*>(sp.v), stride, sp.n_tokens, rb,
                 h.host + at + n * rb);
      d.k = reinterpret_cast<const uint16_t*>(h.dev + at);
      d.v = reinterpret_cast<const uint16_t*>(h.dev + at + n * rb);
    }
    at += 2 * n * rb;
    dv->push_back(d);
  }
  if (run_rows > 0) runs.push_back({run_raw, run_rows});
  if (raw > 0) {
    STRATA_RETURN_IF_ERROR(
        d_->CopyToDeviceAsync(h.dev + base, h.host + base, raw, CudaDevice::Stream::kCompute));
    // Expansions land in order: run i's rows follow run i-1's.
    size_t exp_off = exp_base;
    for (const auto& [raw_at, rows] : runs) {
      STRATA_RETURN_IF_ERROR(d_->ExpandQ8_0(h.dev + raw_at, int64_t(rows), row,
                                            reinterpret_cast<uint16_t*>(h.dev + exp_off)));
      exp_off += rows * f16_row;
    }
    STRATA_RETURN_IF_ERROR(d_->Record(CudaDevice::Stream::kCompute, &h.uploaded));
  }
  h.used = exp_base + expanded;
  view_bytes_ += raw;
  return Status::OK();
}

Status DeviceViewKv::EndBatch() {
  STRATA_RETURN_IF_ERROR(host_->EndBatch());
  if (!retired_.empty()) {
    STRATA_RETURN_IF_ERROR(d_->Synchronize(CudaDevice::Stream::kCompute));
    for (auto& [host, dev] : retired_) {
      d_->HostFree(host);
      d_->Free(dev);
    }
    retired_.clear();
  }
  return Status::OK();
}

KvCounters DeviceViewKv::counters() const {
  KvCounters c = host_->counters();
  const uint64_t staging = halves_[0].capacity + halves_[1].capacity;
  c.staging_bytes += staging;
  c.peak_staging_bytes = std::max<uint64_t>(c.peak_staging_bytes + staging_peak_, c.staging_bytes);
  return c;
}

}  // namespace strata
