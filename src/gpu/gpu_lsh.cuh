// LSH on the GPU: hash families in device memory, bucket codes of many vectors at once, the
// L tables built by sorting, and per-sample active sets.
//
// Tables. Every (table, code, item) triple becomes one 64-bit key: table in the high bits,
// the bucket code below it, and a pseudo-random priority (up to 24 bits) in the low bits. One
// CUB radix sort of those bits (with the items as values) groups each bucket's items, randomly
// ordered (items with equal priorities stay in id order); a
// run-length encoding of (table, code) gives the buckets, and each bucket keeps its first
// `bucket_capacity` items: a uniformly random subset of the items that hashed there. On the
// CPU, FIFO over a random insertion order and reservoir sampling keep a uniformly random
// subset too, so the two paths draw from the same distribution; they hold the same sets
// whenever no bucket overflows. Memory is proportional to what is stored: keys are sorted
// (table, code) pairs, found by binary search, never 2^(K*bits) slots per table.
//
// Active sets. One thread block per sample takes the union of its L buckets in an
// open-addressing hash set (shared memory when it fits, else a per-sample slice of global
// memory that the block clears itself: never a memset of anything sized by the layer), with
// the labels forced in first, keeps the items hit at least hit_threshold times (cut to the
// most-hit ones above max_active), and fills up to min_active with random items (ids seen but
// dropped are eligible again, as on the CPU). Unlike the CPU path, the order of the union
// within a set is not deterministic (atomics place items). The set is, except where
// max_active cuts among items with equal hit counts: which of those are kept is then
// arbitrary (the CPU keeps the first seen).
#pragma once

#include "device_hash.hpp"
#include "device_memory.hpp"
#include "hslide/lsh.hpp"

#include <cstdint>

namespace hslide::gpu {

/// A hash family copied to the device.
class device_hash_family {
  public:
    /// Copies `data`'s arrays to the device, ordered after the work queued on `stream` and
    /// finished on return (families change rarely).
    void upload(const hash_function_data& data, cudaStream_t stream);

    /// Writes the L codes of each of n_rows dense rows (row r at rows + r * row_stride, dim
    /// floats) to codes[r * L .. + L).
    void hash_rows(const float* rows, size_t row_stride, uint32_t n_rows, uint32_t* codes,
                   cudaStream_t stream) const;

    int L() const { return L_; }
    int code_bits() const { return code_bits_; }

  private:
    hash_kind kind_ = hash_kind::dwta;
    int L_ = 0, code_bits_ = 0;
    bin_hash_view bin_{};
    simhash_view sim_{};
    device_array<uint32_t> bins_;
    device_array<int8_t> signs_;
};

/// What a kernel needs to look buckets up.
struct tables_view {
    const uint64_t* bucket_keys = nullptr;   ///< (table << code_bits) | code, ascending
    const uint32_t* bucket_begin = nullptr;  ///< bucket b's items: [begin[b], begin[b + 1])
    const uint32_t* items = nullptr;
    const uint32_t* n_buckets = nullptr;  ///< on the device
    int code_bits = 0;
};

/// The work arrays of a table build (the sort's key and item buffers, bucket lengths and
/// offsets, CUB scratch): one set serves every build of a backend, one build at a time, so
/// that a second set of tables (rebuilt while the first is in use) costs only its result.
class table_build_scratch {
  public:
    size_t memory_bytes() const;

  private:
    friend class device_tables;
    device_array<uint64_t> keys_a_, keys_b_;
    device_array<uint32_t> items_a_, items_b_, lengths_, source_begin_, kept_;
    device_array<uint8_t> temp_;
};

/// The L tables of one layer.
class device_tables {
  public:
    /// Rebuilds from codes[item * L + table], item < n_items; `seed` draws the priorities
    /// that choose which items an overflowing bucket keeps. `scratch` must not be in use by
    /// another build still running on another stream.
    void build(const uint32_t* codes, uint32_t n_items, int L, int code_bits, int capacity,
               uint64_t seed, table_build_scratch& scratch, cudaStream_t stream);

    tables_view view() const;

    /// The tables on the host, for tests: bucket keys, bucket offsets (n_buckets + 1), items.
    void download(std::vector<uint64_t>& keys, std::vector<uint32_t>& begin,
                  std::vector<uint32_t>& items, cudaStream_t stream) const;

    size_t memory_bytes() const;

  private:
    int code_bits_ = 0;
    device_array<uint64_t> bucket_keys_;
    device_array<uint32_t> bucket_begin_, items_;
    device_array<uint32_t> n_buckets_;
};

/// How active sets are formed (active_set_config, plus what the kernel needs to size itself).
struct active_set_params {
    uint32_t n_items = 0;
    int L = 0;
    uint32_t min_active = 0, max_active = 0, hit_threshold = 1;
    int bucket_capacity = 0;
    bool force_labels = false;  ///< training: labels first; a point without labels gets none
    uint64_t seed = 0;          ///< random fill

    /// The parameters of a layer of `n_items` neurons with these tables and active-set settings.
    static active_set_params of(uint32_t n_items, const lsh_config& lsh,
                                const active_set_config& active, bool force_labels, uint64_t seed) {
        active_set_params p;
        p.n_items = n_items;
        p.L = lsh.L;
        p.min_active = active.min_active;
        p.max_active = active.max_active;
        p.hit_threshold = active.hit_threshold;
        p.bucket_capacity = lsh.bucket_capacity;
        p.force_labels = force_labels;
        p.seed = seed;
        return p;
    }
};

/// Per-sample active sets in CSR form on the device.
struct active_sets {
    device_array<uint32_t> padded;        ///< batch * max_per_sample, per-sample slices
    device_array<uint32_t> counts;        ///< batch + 1 (the last is 0 for the scan)
    device_array<uint32_t> offsets;       ///< batch + 1: sample s is [offsets[s], offsets[s+1])
    device_array<uint32_t> ids;           ///< neuron of each entry
    device_array<uint32_t> entry_sample;  ///< sample of each entry
    device_array<uint32_t> set_ids, set_hits;  ///< global hash sets when shared memory is short
    device_array<uint8_t> temp;
    uint32_t max_per_sample = 0;
};

/// Once every sample's set is in out.padded and its size in out.counts[s] (out.counts[batch]
/// = 0): scans the counts into out.offsets, reads the total (one device-to-host read: the
/// only synchronisation of the step) and compacts the sets into out.ids / out.entry_sample.
/// Returns the total. Every selection (LSH, top-k) ends with it.
uint32_t compact_active_sets(uint32_t batch, active_sets& out, cudaStream_t stream);

/// Builds the active sets of `batch` samples from their codes (batch * L) and, when
/// params.force_labels, their labels (CSR: label_offsets[batch + 1], label_ids). Returns the
/// total number of entries (one device-to-host read: the only synchronisation of the step).
uint32_t build_active_sets(const tables_view& tables, const uint32_t* codes, uint32_t batch,
                           const uint32_t* label_offsets, const uint32_t* label_ids,
                           uint32_t max_labels, const active_set_params& params, active_sets& out,
                           cudaStream_t stream);

}  // namespace hslide::gpu
