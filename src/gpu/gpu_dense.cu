// The dense output layer's fused softmax + loss + gradient (see gpu_dense.cuh for the layout,
// the three kernels and their byte counts).
#include "block_reduce.cuh"
#include "gpu_dense.cuh"
#include "hslide/error.hpp"
#include "launch.cuh"
#include "load4.cuh"
#include "logistic.hpp"
#include "online_softmax.hpp"

#include <cfloat>
#include <cstdint>

namespace hslide::gpu {

namespace {

// Partials: 256 threads, 8 loads of 4 logits each (16 bytes in fp32, 8 in bf16), all issued
// before any is used: 8,192 columns a block, 82 blocks a sample at Amazon-670K.
constexpr int partial_threads = 256;
constexpr int partial_loads = 8;
constexpr uint32_t partial_columns = partial_threads * partial_loads * 4;

// Gradient: 256 threads of 4 columns each walk every sample in groups of 4 (4 loads of 4 logits
// in flight per thread, issued before the group's label scan): 655 blocks at Amazon-670K, 5-10
// MB of loads in flight on the whole card, while the column sums stay in registers.
constexpr int gradient_threads = 256;
constexpr uint32_t gradient_columns = gradient_threads * 4;
constexpr int gradient_group = 4;
// 5 blocks an SM (at most 51 registers a thread): 660 resident on an H200's 132 SMs, so
// Amazon-670K's 655 blocks run in one wave (at 4 an SM, 127 would make a second, latency-bound).
constexpr int gradient_blocks_per_sm = 5;

constexpr int combine_threads = 256;

__device__ float get(const float4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ float to_float(float x) {
    return x;
}
__device__ float to_float(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

// bias[col..col + 3] (0 past `rows`); col is a multiple of 4 and bias 16-byte aligned.
__device__ float4 load_bias4(const float* bias, uint32_t col, uint32_t rows) {
    if (col + 4 <= rows) return __ldg(reinterpret_cast<const float4*>(bias + col));
    float b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) b[i] = col + i < rows ? __ldg(bias + col + i) : 0.0f;
    return make_float4(b[0], b[1], b[2], b[3]);
}

// One block per (chunk, sample): the chunk's max_sum pair of logit + bias; Logistic: the
// chunk's sum of softplus(logit + bias) in part_sum instead.
template <bool Logistic, class T>
__global__ void dense_partials_kernel(const T* logits, const float* bias, uint32_t rows,
                                      uint32_t ld, const uint32_t* label_offsets, uint32_t n_chunks,
                                      float* part_max, float* part_sum) {
    __shared__ float scratch[64];
    const uint32_t c = blockIdx.x, s = blockIdx.y;
    if (label_offsets[s + 1] == label_offsets[s]) return;  // not trained: never combined
    const T* row = logits + size_t(s) * ld;
    const uint32_t q0 = c * (partial_columns / 4) + threadIdx.x;
    float4 v[partial_loads];
#pragma unroll
    for (int k = 0; k < partial_loads; ++k) {
        const uint32_t col = 4 * (q0 + k * partial_threads);
        // ld is a multiple of 8: a float4 starting inside the row ends inside it.
        v[k] = col < ld ? load4(row, col / 4) : make_float4(0, 0, 0, 0);
    }
    max_sum ms;
    float softplus_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < partial_loads; ++k) {
        const uint32_t col = 4 * (q0 + k * partial_threads);
        if (col >= rows) continue;
        const float4 b = load_bias4(bias, col, rows);
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // padding columns hold whatever: never added
            if (col + i >= rows) continue;
            if constexpr (Logistic)
                softplus_sum += softplus(get(v[k], i) + get(b, i));
            else
                ms = max_sum_add(ms, get(v[k], i) + get(b, i));
        }
    }
    if constexpr (Logistic) {
        softplus_sum = block_sum(softplus_sum, scratch);
        if (threadIdx.x == 0) part_sum[size_t(s) * n_chunks + c] = softplus_sum;
        return;
    }
    ms = block_combine(ms, scratch);
    if (threadIdx.x == 0) {
        part_max[size_t(s) * n_chunks + c] = ms.max;
        part_sum[size_t(s) * n_chunks + c] = ms.sum;
    }
}

// One block per sample: its chunks' pairs combined, its maximum and 1 / Z kept, its loss.
// Logistic: its loss, the chunks' softplus sums less the labels' logits + bias.
template <bool Logistic, class T>
__global__ void dense_combine_kernel(const T* logits, const float* bias, uint32_t ld,
                                     batch_csr batch, uint32_t n_chunks, const float* part_max,
                                     const float* part_sum, float* sample_max,
                                     float* sample_inv_sum, float* loss) {
    __shared__ float scratch[64];
    const uint32_t s = blockIdx.x;
    const uint32_t label_begin = batch.label_offsets[s];
    const uint32_t n_labels = batch.label_offsets[s + 1] - label_begin;
    if (n_labels == 0) {
        if (threadIdx.x == 0) {
            loss[s] = 0.0f;
            sample_max[s] = 0.0f;
            sample_inv_sum[s] = 0.0f;
        }
        return;
    }
    if constexpr (Logistic) {
        float sample_loss = 0.0f;
        for (uint32_t c = threadIdx.x; c < n_chunks; c += blockDim.x)
            sample_loss += part_sum[size_t(s) * n_chunks + c];
        for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
            const uint32_t j = batch.label_ids[label_begin + i];
            sample_loss -= to_float(logits[size_t(s) * ld + j]) + bias[j];
        }
        sample_loss = block_sum(sample_loss, scratch);
        if (threadIdx.x == 0) loss[s] = sample_loss;
        return;
    }
    max_sum ms;
    for (uint32_t c = threadIdx.x; c < n_chunks; c += blockDim.x)
        ms = max_sum_combine(
            ms, {part_max[size_t(s) * n_chunks + c], part_sum[size_t(s) * n_chunks + c]});
    // Every thread's pair is thread 0's (block_combine_shared): no write to scratch while
    // other warps may still read it.
    ms = block_combine_shared(ms, scratch);
    const float m = ms.max, z = ms.sum, log_partition = m + logf(z);
    const float target = 1.0f / float(n_labels);
    float sample_loss = 0.0f;
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
        const uint32_t j = batch.label_ids[label_begin + i];
        sample_loss -= target * (to_float(logits[size_t(s) * ld + j]) + bias[j] - log_partition);
    }
    sample_loss = block_sum(sample_loss, scratch);  // synchronizes before reusing scratch
    if (threadIdx.x == 0) {
        loss[s] = sample_loss;
        sample_max[s] = m;
        sample_inv_sum[s] = 1.0f / z;
    }
}

