#include "runtime/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "common/file.h"
#include "platforms/cuda_device.h"

namespace strata {
namespace {

// Where a value came from, for error messages: "strata.yaml:12: kv.policy".
struct Where {
  const std::string& source;
  int line;
  const std::string& key;
  std::string str() const {
    return line > 0 ? source + ":" + std::to_string(line) + ": " + key : key;
  }
};

struct Setting {
  std::string key;
  std::string help;
  std::function<Status(const YAML::Node&, const Where&, Config*)> set;
  std::function<std::string(const Config&)> get;  // as YAML flow text
  std::string accepted;             // what set accepts, for people: "[1, 8192]", "a path"
  std::vector<std::string> values;  // the names a choice accepts (empty for other kinds)
};

// A range bound as people read it: 1 << 24 as 2^24, INT64_MAX as 2^63-1.
std::string Bound(int64_t v) {
  const uint64_t u = uint64_t(v);
  if (v >= 65536 && (u & (u - 1)) == 0) return "2^" + std::to_string(__builtin_ctzll(u));
  if (v >= (int64_t(1) << 31) && ((u + 1) & u) == 0)
    return "2^" + std::to_string(__builtin_ctzll(u + 1)) + "-1";
  return std::to_string(v);
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

template <class T>
using Field = std::function<T&(Config&)>;

std::string Quote(const std::string& s) {
  YAML::Emitter e;
  e << YAML::DoubleQuoted << s;
  return e.c_str();
}

Status Expect(const YAML::Node& n, const Where& w, const char* what) {
  if (!n.IsScalar())
    return Status::InvalidArgument(w.str() + ": expected " + what + ", got a " +
                                   (n.IsMap()        ? "map"
                                    : n.IsSequence() ? "list"
                                                     : "null value"));
  return Status::OK();
}

template <class T>
Setting Int(std::string key, std::string help, Field<T> f, int64_t lo, int64_t hi) {
  Setting s{std::move(key), std::move(help), nullptr, nullptr};
  s.accepted = "[" + Bound(lo) + ", " + Bound(hi) + "]";
  s.set = [f, lo, hi](const YAML::Node& n, const Where& w, Config* c) -> Status {
    STRATA_RETURN_IF_ERROR(Expect(n, w, "an integer"));
    int64_t v;
    if (!YAML::convert<int64_t>::decode(n, v))
      return Status::InvalidArgument(w.str() + ": '" + n.Scalar() + "' is not an integer");
    if (v < lo || v > hi)
      return Status::OutOfRange(w.str() + ": " + std::to_string(v) + " is out of range [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
    f(*c) = T(v);
    return Status::OK();
  };
  s.get = [f](const Config& c) { return std::to_string(f(const_cast<Config&>(c))); };
  return s;
}

Setting Float(std::string key, std::string help, Field<float> f, double lo, double hi,
              bool lo_open = false) {
  Setting s{std::move(key), std::move(help), nullptr, nullptr};
  std::ostringstream range;
  range << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
  s.accepted = range.str();
  s.set = [f, lo, hi, lo_open, range = s.accepted](const YAML::Node& n, const Where& w,
                                                   Config* c) -> Status {
    STRATA_RETURN_IF_ERROR(Expect(n, w, "a number"));
    double v;
    if (!YAML::convert<double>::decode(n, v) || !std::isfinite(v))
      return Status::InvalidArgument(w.str() + ": '" + n.Scalar() + "' is not a finite number");
    if (v < lo || v > hi || (lo_open && v == lo))
      return Status::OutOfRange(w.str() + ": " + n.Scalar() + " is out of range " + range);
    f(*c) = float(v);
    return Status::OK();
  };
  s.get = [f](const Config& c) {
    std::ostringstream o;
    o << f(const_cast<Config&>(c));
    return o.str();
  };
  return s;
}

Setting Bool(std::string key, std::string help, Field<bool> f) {
  Setting s{std::move(key), std::move(help), nullptr, nullptr};
  s.accepted = "true, false";
  s.set = [f](const YAML::Node& n, const Where& w, Config* c) -> Status {
    STRATA_RETURN_IF_ERROR(Expect(n, w, "true or false"));
    bool v;
    if (!YAML::convert<bool>::decode(n, v))
      return Status::InvalidArgument(w.str() + ": '" + n.Scalar() + "' is not true or false");
    f(*c) = v;
    return Status::OK();
  };
  s.get = [f](const Config& c) {
    return std::string(f(const_cast<Config&>(c)) ? "true" : "false");
  };
  return s;
}

Setting String(std::string key, std::string help, Field<std::string> f) {
  Setting s{std::move(key), std::move(help), nullptr, nullptr};
  s.accepted = "a string";
  s.set = [f](const YAML::Node& n, const Where& w, Config* c) -> Status {
    STRATA_RETURN_IF_ERROR(Expect(n, w, "a string"));
    f(*c) = n.Scalar();
    return Status::OK();
  };
  s.get = [f](const Config& c) { return Quote(f(const_cast<Config&>(c))); };
  return s;
}

Setting StringList(std::string key, std::string help, Field<std::vector<std::string>> f) {
  Setting s{std::move(key), std::move(help), nullptr, nullptr};
  s.accepted = "a list of strings";
  s.set = [f](const YAML::Node& n, const Where& w, Config* c) -> Status {
    if (!n.IsSequence()) return Status::InvalidArgument(w.str() + ": expected a list of strings");
    std::vector<std::string> v;
    for (const YAML::Node& e : n) {
      if (!e.IsScalar())
        return Status::InvalidArgument(w.str() + ": every list entry must be a string");
      v.push_back(e.Scalar());
    }
    f(*c) = std::move(v);
    return Status::OK();
  };
  s.get = [f](const Config& c) {
    std::string out = "[";
    for (const std::string& e : f(const_cast<Config&>(c))) {
      if (out.size() > 1) out += ", ";
      out += Quote(e);
    }
    return out + "]";
  };
  return s;
}

// The schema: every key, its default (from the structs' initializers) and its range.
const std::vector<Setting>& Schema() {
  static const std::vector<Setting> schema = [] {
    std::vector<Setting> v;
    v.push_back(String("model", "path of the GGUF model file",
                       [](Config& c) -> std::string& { return c.model; }));
    v.push_back(Int<int32_t>(
        "threads", "worker threads, 0 = one per core",
        [](Config& c) -> int32_t& { return c.engine.n_threads; }, 0, 1024));
    v.push_back(Int<int32_t>(
        "context", "context length in tokens, 0 = the model's",
        [](Config& c) -> int32_t& { return c.engine.n_ctx; }, 0, 1 << 24));
    v.push_back(Int<int32_t>(
        "batch", "most tokens per forward pass (prefill chunk)",
        [](Config& c) -> int32_t& { return c.engine.n_batch; }, 1, 8192));
    v.push_back(Int<int32_t>(
        "max_sequences", "sequences decoded together at most",
        [](Config& c) -> int32_t& { return c.engine.max_sequences; }, 1, 4096));
    v.push_back(Bool("repack_weights",
                     "CPU: multiply Q4_0, Q4_1, Q8_0, Q4_K and Q6_K matrices from a copy laid "
                     "out for the kernels (AVX-512): the same results up to float rounding, "
                     "faster prefill and batched decode; false reads them in place from the "
                     "file, where the kernel may evict them under memory pressure",
                     [](Config& c) -> bool& { return c.engine.repack_weights; }));
    v.push_back(Int<int32_t>(
        "generate.max_tokens", "new tokens at most, 0 = until context full",
        [](Config& c) -> int32_t& { return c.generate.max_tokens; }, 0, 1 << 24));
    v.push_back(StringList("generate.stop", "strings that end generation",
                           [](Config& c) -> std::vector<std::string>& { return c.generate.stop; }));
    v.push_back(Bool("generate.ignore_eos", "keep generating after end-of-generation tokens",
                     [](Config& c) -> bool& { return c.generate.ignore_eos; }));
    auto sp = [](Config& c) -> SamplingParams& { return c.generate.sampling; };
    v.push_back(Float(
        "sampling.temperature", "softmax temperature, 0 = greedy (the most likely token)",
        [sp](Config& c) -> float& { return sp(c).temperature; }, 0, 100));
    v.push_back(Int<int32_t>(
        "sampling.top_k", "keep the k most likely tokens, 0 = off",
        [sp](Config& c) -> int32_t& { return sp(c).top_k; }, 0, 1 << 24));
    v.push_back(Float(
        "sampling.top_p", "keep the most likely tokens that make up this probability, 1 = off",
        [sp](Config& c) -> float& { return sp(c).top_p; }, 0, 1, true));
    v.push_back(Float(
        "sampling.min_p", "drop tokens less likely than min_p times the best one, 0 = off",
        [sp](Config& c) -> float& { return sp(c).min_p; }, 0, 0.999999));
    v.push_back(Float(
        "sampling.repeat_penalty",
        "divides (scales down) the logits of recently seen tokens, 1 = off",
        [sp](Config& c) -> float& { return sp(c).repeat_penalty; }, 0, 10, true));
    v.push_back(Int<int32_t>(
        "sampling.repeat_last_n", "tokens the penalty looks back",
        [sp](Config& c) -> int32_t& { return sp(c).repeat_last_n; }, 0, 1 << 24));
    v.push_back(Int<uint64_t>(
        "sampling.seed", "seed of the sampler's random generator",
        [sp](Config& c) -> uint64_t& { return sp(c).seed; }, 0, INT64_MAX));
    Setting device{"device", "where the forward pass runs (cuda = cuda:0)", nullptr, nullptr};
    device.accepted = "cpu, cuda, cuda:N";
    device.set = [](const YAML::Node& n, const Where& w, Config* c) -> Status {
      STRATA_RETURN_IF_ERROR(Expect(n, w, "a device name"));
      Status s = ParseComputeDevice(n.Scalar(), &c->engine.cuda_device);
      return s.ok() ? s : Status::InvalidArgument(w.str() + ": " + s.message());
    };
    device.get = [](const Config& c) { return ComputeDeviceName(c.engine.cuda_device); };
    v.push_back(std::move(device));
    Setting gpu_weights{"gpu.weights",
                        "where a GPU reads the weights: auto (mapped on an integrated GPU), "
                        "device (a copy in GPU memory), mapped (in place, from the model file)",
                        nullptr, nullptr};
    gpu_weights.values = {"auto", "device", "mapped"};
    gpu_weights.accepted = Join(gpu_weights.values);
    gpu_weights.set = [](const YAML::Node& n, const Where& w, Config* c) -> Status {
      STRATA_RETURN_IF_ERROR(Expect(n, w, "a placement"));
      Status s = ParseGpuWeights(n.Scalar(), &c->engine.gpu.weights);
      return s.ok() ? s : Status::InvalidArgument(w.str() + ": " + s.message());
    };
    gpu_weights.get = [](const Config& c) {
      return std::string(GpuWeightsName(c.engine.gpu.weights));
    };
    v.push_back(std::move(gpu_weights));
    v.push_back(Bool("gpu.graphs", "capture a GPU decode step once and replay it",
                     [](Config& c) -> bool& { return c.engine.gpu.graphs; }));
    Setting kv_policy{"kv.policy",
                      "where KV lives: memory (all of it in RAM), disk (on disk, a budget in "
                      "memory)",
                      nullptr, nullptr};
    kv_policy.values = {"memory", "disk"};
    kv_policy.accepted = Join(kv_policy.values);
    kv_policy.set = [](const YAML::Node& n, const Where& w, Config* c) -> Status {
      STRATA_RETURN_IF_ERROR(Expect(n, w, "a policy name"));
      Status s = ParseKvPolicyKind(n.Scalar(), &c->engine.kv.policy);
      return s.ok() ? s : Status::InvalidArgument(w.str() + ": " + s.message());
    };
    kv_policy.get = [](const Config& c) {
      return std::string(KvPolicyKindName(c.engine.kv.policy));
    };
    v.push_back(std::move(kv_policy));
    // The disk-backed sparse policy (kv.policy: disk); see runtime/kv/kv_options.h.
    auto dk = [](Config& c) -> DiskKvOptions& { return c.engine.kv.disk; };
    v.push_back(String("kv.dir", "directory of the disk KV store file",
                       [dk](Config& c) -> std::string& { return dk(c).dir; }));
    v.push_back(String("kv.adapters", "adapters file from strata calibrate, \"\" = MODEL.adapters",
                       [dk](Config& c) -> std::string& { return dk(c).adapters; }));
    v.push_back(Int<int32_t>(
        "kv.group_size",
        "G: tokens per group record, 0 = the G in 4..8 that fills the store's blocks best",
        [dk](Config& c) -> int32_t& { return dk(c).group_size; }, 0, 64));
    v.push_back(Int<int32_t>(
        "kv.ratio",
        "sigma: key summary compression (adapters must hold it), 0 = the smallest whose "
        "summary takes at most half the budget",
        [dk](Config& c) -> int32_t& { return dk(c).ratio; }, 0, 4096));
    v.push_back(Int<int32_t>(
        "kv.groups_per_step", "M: groups selected per layer and step, 0 = C + T (every slot)",
        [dk](Config& c) -> int32_t& { return dk(c).groups_per_step; }, 0, 1 << 20));
    v.push_back(Int<int32_t>(
        "kv.reuse_slots", "C: loaded groups kept per layer, 0 = what the budget allows",
        [dk](Config& c) -> int32_t& { return dk(c).reuse_slots; }, 0, 1 << 20));
    v.push_back(Int<int32_t>(
        "kv.read_through",
        "T: groups a layer may read past its C slots, dropped after the layer runs; -1 = auto",
        [dk](Config& c) -> int32_t& { return dk(c).read_through; }, -1, 1 << 20));
    v.push_back(Int<int32_t>(
        "kv.experimental.read_through_span",
        "groups of a read-through span, each span one request (1 = single groups)",
        [dk](Config& c) -> int32_t& { return dk(c).read_through_span; }, 1, 256));
    v.push_back(Int<int64_t>(
        "kv.budget_bytes", "KV memory per sequence, 0 = 1/13 of the full F16 cache at the context",
        [dk](Config& c) -> int64_t& { return dk(c).budget_bytes; }, 0, int64_t(1) << 50));
    v.push_back(Int<int32_t>(
        "kv.experimental.sink_groups", "leading groups always resident",
        [dk](Config& c) -> int32_t& { return dk(c).sink_groups; }, 0, 64));
    v.push_back(Int<int32_t>(
        "kv.experimental.recent_groups", "newest full groups always resident",
        [dk](Config& c) -> int32_t& { return dk(c).recent_groups; }, 0, 64));
    v.push_back(Float(
        "kv.experimental.resident_bonus", "selection's preference for groups in memory, 0 = off",
        [dk](Config& c) -> float& { return dk(c).resident_bonus; }, 0, 100));
    v.push_back(Float(
        "kv.experimental.dispersed_bonus",
        "resident bonus of layers with dispersed attention (profile), -1 = "
        "kv.experimental.resident_bonus",
        [dk](Config& c) -> float& { return dk(c).dispersed_bonus; }, -1, 100));
    v.push_back(Float(
        "kv.experimental.tail_weight",
        "weight of the left-out keys' estimated share (kv.experimental.attend_tail)",
        [dk](Config& c) -> float& { return dk(c).tail_weight; }, 0, 1));
    v.push_back(Int<int32_t>(
        "kv.experimental.tail_first_layer",
        "first layer whose left-out keys are attended by estimate",
        [dk](Config& c) -> int32_t& { return dk(c).tail_first_layer; }, 0, 1 << 16));
    v.push_back(Float(
        "kv.experimental.group_spread",
        "weight of a group's key spread in its score with a per-group summary (0: mean key)",
        [dk](Config& c) -> float& { return dk(c).group_spread; }, 0, 4));
    auto choice = [](std::string key, std::string help, std::vector<std::string> values, auto parse,
                     auto name) {
      Setting s{std::move(key), std::move(help), nullptr, nullptr};
      s.values = std::move(values);
      s.accepted = Join(s.values);
      s.set = [parse](const YAML::Node& n, const Where& w, Config* c) -> Status {
        STRATA_RETURN_IF_ERROR(Expect(n, w, "a name"));
        Status st = parse(n.Scalar(), c);
        return st.ok() ? st : Status::InvalidArgument(w.str() + ": " + st.message());
      };
      s.get = [name](const Config& c) { return std::string(name(c)); };
      return s;
    };
    v.push_back(choice(
        "kv.experimental.reuse", "which loaded group a full reuse buffer gives up",
        {"fifo", "lru", "lfu"},
        [](const std::string& n, Config* c) {
          return ParseReusePolicy(n, &c->engine.kv.disk.reuse);
        },
        [](const Config& c) { return ReusePolicyName(c.engine.kv.disk.reuse); }));
    v.push_back(choice(
        "kv.record_type", "how group records store K and V (auto: q8_0 where heads allow)",
        {"auto", "f16", "q8_0"},
        [](const std::string& n, Config* c) {
          return ParseKvRecordType(n, &c->engine.kv.disk.record_type);
        },
        [](const Config& c) { return KvRecordTypeName(c.engine.kv.disk.record_type); }));
    v.push_back(choice(
        "kv.experimental.summary_type", "how the low-rank key summary stores values",
        {"f16", "q8", "q4"},
        [](const std::string& n, Config* c) {
          return ParseKeySummaryType(n, &c->engine.kv.disk.summary_type);
        },
        [](const Config& c) { return KeySummaryTypeName(c.engine.kv.disk.summary_type); }));
    v.push_back(choice(
        "kv.group_summary",
        "one key-summary row per group (its mean key) instead of per token (auto: at tight "
        "budgets)",
        {"auto", "true", "false"},
        [](const std::string& n, Config* c) {
          return ParseAutoSwitch(n, &c->engine.kv.disk.group_summary);
        },
        [](const Config& c) { return AutoSwitchName(c.engine.kv.disk.group_summary); }));
    v.push_back(choice(
        "kv.experimental.scoring", "how heads' scores combine into a group's", {"softmax", "sum"},
        [](const std::string& n, Config* c) {
          return ParseGroupScoring(n, &c->engine.kv.disk.scoring);
        },
        [](const Config& c) { return GroupScoringName(c.engine.kv.disk.scoring); }));
    v.push_back(choice(
        "kv.backend", "block store backend (auto: io_uring, else the pread pool)",
        {"auto", "io_uring", "pread"},
        [](const std::string& n, Config* c) {
          if (n != "auto" && n != "io_uring" && n != "pread")
            return Status::InvalidArgument("'" + n +
                                           "' is not a backend (accepted: auto, io_uring, pread)");
          c->engine.kv.disk.backend = n;
          return Status::OK();
        },
        [](const Config& c) { return c.engine.kv.disk.backend.c_str(); }));
    v.push_back(Int<int32_t>(
        "kv.queue_depth", "most reads in the block store at once",
        [dk](Config& c) -> int32_t& { return dk(c).queue_depth; }, 1, 4096));
    v.push_back(Bool("kv.experimental.refine", "re-select each layer's groups from its exact query",
                     [dk](Config& c) -> bool& { return dk(c).refine; }));
    v.push_back(choice(
        "kv.calibrated_layers",
        "spread M and C over layers by the adapters' attention profile (auto: at tight "
        "budgets)",
        {"auto", "true", "false"},
        [](const std::string& n, Config* c) {
          return ParseAutoSwitch(n, &c->engine.kv.disk.calibrated_layers);
        },
        [](const Config& c) { return AutoSwitchName(c.engine.kv.disk.calibrated_layers); }));
    v.push_back(Bool("kv.experimental.attend_tail",
                     "attention gives the keys the selection left out their estimated share",
                     [dk](Config& c) -> bool& { return dk(c).attend_tail; }));
    v.push_back(Bool("kv.experimental.attend_resident",
                     "attention also reads groups the reuse buffer holds from earlier steps",
                     [dk](Config& c) -> bool& { return dk(c).attend_resident; }));
    v.push_back(Bool("kv.experimental.reload_all",
                     "every step reads each layer's whole KV back (a FlexGen-style baseline)",
                     [dk](Config& c) -> bool& { return dk(c).reload_all; }));
    v.push_back(
        Bool("kv.emulate_emmc",
             "cap the KV store at eMMC speed (250 MB/s, 11000 IOPS), to study a slow device",
             [dk](Config& c) -> bool& { return dk(c).emulate_emmc; }));
    // Research settings neither the defaults nor the tuner change come last, in a section
    // of their own (kv.experimental), so that a user's kv: section is what a user decides.
    std::stable_partition(v.begin(), v.end(), [](const Setting& s) {
      return s.key.find(".experimental.") == std::string::npos;
    });
    return v;
  }();
  return schema;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> d(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = d[0];
    d[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cur = d[j];
      d[j] = std::min({d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return d[b.size()];
}

Status UnknownKey(const std::string& key, const Where& w) {
  std::string best;
  size_t best_d = 4;  // suggest only close matches
  for (const Setting& s : Schema()) {
    size_t d = EditDistance(key, s.key);
    if (d < best_d) best_d = d, best = s.key;
  }
  std::string msg = (w.line > 0 ? w.source + ":" + std::to_string(w.line) + ": " : std::string()) +
                    "unknown key '" + key + "'";
  if (!best.empty()) msg += " (did you mean '" + best + "'?)";
  return Status::InvalidArgument(msg);
}

bool IsSection(const std::string& prefix) {
  for (const Setting& s : Schema())
    if (s.key.rfind(prefix + ".", 0) == 0) return true;
  return false;
}

// What the walk that reads a document may meet, aliases expanded: nodes and scalar bytes.
struct Expansion {
  int64_t nodes;
  int64_t bytes;
};

// Walks n as the reader will, an alias as often as it is referenced, taking each node and its
// scalar's bytes off `left`: false as soon as either runs out. Aliases share one node in the
// parsed tree, so this walk copies nothing; the reader copies every scalar it meets.
bool WithinExpansion(const YAML::Node& n, Expansion* left) {
  if (--left->nodes < 0) return false;
  if (n.IsScalar()) {
    left->bytes -= int64_t(n.Scalar().size());
    return left->bytes >= 0;
  }
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      if (!WithinExpansion(it->first, left) || !WithinExpansion(it->second, left)) return false;
  } else if (n.IsSequence()) {
    for (const YAML::Node& e : n)
      if (!WithinExpansion(e, left)) return false;
  }
  return true;
}

// The deepest nesting of flow collections ([...] and {...}) outside quoted scalars: the YAML
// parser recurses on each level.
int FlowDepth(std::string_view text) {
  int depth = 0, most = 0;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (comment) {
      comment = c != '\n';
      continue;
    }
    if (quote) {
      if (c == quote && (quote == '\'' || i == 0 || text[i - 1] != '\\')) quote = 0;
      continue;
    }
    if (c == '#')
      comment = true;
    else if (c == '"' || c == '\'')
      quote = c;
    else if (c == '[' || c == '{')
      most = std::max(most, ++depth);
    else if ((c == ']' || c == '}') && depth > 0)
      --depth;
  }
  return most;
}

const Setting* FindSetting(const std::string& key) {
  const auto& schema = Schema();
  auto s =
      std::find_if(schema.begin(), schema.end(), [&](const Setting& x) { return x.key == key; });
  return s == schema.end() ? nullptr : &*s;
}

// A tuned entry's settings, nested maps flattened to dotted keys; each is checked against
// the schema on a scratch config so a bad value fails at load with its line.
Status FlattenSettings(const YAML::Node& map, const std::string& prefix, const std::string& source,
                       Config* scratch, std::vector<std::pair<std::string, std::string>>* out) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const Where w{source, it->first.Mark().line + 1, key};
    const YAML::Node value = it->second;
    if (value.IsMap()) {
      STRATA_RETURN_IF_ERROR(FlattenSettings(value, key, source, scratch, out));
      continue;
    }
    const Setting* s = FindSetting(key);
    if (!s) return UnknownKey(key, w);
    if (key == "model")
      return Status::InvalidArgument(w.str() + ": a tuned entry cannot change the model");
    STRATA_RETURN_IF_ERROR(s->set(value, w, scratch));
    for (const auto& [k, v] : *out)
      if (k == key) return Status::InvalidArgument(w.str() + ": given twice in this entry");
    out->emplace_back(key, value.Scalar());
  }
  return Status::OK();
}

Status ParseTuned(const YAML::Node& list, const Where& w, Config* cfg) {
  if (list.IsNull()) return Status::OK();
  if (!list.IsSequence())
    return Status::InvalidArgument(w.str() +
                                   ": needs a list of entries (batch, context, settings)");
  std::vector<TunedEntry> entries;
  for (const YAML::Node& e : list) {
    const Where at{w.source, e.Mark().line + 1, "tuned"};
    if (!e.IsMap())
      return Status::InvalidArgument(at.str() + ": an entry needs batch, context and settings");
    TunedEntry t;
    t.line = at.line;
    bool has_batch = false, has_context = false;
    for (auto it = e.begin(); it != e.end(); ++it) {
      const std::string name = it->first.Scalar();
      const Where f{w.source, it->first.Mark().line + 1, "tuned." + name};
      const YAML::Node v = it->second;
      auto number = [&](double lo, double hi, double* out) -> Status {
        STRATA_RETURN_IF_ERROR(Expect(v, f, "a number"));
        double x;
        if (!YAML::convert<double>::decode(v, x) || !std::isfinite(x))
          return Status::InvalidArgument(f.str() + ": '" + v.Scalar() + "' is not a number");
        if (x < lo || x > hi)
          return Status::OutOfRange(f.str() + ": " + v.Scalar() + " is out of range [" +
                                    Bound(int64_t(lo)) + ", " + Bound(int64_t(hi)) + "]");
        *out = x;
        return Status::OK();
      };
      double x = 0;
      if (name == "batch" || name == "context") {
        STRATA_RETURN_IF_ERROR(number(1, name == "batch" ? 4096 : double(1 << 24), &x));
        if (x != std::floor(x))
          return Status::InvalidArgument(f.str() + ": '" + v.Scalar() + "' is not an integer");
        (name == "batch" ? t.batch : t.context) = int32_t(x);
        (name == "batch" ? has_batch : has_context) = true;
      } else if (name == "settings") {
        if (!v.IsMap() && !v.IsNull())
          return Status::InvalidArgument(f.str() + ": needs a map of settings");
        Config scratch = *cfg;
        if (v.IsMap())
          STRATA_RETURN_IF_ERROR(FlattenSettings(v, "", w.source, &scratch, &t.settings));
      } else if (name == "predicted_tokens_per_second") {
        STRATA_RETURN_IF_ERROR(number(0, 1e12, &t.predicted_tokens_per_second));
      } else if (name == "measured_tokens_per_second") {
        STRATA_RETURN_IF_ERROR(number(0, 1e12, &t.measured_tokens_per_second));
      } else if (name == "ppl_loss") {
        STRATA_RETURN_IF_ERROR(number(-1, 1e6, &t.ppl_loss));
      } else if (name == "agreement") {
        STRATA_RETURN_IF_ERROR(number(0, 1, &t.agreement));
      } else {
        return Status::InvalidArgument(f.str() +
                                       ": unknown key in a tuned entry (batch, context, "
                                       "settings, predicted_tokens_per_second, "
                                       "measured_tokens_per_second, ppl_loss, agreement)");
      }
    }
    if (!has_batch || !has_context)
      return Status::InvalidArgument(at.str() + ": an entry needs both batch and context");
    for (const TunedEntry& o : entries)
      if (o.batch == t.batch && o.context == t.context)
        return Status::InvalidArgument(
            at.str() + ": a second entry for batch " + std::to_string(t.batch) + ", context " +
            std::to_string(t.context) + " (first on line " + std::to_string(o.line) + ")");
    entries.push_back(std::move(t));
  }
  cfg->tuned = std::move(entries);
  return Status::OK();
}

Status ParseProvenance(const YAML::Node& map, const Where& w, TuneProvenance* p) {
  if (map.IsNull()) return Status::OK();
  if (!map.IsMap()) return Status::InvalidArgument(w.str() + ": needs a map");
  const std::vector<std::pair<const char*, std::string*>> fields = {
      {"model_identity", &p->model_identity},
      {"model_path", &p->model_path},
      {"machine", &p->machine},
      {"strata_version", &p->strata_version},
      {"date", &p->date},
      {"command", &p->command},
      {"read_curve", &p->read_curve}};
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string name = it->first.Scalar();
    const Where f{w.source, it->first.Mark().line + 1, "provenance." + name};
    auto field =
        std::find_if(fields.begin(), fields.end(), [&](const auto& x) { return name == x.first; });
    if (field == fields.end())
      return Status::InvalidArgument(f.str() + ": unknown key in provenance");
    STRATA_RETURN_IF_ERROR(Expect(it->second, f, "a string"));
    *field->second = it->second.Scalar();
  }
  return Status::OK();
}

Status Walk(const YAML::Node& map, const std::string& prefix, const std::string& source,
            Config* cfg) {
  std::map<std::string, int> seen;  // key -> line, to refuse a key given twice
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const Where w{source, it->first.Mark().line + 1, key};
    const auto [first, fresh] = seen.emplace(name, w.line);
    if (!fresh)
      return Status::InvalidArgument(w.str() + ": given twice (first on line " +
                                     std::to_string(first->second) + ")");
    const YAML::Node value = it->second;  // a copy: the iterator yields temporaries
    if (key == "tuned") {
      STRATA_RETURN_IF_ERROR(ParseTuned(value, w, cfg));
      continue;
    }
    if (key == "provenance") {
      STRATA_RETURN_IF_ERROR(ParseProvenance(value, w, &cfg->provenance));
      continue;
    }
    if (IsSection(key)) {
      if (value.IsNull()) continue;  // an empty section keeps the defaults
      if (!value.IsMap())
        return Status::InvalidArgument(w.str() + ": is a section and needs a map of settings");
      STRATA_RETURN_IF_ERROR(Walk(value, key, source, cfg));
      continue;
    }
    const auto& schema = Schema();
    auto s =
        std::find_if(schema.begin(), schema.end(), [&](const Setting& x) { return x.key == key; });
    if (s == schema.end()) return UnknownKey(key, w);
    STRATA_RETURN_IF_ERROR(s->set(value, w, cfg));
  }
  return Status::OK();
}

}  // namespace

Status ParseConfig(std::string_view yaml_text, const std::string& source, Config* cfg) {
  if (yaml_text.size() > kMaxConfigBytes)
    return Status::ResourceExhausted(source + ": " + std::to_string(yaml_text.size()) +
                                     " bytes; a config is at most " +
                                     std::to_string(kMaxConfigBytes));
  if (const int depth = FlowDepth(yaml_text); depth > kMaxConfigDepth)
    return Status::InvalidArgument(source + ": collections nested " + std::to_string(depth) +
                                   " deep; the limit is " + std::to_string(kMaxConfigDepth));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                                   std::to_string(e.mark.column + 1) +
                                   ": YAML syntax error: " + e.msg);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(source + ": cannot be read as YAML (" + e.what() + ")");
  }
  if (root.IsNull()) return Status::OK();
  if (!root.IsMap())
    return Status::InvalidArgument(source + ": the top level must be a map of settings");
  // Aliases share nodes while parsed but expand when read: a small file can stand for
  // billions of values, or for one long string repeated until it fills memory. The walk below
  // copies every node it reads, so the expansion is bounded first, in values and in bytes.
  Expansion left{kMaxConfigNodes, kMaxConfigExpandedBytes};
  if (!WithinExpansion(root, &left)) {
    if (left.nodes < 0)
      return Status::ResourceExhausted(source + ": expands to more than " +
                                       std::to_string(kMaxConfigNodes) +
                                       " values, the limit (YAML aliases repeating a large node?)");
    return Status::ResourceExhausted(source + ": its values expand to more than " +
                                     std::to_string(kMaxConfigExpandedBytes) +
                                     " bytes, the limit (YAML aliases repeating a long value?)");
  }
  Config c = *cfg;  // all or nothing: *cfg changes only if every setting is valid
  try {
    STRATA_RETURN_IF_ERROR(Walk(root, "", source, &c));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  c.source = source;
  *cfg = std::move(c);
  return Status::OK();
}

