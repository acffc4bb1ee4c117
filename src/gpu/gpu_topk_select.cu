// Exact top-k selection on the GPU, the chunked pass (see gpu_topk.cuh): per chunk of rows
// one cuBLAS GEMM, then the merge kernel's online log-sum-exp and k-selection.
#include "block_reduce.cuh"
#include "cublas_loader.hpp"
#include "gpu_topk.cuh"
#include "launch.cuh"
#include "top_k_order.cuh"

#include <algorithm>
#include <cfloat>

namespace hslide::gpu {

namespace {

constexpr uint32_t select_threads = 256;
constexpr uint32_t none = top_k_none;

// The merge kernel's block: 512 threads (two blocks a multiprocessor at B 256 on an H100 /
// H200's 132: one wave), each loading `per_thread` scores (+ bias) per round, all in flight
// together: 8,192 scores a round, four rounds a 32,768-row chunk.
constexpr uint32_t merge_threads = 512;
constexpr uint32_t per_thread = 16;
static_assert(per_thread <= 32, "a thread's pending candidates are bits of one word");
// Entries of the merge kernel's shared buffer: the k kept (at most top_k_max), then the
// candidates (at least 2,048: a round that overflows them merges and goes on).
constexpr uint32_t merge_buffer = 4096;
static_assert(top_k_max + 2048 <= merge_buffer, "merge buffer too small");
// At a chunk's end, at most this many candidates are merged into the k kept by rank (each
// entry counts the entries above it: no barrier) rather than by a block-wide bitonic sort.
constexpr uint32_t rank_merge_max = 128;

__global__ void top_k_begin_kernel(uint32_t batch, uint32_t k, float* best_score, uint32_t* best_id,
                                   max_sum* running) {
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < uint64_t(batch) * k) best_score[i] = -INFINITY, best_id[i] = none;
    if (i < batch) running[i] = max_sum{};
}

// One block per sample (merge_threads threads). Dynamic shared memory: merge_buffer floats then
// merge_buffer ids: the k kept (best first), then the candidates.
//
// A round: each thread loads its per_thread scores (+ bias) at once (`vec`: as 4 float4s, where
// the chunk's rows and the bias are 16-byte aligned), folds them into its log-sum-exp pair
// (their maximum, then one exp each: no dependent chain), and marks those that beat the k-th
// kept entry; a warp appends its marked entries to the candidates with one shared atomic. One
// barrier a round, which also says whether any append overflowed the buffer: if so, the kept
// and the full buffer are sorted (k kept), and the entries still marked (in registers) are
// filtered against the new k-th and appended again, until none is left. The threshold only
// rises, so after the first chunk's first round few entries pass (about k ln(R / k) over the
// whole layer). At the chunk's end: no candidate, nothing to write (unless a sort changed the
// kept); a few, each entry's rank among kept + candidates is counted and the first k written;
// many, a bitonic sort.
template <bool vec>
__global__ void __launch_bounds__(merge_threads, 2)
    top_k_merge_kernel(const float* __restrict__ scores, uint32_t n_cols, uint32_t first_id,
                       const float* __restrict__ bias, uint32_t k, float* best_score,
                       uint32_t* best_id, max_sum* running) {
    constexpr uint32_t threads = merge_threads, round = per_thread * threads;
    extern __shared__ float shared_keys[];
    float* key = shared_keys;
    uint32_t* id = reinterpret_cast<uint32_t*>(key + merge_buffer);
    __shared__ uint32_t n_cand;
    __shared__ float scratch[64];
    const uint32_t s = blockIdx.x, lane = threadIdx.x % 32;
    float* out_score = best_score + size_t(s) * k;
    uint32_t* out_id = best_id + size_t(s) * k;
    for (uint32_t i = threadIdx.x; i < k; i += threads) key[i] = out_score[i], id[i] = out_id[i];
    if (threadIdx.x == 0) n_cand = 0;
    __syncthreads();
    // The k-th kept entry, in every thread's registers (changed only by a block-wide sort).
    float t_score = key[k - 1];
    uint32_t t_id = id[k - 1];
    bool sorted = false;  // the kept changed by a sort within the chunk
    const uint32_t capacity = merge_buffer - k;
    // Sorts the kept and the `have` candidates (have <= capacity), keeps the first k and
    // reads the new k-th. Every thread calls it, after the appends (behind a barrier).
    auto sort_merge = [&](uint32_t have) {
        const uint32_t used = k + have;
        const uint32_t n = used <= 1 ? 1u : 1u << (32 - __clz(used - 1));
        for (uint32_t i = used + threadIdx.x; i < n; i += threads) key[i] = -INFINITY, id[i] = none;
        bitonic_best_first(key, id, n);  // begins and ends with a barrier
        t_score = key[k - 1];
        t_id = id[k - 1];
        sorted = true;
    };
    // The column of a thread's entry u in the round at `base` (each column once a round).
    auto column = [&](uint32_t base, uint32_t u) {
        return vec ? base + ((u / 4) * threads + threadIdx.x) * 4 + u % 4
                   : base + u * threads + threadIdx.x;
    };
    const float* row = scores + size_t(s) * n_cols;
    max_sum ms;
    for (uint32_t base = 0; base < n_cols; base += round) {
        // Past the end: -inf, which adds nothing to the sum (the maximum starts at -FLT_MAX).
        float v[per_thread];
        if (vec) {
            // n_cols and first_id are multiples of 4 here: a float4 is all in or all out.
#pragma unroll
            for (uint32_t q = 0; q < per_thread / 4; ++q) {
                const uint32_t j = column(base, 4 * q);
                float4 x = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
                if (j < n_cols) {
                    x = *reinterpret_cast<const float4*>(row + j);
                    if (bias) {
                        const float4 b = *reinterpret_cast<const float4*>(bias + first_id + j);
                        x.x += b.x, x.y += b.y, x.z += b.z, x.w += b.w;
                    }
                }
                v[4 * q] = x.x, v[4 * q + 1] = x.y, v[4 * q + 2] = x.z, v[4 * q + 3] = x.w;
            }
        } else {
#pragma unroll
            for (uint32_t u = 0; u < per_thread; ++u) {
                const uint32_t j = column(base, u);
                v[u] = j < n_cols ? (bias ? row[j] + bias[first_id + j] : row[j]) : -INFINITY;
            }
        }
        // The round's pair: one exp a score, a NaN makes the sum NaN (as max_sum_add does),
        // a score equal to the maximum counts 1 (so +inf gives {inf, count}).
        float m = -FLT_MAX;
#pragma unroll
        for (uint32_t u = 0; u < per_thread; ++u) m = fmaxf(m, v[u]);
        float sum = 0.0f;
#pragma unroll
        for (uint32_t u = 0; u < per_thread; ++u) sum += v[u] == m ? 1.0f : fast_exp(v[u] - m);
        ms = max_sum_combine(ms, max_sum{m, sum});
        // Bit u: entry u beats the k-th kept and is not yet a candidate (NaN never beats it).
        uint32_t pending = 0;
#pragma unroll
        for (uint32_t u = 0; u < per_thread; ++u) {
            const uint32_t j = column(base, u);
            if (j < n_cols && better(v[u], first_id + j, t_score, t_id)) pending |= 1u << u;
        }
        for (;;) {
            bool overflowed = false;  // this thread's: an entry that found the buffer full
#pragma unroll
            for (uint32_t u = 0; u < per_thread; ++u) {
                const bool pass = (pending >> u) & 1u;
                const uint32_t mask = __ballot_sync(0xffffffffu, pass);
                if (mask == 0) continue;  // the warp's common case after the first chunk
                const uint32_t leader = __ffs(int(mask)) - 1;
                uint32_t at = 0;
                if (lane == leader) at = atomicAdd(&n_cand, uint32_t(__popc(int(mask))));
                at = __shfl_sync(0xffffffffu, at, int(leader)) +
                     uint32_t(__popc(int(mask & ((1u << lane) - 1u))));
                if (!pass) continue;
                if (at < capacity) {
                    key[k + at] = v[u];
                    id[k + at] = first_id + column(base, u);
                    pending &= ~(1u << u);
                } else {
                    overflowed = true;  // kept in `pending` for the next pass
                }
            }
            // The barrier ends the appends; its OR is the same in every thread (a shared flag
            // could already be set again by a thread in the next round).
            if (!__syncthreads_or(overflowed)) break;
            // Every slot of the buffer holds a candidate (n_cand > capacity): sort them all.
            // No thread reads n_cand before the sort's barriers.
            if (threadIdx.x == 0) n_cand = 0;
            sort_merge(capacity);
#pragma unroll
            for (uint32_t u = 0; u < per_thread; ++u)
                if (((pending >> u) & 1u) &&
                    !better(v[u], first_id + column(base, u), t_score, t_id))
                    pending &= ~(1u << u);
        }
    }
    // The last round ended with a barrier after its appends, without an overflow.
    const uint32_t have = n_cand;
    if (have > rank_merge_max) {
        sort_merge(have);
        for (uint32_t i = threadIdx.x; i < k; i += threads)
            out_score[i] = key[i], out_id[i] = id[i];
    } else if (have > 0) {
        // Kept entry i ranks i + the candidates above it; a candidate, the kept above it (a
        // binary search: the kept are sorted) + the candidates above it. The ids are distinct
        // (only the kept's padding repeats, and no candidate ties it), so the ranks below k
        // are each written once.
        for (uint32_t i = threadIdx.x; i < k + have; i += threads) {
            const float ks = key[i];
            const uint32_t ki = id[i];
            uint32_t rank = i;
            if (i >= k) {
                uint32_t lo = 0, hi = k;
                while (lo < hi) {
                    const uint32_t mid = (lo + hi) / 2;
                    if (better(key[mid], id[mid], ks, ki))
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                rank = lo;
            }
            for (uint32_t c = k; c < k + have && rank < k; ++c)
                rank += better(key[c], id[c], ks, ki) ? 1u : 0u;
            if (rank < k) out_score[rank] = ks, out_id[rank] = ki;
        }
    } else if (sorted) {
        for (uint32_t i = threadIdx.x; i < k; i += threads)
            out_score[i] = key[i], out_id[i] = id[i];
    }
    ms = block_combine(ms, scratch);
    if (threadIdx.x == 0) running[s] = max_sum_combine(running[s], ms);
}

__global__ void top_k_finish_kernel(uint32_t batch, const max_sum* running, float* log_partition) {
    const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s < batch) log_partition[s] = running[s].max + logf(running[s].sum);
}

}  // namespace

