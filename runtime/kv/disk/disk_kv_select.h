// DiskKvSelector: what the disk KV policy reads (internal to runtime/kv/disk).
//
// Owns the group predictor (the adapters' low-rank query projection and the scoring of the
// key summary), the per-worker lists one selection needs, and the gathered inputs of the
// sequences that decode in a pass. For a layer it computes those sequences' low-rank queries
// from the layer's input rows, picks each one's top groups (GroupPredictor::SelectGroups,
// with the resident bonus, read-through priorities and spans), places them in the
// sequence's reuse buffer (Layer::selected, Layer::placed) and, with kv.experimental.attend_tail,
// the share of attention the view will leave out. It also keeps the key summary up to date as
// tokens and full groups arrive.
//
// It issues no I/O (DiskKvStore turns placements into reads) and assembles no view
// (disk_kv_view.h). Called from the engine thread; sequences select side by side on the
// pool's workers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/kv/disk/adapters.h"
#include "runtime/kv/disk/disk_kv_plan.h"
#include "runtime/kv/disk/disk_kv_state.h"
#include "runtime/kv/disk/group_predictor.h"
#include "runtime/kv/kv_options.h"

namespace strata {

class ThreadPool;

class DiskKvSelector {
 public:
  static Status Create(const Model& model, const AdapterSet& set, const DiskKvOptions& options,
                       const DiskKvPlan& plan, int32_t n_ctx, int32_t max_sequences,
                       ThreadPool* pool, std::unique_ptr<DiskKvSelector>* out);

  // Selects `layer`'s groups for the sequences of `batch` that decode (not exact), x being
  // the rows of the layer's input (or, for the early guess, the previous layer's) at each
  // sequence's Sequence::row. `refining`: the selection from the exact query after a guess.
  // Appends the sequences it selected for, in batch order, to *selected.
  void Select(int32_t layer, const float* x, int64_t n_embd,
              std::span<disk_kv::Sequence* const> batch, bool refining,
              std::vector<disk_kv::Sequence*>* selected);

  // The key summary of a layer takes n new tokens at position pos (a per-token summary), or
  // group g's full record (a per-group summary, kv.group_summary); each is a no-op for the
  // other kind of summary.
  void SummarizeKeys(int32_t layer, const float* k, int32_t n, int32_t pos, disk_kv::Layer& L);
  void SummarizeRecord(int32_t layer, const std::byte* record, int32_t g, disk_kv::Layer& L);

  const disk_kv::RefineSchedule& schedule() const { return schedule_; }
  const GroupPredictor& predictor() const { return *predictor_; }

 private:
  DiskKvSelector(const DiskKvOptions& options, const DiskKvPlan& plan, int32_t n_layer);
  // Sequence j of the gathered rows picks its groups; worker as in GroupPredictor::SelectGroups.
  void SelectOne(int32_t layer, size_t j, bool refining, int worker);
  // kv.experimental.attend_tail: layer's left-out share per query head after a selection on
  // `worker` that scored groups [n_sink, g_hi) (the sink groups before, the recent and rolling
  // after).
  void TailRatios(int32_t layer, disk_kv::Sequence& s, int32_t n_sink, int32_t g_hi, int worker);

  const DiskKvOptions options_;
  const DiskKvPlan plan_;
  const disk_kv::RefineSchedule schedule_;
  std::unique_ptr<GroupPredictor> predictor_;
  ThreadPool* pool_ = nullptr;
  // The pass's decode sequences: their input rows, positions and low-rank queries.
  std::vector<disk_kv::Sequence*> rows_;
  std::vector<int32_t> pos_;
  std::vector<float> x_, q_lr_;
  // One selection's lists, per pool worker (sequences select side by side at batch > 1).
  struct Scratch {
    std::vector<int32_t> favored;   // groups in memory, for the resident bonus
    std::vector<float> scores;      // the selection's scores (priorities with read-through)
    std::vector<int32_t> attended;  // TailRatios: the scored groups attention reads
    std::vector<GroupPredictor::TokenRun> outside;  // TailRatios: the other runs it reads
  };
  std::vector<Scratch> scratch_;
  std::vector<float> group_keys_;  // one group's keys as F32 (SummarizeRecord)
};

}  // namespace strata
