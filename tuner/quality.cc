#include "tuner/quality.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "common/file.h"
#include "runtime/engine/engine.h"
#include "tuner/cost_model.h"
#include "tuner/kv_replay.h"
#include "tuner/work_file.h"

namespace strata {
namespace {

// Full KV's best two logits closer than this make a near-tie that rounding decides: two
// full-KV runs differing only in summation order disagree on some of them.
constexpr float kClearMargin = 0.5f;
constexpr char kFullKey[] = "full";

uint64_t Fnv64(const void* p, size_t n) { return Fnv1a64(p, n); }

// A record's line: its JSON with one more field, last, "fnv1a": the FNV-1a 64 of the JSON
// text without it, in 16 hex digits. The line stays a JSON object.
constexpr std::string_view kSealHead = ",\"fnv1a\":\"";
constexpr size_t kSealSize = kSealHead.size() + 16 + 2;  // the head, the digits, "}

std::string Sealed(const nlohmann::json& record) {
  const std::string text = record.dump();
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016llx", (unsigned long long)Fnv1a64(text.data(), text.size()));
  return text.substr(0, text.size() - 1) + std::string(kSealHead) + sum + "\"}\n";
}

// The record of a line, in *text: a sealed line's without its seal, when the checksum
// matches; a line without a seal (written before lines had one) as it is, to be parsed
// whole. False for a seal that does not match its record, or is not one.
bool Unseal(std::string_view line, std::string* text) {
  const size_t head = line.size() >= kSealSize ? line.size() - kSealSize : std::string_view::npos;
  if (head == std::string_view::npos || line.substr(head, kSealHead.size()) != kSealHead) {
    *text = std::string(line);
    return line.find(kSealHead.substr(1)) == std::string_view::npos;  // a seal cut short
  }
  if (line.substr(line.size() - 2) != "\"}") return false;
  uint64_t sum = 0;
  for (char c : line.substr(head + kSealHead.size(), 16)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    sum = sum << 4 | uint64_t(d);
  }
  *text = std::string(line.substr(0, head)) + "}";
  return Fnv1a64(text->data(), text->size()) == sum;
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
          {"counted_from", q.counted_from},
          {"reads", q.reads},
          {"refine_reads", q.refine_reads},
          {"bytes_read", q.bytes_read},
          {"groups_selected", q.groups_selected},
          {"reuse_hits", q.reuse_hits},
          {"resident_attended", q.resident_attended},
          {"layer_reads", q.layer_reads},
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
    // Lines whose reads counted the steps before the plan's reads settle (written before this
    // field, or with another kSettleSteps) are measured again: theirs are not the checks'.
    q->counted_from = j.at("counted_from").get<int32_t>();
    if (q->counted_from != std::min(kSettleSteps, q->positions - 1)) return false;
    q->reads = j.at("reads").get<int64_t>();
    q->refine_reads = j.at("refine_reads").get<int64_t>();  // lines before it: measured again
    q->bytes_read = j.at("bytes_read").get<int64_t>();
    q->groups_selected = j.at("groups_selected").get<int64_t>();
    q->reuse_hits = j.at("reuse_hits").get<int64_t>();
    // Lines written before it are measured again, like those without "nlls".
    q->resident_attended = j.at("resident_attended").get<int64_t>();
    // Optional: without it the cost model spreads the reads evenly over the layers.
    if (j.contains("layer_reads")) q->layer_reads = j.at("layer_reads").get<std::vector<int64_t>>();
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

std::vector<double> QualitySummary::layer_read_shares() const {
  return LayerReadShares(std::vector<uint64_t>(sum.layer_reads.begin(), sum.layer_reads.end()));
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
  STRATA_RETURN_IF_ERROR(MakeWorkDir(options.cache_dir));
  q->results_path_ = options.cache_dir + "/quality.jsonl";
  STRATA_RETURN_IF_ERROR(q->Load());
  *out = std::move(q);
  return Status::OK();
}

Status QualityProfiler::Load() {
  std::string all;
  {
    std::error_code ec;
    if (!std::filesystem::exists(results_path_, ec)) return Status::OK();
    STRATA_RETURN_IF_ERROR(
        ReadRegularFile(results_path_, "tune's results file", uint64_t(1) << 40, &all));
    // Older versions created it with the umask's mode; a file of someone else's stays as
    // it is.
    ::chmod(results_path_.c_str(), 0600);
  }
  // The whole lines, as they were: what the file is rewritten to when some are damaged.
  std::string kept;
  std::vector<int64_t> damaged;
  int64_t line_no = 0;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\n', at);
    const bool terminated = end != std::string::npos;
    const std::string_view line =
        std::string_view(all).substr(at, (terminated ? end : all.size()) - at);
    at = terminated ? end + 1 : all.size();
    ++line_no;
    if (line.empty()) continue;
    // A line without its newline was cut short while it was written, however whole it
    // reads: it is measured again, like one whose checksum does not match.
    std::string text;
    nlohmann::json j;
    if (terminated && Unseal(line, &text))
      j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      damaged.push_back(line_no);
      continue;
    }
    kept.append(line);
    kept += '\n';
    // Lines of older versions that lack a field are measured again too (FromJson), but
    // they are whole: kept, as an older tune may still read them.
    std::string key;
    WindowQuality w;
    if (FromJson(j, &key, &w)) results_[key] = std::move(w);
  }
  if (damaged.empty()) return Status::OK();
  std::string lines;
  for (size_t i = 0; i < damaged.size() && i < 10; ++i)
    lines += (i ? ", " : "") + std::to_string(damaged[i]);
  if (damaged.size() > 10) lines += " and " + std::to_string(damaged.size() - 10) + " more";
  if (options_.log)
    options_.log("work file " + results_path_ + ": line" + (damaged.size() > 1 ? "s " : " ") +
                 lines +
                 " cut short or damaged (no newline, or a checksum that does not match); not "
                 "used, measured again");
  // Rewritten with the whole lines only: the next record appended starts a line of its own,
  // and the damage is reported once.
  const std::string_view parts[] = {kept};
  return ReplaceWorkFile(results_path_, parts, /*sync=*/true);
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
                                       options_.cache_dir, options_.threads, cap.get(), &computed,
                                       options_.log));
  const uint64_t bytes = cap->data.size() * sizeof(uint16_t);
  if (it == held_.end() && held_bytes_ + bytes <= options_.capture_memory_bytes) {
    held_.emplace(begin, cap);
    held_bytes_ += bytes;
  }
  *out = std::move(cap);
  return Status::OK();
}

