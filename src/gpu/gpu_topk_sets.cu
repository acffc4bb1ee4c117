// Top-k active sets on the GPU, their fill and their loss (see gpu_topk.cuh): the sets from
// the selection's k best (labels first, the fill after), the fill's log-Q correction and the
// full softmax's loss through the exact log-partition.
#include "block_reduce.cuh"
#include "gpu_topk.cuh"
#include "launch.cuh"
#include "top_k_order.cuh"

#include <algorithm>

namespace hslide::gpu {

namespace {

constexpr uint32_t select_threads = 256;
constexpr uint32_t none = top_k_none;
constexpr uint32_t empty_slot = 0xffffffffu;
constexpr uint32_t fill_bit = 0x80000000u;  // marks a fill id in the sets' sort

uint32_t next_pow2(uint64_t n) {
    HSLIDE_CHECK(n <= (uint64_t{1} << 31), "a top-k buffer of {} entries is too large", n);
    uint32_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

// A sample's set as a hash set of ids (linear probing, in global memory: one block's own).
struct set_view {
    uint32_t* ids;
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

// One block per sample. Dynamic shared memory: `sort_size` ids (the part after the labels),
// then, with `shared_set`, the sample's hash set of `slots` ids (else in global_ids): the
// fill's sequential draws probe it at shared memory's latency.
__global__ void top_k_sets_kernel(const uint32_t* best_id, uint32_t k,
                                  const uint32_t* label_offsets, const uint32_t* label_ids,
                                  uint32_t fill, uint32_t n_items, uint64_t seed, fill_pool pool,
                                  uint32_t slots, bool shared_set, uint32_t* global_ids,
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
    set_view set{shared_set ? tail + sort_size : global_ids + size_t(s) * slots, slots - 1,
                 32 - uint32_t(__ffs(int(slots)) - 1)};
    uint32_t* out = padded + size_t(s) * max_per_sample;
    for (uint32_t i = threadIdx.x; i < slots; i += blockDim.x) set.ids[i] = empty_slot;
    if (threadIdx.x == 0) n_out = n_labels;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
        const uint32_t label = label_ids[label_begin + i];
        out[i] = label;
        set_find_or_insert(set, label, nullptr);
    }
    __syncthreads();
    // The top-k ids that are not labels (ids are unique: only a label is found present).
    for (uint32_t i = threadIdx.x; i < k; i += blockDim.x) {
        const uint32_t id = best_id[size_t(s) * k + i];
        if (id == none) continue;
        bool inserted = false;
        set_find_or_insert(set, id, &inserted);
        if (inserted) out[atomicAdd(&n_out, 1u)] = id;
    }
    __syncthreads();
    const uint32_t chosen = n_out;
    const uint32_t target = min(fill, n_items);
    if (chosen < target && threadIdx.x == 0) {
        // The CPU's draws (fill_pool.hpp's draw_fill), one thread: each draw's acceptance depends
        // on the ones before. The set is per block, so its atomics meet no other thread.
        rng gen(derive_seed(seed, s));
        uint32_t n = chosen;
        draw_fill(gen, pool, n_items, chosen, target, [&](uint32_t id) {
            bool inserted = false;
            set_find_or_insert(set, id, &inserted);
            if (inserted) out[n++] = id;
            return inserted;
        });
        n_out = n;
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
    const uint32_t slots = next_pow2(2 * (labels + k + fill) + 2);  // at most half full
    const uint32_t sort_size = next_pow2(std::max<uint32_t>(std::max(k, fill), 2));
    int device = 0, shared_limit = 0;
    HSLIDE_CUDA_CHECK(cudaGetDevice(&device));
    HSLIDE_CUDA_CHECK(
        cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    static const int static_shared = [] {
        cudaFuncAttributes attributes{};
        HSLIDE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, top_k_sets_kernel));
        return int(attributes.sharedSizeBytes);
    }();
    const size_t room = size_t(shared_limit) - std::min<size_t>(static_shared, shared_limit);
    // The hash set beside the sort where both fit (about 20 KB at Amazon-670K's sets).
    const bool shared_set = (size_t(sort_size) + slots) * 4 <= room;
    const size_t shared = (size_t(sort_size) + (shared_set ? slots : 0)) * 4;
    HSLIDE_CHECK_KIND(shared <= room, error_kind::unsupported,
                      "top-k sets of up to {} ids after the labels do not fit the GPU's shared "
                      "memory: use a smaller --min-active or --top-k",
                      std::max(k, fill));
    // The same value every time (the most the device allows), as gpu_lsh.cu does.
    HSLIDE_CUDA_CHECK(cudaFuncSetAttribute(top_k_sets_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           shared_limit - static_shared));
    if (!shared_set) ws.set_ids.reserve(size_t(batch) * slots, "top-k set hash sets");
    out.padded.reserve(size_t(batch) * out.max_per_sample, "active sets");
    out.counts.reserve(batch + 1, "active-set sizes");
    ws.drawn_from.reserve(batch, "top-k set fill starts");
    out.offsets.reserve(batch + 1, "active-set offsets");
    HSLIDE_CUDA_CHECK(cudaMemsetAsync(out.counts.data() + batch, 0, 4, stream));
    top_k_sets_kernel<<<batch, select_threads, shared, stream>>>(
        ws.best_id.data(), k, label_offsets, label_ids, fill, n_items, seed, pool, slots,
        shared_set, ws.set_ids.data(), out.max_per_sample, sort_size, out.padded.data(),
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

}  // namespace hslide::gpu
