// Locality-sensitive hashing over neurons: hash families, the L bucket tables, and the
// per-sample active-set query, as SLIDE uses them.
//
// A hash family maps a vector (a neuron's weight row, or a layer's input activation) to L
// bucket codes, one per table. Each code concatenates K hash values of `bits_per_hash` bits
// (an explicit parameter: published SLIDE code silently used 2 bits where it meant 3), so a
// code has K * bits_per_hash bits and is < 2^(K * bits_per_hash) <= 2^32. Hash k of table t
// (k < K) is hash number t * K + k of the family, and sits in the code at bit offset
// (K - 1 - k) * bits_per_hash (the first hash in the highest bits).
//
// Families (all deterministic functions of (config, dim, seed), so a checkpoint stores the
// seed and gets back the same functions; bucket_capacity and policy do not affect them):
//  - dwta:    densified winner-take-all. Each hash looks at a bin of w = min(2^bits_per_hash,
//             dim) coordinates (bins are consecutive slices of random permutations of the
//             dimensions, as in SLIDE, so a bin never repeats a coordinate) and returns the
//             position in the bin of the largest nonzero value (ties: the first position;
//             zeros, NaN and -inf never win). A bin with no such value is empty (all zero, as
//             with sparse vectors) and borrows the value of another hash (densification: the
//             hashes probed are a fixed pseudo-random sequence per hash; after 100 empty
//             probes the value is 0).
//  - wta:     winner-take-all without densification (an empty bin hashes to 0).
//  - simhash: signed random projections; each hash is bits_per_hash sign bits (1 when the
//             projection is > 0) of sparse +-1 projections (ceil(dim / 3) random coordinates
//             of each projection are nonzero), so K * bits_per_hash projections per table.
//             Memory: dim * K * L * bits_per_hash bytes.
//  - minhash: densified one-permutation MinHash over the set {i : x_i > 0}; each hash is the
//             low bits_per_hash bits of the minimum permuted index in its bin (the offset in
//             the bin of the first member). Bins are min(2^bits_per_hash, dim) wide, or
//             dim / (K * L) wide (one permutation) when that is larger, so very sparse
//             high-dimensional inputs still see non-empty bins. Densified as dwta.
//
// Every family's codes_dense and codes_sparse give the same codes for the same vector, and
// both are safe to call from many threads at once (scratch memory is per thread).
#pragma once

#include "hslide/rng.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hslide {

enum class hash_kind { dwta, wta, simhash, minhash };

/// Parses "dwta" | "wta" | "simhash" | "minhash" (throws hslide::error on anything else).
hash_kind parse_hash_kind(const std::string& name);
const char* to_string(hash_kind kind);
/// Every family's name (the argument only picks the overload; config.hpp has the others).
std::vector<std::string> names_of(hash_kind);

/// How a full bucket takes a new item.
enum class insertion_policy {
    fifo,       ///< keep the `bucket_capacity` most recently inserted items
    reservoir,  ///< keep a uniform random sample of the items offered (Algorithm R)
};
insertion_policy parse_insertion_policy(const std::string& name);
const char* to_string(insertion_policy policy);
std::vector<std::string> names_of(insertion_policy);

/// Parameters of one layer's LSH.
struct lsh_config {
    hash_kind kind = hash_kind::dwta;
    /// Hashes concatenated into one bucket code. 4 x 3 bits = 4096 buckets per table (the
    /// bucket count SLIDE's Amazon-670K setting K=6 really had, through its 2-bit packing):
    /// with K=6 x 3 bits an Amazon-sized layer leaves ~2.5 neurons per bucket, retrieval
    /// finds almost nothing and the active set is random fill (bench/synthetic.md).
    int K = 4;
    int L = 50;                 ///< number of tables
    int bits_per_hash = 3;      ///< bits each hash contributes; DWTA/WTA bins hold 2^bits
    int bucket_capacity = 128;  ///< items kept per bucket
    insertion_policy policy = insertion_policy::fifo;
};

/// The most hash tables a layer may have (--L's range; a checkpoint's L is held to it too).
constexpr int lsh_max_tables = 4096;

/// Throws hslide::error when a configuration cannot work: K < 1, L < 1 or over
/// lsh_max_tables, bits_per_hash < 1, K * bits_per_hash > 32, bucket_capacity < 1.
void validate(const lsh_config& config);

