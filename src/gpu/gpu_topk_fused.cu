// The fused top-k scoring pass on the GPU (score_top_k_fused; design and model in
// gpu_topk.cuh): a pilot through the chunked pass, then WMMA tiles whose scores never leave
// the chip, then one merge a sample.
#include "block_reduce.cuh"
#include "cublas_loader.hpp"
#include "gpu_topk.cuh"
#include "launch.cuh"
#include "top_k_order.cuh"

#include <mma.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <cstring>

namespace hslide::gpu {

namespace {
constexpr uint32_t none = top_k_none;
}  // namespace

namespace {

constexpr uint32_t fused_rows = 128;                 // output rows a tile (the A operand)
constexpr uint32_t fused_samples = 64;               // samples a tile (the B operand)
constexpr uint32_t fused_threads = 256;              // 8 warps, each 32 rows x 32 samples
constexpr uint32_t fused_max_width = 256;            // the hidden width the tiles take (K)
constexpr uint32_t fused_score_ld = fused_rows + 4;  // floats a sample's scores in shared memory
// The final merge's shared buffer: the k kept and up to fused_buffer - k candidates a sample.
constexpr uint32_t fused_buffer = 8192;
constexpr uint32_t fused_merge_threads = 512;
static_assert(top_k_max < fused_buffer / 2, "the fused candidates need room beside the k kept");
static_assert(fused_rows == 4 * 32 && fused_samples == 2 * 32 && fused_threads == 8 * 32,
              "the warps' 32 x 32 tiles and the epilogue's 4 threads a sample assume these");

// The fused kernel's inputs. Rows [first_row, rows) are scored; the threshold of sample s is
// (kth_score[s * k], kth_id[s * k]): the pilot's k-th kept entry.
struct fused_view {
    const __nv_bfloat16* weights;  // rows x stride (width used)
    const float* bias;             // rows, or null
    const __nv_bfloat16* hidden;   // batch x hidden_stride (width used)
    uint32_t rows, width, stride, hidden_stride, batch, first_row, k_pad, k;
    const float* kth_score;
    const uint32_t* kth_id;
    max_sum* partials;  // gridDim.x x batch: each block's log-sum-exp pair of each sample
    float* cand_score;  // batch x capacity
    uint32_t* cand_id;
    uint32_t* cand_count;  // batch: counts past capacity too (overflow)
    uint32_t capacity;
};

// Shared bytes of the fused kernel: the row tile and the sample tile (bf16, rows of k_pad + 8:
// the 16-byte skew keeps ldmatrix's 8 rows in distinct banks), the score tile, the row tile's
// bias and every sample's running pair.
size_t fused_shared_bytes(uint32_t k_pad, uint32_t batch) {
    const size_t ld = k_pad + 8;
    return (fused_rows + fused_samples) * ld * 2 + size_t(fused_samples) * fused_score_ld * 4 +
           fused_rows * 4 + size_t(batch) * sizeof(max_sum);
}

// Copies `n` rows of `width` bf16 values (src rows `src_stride` apart, `valid` of them real:
// the others zero) into dst rows of `ld`, zero from width to k_pad. vec: 16-byte loads (the
// strides a multiple of 8, the base 16-byte aligned).
template <bool vec>
__device__ void fused_load_tile(const __nv_bfloat16* __restrict__ src, uint32_t src_stride,
                                uint32_t n, uint32_t valid, uint32_t width, uint32_t k_pad,
                                __nv_bfloat16* dst, uint32_t ld) {
    const uint32_t cols8 = k_pad / 8;
    for (uint32_t idx = threadIdx.x; idx < n * cols8; idx += fused_threads) {
        const uint32_t r = idx / cols8, c = (idx % cols8) * 8;
        // Four words of two bf16 each, the lower column in the low half.
        uint32_t word[4] = {0, 0, 0, 0};
        if (r < valid && c < width) {
            const __nv_bfloat16* p = src + size_t(r) * src_stride + c;
            if (vec) {
                // c < width <= stride and the strides are multiples of 8: all 8 are in the row.
                const uint4 raw = *reinterpret_cast<const uint4*>(p);
                word[0] = raw.x, word[1] = raw.y, word[2] = raw.z, word[3] = raw.w;
#pragma unroll
                for (uint32_t w = 0; w < 4; ++w) {
                    if (c + 2 * w >= width)
                        word[w] = 0;
                    else if (c + 2 * w + 1 >= width)
                        word[w] &= 0xffffu;
                }
            } else {
#pragma unroll
                for (uint32_t w = 0; w < 4; ++w) {
                    const uint32_t lo = c + 2 * w < width ? __bfloat16_as_ushort(p[2 * w]) : 0u;
                    const uint32_t hi =
                        c + 2 * w + 1 < width ? __bfloat16_as_ushort(p[2 * w + 1]) : 0u;
                    word[w] = lo | (hi << 16);
                }
            }
        }
        *reinterpret_cast<uint4*>(dst + size_t(r) * ld + c) =
            make_uint4(word[0], word[1], word[2], word[3]);
    }
}

// Scores rows [first_row, rows) against every sample on the tensor cores and keeps only what
// the selection needs: per (block, sample) the online log-sum-exp pair, and the scores that
// beat the sample's threshold, appended to its candidates. A block loops over row tiles
// (blockIdx.x, + gridDim.x, ...: a fixed order, so the pairs are deterministic): it loads the
// tile's 128 rows once, then per tile of 64 samples: loads their hidden rows (L2), 8 warps
// multiply 32 x 32 each (WMMA bf16, fp32 accumulators) over K = k_pad, store the 128 x 64
// scores to shared memory, and 4 threads a sample each take 32 of its rows (row q + 4 i: no
// bank conflicts) + bias: their maximum across the 4 (2 shuffles), one exp a score, the sum
// across the 4, folded into the sample's pair in shared memory by one thread (always the same
// one for a sample); then the filter (rare after the pilot: one global atomic a candidate).
template <bool vec>
__global__ void __launch_bounds__(fused_threads, 2) top_k_fused_kernel(fused_view v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    namespace wmma = nvcuda::wmma;
    extern __shared__ __align__(128) unsigned char fused_shared[];
    const uint32_t ld = v.k_pad + 8;
    __nv_bfloat16* w_tile = reinterpret_cast<__nv_bfloat16*>(fused_shared);
    __nv_bfloat16* h_tile = w_tile + size_t(fused_rows) * ld;
    float* s_tile = reinterpret_cast<float*>(h_tile + size_t(fused_samples) * ld);
    float* bias_tile = s_tile + fused_samples * fused_score_ld;
    max_sum* pair = reinterpret_cast<max_sum*>(bias_tile + fused_rows);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t wm = warp % 4, wn = warp / 4;  // the warp's 32 rows and 32 samples
    const uint32_t n_local = warp * 8 + lane / 4, q = lane % 4;  // the epilogue's sample, part
    for (uint32_t s = threadIdx.x; s < v.batch; s += fused_threads) pair[s] = max_sum{};
    const uint32_t n_tiles = (v.rows - v.first_row + fused_rows - 1) / fused_rows;
    for (uint32_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const uint32_t row0 = v.first_row + tile * fused_rows;
        const uint32_t valid_rows = min(fused_rows, v.rows - row0);
        // The last tile's epilogue is done with bias_tile (and every warp with w_tile).
        __syncthreads();
        fused_load_tile<vec>(v.weights + size_t(row0) * v.stride, v.stride, fused_rows, valid_rows,
                             v.width, v.k_pad, w_tile, ld);
        if (threadIdx.x < fused_rows)
            bias_tile[threadIdx.x] =
                v.bias && threadIdx.x < valid_rows ? v.bias[row0 + threadIdx.x] : 0.0f;
        for (uint32_t st = 0; st < v.batch; st += fused_samples) {
            // The previous sample tile's warps finished reading h_tile before its second
            // barrier, and its epilogue finishes with s_tile before the barrier below.
            fused_load_tile<vec>(v.hidden + size_t(st) * v.hidden_stride, v.hidden_stride,
                                 fused_samples, min(fused_samples, v.batch - st), v.width, v.k_pad,
                                 h_tile, ld);
            __syncthreads();
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
            for (uint32_t kk = 0; kk < v.k_pad; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    wmma::load_matrix_sync(a[i], w_tile + size_t(32 * wm + 16 * i) * ld + kk, ld);
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    wmma::load_matrix_sync(b[j], h_tile + size_t(32 * wn + 16 * j) * ld + kk, ld);
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
            }
            // Row m of the tile, sample n at s_tile[n * fused_score_ld + m].
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    wmma::store_matrix_sync(
                        s_tile + (32 * wn + 16 * j) * fused_score_ld + 32 * wm + 16 * i, acc[i][j],
                        fused_score_ld, wmma::mem_col_major);
            __syncthreads();
            const uint32_t s = st + n_local;
            const bool active = s < v.batch;  // the same for a sample's 4 threads
            const float* col = s_tile + n_local * fused_score_ld;
            float x[fused_rows / 4];
            float m = -FLT_MAX;
#pragma unroll
            for (uint32_t i = 0; i < fused_rows / 4; ++i) {
                const uint32_t r = q + 4 * i;
                x[i] = active && r < valid_rows ? col[r] + bias_tile[r] : -INFINITY;
                m = fmaxf(m, x[i]);
            }
            // As the merge kernel's rounds: a NaN makes the sum NaN, a score equal to the
            // maximum counts 1 (+inf gives {inf, count}), -inf (past the layer) adds nothing.
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            float sum = 0.0f;
#pragma unroll
            for (uint32_t i = 0; i < fused_rows / 4; ++i)
                sum += x[i] == m ? 1.0f : fast_exp(x[i] - m);
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (!active) continue;  // no barrier before the next sample tile's loads
            if (q == 0) pair[s] = max_sum_combine(pair[s], max_sum{m, sum});
            const float t_score = v.kth_score[size_t(s) * v.k];
            const uint32_t t_id = v.kth_id[size_t(s) * v.k];
#pragma unroll
            for (uint32_t i = 0; i < fused_rows / 4; ++i) {
                const uint32_t r = q + 4 * i;
                if (r < valid_rows && better(x[i], row0 + r, t_score, t_id)) {
                    const uint32_t at = atomicAdd(&v.cand_count[s], 1u);
                    if (at < v.capacity) {
                        v.cand_score[size_t(s) * v.capacity + at] = x[i];
                        v.cand_id[size_t(s) * v.capacity + at] = row0 + r;
                    }
                }
            }
        }
    }
    __syncthreads();
    for (uint32_t s = threadIdx.x; s < v.batch; s += fused_threads)
        v.partials[size_t(blockIdx.x) * v.batch + s] = pair[s];
#endif
}

// One block per sample (fused_merge_threads): log_partition from the pilot's pair and every
// fused block's (a fixed order: deterministic), then the k kept (the pilot's, best first) and
// the candidates sorted together (bitonic, in `fused_buffer` entries of dynamic shared
// memory), the first k written back. A sample whose candidates overflowed sets *overflow.
__global__ void __launch_bounds__(fused_merge_threads)
    top_k_fused_finish_kernel(uint32_t k, float* best_score, uint32_t* best_id,
                              const max_sum* running, const max_sum* partials, uint32_t n_parts,
                              uint32_t batch, const float* cand_score, const uint32_t* cand_id,
                              const uint32_t* cand_count, uint32_t capacity, float* log_partition,
                              uint32_t* overflow) {
    extern __shared__ float fused_keys[];
    float* key = fused_keys;
    uint32_t* id = reinterpret_cast<uint32_t*>(key + fused_buffer);
    __shared__ float scratch[64];
    const uint32_t s = blockIdx.x;
    max_sum ms = threadIdx.x == 0 ? running[s] : max_sum{};
    for (uint32_t b = threadIdx.x; b < n_parts; b += blockDim.x)
        ms = max_sum_combine(ms, partials[size_t(b) * batch + s]);
    ms = block_combine(ms, scratch);
    if (threadIdx.x == 0) log_partition[s] = ms.max + logf(ms.sum);
    const uint32_t have = cand_count[s];
    if (have > capacity) {
        if (threadIdx.x == 0) atomicExch(overflow, 1u);
        return;
    }
    if (have == 0) return;  // the pilot's k stand
    float* out_score = best_score + size_t(s) * k;
    uint32_t* out_id = best_id + size_t(s) * k;
    const uint32_t used = k + have;
    const uint32_t n = 1u << (32 - __clz(used - 1));  // used >= 2
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        if (i < k)
            key[i] = out_score[i], id[i] = out_id[i];
        else if (i < used)
            key[i] = cand_score[size_t(s) * capacity + i - k],
            id[i] = cand_id[size_t(s) * capacity + i - k];
        else
            key[i] = -INFINITY, id[i] = none;
    }
    bitonic_best_first(key, id, n);  // begins and ends with a barrier
    for (uint32_t i = threadIdx.x; i < k; i += blockDim.x) out_score[i] = key[i], out_id[i] = id[i];
}

}  // namespace

