#include "server/scheduler.h"

#include <algorithm>

#include "runtime/engine/sampler.h"
#include "runtime/engine/text_stream.h"

namespace strata::server {

bool Job::Take(std::chrono::milliseconds timeout, std::string* text, Result* result) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return done_ || !pending_.empty(); });
  text->append(pending_);
  pending_.clear();
  if (!done_) return false;
  *result = result_;
  return true;
}

void Job::Deliver(std::string_view text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.append(text);
  }
  cv_.notify_all();
}

void Job::Finish(Result result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(result);
    done_ = true;
  }
  cv_.notify_all();
}

// Owned and touched by the scheduler thread only.
struct Scheduler::Slot {
  SeqId seq = -1;
  std::vector<int32_t> tokens;  // exactly what the KV holds for seq
  std::shared_ptr<Job> job;     // null: free (its tokens stay for reuse)
  size_t prefilled = 0;         // prompt tokens the KV holds
  int64_t cached = 0;           // of them, resident before the request came
  bool decoding = false;        // prefill done; `next` waits to be evaluated
  int32_t next = -1;
  int64_t generated = 0;
  StopReason stop = StopReason::kNone;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  std::vector<int32_t> history;  // prompt and generated, for the repetition penalty
  uint64_t last_used = 0;
};

Scheduler::Scheduler(Engine* engine, int32_t slots, int32_t max_waiting, Metrics* metrics)
    : engine_(engine), metrics_(metrics), max_waiting_(max_waiting) {
  for (int32_t i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
}

Scheduler::~Scheduler() {
  Stop();
  for (auto& s : slots_)
    if (s->seq >= 0) (void)engine_->RemoveSequence(s->seq);
}

Status Scheduler::Start() {
  for (auto& s : slots_) STRATA_RETURN_IF_ERROR(engine_->NewSequence(&s->seq));
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The scheduler thread has ended (or never ran): the slots are this thread's now.
  const std::string bye = "the server is shutting down";
  FailRunning(bye, /*shutting_down=*/true);
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(waiting_);
  }
  for (auto& job : left) {
    Job::Result r;
    r.error = bye;
    r.shutting_down = true;
    job->Finish(r);
  }
  UpdateGauges();
}

Scheduler::Admission Scheduler::Submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Admission::kStopping;
    const int64_t free_slots = int64_t(slots_.size()) - busy_.load();
    if (int64_t(waiting_.size()) >= max_waiting_ + free_slots) return Admission::kQueueFull;
    waiting_.push_back(std::move(job));
    metrics_->SetQueueDepth(int64_t(waiting_.size()));
  }
  cv_.notify_all();
  return Admission::kQueued;
}

void Scheduler::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !waiting_.empty() ||
               std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->job; });
      });
      if (stopping_) break;
    }
    // A request whose client went away gives its slot back before this step's work.
    for (auto& s : slots_)
      if (s->job && s->job->cancelled()) FinishSlot(*s, "the request was cancelled");
    Admit();
    UpdateGauges();
    PrefillStep();
    DecodeStep();
    UpdateGauges();
  }
}

void Scheduler::Admit() {
  for (;;) {
    std::shared_ptr<Job> job;
    Slot* best = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty()) return;
      job = waiting_.front();
      if (!job->cancelled()) {
        // The free slot holding the longest whole prefix of the prompt; else the empty or
        // least recently used one, whose resident tokens are the least likely to be asked for.
        const std::vector<int32_t>& p = job->prompt();
        Slot* lru = nullptr;
        size_t best_len = 0;
        for (auto& sp : slots_) {
          Slot& s = *sp;
          if (s.job) continue;
          const bool prefix = !s.tokens.empty() && s.tokens.size() < p.size() &&
                              std::equal(s.tokens.begin(), s.tokens.end(), p.begin());
          if (prefix && s.tokens.size() > best_len) {
            best = &s;
            best_len = s.tokens.size();
          }
          if (!lru || (s.tokens.empty() != lru->tokens.empty() ? s.tokens.empty()
                                                               : s.last_used < lru->last_used))
            lru = &s;
        }
        if (!best) best = lru;
        if (!best) return;  // every slot is busy: the job keeps its place
      }
      waiting_.pop_front();
      metrics_->SetQueueDepth(int64_t(waiting_.size()));
    }
    if (!best) {
      Job::Result r;
      r.error = "the request was cancelled";
      job->Finish(r);
      continue;
    }
    StartSlot(*best, std::move(job));
  }
}

void Scheduler::StartSlot(Slot& s, std::shared_ptr<Job> job) {
  const std::vector<int32_t>& p = job->prompt();
  const bool prefix =
      s.tokens.size() < p.size() && std::equal(s.tokens.begin(), s.tokens.end(), p.begin());
  if (!prefix) ResetSlot(s);
  s.prefilled = s.tokens.size();
  s.cached = int64_t(s.tokens.size());
  s.decoding = false;
  s.next = -1;
  s.generated = 0;
  s.stop = StopReason::kNone;
  s.sampler = std::make_unique<Sampler>(job->params().sampling, engine_->model().hparams().n_vocab);
  s.text = std::make_unique<TextStream>(job->params().stop);
  s.history.clear();
  metrics_->AddTokens(int64_t(p.size()), 0);
  s.job = std::move(job);
}

