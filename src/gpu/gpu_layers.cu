// The GPU backend's layer kernels (see gpu_layers.cuh for what each computes).
#include "block_reduce.cuh"
#include "gpu_layers.cuh"
#include "launch.cuh"
#include "load4.cuh"
#include "logistic.hpp"
#include "online_softmax.hpp"

#include <algorithm>
#include <cfloat>

namespace hslide::gpu {

namespace {

constexpr int block_threads = 256;
constexpr int warps_per_block = block_threads / 32;
// Hidden rows of up to 1024 floats: 256 float4 chunks, 8 per lane of a warp.
constexpr int max_chunks_per_lane = 8;

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

// Read-only loads (the read-only data path) for data a kernel never writes.
__device__ float4 load4_ro(const float* row, uint32_t q) {
    return __ldg(reinterpret_cast<const float4*>(row) + q);
}
__device__ float4 load4_ro(const __nv_bfloat16* row, uint32_t q) {
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(row) + q);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

// The gather kernels below (row Adam, sparse backward) are templates on C, the float4 chunks
// of a row each lane owns (chunk q = lane + 32 i, i < C), instantiated for C = 1, 2, 4, 8:
// rows of up to 128, 256, 512, 1024 floats. A chunk's registers are then indexed at compile
// time, and a narrow row does not pay the widest row's registers.
inline int chunks_per_lane(uint32_t stride) {
    const uint32_t chunks = (stride / 4 + 31) / 32;
    return chunks <= 1 ? 1 : chunks <= 2 ? 2 : chunks <= 4 ? 4 : 8;
}

// Entries whose vector loads a lane issues together before using any: `loads` float4 loads
// in flight per lane whatever the row width (C float4 an entry), which bounds the registers
// they take. The backward takes 8 (its rows come from DRAM); the row update 4 (its vectors
// are L2-resident, and its registers also hold the row's w, m, v: occupancy matters more).
template <int C, int loads>
constexpr int entries_in_flight() {
    return C >= loads ? 1 : loads / C;
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

// Block s's sample in the set losses' layout (softmax_loss in gpu_layers.cuh): its entries
// [begin, end) and its labels. An untrained one (no labels, or no entries) gets deltas and loss
// 0 here and trained() false.
struct set_sample {
    uint32_t s;
    uint64_t begin, end;
    uint32_t label_begin, n_labels;

    __device__ set_sample(const uint32_t* offsets, uint32_t n_columns, const batch_csr& batch)
        : s(blockIdx.x),
          begin(offsets ? offsets[s] : uint64_t(s) * n_columns),
          end(offsets ? offsets[s + 1] : begin + n_columns),
          label_begin(batch.label_offsets[s]),
          n_labels(batch.label_offsets[s + 1] - label_begin) {}

    __device__ bool trained(float* delta, float* loss) const {
        if (n_labels > 0 && end > begin) return true;
        for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x) delta[e] = 0.0f;
        if (threadIdx.x == 0) loss[s] = 0.0f;
        return false;
    }
    // Entry e's logit, the column's bias added first (stored back) where the entries are the
    // dense columns; read once per entry, by the thread that owns it.
    __device__ float logit(float* logits, const float* bias, const uint32_t* offsets,
                           uint64_t e) const {
        if (offsets || !bias) return logits[e];
        return logits[e] += bias[e - begin];
    }
    // The entry of label i: the i-th entry with the labels first, else the label's column.
    __device__ uint64_t label_entry(uint32_t i, bool labels_first, const batch_csr& batch) const {
        return labels_first ? begin + i : begin + batch.label_ids[label_begin + i];
    }
};

__global__ void softmax_loss_kernel(float* logits, const float* bias, const uint32_t* offsets,
                                    uint32_t n_columns, bool labels_first, batch_csr batch,
                                    float* delta, float* loss) {
    __shared__ float scratch[64];
    const set_sample x(offsets, n_columns, batch);
    if (!x.trained(delta, loss)) return;
    const uint64_t begin = x.begin, end = x.end;
    const uint32_t n_labels = x.n_labels;
    // Online maximum: the maximum and the partition function in one pass over the logits.
    max_sum ms;
    for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x)
        ms = max_sum_add(ms, x.logit(logits, bias, offsets, e));
    ms = block_combine_shared(ms, scratch);
    const float m = ms.max, inv_sum = 1.0f / ms.sum, log_partition = m + logf(ms.sum);
    for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x)
        delta[e] = __expf(logits[e] - m) * inv_sum;  // this thread's own writes above
    __syncthreads();
    const float target = 1.0f / float(n_labels);
    float sample_loss = 0.0f;
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
        const uint64_t e = x.label_entry(i, labels_first, batch);
        // Atomic: over dense columns (labels_first false) a label listed twice is one entry.
        atomicAdd(&delta[e], -target);
        sample_loss -= target * (logits[e] - log_partition);
    }
    sample_loss = block_sum(sample_loss, scratch);
    if (threadIdx.x == 0) loss[x.s] = sample_loss;
}

