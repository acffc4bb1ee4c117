// Tests of the LSH layer: hash families (ranges, dense == sparse, determinism, the LSH
// property), bucket tables (membership, capacity, FIFO and reservoir, thread-count
// independence) and the active-set query.
#include "hslide/config.hpp"
#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/lsh.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <omp.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <vector>

using namespace hslide;
using hslide::testing::make_lsh_config;

namespace {

const hash_kind all_kinds[] = {hash_kind::dwta, hash_kind::wta, hash_kind::simhash,
                               hash_kind::minhash};

// A random vector with roughly `density` of its entries nonzero (at least one), values drawn
// from a few levels so that ties inside a bin happen, and negatives present.
std::vector<float> random_vector(uint32_t dim, double density, rng& gen, bool ties = false) {
    std::vector<float> x(dim, 0.0f);
    bool any = false;
    for (uint32_t i = 0; i < dim; ++i) {
        if (gen.uniform() >= density) continue;
        x[i] = ties ? static_cast<float>(static_cast<int>(gen.below(7)) - 2)
                    : static_cast<float>(gen.normal());
        any |= x[i] != 0.0f;
    }
    if (!any) x[gen.below(dim)] = 1.5f;
    return x;
}

void to_sparse(const std::vector<float>& x, std::vector<uint32_t>& ids, std::vector<float>& vals) {
    ids.clear();
    vals.clear();
    for (uint32_t i = 0; i < x.size(); ++i)
        if (x[i] != 0.0f) ids.push_back(i), vals.push_back(x[i]);
}

std::vector<uint32_t> dense_codes(const hash_family& f, const std::vector<float>& x) {
    std::vector<uint32_t> codes(static_cast<size_t>(f.config().L));
    f.codes_dense(x.data(), codes.data());
    return codes;
}

std::vector<uint32_t> sparse_codes(const hash_family& f, const std::vector<float>& x) {
    std::vector<uint32_t> ids;
    std::vector<float> vals;
    to_sparse(x, ids, vals);
    std::vector<uint32_t> codes(static_cast<size_t>(f.config().L));
    f.codes_sparse(ids.data(), vals.data(), static_cast<uint32_t>(ids.size()), codes.data());
    return codes;
}

// Hash k of table t, decoded from the code (the first hash sits in the highest bits).
uint32_t hash_value(const lsh_config& c, uint32_t code, int k) {
    const int shift = (c.K - 1 - k) * c.bits_per_hash;
    const uint64_t mask = (uint64_t{1} << c.bits_per_hash) - 1;
    return static_cast<uint32_t>((code >> shift) & mask);
}

struct family_case {
    int K, L, bits;
    uint32_t dim;
    double density;
};
// Awkward shapes: dim below the bin width, dim not a multiple of it, 32-bit codes, one table,
// wide sparse inputs (MinHash takes its wide-bin path there).
const family_case family_cases[] = {
    {
        6,
        50,
        3,
        128,
        1.0,
    },
    {6, 50, 3, 128, 0.3},
    {4, 7, 8, 33, 0.5},
    {3, 11, 5, 5, 0.8},
    {1, 3, 32, 200, 0.2},
    {2, 1, 2, 1000, 0.3},
    {6, 50, 3, 1000, 0.01},
    {8, 4, 4, 77, 0.05},
    {5, 20, 3, 5000, 0.004},
};

}  // namespace

// --- configuration -----------------------------------------------------------------------------

TEST(LshConfig, ValidationRejectsImpossibleSettings) {
    EXPECT_NO_THROW(validate(lsh_config{}));
    EXPECT_NO_THROW(validate(make_lsh_config(hash_kind::dwta, 4, 1, 8)));  // exactly 32 bits
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, 11, 50, 3)), hslide::error);  // 33 bits
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, 1, 50, 33)), hslide::error);
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, 0, 50, 3)), hslide::error);
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, -1, 50, 3)), hslide::error);
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, 6, 0, 3)), hslide::error);
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, 6, 50, 0)), hslide::error);
    EXPECT_THROW(validate(make_lsh_config(hash_kind::dwta, 6, 50, 3, 0)), hslide::error);
    EXPECT_THROW(hash_family::create(make_lsh_config(hash_kind::simhash, 6, 50, 6), 128, 1),
                 hslide::error);
    EXPECT_THROW(hash_family::create(lsh_config{}, 0, 1), hslide::error);
    EXPECT_THROW(lsh_tables(make_lsh_config(hash_kind::dwta, 6, 50, 3, 0)), hslide::error);
}

TEST(LshConfig, ProbesRoundTripThroughTheModelConfigJson) {
    // Checkpoints store the model config as JSON: probes survive it, and a config written
    // before probes existed reads as 0.
    model_config c = hslide::testing::two_layer_model(10, 8, 5000, sparsity_mode::lsh);
    c.layers[1].active.probes = 3;
    const std::string json = model_config_to_json(c);
    EXPECT_EQ(model_config_from_json(json).layers[1].active.probes, 3u);
    auto old = nlohmann::json::parse(json);
    for (auto& layer : old["layers"]) layer.erase("probes");
    EXPECT_EQ(model_config_from_json(old.dump()).layers[1].active.probes, 0u);
    c.layers[1].active.probes = 65;
    EXPECT_THROW(validate(c), hslide::error);
}

