// strata run: generate from a prompt, or chat, with the KV policy the config names.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/cli.h"
#include "cli/cmd_run_beams.h"
#include "common/file.h"
#include "runtime/engine/session.h"
#include "runtime/kv/disk/disk_kv.h"

namespace strata::cli {
namespace {

struct RunFlags {
  CommonFlags common;
  std::string prompt, prompt_file, system;
  bool chat = false;
  bool stats = false;
  int32_t parallel = 1;
  GenerateParams gen;
  std::vector<std::string> stop;
  BeamFlags beams;
  CLI::Option *prompt_opt, *file_opt, *n_opt, *temp_opt, *top_k_opt, *top_p_opt, *min_p_opt,
      *rp_opt, *seed_opt, *stop_opt, *ignore_eos_opt;
};

void ApplyGenerateFlags(const RunFlags& f, GenerateParams* g) {
  if (f.n_opt->count()) g->max_tokens = f.gen.max_tokens;
  if (f.temp_opt->count()) g->sampling.temperature = f.gen.sampling.temperature;
  if (f.top_k_opt->count()) g->sampling.top_k = f.gen.sampling.top_k;
  if (f.top_p_opt->count()) g->sampling.top_p = f.gen.sampling.top_p;
  if (f.min_p_opt->count()) g->sampling.min_p = f.gen.sampling.min_p;
  if (f.rp_opt->count()) g->sampling.repeat_penalty = f.gen.sampling.repeat_penalty;
  if (f.seed_opt->count()) g->sampling.seed = f.gen.sampling.seed;
  if (f.stop_opt->count()) g->stop = f.stop;
  if (f.ignore_eos_opt->count()) g->ignore_eos = true;
}

bool PrintPiece(int32_t, std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return true;
}

void PrintStats(const RunFlags& f, const Config& cfg, const GenerationStats& s, const Engine& e) {
  if (!f.stats) return;
  nlohmann::json j = StatsJson(s);
  if (!cfg.tuned_choice.empty()) j["tuned"] = cfg.tuned_choice;
  j["threads"] = e.options().n_threads;
  j["context"] = e.options().n_ctx;
  j["kv_policy"] = KvPolicyKindName(e.options().kv.policy);
  if (const auto* disk = dynamic_cast<const DiskKv*>(&e.kv()))
    j["kv_plan"] = disk->plan().Describe();
  std::fprintf(stderr, "%s\n", j.dump(2).c_str());
}

// A limit error on a prompt source says where the limit comes from.
Status ExplainLimit(Status s, uint64_t limit, int32_t n_ctx) {
  if (s.code() != Status::Code::kResourceExhausted) return s;
  return Status::ResourceExhausted(s.message() + " (a context of " + std::to_string(n_ctx) +
                                   " tokens holds at most " + std::to_string(limit) +
                                   " bytes of text; --ctx sets the context)");
}

Status CheckTextLimit(const char* what, const std::string& text, uint64_t limit, int32_t n_ctx) {
  if (text.size() <= limit) return Status::OK();
  return ExplainLimit(
      Status::ResourceExhausted(std::string(what) + " holds " + std::to_string(text.size()) +
                                " bytes; the limit is " + std::to_string(limit) + " bytes"),
      limit, n_ctx);
}

Status Run(RunFlags& f) {
  Config cfg;
  STRATA_RETURN_IF_ERROR(ResolveConfig(f.common, &cfg, std::max(1, f.parallel)));
  ApplyGenerateFlags(f, &cfg.generate);
  if (f.parallel < 1 || f.parallel > 4096)
    return Status::InvalidArgument("--parallel: " + std::to_string(f.parallel) +
                                   " is out of range [1, 4096]");
  if (f.parallel > 1 && f.chat)
    return Status::InvalidArgument("--parallel cannot be combined with --chat");
  if (f.prompt_opt->count() && f.file_opt->count())
    return Status::InvalidArgument("-p and -f are alternatives: give the prompt one way");
  cfg.engine.max_sequences = std::max(cfg.engine.max_sequences, f.parallel);

  std::string path;
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadConfiguredModel(f.common, cfg, &path, &model));