__global__ void logistic_loss_kernel(float* logits, const float* bias, const uint32_t* offsets,
                                     uint32_t n_columns, bool labels_first, batch_csr batch,
                                     float* delta, float* loss) {
    __shared__ float scratch[64];
    const set_sample x(offsets, n_columns, batch);
    if (!x.trained(delta, loss)) return;
    const uint64_t begin = x.begin, end = x.end;
    float sample_loss = 0.0f;
    for (uint64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
        const float l = x.logit(logits, bias, offsets, e);
        sample_loss += softplus(l);
        delta[e] = sigmoid(l);
    }
    __syncthreads();  // the labels' logits and deltas may be other threads' entries
    for (uint32_t i = threadIdx.x; i < x.n_labels; i += blockDim.x) {
        const uint64_t e = x.label_entry(i, labels_first, batch);
        atomicAdd(&delta[e], -1.0f);  // a label listed twice counts twice, whichever thread
        sample_loss -= logits[e];
    }
    sample_loss = block_sum(sample_loss, scratch);
    if (threadIdx.x == 0) loss[x.s] = sample_loss;
}

// Most warps of a backward block (one block a sample).
constexpr int backward_max_warps = 16;

// d_hidden of one sample (one block, up to 16 warps; the old kernel had 8 warps a sample and
// one dependent ids[e] -> row load chain in flight a warp, 0.40 TB/s). The block's warps take
// the sample's entries 32 consecutive at a time, round-robin: each lane loads one entry's id
// and delta (one coalesced load for 32 entries), then the warp reads the entries' weight
// rows entries_in_flight<C, 8>() at a time (8 at hidden 128), all of a group's loads issued
// before any is used. Each warp's sum is in its entries' order; the warps' partial sums go
// to shared memory and are added in warp order, so the result does not depend on timing.
//
// Bandwidth: B A rows of H w bytes are gathered (Amazon-670K, LSH: 413 MB a step in bf16;
// popular rows hit L2, DRAM moved 170 MB). In flight at once: ~31 warps an SM (256 blocks of
// 16 warps on 132 SMs) x 8 rows x 256 B = 64 KB an SM, enough for the copy rate at ~2 us of
// latency, so the kernel should be bound by L2 and DRAM, not by latency: ~1.5-2 TB/s of
// DRAM bytes, ~100-150 us a step (was 428).
template <class W, int C>
__global__ void __launch_bounds__(backward_max_warps * 32)
    sparse_output_backward_kernel(const W* weights, uint32_t stride, const uint32_t* offsets,
                                  const uint32_t* ids, const float* delta, const float* hidden,
                                  float* d_hidden) {
    extern __shared__ float partial[];  // warps x stride
    constexpr int L = entries_in_flight<C, 8>();
    const uint32_t s = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t n_warps = blockDim.x / 32, chunks = stride / 4;
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    float4 acc[C];
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] = make_float4(0, 0, 0, 0);
    for (uint32_t first = begin + 32 * warp; first < end; first += 32 * n_warps) {
        const uint32_t n = min(32u, end - first);
        uint32_t my_id = 0;
        float my_delta = 0.0f;
        if (lane < n) {
            my_id = ids[first + lane];
            my_delta = delta[first + lane];
        }
        // j is a multiple of L (which divides 32) below n <= 32: lanes j + t stay below 32.
        for (uint32_t j = 0; j < n; j += L) {
            float d[L];
            float4 x[L][C];
#pragma unroll
            for (int t = 0; t < L; ++t) {
                d[t] = __shfl_sync(0xffffffffu, my_delta, j + t);
                const uint32_t id = __shfl_sync(0xffffffffu, my_id, j + t);
                const W* row = weights + size_t(id) * stride;
#pragma unroll
                for (int i = 0; i < C; ++i) {
                    const uint32_t q = lane + 32 * i;
                    x[t][i] = j + t < n && q < chunks ? load4_ro(row, q) : make_float4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int t = 0; t < L; ++t) {
                if (j + t >= n) break;
#pragma unroll
                for (int i = 0; i < C; ++i)
                    if (lane + 32 * i < chunks) acc[i] = fma4(d[t], x[t][i], acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < C; ++i) {
        const uint32_t q = lane + 32 * i;
        if (q < chunks) reinterpret_cast<float4*>(partial + size_t(warp) * stride)[q] = acc[i];
    }
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < stride; c += blockDim.x) {
        float sum = 0.0f;
        for (uint32_t w = 0; w < n_warps; ++w) sum += partial[size_t(w) * stride + c];
        d_hidden[size_t(s) * stride + c] = hidden[size_t(s) * stride + c] > 0.0f ? sum : 0.0f;
    }
}

template <class W>
__global__ void hidden_gradient_share_kernel(const W* weights, uint32_t stride, uint32_t width,
                                             const uint32_t* offsets, const uint32_t* ids,
                                             const float* delta, double* share) {
    const uint32_t s = blockIdx.x, begin = offsets[s], end = offsets[s + 1];
    for (uint32_t j = threadIdx.x; j < width; j += blockDim.x) {
        double acc = 0.0;
        for (uint32_t e = begin; e < end; ++e)
            acc += double(delta[e]) * double(float(weights[size_t(ids[e]) * stride + j]));
        share[size_t(s) * width + j] = acc;
    }
}

__global__ void relu_backward_kernel(const float* hidden, size_t n, float* d_hidden) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n && !(hidden[i] > 0.0f)) d_hidden[i] = 0.0f;
}

