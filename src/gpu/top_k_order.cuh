// The top-k ordering rule and the block-wide sorts that use it, shared by every GPU file
// that ranks (score, id) pairs: the chunked selection and the fused pass (gpu_topk_*.cu), the
// top-k sets (gpu_topk_sets.cu) and prediction's top-k (gpu_predict_top_k.cu). The CPU's
// rule is cpu/top_k.hpp's, the same order: a higher score first, an equal score to the
// smaller id, NaN never kept (a NaN compares false both ways, so it never beats anything).
#pragma once

#include "hslide/host_device.hpp"

#include <cstdint>

namespace hslide::gpu {

/// The id of an empty top-k entry (no row: fewer than k candidates).
constexpr uint32_t top_k_none = 0xffffffffu;

/// (a, ia) ranks above (b, ib): a higher score, or an equal one and a smaller id.
HSLIDE_HD inline bool better(float a, uint32_t ia, float b, uint32_t ib) {
    return a > b || (a == b && ia < ib);
}

#if defined(__CUDACC__)
// Sorts key/id[0, n) (n a power of two) best first; every thread of the block calls it.
__device__ inline void bitonic_best_first(float* key, uint32_t* id, uint32_t n) {
    for (uint32_t size = 2; size <= n; size <<= 1)
        for (uint32_t stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            for (uint32_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
                const uint32_t i = 2 * t - (t & (stride - 1)), j = i + stride;
                const bool up = (i & size) == 0;  // this run best first
                const bool swap = up ? better(key[j], id[j], key[i], id[i])
                                     : better(key[i], id[i], key[j], id[j]);
                if (swap) {
                    const float ks = key[i];
                    key[i] = key[j];
                    key[j] = ks;
                    const uint32_t is = id[i];
                    id[i] = id[j];
                    id[j] = is;
                }
            }
        }
    __syncthreads();
}

// Sorts v[0, n) ascending (n a power of two).
__device__ inline void bitonic_ascending(uint32_t* v, uint32_t n) {
    for (uint32_t size = 2; size <= n; size <<= 1)
        for (uint32_t stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            for (uint32_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
                const uint32_t i = 2 * t - (t & (stride - 1)), j = i + stride;
                const bool up = (i & size) == 0;
                if (up ? v[j] < v[i] : v[i] < v[j]) {
                    const uint32_t x = v[i];
                    v[i] = v[j];
                    v[j] = x;
                }
            }
        }
    __syncthreads();
}
#endif

}  // namespace hslide::gpu
