// GPU hashing, table building and active sets (see gpu_lsh.cuh for the design).
#include "gpu_lsh.cuh"
#include "launch.cuh"

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>

namespace hslide::gpu {

namespace {

constexpr uint32_t empty_slot = 0xffffffffu;
constexpr uint32_t forced_hit = 0x40000000u;  // added to a label's hit count: never cut
constexpr int block_threads = 256;

// Bin families: one warp per row; the raw values of all hashes go to shared memory, then
// each lane finishes tables (densification reads the other hashes' raw values).
__global__ void hash_rows_bin_kernel(bin_hash_view f, const float* rows, size_t stride,
                                     uint32_t n_rows, uint32_t* codes) {
    extern __shared__ int32_t raw_all[];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t row = blockIdx.x * (blockDim.x / 32) + warp;
    if (row >= n_rows) return;
    int32_t* raw = raw_all + size_t(warp) * f.n_hashes;
    const float* x = rows + size_t(row) * stride;
    for (uint32_t h = lane; h < f.n_hashes; h += 32) raw[h] = bin_hash_raw(f, x, h);
    __syncwarp();
    for (int t = int(lane); t < f.L; t += 32)
        codes[size_t(row) * f.L + t] = bin_hash_code(f, raw, t);
}

// Simhash: one thread per (row, table).
__global__ void hash_rows_simhash_kernel(simhash_view f, const float* rows, size_t stride,
                                         uint32_t n_rows, uint32_t* codes) {
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= uint64_t(n_rows) * f.L) return;
    const uint32_t row = uint32_t(i / f.L);
    const int t = int(i % f.L);
    codes[i] = simhash_code(f, rows + size_t(row) * stride, t);
}

}  // namespace

void device_hash_family::upload(const hash_function_data& data, cudaStream_t stream) {
    // Work already queued on `stream` may still read the old functions; the copies are
    // ordered after it on the same stream (a plain cudaMemcpy would run on the legacy stream,
    // which a non-blocking stream does not wait for), and are finished before returning
    // because they read pageable memory the caller owns. Checks and allocations come first,
    // into locals: if one throws, this object still holds the previous functions whole (the
    // backend keeps it and may hash with it again).
    HSLIDE_CHECK(data.kind == hash_kind::simhash || size_t(data.n_hashes) * 4 <= 40 * 1024,
                 "the GPU backend supports at most 10240 hashes per layer (K * L), got {}",
                 data.n_hashes);
    device_array<int8_t> signs;
    device_array<uint32_t> bins;
    if (data.kind == hash_kind::simhash)
        signs.resize(data.signs.size(), "simhash projections");
    else
        bins.resize(data.bins.size(), "LSH bins");
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (data.kind == hash_kind::simhash)
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(signs.data(), data.signs.data(), signs.bytes(),
                                          cudaMemcpyHostToDevice, stream));
    else
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(bins.data(), data.bins.data(), bins.bytes(),
                                          cudaMemcpyHostToDevice, stream));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    signs_.swap(signs);
    bins_.swap(bins);
    kind_ = data.kind;
    L_ = data.L;
    code_bits_ = data.K * data.bits_per_hash;
    sim_ =
        simhash_view{signs_.data(), data.dim, data.sign_stride, data.K, data.L, data.bits_per_hash};
    bin_ = bin_hash_view{bins_.data(),       data.n_hashes, data.width,
                         data.value_mask,    data.K,        data.L,
                         data.bits_per_hash, data.densify,  data.kind == hash_kind::minhash,
                         data.densify_seed};
}

