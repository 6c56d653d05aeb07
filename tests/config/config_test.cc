#include "runtime/config/config.h"

#include <map>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

namespace strata {
namespace {

Status Parse(const std::string& text, Config* c) { return ParseConfig(text, "strata.yaml", c); }

TEST(ConfigTest, EmptyFileKeepsDefaults) {
  Config c;
  ASSERT_TRUE(Parse("", &c).ok());
  ASSERT_TRUE(Parse("# only a comment\n", &c).ok());
  EXPECT_EQ(c.engine.n_batch, 512);
  EXPECT_EQ(c.engine.kv.policy, KvPolicyKind::kMemory);
}

TEST(ConfigTest, ReadsEverySection) {
  Config c;
  Status s = Parse(
      "model: /m.gguf\nthreads: 2\ncontext: 4096\nbatch: 256\nmax_sequences: 8\n"
      "generate:\n  max_tokens: 50\n  stop: [\"\\n\\n\", \"User:\"]\n  ignore_eos: true\n"
      "sampling:\n  temperature: 0\n  top_k: 10\n  top_p: 0.9\n  min_p: 0.1\n"
      "  repeat_penalty: 1.1\n  repeat_last_n: 32\n  seed: 77\n"
      "kv:\n  policy: memory\n",
      &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.model, "/m.gguf");
  EXPECT_EQ(c.engine.n_threads, 2);
  EXPECT_EQ(c.engine.n_ctx, 4096);
  EXPECT_EQ(c.engine.n_batch, 256);
  EXPECT_EQ(c.engine.max_sequences, 8);
  EXPECT_EQ(c.generate.max_tokens, 50);
  ASSERT_EQ(c.generate.stop.size(), 2u);
  EXPECT_EQ(c.generate.stop[0], "\n\n");
  EXPECT_TRUE(c.generate.ignore_eos);
  EXPECT_EQ(c.generate.sampling.temperature, 0.f);
  EXPECT_EQ(c.generate.sampling.top_k, 10);
  EXPECT_FLOAT_EQ(c.generate.sampling.top_p, 0.9f);
  EXPECT_EQ(c.generate.sampling.seed, 77u);
}

TEST(ConfigTest, DeviceNamesCpuOrACudaGpu) {
  Config c;
  EXPECT_EQ(c.engine.cuda_device, -1);  // the CPU by default
  ASSERT_TRUE(Parse("device: cuda:1\n", &c).ok());
  EXPECT_EQ(c.engine.cuda_device, 1);
  ASSERT_TRUE(Parse("device: cuda\n", &c).ok());
  EXPECT_EQ(c.engine.cuda_device, 0);
  ASSERT_TRUE(Parse("device: cpu\n", &c).ok());
  EXPECT_EQ(c.engine.cuda_device, -1);
  Status s = Parse("threads: 1\ndevice: gpu0\n", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("device"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("'gpu0' is not a device"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(":2"), std::string::npos) << s.ToString();  // the line
}

TEST(ConfigTest, UnknownKeyNamesKeyLineAndSuggestion) {
  Config c;
  Status s = Parse("threads: 2\nsampling:\n  temprature: 0.5\n", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("strata.yaml:3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("sampling.temprature"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("did you mean 'sampling.temperature'"), std::string::npos)
      << s.message();
  EXPECT_EQ(c.engine.n_threads, 0) << "a failed parse must not apply any setting";
}

TEST(ConfigTest, OutOfRangeNamesValueAndRange) {
  Config c;
  Status s = Parse("batch: 0\n", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange);
  EXPECT_NE(s.message().find("strata.yaml:1: batch: 0 is out of range [1, 8192]"),
            std::string::npos)
      << s.message();
  s = Parse("sampling:\n  top_p: 1.5\n", &c);
  EXPECT_NE(s.message().find("sampling.top_p: 1.5 is out of range (0, 1]"), std::string::npos)
      << s.message();
}

TEST(ConfigTest, WrongTypesAreErrors) {
  Config c;
  Status s = Parse("threads: two\n", &c);
  EXPECT_NE(s.message().find("'two' is not an integer"), std::string::npos) << s.message();
  s = Parse("sampling: 3\n", &c);
  EXPECT_NE(s.message().find("is a section"), std::string::npos) << s.message();
  s = Parse("threads: [1, 2]\n", &c);
  EXPECT_NE(s.message().find("expected an integer, got a list"), std::string::npos) << s.message();
  s = Parse("kv:\n  policy: ssd\n", &c);
  EXPECT_NE(s.message().find("unknown KV policy 'ssd'"), std::string::npos) << s.message();
  s = Parse("kv:\n  record_type: q4\n", &c);
  EXPECT_NE(s.message().find("kv.record_type"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("unknown KV record type 'q4' (accepted: auto, f16, q8_0)"),
            std::string::npos)
      << s.message();
  ASSERT_TRUE(Parse("kv:\n  record_type: f16\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.record_type, KvRecordType::kF16);
  s = Parse("kv:\n  experimental:\n    summary_type: int8\n", &c);
  EXPECT_NE(s.message().find("kv.experimental.summary_type"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("unknown key summary type 'int8' (accepted: f16, q8, q4)"),
            std::string::npos)
      << s.message();
  ASSERT_TRUE(Parse("kv:\n  experimental:\n    summary_type: q8\n", &c).ok());
  // Research settings live under kv.experimental only.
  s = Parse("kv:\n  summary_type: q8\n", &c);
  EXPECT_NE(s.message().find("unknown key 'kv.summary_type'"), std::string::npos) << s.message();
  s = Parse("kv:\n  experimental:\n    resident_bonus: -1\n", &c);
  EXPECT_NE(s.message().find("kv.experimental.resident_bonus"), std::string::npos) << s.message();
  ASSERT_TRUE(Parse("kv:\n  experimental:\n    resident_bonus: 0.5\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.resident_bonus, 0.5f);
  EXPECT_EQ(c.engine.kv.disk.dispersed_bonus, 10.0f);
  s = Parse("kv:\n  experimental:\n    dispersed_bonus: 101\n", &c);
  EXPECT_NE(s.message().find("kv.experimental.dispersed_bonus"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("101"), std::string::npos) << s.message();
  ASSERT_TRUE(Parse("kv:\n  experimental:\n    dispersed_bonus: -1\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.dispersed_bonus, -1.0f);
  EXPECT_EQ(c.engine.kv.disk.read_through, -1);  // auto
  ASSERT_TRUE(Parse("kv:\n  read_through: 40\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.read_through, 40);
  s = Parse("kv:\n  read_through: -2\n", &c);
  EXPECT_NE(s.message().find("kv.read_through"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("-2 is out of range [-1,"), std::string::npos) << s.message();
  EXPECT_EQ(c.engine.kv.disk.read_through_span, 1);  // single groups
  ASSERT_TRUE(Parse("kv:\n  experimental:\n    read_through_span: 8\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.read_through_span, 8);
  s = Parse("kv:\n  experimental:\n    read_through_span: 0\n", &c);
  EXPECT_NE(s.message().find("kv.experimental.read_through_span"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("0 is out of range [1, 256]"), std::string::npos) << s.message();
  ASSERT_TRUE(Parse("kv:\n  calibrated_layers: true\n  ratio: 0\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.calibrated_layers, AutoSwitch::kOn);
  EXPECT_EQ(c.engine.kv.disk.ratio, 0);
  ASSERT_TRUE(Parse("kv:\n  calibrated_layers: auto\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.calibrated_layers, AutoSwitch::kAuto);
  s = Parse("kv:\n  calibrated_layers: maybe\n", &c);
  EXPECT_NE(s.message().find("kv.calibrated_layers"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'maybe' is not auto, true or false"), std::string::npos)
      << s.message();
  EXPECT_EQ(c.engine.kv.disk.summary_type, KeySummaryType::kQ8);
  EXPECT_EQ(c.engine.kv.disk.group_summary, AutoSwitch::kAuto);
  ASSERT_TRUE(Parse("kv:\n  group_summary: false\n", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.group_summary, AutoSwitch::kOff);
  s = Parse("kv:\n  group_summary: mean\n", &c);
  EXPECT_NE(s.message().find("kv.group_summary"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'mean' is not auto, true or false"), std::string::npos)
      << s.message();
  s = Parse("- a\n- b\n", &c);
  EXPECT_NE(s.message().find("top level must be a map"), std::string::npos) << s.message();
}

// One key from text (benchmarks' settings strings): the YAML loader's checks and names.
TEST(ConfigTest, SetConfigValueChecksLikeTheLoader) {
  Config c;
  ASSERT_TRUE(SetConfigValue("kv.group_size", "8", &c).ok());
  EXPECT_EQ(c.engine.kv.disk.group_size, 8);
  ASSERT_TRUE(SetConfigValue("kv.experimental.attend_tail", "false", &c).ok());
  EXPECT_FALSE(c.engine.kv.disk.attend_tail);
  Status s = SetConfigValue("kv.group_size", "99", &c);
  EXPECT_EQ(s.message(), "kv.group_size: 99 is out of range [0, 64]");
  EXPECT_EQ(c.engine.kv.disk.group_size, 8);
  s = SetConfigValue("kv.record_type", "q4", &c);
  EXPECT_NE(s.message().find("kv.record_type: unknown KV record type 'q4'"), std::string::npos)
      << s.message();
  s = SetConfigValue("kv.group_sise", "4", &c);
  EXPECT_EQ(s.message(), "unknown key 'kv.group_sise' (did you mean 'kv.group_size'?)");
}

TEST(ConfigTest, SyntaxErrorGivesLineAndColumn) {
  Config c;
  Status s = Parse("threads: 2\nsampling:\n  top_k: [1, 2\n", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("YAML syntax error"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("strata.yaml:"), std::string::npos) << s.message();
}

TEST(ConfigTest, WriterOutputParsesBackToTheSameConfig) {
  Config a;
  a.model = "/path/with: colon.gguf";
  a.engine.n_threads = 3;
  a.generate.stop = {"a\"b", "\n"};
  a.generate.sampling.top_p = 0.75f;
  a.generate.sampling.seed = 123456789;
  const std::string yaml = ConfigToYaml(a);
  Config b;
  Status s = Parse(yaml, &b);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << yaml;
  EXPECT_EQ(ConfigToYaml(b), yaml);
  EXPECT_EQ(b.model, a.model);
  EXPECT_EQ(b.generate.stop, a.generate.stop);
  // Every key is written, but the research settings only when one of them was changed.
  for (const std::string& key : ConfigKeys()) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    if (key.find(".experimental.") != std::string::npos)
      EXPECT_EQ(yaml.find("  " + leaf + ":"), std::string::npos) << key << " written at default";
    else
      EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key << " missing from the writer";
  }
  EXPECT_EQ(yaml.find("experimental:"), std::string::npos) << yaml;
  a.engine.kv.disk.resident_bonus = 0.5f;
  const std::string with = ConfigToYaml(a);
  EXPECT_NE(with.find("kv:\n"), std::string::npos) << with;
  EXPECT_NE(with.find("\n  experimental:\n    read_through_span: 1"), std::string::npos) << with;
  ASSERT_TRUE(Parse(with, &b).ok()) << with;
  EXPECT_EQ(b.engine.kv.disk.resident_bonus, 0.5f);
  EXPECT_EQ(ConfigToYaml(b), with);
  for (const std::string& key : ConfigKeys()) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(with.find(leaf + ":"), std::string::npos) << key << " missing from the writer";
  }
}

// The YAML text that sets one dotted key ("kv.policy") to a value.
std::string YamlFor(const std::string& key, const std::string& value) {
  const size_t dot = key.find('.');
  if (dot == std::string::npos) return key + ": " + value + "\n";
  return key.substr(0, dot) + ":\n  " + key.substr(dot + 1) + ": " + value + "\n";
}

// What `strata config --list` prints (and docs/config-reference.md shows) must be what the
// loader accepts: every key with its printed default, and every listed name of a choice.
TEST(ConfigTest, EveryListedKeyAcceptsItsPrintedDefault) {
  const std::vector<ConfigSettingInfo> settings = DescribeConfig();
  ASSERT_EQ(settings.size(), ConfigKeys().size());
  const std::string defaults_yaml = ConfigToYaml(Config{});
  for (const ConfigSettingInfo& s : settings) {
    EXPECT_FALSE(s.default_value.empty()) << s.key;
    EXPECT_FALSE(s.accepted.empty()) << s.key;
    EXPECT_FALSE(s.help.empty()) << s.key;
    EXPECT_EQ(s.help.find('\n'), std::string::npos) << s.key << ": help must be one line";
    Config c;
    Status st = Parse(YamlFor(s.key, s.default_value), &c);
    ASSERT_TRUE(st.ok()) << s.key << " = " << s.default_value << ": " << st.ToString();
    EXPECT_EQ(ConfigToYaml(c), defaults_yaml) << s.key << " = " << s.default_value;
  }
  // All of them in one file, each section opened once.
  std::string grouped, section;
  for (const ConfigSettingInfo& s : settings) {
    const size_t dot = s.key.find('.');
    const std::string sec = dot == std::string::npos ? "" : s.key.substr(0, dot);
    if (sec != section && !sec.empty()) grouped += sec + ":\n";
    section = sec;
    grouped += (sec.empty() ? s.key : "  " + s.key.substr(dot + 1)) + ": " + s.default_value + "\n";
  }
  Config c;
  Status st = Parse(grouped, &c);
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << grouped;
  EXPECT_EQ(ConfigToYaml(c), defaults_yaml);
}

TEST(ConfigTest, EveryListedChoiceIsAccepted) {
  int choices = 0;
  for (const ConfigSettingInfo& s : DescribeConfig()) {
    if (s.values.empty()) continue;
    ++choices;
    bool default_listed = false;
    for (const std::string& v : s.values) {
      Config c;
      Status st = Parse(YamlFor(s.key, v), &c);
      EXPECT_TRUE(st.ok()) << s.key << " = " << v << ": " << st.ToString();
      default_listed |= v == s.default_value;
    }
    EXPECT_TRUE(default_listed) << s.key << ": default " << s.default_value << " is not listed";
    Config c;
    EXPECT_FALSE(Parse(YamlFor(s.key, "no_such_value"), &c).ok()) << s.key;
  }
  EXPECT_GE(choices, 8);
}

TEST(ConfigTest, ListedRangesAreTheCheckedOnes) {
  std::map<std::string, ConfigSettingInfo> by_key;
  for (const ConfigSettingInfo& s : DescribeConfig()) by_key[s.key] = s;
  EXPECT_EQ(by_key["batch"].accepted, "[1, 8192]");
  EXPECT_EQ(by_key["context"].accepted, "[0, 2^24]");
  EXPECT_EQ(by_key["sampling.seed"].accepted, "[0, 2^63-1]");
  EXPECT_EQ(by_key["sampling.top_p"].accepted, "(0, 1]");
  EXPECT_EQ(by_key["kv.read_through"].accepted, "[-1, 2^20]");
  EXPECT_EQ(by_key["kv.policy"].default_value, "memory");
  EXPECT_EQ(by_key["kv.dir"].default_value, "\"/var/tmp\"");
  Config c;
  EXPECT_FALSE(Parse("context: 16777217\n", &c).ok());  // 2^24 + 1
  EXPECT_TRUE(Parse("context: 16777216\n", &c).ok());
}

constexpr char kTuned[] =
    "kv:\n  dir: /kv\ncontext: 8192\n"
    "tuned:\n"
    "  - batch: 1\n    context: 2048\n    settings: {kv.policy: memory}\n"
    "  - batch: 1\n    context: 8192\n"
    "    settings:\n      kv.policy: disk\n      kv: {group_size: 8, ratio: 4}\n"
    "    predicted_tokens_per_second: 50.5\n    measured_tokens_per_second: 48\n"
    "    ppl_loss: 0.021\n    agreement: 0.97\n"
    "  - batch: 8\n    context: 8192\n    settings: {kv.policy: disk, kv.budget_bytes: 1000000}\n"
    "provenance:\n  model_identity: 00ff\n  machine: \"cpu=x; cores=2\"\n  date: 2026-11-26\n";

TEST(ConfigTest, TunedEntriesApplyTheNearestOverTheSettings) {
  Config c;
  Status s = Parse(kTuned, &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(c.tuned.size(), 3u);
  EXPECT_EQ(c.tuned[1].context, 8192);
  EXPECT_EQ(c.tuned[1].line, 8);
  EXPECT_DOUBLE_EQ(c.tuned[1].predicted_tokens_per_second, 50.5);
  EXPECT_DOUBLE_EQ(c.tuned[1].agreement, 0.97);
  ASSERT_EQ(c.tuned[1].settings.size(), 3u);  // nested maps become dotted keys
  EXPECT_EQ(c.tuned[1].settings[1].first, "kv.group_size");
  EXPECT_EQ(c.provenance.model_identity, "00ff");
  EXPECT_EQ(c.provenance.machine, "cpu=x; cores=2");
  // Nothing is applied at load: the base settings are as written.
  EXPECT_EQ(c.engine.kv.policy, KvPolicyKind::kMemory);
  // Nearest in log2 of batch and context.
  EXPECT_EQ(NearestTuned(c, 1, 8192), &c.tuned[1]);
  EXPECT_EQ(NearestTuned(c, 1, 3000), &c.tuned[0]);
  EXPECT_EQ(NearestTuned(c, 6, 4096), &c.tuned[2]);
  EXPECT_EQ(NearestTuned(c, 1, 4096), &c.tuned[1]);  // a tie: the larger context
  Config d = c;
  ASSERT_TRUE(SelectTuned(1, 16384, &d).ok());
  EXPECT_EQ(d.engine.kv.policy, KvPolicyKind::kDisk);
  EXPECT_EQ(d.engine.kv.disk.group_size, 8);
  EXPECT_EQ(d.engine.kv.disk.ratio, 4);
  EXPECT_EQ(d.engine.kv.disk.dir, "/kv");  // what the entry does not set stays
  EXPECT_EQ(d.tuned_choice, "batch 1, context 8192 (strata.yaml:8)");
  d = c;
  ASSERT_TRUE(SelectTuned(16, 8192, &d).ok());
  EXPECT_EQ(d.engine.kv.disk.budget_bytes, 1000000);
  EXPECT_EQ(d.engine.kv.disk.group_size, 0);
  // Written and read back, entries and provenance are the same.
  Config back;
  s = Parse(ConfigToYaml(c), &back);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << ConfigToYaml(c);
  ASSERT_EQ(back.tuned.size(), c.tuned.size());
  for (size_t i = 0; i < c.tuned.size(); ++i) {
    EXPECT_EQ(back.tuned[i].batch, c.tuned[i].batch);
    EXPECT_EQ(back.tuned[i].context, c.tuned[i].context);
    EXPECT_EQ(back.tuned[i].settings, c.tuned[i].settings);
    EXPECT_DOUBLE_EQ(back.tuned[i].ppl_loss, c.tuned[i].ppl_loss);
  }
  EXPECT_EQ(back.provenance.machine, c.provenance.machine);
  EXPECT_EQ(back.provenance.date, c.provenance.date);
}

TEST(ConfigTest, BadTunedEntriesNameTheirLine) {
  struct Case {
    const char* yaml;
    const char* message;
  } cases[] = {
      {"tuned:\n  - batch: 1\n    context: 64\n    settings: {kv.group_sise: 4}\n",
       "strata.yaml:4: unknown key 'kv.group_sise' (did you mean 'kv.group_size'?)"},
      {"tuned:\n  - batch: 1\n    context: 64\n    settings: {kv.group_size: 99999}\n",
       "strata.yaml:4: kv.group_size: 99999 is out of range"},
      {"tuned:\n  - batch: 1\n    settings: {}\n", "strata.yaml:2: tuned: an entry needs both"},
      {"tuned:\n  - {batch: 1, context: 64}\n  - {batch: 1, context: 64}\n",
       "strata.yaml:3: tuned: a second entry for batch 1, context 64 (first on line 2)"},
      {"tuned:\n  - {batch: 0, context: 64}\n", "tuned.batch: 0 is out of range [1, 4096]"},
      {"tuned:\n  - {batch: 1, context: 64, speed: 3}\n", "tuned.speed: unknown key"},
      {"tuned:\n  - {batch: 1, context: 64, settings: {model: /x.gguf}}\n",
       "cannot change the model"},
      {"tuned: 3\n", "tuned: needs a list"},
      {"provenance:\n  owner: me\n", "strata.yaml:2: provenance.owner: unknown key"},
  };
  for (const Case& k : cases) {
    Config c;
    Status s = Parse(k.yaml, &c);
    EXPECT_FALSE(s.ok()) << k.yaml;
    EXPECT_NE(s.message().find(k.message), std::string::npos) << s.message();
    EXPECT_TRUE(c.tuned.empty());
  }
}

TEST(ConfigTest, MissingFileIsAnErrorNamingIt) {
  Config c;
  Status s = LoadConfigFile("/nonexistent/strata.yaml", &c);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/strata.yaml"), std::string::npos);
}

// ---- Bounded input ---------------------------------------------------------------------

TEST(ConfigTest, AliasesThatExpandBeyondTheLimitAreRefusedBeforeTheyAreRead) {
  // Ten levels of ten-fold aliases: 2 * 10^10 strings if expanded.
  std::string z = "x0: &x0 [\"xxxxxxxxxxxxxxxx\", \"xxxxxxxxxxxxxxxx\"]\n";
  for (int i = 1; i <= 10; ++i) {
    const std::string me = std::to_string(i), prev = std::to_string(i - 1);
    z.append("x").append(me).append(": &x").append(me).append(" [");
    for (int j = 0; j < 10; ++j) z.append(j ? ", *x" : "*x").append(prev);
    z.append("]\n");
  }
  Config c;
  const Status s = Parse(z + "generate:\n  stop: *x10\n", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("aliases"), std::string::npos) << s.ToString();
  EXPECT_TRUE(c.generate.stop.empty());
}

// One long string aliased thousands of times stays within the count of values but would
// expand to gigabytes of stop strings: the expansion's bytes are bounded too.
TEST(ConfigTest, ALongValueAliasedManyTimesIsRefusedBeforeItIsCopied) {
  const std::string head = "generate:\n  stop: [&a \"";
  const std::string aliases = [] {
    std::string a;
    for (int i = 0; i < 3000; ++i) a += ", *a";
    return a;
  }();
  const std::string tail = "]\n";
  // The whole document just fits the size limit; 3001 values are far below the count limit.
  const size_t value_bytes = kMaxConfigBytes - head.size() - 1 - aliases.size() - tail.size();
  const std::string doc = head + std::string(value_bytes, 'A') + "\"" + aliases + tail;
  ASSERT_LE(doc.size(), kMaxConfigBytes);
  ASSERT_LT(3001, kMaxConfigNodes);
  Config c;
  const Status s = Parse(doc, &c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.message().substr(0, 300);
  EXPECT_NE(s.message().find("strata.yaml"), std::string::npos) << s.message().substr(0, 300);
  EXPECT_NE(s.message().find(std::to_string(kMaxConfigExpandedBytes) + " bytes"), std::string::npos)
      << s.message().substr(0, 300);
  EXPECT_TRUE(c.generate.stop.empty());

  // A few aliases of short values are fine, and read as their values.
  const Status ok = Parse(
      "generate:\n  stop: [&nl \"\\n\\n\", &u \"User:\", *nl, *u]\n"
      "tuned:\n"
      "  - {batch: 1, context: 512, settings: &s {kv.group_size: 8}}\n"
      "  - {batch: 2, context: 512, settings: *s}\n",
      &c);
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  ASSERT_EQ(c.generate.stop.size(), 4u);
  EXPECT_EQ(c.generate.stop[2], "\n\n");
  EXPECT_EQ(c.generate.stop[3], "User:");
  ASSERT_EQ(c.tuned.size(), 2u);
  EXPECT_EQ(c.tuned[1].settings, c.tuned[0].settings);
}

TEST(ConfigTest, OversizedAndDeeplyNestedTextIsRefused) {
  Config c;
  std::string big(kMaxConfigBytes + 1, 'x');
  big[0] = '#';
  Status s = Parse(big, &c);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find(std::to_string(kMaxConfigBytes)), std::string::npos);
  s = Parse("threads: " + std::string(100000, '[') + std::string(100000, ']') + "\n", &c);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("nested"), std::string::npos) << s.ToString();
  // Brackets inside quotes and comments are text.
  EXPECT_TRUE(Parse("generate:\n  stop: [\"[[[[\", '{{{{']  # ]]]] [[[\n", &c).ok());
}

TEST(ConfigTest, AKeyGivenTwiceIsAnErrorNamingBothLines) {
  Config c;
  const Status s = Parse("threads: 2\nbatch: 64\nthreads: 4\n", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("strata.yaml:3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("threads"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("first on line 1"), std::string::npos) << s.ToString();
  EXPECT_FALSE(Parse("kv:\n  policy: disk\nkv:\n  policy: memory\n", &c).ok());
  EXPECT_FALSE(Parse("kv:\n  dir: /a\n  dir: /b\n", &c).ok());
}

TEST(ConfigTest, OnlyARegularFileIsAConfig) {
  Config c;
  for (const char* path : {"/dev/zero", "/tmp", "/dev/null"}) {
    const Status s = LoadConfigFile(path, &c);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s.ToString();
  }
  // A FIFO is refused at once, not waited on.
  const std::string fifo = ::testing::TempDir() + "strata_config_fifo_" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const Status s = LoadConfigFile(fifo, &c);
  unlink(fifo.c_str());
  EXPECT_NE(s.message().find("a FIFO"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace strata
