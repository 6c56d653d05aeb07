#include "runtime/kv/disk/reuse_buffer.h"

#include <algorithm>

namespace strata {

ReuseBuffer::ReuseBuffer(int32_t capacity, ReusePolicy policy, int32_t transient)
    : policy_(policy),
      capacity_(std::max(capacity, 0)),
      slots_(size_t(capacity_) + size_t(std::max(transient, 0))) {
  by_group_.reserve(slots_.size());
  victims_.reserve(slots_.size());
  missing_.reserve(slots_.size());
  if (transient > 0) {
    order_.reserve(slots_.size());
    take_.reserve(slots_.size());
  }
}

uint64_t ReuseBuffer::TableBytes(int32_t slots, bool read_through) {
  return uint64_t(slots) *
         (sizeof(Slot) + 3 * sizeof(int32_t) + (read_through ? sizeof(int32_t) + 1 : 0));
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

void ReuseBuffer::Assign(std::vector<Placement>& out, std::span<const int32_t> free_slots,
                         const uint8_t* take) {
  size_t v = 0;
  for (size_t i = 0; i < missing_.size() && v < free_slots.size(); ++i) {
    if (take && !take[i]) continue;
    Placement& p = out[size_t(missing_[i])];
    Slot& s = slots_[size_t(free_slots[v])];
    s.group = p.group;
    s.loaded = step_;
    s.last_used = step_;
    s.uses = 1;
    p.slot = free_slots[v++];
  }
}

void ReuseBuffer::IndexGroups() {
  by_group_.clear();
  for (int32_t i = 0; i < size(); ++i)
    if (slots_[size_t(i)].group >= 0) by_group_.push_back(i);
  std::sort(by_group_.begin(), by_group_.end(), [&](int32_t a, int32_t b) {
    return slots_[size_t(a)].group < slots_[size_t(b)].group;
  });
}

void ReuseBuffer::Resolve(std::span<const int32_t> selected, std::vector<Placement>* out,
                          std::span<const float> priority) {
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
      missing_.push_back(int32_t(out->size()));
      out->push_back({g, -1, true});
    }
  }
  if (!missing_.empty()) {
    auto free = [&](int32_t i) {
      return slots_[size_t(i)].last_used != step_ || slots_[size_t(i)].group < 0;
    };
    victims_.clear();
    for (int32_t i = 0; i < capacity_; ++i)
      if (free(i)) victims_.push_back(i);
    const size_t k = std::min(missing_.size(), victims_.size());
    std::partial_sort(victims_.begin(), victims_.begin() + ptrdiff_t(k), victims_.end(),
                      [&](int32_t a, int32_t b) {
                        return EvictBefore(slots_[size_t(a)], a, slots_[size_t(b)], b);
                      });
    victims_.resize(k);
    std::sort(victims_.begin(), victims_.end());
    if (k == missing_.size()) {
      Assign(*out, victims_, nullptr);
    } else {
      // Fewer persistent victims than misses: the k misses of highest priority take them,
      // the rest are read through.
      MarkBest(k, priority);
      Assign(*out, victims_, take_.data());
      victims_.clear();
      for (int32_t i = capacity_; i < size(); ++i)
        if (free(i)) victims_.push_back(i);
      for (uint8_t& t : take_) t = !t;
      Assign(*out, victims_, take_.data());
    }
    IndexGroups();
  }
  if (policy_ == ReusePolicy::kLfu && capacity() > 0 && step_ % uint64_t(capacity()) == 0)
    for (Slot& s : slots_) s.uses >>= 1;
}

void ReuseBuffer::MarkBest(size_t k, std::span<const float> priority) {
  take_.assign(missing_.size(), 0);
  if (k == 0) return;
  order_.resize(missing_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = int32_t(i);
  auto pri = [&](int32_t i) {
    const size_t at = size_t(missing_[size_t(i)]);
    return at < priority.size() ? priority[at] : 0.0f;
  };
  // On a tie, the earlier group.
  std::nth_element(order_.begin(), order_.begin() + ptrdiff_t(k - 1), order_.end(),
                   [&](int32_t a, int32_t b) {
                     const float pa = pri(a), pb = pri(b);
                     return pa != pb ? pa > pb : a < b;
                   });
  for (size_t i = 0; i < k; ++i) take_[size_t(order_[i])] = 1;
}

void ReuseBuffer::ForgetTransient() {
  bool any = false;
  for (int32_t i = capacity_; i < size(); ++i)
    if (slots_[size_t(i)].group >= 0) {
      slots_[size_t(i)] = Slot();
      any = true;
    }
  if (any) IndexGroups();
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
