#include "runtime/engine/options.h"

#include "common/enum_names.h"

namespace strata {

namespace {
constexpr EnumName<GpuWeights> kGpuWeightsNames[] = {
    {GpuWeights::kAuto, "auto"}, {GpuWeights::kDevice, "device"}, {GpuWeights::kMapped, "mapped"}};
}  // namespace

const char* GpuWeightsName(GpuWeights w) { return EnumToName(kGpuWeightsNames, w); }

Status ParseGpuWeights(const std::string& text, GpuWeights* out) {
  return EnumFromName(kGpuWeightsNames, "GPU weight placement", text, out);
}

}  // namespace strata
