// The GPU backend's layer kernels (see gpu_layers.cuh for what each computes).
#include "gpu_layers.cuh"
#include "launch.cuh"
#include "online_softmax.hpp"

#include <algorithm>
#include <cfloat>

namespace hslide::gpu {

namespace {

constexpr int block_threads = 256;
constexpr int warps_per_block = block_threads / 32;
// Hidden rows of up to 1024 floats: 256 float4 chunks, 8 per lane of a warp.
constexpr int max_chunks_per_lane = 8;

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum (every thread gets the result); `scratch` holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x / 32;
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// Four weights of a row as floats: fp32 master or bf16 copy.
__device__ float4 load4(const float* row, uint32_t q) {
    return reinterpret_cast<const float4*>(row)[q];
}
__device__ float4 load4(const __nv_bfloat16* row, uint32_t q) {
    const uint2 raw = reinterpret_cast<const uint2*>(row)[q];
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

__device__ void adam_element(float& w, float& m, float& v, float g, const adam_params& a) {
    const float mi = a.beta1 * m + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v + (1.0f - a.beta2) * g * g;
    m = mi;
    v = vi;
    w -= a.lr * (mi * a.c1) / (sqrtf(vi * a.c2) + a.eps);
}

// Adam on four consecutive weights of a row, and their bf16 copy.
__device__ void adam4(const layer_view& layer, size_t offset, float4 g, const adam_params& a) {
    float4 w = *reinterpret_cast<float4*>(layer.weights + offset);
    float4 m = *reinterpret_cast<float4*>(layer.adam_m + offset);
    float4 v = *reinterpret_cast<float4*>(layer.adam_v + offset);
    adam_element(w.x, m.x, v.x, g.x, a);
    adam_element(w.y, m.y, v.y, g.y, a);
    adam_element(w.z, m.z, v.z, g.z, a);
    adam_element(w.w, m.w, v.w, g.w, a);
    *reinterpret_cast<float4*>(layer.weights + offset) = w;
    *reinterpret_cast<float4*>(layer.adam_m + offset) = m;
    *reinterpret_cast<float4*>(layer.adam_v + offset) = v;
    if (layer.weights16) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(w.x, w.y), hi = __floats2bfloat162_rn(w.z, w.w);
        uint2 packed;
        packed.x = *reinterpret_cast<uint32_t*>(&lo);
        packed.y = *reinterpret_cast<uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(layer.weights16 + offset) = packed;
    }
}

__device__ float4 fma4(float d, float4 x, float4 acc) {
    return make_float4(acc.x + d * x.x, acc.y + d * x.y, acc.z + d * x.z, acc.w + d * x.w);
}
__device__ float4 scale4(float4 a, float s) {
    return make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
}

// --- first layer -----------------------------------------------------------------------------

template <class W>
__global__ void first_layer_forward_kernel(const W* weights, const float* bias, uint32_t width,
                                           uint32_t stride, batch_csr batch, float* hidden,
                                           __nv_bfloat16* hidden16) {
    const uint32_t s = blockIdx.x;
    const uint32_t begin = batch.feature_offsets[s], end = batch.feature_offsets[s + 1];
    for (uint32_t c = threadIdx.x; c < stride; c += blockDim.x) {
        float acc = 0.0f;
        if (c < width) {
            acc = bias[c];
            for (uint32_t k = begin; k < end; ++k)
                acc += batch.feature_values[k] *
                       float(weights[size_t(batch.feature_ids[k]) * stride + c]);
            acc = acc > 0.0f ? acc : 0.0f;
        }
        hidden[size_t(s) * stride + c] = acc;
        if (hidden16) hidden16[size_t(s) * stride + c] = __float2bfloat16_rn(acc);
    }
}

// --- output layer over active sets -----------------------------------------------------------

template <class W, class H>
__global__ void sparse_output_forward_kernel(const W* weights, const float* bias, uint32_t stride,
                                             const H* hidden, const uint32_t* ids,
                                             const uint32_t* entry_sample, uint32_t n_entries,
                                             float* logits) {
    const uint32_t e = blockIdx.x * warps_per_block + threadIdx.x / 32;
    if (e >= n_entries) return;
    const uint32_t lane = threadIdx.x % 32, j = ids[e];
    const W* row = weights + size_t(j) * stride;
    const H* h = hidden + size_t(entry_sample[e]) * stride;
    float acc = 0.0f;
    for (uint32_t q = lane; q < stride / 4; q += 32) acc += dot4(load4(row, q), load4(h, q));
    acc = warp_sum(acc);
    if (lane == 0) logits[e] = acc + bias[j];
}

__device__ max_sum warp_combine(max_sum v) {
    for (int o = 16; o > 0; o /= 2)
        v = max_sum_combine(
            v, {__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)});
    return v;
}
// Block-wide combine (every thread gets the result); `scratch` holds 64 floats.
__device__ max_sum block_combine(max_sum v, float* scratch) {
    v = warp_combine(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) {
        scratch[warp] = v.max;
        scratch[32 + warp] = v.sum;
    }
    __syncthreads();
    const int n_warps = blockDim.x / 32;
    v = lane < n_warps ? max_sum{scratch[lane], scratch[32 + lane]} : max_sum{};
    v = warp_combine(v);
    // The butterfly gives lane i combine(v_i, v_j) and lane j combine(v_j, v_i), which a fused
    // multiply-add may round differently: lane 0's result is every thread's, so all of a
    // sample's deltas share one partition sum.
    return {__shfl_sync(0xffffffffu, v.max, 0), __shfl_sync(0xffffffffu, v.sum, 0)};
}

__global__ void softmax_loss_kernel(float* logits, const float* bias, const uint32_t* offsets,
                                    uint32_t n_columns, bool labels_first, batch_csr batch,
                                    float* delta, float* loss) {
    __shared__ float scratch[64];
    const uint32_t s = blockIdx.x;
    const uint64_t begin = offsets ? offsets[s] : uint64_t(s) * n_columns;
    const uint64_t end = offsets ? offsets[s + 1] : begin + n_columns;
    const uint32_t label_begin = batch.label_offsets[s];
    const uint32_t n_labels = batch.label_offsets[s + 1] - label_begin;
    if (n_labels == 0 || end == begin) {
        for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x) delta[e] = 0.0f;
        if (threadIdx.x == 0) loss[s] = 0.0f;
        return;
    }
    // Online maximum: the maximum and the partition function in one pass over the logits.
    max_sum ms;
    for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
        float l = logits[e];
        if (!offsets && bias) logits[e] = l = l + bias[e - begin];
        ms = max_sum_add(ms, l);
    }
    ms = block_combine(ms, scratch);
    const float m = ms.max, inv_sum = 1.0f / ms.sum, log_partition = m + logf(ms.sum);
    for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x)
        delta[e] = __expf(logits[e] - m) * inv_sum;  // this thread's own writes above
    __syncthreads();
    const float target = 1.0f / float(n_labels);
    float sample_loss = 0.0f;
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
        const uint64_t e = labels_first ? begin + i : begin + batch.label_ids[label_begin + i];
        delta[e] -= target;
        sample_loss -= target * (logits[e] - log_partition);
    }
    sample_loss = block_sum(sample_loss, scratch);
    if (threadIdx.x == 0) loss[s] = sample_loss;
}

