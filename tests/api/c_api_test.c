/* A C99 program that links libstrata through strata.h only: loads the real model,
 * tokenizes, generates (single and batched), reads statistics and checks that errors
 * come back as status codes with messages. Exits non-zero on the first failure. */
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

struct collected {
  char text[4096];
  size_t len;
  int calls;
};

static int collect(int32_t token, const char* text, size_t len, void* user) {
  struct collected* c = (struct collected*)user;
  (void)token;
  if (c->len + len < sizeof(c->text)) {
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = '\0';
  }
  c->calls++;
  return 0;
}

/* The argument rules of strata.h: `st` is STRATA_ERR_INVALID_ARGUMENT and the message is
 * "<fn>: ..." holding `what` (the argument and its count). */
static void expect_refused(int line, strata_status st, const char* fn, const char* what) {
  const char* msg = strata_last_error();
  const size_t n = strlen(fn);
  if (st != STRATA_ERR_INVALID_ARGUMENT || strncmp(msg, fn, n) != 0 || msg[n] != ':' ||
      strstr(msg, what) == NULL) {
    fprintf(stderr, "%s:%d: expected %s to refuse with \"%s\"; got %s: \"%s\"\n", __FILE__, line,
            fn, what, strata_status_name(st), msg);
    failures++;
  }
}
#define EXPECT_REFUSED(call, fn, what) expect_refused(__LINE__, (call), fn, what)

static int stop_after_three(int32_t token, const char* text, size_t len, void* user) {
  int* n = (int*)user;
  (void)token;
  (void)text;
  (void)len;
  return ++*n >= 3;
}

