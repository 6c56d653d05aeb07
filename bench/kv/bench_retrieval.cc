// bench_retrieval: finding something far back in a long context, full KV against the disk
// policy at given budgets, on the same cases.
//
// Perplexity on running text is the easy case for a policy that selects a few groups a layer:
// the next token of prose depends mostly on recent tokens, which it always keeps. These cases
// ask for something stated once, far back, among text that does not help. Each is written
// from a haystack text (--text, any plain text; the cases are reproducible from it and
// --seed), in the manner of the RULER benchmark's synthetic tasks:
//   single      one "secret code" sentence at a depth; asked for its code
//   multikey    four codes for four names, one asked (the others distract)
//   multivalue  four codes for one name; asked for all of them
//   multiquery  four codes for four names; asked for two of them
//   vt          a chain of variable assignments spread over the context; asked which
//               variables hold the first value
//   cwe         a list of words, ten of them far more often than the rest; asked for the ten
// The prompt ends in the start of the answer, and a greedy continuation is scored by which of
// the expected strings appear in it (the share of them: 1 or 0 for single and multikey). The
// full-KV run prefills the prompt; its K/V are captured and replayed into each disk
// configuration (tuner/kv_replay.h), which then decodes the same way.
//
// Results go to a JSON-lines file as each (case, configuration) finishes; a rerun skips what
// is there. The table: accuracy per task and length, and per depth for the tasks with one
// asked needle, for full KV, each configuration, and the difference; then, per configuration
// and task, the share of (needle token span, layer) pairs that attention held at the first
// answer step (DiskKvHooks::on_decode_view): whether a miss is the selection's.
//
//   bench_retrieval --text book.txt --lengths 2048,4096,8192 --cases 20
//     --configs "budget_bytes=1/13;budget_bytes=1/34" --results retrieval.jsonl   (one line)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "bench/kv/kv_bench_util.h"
#include "common/file.h"
#include "runtime/engine/engine.h"
#include "tuner/kv_replay.h"

