/* strata.h: the C API of Strata, an LLM runtime for devices whose memory cannot hold
 * the KV cache.
 *
 * Conventions
 * - Every handle is opaque and created by a strata_*_create/_load function and released
 *   by the matching _free (which accepts NULL).
 * - Functions that can fail return strata_status; on failure strata_last_error() gives a
 *   message naming the problem (file, field, value, limit). The message is thread-local
 *   and stays valid until the next failing call on the same thread.
 * - Parameter structs come with a *_default_params() function: take the defaults, change
 *   the fields you need, pass a pointer.
 * - Arguments, checked the same way by every function before it does anything else:
 *   - A pointer the function needs (a handle, an input, an out parameter) must not be NULL.
 *     The pointers that may be NULL say so below, and so do the _free functions.
 *   - An array comes with its count (text/text_len, tokens/capacity, buf/capacity,
 *     prompts/n_prompts, params->stop/params->n_stop). Its pointer may be NULL only when
 *     the count is 0.
 *   - A count above PTRDIFF_MAX is a negative number converted to size_t (-1 arrives as
 *     SIZE_MAX) and is refused, whatever the pointer.
 *   - An array of strings holds no NULL element.
 *   A call that breaks one returns STRATA_ERR_INVALID_ARGUMENT and changes nothing (out
 *   parameters included); strata_last_error() names the function, the argument and its
 *   count: "strata_generate: params->stop is NULL but params->n_stop is 3",
 *   "strata_tokenize: capacity is negative (-1, passed as size_t 18446744073709551615)",
 *   "strata_generate_batch: prompts[1] is NULL (n_prompts is 2)",
 *   "strata_model_load: out must not be NULL".
 * - A model may be shared by several engines and threads. An engine and its sessions
 *   belong to one thread at a time.
 * - The header is C99; it never exposes a C++ type.
 */
#ifndef STRATA_H_
#define STRATA_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define STRATA_API __declspec(dllexport)
#else
#define STRATA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0

/* "0.1.0" */
STRATA_API const char* strata_version(void);

typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_ERR_INVALID_ARGUMENT = 1,   /* a parameter, prompt or config value is wrong */
  STRATA_ERR_NOT_FOUND = 2,          /* a file, key or tensor does not exist */
  STRATA_ERR_CORRUPTION = 3,         /* a file is damaged or inconsistent */
  STRATA_ERR_NOT_SUPPORTED = 4,      /* valid input this build does not handle */
  STRATA_ERR_IO = 5,                 /* the operating system refused an operation */
  STRATA_ERR_OUT_OF_RANGE = 6,       /* past a limit: context length, buffer size */
  STRATA_ERR_RESOURCE_EXHAUSTED = 7, /* memory budget or disk full */
  STRATA_ERR_ABORTED = 8,            /* stopped on purpose */
  STRATA_ERR_INTERNAL = 9            /* a bug in Strata */
} strata_status;

/* The message of the last failed call on this thread ("" if none). */
STRATA_API const char* strata_last_error(void);
/* "OK", "invalid argument", ... */
STRATA_API const char* strata_status_name(strata_status status);

typedef struct strata_model strata_model;
typedef struct strata_engine strata_engine;
typedef struct strata_session strata_session;

/* ---- Model ------------------------------------------------------------------------- */

/* Maps and validates a GGUF file. */
STRATA_API strata_status strata_model_load(const char* path, strata_model** out);
STRATA_API void strata_model_free(strata_model* model);

typedef struct strata_model_info {
  char architecture[32]; /* "llama", "qwen2", "qwen3" */
  char name[128];        /* general.name, may be empty */
  int32_t n_vocab;
  int32_t n_ctx_train;
  int32_t n_embd;
  int32_t n_layer;
  int32_t n_head;
  int32_t n_head_kv;
  int32_t head_dim;
  int32_t n_ff;
  uint64_t n_params;
  uint64_t weight_bytes;
  uint64_t kv_bytes_per_token; /* K+V of all layers as F16 */
  int32_t bos_token;           /* -1 if none */
  int32_t eos_token;
  char chat_template[16]; /* "chatml", "llama3", "llama2" or "none" */
} strata_model_info;

