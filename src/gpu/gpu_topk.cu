// Exact top-k active sets on the GPU (see gpu_topk.cuh).
#include "block_reduce.cuh"
#include "cublas_loader.hpp"
#include "gpu_topk.cuh"
#include "launch.cuh"

#include <mma.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <cstring>

namespace hslide::gpu {

namespace {

constexpr uint32_t select_threads = 256;
constexpr uint32_t none = 0xffffffffu;
constexpr uint32_t empty_slot = 0xffffffffu;
constexpr uint32_t taken = 0xffffffffu;     // a slot's claim once its id is in the set
constexpr uint32_t fill_bit = 0x80000000u;  // marks a fill id in the sets' sort

uint32_t next_pow2(uint64_t n) {
    HSLIDE_CHECK(n <= (uint64_t{1} << 31), "a top-k buffer of {} entries is too large", n);
    uint32_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

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

// (score, id) ranks above (bs, bi): a higher score, or an equal one and a smaller id.
__device__ bool better(float a, uint32_t ia, float b, uint32_t ib) {
    return a > b || (a == b && ia < ib);
}

// Sorts key/id[0, n) (n a power of two) best first; every thread of the block calls it.
__device__ void bitonic_best_first(float* key, uint32_t* id, uint32_t n) {
    for (uint32_t size = 2; size <= n; size <<= 1)
        for (uint32_t stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            for (uint32_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
                const uint32_t i = 2 * t - (t & (stride - 1)), j = i + stride;
                const bool up = (i & size) == 0;  // this run best first
                const bool swap = up ? better(key[j], id[j], key[i], id[i])
                                     : better(key[i], id[i], key[j], id[j]);
                if (swap) {
                    const float ks = key[i];
                    key[i] = key[j];
                    key[j] = ks;
                    const uint32_t is = id[i];
                    id[i] = id[j];
                    id[j] = is;
                }
            }
        }
    __syncthreads();
}

// Sorts v[0, n) ascending (n a power of two).
__device__ void bitonic_ascending(uint32_t* v, uint32_t n) {
    for (uint32_t size = 2; size <= n; size <<= 1)
        for (uint32_t stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            for (uint32_t t = threadIdx.x; t < n / 2; t += blockDim.x) {
                const uint32_t i = 2 * t - (t & (stride - 1)), j = i + stride;
                const bool up = (i & size) == 0;
                if (up ? v[j] < v[i] : v[i] < v[j]) {
                    const uint32_t x = v[i];
                    v[i] = v[j];
                    v[j] = x;
                }
            }
        }
    __syncthreads();
}

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

struct set_view {
    uint32_t* ids;
    uint32_t* hits;
    uint32_t mask;
    uint32_t shift;
};

__device__ uint32_t set_find_or_insert(const set_view& set, uint32_t id, bool* inserted) {
    uint32_t slot = (id * 2654435761u) >> set.shift;
    for (;;) {
        const uint32_t prev = atomicCAS(&set.ids[slot], empty_slot, id);
        if (prev == empty_slot || prev == id) {
            if (inserted) *inserted = prev == empty_slot;
            return slot;
        }
        slot = (slot + 1) & set.mask;
    }
}

__device__ uint32_t gcd(uint32_t a, uint32_t b) {
    while (b) {
        const uint32_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

// One block per sample. Dynamic shared memory: `sort_size` ids (the part after the labels).
__global__ void top_k_sets_kernel(const uint32_t* best_id, uint32_t k,
                                  const uint32_t* label_offsets, const uint32_t* label_ids,
                                  uint32_t fill, uint32_t n_items, uint64_t seed, fill_pool pool,
                                  uint32_t slots, uint32_t* global_ids, uint32_t* global_hits,
                                  uint32_t max_per_sample, uint32_t sort_size, uint32_t* padded,
                                  uint32_t* counts, uint32_t* drawn_from) {
    extern __shared__ uint32_t tail[];
    __shared__ uint32_t n_out;
    const uint32_t s = blockIdx.x;
    const bool with_labels = label_offsets != nullptr;
    const uint32_t label_begin = with_labels ? label_offsets[s] : 0;
    const uint32_t n_labels = with_labels ? label_offsets[s + 1] - label_begin : 0;
    if (with_labels && n_labels == 0) {  // nothing to train on: no set
        if (threadIdx.x == 0) counts[s] = 0, drawn_from[s] = 0;
        return;
    }
    set_view set{global_ids + size_t(s) * slots, global_hits + size_t(s) * slots, slots - 1,
                 32 - uint32_t(__ffs(int(slots)) - 1)};
    uint32_t* out = padded + size_t(s) * max_per_sample;
    for (uint32_t i = threadIdx.x; i < slots; i += blockDim.x)
        set.ids[i] = empty_slot, set.hits[i] = 0;
    if (threadIdx.x == 0) n_out = n_labels;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
        const uint32_t label = label_ids[label_begin + i];
        out[i] = label;
        set.hits[set_find_or_insert(set, label, nullptr)] = taken;
    }
    __syncthreads();
    // The top-k ids that are not labels (ids are unique: only a label is found present).
    for (uint32_t i = threadIdx.x; i < k; i += blockDim.x) {
        const uint32_t id = best_id[size_t(s) * k + i];
        if (id == none) continue;
        bool inserted = false;
        const uint32_t slot = set_find_or_insert(set, id, &inserted);
        if (!inserted) continue;
        set.hits[slot] = taken;
        out[atomicAdd(&n_out, 1u)] = id;
    }
    __syncthreads();
    const uint32_t chosen = n_out;
    const uint32_t target = min(fill, n_items);
    if (chosen < target) {
        // As gpu_lsh.cu's fill: every thread calls take() together, a twice-drawn id goes to
        // the lower thread, and the round that reaches the target keeps its claims in thread
        // order, so the set depends only on the seed.
        using block_scan = cub::BlockScan<uint32_t, select_threads>;
        __shared__ typename block_scan::TempStorage scan_storage;
        auto take = [&](uint32_t id, bool valid) {
            const uint32_t bid = 0x80000000u + (blockDim.x - 1 - threadIdx.x);
            uint32_t slot = 0;
            if (valid) {
                slot = set_find_or_insert(set, id, nullptr);
                atomicMax(&set.hits[slot], bid);  // a taken id stays taken
            }
            __syncthreads();
            // A volatile read: the set lives in global memory, where the atomics went to L2.
            const uint32_t won =
                valid && *static_cast<volatile uint32_t*>(&set.hits[slot]) == bid ? 1u : 0u;
            __syncthreads();
            if (won) set.hits[slot] = taken;
            uint32_t rank = 0, total = 0;
            block_scan(scan_storage).ExclusiveSum(won, rank, total);
            if (won && n_out + rank < target) out[n_out + rank] = id;
            __syncthreads();
            if (threadIdx.x == 0) n_out = min(n_out + total, target);
        };
        auto have_target = [&]() {
            __syncthreads();
            const uint32_t have = n_out;
            __syncthreads();
            return have >= target;
        };
        const uint32_t need = target - chosen, free_ids = n_items - chosen;
        const uint32_t max_rounds = 2 * need <= free_ids ? 16 + 4 * need / blockDim.x : 0;
        // A pool (fill_pool.hpp) narrows the draws to its entries; the sweep below, reached
        // only when the draws fall short, takes any row.
        const uint32_t range = pool.size ? pool.size : n_items;
        for (uint32_t round = 0; round < max_rounds && !have_target(); ++round) {
            const uint64_t draw = splitmix64(seed ^ (uint64_t(s) << 40) ^
                                             (uint64_t(round) * blockDim.x + threadIdx.x));
            const uint32_t pick = uint32_t(((draw >> 32) * range) >> 32);
            take(pool.size ? fill_pool_row(pool.seed, pick, n_items) : pick, true);
        }
        const uint64_t mix = splitmix64(seed ^ (uint64_t(s) << 40) ^ 0xf111f111f111ULL);
        uint32_t a = uint32_t(mix % n_items) | 1u;
        while (gcd(a, n_items) != 1) a = a + 1 < n_items ? a + 1 : 1;
        const uint64_t b = (mix >> 32) % n_items;
        for (uint32_t base = 0; base < n_items && !have_target(); base += blockDim.x) {
            const uint32_t i = base + threadIdx.x;
            take(uint32_t((uint64_t(a) * i + b) % n_items), i < n_items);
        }
    }
    __syncthreads();
    // The part after the labels: the top-k ids, then the fill, each sorted by id (one sort: the
    // fill's ids carry the top bit, ids are below 2^31), so that the fill's correction
    // (apply_fill_correction) knows where it begins.
    const uint32_t n = n_out, n_tail = n - n_labels, n_top = chosen - n_labels;
    for (uint32_t i = threadIdx.x; i < sort_size; i += blockDim.x)
        tail[i] = i < n_tail ? out[n_labels + i] | (i >= n_top ? fill_bit : 0u) : none;
    bitonic_ascending(tail, sort_size);
    for (uint32_t i = threadIdx.x; i < n_tail; i += blockDim.x)
        out[n_labels + i] = tail[i] & ~fill_bit;
    if (threadIdx.x == 0) counts[s] = n, drawn_from[s] = chosen;
}

__global__ void fill_correction_kernel(const float* logits, const uint32_t* offsets,
                                       const uint32_t* drawn_from, uint32_t rows, float weight,
                                       float* corrected) {
    const uint32_t s = blockIdx.x;
    const uint32_t begin = offsets[s], n = offsets[s + 1] - begin, first = drawn_from[s];
    // r random neurons drawn from the rows - first outside the labels and the top-k.
    const float shift = first < n ? weight * logf(float(rows - first) / float(n - first)) : 0.0f;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        corrected[begin + i] = logits[begin + i] + (i >= first ? shift : 0.0f);
}

__global__ void full_softmax_loss_kernel(const float* logits, const uint32_t* offsets,
                                         batch_csr batch, const float* log_partition, float* loss,
                                         float* dropped) {
    __shared__ float scratch[32];
    const uint32_t s = blockIdx.x;
    const uint32_t begin = offsets[s], end = offsets[s + 1];
    const uint32_t n_labels = batch.label_offsets[s + 1] - batch.label_offsets[s];
    if (n_labels == 0 || end == begin) {
        if (threadIdx.x == 0) loss[s] = 0.0f, dropped[s] = 0.0f;
        return;
    }
    const float log_z = log_partition[s];
    float kept = 0.0f;
    for (uint32_t e = begin + threadIdx.x; e < end; e += blockDim.x)
        kept += expf(logits[e] - log_z);
    kept = block_sum(kept, scratch);
    const float target = 1.0f / float(n_labels);
    float sample_loss = 0.0f;
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x)
        sample_loss -= target * (logits[begin + i] - log_z);  // labels come first
    sample_loss = block_sum(sample_loss, scratch);
    if (threadIdx.x == 0) {
        loss[s] = sample_loss;
        dropped[s] = fmaxf(0.0f, 1.0f - kept);  // another kernel's logits may sum above 1
    }
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

uint32_t build_top_k_sets(uint32_t batch, uint32_t k, const uint32_t* label_offsets,
                          const uint32_t* label_ids, uint32_t max_labels, uint32_t fill,
                          uint32_t n_items, uint64_t seed, const fill_pool& pool,
                          top_k_workspace& ws, active_sets& out, cudaStream_t stream) {
    if (batch == 0) return 0;
    HSLIDE_CHECK(n_items < fill_bit, "top-k sets take at most 2^31 - 1 rows, not {}", n_items);
    fill = std::min(fill, n_items);
    const uint64_t labels = label_offsets ? max_labels : 0;
    out.max_per_sample = uint32_t(std::max<uint64_t>(labels + k, fill));
    HSLIDE_CHECK(uint64_t(batch) * out.max_per_sample < (uint64_t{1} << 32),
                 "a batch of {} samples with up to {} active neurons each has too many entries "
                 "for the GPU backend's 32-bit offsets: use a smaller batch or --min-active",
                 batch, out.max_per_sample);
    const uint32_t slots = next_pow2(2 * (labels + k + fill) + 2 * select_threads);
    const uint32_t sort_size = next_pow2(std::max<uint32_t>(std::max(k, fill), 2));
    int device = 0, shared_limit = 0;
    HSLIDE_CUDA_CHECK(cudaGetDevice(&device));
    HSLIDE_CUDA_CHECK(
        cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t shared = size_t(sort_size) * 4;
    static const int static_shared = [] {
        cudaFuncAttributes attributes{};
        HSLIDE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, top_k_sets_kernel));
        return int(attributes.sharedSizeBytes);
    }();
    HSLIDE_CHECK_KIND(shared + size_t(static_shared) <= size_t(shared_limit),
                      error_kind::unsupported,
                      "top-k sets of up to {} ids after the labels do not fit the GPU's shared "
                      "memory: use a smaller --min-active or --top-k",
                      std::max(k, fill));
    // The same value every time (the most the device allows), as gpu_lsh.cu does.
    HSLIDE_CUDA_CHECK(cudaFuncSetAttribute(top_k_sets_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           shared_limit - static_shared));
    ws.set_ids.reserve(size_t(batch) * slots, "top-k set hash sets");
    ws.set_hits.reserve(size_t(batch) * slots, "top-k set hash sets");
    out.padded.reserve(size_t(batch) * out.max_per_sample, "active sets");
    out.counts.reserve(batch + 1, "active-set sizes");
    ws.drawn_from.reserve(batch, "top-k set fill starts");
    out.offsets.reserve(batch + 1, "active-set offsets");
    HSLIDE_CUDA_CHECK(cudaMemsetAsync(out.counts.data() + batch, 0, 4, stream));
    top_k_sets_kernel<<<batch, select_threads, shared, stream>>>(
        ws.best_id.data(), k, label_offsets, label_ids, fill, n_items, seed, pool, slots,
        ws.set_ids.data(), ws.set_hits.data(), out.max_per_sample, sort_size, out.padded.data(),
        out.counts.data(), ws.drawn_from.data());
    HSLIDE_CUDA_LAUNCH();
    return compact_active_sets(batch, out, stream);
}

void apply_fill_correction(const float* logits, const uint32_t* offsets, uint32_t batch,
                           uint32_t rows, float weight, const top_k_workspace& ws, float* corrected,
                           cudaStream_t stream) {
    if (batch == 0) return;
    fill_correction_kernel<<<batch, select_threads, 0, stream>>>(
        logits, offsets, ws.drawn_from.data(), rows, weight, corrected);
    HSLIDE_CUDA_LAUNCH();
}

void full_softmax_loss(const float* logits, const uint32_t* offsets, const batch_csr& batch,
                       top_k_workspace& ws, float* loss, cudaStream_t stream) {
    if (batch.size == 0) return;
    ws.dropped.reserve(batch.size, "dropped mass");
    full_softmax_loss_kernel<<<batch.size, select_threads, 0, stream>>>(
        logits, offsets, batch, ws.log_partition.data(), loss, ws.dropped.data());
    HSLIDE_CUDA_LAUNCH();
}

// ---- The fused scoring pass (score_top_k_fused; design and model in gpu_topk.cuh) ----

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