TEST(LshConfig, NamesRoundTrip) {
    for (hash_kind k : all_kinds) EXPECT_EQ(parse_hash_kind(to_string(k)), k);
    EXPECT_EQ(parse_insertion_policy("fifo"), insertion_policy::fifo);
    EXPECT_EQ(parse_insertion_policy(to_string(insertion_policy::reservoir)),
              insertion_policy::reservoir);
    EXPECT_THROW(parse_hash_kind("DWTA2"), hslide::error);
    EXPECT_THROW(parse_insertion_policy("lru"), hslide::error);
}

// --- hash families -----------------------------------------------------------------------------

TEST(LshFamily, CodesInRangeAndDenseEqualsSparse) {
    rng gen(101);
    for (hash_kind kind : all_kinds) {
        for (const family_case& fc : family_cases) {
            const lsh_config c = make_lsh_config(kind, fc.K, fc.L, fc.bits);
            if (kind == hash_kind::simhash &&
                static_cast<uint64_t>(fc.K) * fc.L * fc.bits * fc.dim > (uint64_t{1} << 26))
                continue;
            SCOPED_TRACE(::testing::Message() << to_string(kind) << " K=" << fc.K << " L=" << fc.L
                                              << " bits=" << fc.bits << " dim=" << fc.dim);
            const auto f = hash_family::create(c, fc.dim, 7);
            const uint64_t limit = uint64_t{1} << (fc.K * fc.bits);
            std::set<uint32_t> distinct;
            for (int v = 0; v < 30; ++v) {
                const auto x = random_vector(fc.dim, fc.density, gen, v % 2 == 1);
                const auto d = dense_codes(*f, x);
                const auto s = sparse_codes(*f, x);
                ASSERT_EQ(d, s) << "vector " << v;
                for (uint32_t code : d) ASSERT_LT(code, limit);
                distinct.insert(d.begin(), d.end());
            }
            EXPECT_GT(distinct.size(), 1u);  // not a constant function
        }
    }
}

TEST(LshFamily, KernelVariantsAgree) {
    // A family picks its kernels for active_isa() when created; every level this CPU supports
    // must give the codes of the scalar one.
    rng gen(103);
    for (hash_kind kind : all_kinds)
        for (uint32_t dim : {128u, 77u, 300u}) {
            const lsh_config c = make_lsh_config(kind, 6, 50, 3);
            set_active_isa(isa_level::scalar);
            const auto reference = hash_family::create(c, dim, 3);
            std::vector<std::unique_ptr<hash_family>> variants;
            for (isa_level level :
                 {isa_level::avx2, isa_level::avx512, isa_level::avx512bf16, isa_level::amx}) {
                if (!isa_supported(level)) continue;
                set_active_isa(level);
                variants.push_back(hash_family::create(c, dim, 3));
            }
            clear_active_isa();
            variants.push_back(hash_family::create(c, dim, 3));
            for (int v = 0; v < 20; ++v) {
                const auto x = random_vector(dim, v % 3 == 0 ? 0.1 : 0.9, gen, v % 2 == 1);
                const auto expected = dense_codes(*reference, x);
                for (const auto& f : variants)
                    ASSERT_EQ(dense_codes(*f, x), expected) << to_string(kind) << " dim " << dim;
            }
        }
}

TEST(LshFamily, SparseIdsOutOfRangeThrow) {
    for (hash_kind kind : all_kinds) {
        const auto f = hash_family::create(make_lsh_config(kind, 2, 3, 3), 50, 1);
        const uint32_t ids[2] = {3, 50};
        const float vals[2] = {1.0f, 2.0f};
        uint32_t codes[3];
        EXPECT_THROW(f->codes_sparse(ids, vals, 2, codes), hslide::error) << to_string(kind);
    }
}

TEST(LshFamily, DwtaValueIsTheArgmaxOfItsBin) {
    // dim == bin width and one hash: the bin is a permutation of the whole vector, so the
    // position found must hold the largest value, and moving that value moves the code.
    const lsh_config c = make_lsh_config(hash_kind::wta, 1, 4, 3);
    const auto f = hash_family::create(c, 8, 3);
    rng gen(5);
    for (int v = 0; v < 20; ++v) {
        std::vector<float> x(8);
        for (auto& e : x) e = static_cast<float>(gen.normal());
        const auto codes = dense_codes(*f, x);
        const size_t winner = std::max_element(x.begin(), x.end()) - x.begin();
        for (int t = 0; t < 4; ++t) {
            // Find the code of a vector with one nonzero at the winner's coordinate: it
            // must equal the code of x (the same position wins).
            std::vector<float> e(8, 0.0f);
            e[winner] = 1.0f;
            EXPECT_EQ(dense_codes(*f, e)[t], codes[t]);
        }
    }
}

