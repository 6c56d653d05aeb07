// Continuous batching over one Engine: a scheduler thread owns the engine and serves many
// requests at once, each in a slot (an engine sequence). Every step it admits waiting
// requests into free slots, runs one prefill chunk of one slot, then one decode pass over
// every decoding slot together, and hands each request its new text through a Job.
//
// A finished slot keeps its sequence and tokens resident: a later request whose prompt
// begins with them takes that slot and prefills only the rest (the KV policies cannot cut a
// sequence back, so only a stored run that is a whole prefix of the new prompt is reused).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/engine.h"
#include "server/metrics.h"

namespace strata::server {

// One request as the scheduler sees it, and the channel its HTTP thread reads from.
class Job {
 public:
  Job(std::vector<int32_t> prompt, GenerateParams params)
      : prompt_(std::move(prompt)), params_(std::move(params)), submitted_(Clock::now()) {}
  using Clock = std::chrono::steady_clock;

  const std::vector<int32_t>& prompt() const { return prompt_; }
  const GenerateParams& params() const { return params_; }
  Clock::time_point submitted() const { return submitted_; }

  // What the consumer reads. `text` is appended to (the text since the last call); true
  // once the job is over (then `finish`/`error` are final). Waits at most `timeout` for
  // news.
  struct Result {
    StopReason stop = StopReason::kNone;
    std::string error;           // non-empty when the job failed or was cut off
    bool shutting_down = false;  // the error is the server stopping, not the request failing
    int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  };
  bool Take(std::chrono::milliseconds timeout, std::string* text, Result* result);
  // The consumer went away: the scheduler frees the slot at its next step.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Scheduler side.
  void Deliver(std::string_view text);
  void Finish(Result result);

 private:
  std::vector<int32_t> prompt_;
  GenerateParams params_;
  Clock::time_point submitted_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  bool done_ = false;
  Result result_;
};

class Scheduler {
 public:
  // `engine` must allow `slots` sequences (EngineOptions::max_sequences) and passes of
  // `slots` tokens; at most `max_waiting` requests wait once every slot is busy.
  Scheduler(Engine* engine, int32_t slots, int32_t max_waiting, Metrics* metrics);
  ~Scheduler();

  // Makes the slots' sequences and starts the scheduler thread.
  Status Start();
  // Fails every waiting and running job ("the server is shutting down"), refuses new ones
  // and joins the thread. Idempotent.
  void Stop();

  enum class Admission { kQueued, kQueueFull, kStopping };
  Admission Submit(std::shared_ptr<Job> job);

 private:
  struct Slot;
  void Loop();
  void Admit();
  void StartSlot(Slot& s, std::shared_ptr<Job> job);
  void PrefillStep();
  void DecodeStep();
  // Emits a sampled token; returns true when the slot's request is over.
  bool Accept(Slot& s, int32_t id);
  void FinishSlot(Slot& s, std::string error = {}, bool shutting_down = false);
  // Replaces the slot's sequence by an empty one (its KV no longer matches its tokens).
  void ResetSlot(Slot& s);
  void FailRunning(const std::string& error, bool shutting_down);
  void UpdateGauges();

  Engine* engine_;
  Metrics* metrics_;
  const int32_t max_waiting_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t tick_ = 0;  // for least-recently-used eviction of idle slots
  // Slots serving a request, as last counted by the scheduler thread: a request is refused
  // only when it would wait behind max_waiting others with every slot busy.
  std::atomic<int32_t> busy_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  bool stopping_ = false;
  std::thread thread_;
  std::vector<float> logits_;
  ForwardBatch batch_;
};

}  // namespace strata::server
