// Locality-sensitive hashing over neurons: hash families, the L bucket tables, and the
// per-sample active-set query, as SLIDE uses them.
//
// A hash family maps a vector (a neuron's weight row, or a layer's input activation) to L
// bucket codes, one per table. Each code concatenates K hash values of `bits_per_hash` bits
// (an explicit parameter: published SLIDE code silently used 2 bits where it meant 3), so a
// code has K * bits_per_hash bits and is < 2^(K * bits_per_hash) <= 2^32.
//
// Families (all deterministic functions of (config, dim, seed), so a checkpoint stores the
// seed and gets back the same functions):
//  - dwta:    densified winner-take-all. Each hash looks at a random bin of 2^bits_per_hash
//             coordinates and returns the position of the largest; an empty bin (all zero, as
//             with sparse vectors) borrows the value of another hash (densification).
//  - wta:     winner-take-all without densification (an all-zero bin hashes to 0).
//  - simhash: signed random projections; each hash is bits_per_hash sign bits of sparse
//             +-1 projections (one third of the coordinates nonzero).
//  - minhash: densified one-permutation MinHash over the set {i : x_i > 0}; each hash is the
//             low bits_per_hash bits of the minimum permuted index in its bin.
#pragma once

#include "hslide/rng.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hslide {

enum class hash_kind { dwta, wta, simhash, minhash };

/// Parses "dwta" | "wta" | "simhash" | "minhash" (throws hslide::error on anything else).
hash_kind parse_hash_kind(const std::string& name);
const char* to_string(hash_kind kind);

/// How a full bucket takes a new item.
enum class insertion_policy {
    fifo,       ///< keep the `bucket_capacity` most recently inserted items
    reservoir,  ///< keep a uniform random sample of the items offered (Algorithm R)
};
insertion_policy parse_insertion_policy(const std::string& name);
const char* to_string(insertion_policy policy);

/// Parameters of one layer's LSH.
struct lsh_config {
    hash_kind kind = hash_kind::dwta;
    int K = 6;                   ///< hashes concatenated into one bucket code
    int L = 50;                  ///< number of tables
    int bits_per_hash = 3;       ///< bits each hash contributes; DWTA/WTA bins hold 2^bits
    int bucket_capacity = 128;   ///< items kept per bucket
    insertion_policy policy = insertion_policy::fifo;
};

/// Throws hslide::error when a configuration cannot work (K*bits > 32, L < 1, ...).
void validate(const lsh_config& config);

/// A family of K*L hash functions over vectors of a fixed dimension.
class hash_family {
public:
    virtual ~hash_family() = default;

    /// Builds the family `config.kind` for vectors of length `dim`, drawn from `seed`.
    static std::unique_ptr<hash_family> create(const lsh_config& config, uint32_t dim,
                                               uint64_t seed);

    /// Writes the L bucket codes of the dense vector x[0..dim) to codes[0..L).
    virtual void codes_dense(const float* x, uint32_t* codes) const = 0;

    /// Writes the L bucket codes of a sparse vector (ids ascending, < dim) to codes[0..L).
    /// Equal to codes_dense of the same vector written densely.
    virtual void codes_sparse(const uint32_t* ids, const float* values, uint32_t nnz,
                              uint32_t* codes) const = 0;

    const lsh_config& config() const { return config_; }
    uint32_t dim() const { return dim_; }
    uint64_t seed() const { return seed_; }

protected:
    hash_family(const lsh_config& config, uint32_t dim, uint64_t seed)
        : config_(config), dim_(dim), seed_(seed) {}
    lsh_config config_;
    uint32_t dim_;
    uint64_t seed_;
};

/// The contents of one bucket.
struct bucket_view {
    const uint32_t* items;
    uint32_t count;
};

/// L hash tables over `n_items` items (neurons). Built in one pass from every item's codes
/// into compact per-table CSR buckets plus an open-addressing index from code to bucket, so
/// memory is proportional to what is stored (never 2^(K*bits) slots per table).
class lsh_tables {
public:
    lsh_tables() = default;
    explicit lsh_tables(const lsh_config& config);

    /// Rebuilds every table from codes[item * L + table] for item < n_items. Items are offered
    /// to the buckets in a random order drawn from `seed` (so FIFO does not favour high ids);
    /// buckets over capacity apply the insertion policy. Tables are built in parallel
    /// (OpenMP, one table per task), and the result does not depend on the thread count.
    void build(const uint32_t* codes, uint32_t n_items, uint64_t seed);

    /// The bucket of `code` in `table` (empty when no item hashed there).
    bucket_view bucket(int table, uint32_t code) const;

    const lsh_config& config() const { return config_; }
    uint32_t n_items() const { return n_items_; }
    /// Bytes held by the tables (for memory reports and tests).
    size_t memory_bytes() const;

private:
    struct table {
        std::vector<uint32_t> slot_codes;    // open addressing: code per slot
        std::vector<uint32_t> slot_buckets;  // bucket index per slot, UINT32_MAX when empty
        std::vector<uint32_t> offsets;       // bucket b holds items[offsets[b]..offsets[b+1])
        std::vector<uint32_t> items;
    };
    lsh_config config_;
    uint32_t n_items_ = 0;
    std::vector<table> tables_;
};

/// How a sample's active set is formed from its buckets.
struct active_set_config {
    uint32_t min_active = 0;      ///< random fill up to this many
    uint32_t max_active = 0;      ///< cap (0 = no cap); labels are never dropped
    uint32_t hit_threshold = 1;   ///< keep only items found in at least this many tables
};

/// Per-thread scratch for active-set queries: a stamp array over the items, so no memset of
/// n_items per query.
class active_set_builder {
public:
    explicit active_set_builder(uint32_t n_items = 0);

    /// Fills `out` with: the `forced` ids first (labels in training), then the union of the
    /// items in the L buckets `codes[0..L)` that were hit at least `hit_threshold` times
    /// (first-seen order), then uniformly random other items up to `min_active`. When over
    /// `max_active`, the union is cut to the items with the most hits (ties: first seen);
    /// forced ids are never dropped. Every id appears once.
    void build(const lsh_tables& tables, const uint32_t* codes, const uint32_t* forced,
               uint32_t n_forced, const active_set_config& config, rng& gen,
               std::vector<uint32_t>& out);

private:
    std::vector<uint32_t> stamp_;
    std::vector<uint32_t> hits_;
    uint32_t current_ = 0;
    std::vector<uint32_t> scratch_;
};

}  // namespace hslide
