// libFuzzer target: arbitrary bytes as strata.yaml. Parsing must fail cleanly (never crash,
// throw or exhaust memory: aliases, nesting and size are bounded) or give a config that the
// writer turns back into YAML that parses to the same text again.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "runtime/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  strata::Config c;
  if (!strata::ParseConfig(text, "fuzz.yaml", &c).ok()) return 0;
  const std::string again = strata::ConfigToYaml(c);
  strata::Config d;
  const strata::Status s = strata::ParseConfig(again, "written.yaml", &d);
  if (!s.ok() || strata::ConfigToYaml(d) != again) {
    std::fprintf(stderr, "config_fuzzer: a parsed config does not round-trip: %s\n",
                 s.ToString().c_str());
    std::abort();
  }
  return 0;
}
