// MemoryKv: the plain policy that keeps every sequence's K and V in RAM as F16.
//
// Each sequence owns one reservation per layer sized for the whole context; pages are
// committed by the OS only when touched, so a short sequence costs what it uses. The view
// of a (layer, sequence) is a single span. Thread-compatible; see KvPolicy for the calling
// protocol.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "platforms/tier_memory.h"
#include "runtime/kv/kv_policy.h"

namespace strata {

class MemoryKv final : public KvPolicy {
 public:
  // max_sequences bounds how many sequences may exist at once (each reserves address
  // space for n_ctx tokens; nothing is committed until written).
  // memory: where the KV lives (null: host RAM, reserved per sequence and committed on
  // touch; a GPU's memory: allocated per sequence there, and Append takes device pointers).
  static Status Create(const KvShape& shape, int32_t max_sequences, std::unique_ptr<MemoryKv>* out,
                       TierMemory* memory = nullptr);
  ~MemoryKv() override;

  const char* name() const override { return "memory"; }
  const KvShape& shape() const override { return shape_; }
  Status AddSequence(SeqId* out) override;
  Status RemoveSequence(SeqId seq) override;
  Status ForkSequence(SeqId src, SeqId* out) override;
  int32_t Length(SeqId seq) const override;
  Status BeginBatch(std::span<const BatchSeq> batch) override;
  Status Append(int32_t layer, SeqId seq, const float* k, const float* v) override;
  Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override;
  Status EndBatch() override;
  void AbortBatch() override;
  KvCounters counters() const override;
  bool device_memory() const override { return memory_ != nullptr && memory_->device(); }
  bool views_precomputable() const override { return device_memory(); }

 private:
  struct Sequence;
  MemoryKv(const KvShape& shape, int32_t max_sequences);
  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;

  const KvShape shape_;
  const int32_t max_sequences_;
  TierMemory* memory_ = nullptr;
  SeqId next_id_ = 0;
  std::map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::vector<BatchSeq> batch_;
  uint64_t peak_resident_ = 0;
};

}  // namespace strata