TEST(LshFamily, ProbeCodesAreTheRunnerUpBucketsNearestFirst) {
    // A brute-force reference from the family's bins: with every coordinate positive no bin
    // is empty (no densification), a sub-hash is the first position of its bin's maximum,
    // and its probe swaps in the runner-up; a table's probes follow the margins, smallest
    // first; past its K runner-ups a table repeats its base code.
    for (const hash_kind kind : {hash_kind::dwta, hash_kind::wta}) {
        const lsh_config c = make_lsh_config(kind, 3, 8, 3);
        const auto f = hash_family::create(c, 64, 11);
        const hash_function_data d = f->function_data();
        rng gen(12);
        for (int v = 0; v < 20; ++v) {
            std::vector<float> x(64);
            for (auto& e : x) e = 0.01f + static_cast<float>(gen.uniform());
            if (v == 0) x[d.bins[1]] = x[d.bins[0]];  // a tie: margin 0, probed first
            const auto base = dense_codes(*f, x);
            for (const uint32_t probes : {1u, 2u, 5u}) {
                std::vector<uint32_t> got(size_t(c.L) * (1 + probes));
                f->probe_codes_dense(x.data(), probes, got.data());
                for (int t = 0; t < c.L; ++t) {
                    std::vector<uint32_t> winner(c.K), second(c.K);
                    std::vector<std::pair<float, int>> margins;
                    for (int k = 0; k < c.K; ++k) {
                        const uint32_t* bin = d.bins.data() + size_t(t * c.K + k) * d.width;
                        std::vector<float> vals(d.width);
                        for (uint32_t j = 0; j < d.width; ++j) vals[j] = x[bin[j]];
                        winner[k] =
                            uint32_t(std::max_element(vals.begin(), vals.end()) - vals.begin());
                        vals[winner[k]] = -1.0f;
                        second[k] =
                            uint32_t(std::max_element(vals.begin(), vals.end()) - vals.begin());
                        margins.push_back({x[bin[winner[k]]] - x[bin[second[k]]], k});
                    }
                    std::sort(margins.begin(), margins.end());
                    auto code_of = [&](const std::vector<uint32_t>& w) {
                        uint32_t code = 0;
                        for (int k = 0; k < c.K; ++k) code = (code << c.bits_per_hash) | w[k];
                        return code;
                    };
                    const uint32_t* row = got.data() + size_t(t) * (1 + probes);
                    ASSERT_EQ(row[0], base[t]);
                    ASSERT_EQ(row[0], code_of(winner));
                    for (uint32_t p = 0; p < probes; ++p) {
                        std::vector<uint32_t> w = winner;
                        if (p < uint32_t(c.K)) w[margins[p].second] = second[margins[p].second];
                        EXPECT_EQ(row[1 + p], code_of(w)) << to_string(kind) << " vector " << v
                                                          << " table " << t << " probe " << p;
                    }
                }
            }
        }
    }
    // Families without runner-ups repeat their base codes.
    const auto sim = hash_family::create(make_lsh_config(hash_kind::simhash, 4, 5, 1), 32, 3);
    rng gen(13);
    std::vector<float> x(32);
    for (auto& e : x) e = static_cast<float>(gen.normal());
    const auto base = dense_codes(*sim, x);
    std::vector<uint32_t> got(5 * 3);
    sim->probe_codes_dense(x.data(), 2, got.data());
    for (int t = 0; t < 5; ++t)
        for (int p = 0; p < 3; ++p) EXPECT_EQ(got[size_t(t) * 3 + p], base[t]);
}

TEST(LshFamily, Deterministic) {
    rng gen(9);
    for (hash_kind kind : all_kinds) {
        const lsh_config c = make_lsh_config(kind, 6, 50, 3);
        const auto a = hash_family::create(c, 128, 42);
        const auto b = hash_family::create(c, 128, 42);
        const auto other = hash_family::create(c, 128, 43);
        bool differs = false;
        for (int v = 0; v < 10; ++v) {
            const auto x = random_vector(128, 0.7, gen);
            EXPECT_EQ(dense_codes(*a, x), dense_codes(*b, x)) << to_string(kind);
            differs |= dense_codes(*a, x) != dense_codes(*other, x);
        }
        EXPECT_TRUE(differs) << to_string(kind);
        EXPECT_EQ(a->seed(), 42u);
        EXPECT_EQ(a->dim(), 128u);
    }
}

TEST(LshFamily, CodesDenseRowsMatchesOneByOne) {
    rng gen(13);
    const lsh_config c = make_lsh_config(hash_kind::dwta, 6, 50, 3);
    const auto f = hash_family::create(c, 128, 1);
    const uint32_t n = 1000, stride = 130;
    std::vector<float> rows(static_cast<size_t>(n) * stride);
    for (auto& v : rows) v = static_cast<float>(gen.normal());
    std::vector<uint32_t> codes(static_cast<size_t>(n) * c.L), one(c.L);
    f->codes_dense_rows(rows.data(), n, stride, codes.data());
    for (uint32_t r = 0; r < n; r += 37) {
        f->codes_dense(rows.data() + static_cast<size_t>(r) * stride, one.data());
        for (int t = 0; t < c.L; ++t) ASSERT_EQ(codes[static_cast<size_t>(r) * c.L + t], one[t]);
    }
}

