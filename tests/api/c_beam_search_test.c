/* A C99 program that runs strata_beam_search on the real model through strata.h only: the
 * built-in scorer with everything in memory, the same search under a small fast-tier
 * budget (identical results, bytes moved, the budget kept), an application scorer that
 * decides the ranking, a scorer that fails, a second model as the scorer, and bad
 * parameters. Exits non-zero on the first failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/strata.h"

static int failures = 0;
#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              strata_last_error());                                                            \
      failures++;                                                                              \
    }                                                                                          \
  } while (0)

static const char* kPrompt =
    "A long hike in the mountains needs some planning. The weather can change quickly, the "
    "trail may be rough, and water is not always easy to find. The three most useful things "
    "to pack are";

/* Prefers steps whose first token id is even; counts its calls. */
static int even_first(const strata_beam_step* step, float* score, void* user) {
  int* calls = (int*)user;
  (*calls)++;
  if (step->n_step_tokens == 0 || step->text == NULL) return 5;
  *score = step->step_tokens[0] % 2 == 0 ? 1.0f : -1.0f;
  return 0;
}

static int fail_at_step_one(const strata_beam_step* step, float* score, void* user) {
  (void)user;
  *score = step->mean_logprob;
  return step->step == 1 ? 42 : 0;
}

static int same_results(const strata_beam_results* a, const strata_beam_results* b) {
  size_t i, n = strata_beam_results_count(a);
  if (n != strata_beam_results_count(b)) return 0;
  for (i = 0; i < n; ++i) {
    const strata_beam_result* x = strata_beam_results_get(a, i);
    const strata_beam_result* y = strata_beam_results_get(b, i);
    if (x->beam_id != y->beam_id || x->n_tokens != y->n_tokens || x->score != y->score) return 0;
    if (memcmp(x->tokens, y->tokens, x->n_tokens * sizeof(int32_t)) != 0) return 0;
    if (strcmp(x->text, y->text) != 0) return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : getenv("STRATA_TEST_MODEL");
  char default_path[1024];
  strata_model* model = NULL;
  strata_beam_params bp;
  strata_beam_results* fits = NULL;
  strata_beam_results* tight = NULL;
  strata_beam_results* ranked = NULL;
  strata_beam_results* none = NULL;
  strata_beam_stats st;
  size_t i;
  int calls = 0;

  if (!path || !*path) {
    const char* home = getenv("STRATA_HOME");
    if (home && *home) {
      snprintf(default_path, sizeof(default_path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", home);
    } else {
      snprintf(default_path, sizeof(default_path),
               "%s/.cache/strata/SmolLM2-135M-Instruct.Q4_1.gguf",
               getenv("HOME") ? getenv("HOME") : ".");
    }
    path = default_path;
  }
  if (strata_model_load(path, &model) != STRATA_OK) {
    fprintf(stderr, "cannot load %s: %s (run scripts/fetch_model.sh)\n", path, strata_last_error());
    return 1;
  }

  bp = strata_beam_default_params();
  CHECK(bp.n_beams == 8 && bp.beam_width == 2 && bp.fast_budget_bytes == 0);
  bp.n_threads = 1;
  bp.n_beams = 8;
  bp.step_tokens = 8;
  bp.max_tokens = 24;
  bp.seed = 7;
  bp.ignore_eos = 1;

  /* Built-in scorer, everything in memory. */
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &fits) == STRATA_OK);
  CHECK(strata_beam_results_count(fits) == 8);
  CHECK(strata_beam_results_get(fits, 8) == NULL);
  for (i = 0; i < strata_beam_results_count(fits); ++i) {
    const strata_beam_result* r = strata_beam_results_get(fits, i);
    CHECK(r->n_tokens == 24 && r->text_len > 0 && strlen(r->text) == r->text_len);
    CHECK(strcmp(r->stop_reason, "max_tokens") == 0 && r->steps == 3);
    CHECK(r->score < 0 && isfinite(r->score));
    if (i > 0) CHECK(strata_beam_results_get(fits, i - 1)->score >= r->score);
  }
  CHECK(strata_beam_results_get_stats(fits, &st) == STRATA_OK);
  CHECK(st.steps == 3 && st.rounds == 3 && st.bytes_read == 0 && st.peak_shared_blocks > 0);
  CHECK(st.generated_tokens > 0 && st.peak_tree_bytes > 0);

  /* A budget of half the tree: grouping, bytes moved, same ranked beams. */
  bp.fast_budget_bytes = st.peak_tree_bytes / 2;
  bp.slow_in_ram = 0;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &tight) == STRATA_OK);
  CHECK(same_results(fits, tight));
  CHECK(strata_beam_results_get_stats(tight, &st) == STRATA_OK);
  CHECK(st.rounds > st.steps && st.bytes_written > 0 && st.bytes_read > 0);
  CHECK(st.peak_fast_bytes <= st.fast_budget_bytes && st.fast_budget_bytes == bp.fast_budget_bytes);
  strata_beam_results_free(tight);
  tight = NULL;
  bp.schedule = "tokenwise";
  bp.fast_budget_bytes = 0;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &tight) == STRATA_OK);
  CHECK(same_results(fits, tight));
  bp.schedule = NULL;

  /* The application's scorer ranks the beams. */
  CHECK(strata_beam_search(model, kPrompt, &bp, even_first, &calls, &ranked) == STRATA_OK);
  CHECK(calls == 8 * 3);
  for (i = 0; ranked && i < strata_beam_results_count(ranked); ++i) {
    const strata_beam_result* r = strata_beam_results_get(ranked, i);
    double expect = 0;
    size_t t;
    for (t = 0; t < r->n_tokens; t += 8) expect += r->tokens[t] % 2 == 0 ? 1.0 : -1.0;
    CHECK(fabs(r->score - expect / 3.0) < 1e-9);
  }

  /* A failing scorer is an error naming it; nothing is returned. */
  CHECK(strata_beam_search(model, kPrompt, &bp, fail_at_step_one, NULL, &none) ==
        STRATA_ERR_ABORTED);
  CHECK(none == NULL);
  CHECK(strstr(strata_last_error(), "scorer callback returned 42") != NULL);

  /* The same model file as a second, scoring model. */
  bp.scorer_model = path;
  bp.max_tokens = 16;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) == STRATA_OK);
  CHECK(strata_beam_results_count(none) == 8);
  /* Its KV shares a budget with the generator's, evenly: same beams, budget kept. */
  {
    strata_beam_results* shared = NULL;
    strata_beam_stats st;
    CHECK(strata_beam_results_get_stats(none, &st) == STRATA_OK);
    CHECK(st.peak_fast_bytes_both == 0);
    bp.fast_budget_bytes = st.peak_tree_bytes;
    bp.verifier_share = 0.5f;
    CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &shared) == STRATA_OK);
    CHECK(same_results(none, shared));
    CHECK(strata_beam_results_get_stats(shared, &st) == STRATA_OK);
    CHECK(st.peak_fast_bytes_both > 0 && st.peak_fast_bytes_both <= bp.fast_budget_bytes);
    CHECK(fabs(st.verifier_phase_share - 0.5) < 0.1);
    strata_beam_results_free(shared);
    bp.verifier_share = 2.0f;
    CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &shared) ==
          STRATA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(strata_last_error(), "verifier share: 2") != NULL);
    bp.verifier_share = -1.0f;
    bp.fast_budget_bytes = 0;
  }
  strata_beam_results_free(none);
  none = NULL;
  bp.scorer_model = "/nonexistent/scorer.gguf";
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) != STRATA_OK);
  CHECK(strstr(strata_last_error(), "/nonexistent/scorer.gguf") != NULL);
  bp.scorer_model = NULL;

  /* Bad parameters. */
  bp.n_beams = 0;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(strata_last_error(), "beams: 0") != NULL);
  bp.n_beams = 8;
  bp.beam_width = 3;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(strata_last_error(), "beam width: 3") != NULL);
  bp.beam_width = 2;
  bp.step_tokens = 0;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) == STRATA_ERR_INVALID_ARGUMENT);
  bp.step_tokens = 8;
  bp.fast_budget_bytes = 1000;
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) ==
        STRATA_ERR_RESOURCE_EXHAUSTED);
  CHECK(strstr(strata_last_error(), "the minimum is") != NULL);
  bp.fast_budget_bytes = 0;
  bp.schedule = "fastest";
  CHECK(strata_beam_search(model, kPrompt, &bp, NULL, NULL, &none) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(strata_last_error(), "'fastest'") != NULL);
  CHECK(strata_beam_search(NULL, kPrompt, &bp, NULL, NULL, &none) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strata_beam_results_get_stats(NULL, &st) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strata_beam_results_get_stats(fits, NULL) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(strata_last_error(), "strata_beam_results_get_stats: out must not be NULL") == 0);
  CHECK(none == NULL);

  strata_beam_results_free(fits);
  strata_beam_results_free(tight);
  strata_beam_results_free(ranked);
  strata_beam_results_free(NULL);
  strata_model_free(model);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("c_beam_search_test: all checks passed\n");
  return 0;
}
