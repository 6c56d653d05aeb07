// Platform: what machine Strata runs on and what memory tiers it offers.
//
// Detection reads the OS (cores, memory, Jetson markers in the device tree) and the
// kernels' CPU feature probe. The CUDA tiers (device memory, pinned host, unified memory
// on Jetson) are reported when a CUDA build finds a device; on a CPU-only build the only
// fast tier is host RAM. Detection has no side effects and may run on any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

enum class PlatformKind { kCpu, kJetson, kDesktopCuda };
const char* PlatformKindName(PlatformKind k);

struct PlatformInfo {
  PlatformKind kind = PlatformKind::kCpu;
  std::string cpu_model;          // /proc/cpuinfo "model name" (or the device tree model)
  std::string isa;                // the kernels' instruction set in use ("avx512", ...)
  int32_t cores = 0;              // online CPUs
  uint64_t memory_total = 0;      // bytes of RAM (MemTotal)
  uint64_t memory_available = 0;  // bytes the OS could give now (MemAvailable)
  bool unified_memory = false;    // CPU and GPU share RAM (Jetson)
};

Status DetectPlatform(PlatformInfo* out);

// The block device that holds `dir` ("nvme0n1", "vda", "mmcblk0"; its whole-disk parent
// when dir is on a partition), from sysfs; "" when there is none (tmpfs, overlay).
std::string BlockDeviceOf(const std::string& dir);

// What a profile measured on this machine depends on, as one line: the CPU model, cores,
// memory (GiB, rounded), the instruction set and the KV device. A tuned configuration
// records it and start-up compares it with the machine it runs on.
std::string MachineFingerprint(const PlatformInfo& p, const std::string& kv_device);

}  // namespace strata
