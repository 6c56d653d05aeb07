// The C API's beam-search section: a thin translation of strata.h's strata_beam_* onto
// RunBeamSearch. Like strata_c.cc, it converts types and errors, decides nothing, and lets
// no C++ exception cross into C.
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "runtime/api/c_api_internal.h"
#include "runtime/search/beam_search.h"
#include "strata/strata.h"

struct strata_beam_results {
  std::vector<strata::BeamResult> beams;
  std::vector<strata_beam_result> view;  // points into beams
  strata::BeamSearchStats stats;
};

namespace {

strata_status Fail(strata_status code, std::string msg) {
  strata::api::SetLastError(std::move(msg));
  return code;
}

strata_status ToC(const strata::Status& s) {
  if (s.ok()) return STRATA_OK;
  return Fail(static_cast<strata_status>(static_cast<int>(s.code())), s.message());
}

strata::Status ToParams(const strata_beam_params& c, strata::BeamSearchParams* p) {
  p->n_beams = c.n_beams;
  p->beam_width = c.beam_width;
  p->step_tokens = c.step_tokens;
  p->step_delimiter = c.step_delimiter ? c.step_delimiter : "";
  p->max_tokens = c.max_tokens;
  p->max_steps = c.max_steps;
  p->sampling.temperature = c.temperature;
  p->sampling.top_k = c.top_k;
  p->sampling.top_p = c.top_p;
  p->sampling.min_p = c.min_p;
  p->sampling.seed = c.seed;
  p->ignore_eos = c.ignore_eos != 0;
  p->fast_budget_bytes = c.fast_budget_bytes;
  p->n_threads = c.n_threads;
  p->slow_dir = c.slow_dir ? c.slow_dir : "";
  p->slow_in_ram = c.slow_in_ram != 0;
  p->speculate = c.speculate;
  p->verifier_share = c.verifier_share;
  if (c.n_threads < 0 || c.n_threads > 1024)
    return strata::Status::InvalidArgument("n_threads: " + std::to_string(c.n_threads) +
                                           " is out of range [0, 1024]");
  if (c.schedule && *c.schedule) return strata::ParseBeamSchedule(c.schedule, &p->schedule);
  return strata::Status::OK();
}

}  // namespace