bool top_k_fused_requested() {
    static const bool requested = [] {
        const char* v = std::getenv("HSLIDE_GPU_TOPK_FUSED");
        return v && std::strcmp(v, "1") == 0;
    }();
    return requested;
}

bool score_top_k_fused(const layer_view& out, const __nv_bfloat16* hidden16, uint32_t hidden_stride,
                       uint32_t batch, uint32_t k, uint32_t pilot_rows, cublasHandle_t blas,
                       top_k_workspace& ws, cudaStream_t stream) {
    if (batch == 0) return true;
    HSLIDE_CHECK(k >= 1 && k <= std::min(top_k_max, out.rows),
                 "top-k selection on the GPU takes k from 1 to min({}, rows = {}), got {}",
                 top_k_max, out.rows, k);
    if (!out.weights16 || !hidden16 || out.width == 0 || out.width > fused_max_width ||
        hidden_stride < out.width)
        return false;
    const uint32_t capacity = fused_buffer - k;
    // The pilot: after it, a row of the rest is a candidate with a chance of about k / P (the
    // k-th best of P rows as the threshold): k (R - P) / P candidates a sample are expected,
    // kept at a quarter of the capacity (the count's spread is its square root; rows ordered
    // by popularity against the pilot are the risk, and overflow falls back).
    uint64_t pilot = pilot_rows;
    if (pilot_rows == fused_auto_pilot) {
        const uint64_t budget = capacity / 4;
        pilot = (uint64_t(k) * out.rows + (k + budget) - 1) / (k + budget);
        pilot = (pilot + 255) / 256 * 256;
    }
    pilot = std::min<uint64_t>(pilot, out.rows);
    if (pilot >= out.rows) return false;  // nothing left to fuse: the cuBLAS pass
    const uint32_t k_pad = (out.width + 15) / 16 * 16;
    const size_t shared = fused_shared_bytes(k_pad, batch);
    const size_t merge_shared = size_t(fused_buffer) * 8;
    const bool vec = out.stride % 8 == 0 && hidden_stride % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(out.weights16) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(hidden16) % 16 == 0;
    const auto kernel = vec ? top_k_fused_kernel<true> : top_k_fused_kernel<false>;
    int device = 0;
    HSLIDE_CUDA_CHECK(cudaGetDevice(&device));
    // The device's checks, the kernels' shared memory and the grid, once per (device, shared
    // bytes, loads): the step waits on the host anyway, so its host calls count.
    top_k_workspace::fused_setup& setup = ws.fused_launch;
    if (setup.device != device || setup.shared != shared || setup.vec != vec) {
        setup = top_k_workspace::fused_setup{device, shared, vec, 0};
        int major = 0, sms = 0, shared_limit = 0;
        HSLIDE_CUDA_CHECK(
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        if (major < 8) return false;  // bf16 WMMA
        HSLIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        HSLIDE_CUDA_CHECK(
            cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        // The same value every time (the most the device allows beside the kernel's static
        // shared memory), as build_top_k_sets does.
        auto allow_shared = [&](auto function, size_t dynamic) {
            cudaFuncAttributes attributes{};
            HSLIDE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, function));
            const size_t room = size_t(shared_limit) -
                                std::min<size_t>(attributes.sharedSizeBytes, size_t(shared_limit));
            if (dynamic > room) return false;
            HSLIDE_CUDA_CHECK(cudaFuncSetAttribute(
                function, cudaFuncAttributeMaxDynamicSharedMemorySize, int(room)));
            return true;
        };
        if (!allow_shared(kernel, shared) || !allow_shared(top_k_fused_finish_kernel, merge_shared))
            return false;
        int per_sm = 0;
        HSLIDE_CUDA_CHECK(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, fused_threads, shared));
        setup.blocks = uint32_t(std::max(per_sm, 0)) * uint32_t(sms);
    }
    if (setup.blocks == 0) return false;
    const uint32_t n_tiles = uint32_t((out.rows - pilot + fused_rows - 1) / fused_rows);
    const uint32_t grid = std::min(n_tiles, setup.blocks);

    ws.fused_partials.reserve(size_t(grid) * batch, "top-k fused partials");
    ws.fused_score.reserve(size_t(batch) * capacity, "top-k fused candidates");
    ws.fused_id.reserve(size_t(batch) * capacity, "top-k fused candidates");
    ws.fused_count.reserve(batch, "top-k fused candidates");
    ws.fused_flag.reserve(1, "top-k fused flag");
    HSLIDE_CUDA_CHECK(cudaMemsetAsync(ws.fused_count.data(), 0, size_t(batch) * 4, stream));
    HSLIDE_CUDA_CHECK(cudaMemsetAsync(ws.fused_flag.data(), 0, 4, stream));

    // The pilot: rows [0, pilot) as score_top_k scores them.
    top_k_begin(batch, k, ws, stream);
    if (pilot > 0) {
        const uint32_t chunk = top_k_chunk_rows(batch, uint32_t(pilot));
        ws.chunk_scores.reserve(size_t(batch) * chunk, "top-k score chunk");
        const float one = 1.0f, zero = 0.0f;
        for (uint32_t r0 = 0; r0 < pilot; r0 += chunk) {
            const uint32_t n = std::min<uint32_t>(chunk, uint32_t(pilot) - r0);
            HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
                blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(batch), int(out.width), &one,
                out.weights16 + size_t(r0) * out.stride, CUDA_R_16BF, int(out.stride), hidden16,
                CUDA_R_16BF, int(hidden_stride), &zero, ws.chunk_scores.data(), CUDA_R_32F, int(n),
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            top_k_merge_chunk(ws.chunk_scores.data(), n, r0, out.bias, batch, k, ws, stream);
        }
    }
    const fused_view view{out.weights16,
                          out.bias,
                          hidden16,
                          out.rows,
                          out.width,
                          out.stride,
                          hidden_stride,
                          batch,
                          uint32_t(pilot),
                          k_pad,
                          k,
                          ws.best_score.data() + (k - 1),
                          ws.best_id.data() + (k - 1),
                          ws.fused_partials.data(),
                          ws.fused_score.data(),
                          ws.fused_id.data(),
                          ws.fused_count.data(),
                          capacity};
    kernel<<<grid, fused_threads, shared, stream>>>(view);
    HSLIDE_CUDA_LAUNCH();
    top_k_fused_finish_kernel<<<batch, fused_merge_threads, merge_shared, stream>>>(
        k, ws.best_score.data(), ws.best_id.data(), ws.running.data(), ws.fused_partials.data(),
        grid, batch, ws.fused_score.data(), ws.fused_id.data(), ws.fused_count.data(), capacity,
        ws.log_partition.data(), ws.fused_flag.data());
    HSLIDE_CUDA_LAUNCH();
    uint32_t overflowed = 0;
    HSLIDE_CUDA_CHECK(
        cudaMemcpyAsync(&overflowed, ws.fused_flag.data(), 4, cudaMemcpyDeviceToHost, stream));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    ++ws.fused_runs;
    if (overflowed) ++ws.fused_fallbacks;
    return overflowed == 0;
}

}  // namespace hslide::gpu
