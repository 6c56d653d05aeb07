#include "runtime/kv/kv_options.h"

#include "runtime/kv/memory_kv.h"
#include "runtime/model/model.h"

namespace strata {

const char* KvPolicyKindName(KvPolicyKind kind) {
  switch (kind) {
    case KvPolicyKind::kMemory:
      return "memory";
  }
  return "?";
}

Status ParseKvPolicyKind(const std::string& name, KvPolicyKind* out) {
  if (name == "memory") {
    *out = KvPolicyKind::kMemory;
    return Status::OK();
  }
  return Status::InvalidArgument("unknown KV policy '" + name + "' (accepted: memory)");
}

Status CreateKvPolicy(const Model& model, const KvOptions& options, int32_t n_ctx,
                      int32_t max_sequences, ThreadPool* /*pool*/, std::unique_ptr<KvPolicy>* out) {
  const HParams& hp = model.hparams();
  KvShape shape{hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx};
  switch (options.policy) {
    case KvPolicyKind::kMemory: {
      std::unique_ptr<MemoryKv> kv;
      STRATA_RETURN_IF_ERROR(MemoryKv::Create(shape, max_sequences, &kv));
      *out = std::move(kv);
      return Status::OK();
    }
  }
  return Status::Internal("unhandled KV policy");
}

}  // namespace strata