// The LSH property: the chance that one hash agrees on two vectors grows with their cosine
// similarity.
TEST(LshFamily, CollisionRateGrowsWithSimilarity) {
    const uint32_t dim = 128;
    const double rhos[] = {0.95, 0.7, 0.2};
    for (hash_kind kind : all_kinds) {
        const lsh_config c = make_lsh_config(kind, 6, 50, 3);
        const auto f = hash_family::create(c, dim, 77);
        rng gen(1234);
        double rate[3];
        for (int r = 0; r < 3; ++r) {
            uint64_t agree = 0, total = 0;
            for (int pair = 0; pair < 200; ++pair) {
                std::vector<float> x(dim), y(dim);
                for (uint32_t i = 0; i < dim; ++i) {
                    const double a = gen.normal(), z = gen.normal();
                    x[i] = static_cast<float>(a);
                    y[i] = static_cast<float>(rhos[r] * a + std::sqrt(1 - rhos[r] * rhos[r]) * z);
                }
                const auto cx = dense_codes(*f, x), cy = dense_codes(*f, y);
                for (int t = 0; t < c.L; ++t)
                    for (int k = 0; k < c.K; ++k, ++total)
                        agree += hash_value(c, cx[t], k) == hash_value(c, cy[t], k);
            }
            rate[r] = static_cast<double>(agree) / static_cast<double>(total);
        }
        SCOPED_TRACE(::testing::Message()
                     << to_string(kind) << ": " << rate[0] << " " << rate[1] << " " << rate[2]);
        EXPECT_GT(rate[0], rate[1] + 0.1);
        EXPECT_GT(rate[1], rate[2] + 0.05);
    }
}

TEST(LshFamily, DensificationFillsEmptyBins) {
    // A vector with one nonzero leaves almost every DWTA bin empty: densified, the hashes
    // all borrow the few non-empty values; WTA hashes the empty bins to 0.
    const lsh_config dw = make_lsh_config(hash_kind::dwta, 6, 50, 3);
    const lsh_config w = make_lsh_config(hash_kind::wta, 6, 50, 3);
    const auto fd = hash_family::create(dw, 128, 5);
    const auto fw = hash_family::create(w, 128, 5);
    std::vector<float> x(128, 0.0f);
    x[17] = 2.0f;
    const auto cd = dense_codes(*fd, x), cw = dense_codes(*fw, x);
    std::set<uint32_t> dwta_values;
    int wta_zeros = 0;
    for (int t = 0; t < 50; ++t)
        for (int k = 0; k < 6; ++k) {
            dwta_values.insert(hash_value(dw, cd[t], k));
            wta_zeros += hash_value(w, cw[t], k) == 0;
        }
    // Coordinate 17 sits in ~19 bins of 300 (one per permutation): every DWTA value is the
    // position of 17 in one of them, and most WTA values are 0.
    EXPECT_LE(dwta_values.size(), 8u);
    EXPECT_GT(wta_zeros, 250);
    EXPECT_EQ(cd, sparse_codes(*fd, x));
}

// --- tables ------------------------------------------------------------------------------------

namespace {

std::vector<uint32_t> random_codes(uint32_t n, int L, int code_bits, rng& gen, uint32_t skew) {
    // `skew` > 0 draws codes from only `skew` values, so buckets overflow.
    std::vector<uint32_t> codes(static_cast<size_t>(n) * L);
    for (auto& c : codes) {
        const uint64_t range = skew ? skew : (uint64_t{1} << code_bits);
        c = static_cast<uint32_t>(gen.below(range));
        if (skew && code_bits < 32) c &= static_cast<uint32_t>((uint64_t{1} << code_bits) - 1);
    }
    return codes;
}

std::vector<uint32_t> offer_order(uint32_t n, uint64_t seed, int t) {
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    rng gen(derive_seed(seed, static_cast<uint64_t>(t)));
    shuffle(order.begin(), order.end(), gen);
    return order;
}

// Every bucket of every table, keyed by code.
std::vector<std::map<uint32_t, std::vector<uint32_t>>> dump(const lsh_tables& tables,
                                                            const std::vector<uint32_t>& codes) {
    const int L = tables.config().L;
    std::vector<std::map<uint32_t, std::vector<uint32_t>>> out(static_cast<size_t>(L));
    for (int t = 0; t < L; ++t)
        for (uint32_t i = 0; i < tables.n_items(); ++i) {
            const uint32_t code = codes[static_cast<size_t>(i) * L + t];
            if (out[t].count(code)) continue;
            const bucket_view b = tables.bucket(t, code);
            out[t][code] = std::vector<uint32_t>(b.items, b.items + b.count);
        }
    return out;
}

}  // namespace

