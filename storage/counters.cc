#include "storage/counters.h"

#include <bit>
#include <cstdio>

namespace strata::storage {

size_t LatencyHistogram::BucketOf(uint64_t ns) {
  if (ns < kSub) return static_cast<size_t>(ns);
  const int exponent = static_cast<int>(std::bit_width(ns)) - 1;  // >= kSubBits
  const uint64_t sub = (ns >> (exponent - kSubBits)) & (kSub - 1);
  return kSub + static_cast<size_t>(exponent - kSubBits) * kSub + static_cast<size_t>(sub);
}

uint64_t LatencyHistogram::BucketLower(size_t bucket) {
  if (bucket < static_cast<size_t>(kSub)) return bucket;
  const size_t exponent = (bucket - kSub) / kSub + kSubBits;
  const uint64_t sub = (bucket - kSub) % kSub;
  return (kSub + sub) << (exponent - kSubBits);
}

uint64_t LatencyHistogram::BucketUpper(size_t bucket) {
  if (bucket + 1 >= kBuckets) return UINT64_MAX;
  return BucketLower(bucket + 1) - 1;
}

void LatencyHistogram::Record(uint64_t ns) {
  counts_[BucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  uint64_t seen = max_ns_.load(std::memory_order_relaxed);
  while (ns > seen && !max_ns_.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
  }
}

HistogramSnapshot LatencyHistogram::Snapshot() const {
  HistogramSnapshot s;
  s.counts.resize(kBuckets);
  for (size_t i = 0; i < kBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  s.max_ns = max_ns_.load(std::memory_order_relaxed);
  return s;
}

uint64_t HistogramSnapshot::Quantile(double q) const {
  if (count == 0) return 0;
  if (q < 0) q = 0;
  if (q > 1) q = 1;
  // The rank of the sample at quantile q, 1-based, so q = 1 picks the largest sample.
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(count) + 0.5);
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (seen >= rank) {
      const uint64_t upper = LatencyHistogram::BucketUpper(i);
      return upper < max_ns ? upper : max_ns;
    }
  }
  return max_ns;
}

HistogramSnapshot HistogramSnapshot::Since(const HistogramSnapshot& earlier) const {
  HistogramSnapshot d = *this;
  if (earlier.counts.size() != counts.size()) return d;
  d.count = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d.counts[i] = counts[i] - earlier.counts[i];
    d.count += d.counts[i];
  }
  d.sum_ns = sum_ns - earlier.sum_ns;
  return d;
}

void StoreCounters::RecordCompletion(IoKind kind, uint64_t bytes, uint64_t latency_ns, bool ok,
                                     bool cancelled) {
  const bool read = kind == IoKind::kRead;
  (read ? reads_ : writes_).fetch_add(1, std::memory_order_relaxed);
  if (ok) {
    (read ? bytes_read_ : bytes_written_).fetch_add(bytes, std::memory_order_relaxed);
    (read ? read_latency_ : write_latency_).Record(latency_ns);
  } else if (cancelled) {
    cancelled_.fetch_add(1, std::memory_order_relaxed);
  } else {
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
}

void StoreCounters::SetDepth(uint64_t in_flight, uint64_t queued) {
  in_flight_.store(in_flight, std::memory_order_relaxed);
  queued_.store(queued, std::memory_order_relaxed);
  if (in_flight > max_in_flight_.load(std::memory_order_relaxed)) {
    max_in_flight_.store(in_flight, std::memory_order_relaxed);
  }
}

CountersSnapshot StoreCounters::Snapshot() const {
  CountersSnapshot s;
  s.reads = reads_.load(std::memory_order_relaxed);
  s.writes = writes_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  s.cancelled = cancelled_.load(std::memory_order_relaxed);
  s.short_transfers = short_transfers_.load(std::memory_order_relaxed);
  s.in_flight = in_flight_.load(std::memory_order_relaxed);
  s.max_in_flight = max_in_flight_.load(std::memory_order_relaxed);
  s.queued = queued_.load(std::memory_order_relaxed);
  s.read_latency = read_latency_.Snapshot();
  s.write_latency = write_latency_.Snapshot();
  return s;
}

namespace {

void AppendEscaped(std::string* out, const std::string& s) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", static_cast<unsigned>(c));
      out->append(esc);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

void AppendLatency(std::string* out, const char* name, const HistogramSnapshot& h) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "\"%s\":{\"count\":%llu,\"mean_us\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
                "\"max_us\":%.2f}",
                name, static_cast<unsigned long long>(h.count), h.mean_ns() / 1e3,
                static_cast<double>(h.Quantile(0.5)) / 1e3,
                static_cast<double>(h.Quantile(0.99)) / 1e3, static_cast<double>(h.max_ns) / 1e3);
  out->append(buf);
}

}  // namespace

std::string CountersSnapshot::ToJson() const {
  std::string out = "{";
  auto field = [&out](const char* name, uint64_t v) {
    out += '"';
    out += name;
    out += "\":";
    out += std::to_string(v);
    out += ',';
  };
  field("reads", reads);
  field("writes", writes);
  field("bytes_read", bytes_read);
  field("bytes_written", bytes_written);
  field("errors", errors);
  field("cancelled", cancelled);
  field("short_transfers", short_transfers);
  field("in_flight", in_flight);
  field("max_in_flight", max_in_flight);
  field("queued", queued);
  AppendLatency(&out, "read_latency", read_latency);
  out += ',';
  AppendLatency(&out, "write_latency", write_latency);
  out += ",\"backend\":";
  AppendEscaped(&out, backend);
  out += ",\"fallback_reason\":";
  AppendEscaped(&out, fallback_reason);
  out += ",\"emulation\":";
  AppendEscaped(&out, emulation);
  out += ",\"direct_io\":";
  out += direct_io ? "true" : "false";
  out += '}';
  return out;
}

}  // namespace strata::storage
