// Config: strata.yaml, the one configuration file (written by hand; an offline tuner that
// writes it is planned), and the settings it carries.
//
// Every setting has a default, a YAML key and a range check. Unknown keys are errors (a
// typo must not silently fall back to a default), and every error names the file, the
// line, the key, the value and the accepted range. The schema is one table in config.cc:
// ParseConfig reads it, ConfigToYaml writes exactly what ParseConfig reads, and
// DescribeConfig lists it for `strata config --list` and docs/config-reference.md.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "runtime/engine/options.h"

namespace strata {

// One entry of the `tuned:` table `strata tune` writes: the settings it chose for one
// (batch, context), what it predicted and what it measured.
struct TunedEntry {
  int32_t batch = 1;    // sequences decoded together
  int32_t context = 0;  // tokens
  // Schema keys and their values as YAML scalars ({"kv.group_size", "8"}, ...).
  std::vector<std::pair<std::string, std::string>> settings;
  double predicted_tokens_per_second = 0;
  double measured_tokens_per_second = 0;
  double ppl_loss = 0;   // perplexity against full KV, minus 1
  double agreement = 1;  // top-1 agreement with full KV
  int line = 0;          // where the entry starts in its file (for messages)
};

// Where a tuned configuration comes from: the model and machine it was measured on.
struct TuneProvenance {
  std::string model_identity;  // Model::identity_hex()
  std::string model_path;
  std::string machine;  // MachineFingerprint()
  std::string strata_version;
  std::string date;
  std::string command;
  std::string read_curve;  // the KV device's measured curve, as text
};

struct Config {
  std::string model;  // path of the GGUF file ("" = none given)
  EngineOptions engine;
  GenerateParams generate;
  // Written by `strata tune`: settings per (batch, context), applied by SelectTuned at
  // start-up over the settings above (command-line flags still override them).
  std::vector<TunedEntry> tuned;
  TuneProvenance provenance;
  std::string source;        // the file the settings came from ("" = defaults)
  std::string tuned_choice;  // which entry SelectTuned applied, for --stats ("" = none)
};

// The tuned entry nearest to (batch, context): the smallest distance in log2 of each,
// ties to the larger context (a plan for more tokens also holds fewer). Null when there are
// none.
const TunedEntry* NearestTuned(const Config& cfg, int32_t batch, int32_t context);
// Applies the entry nearest to (batch, context) over *cfg and notes it in tuned_choice.
Status SelectTuned(int32_t batch, int32_t context, Config* cfg);

// Applies the settings in `yaml_text` on top of *cfg (which holds defaults or earlier
// settings). `source` names the text in errors (usually its file path).
// Limits on what a config may be: its size, the nesting of its flow collections, and the
// values it expands to with its aliases, counted and in scalar bytes (each checked before the
// values are read). Without aliases a config holds at most kMaxConfigBytes of scalars; the
// expanded limit leaves aliases room for that several times over, and no more.
constexpr size_t kMaxConfigBytes = size_t(1) << 20;
constexpr int kMaxConfigDepth = 64;
constexpr int64_t kMaxConfigNodes = 100000;
constexpr int64_t kMaxConfigExpandedBytes = int64_t(8) << 20;
Status ParseConfig(std::string_view yaml_text, const std::string& source, Config* cfg);
// Reads and parses a file.
Status LoadConfigFile(const std::string& path, Config* cfg);
// The whole configuration as YAML, every key present, with a comment per key.
std::string ConfigToYaml(const Config& cfg);

// Sets one key of the schema (dotted, "kv.group_size") from its text with the same checks
// as the YAML loader (benchmarks' settings strings, flags); errors name the key and value.
Status SetConfigValue(const std::string& key, const std::string& value, Config* cfg);

// Every key of the schema ("kv.policy", ...), for documentation and tests.
std::vector<std::string> ConfigKeys();

// One setting of the schema as people read it, in the schema's order.
struct ConfigSettingInfo {
  std::string key;                  // "kv.policy"; a dotted key nests in YAML (kv: policy:)
  std::string default_value;        // as YAML flow text, the value of a default Config
  std::string accepted;             // "[1, 8192]", "(0, 1]", "memory, disk", "a string", ...
  std::vector<std::string> values;  // the names a choice accepts (empty for other kinds)
  std::string help;                 // one line
};
std::vector<ConfigSettingInfo> DescribeConfig();

}  // namespace strata