STRATA_API strata_status strata_model_get_info(const strata_model* model, strata_model_info* out);

/* Tokenizes UTF-8 text. Writes at most `capacity` ids to `tokens` and the number needed to
 * *n_tokens; if capacity is too small, returns STRATA_ERR_OUT_OF_RANGE with *n_tokens set
 * (call again with a larger buffer). Invalid UTF-8 is an error naming the byte offset. */
STRATA_API strata_status strata_tokenize(const strata_model* model, const char* text,
                                         size_t text_len, int add_bos, int parse_special,
                                         int32_t* tokens, size_t capacity, size_t* n_tokens);
/* Writes the text of `tokens` (NUL-terminated) to `buf`; *text_len gets its length without
 * the NUL. STRATA_ERR_OUT_OF_RANGE with *text_len set when capacity is too small (buf NULL
 * with capacity 0 asks for the length that way). */
STRATA_API strata_status strata_detokenize(const strata_model* model, const int32_t* tokens,
                                           size_t n_tokens, char* buf, size_t capacity,
                                           size_t* text_len);

/* ---- Engine ------------------------------------------------------------------------ */

typedef struct strata_engine_params {
  const char* config_path; /* strata.yaml applied first (NULL = none); the fields below
                              override it when they differ from their defaults */
  int32_t n_threads;       /* 0 = one per core */
  int32_t n_ctx;           /* 0 = the model's training context */
  int32_t n_batch;         /* most tokens per forward pass; default 512 */
  int32_t max_sequences;   /* sessions/sequences decoded together; default 1 */
  const char* kv_policy;   /* "memory" (NULL = the config's or the default) */
} strata_engine_params;

STRATA_API strata_engine_params strata_engine_default_params(void);
/* `params` may be NULL: the defaults. */
STRATA_API strata_status strata_engine_create(const strata_model* model,
                                              const strata_engine_params* params,
                                              strata_engine** out);
STRATA_API void strata_engine_free(strata_engine* engine);

/* ---- Generation -------------------------------------------------------------------- */

typedef struct strata_generate_params {
  int32_t max_tokens;   /* new tokens at most; 0 = until the context is full */
  float temperature;    /* 0 = greedy */
  int32_t top_k;        /* 0 = off */
  float top_p;          /* 1 = off */
  float min_p;          /* 0 = off */
  float repeat_penalty; /* 1 = off */
  int32_t repeat_last_n;
  uint64_t seed;
  const char* const* stop; /* strings that end generation (not included in the output) */
  size_t n_stop;
  int ignore_eos; /* non-zero: do not stop at end-of-generation tokens */
  int chat;       /* non-zero: the prompt is a user message, rendered with the
                     model's chat template; the session keeps the conversation */
} strata_generate_params;

STRATA_API strata_generate_params strata_generate_default_params(void);

/* Called for every generated token with the text it completes (whole UTF-8 characters;
 * may be empty). The final call after generation ends may carry token -1 and the text
 * held back until then. Return 0 to continue, non-zero to stop. */
typedef int (*strata_token_callback)(int32_t token, const char* text, size_t text_len,
                                     void* user_data);

/* A session is one conversation: successive strata_generate calls continue it. */
STRATA_API strata_status strata_session_create(strata_engine* engine, strata_session** out);
STRATA_API void strata_session_free(strata_session* session);
/* Forgets the conversation and its KV. */
STRATA_API strata_status strata_session_reset(strata_session* session);

/* Generates a continuation of `prompt` (NUL-terminated UTF-8). `params` may be NULL (the
 * defaults), and so may `callback`. If `text_out` is not NULL it receives the whole
 * generated text, to be released with strata_string_free. */
STRATA_API strata_status strata_generate(strata_session* session, const char* prompt,
                                         const strata_generate_params* params,
                                         strata_token_callback callback, void* user_data,
                                         char** text_out);

