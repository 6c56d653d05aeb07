// The GPU forward pass's option names, in every build (config files and flags name them
// whether or not this build has CUDA).
#include "runtime/engine/forward_cuda.h"

namespace strata {

const char* GpuWeightsName(GpuWeights w) {
  switch (w) {
    case GpuWeights::kAuto:
      return "auto";
    case GpuWeights::kDevice:
      return "device";
    case GpuWeights::kMapped:
      return "mapped";
  }
  return "?";
}

Status ParseGpuWeights(const std::string& text, GpuWeights* out) {
  for (GpuWeights w : {GpuWeights::kAuto, GpuWeights::kDevice, GpuWeights::kMapped}) {
    if (text == GpuWeightsName(w)) {
      *out = w;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("'" + text +
                                 "' is not a GPU weight placement (auto, device or mapped)");
}

}  // namespace strata
