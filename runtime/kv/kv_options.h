// KvOptions: which KV policy an engine uses and its parameters (strata.yaml's `kv:`
// section and the C API's KV fields map onto this struct).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "runtime/kv/kv_policy.h"

namespace strata {

class Model;
class ThreadPool;

enum class KvPolicyKind { kMemory };
const char* KvPolicyKindName(KvPolicyKind kind);
// "memory" -> kMemory; the error lists the accepted names.
Status ParseKvPolicyKind(const std::string& name, KvPolicyKind* out);

struct KvOptions {
  KvPolicyKind policy = KvPolicyKind::kMemory;
};

// Builds the policy the options name for `model`, sized for n_ctx tokens per sequence and
// at most max_sequences sequences.
Status CreateKvPolicy(const Model& model, const KvOptions& options, int32_t n_ctx,
                      int32_t max_sequences, ThreadPool* pool, std::unique_ptr<KvPolicy>* out);

}  // namespace strata