void Scheduler::ResetSlot(Slot& s) {
  if (s.seq >= 0) (void)engine_->RemoveSequence(s.seq);
  s.seq = -1;
  s.tokens.clear();
  // Removing then adding within the policy's limit cannot fail short of a broken policy;
  // a slot left without a sequence fails its next request instead of the server.
  (void)engine_->NewSequence(&s.seq);
}

void Scheduler::PrefillStep() {
  // One chunk per step, for the request waiting longest: decoding slots keep producing
  // tokens between the chunks of a long prompt. The chunks start where `strata run`'s would
  // (at the first token not yet in the KV, n_batch at a time), so the same prompt gives the
  // same logits.
  Slot* pick = nullptr;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (!s.job || s.decoding) continue;
    if (!pick || s.job->submitted() < pick->job->submitted()) pick = &s;
  }
  if (!pick) return;
  Slot& s = *pick;
  if (s.seq < 0) {
    FinishSlot(s, "no KV sequence is available");
    return;
  }
  const std::vector<int32_t>& p = s.job->prompt();
  const size_t step = size_t(std::max(1, engine_->forward().max_tokens()));
  const size_t n = std::min(step, p.size() - s.prefilled);
  batch_.Clear();
  batch_.Add(s.seq, int32_t(s.prefilled), std::span<const int32_t>(p.data() + s.prefilled, n));
  const Status st = engine_->Evaluate(batch_, &logits_);
  if (!st.ok()) {
    FinishSlot(s, st.message());
    ResetSlot(s);
    return;
  }
  s.tokens.insert(s.tokens.end(), p.begin() + std::ptrdiff_t(s.prefilled),
                  p.begin() + std::ptrdiff_t(s.prefilled + n));
  s.prefilled += n;
  if (s.prefilled < p.size()) return;
  s.history = p;
  s.next = s.sampler->Sample(logits_.data(), s.history);
  metrics_->ObserveTtft(
      std::chrono::duration<double>(Job::Clock::now() - s.job->submitted()).count());
  if (Accept(s, s.next)) {
    FinishSlot(s);
  } else {
    s.decoding = true;
  }
}

void Scheduler::DecodeStep() {
  batch_.Clear();
  std::vector<Slot*> order;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (!s.job || !s.decoding) continue;
    batch_.Add(s.seq, int32_t(s.tokens.size()), std::span<const int32_t>(&s.next, 1));
    order.push_back(&s);
  }
  if (order.empty()) return;
  const auto t0 = Job::Clock::now();
  const Status st = engine_->Evaluate(batch_, &logits_);
  metrics_->ObserveDecodeStep(std::chrono::duration<double>(Job::Clock::now() - t0).count());
  if (!st.ok()) {
    for (Slot* s : order) {
      FinishSlot(*s, st.message());
      ResetSlot(*s);
    }
    return;
  }
  const size_t n_vocab = size_t(engine_->model().hparams().n_vocab);
  for (size_t i = 0; i < order.size(); ++i) {
    Slot& s = *order[i];
    s.tokens.push_back(s.next);
    s.next = s.sampler->Sample(logits_.data() + i * n_vocab, s.history);
    if (Accept(s, s.next)) FinishSlot(s);
  }
}

// The same rules, in the same order, as Engine::Generate, so a request ends where
// `strata run` would.
bool Scheduler::Accept(Slot& s, int32_t id) {
  const Tokenizer& tok = engine_->model().tokenizer();
  const GenerateParams& params = s.job->params();
  if (!params.ignore_eos && tok.IsEndOfGeneration(id)) {
    s.stop = StopReason::kEndOfGeneration;
    return true;
  }
  s.history.push_back(id);
  ++s.generated;
  metrics_->AddTokens(0, 1);
  std::string piece;
  const bool hit = s.text->Push(tok.TokenBytes(id), &piece);
  s.job->Deliver(piece);
  if (hit) {
    s.stop = StopReason::kStopString;
    return true;
  }
  if (params.max_tokens > 0 && s.generated >= params.max_tokens) {
    s.stop = StopReason::kMaxTokens;
    return true;
  }
  if (int64_t(s.tokens.size()) + 1 > engine_->options().n_ctx) {
    s.stop = StopReason::kContextFull;
    return true;
  }
  return false;
}

void Scheduler::FinishSlot(Slot& s, std::string error, bool shutting_down) {
  if (!s.job) return;
  if (error.empty() && s.stop != StopReason::kStopString) s.job->Deliver(s.text->Flush());
  Job::Result r;
  r.stop = s.stop;
  r.error = std::move(error);
  r.shutting_down = shutting_down;
  r.prompt_tokens = int64_t(s.job->prompt().size());
  r.cached_tokens = s.cached;
  r.completion_tokens = s.generated;
  s.job->Finish(std::move(r));
  s.job.reset();
  s.decoding = false;
  s.last_used = ++tick_;
}

void Scheduler::FailRunning(const std::string& error, bool shutting_down) {
  for (auto& s : slots_) FinishSlot(*s, error, shutting_down);
}

void Scheduler::UpdateGauges() {
  int64_t active = 0;
  for (const auto& s : slots_) active += s->job ? 1 : 0;
  busy_.store(int32_t(active));
  metrics_->SetActiveSlots(active);
}

}  // namespace strata::server