uint32_t top_k_chunk_rows(uint32_t batch, uint32_t rows) {
    // 32 MiB: measured on an H200 at Amazon-670K (B 256, k 64; GEMMs + merges a step): 1.43 ms
    // with 8 MiB chunks, 1.06 with 16, 0.89 with 32, 0.85 with 64 (each chunk's two launches
    // cost more than keeping the chunk in L2 saves).
    const uint64_t floats = (uint64_t{32} << 20) / 4;
    const uint64_t chunk = std::max<uint64_t>(256, floats / std::max(batch, 1u) / 256 * 256);
    return uint32_t(std::min<uint64_t>(chunk, std::max(rows, 1u)));
}

void top_k_begin(uint32_t batch, uint32_t k, top_k_workspace& ws, cudaStream_t stream) {
    if (batch == 0) return;
    ws.best_score.reserve(size_t(batch) * k, "top-k selection");
    ws.best_id.reserve(size_t(batch) * k, "top-k selection");
    ws.running.reserve(batch, "top-k selection");
    ws.log_partition.reserve(batch, "top-k selection");
    const uint64_t n = std::max<uint64_t>(uint64_t(batch) * k, batch);
    top_k_begin_kernel<<<blocks_for(n, select_threads), select_threads, 0, stream>>>(
        batch, k, ws.best_score.data(), ws.best_id.data(), ws.running.data());
    HSLIDE_CUDA_LAUNCH();
}