template <class W>
__global__ void sparse_output_backward_kernel(const W* weights, uint32_t stride,
                                              const uint32_t* offsets, const uint32_t* ids,
                                              const float* delta, const float* hidden,
                                              float* d_hidden) {
    extern __shared__ float partial[];  // warps_per_block x stride
    const uint32_t s = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t chunks = stride / 4;
    float4 acc[max_chunks_per_lane];
#pragma unroll
    for (int i = 0; i < max_chunks_per_lane; ++i) acc[i] = make_float4(0, 0, 0, 0);
    for (uint32_t e = offsets[s] + warp; e < offsets[s + 1]; e += warps_per_block) {
        const float d = delta[e];
        const W* row = weights + size_t(ids[e]) * stride;
#pragma unroll
        for (int i = 0; i < max_chunks_per_lane; ++i) {
            const uint32_t q = lane + 32 * i;
            if (q < chunks) acc[i] = fma4(d, load4(row, q), acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < max_chunks_per_lane; ++i) {
        const uint32_t q = lane + 32 * i;
        if (q < chunks) reinterpret_cast<float4*>(partial + size_t(warp) * stride)[q] = acc[i];
    }
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < stride; c += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < warps_per_block; ++w) sum += partial[size_t(w) * stride + c];
        d_hidden[size_t(s) * stride + c] = hidden[size_t(s) * stride + c] > 0.0f ? sum : 0.0f;
    }
}

__global__ void relu_backward_kernel(const float* hidden, size_t n, float* d_hidden) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n && !(hidden[i] > 0.0f)) d_hidden[i] = 0.0f;
}