namespace strata::bench {
namespace {

struct Flags {
  std::string model, text, results = "bench_retrieval.jsonl", kv_dir = "/var/tmp";
  std::string configs = "budget_bytes=1/13;budget_bytes=1/34";
  std::vector<int32_t> lengths = {2048, 4096, 8192};
  std::vector<std::string> tasks = {"single", "multikey", "multivalue", "multiquery", "vt", "cwe"};
  int32_t cases = 20, threads = 2;
  uint64_t seed = 1;
  bool table_only = false;
};

// Depths of the asked needle for single and multikey, as shares of the haystack.
constexpr double kDepths[] = {0.05, 0.275, 0.5, 0.725, 0.95};
constexpr int32_t kDepthCount = int32_t(sizeof(kDepths) / sizeof(kDepths[0]));

struct Case {
  std::string id, task;
  int32_t length = 0;
  double depth = -1;  // of the asked needle, where there is one
  std::string prompt;
  std::vector<std::string> expected;
  int32_t answer_tokens = 16;
};

// The haystack: words of the text, the text's own line breaks kept.
struct Haystack {
  std::string text;
  std::vector<size_t> sentence_ends;  // byte offsets just after ". ", "! ", "? " or a newline
  std::vector<std::string> words;     // distinct lower-case words of 4+ letters, for cwe
};

Haystack MakeHaystack(std::string text) {
  Haystack h;
  h.text = std::move(text);
  for (size_t i = 0; i + 1 < h.text.size(); ++i) {
    const char c = h.text[i];
    if (c == '\n' || ((c == '.' || c == '!' || c == '?') && h.text[i + 1] == ' '))
      h.sentence_ends.push_back(i + 1);
  }
  std::set<std::string> seen;
  std::string w;
  for (char c : h.text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += char(std::tolower(static_cast<unsigned char>(c)));
    } else {
      if (w.size() >= 4 && seen.insert(w).second) h.words.push_back(w);
      w.clear();
    }
  }
  return h;
}

std::string Digits(std::mt19937_64& rng, int n) {
  std::string s(size_t(n), '0');
  s[0] = char('1' + rng() % 9);
  for (int i = 1; i < n; ++i) s[size_t(i)] = char('0' + rng() % 10);
  return s;
}

// A name no text will have by chance: two words of the haystack joined by a hyphen.
std::string Name(const Haystack& h, std::mt19937_64& rng) {
  return h.words[rng() % h.words.size()] + "-" + h.words[rng() % h.words.size()];
}

std::string Upper(std::mt19937_64& rng, int n) {
  std::string s(size_t(n), 'A');
  for (char& c : s) c = char('A' + rng() % 26);
  return s;
}

// `bytes` of the haystack from a random sentence start, with `inserts` (sentence, depth in
// [0, 1]) placed at the sentence boundary nearest their depth.
std::string Fill(const Haystack& h, std::mt19937_64& rng, size_t bytes,
                 std::vector<std::pair<std::string, double>> inserts) {
  size_t start = 0;
  if (!h.sentence_ends.empty() && h.text.size() > bytes)
    for (int tries = 0; tries < 64; ++tries) {
      start = h.sentence_ends[rng() % h.sentence_ends.size()];
      if (start + bytes <= h.text.size()) break;
      start = 0;
    }
  std::string body = h.text.substr(start, bytes);
  while (body.size() < bytes) body += "\n" + h.text.substr(0, bytes - body.size());
  // From the last insert back, so earlier offsets stay valid.
  std::sort(inserts.begin(), inserts.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [sentence, depth] : inserts) {
    size_t at = size_t(depth * double(body.size()));
    while (at > 0 && body[at - 1] != '\n' &&
           !(body[at - 1] == ' ' && at > 1 &&
             (body[at - 2] == '.' || body[at - 2] == '!' || body[at - 2] == '?')))
      --at;
    body.insert(at, sentence + (at > 0 && body[at - 1] == '\n' ? "\n" : " "));
  }
  return body;
}

constexpr const char* kIntro =
    "Below is a long text. Hidden in it are a few facts that matter; remember them, they are "
    "asked about at the end.\n\n";

std::string Code(const std::string& name, const std::string& value) {
  return "The secret code for " + name + " is " + value + ".";
}

// Writes case `index` of `task` at `length` tokens: the prompt is built around a haystack of
// a guessed size, measured with the tokenizer, and the guess corrected until it fits.
Status MakeCase(const Model& model, const Haystack& h, const std::string& task, int32_t length,
                int32_t index, uint64_t seed, Case* c) {
  c->task = task;
  c->length = length;
  c->id = task + "/" + std::to_string(length) + "/" + std::to_string(index);
  double bytes_per_token = 4.0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + std::hash<std::string>{}(c->id));
    std::vector<std::pair<std::string, double>> inserts;
    std::string question;
    c->expected.clear();
    c->depth = -1;
    c->answer_tokens = 16;
    const double depth = kDepths[index % kDepthCount];
    if (task == "single" || task == "multikey") {
      const std::string name = Name(h, rng), value = Digits(rng, 7);
      inserts.push_back({Code(name, value), depth});
      if (task == "multikey")
        for (int k = 0; k < 3; ++k)
          inserts.push_back({Code(Name(h, rng), Digits(rng, 7)), double(rng() % 1000) / 1000.0});
      c->depth = depth;
      c->expected = {value};
      question = "What is the secret code for " + name + "? The secret code for " + name + " is";
    } else if (task == "multivalue") {
      const std::string name = Name(h, rng);
      for (int k = 0; k < 4; ++k) {
        const std::string value = Digits(rng, 7);
        inserts.push_back({Code(name, value), (k + 0.5) / 4});
        c->expected.push_back(value);
      }
      c->answer_tokens = 48;
      question =
          "What are all the secret codes for " + name + "? The secret codes for " + name + " are";
    } else if (task == "multiquery") {
      std::vector<std::string> names;
      for (int k = 0; k < 4; ++k) {
        names.push_back(Name(h, rng));
        const std::string value = Digits(rng, 7);
        inserts.push_back({Code(names.back(), value), (k + 0.5) / 4});
        if (k < 2) c->expected.push_back(value);
      }
      c->answer_tokens = 40;
      question = "What are the secret codes for " + names[0] + " and for " + names[1] +
                 "? The secret code for " + names[0] + " is";
    } else if (task == "vt") {
      const std::string value = Digits(rng, 5);
      std::string prev = Upper(rng, 5);
      inserts.push_back({"VAR " + prev + " = " + value + ".", 0.1});
      c->expected.push_back(prev);
      for (int k = 1; k < 4; ++k) {
        const std::string next = Upper(rng, 5);
        inserts.push_back({"VAR " + next + " = VAR " + prev + ".", 0.1 + 0.25 * k});
        c->expected.push_back(next);
        prev = next;
      }
      c->answer_tokens = 40;
      question = "Which variables are assigned the value " + value +
                 ", directly or through other variables? Answer: the variables that hold " + value +
                 " are";
    } else if (task == "cwe") {
      // Not a haystack: the list is the context. Ten words thirty times each, the rest three.
      std::vector<std::string> words = h.words;
      std::shuffle(words.begin(), words.end(), rng);
      if (words.size() < 20)
        return Status::InvalidArgument("the text has too few distinct words for cwe");
      std::vector<std::string> list;
      const size_t target_words = size_t(double(length) * 0.8 / 2.5);
      for (size_t k = 0; k < 10; ++k) list.insert(list.end(), 30, words[k]);
      for (size_t k = 10; list.size() < target_words && k < words.size(); ++k)
        list.insert(list.end(), 3, words[k]);
      std::shuffle(list.begin(), list.end(), rng);
      std::string body;
      for (size_t k = 0; k < list.size(); ++k)
        body += std::to_string(k + 1) + ". " + list[k] + "\n";
      c->expected.assign(words.begin(), words.begin() + 10);
      c->answer_tokens = 40;
      c->prompt =
          "Below is a numbered list of words. Some of them occur far more often than the "
          "others.\n\n" +
          body +
          "\nWhat are the ten words that occur most often in the list above? Answer: the "
          "ten most common words are";
    } else {
      return Status::InvalidArgument("unknown task '" + task +
                                     "' (single, multikey, multivalue, multiquery, vt, cwe)");
    }
    if (task != "cwe") {
      const size_t room =
          size_t(std::max(256.0, (length - 96 - c->answer_tokens) * bytes_per_token));
      c->prompt = kIntro + Fill(h, rng, room, inserts) + "\n\n" + question;
    }
    std::vector<int32_t> ids;
    STRATA_RETURN_IF_ERROR(model.tokenizer().Encode(c->prompt, true, false, &ids));
    const int32_t limit = length - c->answer_tokens;
    if (int32_t(ids.size()) <= limit && int32_t(ids.size()) > limit - 256) return Status::OK();
    if (task == "cwe") return Status::OK();  // the list's length is set by words, not bytes
    bytes_per_token = bytes_per_token * double(limit - 128) / double(ids.size());
  }
  return Status::Internal(c->id + ": no haystack size fits " + std::to_string(length) + " tokens");
}

