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
#include <vector>

#include "common/status.h"
#include "runtime/engine/options.h"

namespace strata {

struct Config {
  std::string model;  // path of the GGUF file ("" = none given)
  EngineOptions engine;
  GenerateParams generate;
};

// Applies the settings in `yaml_text` on top of *cfg (which holds defaults or earlier
// settings). `source` names the text in errors (usually its file path).
// Limits on what a config may be: its size, the nesting of its flow collections, and the
// values it expands to with its aliases (each checked before the values are read).
constexpr size_t kMaxConfigBytes = size_t(1) << 20;
constexpr int kMaxConfigDepth = 64;
constexpr int64_t kMaxConfigNodes = 100000;
Status ParseConfig(std::string_view yaml_text, const std::string& source, Config* cfg);
// Reads and parses a file.
Status LoadConfigFile(const std::string& path, Config* cfg);
// The whole configuration as YAML, every key present, with a comment per key.
std::string ConfigToYaml(const Config& cfg);

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