int main(int argc, char** argv) {
  char default_path[1024];
  const char* path = argc > 1 ? argv[1] : getenv("STRATA_TEST_MODEL");
  strata_model* model = NULL;
  strata_engine* engine = NULL;
  strata_session* session = NULL;
  strata_model_info info;
  int32_t tokens[64];
  size_t n_tokens = 0, text_len = 0;
  char buf[256];
  char* text = NULL;
  struct collected col;
  strata_stats stats;
  strata_engine_params ep;
  strata_generate_params gp;
  int stops = 0;

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
  printf("strata %s\n", strata_version());

  /* Errors are status codes with a message naming the problem. */
  CHECK(strata_model_load("/nonexistent/model.gguf", &model) != STRATA_OK);
  CHECK(model == NULL);
  CHECK(strstr(strata_last_error(), "/nonexistent/model.gguf") != NULL);
  CHECK(strcmp(strata_status_name(STRATA_ERR_NOT_FOUND), "not found") == 0);

  CHECK(strata_model_load(path, &model) == STRATA_OK);
  if (!model) return 1;
  CHECK(strata_model_get_info(model, &info) == STRATA_OK);
  CHECK(strcmp(info.architecture, "llama") == 0);
  CHECK(info.n_layer == 30 && info.n_head == 9 && info.n_head_kv == 3 && info.head_dim == 64);
  CHECK(info.kv_bytes_per_token == 30u * 2 * 3 * 64 * 2);
  CHECK(strcmp(info.chat_template, "chatml") == 0);

  CHECK(strata_tokenize(model, "Hello world", 11, 0, 0, tokens, 64, &n_tokens) == STRATA_OK);
  CHECK(n_tokens >= 2 && n_tokens <= 4);
  CHECK(strata_detokenize(model, tokens, n_tokens, buf, sizeof(buf), &text_len) == STRATA_OK);
  CHECK(strcmp(buf, "Hello world") == 0 && text_len == 11);
  CHECK(strata_tokenize(model, "Hello world", 11, 0, 0, tokens, 1, &n_tokens) ==
        STRATA_ERR_OUT_OF_RANGE);
  CHECK(n_tokens >= 2);
  CHECK(strata_tokenize(model, "bad \xff byte", 10, 0, 0, tokens, 64, &n_tokens) ==
        STRATA_ERR_INVALID_ARGUMENT);

  ep = strata_engine_default_params();
  ep.kv_policy = "no-such-policy";
  CHECK(strata_engine_create(model, &ep, &engine) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(strata_last_error(), "no-such-policy") != NULL);
  ep = strata_engine_default_params();
  ep.n_threads = 2;
  ep.n_ctx = 512;
  ep.max_sequences = 3;
  CHECK(strata_engine_create(model, &ep, &engine) == STRATA_OK);
  if (!engine) return 1;
  CHECK(strata_session_create(engine, &session) == STRATA_OK);

  gp = strata_generate_default_params();
  gp.max_tokens = 16;
  gp.temperature = 0.0f;
  gp.ignore_eos = 1;
  memset(&col, 0, sizeof(col));
  CHECK(strata_generate(session, "The capital of France is", &gp, collect, &col, &text) ==
        STRATA_OK);
  CHECK(text != NULL);
  if (text) {
    printf("generated: %s\n", text);
    CHECK(strcmp(text, col.text) == 0);
    CHECK(strstr(text, "Paris") != NULL);
    strata_string_free(text);
  }
  CHECK(strata_session_get_stats(session, &stats) == STRATA_OK);
  CHECK(stats.generated_tokens == 16);
  CHECK(stats.prompt_tokens == 5);
  CHECK(stats.decode_tokens_per_second > 0);
  CHECK(strcmp(stats.stop_reason, "max_tokens") == 0);
  CHECK(stats.kv_resident_bytes > 0);

  /* The callback can stop generation. */
  CHECK(strata_session_reset(session) == STRATA_OK);
  CHECK(strata_generate(session, "Once upon a time", &gp, stop_after_three, &stops, NULL) ==
        STRATA_OK);
  CHECK(stops == 3);
  CHECK(strata_session_get_stats(session, &stats) == STRATA_OK);
  CHECK(strcmp(stats.stop_reason, "callback") == 0);

  /* Chat mode uses the model's template. The question asks for a short answer: the bare
     question's first greedy token is a near-tie between "The" and "L" on this model, which
     float rounding (another ISA, repacked weights) tips either way. */
  gp.chat = 1;
  gp.ignore_eos = 0;
  gp.max_tokens = 24;
  CHECK(strata_session_reset(session) == STRATA_OK);
  CHECK(strata_generate(session, "What is the capital of France? Answer in one word.", &gp, NULL,
                        NULL, &text) == STRATA_OK);
  if (text) {
    printf("chat answer: %s\n", text);
    CHECK(strstr(text, "Paris") != NULL);
    strata_string_free(text);
  }
  gp.chat = 0;

  /* Two prompts decoded as one batch give the same greedy text as one at a time. */
  {
    const char* prompts[2] = {"The capital of France is", "1, 2, 3, 4,"};
    char* texts[2] = {NULL, NULL};
    gp.max_tokens = 8;
    gp.ignore_eos = 1;
    CHECK(strata_generate_batch(engine, prompts, 2, &gp, NULL, NULL, texts) == STRATA_OK);
    CHECK(texts[0] && texts[1]);
    if (texts[0] && texts[1]) {
      printf("batch: [%s] [%s]\n", texts[0], texts[1]);
      CHECK(strstr(texts[0], "Paris") != NULL);
      CHECK(strstr(texts[1], "5") != NULL);
    }
    strata_string_free(texts[0]);
    strata_string_free(texts[1]);
  }

  /* The argument rules, function by function: every pointer/count pair with NULL and a
     count, and with a negative count (-1 as size_t); NULL inside arrays of strings; every
     required pointer NULL. Each is refused the same way and changes nothing. */
  {
    const char* two[2] = {"The capital of France is", "1, 2,"};
    const char* hole[2] = {"The capital of France is", NULL};
    const char* stops[3] = {"\n", NULL, "."};
    const size_t neg = (size_t)-1;
    char* untouched = buf;
    char* texts[2] = {buf, buf};
    strata_model* m = (strata_model*)buf;
    strata_engine* e = (strata_engine*)buf;
    strata_session* s = (strata_session*)buf;
    strata_beam_results* r = (strata_beam_results*)buf;
    strata_beam_params bp = strata_beam_default_params();
    strata_beam_stats bst;
    strata_generate_params bad = strata_generate_default_params();
    bad.max_tokens = 4;

    /* strata_tokenize: text/text_len, tokens/capacity. */
    EXPECT_REFUSED(strata_tokenize(model, NULL, 5, 0, 0, tokens, 64, &n_tokens), "strata_tokenize",
                   "text is NULL but text_len is 5");
    EXPECT_REFUSED(strata_tokenize(model, "Hello", neg, 0, 0, tokens, 64, &n_tokens),
                   "strata_tokenize", "text_len is negative (-1");
    EXPECT_REFUSED(strata_tokenize(model, "Hello", 5, 0, 0, NULL, 64, &n_tokens), "strata_tokenize",
                   "tokens is NULL but capacity is 64");
    EXPECT_REFUSED(strata_tokenize(model, "Hello", 5, 0, 0, tokens, neg, &n_tokens),
                   "strata_tokenize", "capacity is negative (-1");
    EXPECT_REFUSED(strata_tokenize(NULL, "Hello", 5, 0, 0, tokens, 64, &n_tokens),
                   "strata_tokenize", "model must not be NULL");
    EXPECT_REFUSED(strata_tokenize(model, "Hello", 5, 0, 0, tokens, 64, NULL), "strata_tokenize",
                   "n_tokens must not be NULL");
    /* NULL with a count of 0 is an empty array: a length query, not an argument error. */
    CHECK(strata_tokenize(model, "Hello", 5, 0, 0, NULL, 0, &n_tokens) == STRATA_ERR_OUT_OF_RANGE);
    CHECK(strata_tokenize(model, NULL, 0, 0, 0, tokens, 64, &n_tokens) == STRATA_OK);

    /* strata_detokenize: tokens/n_tokens, buf/capacity. */
    CHECK(strata_tokenize(model, "Hello world", 11, 0, 0, tokens, 64, &n_tokens) == STRATA_OK);
    EXPECT_REFUSED(strata_detokenize(model, NULL, 3, buf, sizeof(buf), &text_len),
                   "strata_detokenize", "tokens is NULL but n_tokens is 3");
    EXPECT_REFUSED(strata_detokenize(model, tokens, neg, buf, sizeof(buf), &text_len),
                   "strata_detokenize", "n_tokens is negative (-1");
    EXPECT_REFUSED(strata_detokenize(model, tokens, n_tokens, NULL, 16, &text_len),
                   "strata_detokenize", "buf is NULL but capacity is 16");
    EXPECT_REFUSED(strata_detokenize(model, tokens, n_tokens, buf, neg, &text_len),
                   "strata_detokenize", "capacity is negative (-1");
    EXPECT_REFUSED(strata_detokenize(NULL, tokens, n_tokens, buf, sizeof(buf), &text_len),
                   "strata_detokenize", "model must not be NULL");
    EXPECT_REFUSED(strata_detokenize(model, tokens, n_tokens, buf, sizeof(buf), NULL),
                   "strata_detokenize", "text_len must not be NULL");
    text_len = 0;
    CHECK(strata_detokenize(model, tokens, n_tokens, NULL, 0, &text_len) ==
          STRATA_ERR_OUT_OF_RANGE);
    CHECK(text_len == 11);

    /* strata_generate: params->stop/params->n_stop. */
    bad.stop = NULL;
    bad.n_stop = 3;
    EXPECT_REFUSED(strata_generate(session, "Hi", &bad, NULL, NULL, &untouched), "strata_generate",
                   "params->stop is NULL but params->n_stop is 3");
    CHECK(untouched == buf);
    bad.stop = stops;
    bad.n_stop = neg;
    EXPECT_REFUSED(strata_generate(session, "Hi", &bad, NULL, NULL, &untouched), "strata_generate",
                   "params->n_stop is negative (-1");
    bad.n_stop = 3;
    EXPECT_REFUSED(strata_generate(session, "Hi", &bad, NULL, NULL, &untouched), "strata_generate",
                   "params->stop[1] is NULL (params->n_stop is 3)");
    CHECK(untouched == buf);
    EXPECT_REFUSED(strata_generate(NULL, "Hi", &gp, NULL, NULL, NULL), "strata_generate",
                   "session must not be NULL");
    EXPECT_REFUSED(strata_generate(session, NULL, &gp, NULL, NULL, NULL), "strata_generate",
                   "prompt must not be NULL");

    /* strata_generate_batch: prompts/n_prompts, params->stop/params->n_stop. */
    EXPECT_REFUSED(strata_generate_batch(engine, NULL, 2, &gp, NULL, NULL, texts),
                   "strata_generate_batch", "prompts is NULL but n_prompts is 2");
    EXPECT_REFUSED(strata_generate_batch(engine, two, neg, &gp, NULL, NULL, texts),
                   "strata_generate_batch", "n_prompts is negative (-1");
    EXPECT_REFUSED(strata_generate_batch(engine, hole, 2, &gp, NULL, NULL, texts),
                   "strata_generate_batch", "prompts[1] is NULL (n_prompts is 2)");
    EXPECT_REFUSED(strata_generate_batch(engine, two, 0, &gp, NULL, NULL, texts),
                   "strata_generate_batch", "n_prompts is 0");
    bad.stop = NULL;
    EXPECT_REFUSED(strata_generate_batch(engine, two, 2, &bad, NULL, NULL, texts),
                   "strata_generate_batch", "params->stop is NULL but params->n_stop is 3");
    bad.stop = stops;
    bad.n_stop = neg;
    EXPECT_REFUSED(strata_generate_batch(engine, two, 2, &bad, NULL, NULL, texts),
                   "strata_generate_batch", "params->n_stop is negative (-1");
    bad.n_stop = 3;
    EXPECT_REFUSED(strata_generate_batch(engine, two, 2, &bad, NULL, NULL, texts),
                   "strata_generate_batch", "params->stop[1] is NULL (params->n_stop is 3)");
    CHECK(texts[0] == buf && texts[1] == buf);
    EXPECT_REFUSED(strata_generate_batch(NULL, two, 2, &gp, NULL, NULL, texts),
                   "strata_generate_batch", "engine must not be NULL");

    /* The required pointers of the other functions. */
    EXPECT_REFUSED(strata_model_load(NULL, &m), "strata_model_load", "path must not be NULL");
    EXPECT_REFUSED(strata_model_load(path, NULL), "strata_model_load", "out must not be NULL");
    CHECK(m == (strata_model*)buf);
    EXPECT_REFUSED(strata_model_get_info(NULL, &info), "strata_model_get_info",
                   "model must not be NULL");
    EXPECT_REFUSED(strata_model_get_info(model, NULL), "strata_model_get_info",
                   "out must not be NULL");
    EXPECT_REFUSED(strata_engine_create(NULL, &ep, &e), "strata_engine_create",
                   "model must not be NULL");
    EXPECT_REFUSED(strata_engine_create(model, &ep, NULL), "strata_engine_create",
                   "out must not be NULL");
    CHECK(e == (strata_engine*)buf);
    EXPECT_REFUSED(strata_session_create(NULL, &s), "strata_session_create",
                   "engine must not be NULL");
    EXPECT_REFUSED(strata_session_create(engine, NULL), "strata_session_create",
                   "out must not be NULL");
    CHECK(s == (strata_session*)buf);
    EXPECT_REFUSED(strata_session_reset(NULL), "strata_session_reset", "session must not be NULL");
    EXPECT_REFUSED(strata_session_get_stats(NULL, &stats), "strata_session_get_stats",
                   "session must not be NULL");
    EXPECT_REFUSED(strata_session_get_stats(session, NULL), "strata_session_get_stats",
                   "out must not be NULL");
    EXPECT_REFUSED(strata_beam_search(NULL, "Hi", &bp, NULL, NULL, &r), "strata_beam_search",
                   "model must not be NULL");
    EXPECT_REFUSED(strata_beam_search(model, NULL, &bp, NULL, NULL, &r), "strata_beam_search",
                   "prompt must not be NULL");
    EXPECT_REFUSED(strata_beam_search(model, "Hi", NULL, NULL, NULL, &r), "strata_beam_search",
                   "params must not be NULL");
    EXPECT_REFUSED(strata_beam_search(model, "Hi", &bp, NULL, NULL, NULL), "strata_beam_search",
                   "out must not be NULL");
    CHECK(r == (strata_beam_results*)buf);
    EXPECT_REFUSED(strata_beam_results_get_stats(NULL, &bst), "strata_beam_results_get_stats",
                   "results must not be NULL");
    CHECK(strata_beam_results_count(NULL) == 0);
    CHECK(strata_beam_results_get(NULL, 0) == NULL);
  }

  /* A prompt longer than the context is an error, not a crash. */
  {
    size_t n = 600 * 6;
    char* big = (char*)malloc(n + 1);
    size_t i;
    for (i = 0; i < n; ++i) big[i] = "hello "[i % 6];
    big[n] = '\0';
    CHECK(strata_generate(session, big, &gp, NULL, NULL, NULL) == STRATA_ERR_OUT_OF_RANGE);
    CHECK(strstr(strata_last_error(), "context") != NULL);
    free(big);
  }

  strata_session_free(session);
  strata_engine_free(engine);
  strata_model_free(model);
  strata_session_free(NULL);
  strata_engine_free(NULL);
  strata_model_free(NULL);
  if (failures)
    fprintf(stderr, "%d check(s) failed\n", failures);
  else
    printf("all C API checks passed\n");
  return failures ? 1 : 0;
}