/// A family's functions as plain arrays, for a device that evaluates them itself (the GPU
/// backend; src/gpu/device_hash.hpp evaluates them and gives codes_dense's codes exactly).
struct hash_function_data {
    hash_kind kind = hash_kind::dwta;
    int K = 0, L = 0, bits_per_hash = 0;
    uint32_t dim = 0;
    // Bin families (dwta, wta, minhash): hash h reads coordinates bins[h * width .. + width);
    // a value is masked with value_mask; an empty bin is densified (dwta, minhash) by probing
    // the pseudo-random sequence splitmix64(densify_seed ^ (h << 32 | attempt)), attempt =
    // 1..100, over the raw values of the other hashes.
    uint32_t n_hashes = 0, width = 0, value_mask = 0;
    bool densify = false;
    uint64_t densify_seed = 0;
    std::vector<uint32_t> bins;
    // simhash: projection p (K * bits_per_hash per table, the table's first bit highest) sums
    // x_i * signs[i * sign_stride + p] over the nonzero x_i in increasing i.
    uint32_t projections = 0, sign_stride = 0;
    std::vector<int8_t> signs;
};

/// A family of K*L hash functions over vectors of a fixed dimension.
class hash_family {
  public:
    virtual ~hash_family() = default;

    /// Builds the family `config.kind` for vectors of length `dim` (>= 1), drawn from `seed`.
    /// Validates `config` (throws hslide::error).
    static std::unique_ptr<hash_family> create(const lsh_config& config, uint32_t dim,
                                               uint64_t seed);

    /// Writes the L bucket codes of the dense vector x[0..dim) to codes[0..L).
    virtual void codes_dense(const float* x, uint32_t* codes) const = 0;

    /// Writes the L bucket codes of a sparse vector (ids ascending, < dim) to codes[0..L).
    /// Equal to codes_dense of the same vector written densely.
    virtual void codes_sparse(const uint32_t* ids, const float* values, uint32_t nnz,
                              uint32_t* codes) const = 0;

    /// Multi-probe codes of a query: for each table t, codes[t * (1 + probes)] is codes_dense's
    /// code, and the next `probes` are codes of nearby buckets: the code x would have if one
    /// sub-hash's winner lost to its runner-up, the sub-hashes won by the smallest margin
    /// first. DWTA and WTA have runner-ups; a table with fewer than `probes` of them, and the
    /// other families, repeat the base code (a repeated bucket adds nothing to a union).
    virtual void probe_codes_dense(const float* x, uint32_t probes, uint32_t* codes) const;

    /// Codes of n_rows dense rows: row r is rows[r * row_stride .. + dim), its codes go to
    /// codes[r * L .. + L) (the layout lsh_tables::build reads). Parallel over rows with
    /// OpenMP (serial when called inside a parallel region).
    void codes_dense_rows(const float* rows, uint32_t n_rows, size_t row_stride,
                          uint32_t* codes) const;

    /// The functions as arrays (see hash_function_data).
    virtual hash_function_data function_data() const = 0;

    const lsh_config& config() const { return config_; }
    uint32_t dim() const { return dim_; }
    uint64_t seed() const { return seed_; }

  protected:
    hash_family(const lsh_config& config, uint32_t dim, uint64_t seed)
        : config_(config), dim_(dim), seed_(seed) {}
    /// function_data with the fields every family shares filled in.
    hash_function_data common_data() const;
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

    /// Rebuilds every table from codes[item * L + table] for item < n_items (each code must
    /// be < 2^(K * bits_per_hash); throws hslide::error otherwise). Items are offered to the
    /// buckets in a random order (so FIFO does not favour high ids): table t offers them in
    /// the order hslide::shuffle(0..n_items-1, rng(derive_seed(seed, t))) leaves, and the
    /// reservoir draws continue from that generator. Buckets over capacity apply the
    /// insertion policy. Tables are built in parallel (OpenMP, one table per task), and the
    /// result does not depend on the thread count. Memory: 4 bytes per stored item, 4 per
    /// bucket, 8 per index slot (2 to 4 slots per bucket).
    void build(const uint32_t* codes, uint32_t n_items, uint64_t seed);

    /// The bucket of `code` in `table` (empty when no item hashed there). Items are listed
    /// oldest offered first for FIFO, in reservoir-slot order for reservoir. Thread-safe.
    bucket_view bucket(int table, uint32_t code) const;

    /// Number of non-empty buckets in `table`.
    uint32_t n_buckets(int table) const;

    const lsh_config& config() const { return config_; }
    uint32_t n_items() const { return n_items_; }
    /// Bytes held by the tables (for memory reports and tests).
    size_t memory_bytes() const;

  private:
    struct table {
        // Open addressing, linear probing, power-of-two size >= 2x the buckets: slot holds
        // (code << 32) | bucket index, or UINT64_MAX when empty.
        std::vector<uint64_t> slots;
        int shift = 64;                 // slot of a code = mix(code) >> shift
        std::vector<uint32_t> offsets;  // bucket b holds items[offsets[b]..offsets[b+1])
        std::vector<uint32_t> items;
    };
    lsh_config config_;
    uint32_t n_items_ = 0;
    std::vector<table> tables_;
};