  // Every prompt source is bounded by what the context can hold.
  const int32_t n_ctx = ContextOf(cfg, *model);
  const uint64_t limit = TextByteLimit(*model, n_ctx);
  STRATA_RETURN_IF_ERROR(CheckTextLimit("-p", f.prompt, limit, n_ctx));
  STRATA_RETURN_IF_ERROR(CheckTextLimit("--system", f.system, limit, n_ctx));
  std::string prompt = f.prompt;
  if (f.file_opt->count())
    STRATA_RETURN_IF_ERROR(
        ExplainLimit(ReadTextFile(f.prompt_file, "prompt file", limit, &prompt), limit, n_ctx));
  const bool interactive = f.chat && prompt.empty() && isatty(STDIN_FILENO);
  if (prompt.empty() && !interactive) {
    if (f.file_opt->count())
      return Status::InvalidArgument("prompt file " + f.prompt_file + " is empty");
    if (isatty(STDIN_FILENO))
      return Status::InvalidArgument("no prompt: give -p TEXT, -f FILE, or pipe text to stdin");
    STRATA_RETURN_IF_ERROR(
        ExplainLimit(ReadTextStream(STDIN_FILENO, "stdin", limit, &prompt), limit, n_ctx));
    if (prompt.empty()) return Status::InvalidArgument("no prompt: stdin was empty");
  }

  if (BeamSearchRequested(f.beams)) {
    // Beam search keeps its KV in its own prefix tree (with --beam-slow-dir for a disk tier).
    if (cfg.engine.kv.policy == KvPolicyKind::kDisk)
      return Status::InvalidArgument(
          "--beams keeps KV in its own prefix tree; kv.policy disk does not apply to it (use "
          "--beam-slow-dir for a slow tier on disk)");
    return RunBeamSearchCommand(f.beams, cfg, *model, prompt, f.chat, f.stats);
  }
  std::unique_ptr<Engine> engine;
  STRATA_RETURN_IF_ERROR(Engine::Create(*model, cfg.engine, &engine));

  if (f.parallel > 1) {
    std::vector<GenerationRequest> reqs(f.parallel);
    for (int32_t i = 0; i < f.parallel; ++i) {
      STRATA_RETURN_IF_ERROR(model->tokenizer().Encode(prompt, true, true, &reqs[i].prompt));
      STRATA_RETURN_IF_ERROR(engine->NewSequence(&reqs[i].seq));
      reqs[i].params = cfg.generate;
      reqs[i].params.sampling.seed += uint64_t(i);  // distinct continuations
    }
    GenerationStats st;
    STRATA_RETURN_IF_ERROR(engine->Generate(reqs, &st));
    for (int32_t i = 0; i < f.parallel; ++i)
      std::printf("--- sequence %d (%s) ---\n%s%s\n", i, StopReasonName(reqs[i].stop_reason),
                  prompt.c_str(), reqs[i].text.c_str());
    PrintStats(f, cfg, st, *engine);
    return Status::OK();
  }

  std::unique_ptr<Session> session;
  STRATA_RETURN_IF_ERROR(Session::Create(engine.get(), &session));
  if (!f.system.empty()) session->SetSystemPrompt(f.system);
  GenerationStats st;
  if (!f.chat) {
    // The prompt is echoed once generation has started, so a prompt that fails (too long,
    // invalid UTF-8) is not printed back before its error.
    bool echoed = false;
    auto echo_then_print = [&](int32_t token, std::string_view text) {
      if (!echoed) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      echoed = true;
      return PrintPiece(token, text);
    };
    STRATA_RETURN_IF_ERROR(session->Generate(prompt, cfg.generate, echo_then_print, nullptr, &st));
    if (!echoed) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::printf("\n");
    PrintStats(f, cfg, st, *engine);
    return Status::OK();
  }
  if (!interactive) {
    STRATA_RETURN_IF_ERROR(session->Chat(prompt, cfg.generate, PrintPiece, nullptr, &st));
    std::printf("\n");
    PrintStats(f, cfg, st, *engine);
    return Status::OK();
  }
  std::fprintf(stderr, "chat with %s (%s template); an empty line or Ctrl-D ends\n", path.c_str(),
               ChatTemplateName(model->chat_template()));
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    bool too_long = false;
    if (!ReadLineBounded(std::cin, limit, &line, &too_long) || (line.empty() && !too_long)) break;
    if (too_long) {
      std::fprintf(stderr,
                   "strata run: the line holds more than %llu bytes, the most a context "
                   "of %d tokens holds; it was not sent\n",
                   static_cast<unsigned long long>(limit), n_ctx);
      continue;
    }
    // A line the model cannot take (invalid UTF-8, too long for the context) is reported
    // and the conversation goes on; only a failure of the run itself ends it.
    const Status s = session->Chat(line, cfg.generate, PrintPiece, nullptr, &st);
    if (s.code() == Status::Code::kInvalidArgument || s.code() == Status::Code::kOutOfRange) {
      std::fprintf(stderr, "strata run: %s\n", s.message().c_str());
      continue;
    }
    STRATA_RETURN_IF_ERROR(s);
    std::printf("\n");
    PrintStats(f, cfg, st, *engine);
  }
  return Status::OK();
}

}  // namespace

