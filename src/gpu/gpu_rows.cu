// Row change tracking and row transfers (see gpu_rows.cuh).
#include "cuda_check.hpp"
#include "gpu_rows.cuh"
#include "launch.cuh"

namespace hslide::gpu {

namespace {

constexpr int block_threads = 256;

__global__ void mark_rows_kernel(uint8_t* flags, const uint32_t* rows, const uint32_t* n_rows) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= *n_rows) return;
    const uint32_t row = rows[i];
    if (row != UINT32_MAX) flags[row] = 1;
}

// One block per row: the row's floats are read and written with the whole block.
__global__ void gather_rows_kernel(layer_view layer, const uint32_t* rows, float* packed,
                                   float* bias) {
    const uint32_t row = rows[blockIdx.x];
    const float* from = layer.weights + size_t(row) * layer.stride;
    float* to = packed + size_t(blockIdx.x) * layer.stride;
    for (uint32_t i = threadIdx.x; i < layer.stride; i += blockDim.x) to[i] = from[i];
    if (bias && threadIdx.x == 0) bias[blockIdx.x] = layer.bias[row];
}

__global__ void scatter_rows_kernel(layer_view layer, const uint32_t* rows, const float* packed,
                                    const float* bias) {
    const uint32_t row = rows[blockIdx.x];
    const float* from = packed + size_t(blockIdx.x) * layer.stride;
    float* to = layer.weights + size_t(row) * layer.stride;
    __nv_bfloat16* to16 = layer.weights16 ? layer.weights16 + size_t(row) * layer.stride : nullptr;
    for (uint32_t i = threadIdx.x; i < layer.stride; i += blockDim.x) {
        to[i] = from[i];
        if (to16) to16[i] = __float2bfloat16_rn(from[i]);
    }
    if (bias && threadIdx.x == 0) layer.bias[row] = bias[blockIdx.x];
}

}  // namespace

void mark_rows(uint8_t* flags, const uint32_t* rows, const uint32_t* n_rows, uint32_t max_rows,
               cudaStream_t stream) {
    if (max_rows == 0) return;
    mark_rows_kernel<<<blocks_for(max_rows, block_threads), block_threads, 0, stream>>>(flags, rows,
                                                                                        n_rows);
    HSLIDE_CUDA_LAUNCH();
}

void gather_rows(const layer_view& layer, const uint32_t* rows, uint32_t n, float* packed,
                 float* bias, cudaStream_t stream) {
    if (n == 0) return;
    gather_rows_kernel<<<n, 128, 0, stream>>>(layer, rows, packed, bias);
    HSLIDE_CUDA_LAUNCH();
}

void scatter_rows(const layer_view& layer, const uint32_t* rows, uint32_t n, const float* packed,
                  const float* bias, cudaStream_t stream) {
    if (n == 0) return;
    scatter_rows_kernel<<<n, 128, 0, stream>>>(layer, rows, packed, bias);
    HSLIDE_CUDA_LAUNCH();
}

}  // namespace hslide::gpu
