// DeviceViewKv: a KV policy that keeps its state in host memory (the disk policy: its block
// store, reuse slots, key summary and selection) serving a forward pass on a GPU.
//
// The policy itself runs unchanged on the host, so its selection, its reads and its
// results are the CPU policy's by construction. What this adapter adds is the crossing:
//   - inputs to the host: the GPU engine copies each layer's hidden states and new K/V rows
//     to pinned host memory (host_inputs()), one copy and one wait per layer, and calls
//     Prepare and Append with them;
//   - views to the GPU: View gathers the host policy's spans (reuse slots, sink, recent and
//     rolling groups, read-through records, or a prefill's staging) into one pinned block,
//     uploads it in one copy on the compute stream and, for Q8_0 records, expands them to
//     F16 there; the spans it returns point into that GPU buffer.
// A view's bytes cross once per step, which is what a discrete GPU must pay for KV it does
// not hold. Per-layer staging is double-buffered against its upload by events, so the host
// never overwrites bytes the GPU has not copied yet.
//
// Thread-compatible, like the policy it wraps; one GPU engine drives it.
#pragma once

#include <memory>
#include <vector>

#include "platforms/cuda_device.h"
#include "runtime/kv/kv_policy.h"

namespace strata {

class DeviceViewKv final : public KvPolicy {
 public:
  // `host` must keep KV in host memory (device_memory() false).
  static Status Create(std::unique_ptr<KvPolicy> host, std::shared_ptr<CudaDevice> device,
                       std::unique_ptr<DeviceViewKv>* out);
  ~DeviceViewKv() override;

  const char* name() const override { return host_->name(); }
  const KvShape& shape() const override { return host_->shape(); }
  Status AddSequence(SeqId* out) override { return host_->AddSequence(out); }
  Status RemoveSequence(SeqId seq) override { return host_->RemoveSequence(seq); }
  Status ForkSequence(SeqId src, SeqId* out) override { return host_->ForkSequence(src, out); }
  int32_t Length(SeqId seq) const override { return host_->Length(seq); }
  Status BeginBatch(std::span<const BatchSeq> batch) override;
  Status Prepare(int32_t layer, const float* x, int64_t n_embd) override {
    return host_->Prepare(layer, x, n_embd);
  }
  Status Append(int32_t layer, SeqId seq, const float* k, const float* v) override {
    return host_->Append(layer, seq, k, v);
  }
  Status View(int32_t layer, SeqId seq, std::span<const kernels::KvSpan>* out) override;
  KvTailEstimate* tail_estimate() override { return host_->tail_estimate(); }
  Status EndBatch() override;
  void AbortBatch() override { host_->AbortBatch(); }
  Status Settle() override { return host_->Settle(); }
  KvCounters counters() const override;
  bool device_memory() const override { return true; }
  bool host_inputs() const override { return true; }
  int32_t max_pass_tokens() const override { return host_->max_pass_tokens(); }

  KvPolicy& host() { return *host_; }
  // Bytes uploaded for views so far.
  uint64_t view_bytes() const { return view_bytes_; }

 private:
  // One of two staging halves (layers alternate): pinned host bytes, the GPU buffer they go
  // to, and the event that marks the last upload out of them.
  struct Half {
    char* host = nullptr;
    char* dev = nullptr;
    size_t capacity = 0, used = 0;
    std::unique_ptr<CudaDevice::Event> uploaded;
  };
  DeviceViewKv(std::unique_ptr<KvPolicy> host, std::shared_ptr<CudaDevice> device);
  Status Reserve(Half& h, size_t bytes);
  // Appends the device copies of host spans hv to *dv.
  Status Gather(Half& h, std::span<const kernels::KvSpan> hv, std::vector<kernels::KvSpan>* dv);

  std::unique_ptr<KvPolicy> host_;
  std::shared_ptr<CudaDevice> d_;
  Half halves_[2];
  int32_t layer_ = -1;                               // the layer whose views the current half holds
  std::vector<std::vector<kernels::KvSpan>> views_;  // per sequence slot of the pass
  std::vector<SeqId> batch_seqs_;
  std::vector<std::pair<char*, char*>> retired_;  // outgrown (host, device) buffers
  uint64_t view_bytes_ = 0;
  uint64_t staging_peak_ = 0;
};

}  // namespace strata
