// cuBLAS, loaded at run time: the dense output layer (the --backend gpu-dense baseline, or an
// output layer configured dense) and exact scoring of every label use it.
//
// Linking libcublas would make every hslide binary built with CUDA need the exact cuBLAS it
// was built against, even for LSH training that never calls it; the GPU machines we measure
// on carry their own CUDA libraries. So the few entry points are resolved with dlopen from
// $HSLIDE_CUBLAS, then the major version this build was compiled against, libcublas.so,
// libcublas.so.13 and libcublas.so.12 (the API used here is the same in both), and a missing
// library is an error only when one of those uses comes.
#pragma once

#include <cublas_v2.h>

namespace hslide::gpu {

/// The cuBLAS entry points hslide calls.
struct cublas_api {
    cublasStatus_t (*create)(cublasHandle_t*);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const float*, const float*, int, const float*, int, const float*,
                            float*, int);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void*, const void*, cudaDataType, int, const void*,
                              cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
};

/// The loaded library (loaded once; thread-safe). Throws hslide::error (unsupported) naming
/// the files tried when none loads.
const cublas_api& cublas();

}  // namespace hslide::gpu

/// Throws hslide::error when a cuBLAS call does not return CUBLAS_STATUS_SUCCESS.
#define HSLIDE_CUBLAS_CHECK(call)                                                                 \
    do {                                                                                          \
        const cublasStatus_t hslide_blas_status_ = (call);                                        \
        if (hslide_blas_status_ != CUBLAS_STATUS_SUCCESS)                                         \
            throw ::hslide::error(                                                                \
                ::hslide::error_kind::runtime,                                                    \
                ::fmt::format("cuBLAS error at {}:{}: {} failed (status {})", __FILE__, __LINE__, \
                              #call, int(hslide_blas_status_)));                                  \
    } while (0)
