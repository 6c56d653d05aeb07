#include "tuner/quality.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/engine/engine.h"
#include "tuner/kv_replay.h"

namespace strata {
namespace {

// Full KV's best two logits closer than this make a near-tie that rounding decides: two
// full-KV runs differing only in summation order disagree on some of them.
constexpr float kClearMargin = 0.5f;
constexpr char kFullKey[] = "full";

uint64_t Fnv64(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

void Accumulate(const float* logits, int32_t n_vocab, int32_t target, WindowQuality* q) {
  const PositionScore p = ScorePosition(logits, n_vocab, target);
  q->nll += p.nll;
  q->argmax.push_back(p.argmax);
  q->margin.push_back(p.margin);
  q->nlls.push_back(float(p.nll));
  ++q->positions;
}
nlohmann::json ToJson(const std::string& key, const WindowQuality& q) {
  return {{"key", key},
          {"positions", q.positions},
          {"nll", q.nll},
          {"agree", q.agree},
          {"clear", q.clear},
          {"clear_agree", q.clear_agree},
          {"steps", q.steps},
          {"reads", q.reads},
          {"refine_reads", q.refine_reads},
          {"bytes_read", q.bytes_read},
          {"groups_selected", q.groups_selected},
          {"reuse_hits", q.reuse_hits},
          {"resident_attended", q.resident_attended},
          {"argmax", q.argmax},
          {"margin", q.margin},
          {"nlls", q.nlls}};
}

bool FromJson(const nlohmann::json& j, std::string* key, WindowQuality* q) {
  try {
    *key = j.at("key").get<std::string>();
    q->positions = j.at("positions").get<int32_t>();
    q->nll = j.at("nll").get<double>();
    q->agree = j.at("agree").get<int32_t>();
    q->clear = j.at("clear").get<int32_t>();
    q->clear_agree = j.at("clear_agree").get<int32_t>();
    q->steps = j.at("steps").get<int64_t>();
    q->reads = j.at("reads").get<int64_t>();
    q->refine_reads = j.at("refine_reads").get<int64_t>();  // lines before it: measured again
    q->bytes_read = j.at("bytes_read").get<int64_t>();
    q->groups_selected = j.at("groups_selected").get<int64_t>();
    q->reuse_hits = j.at("reuse_hits").get<int64_t>();
    // Lines written before it are measured again, like those without "nlls".
    q->resident_attended = j.at("resident_attended").get<int64_t>();
    q->argmax = j.at("argmax").get<std::vector<int32_t>>();
    q->margin = j.at("margin").get<std::vector<float>>();
    q->nlls = j.at("nlls").get<std::vector<float>>();  // lines written before it: measured again
    return q->positions > 0 && int32_t(q->argmax.size()) == q->positions &&
           q->margin.size() == q->argmax.size() && q->nlls.size() == q->argmax.size();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace

PositionScore ScorePosition(const float* logits, int32_t n_vocab, int32_t target) {
  const float* e = logits + n_vocab;
  const float* best = std::max_element(logits, e);
  const float mx = *best;
  double z = 0;
  for (const float* p = logits; p < e; ++p) z += std::exp(double(*p - mx));
  float second = -INFINITY;
  for (const float* p = logits; p < e; ++p)
    if (p != best && *p > second) second = *p;
  return {std::log(z) - double(logits[target] - mx), int32_t(best - logits), *best - second};
}

double QualitySummary::ppl_loss() const {
  if (sum.positions == 0) return 0;
  return std::exp((sum.nll - full_nll) / sum.positions) - 1.0;
}

double QualitySummary::ppl_loss_upper(double z) const {
  if (sum.positions < 2) return ppl_loss();
  const double n = sum.positions;
  const double mean = (sum.nll - full_nll) / n;
  const double var = std::max(0.0, (diff_sq - n * mean * mean) / (n - 1));
  return std::exp(mean + z * std::sqrt(var / n)) - 1.0;
}

double QualitySummary::agreement() const {
  if (sum.clear > 0) return double(sum.clear_agree) / sum.clear;
  return sum.positions > 0 ? double(sum.agree) / sum.positions : 1.0;
}

double QualitySummary::requests_per_step() const {
  return sum.steps > 0 ? double(sum.reads) / double(sum.steps) : 0;
}

double QualitySummary::refine_requests_per_step() const {
  return sum.steps > 0 ? double(sum.refine_reads) / double(sum.steps) : 0;
}

double QualitySummary::bytes_per_step() const {
  return sum.steps > 0 ? double(sum.bytes_read) / double(sum.steps) : 0;
}

double QualitySummary::attended_groups_per_step() const {
  return sum.steps > 0 ? double(sum.groups_selected + sum.resident_attended) / double(sum.steps)
                       : 0;
}

Status QualityProfiler::Open(const Model& model, const QualityOptions& options,
                             std::unique_ptr<QualityProfiler>* out) {
  if (options.scored < 1 || options.windows < 1)
    return Status::InvalidArgument("tune: scored positions and windows must be >= 1");
  std::unique_ptr<QualityProfiler> q(new QualityProfiler(model, options));
  STRATA_RETURN_IF_ERROR(
      EvaluationTokens(model, options.text_path, options.skip_fraction, &q->tokens_));
  q->text_hash_ = Fnv64(q->tokens_.data(), q->tokens_.size() * sizeof(int32_t));
  std::error_code ec;
  std::filesystem::create_directories(options.cache_dir, ec);
  if (ec)
    return Status::IOError("tune: cannot create the work directory " + options.cache_dir + ": " +
                           ec.message());
  q->results_path_ = options.cache_dir + "/quality.jsonl";
  std::ifstream in(q->results_path_);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    // A line cut short by an interruption is measured again, not trusted.
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    std::string key;
    WindowQuality w;
    if (!j.is_discarded() && FromJson(j, &key, &w)) q->results_[key] = std::move(w);
  }
  *out = std::move(q);
  return Status::OK();
}

int32_t QualityProfiler::WindowsAvailable(int32_t context) const {
  // A window's capture spans its whole stride but the last token.
  return context > 0 ? int32_t(tokens_.size() / Stride(context)) : 0;
}

std::string QualityProfiler::LineKey(const std::string& config, int32_t context,
                                     int32_t window) const {
  char ids[48];
  std::snprintf(ids, sizeof ids, "%016llx/%016llx", (unsigned long long)model_.identity(),
                (unsigned long long)text_hash_);
  // Windows laid out at their own context keep the keys they always had.
  const std::string at = Stride(context) == size_t(context)
                             ? ""
                             : "/at=" + std::to_string(WindowBegin(context, window));
  return std::string(ids) + "/ctx=" + std::to_string(context) + "/w=" + std::to_string(window) +
         at + "/s=" + std::to_string(options_.scored) + "/" + config;
}

Status QualityProfiler::Capture(int32_t context, int32_t w,
                                std::shared_ptr<const KvCapture>* out) const {
  if (context < 2 || w < 0 || w >= WindowsAvailable(context))
    return Status::OutOfRange("tune: the text " + options_.text_path + " holds " +
                              std::to_string(WindowsAvailable(context)) + " windows of " +
                              std::to_string(context) + " tokens, not " + std::to_string(w + 1));
  const size_t begin = WindowBegin(context, w), n = Stride(context) - 1;
  auto it = held_.find(begin);
  if (it != held_.end() && size_t(it->second->n_tokens) == n) {
    *out = it->second;
    return Status::OK();
  }
  auto cap = std::make_shared<KvCapture>();
  bool computed = false;
  STRATA_RETURN_IF_ERROR(LoadOrCapture(model_, std::span<const int32_t>(tokens_.data() + begin, n),
                                       options_.cache_dir, options_.threads, cap.get(), &computed));
  const uint64_t bytes = cap->data.size() * sizeof(uint16_t);
  if (it == held_.end() && held_bytes_ + bytes <= options_.capture_memory_bytes) {
    held_.emplace(begin, cap);
    held_bytes_ += bytes;
  }
  *out = std::move(cap);
  return Status::OK();
}

Status QualityProfiler::Window(int32_t context, int32_t w, const DiskKvOptions* disk,
                               WindowQuality* out) {
  const int32_t prefix = context - options_.scored - 1;
  if (prefix < 1)
    return Status::InvalidArgument("tune: a context of " + std::to_string(context) +
                                   " tokens leaves no prefix before " +
                                   std::to_string(options_.scored) + " scored positions");
  std::shared_ptr<const KvCapture> cap;
  STRATA_RETURN_IF_ERROR(Capture(context, w, &cap));
  const size_t begin = WindowBegin(context, w);
  const std::vector<int32_t> win(tokens_.begin() + ptrdiff_t(begin),
                                 tokens_.begin() + ptrdiff_t(begin + size_t(context)));
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(CreateRunEngine(model_, options_.threads, context, 1, disk, &e));
  SeqId seq;
  STRATA_RETURN_IF_ERROR(e->NewSequence(&seq));
  STRATA_RETURN_IF_ERROR(ReplayPrefix(e->kv(), seq, *cap, prefix));
  const KvCounters c0 = e->kv().counters();
  WindowQuality q;
  std::vector<float> logits;
  ForwardBatch b;
  const int32_t n_vocab = model_.hparams().n_vocab;
  for (int32_t i = 0; i < options_.scored; ++i) {
    b.Clear();
    b.Add(seq, prefix + i, std::span<const int32_t>(&win[size_t(prefix + i)], 1));
    STRATA_RETURN_IF_ERROR(e->Evaluate(b, &logits));
    Accumulate(logits.data(), n_vocab, win[size_t(prefix + i + 1)], &q);
  }
  const KvCounters c = e->kv().counters();
  q.steps = int64_t(c.steps - c0.steps);
  q.reads = int64_t(c.reads_issued - c0.reads_issued);
  q.refine_reads = int64_t(c.refine_reads_issued - c0.refine_reads_issued);
  q.bytes_read = int64_t(c.bytes_read - c0.bytes_read);
  q.groups_selected = int64_t(c.groups_selected - c0.groups_selected);
  q.reuse_hits = int64_t(c.reuse_hits - c0.reuse_hits);
  q.resident_attended = int64_t(c.resident_attended - c0.resident_attended);
  *out = std::move(q);
  return Status::OK();
}

Status QualityProfiler::Cached(const std::string& key, int32_t context, int32_t w,
                               const DiskKvOptions* disk, WindowQuality* out, bool* measured) {
  *measured = false;
  auto it = results_.find(key);
  if (it != results_.end()) {
    *out = it->second;
    return Status::OK();
  }
  STRATA_RETURN_IF_ERROR(Window(context, w, disk, out));
  *measured = true;
  return Status::OK();
}

Status QualityProfiler::Measure(const DiskKvOptions& disk, const std::string& key, int32_t context,
                                QualitySummary* out, int32_t* measured) {
  QualitySummary s;
  int32_t ran = 0;
  for (int32_t w = 0; w < options_.windows; ++w) {
    WindowQuality ref, q;
    bool fresh = false;
    const std::string ref_key = LineKey(kFullKey, context, w);
    STRATA_RETURN_IF_ERROR(Cached(ref_key, context, w, nullptr, &ref, &fresh));
    if (fresh) STRATA_RETURN_IF_ERROR(Record(ref_key, ref));
    const std::string cfg_key = LineKey(key, context, w);
    STRATA_RETURN_IF_ERROR(Cached(cfg_key, context, w, &disk, &q, &fresh));
    if (fresh) {
      ++ran;
      for (int32_t i = 0; i < q.positions && i < ref.positions; ++i) {
        const bool same = q.argmax[size_t(i)] == ref.argmax[size_t(i)];
        q.agree += same;
        if (ref.margin[size_t(i)] >= kClearMargin) {
          ++q.clear;
          q.clear_agree += same;
        }
      }
      STRATA_RETURN_IF_ERROR(Record(cfg_key, q));
    }
    s.full_nll += ref.nll;
    for (size_t i = 0; i < q.nlls.size() && i < ref.nlls.size(); ++i) {
      const double d = double(q.nlls[i]) - double(ref.nlls[i]);
      s.diff_sq += d * d;
    }
    s.sum.positions += q.positions;
    s.sum.nll += q.nll;
    s.sum.agree += q.agree;
    s.sum.clear += q.clear;
    s.sum.clear_agree += q.clear_agree;
    s.sum.steps += q.steps;
    s.sum.reads += q.reads;
    s.sum.refine_reads += q.refine_reads;
    s.sum.bytes_read += q.bytes_read;
    s.sum.groups_selected += q.groups_selected;
    s.sum.reuse_hits += q.reuse_hits;
    s.sum.resident_attended += q.resident_attended;
    ++s.windows;
  }
  *out = s;
  if (measured) *measured = ran;
  return Status::OK();
}

Status QualityProfiler::Record(const std::string& key, const WindowQuality& q) {
  results_[key] = q;
  std::FILE* f = std::fopen(results_path_.c_str(), "a");
  if (!f) return Status::FromErrno("tune: appending to " + results_path_, errno);
  const std::string line = ToJson(key, q).dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  const bool flushed = std::fflush(f) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !flushed || !closed) return Status::FromErrno("tune: writing " + results_path_, errno);
  return Status::OK();
}

}  // namespace strata