Status QualityProfiler::Windows(int32_t context, std::span<const int32_t> ws,
                                const DiskKvOptions* disk, std::vector<WindowQuality>* out) {
  const int32_t prefix = context - options_.scored - 1;
  if (prefix < 1)
    return Status::InvalidArgument("tune: a context of " + std::to_string(context) +
                                   " tokens leaves no prefix before " +
                                   std::to_string(options_.scored) + " scored positions");
  const int32_t n = int32_t(ws.size());
  std::unique_ptr<Engine> e;
  STRATA_RETURN_IF_ERROR(CreateRunEngine(model_, options_.threads, context, n, disk, &e));
  // A policy whose budget stages a pass in few tokens decodes the windows in as many passes.
  const size_t most =
      size_t(std::max(1, std::min(e->forward().max_tokens(), e->kv().max_pass_tokens())));
  std::vector<SeqId> seqs(ws.size());
  std::vector<size_t> begins(ws.size());
  for (size_t j = 0; j < ws.size(); ++j) {
    std::shared_ptr<const KvCapture> cap;
    STRATA_RETURN_IF_ERROR(Capture(context, ws[j], &cap));
    begins[j] = WindowBegin(context, ws[j]);
    STRATA_RETURN_IF_ERROR(e->NewSequence(&seqs[j]));
    STRATA_RETURN_IF_ERROR(ReplayPrefix(e->kv(), seqs[j], *cap, prefix));
  }
  // The reads are counted once the plan's reads have settled (kSettleSteps), keeping at
  // least the last pass: a long generation pays the settling once, and the checks
  // (MeasureSpeed) time and count the steps after it. Counted with it, the first load
  // overstated the reads of plans that read few groups a step, and the stale picks' turnover
  // those of plans whose M is below their slots.
  const int32_t uncounted = std::min(kSettleSteps, options_.scored - 1);
  KvCounters c0 = e->kv().counters();
  out->assign(ws.size(), WindowQuality{});
  std::vector<float> logits;
  ForwardBatch b;
  const int32_t n_vocab = model_.hparams().n_vocab;
  for (int32_t i = 0; i < options_.scored; ++i) {
    if (i == uncounted) c0 = e->kv().counters();
    for (size_t j0 = 0; j0 < ws.size(); j0 += most) {
      const size_t j1 = std::min(ws.size(), j0 + most);
      b.Clear();
      for (size_t j = j0; j < j1; ++j)
        b.Add(seqs[j], prefix + i,
              std::span<const int32_t>(&tokens_[begins[j] + size_t(prefix + i)], 1));
      STRATA_RETURN_IF_ERROR(e->Evaluate(b, &logits));
      for (size_t j = j0; j < j1; ++j)
        Accumulate(logits.data() + (j - j0) * size_t(n_vocab), n_vocab,
                   tokens_[begins[j] + size_t(prefix + i + 1)], &(*out)[j]);
    }
  }
  // The policy counts for all the windows: each gets its share of what the counted passes
  // read (the remainder to the first) and their number as its steps, so a summary's reads
  // per step stay reads per sequence and step.
  const KvCounters c = e->kv().counters();
  auto share = [n](uint64_t total, int32_t j) {
    return int64_t(total / uint64_t(n) + (uint64_t(j) < total % uint64_t(n) ? 1 : 0));
  };
  for (int32_t j = 0; j < n; ++j) {
    WindowQuality& q = (*out)[size_t(j)];
    q.steps = options_.scored - uncounted;
    q.counted_from = uncounted;
    q.reads = share(c.reads_issued - c0.reads_issued, j);
    q.refine_reads = share(c.refine_reads_issued - c0.refine_reads_issued, j);
    q.bytes_read = share(c.bytes_read - c0.bytes_read, j);
    q.groups_selected = share(c.groups_selected - c0.groups_selected, j);
    q.reuse_hits = share(c.reuse_hits - c0.reuse_hits, j);
    q.resident_attended = share(c.resident_attended - c0.resident_attended, j);
    q.layer_reads.clear();
    for (size_t l = 0; l < c.layer_reads_issued.size(); ++l)
      q.layer_reads.push_back(
          share(c.layer_reads_issued[l] -
                    (l < c0.layer_reads_issued.size() ? c0.layer_reads_issued[l] : 0),
                j));
  }
  return Status::OK();
}