Status LoadConfigFile(const std::string& path, Config* cfg) {
  std::string text;
  STRATA_RETURN_IF_ERROR(ReadRegularFile(path, "config file", kMaxConfigBytes, &text));
  return ParseConfig(text, path, cfg);
}

std::string ConfigToYaml(const Config& cfg) {
  std::string out = "# strata.yaml: every key with its value; see docs/config-reference.md\n";
  // Experimental settings are written only when one of them is not at its default.
  const Config defaults;
  bool experimental = false;
  for (const Setting& s : Schema())
    if (s.key.find(".experimental.") != std::string::npos && s.get(cfg) != s.get(defaults))
      experimental = true;
  std::vector<std::string> open;  // the sections written last, outermost first
  for (const Setting& s : Schema()) {
    if (!experimental && s.key.find(".experimental.") != std::string::npos) continue;
    std::vector<std::string> path;
    size_t from = 0;
    for (size_t dot; (dot = s.key.find('.', from)) != std::string::npos; from = dot + 1)
      path.push_back(s.key.substr(from, dot - from));
    const std::string leaf = s.key.substr(from);
    size_t same = 0;
    while (same < path.size() && same < open.size() && path[same] == open[same]) ++same;
    for (size_t i = same; i < path.size(); ++i) {
      if (path[i] == "experimental")
        out += std::string(2 * i, ' ') +
               "# Research settings: neither the defaults nor strata tune change them.\n";
      out += std::string(2 * i, ' ') + path[i] + ":\n";
    }
    open = path;
    out += std::string(2 * path.size(), ' ') + leaf + ": " + s.get(cfg) + "  # " + s.help + "\n";
  }
  if (!cfg.tuned.empty()) {
    out += "# Per (batch, context), applied at start-up over the settings above (nearest entry):\n";
    out += "tuned:\n";
    for (const TunedEntry& t : cfg.tuned) {
      out += "  - batch: " + std::to_string(t.batch) + "\n";
      out += "    context: " + std::to_string(t.context) + "\n";
      out += "    settings:";
      if (t.settings.empty()) out += " {}";
      out += "\n";
      for (const auto& [k, v] : t.settings) out += "      " + k + ": " + Quote(v) + "\n";
      auto num = [](double x) {
        std::ostringstream ss;
        ss.precision(6);
        ss << x;
        return ss.str();
      };
      out += "    predicted_tokens_per_second: " + num(t.predicted_tokens_per_second) + "\n";
      out += "    measured_tokens_per_second: " + num(t.measured_tokens_per_second) + "\n";
      out += "    ppl_loss: " + num(t.ppl_loss) + "\n";
      out += "    agreement: " + num(t.agreement) + "\n";
    }
  }
  const TuneProvenance& p = cfg.provenance;
  if (!p.model_identity.empty() || !p.machine.empty()) {
    out += "provenance:\n";
    const std::vector<std::pair<const char*, const std::string*>> fields = {
        {"model_identity", &p.model_identity},
        {"model_path", &p.model_path},
        {"machine", &p.machine},
        {"strata_version", &p.strata_version},
        {"date", &p.date},
        {"command", &p.command},
        {"read_curve", &p.read_curve}};
    for (const auto& [k, v] : fields)
      if (!v->empty()) out += std::string("  ") + k + ": " + Quote(*v) + "\n";
  }
  return out;
}