// --- row-sparse gradients and Adam -----------------------------------------------------------

// Adam on four weights held in registers (the same arithmetic as adam4), then their stores.
__device__ void adam4_in_registers(float4& w, float4& m, float4& v, float4 g,
                                   const adam_params& a) {
    adam_element(w.x, m.x, v.x, g.x, a);
    adam_element(w.y, m.y, v.y, g.y, a);
    adam_element(w.z, m.z, v.z, g.z, a);
    adam_element(w.w, m.w, v.w, g.w, a);
}
__device__ void store4(const layer_view& layer, size_t offset, float4 w, float4 m, float4 v) {
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

// Blocks of the row update an SM should hold: at hidden 128 (C = 1) 4 of 256 threads, 32
// warps, at most 64 registers a thread (the row's w, m, v take 12, its gradient 4, the
// vectors in flight 16, their addresses and the row's pointers most of the rest: 5 blocks'
// 51 registers spill). Wider rows take the registers they need (no spills).
constexpr int rows_adam_min_blocks(int C) {
    return C == 1 ? 4 : 1;
}

// One warp per distinct row (warps loop over the rows, u += every warp of the grid): the
// row's gradient over its segment, in entry order, then Adam. `first_layer`: entries are
// nonzeros (value * d_hidden of their sample), no bias; otherwise entries are active-set
// entries (delta * hidden of their sample) with a bias gradient. C: float4 chunks a lane owns
// (chunks_per_lane); the default fits any stride the launchers allow.
//
// Latency is what held the old kernel to 1.5 TB/s: its w, m, v loads were issued after the
// gradient loop, whose every entry was a dependent chain order[k] -> e -> scale[e] /
// entry_sample[e] -> the sample's vector. Here the row's w, m, v (and bias) loads are issued
// first, so they are in flight during the gradient; the segment's indices are loaded 32 at a
// time, one per lane (two dependent loads for 32 entries, not for each), and passed around
// by shuffles; and the samples' vectors (L2-resident: the batch's hidden rows) are read
// entries_in_flight<C, 4>() entries at a time. Per lane the sums are the old kernel's, in the
// same order, so the result is bitwise the same.
//
// Bandwidth: a row moves its w, m, v both ways and its bf16 copy (3.3 KB at hidden 128);
// LSH at Amazon-670K touches ~570K rows a step, 2.18 GB. With 32 warps an SM, each with a
// row's 1.5 KB of loads in flight from its start, ~48 KB an SM are in flight, above the ~33-49
// KB the copy rate needs at 1-1.5 us of latency: ~3-3.5 TB/s (the copy's 4.3 less the index and
// gradient reads, and the writes' turnaround), ~0.65 ms for both layers' launches (was 1.42).
template <bool first_layer, int C = max_chunks_per_lane>
__global__ void __launch_bounds__(block_threads, rows_adam_min_blocks(C))
    rows_adam_kernel(layer_view layer, const uint32_t* unique_rows, const uint32_t* segment_begin,
                     const uint32_t* n_unique, const uint32_t* order, const uint32_t* entry_sample,
                     const float* scale, const float* vectors, float inv_batch, adam_params adam) {
    constexpr int L = entries_in_flight<C, 4>();
    const uint32_t lane = threadIdx.x % 32, chunks = layer.stride / 4;
    const uint32_t n_rows = *n_unique, warps = gridDim.x * (blockDim.x / 32);
    // A warp's rows are u, u + warps, ...: the next one's index and segment are loaded while
    // this one is updated, one dependent load fewer on each row's path.
    uint32_t u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    uint32_t row = 0xffffffffu, seg_begin = 0, seg_end = 0;
    if (u < n_rows) {
        row = unique_rows[u];
        seg_begin = segment_begin[u];
        seg_end = segment_begin[u + 1];
    }
    for (; u < n_rows; u += warps) {
        const uint32_t next = u + warps;
        uint32_t next_row = 0xffffffffu, next_begin = 0, next_end = 0;
        if (next < n_rows) {
            next_row = unique_rows[next];
            next_begin = segment_begin[next];
            next_end = segment_begin[next + 1];
        }
        if (row != 0xffffffffu) {  // UINT32_MAX: nonzeros of points without labels
            const size_t base = size_t(row) * layer.stride;
            float4 w[C], m[C], v[C];
#pragma unroll
            for (int i = 0; i < C; ++i) {
                const uint32_t q = lane + 32 * i;
                const bool mine = q < chunks;
                w[i] = mine ? load4(layer.weights + base, q) : make_float4(0, 0, 0, 0);
                m[i] = mine ? load4(layer.adam_m + base, q) : make_float4(0, 0, 0, 0);
                v[i] = mine ? load4(layer.adam_v + base, q) : make_float4(0, 0, 0, 0);
            }
            float bias = 0.0f, bias_m = 0.0f, bias_v = 0.0f;
            if (!first_layer && lane == 0) {
                bias = layer.bias[row];
                bias_m = layer.bias_m[row];
                bias_v = layer.bias_v[row];
            }
            float4 acc[C];
#pragma unroll
            for (int i = 0; i < C; ++i) acc[i] = make_float4(0, 0, 0, 0);
            float bias_grad = 0.0f;
            for (uint32_t first = seg_begin; first < seg_end; first += 32) {
                const uint32_t n = min(32u, seg_end - first);
                float my_scale = 0.0f;
                uint32_t my_sample = 0;
                if (lane < n) {
                    const uint32_t e = order[first + lane];
                    my_scale = scale[e];
                    my_sample = entry_sample[e];
                }
                // j is a multiple of L (which divides 32) below n <= 32: lanes j + t stay below 32.
                for (uint32_t j = 0; j < n; j += L) {
                    float d[L];
                    float4 x[L][C];
#pragma unroll
                    for (int t = 0; t < L; ++t) {
                        d[t] = __shfl_sync(0xffffffffu, my_scale, j + t);
                        const uint32_t sample = __shfl_sync(0xffffffffu, my_sample, j + t);
                        const float* vec = vectors + size_t(sample) * layer.stride;
#pragma unroll
                        for (int i = 0; i < C; ++i) {
                            const uint32_t q = lane + 32 * i;
                            x[t][i] = j + t < n && q < chunks ? load4_ro(vec, q)
                                                              : make_float4(0, 0, 0, 0);
                        }
                    }
#pragma unroll
                    for (int t = 0; t < L; ++t) {
                        if (j + t >= n) break;
                        bias_grad += d[t];
#pragma unroll
                        for (int i = 0; i < C; ++i)
                            if (lane + 32 * i < chunks) acc[i] = fma4(d[t], x[t][i], acc[i]);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < C; ++i) {
                const uint32_t q = lane + 32 * i;
                if (q >= chunks) continue;
                adam4_in_registers(w[i], m[i], v[i], scale4(acc[i], inv_batch), adam);
                store4(layer, base + 4 * size_t(q), w[i], m[i], v[i]);
            }
            if (!first_layer && lane == 0) {
                adam_element(bias, bias_m, bias_v, bias_grad * inv_batch, adam);
                layer.bias[row] = bias;
                layer.bias_m[row] = bias_m;
                layer.bias_v[row] = bias_v;
            }
        }
        row = next_row;
        seg_begin = next_begin;
        seg_end = next_end;
    }
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

template <class G>
__global__ void dense_adam_kernel(layer_view layer, const G* gradient, const float* bias_gradient,
                                  adam_params adam) {
    const size_t q = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t n4 = size_t(layer.rows) * layer.stride / 4;
    if (q < n4) adam4(layer, 4 * q, load4(gradient, q), adam);
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

void logistic_loss(float* logits, const float* bias, const uint32_t* offsets, uint32_t n_columns,
                   bool labels_first, const batch_csr& batch, float* delta, float* loss,
                   cudaStream_t stream) {
    if (batch.size == 0) return;
    logistic_loss_kernel<<<batch.size, block_threads, 0, stream>>>(
        logits, bias, offsets, n_columns, labels_first, batch, delta, loss);
    HSLIDE_CUDA_LAUNCH();
}

namespace {

template <class W, int C>
void launch_sparse_output_backward(const W* weights, uint32_t stride, const uint32_t* offsets,
                                   const uint32_t* ids, const float* delta, const float* hidden,
                                   uint32_t batch, float* d_hidden, cudaStream_t stream) {
    // The warps' partial sums take warps x stride floats of shared memory: at most 48 KB (the
    // default limit), so 12 warps at stride 1024.
    const uint32_t warps =
        std::min<uint32_t>(backward_max_warps, std::max<uint32_t>(1, 48 * 1024 / (4 * stride)));
    const size_t shared = size_t(warps) * stride * sizeof(float);
    sparse_output_backward_kernel<W, C><<<batch, warps * 32, shared, stream>>>(
        weights, stride, offsets, ids, delta, hidden, d_hidden);
    HSLIDE_CUDA_LAUNCH();
}

template <class W>
void sparse_output_backward_of(const W* weights, uint32_t stride, const uint32_t* offsets,
                               const uint32_t* ids, const float* delta, const float* hidden,
                               uint32_t batch, float* d_hidden, cudaStream_t stream) {
    switch (chunks_per_lane(stride)) {
        case 1:
            launch_sparse_output_backward<W, 1>(weights, stride, offsets, ids, delta, hidden, batch,
                                                d_hidden, stream);
            break;
        case 2:
            launch_sparse_output_backward<W, 2>(weights, stride, offsets, ids, delta, hidden, batch,
                                                d_hidden, stream);
            break;
        case 4:
            launch_sparse_output_backward<W, 4>(weights, stride, offsets, ids, delta, hidden, batch,
                                                d_hidden, stream);
            break;
        default:
            launch_sparse_output_backward<W, 8>(weights, stride, offsets, ids, delta, hidden, batch,
                                                d_hidden, stream);
    }
}

}  // namespace

void sparse_output_backward(const layer_view& layer, bool bf16, const uint32_t* offsets,
                            const uint32_t* ids, const float* delta, const float* hidden,
                            uint32_t batch, float* d_hidden, cudaStream_t stream) {
    if (batch == 0) return;
    HSLIDE_ASSERT(layer.stride <= 32 * 4 * max_chunks_per_lane);
    if (bf16)
        sparse_output_backward_of(layer.weights16, layer.stride, offsets, ids, delta, hidden, batch,
                                  d_hidden, stream);
    else
        sparse_output_backward_of(layer.weights, layer.stride, offsets, ids, delta, hidden, batch,
                                  d_hidden, stream);
}

void hidden_gradient_share_f64(const layer_view& layer, bool bf16, const uint32_t* offsets,
                               const uint32_t* ids, const float* delta, uint32_t batch,
                               double* share, cudaStream_t stream) {
    if (batch == 0) return;
    // A warp's lanes read consecutive units of a row (coalesced); the entries one after the
    // other, as the reference adds them.
    const uint32_t threads = std::min<uint32_t>(1024, (layer.width + 31) / 32 * 32);
    if (bf16)
        hidden_gradient_share_kernel<<<batch, threads, 0, stream>>>(
            layer.weights16, layer.stride, layer.width, offsets, ids, delta, share);
    else
        hidden_gradient_share_kernel<<<batch, threads, 0, stream>>>(
            layer.weights, layer.stride, layer.width, offsets, ids, delta, share);
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

namespace {

// The rows kernel's grid: one wave of resident blocks (warps then loop over the rows), or
// fewer when there are fewer rows. A grid of one block a row would launch a block for every
// entry the step could have touched (max_unique is the entry count), most of them idle.
template <bool first_layer, int C>
uint32_t rows_adam_blocks(uint32_t max_unique) {
    int device = 0, sms = 0, per_sm = 0;
    HSLIDE_CUDA_CHECK(cudaGetDevice(&device));
    HSLIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    HSLIDE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, rows_adam_kernel<first_layer, C>, block_threads, 0));
    const uint32_t resident = uint32_t(std::max(sms, 1) * std::max(per_sm, 1));
    return std::min(blocks_for(max_unique, warps_per_block), resident);
}

template <bool first_layer, int C>
void launch_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                      const uint32_t* segment_begin, const uint32_t* n_unique, uint32_t max_unique,
                      const uint32_t* order, const uint32_t* entry_sample, const float* scale,
                      const float* vectors, float inv_batch, const adam_params& adam,
                      cudaStream_t stream) {
    rows_adam_kernel<first_layer, C>
        <<<rows_adam_blocks<first_layer, C>(max_unique), block_threads, 0, stream>>>(
            layer, unique_rows, segment_begin, n_unique, order, entry_sample, scale, vectors,
            inv_batch, adam);
    HSLIDE_CUDA_LAUNCH();
}

template <bool first_layer>
void rows_adam(const layer_view& layer, const uint32_t* unique_rows, const uint32_t* segment_begin,
               const uint32_t* n_unique, uint32_t max_unique, const uint32_t* order,
               const uint32_t* entry_sample, const float* scale, const float* vectors,
               float inv_batch, const adam_params& adam, cudaStream_t stream) {
    if (max_unique == 0) return;
    HSLIDE_ASSERT(layer.stride <= 32 * 4 * max_chunks_per_lane);
    switch (chunks_per_lane(layer.stride)) {
        case 1:
            launch_rows_adam<first_layer, 1>(layer, unique_rows, segment_begin, n_unique,
                                             max_unique, order, entry_sample, scale, vectors,
                                             inv_batch, adam, stream);
            break;
        case 2:
            launch_rows_adam<first_layer, 2>(layer, unique_rows, segment_begin, n_unique,
                                             max_unique, order, entry_sample, scale, vectors,
                                             inv_batch, adam, stream);
            break;
        case 4:
            launch_rows_adam<first_layer, 4>(layer, unique_rows, segment_begin, n_unique,
                                             max_unique, order, entry_sample, scale, vectors,
                                             inv_batch, adam, stream);
            break;
        default:
            launch_rows_adam<first_layer, 8>(layer, unique_rows, segment_begin, n_unique,
                                             max_unique, order, entry_sample, scale, vectors,
                                             inv_batch, adam, stream);
    }
}

}  // namespace

void output_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                      const uint32_t* segment_begin, const uint32_t* n_unique, uint32_t max_unique,
                      const uint32_t* order, const uint32_t* entry_sample, const float* delta,
                      const float* hidden, float inv_batch, const adam_params& adam,
                      cudaStream_t stream) {
    rows_adam<false>(layer, unique_rows, segment_begin, n_unique, max_unique, order, entry_sample,
                     delta, hidden, inv_batch, adam, stream);
}

void first_layer_rows_adam(const layer_view& layer, const uint32_t* unique_rows,
                           const uint32_t* segment_begin, const uint32_t* n_unique,
                           uint32_t max_unique, const uint32_t* order,
                           const uint32_t* nonzero_sample, const float* values,
                           const float* d_hidden, float inv_batch, const adam_params& adam,
                           cudaStream_t stream) {
    rows_adam<true>(layer, unique_rows, segment_begin, n_unique, max_unique, order, nonzero_sample,
                    values, d_hidden, inv_batch, adam, stream);
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

template <class G>
void dense_adam(const layer_view& layer, const G* gradient, const float* bias_gradient,
                const adam_params& adam, cudaStream_t stream) {
    const size_t n = std::max<size_t>(size_t(layer.rows) * layer.stride / 4, layer.rows);
    dense_adam_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(
        layer, gradient, bias_gradient, adam);
    HSLIDE_CUDA_LAUNCH();
}
template void dense_adam(const layer_view&, const float*, const float*, const adam_params&,
                         cudaStream_t);
template void dense_adam(const layer_view&, const __nv_bfloat16*, const float*, const adam_params&,
                         cudaStream_t);

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

}  // namespace hslide::gpu