TEST(LshTables, BucketsHoldMatchingItemsWithinCapacity) {
    rng gen(21);
    struct tcase {
        int K, bits, L, capacity;
        uint32_t n, skew;
        insertion_policy policy;
    };
    const tcase cases[] = {
        {2, 3, 8, 16, 5000, 0, insertion_policy::fifo},
        {2, 3, 8, 16, 5000, 0, insertion_policy::reservoir},
        {6, 3, 5, 4, 20000, 0, insertion_policy::fifo},
        {4, 8, 6, 3, 3001, 40, insertion_policy::reservoir},  // 32-bit codes, skewed
        {4, 8, 6, 3, 3001, 0, insertion_policy::fifo},
        {1, 1, 3, 1, 7, 0, insertion_policy::fifo},
    };
    for (const tcase& tc : cases) {
        SCOPED_TRACE(::testing::Message() << "K=" << tc.K << " bits=" << tc.bits << " n=" << tc.n
                                          << " policy=" << to_string(tc.policy));
        const lsh_config c =
            make_lsh_config(hash_kind::dwta, tc.K, tc.L, tc.bits, tc.capacity, tc.policy);
        const auto codes = random_codes(tc.n, tc.L, tc.K * tc.bits, gen, tc.skew);
        lsh_tables tables(c);
        tables.build(codes.data(), tc.n, 99);
        EXPECT_EQ(tables.n_items(), tc.n);
        size_t stored_total = 0;
        for (int t = 0; t < tc.L; ++t) {
            std::map<uint32_t, uint32_t> offered;
            for (uint32_t i = 0; i < tc.n; ++i) ++offered[codes[static_cast<size_t>(i) * tc.L + t]];
            EXPECT_EQ(tables.n_buckets(t), offered.size());
            std::vector<int> seen(tc.n, 0);
            for (const auto& [code, count] : offered) {
                const bucket_view b = tables.bucket(t, code);
                ASSERT_EQ(b.count, std::min<uint32_t>(count, tc.capacity));
                for (uint32_t k = 0; k < b.count; ++k) {
                    const uint32_t item = b.items[k];
                    ASSERT_LT(item, tc.n);
                    ASSERT_EQ(codes[static_cast<size_t>(item) * tc.L + t], code);
                    ASSERT_EQ(seen[item]++, 0) << "item twice in table " << t;
                }
                stored_total += b.count;
            }
            // Codes no item has give empty buckets.
            for (int probe = 0; probe < 50; ++probe) {
                const uint32_t code =
                    static_cast<uint32_t>(gen.below(uint64_t{1} << (tc.K * tc.bits)));
                if (!offered.count(code)) EXPECT_EQ(tables.bucket(t, code).count, 0u);
            }
        }
        // Memory is proportional to what is stored: items + offsets + at most 4 slots per
        // bucket (power of two >= 2x buckets), plus small overhead.
        size_t buckets = 0;
        for (int t = 0; t < tc.L; ++t) buckets += tables.n_buckets(t);
        EXPECT_LE(tables.memory_bytes(),
                  stored_total * 4 + buckets * (4 + 32) + static_cast<size_t>(tc.L) * 128);
    }
}

TEST(LshTables, EmptyBeforeBuildAndWithNoItems) {
    const lsh_config c = make_lsh_config(hash_kind::dwta, 6, 4, 3);
    lsh_tables tables(c);
    EXPECT_EQ(tables.bucket(0, 5).count, 0u);
    tables.build(nullptr, 0, 1);
    EXPECT_EQ(tables.bucket(3, 5).count, 0u);
    EXPECT_EQ(tables.n_buckets(3), 0u);
}

TEST(LshTables, RejectsCodesWiderThanTheConfiguration) {
    const lsh_config c = make_lsh_config(hash_kind::dwta, 2, 1, 3);
    std::vector<uint32_t> codes = {1, 64, 3};
    lsh_tables tables(c);
    EXPECT_THROW(tables.build(codes.data(), 3, 1), hslide::error);
}

TEST(LshTables, FifoKeepsTheLastOfferedOldestFirst) {
    rng gen(31);
    const int L = 4, capacity = 5;
    const uint32_t n = 400;
    const lsh_config c =
        make_lsh_config(hash_kind::dwta, 1, L, 3, capacity, insertion_policy::fifo);
    const auto codes = random_codes(n, L, 3, gen, 0);  // 8 codes: ~50 offers per bucket
    lsh_tables tables(c);
    const uint64_t seed = 2024;
    tables.build(codes.data(), n, seed);
    for (int t = 0; t < L; ++t) {
        const auto order = offer_order(n, seed, t);
        std::map<uint32_t, std::vector<uint32_t>> offers;
        for (uint32_t item : order)
            offers[codes[static_cast<size_t>(item) * L + t]].push_back(item);
        for (const auto& [code, items] : offers) {
            const std::vector<uint32_t> expected(
                items.end() - std::min<size_t>(items.size(), capacity), items.end());
            const bucket_view b = tables.bucket(t, code);
            EXPECT_EQ(std::vector<uint32_t>(b.items, b.items + b.count), expected);
        }
    }
}