// --- row-sparse gradients and Adam -----------------------------------------------------------

// One warp per distinct row: the row's gradient over its segment, in entry order, then Adam.
// `first_layer`: entries are nonzeros (value * d_hidden of their sample), no bias; otherwise
// entries are active-set entries (delta * hidden of their sample) with a bias gradient.
template <bool first_layer>
__global__ void rows_adam_kernel(layer_view layer, const uint32_t* unique_rows,
                                 const uint32_t* segment_begin, const uint32_t* n_unique,
                                 const uint32_t* order, const uint32_t* entry_sample,
                                 const float* scale, const float* vectors, float inv_batch,
                                 adam_params adam) {
    const uint32_t u = blockIdx.x * warps_per_block + threadIdx.x / 32;
    if (u >= *n_unique) return;
    const uint32_t row = unique_rows[u];
    if (row == 0xffffffffu) return;  // nonzeros of points without labels
    const uint32_t lane = threadIdx.x % 32, chunks = layer.stride / 4;
    float4 acc[max_chunks_per_lane];
#pragma unroll
    for (int i = 0; i < max_chunks_per_lane; ++i) acc[i] = make_float4(0, 0, 0, 0);
    float bias_grad = 0.0f;
    for (uint32_t k = segment_begin[u]; k < segment_begin[u + 1]; ++k) {
        const uint32_t e = order[k];
        const float d = scale[e];
        const float* x = vectors + size_t(entry_sample[e]) * layer.stride;
        bias_grad += d;
#pragma unroll
        for (int i = 0; i < max_chunks_per_lane; ++i) {
            const uint32_t q = lane + 32 * i;
            if (q < chunks) acc[i] = fma4(d, load4(x, q), acc[i]);
        }
    }
    const size_t base = size_t(row) * layer.stride;
#pragma unroll
    for (int i = 0; i < max_chunks_per_lane; ++i) {
        const uint32_t q = lane + 32 * i;
        if (q < chunks) adam4(layer, base + 4 * size_t(q), scale4(acc[i], inv_batch), adam);
    }
    if (!first_layer && lane == 0)
        adam_element(layer.bias[row], layer.bias_m[row], layer.bias_v[row], bias_grad * inv_batch,
                     adam);
}

__global__ void untouched_rows_adam_kernel(layer_view layer, const uint8_t* touched,
                                           adam_params adam) {
    const size_t q = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (q >= size_t(layer.rows) * layer.stride / 4) return;
    if (touched[4 * q / layer.stride]) return;
    adam4(layer, 4 * q, make_float4(0, 0, 0, 0), adam);
}

__global__ void first_layer_bias_adam_kernel(layer_view layer, const float* d_hidden,
                                             uint32_t batch, float inv_batch, adam_params adam) {
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= layer.width) return;
    float g = 0.0f;
    for (uint32_t s = 0; s < batch; ++s) g += inv_batch * d_hidden[size_t(s) * layer.stride + c];
    adam_element(layer.bias[c], layer.bias_m[c], layer.bias_v[c], g, adam);
}

__global__ void dense_adam_kernel(layer_view layer, const float* gradient,
                                  const float* bias_gradient, adam_params adam) {
    const size_t q = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t n4 = size_t(layer.rows) * layer.stride / 4;
    if (q < n4) adam4(layer, 4 * q, reinterpret_cast<const float4*>(gradient)[q], adam);
    if (q < layer.rows)
        adam_element(layer.bias[q], layer.bias_m[q], layer.bias_v[q], bias_gradient[q], adam);
}

__global__ void column_sums_kernel(const float* delta, uint32_t batch, uint32_t n, float inv_batch,
                                   float* out) {
    const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float g = 0.0f;
    for (uint32_t s = 0; s < batch; ++s) g += delta[size_t(s) * n + j];
    out[j] = g * inv_batch;
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void nonzero_keys_kernel(batch_csr batch, uint32_t* keys, uint32_t* sample,
                                    uint32_t* index) {
    const uint32_t s = blockIdx.x;
    const bool trained = batch.label_offsets[s + 1] > batch.label_offsets[s];
    for (uint32_t k = batch.feature_offsets[s] + threadIdx.x; k < batch.feature_offsets[s + 1];
         k += blockDim.x) {
        keys[k] = trained ? batch.feature_ids[k] : 0xffffffffu;
        sample[k] = s;
        index[k] = k;
    }
}

__global__ void iota_kernel(uint32_t* index, uint32_t n) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) index[i] = i;
}

