// Four consecutive values of a row, fp32 or bf16, as a float4: one 16-byte or 8-byte load.
// The kernels read fp32 masters and bf16 copies (weights, logits, gradients) through one
// template this way.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace hslide::gpu {

/// row[4q .. 4q + 3]; row must be 16-byte (fp32) or 8-byte (bf16) aligned.
__device__ inline float4 load4(const float* row, size_t q) {
    return reinterpret_cast<const float4*>(row)[q];
}
__device__ inline float4 load4(const __nv_bfloat16* row, size_t q) {
    const uint2 raw = reinterpret_cast<const uint2*>(row)[q];
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

}  // namespace hslide::gpu
