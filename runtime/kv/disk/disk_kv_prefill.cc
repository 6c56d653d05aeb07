// The exact-attention half of DiskKv: passes with more than one new token per sequence
// (prefill) and the reload-everything baseline read each layer's earlier records back into
// staging (in the slot pool, whole or in windows), write the pass's new full groups as they
// arrive, and commit the rolling group only at EndBatch.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/kv/disk/disk_kv.h"

namespace strata {

using disk_kv::kBulkRequestBytes;
using disk_kv::kReadbackTag;

namespace {

constexpr char kWriting[] = "disk KV: writing group records";
constexpr char kReadingBack[] = "disk KV: reading group records back";

// Reads records [first, first + n) of `layer` of a sequence into dst, in pieces that run in
// parallel on the device's queues.
void AddRecordReads(const KvRecordLayout& layout, int32_t region, int32_t layer, int32_t first,
                    int32_t n, std::byte* dst, storage::IoBatch* batch) {
  const uint64_t rec = layout.record_bytes;
  const uint64_t total = uint64_t(n) * rec;
  const uint64_t piece = std::max<uint64_t>(rec, kBulkRequestBytes / rec * rec);
  const uint64_t origin = layout.Offset(region, layer, first);
  for (uint64_t off = 0; off < total; off += piece)
    batch->AddRead(origin + off, dst + off, uint32_t(std::min(piece, total - off)), kReadbackTag);
}

}  // namespace

// Bytes an exact pass of n_new tokens after `length` needs besides the earlier records: its
// new full groups (two layers), the ring as it will stand, and its fresh tokens in F16.
uint64_t DiskKv::PassBytes(int32_t length, int32_t n_new) const {
  const int32_t G = layout_.group_size;
  const uint64_t rec = layout_.record_bytes;
  const uint64_t full = uint64_t((length + n_new) / G - length / G) * rec;
  const uint64_t fresh = uint64_t(length % G + n_new) * uint64_t(layout_.row) * 2;
  return 2 * full + uint64_t(shape_.n_layer) * uint64_t(plan_.ring_records()) * rec +
         2 * ((fresh + 63) / 64 * 64);
}

int32_t DiskKv::max_pass_tokens() const {
  // The pool is the same for every sequence; the worst start is one token short of a group.
  const uint64_t pool = PoolBytes();
  const uint64_t need_min = 3 * uint64_t(layout_.record_bytes);
  int32_t lo = 0, hi = shape_.n_ctx;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (PassBytes(layout_.group_size - 1, mid) + need_min <= pool)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

uint64_t DiskKv::PoolBytes() const {
  uint64_t records = uint64_t(plan_.transient_records());
  for (int32_t l = 0; l < shape_.n_layer; ++l) records += uint64_t(plan_.layer_slots[size_t(l)]);
  return records * layout_.record_bytes;
}

Status DiskKv::PlanStaging(Sequence& s, int32_t n_new) {
  const uint64_t rec = layout_.record_bytes;
  const int32_t G = layout_.group_size;
  const int32_t prior = s.length / G;
  const uint64_t pass = PassBytes(s.length, n_new);
  if (pass + 3 * rec > s.pool_bytes)
    return Status::ResourceExhausted(
        "disk KV: a pass of " + std::to_string(n_new) + " tokens needs " + std::to_string(pass) +
        " bytes of staging inside the sequence's budget, whose slots hold " +
        std::to_string(s.pool_bytes) + "; pass at most " + std::to_string(max_pass_tokens()) +
        " tokens (--batch) or raise kv.budget_bytes");
  auto st = std::make_unique<Staging>();
  // The slots' contents go: forget them (the next decode step selects afresh).
  for (Layer& L : s.layers) L.reuse.Clear();
  const uint64_t room = (s.pool_bytes - pass) / rec;  // records left for the earlier ones
  if (uint64_t(prior) * 2 <= room) {
    st->window_records = prior;
    st->windows = 1;
  } else {
    st->window_records = int32_t(std::min<uint64_t>(room / 3, uint64_t(prior)));
    st->windows = (prior + st->window_records - 1) / st->window_records;
  }
  std::byte* at = s.arena.data();
  const int n_buffers = st->windows > 1 ? 3 : 2;
  for (int i = 0; i < n_buffers; ++i, at += size_t(st->window_records) * rec) st->readback[i] = at;
  const uint64_t full = uint64_t((s.length + n_new) / G - prior) * rec;
  for (int i = 0; i < 2; ++i, at += full) st->records[i] = at;
  st->ring = at;
  at += size_t(shape_.n_layer) * size_t(plan_.ring_records()) * rec;
  const size_t fresh = size_t(s.length % G + n_new) * size_t(layout_.row) * 2;
  st->fresh_k = reinterpret_cast<uint16_t*>(at);
  st->fresh_v = reinterpret_cast<uint16_t*>(at + (fresh + 63) / 64 * 64);
  st->view.reserve(size_t(std::min(prior, st->window_records)) + 1);
  s.staging = std::move(st);
  return Status::OK();
}

void DiskKv::WaitStaging(Sequence& s) {
  if (!s.staging) return;
  for (storage::IoBatch& wb : s.staging->writes) (void)store_->WaitStaging(wb, kWriting);
  (void)store_->WaitStaging(s.staging->window_read, kReadingBack);
}

void DiskKv::AddReadback(int32_t layer, Sequence& s) {
  const int32_t n_prior = s.length / layout_.group_size;
  if (n_prior == 0) return;
  // Window 0 (the whole prefix when it fits), read while the previous layer computes.
  const Staging& st = *s.staging;
  AddRecordReads(layout_, s.region, layer, 0, std::min(n_prior, st.window_records),
                 st.readback[layer % 2], &store_->reads(DiskKvStore::GuessReads(layer)));
}

Status DiskKv::AppendExact(int32_t layer, Sequence& s, const float* k, const float* v) {
  Layer& L = s.layers[size_t(layer)];
  Staging& st = *s.staging;
  const int32_t G = layout_.group_size, row = layout_.row, R = plan_.ring_records();
  const uint32_t rec = layout_.record_bytes;
  const int32_t p0 = s.length, n = s.pending, gp0 = p0 / G, head = p0 - gp0 * G;
  uint16_t* fk = st.fresh_k;
  uint16_t* fv = st.fresh_v;
  // The pass attends over its fresh tokens in F16, whatever the record type.
  if (head > 0) layout_.GetF16(L.ring + size_t(gp0 % R) * rec, 0, head, fk, fv);
  kernels::F32ToF16Row(k, fk + size_t(head) * row, int64_t(n) * row);
  kernels::F32ToF16Row(v, fv + size_t(head) * row, int64_t(n) * row);
  if (!options_.reload_all) selector_->SummarizeKeys(layer, k, n, p0, L);
  if (plan_.tail)
    for (int32_t i = 0; i < n; ++i) kernels::Add(L.v_new.data(), v + size_t(i) * row, row);

  auto fill = [&](std::byte* r, int32_t g) {  // record of group g from the fresh tokens
    const int32_t first = (g - gp0) * G;
    const int32_t count = std::min(G, head + n - first);
    layout_.PutF16(r, 0, fk + size_t(first) * row, fv + size_t(first) * row, count);
  };
  const int32_t gp_end = (p0 + n) / G, n_full = gp_end - gp0;
  if (n_full > 0) {
    storage::IoBatch& wb = st.writes[layer % 2];
    STRATA_RETURN_IF_ERROR(store_->WaitStaging(wb, kWriting));
    wb.Clear();
    std::byte* recs = st.records[layer % 2];
    for (int32_t i = 0; i < n_full; ++i) {
      std::byte* r = recs + size_t(i) * rec;
      fill(r, gp0 + i);
      if (!options_.reload_all) selector_->SummarizeRecord(layer, r, gp0 + i, L);
      if (gp0 + i < plan_.sink_groups)
        std::memcpy(L.sink + size_t(gp0 + i) * rec, r, layout_.payload_bytes);
    }
    const uint64_t total = uint64_t(n_full) * rec;
    const uint64_t piece = std::max<uint64_t>(rec, kBulkRequestBytes / rec * rec);
    const uint64_t origin = layout_.Offset(s.region, layer, gp0);
    for (uint64_t off = 0; off < total; off += piece)
      wb.AddWrite(origin + off, recs + off, uint32_t(std::min(piece, total - off)),
                  uint64_t(s.region));
    STRATA_RETURN_IF_ERROR(store_->SubmitStaging(wb, kWriting));
  }
  // The ring as it must stand after the pass; it replaces the real one only at EndBatch,
  // so an aborted pass leaves the sequence as it was.
  std::byte* ring = st.ring + size_t(layer) * R * rec;
  for (int32_t g = std::max(0, gp_end - plan_.recent_groups); g <= gp_end; ++g) {
    std::byte* dst = ring + size_t(g % R) * rec;
    if (g >= gp0) {
      if ((g - gp0) * G < head + n) fill(dst, g);
    } else {
      std::memcpy(dst, L.ring + size_t(g % R) * rec, rec);
    }
  }
  return Status::OK();
}

Status DiskKv::ViewExact(int32_t layer, Sequence& s, int32_t w) {
  Staging& st = *s.staging;
  const int32_t G = layout_.group_size, gp0 = s.length / G, W = st.window_records;
  const uint32_t rec = layout_.record_bytes;
  // Window 0 lies in the layer's own buffer; window w >= 1 alternates with it in readback[2],
  // each read while the window before it is attended.
  auto buffer = [&](int32_t i) { return i % 2 == 1 ? st.readback[2] : st.readback[layer % 2]; };
  auto wait_window = [&]() { return store_->WaitStaging(st.window_read, kReadingBack); };
  if (w > 0) STRATA_RETURN_IF_ERROR(wait_window());
  if (w == 0 && st.window_layer == layer && st.window0_reused) {
    // The layer is viewed again after its windows moved on: window 0 comes back first.
    STRATA_RETURN_IF_ERROR(wait_window());
    st.window_read.Clear();
    AddRecordReads(layout_, s.region, layer, 0, std::min(W, gp0), buffer(0), &st.window_read);
    STRATA_RETURN_IF_ERROR(store_->SubmitStaging(st.window_read, kReadingBack));
    STRATA_RETURN_IF_ERROR(wait_window());
  }
  if (st.window_layer != layer) st.window0_reused = false;
  st.window_layer = layer;
  st.window = w;
  if (w + 1 < st.windows) {
    // The next window goes where the one before this lay (it has been attended).
    st.window_read.Clear();
    const int32_t first = (w + 1) * W;
    AddRecordReads(layout_, s.region, layer, first, std::min(W, gp0 - first), buffer(w + 1),
                   &st.window_read);
    if ((w + 1) % 2 == 0) st.window0_reused = true;
    STRATA_RETURN_IF_ERROR(store_->SubmitStaging(st.window_read, kReadingBack));
  }
  st.view.clear();
  const std::byte* prior = buffer(w);
  const int32_t g_end = std::min(gp0, (w + 1) * W);
  for (int32_t g = w * W; g < g_end; ++g)
    st.view.push_back(layout_.Span(prior + size_t(g - w * W) * rec, g, G));
  if (w + 1 == st.windows) {
    const int32_t n = s.length - gp0 * G + s.pending;
    st.view.push_back(kernels::KvSpan{st.fresh_k, st.fresh_v, n, gp0 * G, layout_.row});
  }
  return Status::OK();
}

Status DiskKv::FinishExact(Sequence& s) {
  Staging& st = *s.staging;
  for (storage::IoBatch& wb : st.writes) STRATA_RETURN_IF_ERROR(store_->WaitStaging(wb, kWriting));
  STRATA_RETURN_IF_ERROR(store_->WaitStaging(st.window_read, kReadingBack));
  const size_t ring_bytes = size_t(plan_.ring_records()) * layout_.record_bytes;
  for (int32_t l = 0; l < shape_.n_layer; ++l)
    std::memcpy(s.layers[size_t(l)].ring, st.ring + size_t(l) * ring_bytes, ring_bytes);
  return Status::OK();
}

}  // namespace strata
