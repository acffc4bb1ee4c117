// The LSH bucket tables (compact CSR buckets behind an open-addressing index) and the
// per-sample active-set query declared in hslide/lsh.hpp.
#include "hslide/error.hpp"
#include "hslide/lsh.hpp"

#include <omp.h>

#include <algorithm>
#include <numeric>

namespace hslide {

namespace {

constexpr uint64_t empty_slot = UINT64_MAX;
// Codes of up to this many bits are counted in arrays indexed by the code itself (when that
// array is not much larger than the items); wider codes are first renamed to dense ids
// through a temporary hash map.
constexpr int direct_bits = 20;
// Tables whose code columns are copied out of the item-major code array in one pass.
constexpr int max_group = 8;

// Fibonacci hashing: codes are far from uniform (DWTA favours some positions), so mix them.
inline size_t slot_of(uint32_t code, int shift) {
    return static_cast<size_t>((static_cast<uint64_t>(code) * 0x9e3779b97f4a7c15ULL) >> shift);
}

int log2_ceil(uint64_t n) {
    int s = 0;
    while ((uint64_t{1} << s) < n) ++s;
    return s;
}

// Where a key's offers go: the k-th offer (k = next++) to items[base + k] while k < capacity.
// FIFO starts next at -(offers - capacity) modulo 2^32, so the first offers of an overfull
// bucket count up through values >= capacity (offers < 2^32 - capacity) and fall off.
struct key_state {
    uint32_t next;
    uint32_t base;
};

// Per-thread scratch of a build, reused across the tables a thread builds.
struct build_scratch {
    std::vector<uint32_t> columns;      // max_group columns: this group's key of every item
    std::vector<uint32_t> order;        // items in the order they are offered
    std::vector<uint32_t> counts;       // offers per key; all zero between tables
    std::vector<key_state> state;       // per key
    std::vector<uint32_t> key_code;     // code of each key (renamed keys only)
    std::vector<uint32_t> bucket_code;  // code of each bucket
    std::vector<uint64_t> rename;       // code -> key, for wide codes
};

}  // namespace

lsh_tables::lsh_tables(const lsh_config& config) : config_(config) {
    validate(config_);
}

void lsh_tables::build(const uint32_t* codes, uint32_t n_items, uint64_t seed) {
    validate(config_);
    const int L = config_.L;
    const int code_bits = config_.K * config_.bits_per_hash;
    const uint32_t capacity = static_cast<uint32_t>(config_.bucket_capacity);
    const bool fifo = config_.policy == insertion_policy::fifo;
    const bool direct =
        code_bits <= direct_bits && (uint64_t{1} << code_bits) <= 8 * uint64_t{n_items} + 4096;
    n_items_ = n_items;
    tables_.resize(static_cast<size_t>(L));  // keeps the storage of the previous build

    // Groups of tables share one pass over the code array (a cache line holds 16 codes of an
    // item); as many groups as keep every thread busy. The grouping depends on the thread
    // count, the tables do not.
    const int threads = std::max(1, omp_get_max_threads());
    const int per_round = threads * max_group;
    const int n_groups = std::min(L, threads * ((L + per_round - 1) / per_round));
    const int group = (L + n_groups - 1) / n_groups;

    int bad_table = -1;
#pragma omp parallel
    {
        build_scratch s;
#pragma omp for schedule(dynamic, 1)
        for (int first = 0; first < L; first += group) {
            const int n_in_group = std::min(group, L - first);
            s.columns.resize(static_cast<size_t>(n_in_group) * n_items);
            uint32_t wide = 0;  // OR of the bits no code may have
            for (uint32_t i = 0; i < n_items; ++i) {
                const uint32_t* item_codes = codes + static_cast<size_t>(i) * L + first;
                for (int g = 0; g < n_in_group; ++g) {
                    const uint32_t c = item_codes[g];
                    wide |= code_bits >= 32 ? 0u : c >> code_bits;
                    s.columns[static_cast<size_t>(g) * n_items + i] = c;
                }
            }
            if (wide != 0) {
                // An exception must not leave the parallel region: note it, throw after.
#pragma omp critical(hslide_lsh_build_error)
                bad_table = first;
                continue;
            }
            for (int g = 0; g < n_in_group; ++g) {
                const int t = first + g;
                uint32_t* keys = s.columns.data() + static_cast<size_t>(g) * n_items;
                // Everything below depends only on (codes, seed, t), never on the thread.
                rng gen(derive_seed(seed, static_cast<uint64_t>(t)));
                s.order.resize(n_items);
                std::iota(s.order.begin(), s.order.end(), 0u);
                shuffle(s.order.begin(), s.order.end(), gen);

                // Keys: the code itself, or a dense id for wide codes.
                uint64_t n_keys;
                if (direct) {
                    n_keys = uint64_t{1} << code_bits;
                } else {
                    const uint64_t max_keys =
                        std::min<uint64_t>(n_items, uint64_t{1} << std::min(code_bits, 32));
                    const int bits = std::max(1, log2_ceil(2 * max_keys));
                    s.rename.assign(size_t{1} << bits, empty_slot);
                    const size_t mask = s.rename.size() - 1;
                    s.key_code.clear();
                    for (uint32_t i = 0; i < n_items; ++i) {
                        const uint32_t c = keys[i];
                        size_t k = slot_of(c, 64 - bits);
                        while (s.rename[k] != empty_slot &&
                               static_cast<uint32_t>(s.rename[k] >> 32) != c)
                            k = (k + 1) & mask;
                        if (s.rename[k] == empty_slot) {
                            s.rename[k] = (static_cast<uint64_t>(c) << 32) | s.key_code.size();
                            s.key_code.push_back(c);
                        }
                        keys[i] = static_cast<uint32_t>(s.rename[k]);
                    }
                    n_keys = s.key_code.size();
                }
                if (s.counts.size() < n_keys) s.counts.resize(n_keys, 0);
                if (s.state.size() < n_keys) s.state.resize(n_keys);

                // Count the offers per key, then lay out the buckets (in key order).
                for (uint32_t i = 0; i < n_items; ++i) ++s.counts[keys[i]];
                table& tb = tables_[static_cast<size_t>(t)];
                tb.offsets.clear();
                s.bucket_code.clear();
                uint32_t stored = 0;
                for (uint64_t key = 0; key < n_keys; ++key) {
                    const uint32_t offered = s.counts[key];
                    if (offered == 0) continue;
                    s.counts[key] = 0;
                    s.bucket_code.push_back(direct ? static_cast<uint32_t>(key) : s.key_code[key]);
                    tb.offsets.push_back(stored);
                    s.state[key] = {fifo ? 0u - (offered - std::min(offered, capacity)) : 0u,
                                    stored};
                    stored += std::min(offered, capacity);
                }
                tb.offsets.push_back(stored);
                tb.items.resize(stored);

                // Place the items in offer order. FIFO keeps the last `capacity` offered to a
                // bucket, oldest first; reservoir runs Algorithm R on the offers, drawing from
                // this table's generator after the shuffle.
                if (fifo) {
                    for (uint32_t r = 0; r < n_items; ++r) {
                        const uint32_t item = s.order[r];
                        key_state& st = s.state[keys[item]];
                        const uint32_t k = st.next++;
                        if (k < capacity) tb.items[st.base + k] = item;
                    }
                } else {
                    for (uint32_t r = 0; r < n_items; ++r) {
                        const uint32_t item = s.order[r];
                        key_state& st = s.state[keys[item]];
                        const uint64_t k = st.next++;
                        if (k < capacity) {
                            tb.items[st.base + k] = item;
                        } else {
                            const uint64_t j = gen.below(k + 1);
                            if (j < capacity) tb.items[st.base + j] = item;
                        }
                    }
                }

                // The index from code to bucket, sized to this table's buckets.
                const uint32_t n_buckets = static_cast<uint32_t>(s.bucket_code.size());
                const int bits = std::max(1, log2_ceil(2 * uint64_t{n_buckets}));
                tb.shift = 64 - bits;
                tb.slots.assign(size_t{1} << bits, empty_slot);
                const size_t mask = tb.slots.size() - 1;
                for (uint32_t b = 0; b < n_buckets; ++b) {
                    const uint32_t c = s.bucket_code[b];
                    size_t i = slot_of(c, tb.shift);
                    while (tb.slots[i] != empty_slot) i = (i + 1) & mask;
                    tb.slots[i] = (static_cast<uint64_t>(c) << 32) | b;
                }
                // Rebuilds reuse the storage; give back what a smaller build left unused.
                if (tb.items.capacity() > tb.items.size() + tb.items.size() / 4)
                    tb.items.shrink_to_fit();
                if (tb.offsets.capacity() > tb.offsets.size() + tb.offsets.size() / 4)
                    tb.offsets.shrink_to_fit();
            }
        }
    }
    if (bad_table >= 0) {
        tables_.assign(static_cast<size_t>(L), table{});
        n_items_ = 0;
        for (uint32_t i = 0; i < n_items; ++i)
            for (int t = 0; t < L; ++t) {
                const uint32_t c = codes[static_cast<size_t>(i) * L + t];
                HSLIDE_CHECK(
                    (c >> code_bits) == 0,
                    "LSH code {} of item {} in table {} does not fit in K * bits = {} bits", c, i,
                    t, code_bits);
            }
        HSLIDE_ASSERT(false);
    }
}

bucket_view lsh_tables::bucket(int t, uint32_t code) const {
    HSLIDE_ASSERT(t >= 0 && t < config_.L);
    if (static_cast<size_t>(t) >= tables_.size()) return {nullptr, 0};
    const table& tb = tables_[static_cast<size_t>(t)];
    const size_t mask = tb.slots.size() - 1;
    for (size_t i = slot_of(code, tb.shift);; i = (i + 1) & mask) {
        const uint64_t slot = tb.slots[i];
        if (slot == empty_slot) return {nullptr, 0};
        if (static_cast<uint32_t>(slot >> 32) == code) {
            const uint32_t b = static_cast<uint32_t>(slot);
            return {tb.items.data() + tb.offsets[b], tb.offsets[b + 1] - tb.offsets[b]};
        }
    }
}

uint32_t lsh_tables::n_buckets(int t) const {
    HSLIDE_ASSERT(t >= 0 && t < config_.L);
    if (static_cast<size_t>(t) >= tables_.size()) return 0;
    return static_cast<uint32_t>(tables_[static_cast<size_t>(t)].offsets.size() - 1);
}

size_t lsh_tables::memory_bytes() const {
    size_t bytes = tables_.capacity() * sizeof(table);
    for (const table& tb : tables_)
        bytes += tb.slots.capacity() * sizeof(uint64_t) + tb.offsets.capacity() * sizeof(uint32_t) +
                 tb.items.capacity() * sizeof(uint32_t);
    return bytes;
}

// --- active sets -----------------------------------------------------------------------------

active_set_builder::active_set_builder(uint32_t n_items) : marks_(n_items) {}

hits_cut cut_by_hits(const uint32_t* hist, int L, uint32_t threshold, size_t room) {
    size_t above = 0;
    uint32_t level = static_cast<uint32_t>(L) + 1;
    while (level > threshold && above + hist[level] < room) above += hist[level--];
    return {level, room - above};  // the loop stops with above <= room <= above + hist
}

void active_set_builder::build(const lsh_tables& tables, const uint32_t* codes,
                               const uint32_t* forced, uint32_t n_forced,
                               const active_set_config& config, rng& gen,
                               std::vector<uint32_t>& out, uint32_t codes_per_table,
                               std::vector<uint32_t>* hits) {
    const uint32_t n = tables.n_items();
    if (marks_.size() < n) marks_.resize(n);
    // Two stamp values per query: `chosen` marks ids in `out`, `seen` ids met in a bucket.
    if (current_ >= UINT32_MAX - 2) {
        std::fill(marks_.begin(), marks_.end(), mark{});
        current_ = 0;
    }
    current_ += 2;
    const uint32_t chosen = current_, seen = current_ - 1;
    mark* marks = marks_.data();

    out.clear();
    for (uint32_t f = 0; f < n_forced; ++f) {
        const uint32_t id = forced[f];
        HSLIDE_CHECK(id < n, "forced active id {} out of range ({} items)", id, n);
        if (marks[id].stamp != chosen) {
            marks[id].stamp = chosen;
            out.push_back(id);
        }
    }
    const size_t n_kept_forced = out.size();

    // Look the buckets up first, prefetching the marks of their items, so that the cache
    // misses of the L buckets overlap instead of following one another.
    scratch_.clear();
    const int L = tables.config().L;
    views_.clear();
    if (codes != nullptr && n > 0) {
        for (int t = 0; t < L; ++t) {
            const uint32_t* table_codes = codes + static_cast<size_t>(t) * codes_per_table;
            for (uint32_t p = 0; p < codes_per_table; ++p) {
                if (std::find(table_codes, table_codes + p, table_codes[p]) != table_codes + p)
                    continue;  // a repeated probe: the same bucket
                const bucket_view bv = tables.bucket(t, table_codes[p]);
                if (bv.count == 0) continue;
                views_.push_back(bv);
                for (uint32_t k = 0; k < bv.count; ++k) __builtin_prefetch(marks + bv.items[k], 1);
            }
        }
    }
    for (const bucket_view& bv : views_) {
        for (uint32_t k = 0; k < bv.count; ++k) {
            const uint32_t id = bv.items[k];
            mark& m = marks[id];
            if (m.stamp == seen) {
                ++m.hits;
            } else if (m.stamp != chosen) {
                m.stamp = seen;
                m.hits = 1;
                scratch_.push_back(id);
            }
        }
    }

    const uint32_t threshold = std::max<uint32_t>(1, config.hit_threshold);
    size_t n_candidates = 0;
    for (uint32_t id : scratch_) n_candidates += marks[id].hits >= threshold;

    // Over the cap: keep the items with the most hits; at the cut level, the first seen.
    uint32_t cut_level = threshold;  // keep hits > cut_level, and ...
    size_t at_cut_quota = SIZE_MAX;  // ... up to this many with hits == cut_level
    if (config.max_active > 0 && n_kept_forced + n_candidates > config.max_active) {
        const size_t quota =
            config.max_active > n_kept_forced ? config.max_active - n_kept_forced : 0;
        hist_.assign(static_cast<size_t>(L) + 2, 0);
        for (uint32_t id : scratch_)
            if (marks[id].hits >= threshold) ++hist_[std::min<uint32_t>(marks[id].hits, L + 1)];
        const hits_cut cut = cut_by_hits(hist_.data(), L, threshold, quota);
        cut_level = cut.level;
        at_cut_quota = cut.quota;
    }
    if (hits) hits->assign(out.size(), 0);  // the forced ids
    for (uint32_t id : scratch_) {
        const uint32_t h = marks[id].hits;
        if (h < cut_level) continue;
        if (h == cut_level) {
            if (at_cut_quota == 0) continue;
            if (at_cut_quota != SIZE_MAX) --at_cut_quota;
        }
        marks[id].stamp = chosen;
        out.push_back(id);
        if (hits) hits->push_back(h);
    }

    // Random fill from the ids not chosen (ids seen but dropped are eligible again).
    size_t target = config.min_active;
    if (config.max_active > 0) target = std::min<size_t>(target, config.max_active);
    target = std::min<size_t>(target, n);
    if (out.size() >= target) return;
    fill_randomly(
        gen, n, target - out.size(), n - out.size(),
        [&](uint32_t id) { return marks[id].stamp == chosen; },
        [&](uint32_t id) {
            marks[id].stamp = chosen;
            out.push_back(id);
        },
        scratch_);
    if (hits) hits->resize(out.size(), 0);
}

}  // namespace hslide