__device__ void store4(float* out, float4 d) {
    *reinterpret_cast<float4*>(out) = d;
}
__device__ void store4(__nv_bfloat16* out, float4 d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(d.x, d.y), hi = __floats2bfloat162_rn(d.z, d.w);
    uint2 packed;
    packed.x = *reinterpret_cast<uint32_t*>(&lo);
    packed.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out) = packed;
}

// One block per gradient_columns columns, every sample: delta written, column sums kept.
// A sample's label columns inside the block are marked in shared memory (a count per column:
// a label listed twice is subtracted twice, as in softmax_loss) by a scan of its labels, and
// cleared by the thread owning the column once applied. Logistic: delta = sigmoid(logit +
// bias) - 1 on each label (the marks count), no maximum or sum read.
template <bool Logistic, class T>
__global__ void __launch_bounds__(gradient_threads, gradient_blocks_per_sm)
    dense_gradient_kernel(const T* logits, const float* bias, uint32_t rows, uint32_t ld,
                          batch_csr batch, const float* sample_max, const float* sample_inv_sum,
                          float inv_batch, T* delta, float* bias_gradient) {
    __shared__ int marks[gradient_group][gradient_columns];
    const uint32_t c0 = blockIdx.x * gradient_columns, local = 4 * threadIdx.x;
    const uint32_t col = c0 + local;
    const bool in_row = col < ld;  // its 4 columns are inside a row (some may be padding)
    for (uint32_t i = threadIdx.x; i < gradient_group * gradient_columns; i += blockDim.x)
        (&marks[0][0])[i] = 0;
    const float4 b = in_row ? load_bias4(bias, col, rows) : make_float4(0, 0, 0, 0);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint32_t s0 = 0; s0 < batch.size; s0 += gradient_group) {
        // The group's logits first: their loads are in flight during the label scan.
        float4 l[gradient_group];
#pragma unroll
        for (int g = 0; g < gradient_group; ++g)
            l[g] = in_row && s0 + g < batch.size ? load4(logits + size_t(s0 + g) * ld, col / 4)
                                                 : make_float4(0, 0, 0, 0);
        __syncthreads();  // the marks are clear (zeroed above, or by their owners below)
#pragma unroll
        for (int g = 0; g < gradient_group; ++g) {
            if (s0 + g >= batch.size) break;
            const uint32_t end = batch.label_offsets[s0 + g + 1];
            for (uint32_t k = batch.label_offsets[s0 + g] + threadIdx.x; k < end; k += blockDim.x) {
                const uint32_t j = batch.label_ids[k];
                if (j >= c0 && j - c0 < gradient_columns) atomicAdd(&marks[g][j - c0], 1);
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < gradient_group; ++g) {
            const uint32_t s = s0 + g;
            if (s >= batch.size || !in_row) break;
            const uint32_t n_labels = batch.label_offsets[s + 1] - batch.label_offsets[s];
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (n_labels > 0) {  // else delta 0: the sample is not trained
                const float m = Logistic ? 0.0f : sample_max[s];
                const float inv_sum = Logistic ? 0.0f : sample_inv_sum[s];
                const float target = Logistic ? 1.0f : 1.0f / float(n_labels);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if (col + i >= rows) continue;  // padding: 0
                    const float x = get(l[g], i) + get(b, i);
                    d[i] = Logistic ? sigmoid(x) : __expf(x - m) * inv_sum;
                    for (int k = marks[g][local + i]; k > 0; --k) d[i] -= target;
                    marks[g][local + i] = 0;
                    acc[i] += d[i];
                }
            }
            store4(delta + size_t(s) * ld + col, make_float4(d[0], d[1], d[2], d[3]));
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (col + i < rows) bias_gradient[col + i] = acc[i] * inv_batch;
}

}  // namespace