void device_hash_family::hash_rows(const float* rows, size_t row_stride, uint32_t n_rows,
                                   uint32_t* codes, cudaStream_t stream) const {
    if (n_rows == 0) return;
    if (kind_ == hash_kind::simhash) {
        hash_rows_simhash_kernel<<<blocks_for(uint64_t(n_rows) * L_, block_threads), block_threads,
                                   0, stream>>>(sim_, rows, row_stride, n_rows, codes);
    } else {
        // As many warps per block as 40 KiB of raw values allow (at most 8).
        const uint32_t warps = std::clamp<uint32_t>(40 * 1024 / (bin_.n_hashes * 4), 1, 8);
        hash_rows_bin_kernel<<<blocks_for(n_rows, warps), warps * 32,
                               size_t(warps) * bin_.n_hashes * 4, stream>>>(bin_, rows, row_stride,
                                                                            n_rows, codes);
    }
    HSLIDE_CUDA_LAUNCH();
}

// --- tables ----------------------------------------------------------------------------------

namespace {

__global__ void make_keys_kernel(const uint32_t* codes, uint32_t n_items, int L, int code_bits,
                                 int priority_bits, uint64_t seed, uint64_t* keys,
                                 uint32_t* items) {
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= uint64_t(n_items) * L) return;
    const uint32_t item = uint32_t(i / L);
    const uint64_t table = i % L;
    const uint64_t priority = splitmix64(seed ^ ((table << 32) | item)) >> (64 - priority_bits);
    keys[i] = (((table << code_bits) | codes[i]) << priority_bits) | priority;
    items[i] = item;
}

__global__ void shift_keys_kernel(uint64_t* keys, uint64_t n, int priority_bits) {
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) keys[i] >>= priority_bits;
}

__global__ void cap_lengths_kernel(const uint32_t* lengths, const uint32_t* n_buckets,
                                   uint32_t capacity, uint32_t n, uint32_t* kept) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) kept[i] = i < *n_buckets ? min(lengths[i], capacity) : 0u;
}

// One warp per bucket copies the bucket's first `kept` items.
__global__ void gather_kept_kernel(const uint32_t* sorted_items, const uint32_t* source_begin,
                                   const uint32_t* bucket_begin, const uint32_t* n_buckets,
                                   uint32_t* items) {
    const uint32_t bucket = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (bucket >= *n_buckets) return;
    const uint32_t from = source_begin[bucket], to = bucket_begin[bucket];
    const uint32_t n = bucket_begin[bucket + 1] - to;
    for (uint32_t k = threadIdx.x % 32; k < n; k += 32) items[to + k] = sorted_items[from + k];
}

int bits_for(uint64_t n) {  // bits to hold 0..n-1
    int bits = 0;
    while ((uint64_t{1} << bits) < n) ++bits;
    return bits;
}

}  // namespace

