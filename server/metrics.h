// Counters a running server exposes at GET /metrics in Prometheus' text format. Updated from
// the HTTP threads and the scheduler thread under one mutex: a handful of updates per token
// is far below the cost of the forward pass it accounts for.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata::server {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends the _bucket, _sum and _count lines of `name`.
  void Render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void CountRequest(const std::string& endpoint, int status);
  void AddTokens(int64_t prompt, int64_t generated);
  void ObserveTtft(double seconds);
  void ObserveDecodeStep(double seconds);
  void SetQueueDepth(int64_t n);
  void SetActiveSlots(int64_t n);
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  int64_t queue_depth_ = 0, active_slots_ = 0;
  Histogram ttft_, decode_step_;
};

}  // namespace strata::server