TEST(LshTables, ReservoirKeepsAFairSample) {
    // One bucket per table (every item has code 0), 1000 offers, capacity 100: each offer
    // is kept with probability 0.1 whatever its position in the offer order.
    const int L = 50, capacity = 100;
    const uint32_t n = 1000;
    const lsh_config c =
        make_lsh_config(hash_kind::dwta, 1, L, 2, capacity, insertion_policy::reservoir);
    std::vector<uint32_t> codes(static_cast<size_t>(n) * L, 0);
    std::vector<double> by_rank(10, 0);
    int builds = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed, ++builds) {
        lsh_tables tables(c);
        tables.build(codes.data(), n, seed);
        for (int t = 0; t < L; ++t) {
            const auto order = offer_order(n, seed, t);
            std::vector<uint32_t> rank(n);
            for (uint32_t r = 0; r < n; ++r) rank[order[r]] = r;
            const bucket_view b = tables.bucket(t, 0);
            ASSERT_EQ(b.count, static_cast<uint32_t>(capacity));
            for (uint32_t k = 0; k < b.count; ++k) by_rank[rank[b.items[k]] / 100] += 1;
        }
    }
    // 400 samples of 100: each rank decile expects 4000 kept (sd ~ 60).
    const double expected = builds * L * capacity / 10.0;
    for (int d = 0; d < 10; ++d)
        EXPECT_NEAR(by_rank[d], expected, 0.06 * expected) << "decile " << d;
}

TEST(LshTables, ResultIndependentOfThreadCount) {
    rng gen(41);
    const int L = 12;
    const uint32_t n = 6000;
    for (insertion_policy policy : {insertion_policy::fifo, insertion_policy::reservoir}) {
        for (int bits : {3, 8}) {  // the direct map (18-bit codes) and the hash map (32-bit)
            const lsh_config c =
                make_lsh_config(hash_kind::dwta, 4 + (bits == 3 ? 2 : 0), L, bits, 4, policy);
            const auto codes = random_codes(n, L, c.K * bits, gen, 300);
            const int saved = omp_get_max_threads();
            omp_set_num_threads(1);
            lsh_tables one(c);
            one.build(codes.data(), n, 5);
            omp_set_num_threads(2);
            lsh_tables two(c);
            two.build(codes.data(), n, 5);
            omp_set_num_threads(3);
            lsh_tables three(c);
            three.build(codes.data(), n, 5);
            omp_set_num_threads(saved);
            const auto d1 = dump(one, codes);
            EXPECT_EQ(d1, dump(two, codes));
            EXPECT_EQ(d1, dump(three, codes));
            lsh_tables other_seed(c);
            other_seed.build(codes.data(), n, 6);
            EXPECT_NE(d1, dump(other_seed, codes));
        }
    }
}

// --- active sets -------------------------------------------------------------------------------

namespace {

// Ten items, three tables, codes 0..3 (K=1, 2 bits). Query codes {0, 0, 0} hit:
//   table 0, code 0: items 1, 2, 3, 4
//   table 1, code 0: items 2, 3, 5
//   table 2, code 0: items 3, 6, 2
// so hits: 3 -> 3, 2 -> 3, 1 -> 1, 4 -> 1, 5 -> 1, 6 -> 1; items 0, 7, 8, 9 never.
struct small_index {
    lsh_config config = make_lsh_config(hash_kind::dwta, 1, 3, 2, 100);
    std::vector<uint32_t> codes;
    lsh_tables tables{config};
    small_index() {
        const uint32_t table0[10] = {1, 0, 0, 0, 0, 2, 3, 1, 2, 3};
        const uint32_t table1[10] = {1, 1, 0, 0, 2, 0, 3, 1, 2, 3};
        const uint32_t table2[10] = {1, 1, 0, 0, 2, 3, 0, 1, 2, 3};
        for (int i = 0; i < 10; ++i) {
            codes.push_back(table0[i]);
            codes.push_back(table1[i]);
            codes.push_back(table2[i]);
        }
        tables.build(codes.data(), 10, 3);
    }
};

std::set<uint32_t> as_set(const std::vector<uint32_t>& v) {
    return {v.begin(), v.end()};
}

}  // namespace

