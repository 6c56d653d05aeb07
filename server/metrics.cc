#include "server/metrics.h"

#include <cstdio>

namespace strata::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

void Histogram::Render(const std::string& name, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += name + "_bucket{le=\"" + Num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  *out += name + "_sum " + Num(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

// Time to first token spans a CPU prefill of a long prompt (seconds) down to a GPU's short
// one (milliseconds); a decode step from a GPU's few milliseconds to a slow disk tier's
// seconds.
Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      decode_step_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::AddTokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::ObserveTtft(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void Metrics::ObserveDecodeStep(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  decode_step_.Observe(seconds);
}

void Metrics::SetQueueDepth(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_depth_ = n;
}

void Metrics::SetActiveSlots(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  active_slots_ = n;
}

std::string Metrics::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP strata_requests_total HTTP requests answered, by endpoint and status.\n";
  out += "# TYPE strata_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "strata_requests_total{endpoint=\"" + key.first + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  out += "# HELP strata_prompt_tokens_total Prompt tokens of admitted requests.\n";
  out += "# TYPE strata_prompt_tokens_total counter\n";
  out += "strata_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  out += "# HELP strata_generated_tokens_total Tokens generated.\n";
  out += "# TYPE strata_generated_tokens_total counter\n";
  out += "strata_generated_tokens_total " + std::to_string(generated_tokens_) + "\n";
  out += "# HELP strata_queue_depth Requests waiting for a slot.\n";
  out += "# TYPE strata_queue_depth gauge\n";
  out += "strata_queue_depth " + std::to_string(queue_depth_) + "\n";
  out += "# HELP strata_active_slots Slots serving a request.\n";
  out += "# TYPE strata_active_slots gauge\n";
  out += "strata_active_slots " + std::to_string(active_slots_) + "\n";
  out +=
      "# HELP strata_time_to_first_token_seconds From submission (queue time included) to the "
      "first token.\n";
  out += "# TYPE strata_time_to_first_token_seconds histogram\n";
  ttft_.Render("strata_time_to_first_token_seconds", &out);
  out += "# HELP strata_decode_step_seconds One decode pass over every decoding slot.\n";
  out += "# TYPE strata_decode_step_seconds histogram\n";
  decode_step_.Render("strata_decode_step_seconds", &out);
  return out;
}

}  // namespace strata::server