const TunedEntry* NearestTuned(const Config& cfg, int32_t batch, int32_t context) {
  const TunedEntry* best = nullptr;
  double best_d = 0;
  for (const TunedEntry& t : cfg.tuned) {
    const double d = std::fabs(std::log2(double(std::max(batch, 1)) / t.batch)) +
                     std::fabs(std::log2(double(std::max(context, 1)) / t.context));
    if (!best || d < best_d - 1e-9 ||
        (std::fabs(d - best_d) <= 1e-9 && t.context > best->context)) {
      best = &t;
      best_d = d;
    }
  }
  return best;
}

Status SelectTuned(int32_t batch, int32_t context, Config* cfg) {
  const TunedEntry* t = NearestTuned(*cfg, batch, context);
  if (!t) return Status::OK();
  Config c = *cfg;
  for (const auto& [key, value] : t->settings) {
    const Setting* s = FindSetting(key);
    const Where w{cfg->source, t->line, key};
    if (!s) return UnknownKey(key, w);
    STRATA_RETURN_IF_ERROR(s->set(YAML::Node(value), w, &c));
  }
  c.tuned_choice = "batch " + std::to_string(t->batch) + ", context " + std::to_string(t->context) +
                   " (" + cfg->source + ":" + std::to_string(t->line) + ")";
  *cfg = std::move(c);
  return Status::OK();
}

Status SetConfigValue(const std::string& key, const std::string& value, Config* cfg) {
  const Setting* s = FindSetting(key);
  const std::string none;
  if (!s) return UnknownKey(key, Where{none, 0, key});
  return s->set(YAML::Node(value), Where{none, 0, key}, cfg);
}

std::vector<std::string> ConfigKeys() {
  std::vector<std::string> keys;
  for (const Setting& s : Schema()) keys.push_back(s.key);
  return keys;
}

std::vector<ConfigSettingInfo> DescribeConfig() {
  const Config defaults;
  std::vector<ConfigSettingInfo> out;
  for (const Setting& s : Schema())
    out.push_back({s.key, s.get(defaults), s.accepted, s.values, s.help});
  return out;
}

}  // namespace strata
