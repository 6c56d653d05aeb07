#include "runtime/engine/options.h"

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
