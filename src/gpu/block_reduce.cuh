// Warp- and block-wide reductions shared by the GPU kernels: sums, and the online softmax's
// (max, sum) pairs (online_softmax.hpp). Every thread of a warp (warp_*) or of the block
// (block_*) calls them. The block ones take `scratch` in shared memory (32 floats for a sum,
// 64 for a pair) and begin with a barrier, so one scratch serves several reductions in a row;
// every warp then reduces the warps' partial results in warp order. A butterfly may round lane
// i's and lane j's combines differently: block_combine's result is thread 0's, and
// block_combine_shared hands it to every thread.
#pragma once

#include "online_softmax.hpp"

namespace hslide::gpu {

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/// The block's sum (every thread gets it: the warps' sums are added in warp order).
__device__ inline float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ inline max_sum warp_combine(max_sum v) {
    for (int o = 16; o > 0; o /= 2)
        v = max_sum_combine(
            v, {__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)});
    return v;
}

/// The block's pair, exact in thread 0 (other lanes may differ in the last bit).
__device__ inline max_sum block_combine(max_sum v, float* scratch) {
    v = warp_combine(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) {
        scratch[warp] = v.max;
        scratch[32 + warp] = v.sum;
    }
    __syncthreads();
    v = lane < n_warps ? max_sum{scratch[lane], scratch[32 + lane]} : max_sum{};
    return warp_combine(v);
}

/// The block's pair, the same in every thread (thread 0's): all of a sample's deltas then
/// share one partition sum.
__device__ inline max_sum block_combine_shared(max_sum v, float* scratch) {
    v = block_combine(v, scratch);
    return {__shfl_sync(0xffffffffu, v.max, 0), __shfl_sync(0xffffffffu, v.sum, 0)};
}

}  // namespace hslide::gpu