/* Generates for n_prompts prompts at once, decoding them together as one batch (the
 * engine needs max_sequences >= n_prompts; n_prompts 0 is refused). `params` and
 * `callback` may be NULL, as for strata_generate. The callback's user data is
 * user_data[i] for prompt i (user_data may be NULL). texts_out (NULL or an array of
 * n_prompts pointers) receives each text, to be released with strata_string_free. */
STRATA_API strata_status strata_generate_batch(strata_engine* engine, const char* const* prompts,
                                               size_t n_prompts,
                                               const strata_generate_params* params,
                                               strata_token_callback callback,
                                               void* const* user_data, char** texts_out);

STRATA_API void strata_string_free(char* s);

typedef struct strata_stats {
  int64_t prompt_tokens;
  int64_t generated_tokens;
  double prefill_seconds;
  double decode_seconds;
  double prefill_tokens_per_second;
  double decode_tokens_per_second;
  int64_t peak_rss_bytes;     /* of the process */
  uint64_t kv_resident_bytes; /* memory the KV policy holds now */
  uint64_t kv_peak_resident_bytes;
  uint64_t kv_bytes_read; /* from the slow tier (disk policies) */
  uint64_t kv_bytes_written;
  uint64_t kv_reads_issued;
  uint64_t kv_reuse_hits;
  double kv_io_wait_seconds; /* I/O wait not hidden by compute */
  char stop_reason[16];      /* "max_tokens", "eos", "stop_string", "callback", ... */
} strata_stats;

/* Statistics of the session's last strata_generate call. */
STRATA_API strata_status strata_session_get_stats(const strata_session* session, strata_stats* out);

/* ---- Beam search ------------------------------------------------------------------- */

/* Step-wise beam search with a verifier over a prefix-tree KV cache that spans a fast tier
 * with a byte budget and a slow tier (a file on disk, or host RAM). Every step, n_beams beams
 * generate one step each (step_tokens tokens, or up to the token completing step_delimiter);
 * the scorer rates each step and a beam's score is the mean of its step scores; the best
 * n_beams / beam_width unfinished beams each fork beam_width children. A beam ends at EOS or
 * max_tokens; the search ends when none is left or after max_steps. With the same seed the
 * results do not depend on the budget or the schedule. */
typedef struct strata_beam_params {
  int32_t n_threads;          /* 0 = one per core */
  int32_t n_beams;            /* beams generating in every step; default 8, [1, 1024] */
  int32_t beam_width;         /* children per kept beam, dividing n_beams; default 2 */
  int32_t step_tokens;        /* tokens per step (the most, with a delimiter); default 32 */
  const char* step_delimiter; /* NULL or "": fixed-length steps; e.g. "\n\n" */
  int32_t max_tokens;         /* generated tokens per path at most; default 256 */
  int32_t max_steps;          /* 0 = until every path ended */
  float temperature;          /* 0 = greedy: child j starts its step with the j-th best token */
  int32_t top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  int ignore_eos;
  int chat;                   /* non-zero: the prompt is a user message (chat template) */
  uint64_t fast_budget_bytes; /* fast-tier KV bytes; 0 = all KV stays in memory */
  const char* slow_dir;       /* directory of the slow tier's file (NULL: $TMPDIR or /tmp) */
  int slow_in_ram;            /* non-zero: the slow tier is host RAM instead of a file */
  const char* schedule;       /* "balanced" (NULL, default), "prefix", "grouped", "tokenwise" */
  const char* scorer_model;   /* a GGUF path scoring steps (its log-likelihood of the step);
                                 NULL: the callback, else the generator's mean log-probability */
  float speculate;            /* > 0: a beam that ends its step before the others of its group
                                 goes on as its first child for up to this share of the mean
                                 step length, kept if it is selected; [0, 1], results are the
                                 same; not with "tokenwise". Default 0 (off) */
  float verifier_share;       /* with scorer_model and a fast_budget_bytes, the budget holds
                                 both models' KV, the one not running keeping the rest in the
                                 slow tier: < 0 (default) a cost model splits it before each
                                 phase; [0, 1] the scorer's fixed share (0.5: even) */
} strata_beam_params;

STRATA_API strata_beam_params strata_beam_default_params(void);

