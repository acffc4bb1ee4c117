// Prediction's top-k on the GPU (gpu_layers.cuh's top_k): the k best (score, id) of each
// sample over its active set (LSH scoring) or over consecutive columns, in the order of
// top_k_order.cuh's better().
#include "gpu_layers.cuh"
#include "launch.cuh"
#include "top_k_order.cuh"

#include <cfloat>

namespace hslide::gpu {

namespace {

constexpr int block_threads = 256;

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
