#include "runtime/kv/disk/disk_kv_select.h"

#include <algorithm>
#include <cstring>

#include "common/thread_pool.h"
#include "runtime/kv/disk/disk_kv_view.h"
#include "runtime/model/model.h"

namespace strata {

DiskKvSelector::DiskKvSelector(const DiskKvOptions& options, const DiskKvPlan& plan,
                               int32_t n_layer)
    : options_(options), plan_(plan), schedule_{options.refine, n_layer} {}

Status DiskKvSelector::Create(const Model& model, const AdapterSet& set,
                              const DiskKvOptions& options, const DiskKvPlan& plan, int32_t n_ctx,
                              int32_t max_sequences, ThreadPool* pool,
                              std::unique_ptr<DiskKvSelector>* out) {
  const HParams& hp = model.hparams();
  std::unique_ptr<DiskKvSelector> sel(new DiskKvSelector(options, plan, hp.n_layer));
  STRATA_RETURN_IF_ERROR(GroupPredictor::Create(model, set, options.scoring,
                                                plan.summary_score_type(), n_ctx, max_sequences,
                                                pool, &sel->predictor_));
  sel->pool_ = pool;
  sel->predictor_->ReserveGroupSize(plan.summary_group_size());
  sel->q_lr_.resize(size_t(max_sequences) * hp.n_head * plan.rank);
  sel->x_.resize(size_t(max_sequences) * hp.n_embd);
  sel->group_keys_.resize(size_t(plan.layout.group_size) * size_t(plan.layout.row));
  sel->scratch_.resize(max_sequences >= 2 ? size_t(pool->size()) : 1);
  for (Scratch& s : sel->scratch_) {
    s.favored.reserve(size_t(*std::max_element(plan.layer_slots.begin(), plan.layer_slots.end()) +
                             plan.transient_groups));
    s.scores.reserve(size_t(*std::max_element(plan.layer_groups.begin(), plan.layer_groups.end())));
  }
  *out = std::move(sel);
  return Status::OK();
}

void DiskKvSelector::Select(int32_t layer, const float* x, int64_t n_embd,
                            std::span<disk_kv::Sequence* const> batch, bool refining,
                            std::vector<disk_kv::Sequence*>* selected) {
  rows_.clear();
  pos_.clear();
  for (disk_kv::Sequence* s : batch) {
    if (s->exact) continue;
    std::memcpy(x_.data() + rows_.size() * n_embd, x + int64_t(s->row) * n_embd,
                size_t(n_embd) * sizeof(float));
    rows_.push_back(s);
    pos_.push_back(s->length);
  }
  if (rows_.empty()) return;
  predictor_->LowRankQueries(layer, x_.data(), int64_t(rows_.size()), pos_.data(), q_lr_.data());
  // Two or more sequences select side by side, each whole on one worker: a selection's
  // serial tail (softmax over groups, partition, slot planning) otherwise leaves the other
  // cores idle. Their reads join the batch afterwards in sequence order, as one at a time.
  const size_t n = rows_.size();
  if (n >= 2 && scratch_.size() >= 2) {
    pool_->Run(int64_t(n),
               [&](int64_t j, int worker) { SelectOne(layer, size_t(j), refining, worker); });
  } else {
    for (size_t j = 0; j < n; ++j) SelectOne(layer, j, refining, -1);
  }
  selected->insert(selected->end(), rows_.begin(), rows_.end());
}

void DiskKvSelector::SelectOne(int32_t layer, size_t j, bool refining, int worker) {
  const int32_t G = plan_.layout.group_size, rank = plan_.rank;
  const int32_t n_head = predictor_->n_head();
  Scratch& sc = scratch_[size_t(std::max(worker, 0))];
  disk_kv::Sequence& s = *rows_[j];
  disk_kv::Layer& L = s.layers[size_t(layer)];
  const int32_t gp = s.length / G;
  const int32_t g_lo = std::min(plan_.sink_groups, gp);
  const int32_t g_hi = std::max(g_lo, gp - plan_.recent_groups);
  // A new step's read-through records are gone (later layers read into their buffer);
  // the refinement keeps what the guess read through this step.
  if (schedule_.FirstSelection(layer, refining)) L.reuse.ForgetTransient();
  sc.favored.clear();
  const float bonus = plan_.layer_bonus[size_t(layer)];
  if (bonus > 0)
    for (int32_t slot = 0; slot < L.reuse.size(); ++slot)
      if (L.reuse.group_of(slot) >= 0) sc.favored.push_back(L.reuse.group_of(slot));
  const bool read_through = L.reuse.transient() > 0;
  predictor_->SelectGroups(
      q_lr_.data() + j * n_head * rank, L.klr, g_lo, g_hi, plan_.summary_group_size(),
      plan_.layer_groups[size_t(layer)], &L.selected, sc.favored, bonus,
      RowSpread{L.spread, options_.group_spread}, read_through ? &sc.scores : nullptr, worker);
  if (read_through && options_.read_through_span > 1)
    predictor_->SpanReadThrough(g_lo, g_hi,
                                plan_.layer_groups[size_t(layer)] - plan_.transient_groups,
                                options_.read_through_span, &L.selected, &sc.scores, worker);
  L.reuse.Resolve(L.selected, &L.placed,
                  read_through ? std::span<const float>(sc.scores) : std::span<const float>());
  // The view follows the step's last selection of the layer.
  if (plan_.tail && (refining || !schedule_.Refined(layer)))
    TailRatios(layer, s, g_lo, g_hi, worker);
}

void DiskKvSelector::TailRatios(int32_t layer, disk_kv::Sequence& s, int32_t n_sink, int32_t g_hi,
                                int worker) {
  disk_kv::Layer& L = s.layers[size_t(layer)];
  Scratch& sc = scratch_[size_t(std::max(worker, 0))];
  const int32_t G = plan_.layout.group_size, p = s.length;
  std::fill(L.tail_ratio.begin(), L.tail_ratio.end(), 0.0f);
  if (layer < options_.tail_first_layer || options_.tail_weight == 0.0f) return;
  // What the view will read: slots' groups among those the selection scored, [n_sink, g_hi),
  // and the sink and ring runs outside them (the new token has no summary row yet; its
  // share is left to attention).
  sc.attended.clear();
  sc.outside.clear();
  disk_kv::ForEachViewed(plan_, options_.attend_resident, L, p,
                         [&](disk_kv::Viewed kind, int32_t g, int32_t, int32_t n) {
                           if (kind == disk_kv::Viewed::kSink || kind == disk_kv::Viewed::kRing) {
                             const int64_t begin = int64_t(g) * G,
                                           end = std::min<int64_t>(begin + n, p);
                             if (end > begin) sc.outside.push_back({begin, end});
                           } else {
                             sc.attended.push_back(g);
                           }
                         });
  // Nothing left out (also where the selection took every group without scoring them).
  if (int32_t(sc.attended.size()) >= g_hi - n_sink) return;
  predictor_->TailRatios(L.klr, n_sink, g_hi, sc.attended, sc.outside, worker, L.tail_ratio.data());
  for (float& r : L.tail_ratio) r *= options_.tail_weight;
}

void DiskKvSelector::SummarizeKeys(int32_t layer, const float* k, int32_t n, int32_t pos,
                                   disk_kv::Layer& L) {
  if (!plan_.group_summary) predictor_->ProjectKeys(layer, k, n, pos, L.klr);
}

void DiskKvSelector::SummarizeRecord(int32_t layer, const std::byte* record, int32_t g,
                                     disk_kv::Layer& L) {
  if (!plan_.group_summary) return;
  // From the record, not the F32 keys, so that prefill and decode give a group the same row.
  plan_.layout.GetKeysF32(record, plan_.layout.group_size, group_keys_.data());
  predictor_->ProjectGroup(layer, group_keys_.data(), plan_.layout.group_size, g, L.klr, L.spread);
}

}  // namespace strata