TEST(ActiveSet, UnionThresholdForcedAndCap) {
    small_index idx;
    const uint32_t query[3] = {0, 0, 0};
    active_set_builder builder(10);
    rng gen(1);
    std::vector<uint32_t> out;

    active_set_config cfg;
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(out.size(), 6u);

    cfg.hit_threshold = 2;
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{2, 3}));

    // Forced first, in the order given, repeated ids once, and not counted again.
    cfg.hit_threshold = 1;
    const uint32_t forced[4] = {9, 3, 9, 0};
    builder.build(idx.tables, query, forced, 4, cfg, gen, out);
    ASSERT_GE(out.size(), 3u);
    EXPECT_EQ(out[0], 9u);
    EXPECT_EQ(out[1], 3u);
    EXPECT_EQ(out[2], 0u);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{0, 1, 2, 3, 4, 5, 6, 9}));
    EXPECT_EQ(out.size(), 8u);

    // Cap: the 3-hit items beat the 1-hit ones; at the cut level the first seen wins (of the
    // 1-hit items, 1 and 4 share the first table's bucket: whichever it lists first).
    const bucket_view b0 = idx.tables.bucket(0, 0);
    uint32_t first_one_hit = UINT32_MAX;
    for (uint32_t k = 0; k < b0.count && first_one_hit == UINT32_MAX; ++k)
        if (b0.items[k] == 1 || b0.items[k] == 4) first_one_hit = b0.items[k];
    ASSERT_NE(first_one_hit, UINT32_MAX);

    cfg.max_active = 5;  // 3 forced + room for 2: item 2 (3 hits) and the first 1-hit item
    builder.build(idx.tables, query, forced, 4, cfg, gen, out);
    EXPECT_EQ(out.size(), 5u);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{9, 3, 0, 2, first_one_hit}));

    cfg.max_active = 3;  // no forced: 2 and 3 (3 hits each) and the first 1-hit item
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    EXPECT_EQ(out.size(), 3u);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{2, 3, first_one_hit}));

    cfg.max_active = 2;  // exactly the two 3-hit items
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{2, 3}));

    // Fill: min_active 8 over a 6-item union adds two of the four never-hit items.
    cfg.max_active = 0;
    cfg.min_active = 8;
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    ASSERT_EQ(out.size(), 8u);
    EXPECT_EQ(as_set(std::vector<uint32_t>(out.begin(), out.begin() + 6)),
              (std::set<uint32_t>{1, 2, 3, 4, 5, 6}));
    // With a threshold, dropped items are eligible for the fill; the cap bounds the fill.
    cfg.hit_threshold = 2;
    cfg.min_active = 10;
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    EXPECT_EQ(as_set(out).size(), 10u);
    cfg.max_active = 4;
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    EXPECT_EQ(out.size(), 4u);
    EXPECT_EQ(as_set(std::vector<uint32_t>(out.begin(), out.begin() + 2)),
              (std::set<uint32_t>{2, 3}));
    cfg = active_set_config{};
    cfg.hit_threshold = 1;

    // Forced ids are never dropped, even over the cap.
    cfg.max_active = 2;
    cfg.hit_threshold = 1;
    builder.build(idx.tables, query, forced, 4, cfg, gen, out);
    EXPECT_EQ(out, (std::vector<uint32_t>{9, 3, 0}));

    // Union items keep their first-seen order.
    cfg = active_set_config{};
    builder.build(idx.tables, query, nullptr, 0, cfg, gen, out);
    std::vector<uint32_t> first_seen;
    for (int t = 0; t < 3; ++t) {
        const bucket_view b = idx.tables.bucket(t, 0);
        for (uint32_t k = 0; k < b.count; ++k)
            if (std::find(first_seen.begin(), first_seen.end(), b.items[k]) == first_seen.end())
                first_seen.push_back(b.items[k]);
    }
    EXPECT_EQ(out, first_seen);

    EXPECT_THROW(
        builder.build(idx.tables, query, std::vector<uint32_t>{10}.data(), 1, cfg, gen, out),
        hslide::error);
}

TEST(ActiveSet, MultiProbeQueriesUnionEveryBucketOnceATable) {
    // Two codes a table (table 0: bucket 2 twice; table 1: buckets 0 and 1; table 2: bucket 0
    // twice). A repeated code is one bucket: item 8 (only in table 0's bucket 2) has 1 hit,
    // so the threshold of 2 keeps {2, 3, 5} and not 8.
    small_index idx;
    const uint32_t probes[6] = {2, 2, 0, 1, 0, 0};
    active_set_builder builder(10);
    rng gen(1);
    std::vector<uint32_t> out;
    active_set_config cfg;
    builder.build(idx.tables, probes, nullptr, 0, cfg, gen, out, 2);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{0, 1, 2, 3, 5, 6, 7, 8}));
    EXPECT_EQ(out.size(), 8u);
    cfg.hit_threshold = 2;
    builder.build(idx.tables, probes, nullptr, 0, cfg, gen, out, 2);
    EXPECT_EQ(as_set(out), (std::set<uint32_t>{2, 3, 5}));
}