extern "C" {

strata_beam_params strata_beam_default_params(void) {
  const strata::BeamSearchParams d;
  strata_beam_params p;
  std::memset(&p, 0, sizeof(p));
  p.n_threads = d.n_threads;
  p.n_beams = d.n_beams;
  p.beam_width = d.beam_width;
  p.step_tokens = d.step_tokens;
  p.max_tokens = d.max_tokens;
  p.max_steps = d.max_steps;
  p.temperature = d.sampling.temperature;
  p.top_k = d.sampling.top_k;
  p.top_p = d.sampling.top_p;
  p.min_p = d.sampling.min_p;
  p.seed = d.sampling.seed;
  p.fast_budget_bytes = d.fast_budget_bytes;
  p.verifier_share = d.verifier_share;
  return p;
}

strata_status strata_beam_search(const strata_model* model, const char* prompt,
                                 const strata_beam_params* params, strata_beam_scorer scorer,
                                 void* user_data, strata_beam_results** out) {
  STRATA_C_REQUIRE_ARG(model);
  STRATA_C_REQUIRE_ARG(prompt);
  STRATA_C_REQUIRE_ARG(params);
  STRATA_C_REQUIRE_ARG(out);
  *out = nullptr;
  try {
    const strata::Model& m = *model->model;
    strata::BeamSearchParams p;
    strata_status s = ToC(ToParams(*params, &p));
    if (s != STRATA_OK) return s;
    std::vector<int32_t> ids;
    s = ToC(strata::EncodeBeamPrompt(m, prompt, params->chat != 0, &ids));
    if (s != STRATA_OK) return s;

    std::unique_ptr<strata::Verifier> verifier;
    std::unique_ptr<strata::Model> scorer_model;
    if (scorer) {
      verifier = std::make_unique<strata::CallbackVerifier>(
          [scorer, user_data](const strata::StepCandidate& c, double* score) {
            double sum = 0;
            for (float x : c.step_logprobs) sum += x;
            strata_beam_step step;
            step.beam_id = c.beam_id;
            step.step = c.step;
            step.path_tokens = c.path_tokens.data();
            step.n_path_tokens = c.path_tokens.size();
            step.step_tokens = c.step_tokens.data();
            step.n_step_tokens = c.step_tokens.size();
            step.text = c.text.data();
            step.text_len = c.text.size();
            step.mean_logprob =
                c.step_logprobs.empty() ? 0.f : float(sum / double(c.step_logprobs.size()));
            step.final_step = c.final ? 1 : 0;
            float value = 0;
            const int rc = scorer(&step, &value, user_data);
            if (rc != 0)
              return strata::Status::Aborted("scorer callback returned " + std::to_string(rc) +
                                             " for beam " + std::to_string(c.beam_id) +
                                             " at step " + std::to_string(c.step));
            *score = double(value);
            return strata::Status::OK();
          });
    } else if (params->scorer_model && *params->scorer_model) {
      std::unique_ptr<strata::ModelVerifier> mv;
      s = ToC(strata::ModelVerifier::Load(params->scorer_model, m, p.n_threads, ids.size(),
                                          p.max_tokens, p.n_beams, &scorer_model, &mv));
      if (s != STRATA_OK) return s;
      verifier = std::move(mv);
    }

    auto r = std::make_unique<strata_beam_results>();
    s = ToC(strata::RunBeamSearch(m, ids, p, verifier.get(), &r->beams, &r->stats));
    if (s != STRATA_OK) return s;
    r->view.resize(r->beams.size());
    for (size_t i = 0; i < r->beams.size(); ++i) {
      const strata::BeamResult& b = r->beams[i];
      strata_beam_result& v = r->view[i];
      v.beam_id = b.beam_id;
      v.text = b.text.c_str();
      v.text_len = b.text.size();
      v.tokens = b.tokens.data();
      v.n_tokens = b.tokens.size();
      v.score = b.score;
      v.steps = b.steps;
      v.stop_reason = strata::BeamStopName(b.stop);
    }
    *out = r.release();
    return STRATA_OK;
  } catch (const std::bad_alloc&) {
    return Fail(STRATA_ERR_RESOURCE_EXHAUSTED, "strata_beam_search: out of memory");
  } catch (const std::exception& e) {
    return Fail(STRATA_ERR_INTERNAL,
                std::string("strata_beam_search: unexpected exception: ") + e.what());
  }
}

size_t strata_beam_results_count(const strata_beam_results* results) {
  return results ? results->view.size() : 0;
}

const strata_beam_result* strata_beam_results_get(const strata_beam_results* results, size_t i) {
  if (!results || i >= results->view.size()) return nullptr;
  return &results->view[i];
}

strata_status strata_beam_results_get_stats(const strata_beam_results* results,
                                            strata_beam_stats* out) {
  STRATA_C_REQUIRE_ARG(results);
  STRATA_C_REQUIRE_ARG(out);
  const strata::BeamSearchStats& s = results->stats;
  std::memset(out, 0, sizeof(*out));
  out->steps = s.steps;
  out->rounds = s.rounds;
  out->generated_tokens = s.generated_tokens;
  out->seconds = s.seconds;
  out->bytes_read = s.kv.bytes_read;
  out->bytes_written = s.kv.bytes_written;
  out->peak_shared_blocks = s.peak_shared_blocks;
  out->peak_tree_bytes = s.peak_tree_bytes;
  out->fast_budget_bytes = s.kv.fast_budget_bytes;
  out->peak_fast_bytes = s.kv.peak_fast_bytes;
  out->blocks_prefetched = s.kv.blocks_prefetched;
  out->stall_seconds = s.kv.stall_seconds;
  out->finished_tokens = s.finished_tokens;
  out->slot_passes = s.slot_passes;
  out->idle_slot_passes = s.idle_slot_passes;
  out->speculative_tokens = s.speculative_tokens;
  out->speculative_tokens_kept = s.speculative_tokens_kept;
  out->verifier_ahead_tokens = s.verifier_ahead_tokens;
  out->verifier_ahead_reused = s.verifier_ahead_reused;
  if (s.shared_budget) {
    out->peak_fast_bytes_both = s.peak_fast_bytes_total;
    out->verifier_bytes_read = s.verifier_kv.bytes_read;
    out->verifier_bytes_written = s.verifier_kv.bytes_written;
    out->generator_phase_share = s.generator_phase_share;
    out->verifier_phase_share = s.verifier_phase_share;
  }
  return STRATA_OK;
}

void strata_beam_results_free(strata_beam_results* results) { delete results; }

}  // extern "C"