size_t dense_softmax_work_floats(uint32_t batch, uint32_t rows) {
    return 2 * size_t(batch) * blocks_for(rows, partial_columns) + 2 * size_t(batch);
}

namespace {

template <bool Logistic, class T>
void dense_output_loss(const T* logits, const float* bias, uint32_t rows, uint32_t ld,
                       const batch_csr& batch, float inv_batch, T* delta, float* bias_gradient,
                       float* loss, float* work, cudaStream_t stream) {
    if (batch.size == 0) return;
    HSLIDE_ASSERT(rows > 0 && ld >= rows && ld % 8 == 0);
    HSLIDE_ASSERT(reinterpret_cast<uintptr_t>(bias) % 16 == 0);
    HSLIDE_ASSERT(reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(delta) % 16 == 0);
    HSLIDE_CHECK(batch.size <= 65535, "a dense-output batch of {} samples is above 65,535",
                 batch.size);
    const uint32_t n_chunks = blocks_for(rows, partial_columns);
    float* part_max = work;
    float* part_sum = part_max + size_t(batch.size) * n_chunks;
    float* sample_max = part_sum + size_t(batch.size) * n_chunks;
    float* sample_inv_sum = sample_max + batch.size;
    dense_partials_kernel<Logistic><<<dim3(n_chunks, batch.size), partial_threads, 0, stream>>>(
        logits, bias, rows, ld, batch.label_offsets, n_chunks, part_max, part_sum);
    HSLIDE_CUDA_LAUNCH();
    dense_combine_kernel<Logistic><<<batch.size, combine_threads, 0, stream>>>(
        logits, bias, ld, batch, n_chunks, part_max, part_sum, sample_max, sample_inv_sum, loss);
    HSLIDE_CUDA_LAUNCH();
    dense_gradient_kernel<Logistic>
        <<<blocks_for(ld, gradient_columns), gradient_threads, 0, stream>>>(
            logits, bias, rows, ld, batch, sample_max, sample_inv_sum, inv_batch, delta,
            bias_gradient);
    HSLIDE_CUDA_LAUNCH();
}

}  // namespace

template <class T>
void dense_softmax_loss(const T* logits, const float* bias, uint32_t rows, uint32_t ld,
                        const batch_csr& batch, float inv_batch, T* delta, float* bias_gradient,
                        float* loss, float* work, cudaStream_t stream) {
    dense_output_loss<false>(logits, bias, rows, ld, batch, inv_batch, delta, bias_gradient, loss,
                             work, stream);
}

template <class T>
void dense_logistic_loss(const T* logits, const float* bias, uint32_t rows, uint32_t ld,
                         const batch_csr& batch, float inv_batch, T* delta, float* bias_gradient,
                         float* loss, float* work, cudaStream_t stream) {
    dense_output_loss<true>(logits, bias, rows, ld, batch, inv_batch, delta, bias_gradient, loss,
                            work, stream);
}

template void dense_softmax_loss(const float*, const float*, uint32_t, uint32_t, const batch_csr&,
                                 float, float*, float*, float*, float*, cudaStream_t);
template void dense_softmax_loss(const __nv_bfloat16*, const float*, uint32_t, uint32_t,
                                 const batch_csr&, float, __nv_bfloat16*, float*, float*, float*,
                                 cudaStream_t);
template void dense_logistic_loss(const float*, const float*, uint32_t, uint32_t, const batch_csr&,
                                  float, float*, float*, float*, float*, cudaStream_t);
template void dense_logistic_loss(const __nv_bfloat16*, const float*, uint32_t, uint32_t,
                                  const batch_csr&, float, __nv_bfloat16*, float*, float*, float*,
                                  cudaStream_t);

}  // namespace hslide::gpu
