// strata info: the model (architecture, sizes, tensor types, KV bytes per token) and the
// platform (CPU, kernels in use, memory).
#include <cstdio>
#include <map>

#include "cli/cli.h"
#include "platforms/platform.h"

namespace strata::cli {
namespace {

struct InfoFlags {
  std::string model;
  CLI::Option* model_opt = nullptr;
  bool json = false;
};

std::string Bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

Status Info(const InfoFlags& f) {
  CommonFlags common;
  common.model = f.model;
  common.model_opt = f.model_opt;
  std::string path;
  STRATA_RETURN_IF_ERROR(ResolveModelPath(common, Config{}, &path));
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadModel(path, &model));
  PlatformInfo plat;
  STRATA_RETURN_IF_ERROR(DetectPlatform(&plat));
  const HParams& hp = model->hparams();
  std::map<std::string, std::pair<int, uint64_t>> types;
  uint64_t params = 0;
  for (const GgufTensor& t : model->gguf().tensors()) {
    auto& e = types[kernels::TypeName(t.type)];
    e.first += 1;
    e.second += t.nbytes;
    params += uint64_t(t.n_elements());
  }
  nlohmann::json j;
  j["model"] = {{"path", path},
                {"name", hp.name},
                {"architecture", hp.arch_name},
                {"identity", model->identity_hex()},
                {"parameters", params},
                {"weight_bytes", model->weight_bytes()},
                {"vocab", hp.n_vocab},
                {"context_train", hp.n_ctx_train},
                {"embedding", hp.n_embd},
                {"layers", hp.n_layer},
                {"heads", hp.n_head},
                {"kv_heads", hp.n_head_kv},
                {"head_dim", hp.head_dim},
                {"feed_forward", hp.n_ff},
                {"rope_base", hp.rope_base},
                {"rope_layout", hp.rope_layout == kernels::RopeLayout::kNeox ? "neox" : "normal"},
                {"tied_output", hp.tied_output},
                {"chat_template", ChatTemplateName(model->chat_template())},
                {"kv_bytes_per_token_f16", hp.kv_bytes_per_token_f16()}};
  for (const auto& [name, e] : types)
    j["model"]["tensor_types"][name] = {{"tensors", e.first}, {"bytes", e.second}};
  j["platform"] = {{"kind", PlatformKindName(plat.kind)},
                   {"cpu", plat.cpu_model},
                   {"kernels", plat.isa},
                   {"cores", plat.cores},
                   {"memory_total", plat.memory_total},
                   {"memory_available", plat.memory_available},
                   {"unified_memory", plat.unified_memory}};
  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return Status::OK();
  }
  std::printf("model          %s\n", path.c_str());
  std::printf("name           %s\n", hp.name.c_str());
  std::printf("architecture   %s (%d layers, %d heads, %d KV heads, head dim %d)\n",
              hp.arch_name.c_str(), hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim);
  std::printf("sizes          embedding %d, feed-forward %d, vocabulary %d, context %d\n",
              hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_ctx_train);
  std::printf("parameters     %.1f M, weights %s\n", double(params) / 1e6,
              Bytes(double(model->weight_bytes())).c_str());
  std::printf("tensor types  ");
  for (const auto& [name, e] : types)
    std::printf(" %s x%d (%s)", name.c_str(), e.first, Bytes(double(e.second)).c_str());
  std::printf("\n");
  std::printf("KV per token   %s (F16 K+V, all layers); %s for the full %d-token context\n",
              Bytes(double(hp.kv_bytes_per_token_f16())).c_str(),
              Bytes(double(hp.kv_bytes_per_token_f16()) * hp.n_ctx_train).c_str(), hp.n_ctx_train);
  std::printf("chat template  %s\n", ChatTemplateName(model->chat_template()));
  std::printf("identity       %s\n", model->identity_hex().c_str());
  std::printf("platform       %s, %s, %d cores, kernels %s, memory %s (%s available)\n",
              PlatformKindName(plat.kind), plat.cpu_model.c_str(), plat.cores, plat.isa.c_str(),
              Bytes(double(plat.memory_total)).c_str(),
              Bytes(double(plat.memory_available)).c_str());
  return Status::OK();
}

}  // namespace

void AddInfoCommand(CLI::App* app) {
  auto f = std::make_shared<InfoFlags>();
  CLI::App* cmd = app->add_subcommand("info", "describe a model and this platform");
  FlagModes& modes = FlagModes::Of(cmd);
  f->model_opt = modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("-m,--model", f->model, "GGUF model file (default: the default model)"));
  modes.Put(FlagModes::kGeneral, cmd->add_flag("--json", f->json, "print JSON"));
  cmd->callback([f, &modes] {
    Status s = modes.Check();
    if (s.ok()) s = Info(*f);
    if (!s.ok()) ExitCode() = ReportError("info", s);
  });
}

}  // namespace strata::cli
