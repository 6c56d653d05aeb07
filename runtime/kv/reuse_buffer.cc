#include "runtime/kv/reuse_buffer.h"

#include <algorithm>

namespace strata {

ReuseBuffer::ReuseBuffer(int32_t capacity, ReusePolicy policy)
    : policy_(policy), slots_(size_t(std::max(capacity, 0))) {
  by_group_.reserve(slots_.size());
  victims_.reserve(slots_.size());
  missing_.reserve(slots_.size());
}

uint64_t ReuseBuffer::TableBytes(int32_t capacity) {
  return uint64_t(capacity) * (sizeof(Slot) + 3 * sizeof(int32_t));
}

bool ReuseBuffer::EvictBefore(const Slot& a, int32_t ia, const Slot& b, int32_t ib) const {
  // An empty slot costs nothing to give up.
  if ((a.group < 0) != (b.group < 0)) return a.group < 0;
  switch (policy_) {
    case ReusePolicy::kFifo:
      if (a.loaded != b.loaded) return a.loaded < b.loaded;
      break;
    case ReusePolicy::kLru:
      if (a.last_used != b.last_used) return a.last_used < b.last_used;
      if (a.loaded != b.loaded) return a.loaded < b.loaded;
      break;
    case ReusePolicy::kLfu:
      if (a.uses != b.uses) return a.uses < b.uses;
      if (a.last_used != b.last_used) return a.last_used < b.last_used;
      break;
  }
  return ia < ib;
}

void ReuseBuffer::Resolve(std::span<const int32_t> selected, std::vector<Placement>* out) {
  ++step_;
  out->clear();
  missing_.clear();
  size_t j = 0;
  for (int32_t g : selected) {
    while (j < by_group_.size() && slots_[size_t(by_group_[j])].group < g) ++j;
    if (j < by_group_.size() && slots_[size_t(by_group_[j])].group == g) {
      Slot& s = slots_[size_t(by_group_[j])];
      s.last_used = step_;
      ++s.uses;
      out->push_back({g, by_group_[j], false});
    } else {
      missing_.push_back(g);
      out->push_back({g, -1, true});
    }
  }
  if (!missing_.empty()) {
    victims_.clear();
    for (int32_t i = 0; i < capacity(); ++i)
      if (slots_[size_t(i)].last_used != step_ || slots_[size_t(i)].group < 0)
        victims_.push_back(i);
    // The caller never selects more than capacity() groups, so there are enough victims.
    const size_t k = std::min(missing_.size(), victims_.size());
    std::partial_sort(victims_.begin(), victims_.begin() + ptrdiff_t(k), victims_.end(),
                      [&](int32_t a, int32_t b) {
                        return EvictBefore(slots_[size_t(a)], a, slots_[size_t(b)], b);
                      });
    victims_.resize(k);
    std::sort(victims_.begin(), victims_.end());
    size_t v = 0;
    for (Placement& p : *out) {
      if (!p.load) continue;
      if (v == victims_.size()) break;
      Slot& s = slots_[size_t(victims_[v])];
      s.group = p.group;
      s.loaded = step_;
      s.last_used = step_;
      s.uses = 1;
      p.slot = victims_[v++];
    }
    by_group_.clear();
    for (int32_t i = 0; i < capacity(); ++i)
      if (slots_[size_t(i)].group >= 0) by_group_.push_back(i);
    std::sort(by_group_.begin(), by_group_.end(), [&](int32_t a, int32_t b) {
      return slots_[size_t(a)].group < slots_[size_t(b)].group;
    });
  }
  if (policy_ == ReusePolicy::kLfu && capacity() > 0 && step_ % uint64_t(capacity()) == 0)
    for (Slot& s : slots_) s.uses >>= 1;
}

void ReuseBuffer::Invalidate(int32_t slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.group < 0) return;
  s.group = -1;
  by_group_.erase(std::remove(by_group_.begin(), by_group_.end(), slot), by_group_.end());
}

void ReuseBuffer::Clear() {
  for (Slot& s : slots_) s = Slot();
  by_group_.clear();
}

}  // namespace strata