/* One beam's newest step, as the scorer sees it. Pointers are valid during the call only. */
typedef struct strata_beam_step {
  uint64_t beam_id;
  int32_t step; /* 0-based */
  const int32_t* path_tokens;
  size_t n_path_tokens; /* generated before this step */
  const int32_t* step_tokens;
  size_t n_step_tokens; /* this step's, an ending EOS included */
  const char* text;
  size_t text_len;    /* all text the beam generated, this step's last */
  float mean_logprob; /* the generator's mean log-probability of the step's tokens */
  int final_step;     /* non-zero: the beam ends with this step */
} strata_beam_step;

/* Writes the step's score (higher is better, finite) to *score and returns 0. Any other
 * return value stops the search: strata_beam_search fails with STRATA_ERR_ABORTED and a
 * message naming the beam, the step and the value, and releases everything it held. */
typedef int (*strata_beam_scorer)(const strata_beam_step* step, float* score, void* user_data);

typedef struct strata_beam_results strata_beam_results;

typedef struct strata_beam_result {
  uint64_t beam_id;
  const char* text; /* NUL-terminated; text_len bytes */
  size_t text_len;
  const int32_t* tokens;
  size_t n_tokens;
  double score; /* mean of the step scores */
  int32_t steps;
  const char* stop_reason; /* "eos", "max_tokens" or "step_limit" */
} strata_beam_result;

typedef struct strata_beam_stats {
  int32_t steps;
  int64_t rounds; /* groups run, summed over steps (one per step when everything fits) */
  int64_t generated_tokens;
  double seconds;              /* prompt prefill to the last score */
  uint64_t bytes_read;         /* slow tier -> fast tier */
  uint64_t bytes_written;      /* fast tier -> slow tier */
  uint64_t peak_shared_blocks; /* KV blocks used by more than one beam, at most */
  uint64_t peak_tree_bytes;    /* distinct KV bytes of the prefix tree at its largest */
  uint64_t fast_budget_bytes;
  uint64_t peak_fast_bytes; /* never above fast_budget_bytes */
  uint64_t blocks_prefetched;
  double stall_seconds;            /* waiting for the slow tier, not hidden by compute */
  int64_t finished_tokens;         /* tokens of the returned beams; per second: goodput */
  int64_t slot_passes;             /* a group's beams times its passes */
  int64_t idle_slot_passes;        /* of which the beam had ended its step */
  int64_t speculative_tokens;      /* generated ahead into a beam's next step */
  int64_t speculative_tokens_kept; /* of which a selected beam's first child kept */
  /* With a scorer model sharing the budget (otherwise 0): both models' fast-tier peak
   * together, the scorer's traffic with its slow tier, and the mean share of the budget the
   * generator had in its phases and the scorer in its. */
  uint64_t peak_fast_bytes_both;
  uint64_t verifier_bytes_read, verifier_bytes_written;
  double generator_phase_share, verifier_phase_share;
  /* Speculative tokens a scorer model ran in their parent's scoring pass, and tokens whose
   * scoring a child took over from there (every child whose step begins with them does). */
  int64_t verifier_ahead_tokens, verifier_ahead_reused;
} strata_beam_stats;

/* Runs a beam search from `prompt` (NUL-terminated UTF-8). `scorer` may be NULL (then
 * params->scorer_model, else the built-in mean log-probability). On success *out holds the
 * finished beams, best first, to be released with strata_beam_results_free. */
STRATA_API strata_status strata_beam_search(const strata_model* model, const char* prompt,
                                            const strata_beam_params* params,
                                            strata_beam_scorer scorer, void* user_data,
                                            strata_beam_results** out);
/* 0 when results is NULL. */
STRATA_API size_t strata_beam_results_count(const strata_beam_results* results);
/* The i-th best beam, or NULL when i >= count (or results is NULL). Valid until
 * strata_beam_results_free. */
STRATA_API const strata_beam_result* strata_beam_results_get(const strata_beam_results* results,
                                                             size_t i);
STRATA_API strata_status strata_beam_results_get_stats(const strata_beam_results* results,
                                                       strata_beam_stats* out);
STRATA_API void strata_beam_results_free(strata_beam_results* results);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_H_ */
