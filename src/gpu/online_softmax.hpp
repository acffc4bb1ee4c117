// The online maximum of the fused softmax (gpu_layers.cu): one pass over a sample's logits
// gives both their maximum m and the partition sum of exp(x - m), as a running pair that is
// rescaled whenever a larger value arrives; pairs from different threads combine the same
// way. Compiles for the GPU and the host (tests/test_online_softmax.cpp runs the kernel's
// reduction order on the CPU against a two-pass sum in double precision).
#pragma once

#include "hslide/host_device.hpp"

#include <cfloat>
#include <cmath>

namespace hslide::gpu {

/// exp in single precision: the fast intrinsic on the GPU (CUDA documents 2 + 1.17 |x| ulp:
/// about 2^-21 relative near 0, 2^-17 at x = -80, where the value, below 1e-34, no longer
/// counts), the library's on the host.
HSLIDE_HD inline float fast_exp(float x) {
#if defined(__CUDA_ARCH__)
    return __expf(x);
#else
    return std::exp(x);
#endif
}

/// A running maximum and the sum of exp(x - max) over the values seen so far.
struct max_sum {
    float max = -FLT_MAX;  ///< -FLT_MAX, not -inf, for "nothing seen": exponents stay finite
    float sum = 0.0f;
};

/// Adds one value.
HSLIDE_HD inline max_sum max_sum_add(max_sum a, float x) {
    if (x > a.max) return {x, a.sum * fast_exp(a.max - x) + 1.0f};
    return {a.max, a.sum + fast_exp(x - a.max)};
}

/// The pair of the union of two sets of values.
HSLIDE_HD inline max_sum max_sum_combine(max_sum a, max_sum b) {
    const float m = a.max > b.max ? a.max : b.max;
    return {m, a.sum * fast_exp(a.max - m) + b.sum * fast_exp(b.max - m)};
}

}  // namespace hslide::gpu
