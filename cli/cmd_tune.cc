// strata tune: profile this machine and the model, choose the KV settings per (batch,
// context), check them by running them, and write strata.yaml (see tuner/tune.h).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/file.h"
#include "common/progress_bar.h"
#include "platforms/cuda_device.h"
#include "platforms/platform.h"
#include "runtime/kv/disk/adapters.h"
#include "tuner/plot.h"
#include "tuner/tune.h"

namespace strata::cli {
namespace {

struct TuneFlags {
  std::string model;
  std::string output = "strata.yaml";
  std::string report;  // JSON report path ("" = none)
  std::string plot;    // SVG path ("" = none)
  std::string device = "cpu";
  bool force = false;
  std::string memory;     // the whole process
  std::string kv_memory;  // KV of a batch
  TuneOptions options;
};

// A size of --memory or --kv-memory: ParseByteSize's, and more than nothing.
Status ParseBytes(const std::string& flag, const std::string& text, int64_t* out) {
  STRATA_RETURN_IF_ERROR(ParseByteSize(flag, text, out));
  if (*out == 0) return Status::InvalidArgument(flag + ": '" + text + "' is not a positive size");
  return Status::OK();
}

std::string DirOf(const std::string& path) {
  const std::string d = std::filesystem::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

// A directory the command will create files in; `name` is what messages call it
// ("tune: --kv-dir '/x'").
Status CheckWritableDir(const std::string& name, const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound(name + " does not exist");
    return Status::FromErrno(name, errno);
  }
  if (!S_ISDIR(st.st_mode))
    return Status::InvalidArgument(name + " is " + FileKindName(st.st_mode) + ", not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::FromErrno(name + ": cannot create files in it", errno);
  return Status::OK();
}

// A file the command will write at the end (whole, replacing what is there when `force`):
// checked before anything is measured, so that a tune never ends in an error about where
// its result goes.
Status CheckOutputFile(const std::string& flag, const std::string& path, bool force) {
  if (path.empty()) return Status::InvalidArgument("tune: " + flag + ": the path is empty");
  const std::string name = "tune: " + flag + " '" + path + "'";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return Status::InvalidArgument(name + " is a directory; give the file to write");
    if (!S_ISREG(st.st_mode))
      return Status::InvalidArgument(name + " is " + FileKindName(st.st_mode) +
                                     ", not a regular file");
    if (!force)
      return Status::InvalidArgument("tune: " + path + " exists; give another " + flag +
                                     " or --force to replace it");
    if (::access(path.c_str(), W_OK) != 0)
      return Status::FromErrno(name + " cannot be replaced", errno);
  } else if (errno != ENOENT) {
    return Status::FromErrno(name, errno);
  }
  const std::string dir = DirOf(path);
  return CheckWritableDir(name + ": its directory '" + dir + "'", dir);
}

// A file the command reads: there, a regular file, readable.
Status CheckInputFile(const std::string& flag, const std::string& path) {
  int fd = -1;
  uint64_t size = 0;
  STRATA_RETURN_IF_ERROR(OpenRegularFile(path, flag.c_str(), &fd, &size));
  ::close(fd);
  return Status::OK();
}

// The work directory and the results file in it: an existing directory must take new files
// and the file must be a readable and writable regular file; a new one must be creatable,
// which is decided by the nearest directory above it that exists. Nothing is created here.
Status CheckWorkDir(const std::string& dir) {
  const std::string flag = "--work-dir";
  if (dir.empty()) return Status::InvalidArgument("tune: " + flag + ": the path is empty");
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    STRATA_RETURN_IF_ERROR(CheckWritableDir("tune: " + flag + " '" + dir + "'", dir));
    const std::string results = dir + "/quality.jsonl";
    struct stat st {};
    if (::stat(results.c_str(), &st) == 0) {
      if (!S_ISREG(st.st_mode))
        return Status::InvalidArgument("tune: " + flag + ": '" + results + "' is " +
                                       FileKindName(st.st_mode) + ", not a regular file");
      if (::access(results.c_str(), R_OK | W_OK) != 0)
        return Status::FromErrno("tune: " + flag + ": '" + results + "'", errno);
    }
    return Status::OK();
  }
  std::filesystem::path above = std::filesystem::path(dir).parent_path();
  while (!above.empty() && !std::filesystem::exists(above, ec)) above = above.parent_path();
  const std::string parent = above.empty() ? "." : above.string();
  struct stat st {};
  if (::stat(parent.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return Status::InvalidArgument("tune: " + flag + " '" + dir + "': '" + parent + "' is " +
                                   FileKindName(st.st_mode) + ", not a directory");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    return Status::FromErrno(
        "tune: " + flag + " '" + dir + "': cannot create it in '" + parent + "'", errno);
  return Status::OK();
}

std::string Join(const std::vector<int32_t>& v) {
  std::string s;
  // Appended piece by piece: g++ 12 warns (-Wrestrict, wrongly) on "," + to_string(x) here.
  for (int32_t x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

// What was asked, for the provenance (the settings that decide the result).
std::string CommandOf(const TuneFlags& f) {
  const TuneOptions& o = f.options;
  char loss[32];
  std::snprintf(loss, sizeof loss, "%g", o.max_ppl_loss);
  std::string c = "strata tune --text " + o.text_path + " --batches " + Join(o.batches) +
                  " --contexts " + Join(o.contexts) + " --max-ppl-loss " + loss + " --kv-dir " +
                  o.kv_dir;
  if (!f.memory.empty()) c += " --memory " + f.memory;
  if (!f.kv_memory.empty()) c += " --kv-memory " + f.kv_memory;
  if (o.emulate_emmc) c += " --emmc";
  if (o.quick) c += " --quick";
  if (o.cuda_device >= 0) c += " --device " + f.device;
  return c;
}

// Everything measured and chosen, for plots and for comparing machines.
nlohmann::json ReportJson(const TuneOptions& o, const TuneReport& r) {
  nlohmann::json reads = nlohmann::json::array();
  for (const ReadCurvePoint& p : r.device.reads)
    reads.push_back(
        {{"block", p.block}, {"depth", p.depth}, {"iops", p.iops}, {"mean_us", p.mean_us}});
  nlohmann::json dense = nlohmann::json::array();
  for (size_t i = 0; i < r.compute.batches.size(); ++i)
    dense.push_back({{"batch", r.compute.batches[i]}, {"seconds", r.compute.dense_seconds[i]}});
  nlohmann::json score = nlohmann::json::array();
  {
    const ComputeProfile& c = r.compute;
    const size_t n_g = std::max<size_t>(1, c.score_group_sizes.size());
    for (size_t i = 0; i < c.ranks.size(); ++i)
      for (size_t j = 0; j < n_g && (i + 1) * n_g <= c.score_seconds_per_row.size(); ++j) {
        const size_t k = i * n_g + j;
        score.push_back({{"rank", c.ranks[i]},
                         {"group_rows", c.score_group_sizes.empty() ? 1 : c.score_group_sizes[j]},
                         {"seconds_per_row", c.score_seconds_per_row[k]},
                         {"seconds_per_row_one_core", k < c.score_seconds_per_row_one_core.size()
                                                          ? c.score_seconds_per_row_one_core[k]
                                                          : c.score_seconds_per_row[k]}});
      }
  }
  nlohmann::json query = nlohmann::json::array();
  for (size_t i = 0; i < r.compute.ranks.size() && i < r.compute.query_seconds.size() &&
                     i < r.compute.query_row_seconds.size();
       ++i)
    query.push_back({{"rank", r.compute.ranks[i]},
                     {"seconds", r.compute.query_seconds[i]},
                     {"row_seconds", r.compute.query_row_seconds[i]}});
  nlohmann::json q8 = nlohmann::json::array();
  for (size_t i = 0; i < r.compute.q8_group_sizes.size(); ++i) {
    const ComputeProfile& c = r.compute;
    nlohmann::json e = {{"group_size", c.q8_group_sizes[i]}};
    if (i < c.q8_seconds_per_token.size()) e["seconds_per_token"] = c.q8_seconds_per_token[i];
    if (i < c.q8_seconds_per_token_many.size())
      e["seconds_per_token_many"] = c.q8_seconds_per_token_many[i];
    q8.push_back(std::move(e));
  }
  auto prices = [](const ComputeProfile::SelectionPrices& p) {
    return nlohmann::json{
        {"seconds_per_selection", p.per_selection}, {"seconds_per_candidate", p.per_candidate},
        {"seconds_per_group", p.per_group},         {"seconds_per_request", p.per_request},
        {"seconds_per_rank", p.per_rank},           {"score_scale", p.score_scale}};
  };
  // Where a predicted step's time goes: the same parts for a candidate and a choice.
  auto step_parts = [](const StepPrediction& p) {
    return nlohmann::json{{"predicted_compute_seconds", p.compute_seconds},
                          {"predicted_read_seconds", p.read_seconds},
                          {"predicted_wait_seconds", p.wait_seconds},
                          {"predicted_own_seconds", p.own_seconds}};
  };
  nlohmann::json choices = nlohmann::json::array();
  for (const TunedChoice& c : r.choices) {
    nlohmann::json cands = nlohmann::json::array();
    for (const TunedCandidate& k : c.candidates) {
      cands.push_back(
          {{"settings", k.key},
           {"predicted_tokens_per_second", k.predicted_tokens_per_second},
           {"ppl_loss", k.ppl_loss},
           {"ppl_loss_upper", k.ppl_loss_upper},
           {"agreement", k.agreement},
           {"requests_per_step", k.requests_per_step},
           {"refine_requests_per_step", k.refine_requests_per_step},
           {"bytes_per_step", k.bytes_per_step},
           {"within_bound", k.within_bound},
           {"measured_tokens_per_second", k.measured_tokens_per_second},
           {"anchor_seconds", k.anchor_seconds},
           {"anchor_disk_factor", k.anchor_disk_factor},
           {"anchored_tokens_per_second", k.anchored_tokens_per_second},
           {"remeasured_tokens_per_second", k.remeasured_tokens_per_second},
           {"remeasured_anchored_tokens_per_second", k.remeasured_anchored_tokens_per_second},
           {"checks_anchored_tokens_per_second", k.checks_anchored_tokens_per_second},
           {"remeasured_checks_anchored_tokens_per_second",
            k.remeasured_checks_anchored_tokens_per_second},
           {"measured_again_tokens_per_second", k.measured_again_tokens_per_second},
           {"measured_requests_per_step", k.measured_requests_per_step},
           {"attended_groups_per_step", k.attended_groups_per_step},
           {"measured_attended_groups_per_step", k.measured_attended_groups_per_step},
           {"measured_refine_requests_per_step", k.measured_refine_requests_per_step},
           {"measured_bytes_per_step", k.measured_bytes_per_step},
           {"predicted_at_measured_reads", k.predicted_at_measured_reads},
           {"measured_select_seconds", k.measured_select_seconds},
           {"measured_wait_seconds", k.measured_wait_seconds},
           {"predicted_select_seconds", k.predicted_select_seconds},
           {"attended_tokens", k.shape.attended_tokens},
           {"selections", k.shape.selections},
           {"summary_rows", k.shape.summary_rows},
           {"queue_depth", k.shape.queue_depth}});
      cands.back().update(step_parts(k.predicted));
    }
    choices.push_back(
        {{"batch", c.batch},
         {"context", c.context},
         {"policy", c.disk ? "disk" : "memory"},
         {"plan", c.description},
         {"settings", c.key},
         {"queue_depth", c.disk ? c.disk_options.queue_depth : 0},
         {"predicted_best", c.predicted_best},
         {"predicted_tokens_per_second", c.predicted.tokens_per_second},
         {"predicted_step_seconds", c.predicted.step_seconds},
         {"predicted_select_seconds", c.predicted.select_seconds},
         {"measured_tokens_per_second", c.measured_tokens_per_second},
         {"anchor_seconds", c.anchor_seconds},
         {"anchor_disk_factor", c.anchor_disk_factor},
         {"anchored_tokens_per_second", c.anchored_tokens_per_second},
         {"remeasured_tokens_per_second", c.remeasured_tokens_per_second},
         {"remeasured_anchored_tokens_per_second", c.remeasured_anchored_tokens_per_second},
         {"checks_anchor_seconds", c.checks_anchor_seconds},
         {"checks_disk_factor", c.checks_disk_factor},
         {"checks_anchored_tokens_per_second", c.checks_anchored_tokens_per_second},
         {"remeasured_checks_anchored_tokens_per_second",
          c.remeasured_checks_anchored_tokens_per_second},
         {"measured_again_tokens_per_second", c.measured_again_tokens_per_second},
         {"default_tokens_per_second", c.default_tokens_per_second},
         {"ppl_loss", c.ppl_loss},
         {"ppl_loss_upper", c.ppl_loss_upper},
         {"agreement", c.agreement},
         {"candidates", cands}});
    choices.back().update(step_parts(c.predicted));
  }
  nlohmann::json fit_runs = nlohmann::json::array();
  for (const ComputeProfile::DiskFitRun& f : r.compute.disk_fit)
    fit_runs.push_back({{"batch", f.batch},
                        {"context", f.context},
                        {"group_size", f.group_size},
                        {"rank", f.rank},
                        {"groups_per_step", f.groups_per_step},
                        {"record_type", f.q8_records ? "q8_0" : "f16"},
                        {"group_summary", f.group_summary},
                        {"budget_bytes", f.budget_bytes},
                        {"step_seconds", f.step_seconds},
                        {"select_seconds", f.select_seconds},
                        {"predicted_step_seconds", f.predicted_step_seconds},
                        {"predicted_select_seconds", f.predicted_select_seconds}});
  return {{"kind", "strata.tune_report"},
          {"version", 1},
          {"command", o.command},
          {"machine", r.device.Fingerprint()},
          {"device",
           {{"kv_dir", r.device.kv_dir},
            {"backend", r.device.backend},
            {"emulate_emmc", r.device.emulate_emmc},
            {"reads", reads},
            {"memory_gb_per_s", r.device.memory_gb_per_s}}},
          {"compute",
           {{"threads", r.compute.threads},
            {"dense", dense},
            {"attention_seconds_per_token", r.compute.attention_seconds_per_token},
            {"attention_seconds_per_token_many", r.compute.attention_seconds_per_token_many},
            {"score", score},
            {"low_rank_query", query},
            {"disk_overhead_seconds", r.compute.disk_overhead_seconds},
            {"disk_seconds_per_group", r.compute.disk_seconds_per_group},
            {"disk_seconds_per_request", r.compute.disk_seconds_per_request},
            {"disk_seconds_per_request_many", r.compute.disk_seconds_per_request_many},
            {"q8_records", q8},
            {"selection_one_sequence", prices(r.compute.select_one)},
            {"selection_several_sequences", prices(r.compute.select_many)},
            {"disk_fit_runs", r.compute.disk_fit_runs},
            {"disk_fit", fit_runs},
            {"anchor_seconds", r.compute.anchor_seconds}}},
          {"max_ppl_loss", o.max_ppl_loss},
          {"process_base_bytes", r.process_base_bytes},
          {"choices", choices}};
}

Status Tune(TuneFlags& f) {
  CommonFlags flags;
  flags.model = f.model;
  std::string path;
  STRATA_RETURN_IF_ERROR(ResolveModelPath(flags, Config(), &path));
  if (!f.memory.empty() && !f.kv_memory.empty())
    return Status::InvalidArgument(
        "tune: --memory (the whole process) and --kv-memory (KV of a batch) are alternatives; "
        "give one");
  if (!f.memory.empty())
    STRATA_RETURN_IF_ERROR(ParseBytes("--memory", f.memory, &f.options.process_memory_bytes));
  if (!f.kv_memory.empty())
    STRATA_RETURN_IF_ERROR(ParseBytes("--kv-memory", f.kv_memory, &f.options.kv_memory_bytes));
  STRATA_RETURN_IF_ERROR(
      ParseComputeDevice(f.device, &f.options.cuda_device).WithContext("tune: --device"));
  if (f.options.cuda_device >= 0 && f.options.cuda_device >= CudaDevice::Count())
    return Status::NotSupported(
        "tune: --device " + f.device + ": " +
        (CudaDevice::Count() == 0
             ? std::string("no CUDA device is visible to this process")
             : "this process sees " + std::to_string(CudaDevice::Count()) +
                   " CUDA device(s), cuda:0 to cuda:" + std::to_string(CudaDevice::Count() - 1)));
  // Memory the machine does not have cannot be tuned for: the plans would be chosen for a
  // process that cannot run here.
  {
    PlatformInfo machine;
    if (DetectPlatform(&machine).ok() && machine.memory_total > 0)
      for (const auto& [flag, bytes] :
           {std::pair<const char*, int64_t>{"--memory", f.options.process_memory_bytes},
            {"--kv-memory", f.options.kv_memory_bytes}})
        if (bytes > 0 && uint64_t(bytes) > machine.memory_total)
          return Status::InvalidArgument(
              std::string("tune: ") + flag + " " + ReadableBytes(uint64_t(bytes)) +
              " is more than this machine's memory, " + ReadableBytes(machine.memory_total));
  }
  // Found out now, not after the measurements: every file to write must be new (or
  // --force), a file, and writable; every input there and readable.
  const std::string tmp = f.output + ".tmp";
  const std::pair<std::string, std::string> outputs[] = {
      {"-o", f.output}, {"--report", f.report}, {"--plot", f.plot}};
  for (const auto& [flag, file] : outputs) {
    if (flag == "-o" || !file.empty()) STRATA_RETURN_IF_ERROR(CheckOutputFile(flag, file, f.force));
  }
  for (size_t i = 0; i < std::size(outputs); ++i)
    for (size_t j = i + 1; j < std::size(outputs); ++j) {
      if (outputs[i].second.empty() || outputs[j].second.empty()) continue;
      std::error_code ec;
      const auto where = [&ec](const std::string& p) {
        return std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
      };
      if (where(outputs[i].second) == where(outputs[j].second))
        return Status::InvalidArgument("tune: " + outputs[i].first + " and " + outputs[j].first +
                                       " name the same file, " + outputs[j].second);
    }
  {
    // The result is written here first, then renamed over -o.
    struct stat st {};
    if (::stat(tmp.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return Status::InvalidArgument(
          "tune: -o: '" + tmp + "', where the result is written before " + "it is renamed to " +
          f.output + ", is " + FileKindName(st.st_mode));
  }
  STRATA_RETURN_IF_ERROR(CheckInputFile("tune: --text", f.options.text_path));
  {
    const std::string adapters =
        f.options.adapters.empty() ? Adapters::DefaultPath(path) : f.options.adapters;
    STRATA_RETURN_IF_ERROR(
        CheckInputFile(
            f.options.adapters.empty() ? "adapters (beside the model; --adapters)" : "--adapters",
            adapters)
            .WithContext("tune needs the model's adapters (strata calibrate writes them)"));
  }
  STRATA_RETURN_IF_ERROR(
      CheckWritableDir("tune: --kv-dir '" + f.options.kv_dir + "'", f.options.kv_dir));
  if (!f.options.work_dir.empty()) STRATA_RETURN_IF_ERROR(CheckWorkDir(f.options.work_dir));
  std::unique_ptr<Model> model;
  STRATA_RETURN_IF_ERROR(LoadModel(path, &model));
  TuneOptions& o = f.options;
  o.model_path = path;
  o.command = CommandOf(f);
  if (o.work_dir.empty()) {
    const char* home = std::getenv("HOME");
    o.work_dir = std::string(home ? home : ".") + "/.cache/strata/tune/" + model->identity_hex();
    STRATA_RETURN_IF_ERROR(CheckWorkDir(o.work_dir));
  }
  std::fprintf(stderr, "tune: results kept in %s (a rerun resumes there)\n", o.work_dir.c_str());
  TuneReport report;
  {
    // The log goes to stderr line by line; on a terminal a bar with the phase's ETA sits
    // under it.
    ProgressBar bar(stderr, ProgressBar::IsTerminal(STDERR_FILENO));
    o.on_progress = [&bar](const std::string& phase, int64_t done, int64_t total) {
      bar.Update(phase, done, total);
    };
    STRATA_RETURN_IF_ERROR(strata::Tune(
        *model, o, [&bar](const std::string& line) { bar.Log("tune: " + line); }, &report));
  }
  const Config tuned = TunedConfig(*model, o, report);
  const std::string yaml = ConfigToYaml(tuned);
  // Checked by the reader before anything is written: what start-up will read must parse.
  Config check;
  STRATA_RETURN_IF_ERROR(ParseConfig(yaml, f.output, &check).WithContext("tune: the result"));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << yaml;
    out.close();
    if (!out) {
      const int err = errno;
      std::remove(tmp.c_str());
      return Status::FromErrno("tune: writing " + tmp, err);
    }
  }
  if (std::rename(tmp.c_str(), f.output.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::FromErrno("tune: renaming " + tmp + " to " + f.output, err);
  }
  if (!f.report.empty()) {
    std::ofstream out(f.report, std::ios::binary | std::ios::trunc);
    out << ReportJson(o, report).dump(2) << "\n";
    if (!out) return Status::FromErrno("tune: writing the report " + f.report, errno);
  }
  if (!f.plot.empty()) {
    std::ofstream out(f.plot, std::ios::binary | std::ios::trunc);
    out << TunePlotSvg(report, o.max_ppl_loss);
    if (!out) return Status::FromErrno("tune: writing the plot " + f.plot, errno);
  }
  std::printf(
      "| batch | context | policy | predicted tok/s | measured tok/s | defaults tok/s | tuned / "
      "defaults | ppl loss (upper) | agreement |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const TunedChoice& c : report.choices)
    std::printf("| %d | %d | %s | %.1f | %.1f | %.1f | %.2fx | %+.2f%% (%+.2f%%) | %.1f%% |\n",
                c.batch, c.context, c.disk ? "disk" : "memory", c.predicted.tokens_per_second,
                c.measured_tokens_per_second, c.default_tokens_per_second,
                c.default_tokens_per_second > 0
                    ? c.measured_tokens_per_second / c.default_tokens_per_second
                    : 0.0,
                c.ppl_loss * 100, c.ppl_loss_upper * 100, c.agreement * 100);
  // The cost model against every plan that ran: relative error of the step time, as
  // predicted from the profile; with the profile scaled to the machine's speed during all of
  // an entry's checks, which take their steps in turn (the median of their anchor steps and
  // disk anchors); and scaled to each run's own anchors.
  struct Run {
    double predicted, at_checks, at_run, measured;
    // With --repeat-checks: the second measurement and its predictions; 0 otherwise.
    double again, again_at_checks, again_at_run;
    // Every measurement, the first and each round's.
    std::vector<double> all;
  };
  auto all_of = [](double first, const std::vector<double>& again) {
    std::vector<double> v = {first};
    v.insert(v.end(), again.begin(), again.end());
    return v;
  };
  std::vector<Run> runs;
  for (const TunedChoice& c : report.choices) {
    if (c.measured_tokens_per_second > 0)
      runs.push_back({c.predicted.tokens_per_second, c.checks_anchored_tokens_per_second,
                      c.anchored_tokens_per_second, c.measured_tokens_per_second,
                      c.remeasured_tokens_per_second,
                      c.remeasured_checks_anchored_tokens_per_second,
                      c.remeasured_anchored_tokens_per_second,
                      all_of(c.measured_tokens_per_second, c.measured_again_tokens_per_second)});
    for (const TunedCandidate& k : c.candidates)
      if (k.key != c.key && k.measured_tokens_per_second > 0)  // the choice, counted above
        runs.push_back({k.predicted_tokens_per_second, k.checks_anchored_tokens_per_second,
                        k.anchored_tokens_per_second, k.measured_tokens_per_second,
                        k.remeasured_tokens_per_second,
                        k.remeasured_checks_anchored_tokens_per_second,
                        k.remeasured_anchored_tokens_per_second,
                        all_of(k.measured_tokens_per_second, k.measured_again_tokens_per_second)});
  }
  // Step time is batch / tokens per second: |predicted step / measured step - 1|.
  auto error = [](double pred, double meas) { return std::fabs(meas / pred - 1.0); };
  auto summary = [](std::vector<double> e, const std::string& what) {
    if (e.empty()) return;
    std::sort(e.begin(), e.end());
    std::printf("%s: median %.1f%%, worst %.1f%%\n", what.c_str(), 100 * e[e.size() / 2],
                100 * e.back());
  };
  // Errors of the prediction `pred` of each run against its measurement `meas`.
  auto errors = [&](double Run::*pred, double Run::*meas) {
    std::vector<double> e;
    for (const Run& r : runs)
      if (r.*pred > 0 && r.*meas > 0) e.push_back(error(r.*pred, r.*meas));
    return e;
  };
  const std::string n = std::to_string(runs.size());
  summary(errors(&Run::predicted, &Run::measured),
          "cost model over " + n + " runs: step time error");
  summary(errors(&Run::at_checks, &Run::measured),
          "cost model over " + n +
              " runs at the machine's and the KV device's speeds during their entry's checks: "
              "step time error");
  summary(errors(&Run::at_run, &Run::measured),
          "cost model over " + n +
              " runs at the machine's and the KV device's speeds during each run: step time "
              "error");
  std::vector<double> apart, bound, mean;
  for (const Run& r : runs) {
    if (!(r.again > 0)) continue;
    // The step time closest to both of a run's measurements misses each by |a - b| / (a + b)
    // (step times a and b): what no prediction can beat on this machine.
    const double a = 1 / r.measured, b = 1 / r.again;
    apart.push_back(std::fabs(a - b) / std::min(a, b));
    bound.push_back(std::fabs(a - b) / (a + b));
    mean.push_back(error(r.predicted, 2 / (a + b)));
  }
  if (!apart.empty()) {
    auto both = [&](double Run::*pred, double Run::*pred_again) {
      std::vector<double> e = errors(pred, &Run::measured);
      const std::vector<double> e2 = errors(pred_again, &Run::again);
      e.insert(e.end(), e2.begin(), e2.end());
      return e;
    };
    const std::string m = std::to_string(apart.size());
    summary(apart, "the " + m + " runs measured twice: the two step times apart by");
    summary(bound, "the least error any prediction can have against both measurements");
    summary(both(&Run::predicted, &Run::predicted),
            "cost model over both measurements of the " + m + " runs: step time error");
    summary(mean, "cost model against the mean of each run's first two step times: error");
    // Three or more measurements: against each run's median step time, which one round
    // caught in a slow (or fast) spell of the machine does not move.
    std::vector<double> median;
    size_t most = 0;
    for (const Run& r : runs) {
      std::vector<double> steps;
      for (double tps : r.all)
        if (tps > 0) steps.push_back(1 / tps);
      if (steps.size() < 3) continue;
      most = std::max(most, steps.size());
      std::sort(steps.begin(), steps.end());
      const size_t h = steps.size() / 2;
      const double step = steps.size() % 2 ? steps[h] : (steps[h - 1] + steps[h]) / 2;
      median.push_back(error(r.predicted, 1 / step));
    }
    if (!median.empty())
      summary(median, "cost model against the median of each run's " + std::to_string(most) +
                          " step times: error");
    summary(both(&Run::at_checks, &Run::again_at_checks),
            "cost model over both measurements at their entry's checks' speeds: step time error");
    summary(both(&Run::at_run, &Run::again_at_run),
            "cost model over both measurements at their speeds: step time error");
  }
  std::printf("wrote %s\n", f.output.c_str());
  return Status::OK();
}

}  // namespace

void AddTuneCommand(CLI::App* app) {
  auto f = std::make_shared<TuneFlags>();
  CLI::App* cmd = app->add_subcommand(
      "tune", "measure this machine and the model, choose KV settings, write strata.yaml");
  FlagModes& modes = FlagModes::Of(cmd);
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("-m,--model", f->model, "GGUF model file (default: as for run)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("-o,--output", f->output, "the strata.yaml to write"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_flag("--force", f->force, "replace the output file if it exists"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--report", f->report,
                            "also write everything measured and chosen as JSON to this file"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--plot", f->plot,
                      "also draw predicted against measured step time and quality against budget "
                      "(SVG) to this file"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--text", f->options.text_path,
                      "evaluation text (UTF-8; its second half, which calibration did not use)")
          ->required());
  modes.Put(FlagModes::kGeneral, cmd->add_option("--batches", f->options.batches,
                                                 "sequences decoded together, comma separated")
                                     ->delimiter(','));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--contexts", f->options.contexts, "context lengths, comma separated")
                ->delimiter(','));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--memory", f->memory,
                      "memory for the whole process (e.g. 1G): KV gets what the model and scratch "
                      "leave; default: what is free now"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--kv-memory", f->kv_memory,
                            "or KV memory for a whole batch (e.g. 512M), whatever the rest needs"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--max-ppl-loss", f->options.max_ppl_loss,
                      "largest perplexity loss against full KV a disk plan may have (0.03 = 3%)"));
  modes.Put(FlagModes::kGeneral, cmd->add_option("--kv-dir", f->options.kv_dir,
                                                 "directory of the disk KV store to profile"));
  modes.Put(FlagModes::kGeneral, cmd->add_flag("--emmc", f->options.emulate_emmc,
                                               "profile and tune under the eMMC emulation"));
  modes.Put(FlagModes::kGeneral, cmd->add_option("--adapters", f->options.adapters,
                                                 "adapters file (default: MODEL.adapters)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--work-dir", f->options.work_dir,
                            "where captures and quality results are kept (default: "
                            "~/.cache/strata/tune/MODEL_IDENTITY)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--windows", f->options.windows, "quality windows per context"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("--scored", f->options.scored, "scored positions per window"));
  CLI::Option* verify = modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--verify-steps", f->options.verify_steps, "decode steps of each check run"));
  CLI::Option* runners = modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--runners-up", f->options.runners_up,
                      "besides the plan predicted fastest, run this many of the next ones and "
                      "keep the measured fastest"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--validate", f->options.validate,
                      "also run up to this many other measured plans per entry, to check the cost "
                      "model (their speed goes in the report)"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_flag("--repeat-checks{1}", f->options.repeat_checks,
                    "after the grid, measure each run again (=N: N rounds) and report how far the "
                    "measurements lie apart, and the cost model's error against each run's median")
          ->check(CLI::Range(0, 16)));
  CLI::Option* candidates = modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--max-candidates", f->options.max_candidates,
                      "disk plans whose quality is measured per (batch, context), at most"));
  CLI::Option* variants = modes.Put(
      FlagModes::kGeneral,
      cmd->add_option("--max-variants", f->options.max_variants,
                      "besides those, plans re-selecting fewer groups a step (kv.groups_per_step) "
                      "than a measured one, per (batch, context), at most"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option("-t,--threads", f->options.threads, "worker threads (0 = all cores)"));
  modes.Put(FlagModes::kGeneral,
            cmd->add_option(
                "--device", f->device,
                "where decode speed is measured: cpu, cuda or cuda:N (quality runs on the CPU)"));
  modes.Put(
      FlagModes::kGeneral,
      cmd->add_flag("--quick", f->options.quick,
                    "shorter device and compute profiles, and unless given --max-candidates 8 "
                    "--max-variants 3 --runners-up 1, and --verify-steps 16 without --validate"));
  cmd->callback([f, candidates, variants, runners, verify, &modes] {
    if (const Status s = modes.Check(); !s.ok()) {
      ExitCode() = ReportError("tune", s);
      return;
    }
    // Not fewer windows: the upper loss estimate counts positions as independent, and
    // windows of one text differ by more than that allows (two windows let through a plan
    // that lost more than the bound on unseen text; docs/experiments/tuner.md).
    if (f->options.quick) {
      if (candidates->count() == 0) f->options.max_candidates = 8;
      if (variants->count() == 0) f->options.max_variants = 3;
      if (runners->count() == 0) f->options.runners_up = 1;
      // Half as many steps a check: the median of 16 still passes over a stall, and the
      // checks are a sixth of a quick tune. A tune that validates the cost model keeps the
      // full runs, whose error it reports.
      if (verify->count() == 0 && f->options.validate == 0) f->options.verify_steps = 16;
    }
    Status s = Tune(*f);
    if (!s.ok()) ExitCode() = ReportError("tune", s);
  });
}

}  // namespace strata::cli