void AddRunCommand(CLI::App* app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app->add_subcommand("run", "generate text from a prompt, or chat");
  AddCommonFlags(cmd, &f->common);
  FlagModes& modes = FlagModes::Of(cmd);
  const std::string gen = FlagModes::kGeneral, chat = "Chat (--chat)",
                    plain = "Generation (without --beams)";
  const RunFlags* rf = f.get();
  modes.Declare(chat, "with --chat (and without --beams)",
                [rf] { return rf->chat && !BeamSearchRequested(rf->beams); });
  modes.Declare(plain, "without --beams", [rf] { return !BeamSearchRequested(rf->beams); });
  f->prompt_opt = modes.Put(
      gen, cmd->add_option("-p,--prompt", f->prompt, "prompt text (else -f, else stdin)"));
  f->file_opt =
      modes.Put(gen, cmd->add_option("-f,--file", f->prompt_file,
                                     "read the prompt from a file, a named pipe or a terminal"));
  modes.Put(gen, cmd->add_flag("--chat", f->chat,
                               "use the model's chat template; interactive without -p"));
  modes.Put(chat, cmd->add_option("--system", f->system, "system prompt for --chat"));
  f->n_opt =
      modes.Put(gen, cmd->add_option("-n,--max-tokens", f->gen.max_tokens, "new tokens at most"));
  f->temp_opt = modes.Put(
      gen, cmd->add_option("--temp", f->gen.sampling.temperature, "temperature, 0 = greedy"));
  f->top_k_opt =
      modes.Put(gen, cmd->add_option("--top-k", f->gen.sampling.top_k, "top-k, 0 = off"));
  f->top_p_opt =
      modes.Put(gen, cmd->add_option("--top-p", f->gen.sampling.top_p, "top-p, 1 = off"));
  f->min_p_opt =
      modes.Put(gen, cmd->add_option("--min-p", f->gen.sampling.min_p, "min-p, 0 = off"));
  f->rp_opt = modes.Put(
      gen, cmd->add_option("--repeat-penalty", f->gen.sampling.repeat_penalty, "1 = off"));
  f->seed_opt = modes.Put(gen, cmd->add_option("--seed", f->gen.sampling.seed, "random seed"));
  f->stop_opt = modes.Put(plain, cmd->add_option("--stop", f->stop, "stop string (repeatable)"));
  f->ignore_eos_opt = modes.Put(gen, cmd->add_flag("--ignore-eos", f->gen.ignore_eos,
                                                   "do not stop at end-of-generation tokens"));
  modes.Put(plain, cmd->add_option("--parallel", f->parallel,
                                   "decode N copies of the prompt as one batch"));
  modes.Put(gen, cmd->add_flag("--stats", f->stats, "print statistics as JSON on stderr"));
  AddBeamFlags(cmd, &f->beams, &f->common);
  cmd->callback([f] {
    Status s = Run(*f);
    if (!s.ok()) ExitCode() = ReportError("run", s);
  });
}

}  // namespace strata::cli