void top_k_merge_chunk(const float* scores, uint32_t n_cols, uint32_t first_id, const float* bias,
                       uint32_t batch, uint32_t k, top_k_workspace& ws, cudaStream_t stream) {
    if (batch == 0 || n_cols == 0) return;
    HSLIDE_CHECK(k >= 1 && k <= top_k_max,
                 "top-k selection on the GPU takes k from 1 to {}, got {}", top_k_max, k);
    const size_t shared = size_t(merge_buffer) * 8;  // 32 KiB: no opt-in needed
    // float4 loads where every sample's row and the bias are 16-byte aligned (the backend's
    // chunks of a multiple of 4 rows: all but the layer's last).
    const bool vec = n_cols % 4 == 0 && reinterpret_cast<uintptr_t>(scores) % 16 == 0 &&
                     (!bias || reinterpret_cast<uintptr_t>(bias + first_id) % 16 == 0);
    if (vec)
        top_k_merge_kernel<true><<<batch, merge_threads, shared, stream>>>(
            scores, n_cols, first_id, bias, k, ws.best_score.data(), ws.best_id.data(),
            ws.running.data());
    else
        top_k_merge_kernel<false><<<batch, merge_threads, shared, stream>>>(
            scores, n_cols, first_id, bias, k, ws.best_score.data(), ws.best_id.data(),
            ws.running.data());
    HSLIDE_CUDA_LAUNCH();
}

