#include "kernels/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>

namespace strata::kernels::cuda {
namespace {

struct Loaded {
  CublasApi api{};
  bool ok = false;
  std::string error;
};

template <class Fn>
bool Resolve(void* lib, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) {
    const char* why = dlerror();
    *error = std::string("symbol ") + name + " is missing" + (why ? std::string(": ") + why : "");
  }
  return *fn != nullptr;
}

Loaded Load() {
  Loaded l;
  // The toolkit's soname first (found through the loader's search path, as a linked library
  // would be), then the copy in the toolkit the build used.
  const char* candidates[] = {STRATA_CUBLAS_SONAME, STRATA_CUBLAS_DIR "/" STRATA_CUBLAS_SONAME};
  void* lib = nullptr;
  std::string tried;
  for (const char* c : candidates) {
    lib = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + c + ": " + (why ? why : "not found");
  }
  if (!lib) {
    l.error = "cannot load cuBLAS (" + tried + ")";
    return l;
  }
  std::string err;
  l.ok = Resolve(lib, "cublasCreate_v2", &l.api.create, &err) &&
         Resolve(lib, "cublasDestroy_v2", &l.api.destroy, &err) &&
         Resolve(lib, "cublasSetStream_v2", &l.api.set_stream, &err) &&
         Resolve(lib, "cublasGemmEx", &l.api.gemm_ex, &err);
  // The library stays open for the life of the process: handles may outlive any caller.
  if (!l.ok) l.error = std::string("cuBLAS library ") + STRATA_CUBLAS_SONAME + ": " + err;
  return l;
}

}  // namespace

const CublasApi* Cublas(std::string* error) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = Load(); });
  if (!loaded.ok) {
    if (error) *error = loaded.error;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace strata::kernels::cuda