// --- top-k -----------------------------------------------------------------------------------

// (score, id) pairs ordered best first: higher score, then smaller id.
__device__ bool better(float a, uint32_t ia, float b, uint32_t ib) {
    return a > b || (a == b && ia < ib);
}

struct scored_id {
    float score;
    uint32_t id;
};

// The best (score, id) over the block, in thread 0, from each thread's (bs, bi); one slot per
// warp in shared memory (the caller synchronises before the slots are written again).
__device__ scored_id block_best(float bs, uint32_t bi, float* slot_score, uint32_t* slot_id) {
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int o = 16; o > 0; o /= 2) {
        const float os = __shfl_xor_sync(0xffffffffu, bs, o);
        const uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(os, oi, bs, bi)) bs = os, bi = oi;
    }
    if (lane == 0) slot_score[warp] = bs, slot_id[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (uint32_t w = 1; w < blockDim.x / 32; ++w)
            if (better(slot_score[w], slot_id[w], bs, bi)) bs = slot_score[w], bi = slot_id[w];
    return {bs, bi};
}

__global__ void top_k_kernel(const float* scores, const uint32_t* offsets, const uint32_t* ids,
                             uint32_t n_columns, uint32_t k, const float* bias,
                             uint32_t* out_labels, float* out_scores) {
    __shared__ float best_score[32];
    __shared__ uint32_t best_id[32];
    __shared__ float prev_score;
    __shared__ uint32_t prev_id;
    const uint32_t s = blockIdx.x;
    const uint64_t begin = offsets ? offsets[s] : uint64_t(s) * n_columns;
    const uint64_t end = offsets ? offsets[s + 1] : begin + n_columns;
    if (threadIdx.x == 0) prev_score = FLT_MAX, prev_id = 0xffffffffu;
    bool first_round = true;
    for (uint32_t r = 0; r < k; ++r) {
        __syncthreads();
        const float ps = prev_score;
        const uint32_t pi = prev_id;
        // The best entry strictly after the previous pick in the (score desc, id asc) order.
        float bs = -INFINITY;
        uint32_t bi = 0xffffffffu;
        for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
            const uint32_t id = ids ? ids[e] : uint32_t(e - begin);
            const float v = bias ? scores[e] + bias[id] : scores[e];
            if (isnan(v)) continue;
            if (!first_round && !better(ps, pi, v, id)) continue;
            if (better(v, id, bs, bi)) bs = v, bi = id;
        }
        const scored_id best = block_best(bs, bi, best_score, best_id);
        if (threadIdx.x == 0) {
            out_labels[size_t(s) * k + r] = best.id;
            out_scores[size_t(s) * k + r] = best.id == 0xffffffffu ? -INFINITY : best.score;
            prev_score = best.score;
            prev_id = best.id;
        }
        first_round = false;
    }
}

// Most k a thread keeps in its own list in top_k_one_pass_kernel (a larger k takes the
// k-pass kernel above).
constexpr uint32_t top_k_local_max = 32;

// One read of the scores: each thread keeps the best k of its strided slice, sorted best
// first; then k rounds take the best head among the threads' lists (the global best k are
// among the lists' entries). Ids are unique within a sample, so the head holding the picked id
// is the one to advance.
__global__ void top_k_one_pass_kernel(const float* scores, const uint32_t* offsets,
                                      const uint32_t* ids, uint32_t n_columns, uint32_t k,
                                      const float* bias, uint32_t* out_labels, float* out_scores) {
    __shared__ float best_score[32];
    __shared__ uint32_t best_id[32];
    __shared__ uint32_t picked_id;
    const uint32_t s = blockIdx.x;
    const uint64_t begin = offsets ? offsets[s] : uint64_t(s) * n_columns;
    const uint64_t end = offsets ? offsets[s + 1] : begin + n_columns;
    float my_score[top_k_local_max];
    uint32_t my_id[top_k_local_max];
    uint32_t count = 0;
    float worst_score = -INFINITY;  // the k-th entry once the list is full
    uint32_t worst_id = 0xffffffffu;
    for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
        const uint32_t id = ids ? ids[e] : uint32_t(e - begin);
        const float v = bias ? scores[e] + bias[id] : scores[e];
        if (isnan(v)) continue;
        if (count == k && !better(v, id, worst_score, worst_id)) continue;
        uint32_t at = count < k ? count++ : k - 1;  // a full list drops its last entry
        while (at > 0 && better(v, id, my_score[at - 1], my_id[at - 1])) {
            my_score[at] = my_score[at - 1];
            my_id[at] = my_id[at - 1];
            --at;
        }
        my_score[at] = v;
        my_id[at] = id;
        if (count == k) worst_score = my_score[k - 1], worst_id = my_id[k - 1];
    }
    uint32_t head = 0;
    for (uint32_t r = 0; r < k; ++r) {
        const float bs = head < count ? my_score[head] : -INFINITY;
        const uint32_t bi = head < count ? my_id[head] : 0xffffffffu;
        const scored_id best = block_best(bs, bi, best_score, best_id);
        if (threadIdx.x == 0) {
            out_labels[size_t(s) * k + r] = best.id;
            out_scores[size_t(s) * k + r] = best.id == 0xffffffffu ? -INFINITY : best.score;
            picked_id = best.id;
        }
        __syncthreads();
        if (head < count && my_id[head] == picked_id) ++head;
    }
}

}  // namespace

