#include "storage/fault_injection.h"

#include <cerrno>

#include "storage/shaping_backend.h"

namespace strata::storage {

FaultRule FaultRule::Eio(std::optional<IoKind> only) {
  FaultRule r;
  r.kind = FaultKind::kError;
  r.error = EIO;
  r.only = only;
  return r;
}

FaultRule FaultRule::NoSpace() {
  FaultRule r;
  r.kind = FaultKind::kError;
  r.error = ENOSPC;
  r.only = IoKind::kWrite;
  return r;
}

FaultRule FaultRule::Short(uint32_t bytes, std::optional<IoKind> only) {
  FaultRule r;
  r.kind = FaultKind::kShortTransfer;
  r.short_bytes = bytes;
  r.only = only;
  return r;
}

FaultRule FaultRule::Delay(std::chrono::nanoseconds delay) {
  FaultRule r;
  r.kind = FaultKind::kDelay;
  r.delay = delay;
  return r;
}

void FaultInjector::Add(const FaultRule& rule) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(Armed{rule});
}

void FaultInjector::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

uint64_t FaultInjector::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

std::optional<FaultRule> FaultInjector::Match(IoKind kind, uint64_t offset, uint32_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Armed& a : rules_) {
    const FaultRule& r = a.rule;
    if (r.only.has_value() && *r.only != kind) continue;
    if (offset >= r.range_end || offset + length <= r.range_begin) continue;
    if (r.times != 0 && a.fired >= r.times) continue;
    if (a.seen++ < r.skip) continue;
    ++a.fired;
    ++fired_;
    return r;
  }
  return std::nullopt;
}

namespace {

class FaultInjectingBackend final : public ShapingBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<IoBackend> inner, std::shared_ptr<FaultInjector> injector,
                        uint64_t data_origin, uint32_t block_size)
      : ShapingBackend(std::move(inner)),
        injector_(std::move(injector)),
        data_origin_(data_origin),
        block_size_(block_size) {}

  std::string Describe() const override { return inner().Describe() + " [fault injection]"; }

 protected:
  OpShape Shape(const BackendOp& op, Clock::time_point now) override {
    OpShape shape;
    const uint64_t offset = op.file_offset >= data_origin_ ? op.file_offset - data_origin_ : 0;
    const std::optional<FaultRule> rule = injector_->Match(op.kind, offset, op.length);
    if (!rule.has_value()) return shape;
    switch (rule->kind) {
      case FaultKind::kError:
        shape.fail_errno = rule->error > 0 ? rule->error : EIO;
        break;
      case FaultKind::kShortTransfer:
        if (rule->short_bytes >= op.length) break;
        if (rule->short_bytes > 0 && rule->short_bytes % block_size_ == 0) {
          shape.run_length = rule->short_bytes;
        } else {
          shape.report_bytes = rule->short_bytes;
        }
        break;
      case FaultKind::kDelay:
        shape.release_at = now + rule->delay;
        break;
    }
    return shape;
  }

 private:
  const std::shared_ptr<FaultInjector> injector_;
  const uint64_t data_origin_;
  const uint32_t block_size_;
};

}  // namespace

std::unique_ptr<IoBackend> WrapWithFaults(std::unique_ptr<IoBackend> inner,
                                          std::shared_ptr<FaultInjector> injector,
                                          uint64_t data_origin, uint32_t block_size) {
  return std::make_unique<FaultInjectingBackend>(std::move(inner), std::move(injector), data_origin,
                                                 block_size);
}

}  // namespace strata::storage