// Token indices of `ids` that hold the first occurrence in the prompt of each expected string
// (the needles' values, the chain's names); none for cwe, whose words are everywhere.
std::vector<std::pair<int32_t, int32_t>> NeedleTokens(const Model& model, const Case& c,
                                                      const std::vector<int32_t>& ids) {
  std::vector<std::pair<int32_t, int32_t>> out;
  if (c.task == "cwe") return out;
  std::vector<size_t> end(ids.size());  // byte offset after each token
  size_t at = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    at += model.tokenizer().TokenBytes(ids[i]).size();
    end[i] = at;
  }
  for (const std::string& e : c.expected) {
    const size_t off = c.prompt.find(e);
    if (off == std::string::npos) continue;
    const auto first = std::upper_bound(end.begin(), end.end(), off) - end.begin();
    const auto last = std::lower_bound(end.begin(), end.end(), off + e.size()) - end.begin();
    out.push_back({int32_t(first), int32_t(std::min<ptrdiff_t>(last, ptrdiff_t(ids.size()) - 1))});
  }
  return out;
}

double Score(const Case& c, const std::string& answer, int32_t* found) {
  *found = 0;
  for (const std::string& e : c.expected) *found += answer.find(e) != std::string::npos;
  return double(*found) / double(c.expected.size());
}