void first_layer_forward(const layer_view& layer, const batch_csr& batch, float* hidden,
                         __nv_bfloat16* hidden16, cudaStream_t stream) {
    if (batch.size == 0) return;  // a grid of no blocks is a launch error
    const uint32_t threads = std::min<uint32_t>(layer.stride, 256);
    if (layer.weights16)
        first_layer_forward_kernel<<<batch.size, threads, 0, stream>>>(
            layer.weights16, layer.bias, layer.width, layer.stride, batch, hidden, hidden16);
    else
        first_layer_forward_kernel<<<batch.size, threads, 0, stream>>>(
            layer.weights, layer.bias, layer.width, layer.stride, batch, hidden, hidden16);
    HSLIDE_CUDA_LAUNCH();
}

void sparse_output_forward(const layer_view& layer, const float* hidden,
                           const __nv_bfloat16* hidden16, bool bf16, const uint32_t* ids,
                           const uint32_t* entry_sample, uint32_t n_entries, float* logits,
                           cudaStream_t stream) {
    if (n_entries == 0) return;
    const uint32_t blocks = blocks_for(n_entries, warps_per_block);
    if (bf16)
        sparse_output_forward_kernel<<<blocks, block_threads, 0, stream>>>(
            layer.weights16, layer.bias, layer.stride, hidden16, ids, entry_sample, n_entries,
            logits);
    else
        sparse_output_forward_kernel<<<blocks, block_threads, 0, stream>>>(
            layer.weights, layer.bias, layer.stride, hidden, ids, entry_sample, n_entries, logits);
    HSLIDE_CUDA_LAUNCH();
}

void softmax_loss(float* logits, const float* bias, const uint32_t* offsets, uint32_t n_columns,
                  bool labels_first, const batch_csr& batch, float* delta, float* loss,
                  cudaStream_t stream) {
    if (batch.size == 0) return;
    softmax_loss_kernel<<<batch.size, block_threads, 0, stream>>>(logits, bias, offsets, n_columns,
                                                                  labels_first, batch, delta, loss);
    HSLIDE_CUDA_LAUNCH();
}

void sparse_output_backward(const layer_view& layer, bool bf16, const uint32_t* offsets,
                            const uint32_t* ids, const float* delta, const float* hidden,
                            uint32_t batch, float* d_hidden, cudaStream_t stream) {
    if (batch == 0) return;
    HSLIDE_ASSERT(layer.stride <= 32 * 4 * max_chunks_per_lane);
    const size_t shared = size_t(warps_per_block) * layer.stride * sizeof(float);
    if (bf16)
        sparse_output_backward_kernel<<<batch, block_threads, shared, stream>>>(
            layer.weights16, layer.stride, offsets, ids, delta, hidden, d_hidden);
    else
        sparse_output_backward_kernel<<<batch, block_threads, shared, stream>>>(
            layer.weights, layer.stride, offsets, ids, delta, hidden, d_hidden);
    HSLIDE_CUDA_LAUNCH();
}

void relu_backward(const float* hidden, uint32_t batch, uint32_t stride, float* d_hidden,
                   cudaStream_t stream) {
    const size_t n = size_t(batch) * stride;
    if (n == 0) return;
    relu_backward_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(hidden, n,
                                                                                     d_hidden);
    HSLIDE_CUDA_LAUNCH();
}

