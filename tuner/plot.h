// The tune report as a picture (SVG, no dependencies): the cost model's predicted decode
// step time against the measured one for every plan that ran, and each measured plan's
// perplexity loss against its KV budget beside the quality bound.
#pragma once

#include <string>

#include "tuner/tune.h"

namespace strata {

std::string TunePlotSvg(const TuneReport& report, double max_ppl_loss);

}  // namespace strata