// Greedy continuation of `seq`, whose KV holds all but the last prompt token.
// *first_step (when given) is true during the first pass only: the one that reads the
// question's last token and picks the answer's first.
Status Continue(Engine& e, SeqId seq, const std::vector<int32_t>& ids, int32_t n, std::string* out,
                bool* first_step = nullptr) {
  const Tokenizer& tok = e.model().tokenizer();
  const int32_t n_vocab = e.model().hparams().n_vocab;
  std::vector<int32_t> generated;
  int32_t next = ids.back();
  int32_t pos = int32_t(ids.size()) - 1;
  std::vector<float> logits;
  ForwardBatch b;
  for (int32_t i = 0; i < n; ++i) {
    b.Clear();
    b.Add(seq, pos++, std::span<const int32_t>(&next, 1));
    if (first_step) *first_step = i == 0;
    STRATA_RETURN_IF_ERROR(e.Evaluate(b, &logits));
    if (first_step) *first_step = false;
    next = int32_t(std::max_element(logits.begin(), logits.begin() + n_vocab) - logits.begin());
    if (tok.IsEndOfGeneration(next)) break;
    generated.push_back(next);
  }
  *out = tok.Decode(generated);
  return Status::OK();
}

std::string Bucket(double depth) {
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", depth * 100);
  return b;
}

void PrintTable(const Flags& f, const std::vector<std::string>& configs,
                const std::map<std::pair<std::string, std::string>, nlohmann::json>& done) {
  // (config, row key) -> score sum, count; rows: task/length and task/depth.
  std::map<std::pair<std::string, std::string>, std::pair<double, int>> acc;
  std::vector<std::string> rows;
  auto add_row = [&](const std::string& r) {
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
  };
  for (const std::string& task : f.tasks)
    for (int32_t len : f.lengths) add_row(task + " @" + std::to_string(len));
  for (const std::string& task : {std::string("single"), std::string("multikey")})
    if (std::find(f.tasks.begin(), f.tasks.end(), task) != f.tasks.end())
      for (double d : kDepths) add_row(task + " depth " + Bucket(d));
  for (const auto& [key, j] : done) {
    if (!j.contains("score")) continue;
    const auto full = done.find({key.first, "full"});
    if (full == done.end()) continue;  // compared on cases both ran
    const std::string task = j["task"], cfg = key.second;
    const double s = j["score"].get<double>();
    const std::string by_len = task + " @" + std::to_string(j["length"].get<int>());
    acc[{cfg, by_len}].first += s;
    acc[{cfg, by_len}].second += 1;
    if (j["depth"].get<double>() >= 0) {
      const std::string by_depth = task + " depth " + Bucket(j["depth"].get<double>());
      acc[{cfg, by_depth}].first += s;
      acc[{cfg, by_depth}].second += 1;
    }
  }
  std::printf("\n%-24s %6s %7s", "task", "cases", "full");
  for (const std::string& c : configs) std::printf("  %22s %7s", c.c_str(), "diff");
  std::printf("\n");
  for (const std::string& r : rows) {
    const auto full = acc.find({"full", r});
    if (full == acc.end()) continue;
    const double fa = 100 * full->second.first / full->second.second;
    std::printf("%-24s %6d %6.1f%%", r.c_str(), full->second.second, fa);
    for (const std::string& c : configs) {
      const auto it = acc.find({c, r});
      if (it == acc.end()) {
        std::printf("  %22s %7s", "-", "-");
        continue;
      }
      const double a = 100 * it->second.first / it->second.second;
      std::printf("  %21.1f%% %+6.1f", a, a - fa);
    }
    std::printf("\n");
  }
  // What attention held of the needles at the first answer step, per configuration and task.
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> held;
  for (const auto& [key, j] : done)
    if (j.contains("needle_layers") && j["needle_layers"].get<int>() > 0) {
      auto& h = held[{key.second, j["task"].get<std::string>()}];
      h.first += j["needle_layers_attended"].get<double>();
      h.second += j["needle_layers"].get<double>();
    }
  if (held.empty()) return;
  std::printf("\nneedle tokens in attention at the first answer step, share of (needle, layer):\n");
  for (const std::string& c : configs)
    for (const std::string& task : f.tasks)
      if (const auto it = held.find({c, task}); it != held.end())
        std::printf("  %-24s %-12s %6.1f%%\n", c.c_str(), task.c_str(),
                    100 * it->second.first / it->second.second);
}