void device_tables::build(const uint32_t* codes, uint32_t n_items, int L, int code_bits,
                          int capacity, uint64_t seed, table_build_scratch& scratch,
                          cudaStream_t stream) {
    const uint64_t n64 = uint64_t(n_items) * uint64_t(L);
    HSLIDE_CHECK(n64 < (uint64_t{1} << 31), "GPU LSH tables hold at most 2^31 entries, got {}",
                 n64);
    const uint32_t n = uint32_t(n64);
    HSLIDE_ASSERT(n > 0);  // layers have rows and tables (validated configurations)
    const int table_bits = bits_for(uint64_t(L));
    // The sort's cost is in its passes over the key bits: 24 bits of priority order a bucket
    // randomly (exact ties, which keep the items' order, are rare below 2^12 items a bucket)
    // with 2 passes fewer than filling all 64 bits.
    const int priority_bits = std::min(64 - table_bits - code_bits, 24);
    const int key_bits = table_bits + code_bits + priority_bits;
    HSLIDE_ASSERT(priority_bits >= 1);
    code_bits_ = code_bits;
    scratch.keys_a_.reserve(n, "LSH table keys");
    scratch.keys_b_.reserve(n, "LSH table keys");
    scratch.items_a_.reserve(n, "LSH table items");
    scratch.items_b_.reserve(n, "LSH table items");
    bucket_keys_.reserve(n, "LSH bucket keys");
    scratch.lengths_.reserve(n + 1, "LSH bucket lengths");
    scratch.source_begin_.reserve(n + 1, "LSH bucket offsets");
    scratch.kept_.reserve(n + 1, "LSH bucket sizes");
    bucket_begin_.reserve(n + 1, "LSH bucket offsets");
    items_.reserve(n, "LSH table items");
    n_buckets_.resize(1, "LSH bucket count");

    make_keys_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(
        codes, n_items, L, code_bits, priority_bits, seed, scratch.keys_a_.data(),
        scratch.items_a_.data());
    HSLIDE_CUDA_LAUNCH();
    with_scratch(scratch.temp_, [&](void* t, size_t& bytes) {
        return cub::DeviceRadixSort::SortPairs(t, bytes, scratch.keys_a_.data(),
                                               scratch.keys_b_.data(), scratch.items_a_.data(),
                                               scratch.items_b_.data(), n, 0, key_bits, stream);
    });
    shift_keys_kernel<<<blocks_for(n, block_threads), block_threads, 0, stream>>>(
        scratch.keys_b_.data(), n, priority_bits);
    HSLIDE_CUDA_LAUNCH();
    // Lengths past the last bucket must read 0 for the scans below, which run over n + 1.
    HSLIDE_CUDA_CHECK(cudaMemsetAsync(scratch.lengths_.data(), 0, (size_t(n) + 1) * 4, stream));
    with_scratch(scratch.temp_, [&](void* t, size_t& bytes) {
        return cub::DeviceRunLengthEncode::Encode(t, bytes, scratch.keys_b_.data(),
                                                  bucket_keys_.data(), scratch.lengths_.data(),
                                                  n_buckets_.data(), n, stream);
    });
    with_scratch(scratch.temp_, [&](void* t, size_t& bytes) {
        return cub::DeviceScan::ExclusiveSum(t, bytes, scratch.lengths_.data(),
                                             scratch.source_begin_.data(), n + 1, stream);
    });
    cap_lengths_kernel<<<blocks_for(n + 1, block_threads), block_threads, 0, stream>>>(
        scratch.lengths_.data(), n_buckets_.data(), uint32_t(capacity), n + 1,
        scratch.kept_.data());
    HSLIDE_CUDA_LAUNCH();
    with_scratch(scratch.temp_, [&](void* t, size_t& bytes) {
        return cub::DeviceScan::ExclusiveSum(t, bytes, scratch.kept_.data(), bucket_begin_.data(),
                                             n + 1, stream);
    });
    gather_kept_kernel<<<blocks_for(n, block_threads / 32), block_threads, 0, stream>>>(
        scratch.items_b_.data(), scratch.source_begin_.data(), bucket_begin_.data(),
        n_buckets_.data(), items_.data());
    HSLIDE_CUDA_LAUNCH();
}

tables_view device_tables::view() const {
    return tables_view{bucket_keys_.data(), bucket_begin_.data(), items_.data(), n_buckets_.data(),
                       code_bits_};
}

void device_tables::download(std::vector<uint64_t>& keys, std::vector<uint32_t>& begin,
                             std::vector<uint32_t>& items, cudaStream_t stream) const {
    uint32_t n_buckets = 0;
    HSLIDE_CUDA_CHECK(
        cudaMemcpyAsync(&n_buckets, n_buckets_.data(), 4, cudaMemcpyDeviceToHost, stream));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    keys.resize(n_buckets);
    begin.resize(size_t(n_buckets) + 1);
    HSLIDE_CUDA_CHECK(cudaMemcpy(keys.data(), bucket_keys_.data(), size_t(n_buckets) * 8,
                                 cudaMemcpyDeviceToHost));
    HSLIDE_CUDA_CHECK(
        cudaMemcpy(begin.data(), bucket_begin_.data(), begin.size() * 4, cudaMemcpyDeviceToHost));
    items.resize(begin.back());
    HSLIDE_CUDA_CHECK(
        cudaMemcpy(items.data(), items_.data(), items.size() * 4, cudaMemcpyDeviceToHost));
}