/// How a sample's active set is formed from its buckets.
struct active_set_config {
    /// random fill up to this many (clamped to max_active > 0); a top-k layer fills its sets
    /// the same way (its other fields are LSH's)
    uint32_t min_active = 0;
    uint32_t max_active = 0;     ///< cap (0 = no cap); labels are never dropped
    uint32_t hit_threshold = 1;  ///< keep only items found in at least this many tables (0 = 1)
    /// Multi-probe at prediction (never in training): besides its own bucket, each table
    /// contributes the `probes` buckets nearest to it (hash_family::probe_codes_dense).
    uint32_t probes = 0;
};

/// The cut of a bucket union over max_active (active_set_builder's rule): keep the items hit
/// more than `level` times, and of those hit exactly `level` times the first `quota` in the
/// union's order (SIZE_MAX: every one).
struct hits_cut {
    uint32_t level;
    size_t quota;
};
/// The cut keeping `room` of a union whose items hit h times number hist[h] (h in
/// [threshold, L + 1], L + 1 standing for more): the highest hit counts first.
hits_cut cut_by_hits(const uint32_t* hist, int L, uint32_t threshold, size_t room);

/// The random fill of a set (active_set_builder's rule; a sharded output layer's sets draw
/// theirs by it too): `need` more of the ids in [0, n) that are not chosen, drawn by `gen`, by
/// rejection (gen.below(n) until an unchosen id) or, when more than half of the `available`
/// unchosen ids are needed, by a partial shuffle of their list in id order. is_chosen(id) reads
/// the membership, choose(id) adds an id; `scratch` holds the list.
template <class IsChosen, class Choose>
void fill_randomly(rng& gen, uint32_t n, size_t need, size_t available, IsChosen&& is_chosen,
                   Choose&& choose, std::vector<uint32_t>& scratch) {
    if (2 * need > available) {
        scratch.clear();
        for (uint32_t id = 0; id < n; ++id)
            if (!is_chosen(id)) scratch.push_back(id);
        for (size_t i = 0; i < need; ++i) {
            const size_t j = i + static_cast<size_t>(gen.below(scratch.size() - i));
            std::swap(scratch[i], scratch[j]);
            choose(scratch[i]);
        }
    } else {
        while (need > 0) {
            const uint32_t id = static_cast<uint32_t>(gen.below(n));
            if (is_chosen(id)) continue;
            choose(id);
            --need;
        }
    }
}

/// Per-thread scratch for active-set queries: a stamp array over the items, so no memset of
/// n_items per query. One builder per thread; it grows to tables.n_items() on first use.
class active_set_builder {
  public:
    explicit active_set_builder(uint32_t n_items = 0);

    /// Fills `out` with: the `forced` ids first (labels in training), then the union of the
    /// items in the L buckets `codes[0..L)` that were hit at least `hit_threshold` times
    /// (first-seen order), then uniformly random other items up to `min_active`. When over
    /// `max_active`, the union is cut to the items with the most hits (ties: first seen);
    /// forced ids are never dropped. Every id appears once (repeated forced ids are kept once).
    /// The kept union items stay in first-seen order. The random fill draws from `gen` by
    /// rejection against the stamps, or by a partial shuffle of the unchosen items when more
    /// than half of them are needed (the only case with O(n_items) work). Throws
    /// hslide::error when a forced id is >= tables.n_items(). With `codes_per_table` > 1
    /// (multi-probe queries, hash_family::probe_codes_dense), table t's buckets are those of
    /// codes[t * codes_per_table .. + codes_per_table), a repeated code counted once. With
    /// `hits`, hits[i] becomes the tables that listed out[i] (0 for forced and fill ids).
    void build(const lsh_tables& tables, const uint32_t* codes, const uint32_t* forced,
               uint32_t n_forced, const active_set_config& config, rng& gen,
               std::vector<uint32_t>& out, uint32_t codes_per_table = 1,
               std::vector<uint32_t>* hits = nullptr);

  private:
    struct mark {
        uint32_t stamp = 0;  // == current_: the id is in `out`; == current_ - 1: seen in a
                             // bucket this query, not (yet) kept
        uint32_t hits = 0;   // tables that listed the id this query (when seen)
    };
    std::vector<mark> marks_;  // per item: one cache miss for both fields
    uint32_t current_ = 0;
    std::vector<uint32_t> scratch_;   // union in first-seen order
    std::vector<uint32_t> hist_;      // union items per hit count, for the max_active cut
    std::vector<bucket_view> views_;  // the query's non-empty buckets
};

}  // namespace hslide