Status Main(Flags& f, const std::string& command) {
  if (f.text.empty())
    return Status::InvalidArgument(
        "--text FILE is required: the haystack the cases are written "
        "from (any plain text)");
  if (f.model.empty()) {
    const char* home = std::getenv("HOME");
    f.model = std::string(home ? home : ".") + "/.cache/strata/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(Model::Load(f.model, &model));
  std::vector<std::string> configs;
  {
    std::stringstream ss(f.configs);
    std::string spec;
    while (std::getline(ss, spec, ';'))
      if (!spec.empty()) configs.push_back(spec);
  }
  std::map<std::pair<std::string, std::string>, nlohmann::json> done;
  {
    std::ifstream in(f.results);
    std::string line;
    while (std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("case") || !j.contains("config")) continue;
      done[{j["case"].get<std::string>(), j["config"].get<std::string>()}] = j;
    }
  }
  std::printf("%s\nmodel %s (%s), haystack %s, %d cases per task and length, seed %llu\n",
              command.c_str(), f.model.c_str(), model->identity_hex().c_str(), f.text.c_str(),
              f.cases, static_cast<unsigned long long>(f.seed));
  if (f.table_only) {
    PrintTable(f, configs, done);
    return Status::OK();
  }
  std::string text;
  STRATA_RETURN_IF_ERROR(ReadRegularFile(f.text, "haystack text", kMaxTextBytes, &text));
  const Haystack h = MakeHaystack(std::move(text));
  if (h.words.size() < 20 || h.sentence_ends.empty())
    return Status::InvalidArgument(f.text + " is too short or has no sentences to hide facts in");
  std::ofstream out(f.results, std::ios::app);
  DiskKvOptions base;
  base.dir = f.kv_dir;
  for (int32_t length : f.lengths) {
    const int64_t full_cache = int64_t(FullKvBytes(model->hparams(), length));
    for (const std::string& task : f.tasks) {
      for (int32_t i = 0; i < f.cases; ++i) {
        Case c;
        STRATA_RETURN_IF_ERROR(MakeCase(*model, h, task, length, i, f.seed, &c));
        bool need = !done.count({c.id, "full"});
        for (const std::string& cfg : configs) need |= !done.count({c.id, cfg});
        if (!need) continue;
        std::vector<int32_t> ids;
        STRATA_RETURN_IF_ERROR(model->tokenizer().Encode(c.prompt, true, false, &ids));
        const int32_t n_ctx = int32_t(ids.size()) + c.answer_tokens;
        KvCapture cap;
        std::unique_ptr<Engine> full;
        SeqId seq = -1;
        STRATA_RETURN_IF_ERROR(CaptureKv(*model,
                                         std::span<const int32_t>(ids.data(), ids.size() - 1),
                                         f.threads, n_ctx, &cap, &full, &seq));
        const auto needles = NeedleTokens(*model, c, ids);
        auto record = [&](const std::string& cfg, const std::string& answer,
                          const nlohmann::json& extra) {
          int32_t found = 0;
          const double s = Score(c, answer, &found);
          nlohmann::json j = {
              {"case", c.id},           {"config", cfg},    {"task", c.task}, {"length", c.length},
              {"tokens", ids.size()},   {"depth", c.depth}, {"score", s},     {"found", found},
              {"expected", c.expected}, {"answer", answer}};
          j.update(extra);
          out << j.dump() << "\n" << std::flush;
          done[{c.id, cfg}] = j;
          std::fprintf(stderr, "%s %s: %.2f\n", c.id.c_str(), cfg.c_str(), s);
        };
        if (!done.count({c.id, "full"})) {
          std::string answer;
          STRATA_RETURN_IF_ERROR(Continue(*full, seq, ids, c.answer_tokens, &answer));
          record("full", answer, nlohmann::json::object());
        }
        full.reset();
        for (const std::string& cfg : configs) {
          if (done.count({c.id, cfg})) continue;
          DiskKvOptions d;
          STRATA_RETURN_IF_ERROR(ParseDiskSpec(cfg, base, n_ctx, full_cache, &d));
          // Which layers' attention held each needle token at the first answer step.
          bool first_step = false;
          std::vector<std::vector<bool>> seen(needles.size(),
                                              std::vector<bool>(size_t(model->hparams().n_layer)));
          EngineOptions eo;
          eo.n_threads = f.threads;
          eo.n_ctx = n_ctx;
          eo.kv.policy = KvPolicyKind::kDisk;
          eo.kv.disk = d;
          eo.kv.hooks.on_decode_view = [&](int32_t layer, SeqId,
                                           std::span<const kernels::KvSpan> view) {
            if (!first_step) return;
            for (size_t k = 0; k < needles.size(); ++k)
              for (const kernels::KvSpan& sp : view)
                if (sp.pos0 <= needles[k].second && sp.pos0 + sp.n_tokens > needles[k].first)
                  seen[k][size_t(layer)] = true;
          };
          std::unique_ptr<Engine> e;
          STRATA_RETURN_IF_ERROR(Engine::Create(*model, eo, &e));
          SeqId s;
          STRATA_RETURN_IF_ERROR(e->NewSequence(&s));
          STRATA_RETURN_IF_ERROR(ReplayPrefix(e->kv(), s, cap, cap.n_tokens));
          std::string answer;
          STRATA_RETURN_IF_ERROR(Continue(*e, s, ids, c.answer_tokens, &answer, &first_step));
          // Per needle: the layers that did not attend to it.
          nlohmann::json missed = nlohmann::json::array();
          int32_t attended = 0, total = 0;
          for (const auto& layers : seen) {
            nlohmann::json m = nlohmann::json::array();
            for (size_t l = 0; l < layers.size(); ++l) {
              attended += layers[l];
              ++total;
              if (!layers[l]) m.push_back(l);
            }
            missed.push_back(m);
          }
          record(cfg, answer,
                 {{"needle_layers_attended", attended},
                  {"needle_layers", total},
                  {"needle_layers_missed", missed}});
        }
      }
    }
  }
  PrintTable(f, configs, done);
  return Status::OK();
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  strata::bench::Flags f;
  CLI::App app{"bench_retrieval: long-context retrieval, full KV against the disk policy"};
  app.add_option("-m,--model", f.model, "GGUF model (default: ~/.cache/strata/SmolLM2...)");
  app.add_option("--text", f.text, "haystack text the cases are written from, required");
  app.add_option("--lengths", f.lengths, "prompt lengths in tokens, comma separated")
      ->delimiter(',');
  app.add_option("--tasks", f.tasks, "single, multikey, multivalue, multiquery, vt, cwe")
      ->delimiter(',');
  app.add_option("--cases", f.cases, "cases per task and length");
  app.add_option("--seed", f.seed, "seed of the cases");
  app.add_option("--configs", f.configs, "disk policy specs separated by ';' (kv_bench_util.h)");
  app.add_option("--kv-dir", f.kv_dir, "directory for the disk KV store");
  app.add_option("--results", f.results, "JSON-lines results file (appended, resumable)");
  app.add_option("-t,--threads", f.threads, "worker threads");
  app.add_flag("--table-only", f.table_only, "print the table from the results file");
  CLI11_PARSE(app, argc, argv);
  strata::Status st = strata::bench::Main(f, strata::bench::CommandLine(argc, argv));
  if (!st.ok()) {
    std::fprintf(stderr, "bench_retrieval: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
