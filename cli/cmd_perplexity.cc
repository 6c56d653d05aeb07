// strata perplexity: perplexity of a text file over fixed windows.
//
// The first `tokens` tokens of the file are cut into windows of `window` tokens; each
// window is evaluated from an empty context and every token after the window's first is
// scored (its negative log-likelihood given the tokens before it in the window).
// tests/golden/make_generation_golden.py computes the same quantity with llama.cpp.
// --score-from N scores only the tokens after position N of each window, so that every
// scored token has at least N tokens of context: llama.cpp's llama-perplexity -c W scores
// the second half of each window, which is --window W --score-from W/2 here.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "common/file.h"

namespace strata::cli {
namespace {

struct PplFlags {
  CommonFlags common;
  std::string file;
  int64_t tokens = 32768;
  int32_t window = 1024;
  int32_t score_from = 0;
  bool json = false;
};

// A text cut at a byte count may end inside a UTF-8 sequence: that tail is dropped.
void DropPartialUtf8(std::string* s) {
  size_t i = s->size(), cont = 0;
  while (i > 0 && cont < 3 && (uint8_t((*s)[i - 1]) & 0xC0) == 0x80) --i, ++cont;
  if (i == 0) return;
  const uint8_t lead = uint8_t((*s)[i - 1]);
  const size_t len = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (len > cont + 1) s->resize(i - 1);
}

Status Perplexity(const PplFlags& f) {
  Config cfg;
  STRATA_RETURN_IF_ERROR(ResolveConfig(f.common, &cfg));
  if (f.window < 2) return Status::InvalidArgument("--window: must be at least 2");
  if (f.score_from < 0 || f.score_from > f.window - 2)
    return Status::InvalidArgument("--score-from: " + std::to_string(f.score_from) +
                                   " is outside 0.." + std::to_string(f.window - 2));
  if (f.tokens < f.window)
    return Status::InvalidArgument("--tokens: " + std::to_string(f.tokens) +
                                   " is less than one window of " + std::to_string(f.window));
  std::string path;
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadConfiguredModel(f.common, cfg, &path, &model));
  // Only the first --tokens tokens are scored: a longer file is read up to what they can hold.
  std::string text;
  const uint64_t limit = TextByteLimit(*model, f.tokens);
  bool more = false;
  STRATA_RETURN_IF_ERROR(ReadTextFile(f.file, "text file", limit, &text, &more));
  if (more) DropPartialUtf8(&text);
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(model->tokenizer().Encode(text, false, false, &ids));
  const int64_t n_windows = std::min<int64_t>(f.tokens, int64_t(ids.size())) / f.window;
  if (n_windows == 0)
    return Status::InvalidArgument(f.file + " has " + std::to_string(ids.size()) +
                                   " tokens, fewer than one window of " + std::to_string(f.window));
  cfg.engine.n_ctx = std::max(cfg.engine.n_ctx, f.window);
  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(*model, cfg.engine, &engine));
  const int32_t n_vocab = model->hparams().n_vocab;
  const int32_t step = std::min(engine->options().n_batch, f.window);
  const int32_t per_window = f.window - 1 - f.score_from;  // tokens scored per window

  double nll_total = 0;
  int64_t scored = 0;
  nlohmann::json windows = nlohmann::json::array();
  std::vector<float> logits;
  ForwardBatch batch;
  for (int64_t w = 0; w < n_windows; ++w) {
    const int32_t* tok = ids.data() + w * f.window;
    SeqId seq;
    STRATA_RETURN_IF_ERROR(engine->NewSequence(&seq));
    double nll = 0;
    for (int32_t i = 0; i < f.window; i += step) {
      const int32_t n = std::min(step, f.window - i);
      batch.Clear();
      batch.Add(seq, i, {tok + i, size_t(n)}, /*all_logits=*/true);
      STRATA_RETURN_IF_ERROR(engine->Evaluate(batch, &logits));
      for (int32_t j = 0; j < n && i + j + 1 < f.window; ++j) {
        if (i + j < f.score_from) continue;
        const float* row = logits.data() + size_t(j) * n_vocab;
        float mx = row[0];
        for (int32_t v = 1; v < n_vocab; ++v) mx = std::max(mx, row[v]);
        double sum = 0;
        for (int32_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v] - mx));
        nll += -(double(row[tok[i + j + 1]] - mx) - std::log(sum));
      }
    }
    STRATA_RETURN_IF_ERROR(engine->RemoveSequence(seq));
    nll_total += nll;
    scored += per_window;
    windows.push_back(std::exp(nll / per_window));
    if (!f.json)
      std::fprintf(stderr, "window %lld/%lld: ppl %.4f (running %.4f)\n", (long long)(w + 1),
                   (long long)n_windows, std::exp(nll / per_window),
                   std::exp(nll_total / double(scored)));
  }
  const double ppl = std::exp(nll_total / double(scored));
  if (f.json) {
    nlohmann::json j{{"file", f.file},       {"tokens", n_windows * f.window},
                     {"window", f.window},   {"score_from", f.score_from},
                     {"windows", n_windows}, {"scored", scored},
                     {"perplexity", ppl},    {"window_perplexity", windows}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("perplexity %.4f over %lld windows of %d tokens (%lld tokens scored)\n", ppl,
                (long long)n_windows, f.window, (long long)scored);
  }
  return Status::OK();
}

}  // namespace

void AddPerplexityCommand(CLI::App* app) {
  auto f = std::make_shared<PplFlags>();
  CLI::App* cmd = app->add_subcommand("perplexity", "perplexity of a text over fixed windows");
  FlagModes& modes = FlagModes::Of(cmd);
  AddCommonFlags(cmd, &f->common);
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("-f,--file", f->file, "UTF-8 text file")->required());
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--tokens", f->tokens, "use the first N tokens of the file"));
  modes.Put(FlagModes::kGeneral, cmd->add_option("--window", f->window, "tokens per window"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option(
                "--score-from", f->score_from,
                "score only tokens after this position of each window (llama-perplexity -c W: "
                "W/2)"));
  modes.Put(FlagModes::kGeneral, cmd->add_flag("--json", f->json, "print JSON"));
  cmd->callback([f] {
    Status s = Perplexity(*f);
    if (!s.ok()) ExitCode() = ReportError("perplexity", s);
  });
}

}  // namespace strata::cli
