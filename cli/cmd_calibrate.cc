// strata calibrate: computes the disk KV policy's low-rank key adapters for a model from
// calibration text and writes them, with the model's identity and a checksum, to one file.
//
//   strata calibrate -m MODEL --text FILE --ratios 4,8,16,32 -o FILE
#include <cstdio>

#include "cli/cli.h"
#include "tuner/calibration.h"

namespace strata::cli {
namespace {

struct CalibrateFlags {
  std::string model, text, output;
  std::vector<int32_t> ratios = {4, 8, 16, 32};
  std::string method = "keys";
  CalibrationOptions options;
};

Status Calibrate(CalibrateFlags& f) {
  CommonFlags common;
  common.model = f.model;
  std::string path;
  STRATA_RETURN_IF_ERROR(ResolveModelPath(common, Config{}, &path));
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadModel(path, &model));
  f.options.text_path = f.text;
  f.options.ratios = f.ratios;
  f.options.query_aware = f.method == "query-aware";
  std::string out = f.output;
  // Where the disk policy looks when kv.adapters is not set.
  if (out.empty()) out = Adapters::DefaultPath(path);
  Adapters a;
  STRATA_RETURN_IF_ERROR(strata::Calibrate(*model, f.options, &a, [](const std::string& line) {
    std::fprintf(stderr, "calibrate: %s\n", line.c_str());
  }));
  STRATA_RETURN_IF_ERROR(a.Write(out));
  std::printf("wrote %s: ratios %s for model %s (%s), %s\n", out.c_str(), a.RatioList().c_str(),
              path.c_str(), model->identity_hex().c_str(), a.note.c_str());
  if (!a.profile.empty()) {
    // How unevenly the layers need their context: the error of 400 selected tokens.
    std::printf("attention output error with 400 tokens selected, per layer:");
    for (int32_t l = 0; l < a.n_layer; ++l) std::printf(" %.3f", a.profile.Error(l, 400));
    std::printf("\n");
  }
  return Status::OK();
}

}  // namespace

void AddCalibrateCommand(CLI::App* app) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app->add_subcommand(
      "calibrate", "compute the disk KV policy's key adapters (SVD of post-RoPE keys)");
  FlagModes& modes = FlagModes::Of(cmd);
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("-m,--model", f->model, "GGUF model file (default: as for run)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--text", f->text, "calibration text (UTF-8)")->required());
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--ratios", f->ratios, "compression ratios sigma, comma separated")
                ->delimiter(','));
  modes.Put(FlagModes::kGeneral, cmd->add_option("-o,--output", f->output,
                                                 "adapters file (default: MODEL with .adapters)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--tokens", f->options.tokens, "keys collected per layer"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--window", f->options.window, "tokens per forward window"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--text-fraction", f->options.text_fraction,
                      "use only this leading fraction of the text (the rest is for evaluation)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("-t,--threads", f->options.threads, "worker threads (0 = all cores)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--method", f->method,
                            "keys (SVD of the keys) or query-aware (fit to keys and queries)")
                ->check(CLI::IsMember({"query-aware", "keys"})));
  cmd->callback([f, &modes] {
    Status s = modes.Check();
    if (s.ok()) s = Calibrate(*f);
    if (!s.ok()) ExitCode() = ReportError("calibrate", s);
  });
}

}  // namespace strata::cli
