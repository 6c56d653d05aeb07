#include "bench/kv/kv_bench_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/config/config.h"
#include "runtime/engine/engine.h"

namespace strata::bench {

Status ParseDiskSpec(const std::string& spec, const DiskKvOptions& base, int32_t n_ctx,
                     int64_t full_cache_bytes, DiskKvOptions* out) {
  (void)n_ctx;
  Config c;
  c.engine.kv.disk = base;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return Status::InvalidArgument("spec item '" + item + "' has no '='");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    // Keys of strata.yaml's kv section, with or without "kv.": the schema checks them.
    if (key.rfind("kv.", 0) != 0) key = "kv." + key;
    if (key == "kv.policy")
      return Status::InvalidArgument("spec item '" + item + "': a spec sets the disk policy");
    if (key == "kv.budget_bytes" && value.rfind("1/", 0) == 0) {
      char* end = nullptr;
      const long long div = std::strtoll(value.c_str() + 2, &end, 10);
      if (div <= 0 || *end != '\0')
        return Status::InvalidArgument("spec item '" + item + "': expected 1/N with N > 0");
      value = std::to_string(full_cache_bytes / div);
    }
    STRATA_RETURN_IF_ERROR(SetConfigValue(key, value, &c).WithContext("spec item '" + item + "'"));
  }
  *out = c.engine.kv.disk;
  return Status::OK();
}

std::string CommandLine(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s.push_back(' ');
    s.append(argv[i]);
  }
  return s;
}

}  // namespace strata::bench
