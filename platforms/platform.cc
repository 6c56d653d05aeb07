#include "platforms/platform.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <fstream>
#include <sstream>

#include "kernels/kernels.h"
#include "platforms/cuda_device.h"

namespace strata {
namespace {

// Reads "Key: value kB" lines of /proc/meminfo.
uint64_t MemInfoBytes(const std::string& text, const std::string& key) {
  size_t p = text.find(key + ":");
  if (p == std::string::npos) return 0;
  std::istringstream in(text.substr(p + key.size() + 1));
  uint64_t kib = 0;
  in >> kib;
  return kib * 1024;
}

std::string ReadFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const char* PlatformKindName(PlatformKind k) {
  switch (k) {
    case PlatformKind::kCpu:
      return "cpu";
    case PlatformKind::kJetson:
      return "jetson";
    case PlatformKind::kDesktopCuda:
      return "desktop-cuda";
  }
  return "?";
}

Status DetectPlatform(PlatformInfo* out) {
  PlatformInfo p;
  p.cores = int32_t(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string mem = ReadFile("/proc/meminfo");
  p.memory_total = MemInfoBytes(mem, "MemTotal");
  p.memory_available = MemInfoBytes(mem, "MemAvailable");
  const std::string cpu = ReadFile("/proc/cpuinfo");
  size_t m = cpu.find("model name");
  if (m != std::string::npos) {
    size_t colon = cpu.find(':', m), eol = cpu.find('\n', m);
    if (colon != std::string::npos && colon < eol)
      p.cpu_model = cpu.substr(colon + 2, eol - colon - 2);
  }
  // Jetson modules (Tegra SoCs) say so in the device tree's compatible string.
  const std::string compat = ReadFile("/proc/device-tree/compatible");
  if (compat.find("nvidia,tegra") != std::string::npos) {
    p.kind = PlatformKind::kJetson;
    p.unified_memory = true;
    std::string model = ReadFile("/proc/device-tree/model");
    if (!model.empty()) p.cpu_model = model.c_str();
  } else if (CudaDevice::Count() > 0) {
    p.kind = PlatformKind::kDesktopCuda;  // a discrete GPU this build can use
  }
  p.isa = kernels::IsaName(kernels::ActiveIsa());
  *out = p;
  return Status::OK();
}

std::string BlockDeviceOf(const std::string& dir) {
  struct stat sb {};
  if (stat(dir.c_str(), &sb) != 0) return "";
  const std::string sys =
      "/sys/dev/block/" + std::to_string(major(sb.st_dev)) + ":" + std::to_string(minor(sb.st_dev));
  std::error_code ec;
  std::filesystem::path dev = std::filesystem::canonical(sys, ec);
  if (ec) return "";
  // A partition's sysfs directory sits inside its disk's and has a "partition" file.
  if (std::filesystem::exists(dev / "partition", ec)) dev = dev.parent_path();
  return dev.filename().string();
}

std::string MachineFingerprint(const PlatformInfo& p, const std::string& kv_device) {
  const double gib = double(p.memory_total) / double(uint64_t(1) << 30);
  return "cpu=" + p.cpu_model + "; cores=" + std::to_string(p.cores) +
         "; memory_gib=" + std::to_string(int64_t(std::lround(gib))) + "; isa=" + p.isa +
         "; kv_device=" + (kv_device.empty() ? "none" : kv_device);
}

Status ParseComputeDevice(const std::string& text, int32_t* cuda_device) {
  if (text == "cpu") {
    *cuda_device = -1;
    return Status::OK();
  }
  if (text == "cuda") {
    *cuda_device = 0;
    return Status::OK();
  }
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    *cuda_device = std::stoi(text.substr(5));
    return Status::OK();
  }
  return Status::InvalidArgument("'" + text + "' is not a device (cpu, cuda or cuda:N)");
}

Status CudaDevice::MapHost(const void*, size_t, bool, const void** device) {
  *device = nullptr;
  return Status::NotSupported(name() + ": cannot map host memory");
}

Status CudaDevice::TakeStores(std::vector<kernels::cuda::StoreF16Op>* ops) {
  ops->clear();
  return Status::NotSupported(name() + ": stores cannot be taken");
}

Status CudaDevice::ExpandQ8_0(const void*, int64_t, int64_t, uint16_t*) {
  return Status::NotSupported(name() + ": cannot expand Q8_0 rows");
}

Status CudaDevice::EndCapture(std::unique_ptr<Graph>* out) {
  out->reset();
  return Status::NotSupported(name() + ": no graph capture");
}

std::string ComputeDeviceName(int32_t cuda_device) {
  return cuda_device < 0 ? "cpu" : "cuda:" + std::to_string(cuda_device);
}

}  // namespace strata
