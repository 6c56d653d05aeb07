// cuBLAS, opened on first use instead of linked. Linking libcublas makes every process map
// and relocate it (and libcublasLt) at start-up, which costs a CPU-only run more resident
// memory than a small model's weights; a build with the CUDA backend must cost nothing
// until a GPU is asked for. Only the entry points the CUDA engine calls are resolved.
#pragma once

#include <string>

#include <cublas_v2.h>

namespace strata::kernels::cuda {

struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
};

// The library loaded once per process (thread-safe), or nullptr with `error` (when given)
// naming the library files tried and the loader's reason.
const CublasApi* Cublas(std::string* error);

}  // namespace strata::kernels::cuda