size_t table_build_scratch::memory_bytes() const {
    return keys_a_.bytes() + keys_b_.bytes() + items_a_.bytes() + items_b_.bytes() +
           lengths_.bytes() + source_begin_.bytes() + kept_.bytes() + temp_.bytes();
}

size_t device_tables::memory_bytes() const {
    return bucket_keys_.bytes() + bucket_begin_.bytes() + items_.bytes() + n_buckets_.bytes();
}

// --- active sets -----------------------------------------------------------------------------

namespace {

struct set_view {
    uint32_t* ids;
    uint32_t* hits;
    uint32_t mask;   // slots - 1 (a power of two)
    uint32_t shift;  // 32 - log2(slots)
};

// An item's hit count once it is in the output (chosen, or a label): the fill skips it.
constexpr uint32_t taken = 0xffffffffu;

// The slot where the probe for `id` starts. Fibonacci hashing keeps the product's high bits:
// its low bits depend only on the low bits of id, so ids equal modulo the table size would
// all start at one slot.
__device__ uint32_t home_slot(const set_view& set, uint32_t id) {
    return (id * 2654435761u) >> set.shift;
}

// The slot holding id, inserting it (with 0 hits) when absent.
__device__ uint32_t set_find_or_insert(const set_view& set, uint32_t id) {
    uint32_t slot = home_slot(set, id);
    for (;;) {
        const uint32_t prev = atomicCAS(&set.ids[slot], empty_slot, id);
        if (prev == empty_slot || prev == id) return slot;
        slot = (slot + 1) & set.mask;
    }
}

// Adds `add` hits to id, inserting it when absent.
__device__ void set_add_hits(const set_view& set, uint32_t id, uint32_t add) {
    atomicAdd(&set.hits[set_find_or_insert(set, id)], add);
}

// A claim's bid in the hit counts of the set: above any count, below `taken`; the lowest
// thread of a block bids highest. Ids seen in buckets but dropped (too few hits, or cut by
// max_active) can be claimed, as on the CPU.
__device__ uint32_t claim_bid() {
    return 0x80000000u + (blockDim.x - 1 - threadIdx.x);
}

__device__ uint32_t gcd(uint32_t a, uint32_t b) {
    while (b) {
        const uint32_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

// The bucket of `key` by binary search over the sorted bucket keys: [begin, end) of items.
__device__ void find_bucket(const tables_view& t, uint64_t key, uint32_t& begin, uint32_t& end) {
    uint32_t lo = 0, hi = *t.n_buckets;
    while (lo < hi) {
        const uint32_t mid = (lo + hi) / 2;
        if (t.bucket_keys[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < *t.n_buckets && t.bucket_keys[lo] == key) {
        begin = t.bucket_begin[lo];
        end = t.bucket_begin[lo + 1];
    } else {
        begin = end = 0;
    }
}

// One block per sample. Dynamic shared memory: [hist: L + 1][bucket begin: L][bucket end: L]
// then, when `in_shared`, the set's ids and hits.
__global__ void active_sets_kernel(tables_view tables, const uint32_t* codes,
                                   const uint32_t* label_offsets, const uint32_t* label_ids,
                                   active_set_params p, uint32_t slots, bool in_shared,
                                   uint32_t* global_ids, uint32_t* global_hits,
                                   uint32_t max_per_sample, uint32_t* padded, uint32_t* counts) {
    extern __shared__ uint32_t shared[];
    const uint32_t s = blockIdx.x;
    uint32_t* hist = shared;
    uint32_t* bucket_begin = hist + p.L + 1;
    uint32_t* bucket_end = bucket_begin + p.L;
    set_view set;
    if (in_shared) {
        set.ids = bucket_end + p.L;
        set.hits = set.ids + slots;
    } else {
        set.ids = global_ids + size_t(s) * slots;
        set.hits = global_hits + size_t(s) * slots;
    }
    set.mask = slots - 1;
    set.shift = 32 - uint32_t(__ffs(int(slots)) - 1);
    __shared__ uint32_t n_out, n_ties, cutoff, budget_at_cutoff;
    uint32_t* out = padded + size_t(s) * max_per_sample;

    const uint32_t label_begin = p.force_labels ? label_offsets[s] : 0;
    const uint32_t n_labels = p.force_labels ? label_offsets[s + 1] - label_begin : 0;
    if (p.force_labels && n_labels == 0) {  // nothing to train on: no active set at all
        if (threadIdx.x == 0) counts[s] = 0;
        return;
    }
    for (uint32_t i = threadIdx.x; i < slots; i += blockDim.x)
        set.ids[i] = empty_slot, set.hits[i] = 0;
    for (uint32_t i = threadIdx.x; i <= uint32_t(p.L); i += blockDim.x) hist[i] = 0;
    for (int t = int(threadIdx.x); t < p.L; t += blockDim.x) {
        const uint64_t key = (uint64_t(t) << tables.code_bits) | codes[size_t(s) * p.L + t];
        find_bucket(tables, key, bucket_begin[t], bucket_end[t]);
    }
    if (threadIdx.x == 0) n_out = n_labels, n_ties = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n_labels; i += blockDim.x) {
        const uint32_t label = label_ids[label_begin + i];
        out[i] = label;
        set_add_hits(set, label, forced_hit);
    }
    __syncthreads();
    // The union: one warp per table, lanes over the bucket's items.
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    for (int t = int(warp); t < p.L; t += n_warps)
        for (uint32_t k = bucket_begin[t] + lane; k < bucket_end[t]; k += 32)
            set_add_hits(set, tables.items[k], 1);
    __syncthreads();

    const uint32_t threshold = max(p.hit_threshold, 1u);
    for (uint32_t i = threadIdx.x; i < slots; i += blockDim.x) {
        const uint32_t h = set.hits[i];
        if (set.ids[i] != empty_slot && h < forced_hit && h >= threshold)
            atomicAdd(&hist[min(h, uint32_t(p.L))], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // Above max_active, keep the most-hit items: all above `cutoff` hits and
        // budget_at_cutoff of those at it.
        uint32_t budget = 0xffffffffu;
        if (p.max_active > 0) budget = p.max_active > n_labels ? p.max_active - n_labels : 0;
        uint32_t above = 0, c = uint32_t(p.L);
        cutoff = threshold;
        budget_at_cutoff = 0xffffffffu;
        for (; c >= threshold; --c) {
            if (above + hist[c] > budget) {
                cutoff = c;
                budget_at_cutoff = budget - above;
                break;
            }
            above += hist[c];
            if (c == 0) break;
        }
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < slots; i += blockDim.x) {
        const uint32_t id = set.ids[i], h = set.hits[i];
        if (id == empty_slot || h < threshold || h < cutoff) continue;
        if (h >= forced_hit) {  // a label: in the output already
            set.hits[i] = taken;
            continue;
        }
        if (h == cutoff && atomicAdd(&n_ties, 1u) >= budget_at_cutoff) continue;
        set.hits[i] = taken;
        out[atomicAdd(&n_out, 1u)] = id;
    }
    __syncthreads();

    // Random fill up to min_active (clamped to max_active and to the layer) from the ids not
    // taken. Rejection sampling while at most half of the free ids are needed, as on the CPU;
    // whatever is still missing then (a fill close to the layer size, or an unlucky run of
    // draws) comes from one pass over a pseudo-random permutation of all ids, so the set
    // always reaches its target.
    uint32_t target =
        p.max_active > 0 ? min(p.min_active, max(p.max_active, n_labels)) : p.min_active;
    target = min(target, p.n_items);
    const uint32_t chosen = n_out;
    if (chosen < target) {
        // Every thread calls take() together, and nothing in it depends on the order the
        // atomics ran in, so the set depends only on the seed: an id two threads drew goes to
        // the lower thread (the highest bid), and the round that reaches the target keeps its
        // claims in thread order.
        using block_scan = cub::BlockScan<uint32_t, block_threads>;
        __shared__ typename block_scan::TempStorage scan_storage;
        auto take = [&](uint32_t id, bool valid) {
            const uint32_t bid = claim_bid();
            uint32_t slot = 0;
            if (valid) {
                slot = set_find_or_insert(set, id);
                atomicMax(&set.hits[slot], bid);  // a taken id stays taken
            }
            __syncthreads();
            const uint32_t won = valid && set.hits[slot] == bid ? 1u : 0u;
            __syncthreads();
            if (won) set.hits[slot] = taken;
            uint32_t rank = 0, total = 0;
            block_scan(scan_storage).ExclusiveSum(won, rank, total);
            if (won && n_out + rank < target) out[n_out + rank] = id;
            __syncthreads();
            if (threadIdx.x == 0) n_out = min(n_out + total, target);
        };
        // Every thread reads the count between two barriers, so all leave a loop together.
        auto have_target = [&]() {
            __syncthreads();
            const uint32_t have = n_out;
            __syncthreads();
            return have >= target;
        };
        const uint32_t need = target - chosen, free_ids = p.n_items - chosen;
        const uint32_t max_rounds = 2 * need <= free_ids ? 16 + 4 * need / blockDim.x : 0;
        for (uint32_t round = 0; round < max_rounds && !have_target(); ++round) {
            const uint64_t draw = splitmix64(p.seed ^ (uint64_t(s) << 40) ^
                                             (uint64_t(round) * blockDim.x + threadIdx.x));
            take(uint32_t(((draw >> 32) * p.n_items) >> 32), true);
        }
        // The permutation i -> (a * i + b) mod n_items, a coprime to n_items.
        const uint64_t mix = splitmix64(p.seed ^ (uint64_t(s) << 40) ^ 0xf111f111f111ULL);
        uint32_t a = uint32_t(mix % p.n_items) | 1u;
        while (gcd(a, p.n_items) != 1) a = a + 1 < p.n_items ? a + 1 : 1;
        const uint64_t b = (mix >> 32) % p.n_items;
        for (uint32_t base = 0; base < p.n_items && !have_target(); base += blockDim.x) {
            const uint32_t i = base + threadIdx.x;
            take(uint32_t((uint64_t(a) * i + b) % p.n_items), i < p.n_items);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) counts[s] = min(n_out, max_per_sample);
}

// One block per sample copies its slice into the CSR arrays.
__global__ void compact_kernel(const uint32_t* padded, uint32_t max_per_sample,
                               const uint32_t* offsets, uint32_t* ids, uint32_t* entry_sample) {
    const uint32_t s = blockIdx.x;
    const uint32_t begin = offsets[s], n = offsets[s + 1] - begin;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        ids[begin + i] = padded[size_t(s) * max_per_sample + i];
        entry_sample[begin + i] = s;
    }
}

uint32_t next_pow2(uint64_t n) {
    HSLIDE_CHECK(n <= (uint64_t{1} << 31),
                 "an active-set hash set of {} slots is too large for the GPU backend: use a "
                 "smaller --min-active or fewer tables",
                 n);
    uint32_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

}  // namespace

uint32_t build_active_sets(const tables_view& tables, const uint32_t* codes, uint32_t batch,
                           const uint32_t* label_offsets, const uint32_t* label_ids,
                           uint32_t max_labels, const active_set_params& p, active_sets& out,
                           cudaStream_t stream) {
    if (batch == 0) return 0;  // a grid of no blocks is a launch error
    const uint64_t from_buckets =
        std::min<uint64_t>(uint64_t(p.L) * uint64_t(p.bucket_capacity), p.n_items);
    const uint64_t fill = std::min(p.min_active, p.n_items);
    const uint64_t labels = p.force_labels ? max_labels : 0;
    out.max_per_sample =
        uint32_t(std::min<uint64_t>(labels + from_buckets + fill, uint64_t(p.n_items) + labels));
    HSLIDE_CHECK(uint64_t(batch) * out.max_per_sample < (uint64_t{1} << 32),
                 "a batch of {} samples with up to {} active neurons each has too many entries "
                 "for the GPU backend's 32-bit offsets: use a smaller batch or --min-active",
                 batch, out.max_per_sample);
    // Room for the union, the labels, and the fill's overshoot of one round.
    const uint32_t slots = next_pow2(2 * (labels + from_buckets + fill) + 2 * block_threads);
    int device = 0, shared_limit = 0;
    HSLIDE_CUDA_CHECK(cudaGetDevice(&device));
    HSLIDE_CUDA_CHECK(
        cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t fixed_shared = size_t(3 * p.L + 1) * 4;
    const size_t set_shared = size_t(slots) * 8;
    const bool in_shared = fixed_shared + set_shared + 1024 <= size_t(shared_limit);
    HSLIDE_CHECK(fixed_shared + 1024 <= size_t(shared_limit),
                 "the GPU backend supports at most {} LSH tables per layer, got {}",
                 (shared_limit - 1024) / 12, p.L);
    const size_t shared = fixed_shared + (in_shared ? set_shared : 0);
    if (!in_shared) {
        out.set_ids.reserve(size_t(batch) * slots, "active-set hash sets");
        out.set_hits.reserve(size_t(batch) * slots, "active-set hash sets");
    }
    out.padded.reserve(size_t(batch) * out.max_per_sample, "active sets");
    out.counts.reserve(batch + 1, "active-set sizes");
    out.offsets.reserve(batch + 1, "active-set offsets");
    // The limit is per device and function, shared by every backend in the process (two GPU
    // workers on one device): always the same value, the most the device allows, so no
    // backend lowers it under another's launch.
    // The kernel's static shared memory is fixed at compile time: read once, not per batch.
    static const int static_shared = [] {
        cudaFuncAttributes attributes{};
        HSLIDE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, active_sets_kernel));
        return int(attributes.sharedSizeBytes);
    }();
    HSLIDE_CUDA_CHECK(cudaFuncSetAttribute(active_sets_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           shared_limit - static_shared));
    HSLIDE_CUDA_CHECK(cudaMemsetAsync(out.counts.data() + batch, 0, 4, stream));
    active_sets_kernel<<<batch, block_threads, shared, stream>>>(
        tables, codes, label_offsets, label_ids, p, slots, in_shared, out.set_ids.data(),
        out.set_hits.data(), out.max_per_sample, out.padded.data(), out.counts.data());
    HSLIDE_CUDA_LAUNCH();
    return compact_active_sets(batch, out, stream);
}

uint32_t compact_active_sets(uint32_t batch, active_sets& out, cudaStream_t stream) {
    with_scratch(out.temp, [&](void* t, size_t& bytes) {
        return cub::DeviceScan::ExclusiveSum(t, bytes, out.counts.data(), out.offsets.data(),
                                             batch + 1, stream);
    });
    uint32_t total = 0;
    HSLIDE_CUDA_CHECK(
        cudaMemcpyAsync(&total, out.offsets.data() + batch, 4, cudaMemcpyDeviceToHost, stream));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    out.ids.reserve(std::max(total, 1u), "active-set entries");
    out.entry_sample.reserve(std::max(total, 1u), "active-set entries");
    compact_kernel<<<batch, block_threads, 0, stream>>>(out.padded.data(), out.max_per_sample,
                                                        out.offsets.data(), out.ids.data(),
                                                        out.entry_sample.data());
    HSLIDE_CUDA_LAUNCH();
    return total;
}

}  // namespace hslide::gpu
