// Checking every CUDA runtime call and kernel launch (the GPU side of error.hpp's two tiers).
//
// A failed call throws hslide::error naming the call, the file and line, and CUDA's reason:
// running out of memory or finding no device is something a user can act on, so it is an
// error, not an abort. Kernel launches are checked with HSLIDE_CUDA_LAUNCH right after the
// <<<...>>> (launch-configuration errors); faults inside a kernel surface at the next
// synchronising call, which is checked like any other.
#pragma once

#include "hslide/error.hpp"

#include <cuda_runtime.h>

namespace hslide::gpu {

[[noreturn]] inline void cuda_failed(cudaError_t status, const char* call, const char* file,
                                     int line) {
    throw error(error_kind::runtime,
                fmt::format("CUDA error at {}:{}: {} failed: {} ({})", file, line, call,
                            cudaGetErrorString(status), cudaGetErrorName(status)));
}

}  // namespace hslide::gpu

/// Throws hslide::error when a CUDA runtime call does not return cudaSuccess.
#define HSLIDE_CUDA_CHECK(call)                                                    \
    do {                                                                           \
        const cudaError_t hslide_status_ = (call);                                 \
        if (hslide_status_ != cudaSuccess)                                         \
            ::hslide::gpu::cuda_failed(hslide_status_, #call, __FILE__, __LINE__); \
    } while (0)

/// Checks the launch just made (configuration errors; in-kernel faults show up later).
#define HSLIDE_CUDA_LAUNCH() HSLIDE_CUDA_CHECK(cudaGetLastError())