TEST(ActiveSet, RandomFillAndInvariants) {
    rng gen(51);
    const int L = 10;
    const uint32_t n = 3000;
    const lsh_config c = make_lsh_config(hash_kind::dwta, 2, L, 3, 20);
    const auto codes = random_codes(n, L, 6, gen, 0);
    lsh_tables tables(c);
    tables.build(codes.data(), n, 8);
    active_set_builder builder;  // grows on first use
    std::vector<uint32_t> out;
    std::vector<uint32_t> query(L), forced;
    for (int q = 0; q < 300; ++q) {
        for (auto& code : query) code = static_cast<uint32_t>(gen.below(64));
        forced.clear();
        for (uint32_t f = 0, nf = static_cast<uint32_t>(gen.below(6)); f < nf; ++f)
            forced.push_back(static_cast<uint32_t>(gen.below(n)));
        active_set_config cfg;
        cfg.min_active = static_cast<uint32_t>(gen.below(q % 3 == 0 ? n + 10 : 400));
        cfg.max_active = q % 4 == 0 ? 0 : cfg.min_active + static_cast<uint32_t>(gen.below(300));
        cfg.hit_threshold = 1 + static_cast<uint32_t>(gen.below(2));
        builder.build(tables, query.data(), forced.data(), static_cast<uint32_t>(forced.size()),
                      cfg, gen, out);

        // Forced prefix (deduplicated), no duplicates, ids in range.
        std::vector<uint32_t> forced_unique;
        for (uint32_t f : forced)
            if (std::find(forced_unique.begin(), forced_unique.end(), f) == forced_unique.end())
                forced_unique.push_back(f);
        ASSERT_GE(out.size(), forced_unique.size());
        EXPECT_TRUE(std::equal(forced_unique.begin(), forced_unique.end(), out.begin()));
        ASSERT_EQ(as_set(out).size(), out.size()) << "duplicates in query " << q;
        for (uint32_t id : out) ASSERT_LT(id, n);

        // The union with its hit counts.
        std::map<uint32_t, uint32_t> hits;
        for (int t = 0; t < L; ++t) {
            const bucket_view b = tables.bucket(t, query[t]);
            for (uint32_t k = 0; k < b.count; ++k) ++hits[b.items[k]];
        }
        size_t candidates = 0;
        for (const auto& [id, h] : hits)
            candidates += h >= cfg.hit_threshold && !as_set(forced_unique).count(id);
        const size_t with_union = forced_unique.size() + candidates;
        const size_t cap = cfg.max_active ? cfg.max_active : SIZE_MAX;
        const size_t expected_union = std::max(forced_unique.size(), std::min(with_union, cap));
        const size_t fill = std::min<size_t>({cfg.min_active, cap, n});
        EXPECT_EQ(out.size(), std::max(expected_union, fill)) << "query " << q;

        // Every union item kept has at least as many hits as every one dropped.
        const std::set<uint32_t> kept = as_set(out);
        uint32_t min_kept = UINT32_MAX, max_dropped = 0;
        for (const auto& [id, h] : hits) {
            if (h < cfg.hit_threshold || as_set(forced_unique).count(id)) continue;
            if (kept.count(id)) {
                min_kept = std::min(min_kept, h);
            } else {
                max_dropped = std::max(max_dropped, h);
            }
        }
        if (min_kept != UINT32_MAX) EXPECT_GE(min_kept, max_dropped);
    }
}

TEST(ActiveSet, RandomFillIsRoughlyUniform) {
    // No tables hit (empty query buckets): the fill alone, 50 of 200 items, many times.
    const lsh_config c = make_lsh_config(hash_kind::dwta, 1, 2, 3);
    std::vector<uint32_t> codes(400, 0);
    lsh_tables tables(c);
    tables.build(codes.data(), 200, 1);
    const uint32_t query[2] = {7, 7};  // no item has code 7
    active_set_builder builder(200);
    rng gen(61);
    std::vector<uint32_t> out;
    std::vector<int> count(200, 0);
    for (uint32_t min_active : {50u, 150u}) {  // rejection, then the scan path
        std::fill(count.begin(), count.end(), 0);
        active_set_config cfg;
        cfg.min_active = min_active;
        for (int q = 0; q < 2000; ++q) {
            builder.build(tables, query, nullptr, 0, cfg, gen, out);
            ASSERT_EQ(out.size(), min_active);
            for (uint32_t id : out) ++count[id];
        }
        const double expected = 2000.0 * min_active / 200.0;
        for (int id = 0; id < 200; ++id) EXPECT_NEAR(count[id], expected, 0.2 * expected);
    }
}

TEST(ActiveSet, QueryWithAnItemsOwnVectorFindsIt) {
    const uint32_t dim = 128, n = 3000;
    for (hash_kind kind : {hash_kind::dwta, hash_kind::simhash}) {
        const lsh_config c = make_lsh_config(kind, 6, 50, 3, 64);
        const auto family = hash_family::create(c, dim, 11);
        rng gen(71);
        std::vector<float> rows(static_cast<size_t>(n) * dim);
        for (auto& v : rows) v = static_cast<float>(gen.normal());
        std::vector<uint32_t> codes(static_cast<size_t>(n) * c.L);
        family->codes_dense_rows(rows.data(), n, dim, codes.data());
        lsh_tables tables(c);
        tables.build(codes.data(), n, 4);
        active_set_builder builder(n);
        active_set_config cfg;
        std::vector<uint32_t> out, query(c.L);
        int found = 0;
        for (uint32_t item = 0; item < n; item += 29) {
            family->codes_dense(rows.data() + static_cast<size_t>(item) * dim, query.data());
            builder.build(tables, query.data(), nullptr, 0, cfg, gen, out);
            found += std::find(out.begin(), out.end(), item) != out.end();
        }
        EXPECT_EQ(found, static_cast<int>((n + 28) / 29)) << to_string(kind);
    }
}
