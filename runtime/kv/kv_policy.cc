#include "runtime/kv/kv_policy.h"

namespace strata {

Status KvPolicy::ForkSequence(SeqId, SeqId*) {
  return Status::NotSupported(std::string("KV policy '") + name() + "' cannot fork sequences");
}

Status KvPolicy::Prepare(int32_t, const float*, int64_t) { return Status::OK(); }

}  // namespace strata