Status QualityProfiler::Missing(const std::string& config, int32_t context,
                                const DiskKvOptions* disk) {
  std::vector<int32_t> ws;
  for (int32_t w = 0; w < options_.windows; ++w)
    if (!results_.count(LineKey(config, context, w))) ws.push_back(w);
  if (ws.empty()) return Status::OK();
  // Windows run side by side, as one batch of sequences, while their KV fits in what the
  // captures may hold: the pass's weights are read once for all of them.
  const uint64_t kv = disk ? uint64_t(std::max<int64_t>(1, disk->budget_bytes))
                           : FullKvBytes(model_.hparams(), context);
  const size_t together =
      std::max<size_t>(1, std::min<uint64_t>(ws.size(), options_.capture_memory_bytes / kv));
  for (size_t i = 0; i < ws.size(); i += together) {
    const std::span<const int32_t> part(ws.data() + i, std::min(together, ws.size() - i));
    std::vector<WindowQuality> qs;
    STRATA_RETURN_IF_ERROR(Windows(context, part, disk, &qs));
    for (size_t j = 0; j < part.size(); ++j) {
      WindowQuality& q = qs[j];
      if (disk) {
        // Agreement with full KV's top-1 token (measured before any configuration's).
        const WindowQuality& ref = results_.at(LineKey(kFullKey, context, part[j]));
        for (int32_t k = 0; k < q.positions && k < ref.positions; ++k) {
          const bool same = q.argmax[size_t(k)] == ref.argmax[size_t(k)];
          q.agree += same;
          if (ref.margin[size_t(k)] >= kClearMargin) {
            ++q.clear;
            q.clear_agree += same;
          }
        }
      }
      STRATA_RETURN_IF_ERROR(Record(LineKey(config, context, part[j]), q));
    }
  }
  return Status::OK();
}

Status QualityProfiler::Measure(const DiskKvOptions& disk, const std::string& key, int32_t context,
                                QualitySummary* out, int32_t* measured) {
  int32_t cached = 0;
  for (int32_t w = 0; w < options_.windows; ++w)
    cached += int32_t(results_.count(LineKey(key, context, w)));
  STRATA_RETURN_IF_ERROR(Missing(kFullKey, context, nullptr));
  STRATA_RETURN_IF_ERROR(Missing(key, context, &disk));
  QualitySummary s;
  for (int32_t w = 0; w < options_.windows; ++w) {
    const WindowQuality& ref = results_.at(LineKey(kFullKey, context, w));
    const WindowQuality& q = results_.at(LineKey(key, context, w));
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
    // Per layer only where every window has it.
    if (s.windows == 0)
      s.sum.layer_reads = q.layer_reads;
    else if (q.layer_reads.size() != s.sum.layer_reads.size())
      s.sum.layer_reads.clear();
    else
      for (size_t l = 0; l < q.layer_reads.size(); ++l) s.sum.layer_reads[l] += q.layer_reads[l];
    ++s.windows;
  }
  *out = s;
  if (measured) *measured = options_.windows - cached;
  return Status::OK();
}

Status QualityProfiler::Record(const std::string& key, const WindowQuality& q) {
  results_[key] = q;
  return AppendWorkFile(results_path_, Sealed(ToJson(key, q)));
}

}  // namespace strata