void output_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                      const uint32_t* segment_begin, const uint32_t* n_unique, uint32_t max_unique,
                      const uint32_t* order, const uint32_t* entry_sample, const float* delta,
                      const float* hidden, float inv_batch, const adam_params& adam,
                      cudaStream_t stream) {
    if (max_unique == 0) return;
    HSLIDE_ASSERT(layer.stride <= 32 * 4 * max_chunks_per_lane);
    rows_adam_kernel<false><<<blocks_for(max_unique, warps_per_block), block_threads, 0, stream>>>(
        layer, unique_rows, segment_begin, n_unique, order, entry_sample, delta, hidden, inv_batch,
        adam);
    HSLIDE_CUDA_LAUNCH();
}

void first_layer_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                           const uint32_t* segment_begin, const uint32_t* n_unique,
                           uint32_t max_unique, const uint32_t* order,
                           const uint32_t* nonzero_sample, const float* values,
                           const float* d_hidden, float inv_batch, const adam_params& adam,
                           cudaStream_t stream) {
    if (max_unique == 0) return;
    HSLIDE_ASSERT(layer.stride <= 32 * 4 * max_chunks_per_lane);
    rows_adam_kernel<true><<<blocks_for(max_unique, warps_per_block), block_threads, 0, stream>>>(
        layer, unique_rows, segment_begin, n_unique, order, nonzero_sample, values, d_hidden,
        inv_batch, adam);
    HSLIDE_CUDA_LAUNCH();
}

void untouched_rows_adam(const layer_view& layer, const uint8_t* touched, const adam_params& adam,
                         cudaStream_t stream) {
    const size_t n4 = size_t(layer.rows) * layer.stride / 4;
    untouched_rows_adam_kernel<<<blocks_for(n4, block_threads), block_threads, 0, stream>>>(
        layer, touched, adam);
    HSLIDE_CUDA_LAUNCH();
}

void first_layer_bias_adam(const layer_view& layer, const float* d_hidden, uint32_t batch,
                           float inv_batch, const adam_params& adam, cudaStream_t stream) {
    first_layer_bias_adam_kernel<<<blocks_for(layer.width, block_threads), block_threads, 0,
                                   stream>>>(layer, d_hidden, batch, inv_batch, adam);
    HSLIDE_CUDA_LAUNCH();
}

void dense_adam(const layer_view& layer, const float* gradient, const float* bias_gradient,
                const adam_params& adam, cudaStream_t stream) {
    const size_t n = std::max<size_t>(size_t(layer.rows) * layer.stride / 4, layer.rows);
    dense_adam_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(
        layer, gradient, bias_gradient, adam);
    HSLIDE_CUDA_LAUNCH();
}

void column_sums(const float* delta, uint32_t batch, uint32_t n, float inv_batch,
                 float* bias_gradient, cudaStream_t stream) {
    if (n == 0) return;
    column_sums_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(
        delta, batch, n, inv_batch, bias_gradient);
    HSLIDE_CUDA_LAUNCH();
}

void to_bf16(const float* in, __nv_bfloat16* out, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    to_bf16_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(in, out, n);
    HSLIDE_CUDA_LAUNCH();
}

void nonzero_keys(const batch_csr& batch, uint32_t* keys, uint32_t* sample, uint32_t* index,
                  cudaStream_t stream) {
    if (batch.size == 0) return;
    nonzero_keys_kernel<<<batch.size, 128, 0, stream>>>(batch, keys, sample, index);
    HSLIDE_CUDA_LAUNCH();
}

void iota(uint32_t* index, uint32_t n, cudaStream_t stream) {
    if (n == 0) return;
    iota_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(index, n);
    HSLIDE_CUDA_LAUNCH();
}

void top_k(const float* scores, const uint32_t* offsets, const uint32_t* ids, uint32_t n_columns,
           uint32_t batch, uint32_t k, uint32_t* out_labels, float* out_scores, cudaStream_t stream,
           const float* bias) {
    if (batch == 0 || k == 0) return;  // k = 0 would index the empty list at k - 1
    if (k <= top_k_local_max)
        top_k_one_pass_kernel<<<batch, block_threads, 0, stream>>>(scores, offsets, ids, n_columns,
                                                                   k, bias, out_labels, out_scores);
    else
        top_k_kernel<<<batch, block_threads, 0, stream>>>(scores, offsets, ids, n_columns, k, bias,
                                                          out_labels, out_scores);
    HSLIDE_CUDA_LAUNCH();
}

}  // namespace hslide::gpu
