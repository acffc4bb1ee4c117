// The logistic loss's two functions for the GPU kernels (the set losses of gpu_layers.cu and the
// dense loss of gpu_dense.cu), in one place so that both compute the same bits. Compiles for
// the GPU and the host; the CPU's reference is logistic_loss_gradient (hslide/loss.hpp).
#pragma once

#include "online_softmax.hpp"

#include <cmath>

namespace hslide::gpu {

/// softplus(x) = log(1 + e^x), the binary cross-entropy of a negative at logit x, written so
/// that neither side overflows.
HSLIDE_HD inline float softplus(float x) {
    return fmaxf(x, 0.0f) + log1pf(fast_exp(-fabsf(x)));
}

/// The logistic function 1 / (1 + e^-x): a member's delta before its label's 1 is subtracted.
HSLIDE_HD inline float sigmoid(float x) {
    return 1.0f / (1.0f + fast_exp(-x));
}

}  // namespace hslide::gpu