void top_k_finish(uint32_t batch, top_k_workspace& ws, cudaStream_t stream) {
    if (batch == 0) return;
    top_k_finish_kernel<<<blocks_for(batch, select_threads), select_threads, 0, stream>>>(
        batch, ws.running.data(), ws.log_partition.data());
    HSLIDE_CUDA_LAUNCH();
}

void score_top_k(const layer_view& out, const float* hidden, const __nv_bfloat16* hidden16,
                 uint32_t hidden_stride, bool bf16, uint32_t batch, uint32_t k, uint32_t chunk,
                 cublasHandle_t blas, top_k_workspace& ws, cudaStream_t stream) {
    if (batch == 0) return;
    HSLIDE_CHECK(k >= 1 && k <= std::min(top_k_max, out.rows),
                 "top-k selection on the GPU takes k from 1 to min({}, rows = {}), got {}",
                 top_k_max, out.rows, k);
    HSLIDE_CHECK(!bf16 || (out.weights16 && hidden16), "bf16 top-k scoring needs bf16 copies");
    if (chunk == 0) chunk = top_k_chunk_rows(batch, out.rows);
    chunk = std::min(chunk, out.rows);
    ws.chunk_scores.reserve(size_t(batch) * chunk, "top-k score chunk");
    top_k_begin(batch, k, ws, stream);
    const float one = 1.0f, zero = 0.0f;
    for (uint32_t r0 = 0; r0 < out.rows; r0 += chunk) {
        const uint32_t n = std::min(chunk, out.rows - r0);
        // Column-major n x batch = W[r0, r0 + n) . hidden^T: sample s's scores at s * n.
        if (bf16)
            HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
                blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(batch), int(out.width), &one,
                out.weights16 + size_t(r0) * out.stride, CUDA_R_16BF, int(out.stride), hidden16,
                CUDA_R_16BF, int(hidden_stride), &zero, ws.chunk_scores.data(), CUDA_R_32F, int(n),
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
            HSLIDE_CUBLAS_CHECK(
                cublas().sgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(batch), int(out.width),
                               &one, out.weights + size_t(r0) * out.stride, int(out.stride), hidden,
                               int(hidden_stride), &zero, ws.chunk_scores.data(), int(n)));
        top_k_merge_chunk(ws.chunk_scores.data(), n, r0, out.bias, batch, k, ws, stream);
    }
    top_k_finish(batch, ws, stream);
}

}  // namespace hslide::gpu
