// The CUDA backend's kernels against host references: LSH codes, tables and active sets
// (the CPU's), the layer kernels (sparse backward, row-sparse Adam) and the dense softmax, on
// awkward sizes. Every test skips (GTEST_SKIP) without a usable GPU or without CUDA.
#include "gpu_test_util.hpp"
#include "hslide/backend.hpp"
#include "hslide/loss.hpp"
#include "hslide/lsh.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"
#if HSLIDE_HAVE_CUDA
#include "cpu/kernels.hpp"
#include "gpu/gpu_backend.hpp"
#include "gpu/gpu_testing.hpp"
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

using namespace hslide;
using hslide::testing::make_lsh_config;
using hslide::testing::random_rows;
using hslide::testing::round_bf16;

namespace {

#if HSLIDE_HAVE_CUDA

TEST(GpuLsh, CodesMatchTheCpuFamilies) {
    HSLIDE_REQUIRE_GPU();
    rng gen(11);
    for (hash_kind kind : {hash_kind::dwta, hash_kind::wta, hash_kind::simhash, hash_kind::minhash})
        for (uint32_t dim : {1u, 15u, 16u, 17u, 33u, 128u}) {
            const lsh_config config = make_lsh_config(kind, 4, 9, 3, 16);
            const auto family = hash_family::create(config, dim, gen());
            const uint32_t n_rows = 77;
            const size_t stride = (dim + 15) / 16 * 16;
            const auto rows = random_rows(n_rows, dim, stride, gen);
            const auto gpu_codes =
                gpu::testing::hash_rows(family->function_data(), rows, n_rows, stride);
            std::vector<uint32_t> cpu_codes(size_t(n_rows) * config.L);
            for (uint32_t r = 0; r < n_rows; ++r)
                family->codes_dense(&rows[size_t(r) * stride], &cpu_codes[size_t(r) * config.L]);
            EXPECT_EQ(gpu_codes, cpu_codes) << to_string(kind) << " dim " << dim;
        }
}

// Random codes of n_items items in L tables, with few distinct codes so buckets fill.
std::vector<uint32_t> random_codes(uint32_t n_items, int L, uint32_t n_codes, rng& gen) {
    std::vector<uint32_t> codes(size_t(n_items) * L);
    for (auto& c : codes) c = uint32_t(gen.below(n_codes));
    return codes;
}

// A layer of n_items items in 5 tables (K = 2, 3 bits a hash, 64 codes in use) and the codes
// of n_samples queries, each with one random label: what the random-fill tests query.
struct fill_query {
    lsh_config config = make_lsh_config(hash_kind::dwta, 2, 5, 3, 600);
    std::vector<uint32_t> item_codes, sample_codes, offsets{0}, labels;
    fill_query(uint32_t n_items, uint32_t n_samples, rng& gen)
        : item_codes(random_codes(n_items, config.L, 64, gen)),
          sample_codes(random_codes(n_samples, config.L, 64, gen)) {
        for (uint32_t s = 0; s < n_samples; ++s) {
            labels.push_back(uint32_t(gen.below(n_items)));
            offsets.push_back(uint32_t(labels.size()));
        }
    }
    std::vector<std::vector<uint32_t>> run(uint32_t n_items, uint32_t min_active,
                                           uint64_t seed) const {
        active_set_config active;
        active.hit_threshold = 2;
        active.min_active = min_active;
        return gpu::testing::query_active_sets(item_codes, n_items, config, active, sample_codes,
                                               offsets, labels, seed);
    }
};

TEST(GpuLsh, TablesHoldTheCpuSetsAndRespectTheCapacity) {
    HSLIDE_REQUIRE_GPU();
    rng gen(12);
    const uint32_t n_items = 1000;
    for (int capacity : {1000, 7}) {
        const lsh_config config = make_lsh_config(hash_kind::dwta, 2, 6, 3, capacity);  // 64 codes
        const auto codes = random_codes(n_items, config.L, 64, gen);
        const auto gpu_tables = gpu::testing::build_tables(codes, n_items, config, 5);
        lsh_tables cpu_tables(make_lsh_config(hash_kind::dwta, 2, 6, 3, 1000));  // never overflows
        cpu_tables.build(codes.data(), n_items, 5);
        ASSERT_EQ(gpu_tables.size(), size_t(config.L));
        for (int t = 0; t < config.L; ++t) {
            EXPECT_EQ(gpu_tables[t].size(), cpu_tables.n_buckets(t)) << "table " << t;
            for (const auto& [code, items] : gpu_tables[t]) {
                const bucket_view b = cpu_tables.bucket(t, code);
                std::vector<uint32_t> all(b.items, b.items + b.count);
                std::sort(all.begin(), all.end());
                if (capacity >= int(n_items)) {
                    EXPECT_EQ(items, all) << "table " << t << " code " << code;
                } else {
                    EXPECT_EQ(items.size(), std::min<size_t>(all.size(), size_t(capacity)));
                    EXPECT_TRUE(std::includes(all.begin(), all.end(), items.begin(), items.end()));
                }
            }
        }
    }
}

TEST(GpuLsh, ActiveSetsAreTheCpuUnionsWithLabelsFirst) {
    HSLIDE_REQUIRE_GPU();
    rng gen(13);
    const uint32_t n_items = 600, n_samples = 40;
    const lsh_config config = make_lsh_config(hash_kind::dwta, 2, 5, 3, 600);
    const auto item_codes = random_codes(n_items, config.L, 64, gen);
    const auto sample_codes = random_codes(n_samples, config.L, 64, gen);
    std::vector<uint32_t> offsets{0}, labels;
    for (uint32_t s = 0; s < n_samples; ++s) {
        for (uint32_t i = 0; i < s % 4; ++i) labels.push_back(uint32_t(gen.below(n_items)));
        std::sort(labels.begin() + offsets.back(), labels.end());
        labels.erase(std::unique(labels.begin() + offsets.back(), labels.end()), labels.end());
        offsets.push_back(uint32_t(labels.size()));
    }
    lsh_tables cpu_tables(config);
    cpu_tables.build(item_codes.data(), n_items, 9);
    for (uint32_t threshold : {1u, 2u}) {
        active_set_config active;
        active.hit_threshold = threshold;
        const auto gpu_sets = gpu::testing::query_active_sets(item_codes, n_items, config, active,
                                                              sample_codes, offsets, labels, 9);
        active_set_builder builder(n_items);
        rng fill(1);
        for (uint32_t s = 0; s < n_samples; ++s) {
            std::vector<uint32_t> expected;
            const uint32_t n_labels = offsets[s + 1] - offsets[s];
            if (n_labels > 0)  // a point without labels gets no set on the GPU: it is not trained
                builder.build(cpu_tables, &sample_codes[size_t(s) * config.L],
                              labels.data() + offsets[s], n_labels, active, fill, expected);
            std::sort(expected.begin(), expected.end());
            EXPECT_EQ(gpu_sets[s], expected) << "sample " << s << " threshold " << threshold;
        }
    }
    // Random fill reaches min_active, and max_active cuts the union but keeps the labels.
    active_set_config filled;
    filled.min_active = 300;
    auto sets = gpu::testing::query_active_sets(item_codes, n_items, config, filled, sample_codes,
                                                offsets, labels, 9);
    for (uint32_t s = 0; s < n_samples; ++s)
        if (offsets[s + 1] > offsets[s]) EXPECT_GE(sets[s].size(), 300u) << "sample " << s;
    active_set_config capped;
    capped.max_active = 10;
    sets = gpu::testing::query_active_sets(item_codes, n_items, config, capped, sample_codes,
                                           offsets, labels, 9);
    for (uint32_t s = 0; s < n_samples; ++s) {
        if (offsets[s + 1] == offsets[s]) continue;
        EXPECT_LE(sets[s].size(), 10u) << "sample " << s;
        for (uint32_t i = offsets[s]; i < offsets[s + 1]; ++i)
            EXPECT_TRUE(std::binary_search(sets[s].begin(), sets[s].end(), labels[i]));
    }
}

TEST(GpuLsh, RandomFillReachesItsTargetEvenCloseToTheLayerSize) {
    // The fill must count ids the threshold dropped as free (the CPU does), and reach
    // min_active even when it needs nearly every id of a large layer (rejection sampling
    // alone would stop short there).
    HSLIDE_REQUIRE_GPU();
    rng gen(14);
    for (const uint32_t n_items : {100u, 600u, 20000u}) {
        const uint32_t n_samples = 8;
        const fill_query query(n_items, n_samples, gen);
        for (const uint32_t min_active : {n_items, n_items - n_items / 50}) {
            const auto sets = query.run(n_items, min_active, 9);
            for (uint32_t s = 0; s < n_samples; ++s) {
                SCOPED_TRACE("n_items " + std::to_string(n_items) + ", min_active " +
                             std::to_string(min_active) + ", sample " + std::to_string(s));
                ASSERT_EQ(sets[s].size(), min_active);
                EXPECT_TRUE(std::adjacent_find(sets[s].begin(), sets[s].end()) == sets[s].end())
                    << "an id appears twice";
                EXPECT_LT(sets[s].back(), n_items);
                EXPECT_TRUE(std::binary_search(sets[s].begin(), sets[s].end(), query.labels[s]));
            }
        }
    }
}

TEST(GpuLsh, RandomFillDependsOnlyOnTheSeed) {
    // The round of draws that reaches min_active claims more ids than it needs; which are
    // kept must not depend on the order the GPU's atomics ran in.
    HSLIDE_REQUIRE_GPU();
    rng gen(15);
    const uint32_t n_items = 5000;
    const fill_query query(n_items, 16, gen);
    for (const uint32_t min_active : {333u, 1777u, 4900u}) {       // rejection draws, then the
        SCOPED_TRACE("min_active " + std::to_string(min_active));  // permutation pass
        const auto first = query.run(n_items, min_active, 9);
        for (int run = 0; run < 5; ++run)
            EXPECT_EQ(query.run(n_items, min_active, 9), first) << "run " << run;
        EXPECT_NE(query.run(n_items, min_active, 10), first) << "another seed draws other ids";
        for (const auto& set : first) EXPECT_EQ(set.size(), min_active);
    }
}

// bf16 bits of x, rounded to nearest even (the device's __float2bfloat16_rn; no NaNs here).
uint16_t bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16_bits(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

gpu::testing::host_layer random_host_layer(uint32_t rows, uint32_t width, uint32_t stride,
                                           bool bf16, rng& gen) {
    gpu::testing::host_layer l;
    l.rows = rows;
    l.stride = stride;
    l.weights = random_rows(rows, width, stride, gen);
    l.adam_m = random_rows(rows, width, stride, gen);
    // Second moments as Adam keeps them (v >= m^2), some fresh (m = v = 0).
    l.adam_v.assign(size_t(rows) * stride, 0.0f);
    for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t i = 0; i < width; ++i) {
            const size_t at = size_t(r) * stride + i;
            const float m = l.adam_m[at];
            l.adam_v[at] = m == 0.0f && gen.uniform() < 0.5f ? 0.0f : m * m + gen.uniform();
        }
    for (uint32_t r = 0; r < rows; ++r) {
        l.bias.push_back(float(gen.normal()));
        l.bias_m.push_back(float(gen.normal()) * 0.1f);
        l.bias_v.push_back(l.bias_m.back() * l.bias_m.back() + gen.uniform());
    }
    if (bf16)
        for (float w : l.weights) l.weights16.push_back(bf16_bits(w));
    return l;
}

// Row-sparse Adam against a double-precision reference, on awkward widths (1 float4 chunk
// per lane and more, partial chunks, padding), rows touched by one entry and by more than a
// warp's 32 (the kernel loads a segment's indices 32 at a time), in an order the grouping
// must keep; untouched rows must not move, the bf16 copy must be the new weights' rounding,
// and a second run on the same inputs must give the same bits.
TEST(GpuLayers, RowSparseAdamMatchesAReferenceOnAwkwardWidthsAndSegments) {
    HSLIDE_REQUIRE_GPU();
    rng gen(2211);
    const gpu::testing::host_adam adam{
        0.01f, 0.9f, 0.999f, 1e-8f, 1.0f / (1.0f - 0.9f * 0.9f), 1.0f / (1.0f - 0.999f * 0.999f)};
    for (const uint32_t width : {1u, 15u, 16u, 17u, 33u, 128u, 130u, 300u, 600u, 1000u})
        for (const bool first_layer : {false, true})
            for (const bool bf16 : {false, true}) {
                const uint32_t stride = (width + 15) / 16 * 16, rows = 97, batch = 37;
                const gpu::testing::host_layer before =
                    random_host_layer(rows, width, stride, bf16, gen);
                const std::vector<float> vectors = random_rows(batch, width, stride, gen);
                // Row 3 by 1 entry, row 5 by 32, row 7 by 33, row 11 by 100, the rest by
                // 0 to 4; the first layer also has entries of no row (UINT32_MAX).
                std::vector<uint32_t> entry_row;
                auto touch = [&](uint32_t row, uint32_t times) {
                    for (uint32_t i = 0; i < times; ++i) entry_row.push_back(row);
                };
                touch(3, 1), touch(5, 32), touch(7, 33), touch(11, 100);
                for (uint32_t r = 12; r < rows; ++r) touch(r, uint32_t(gen.below(5)));
                if (first_layer) touch(UINT32_MAX, 40);
                // Entries in random order: a row's entries are spread, and summed in entry order.
                for (size_t i = entry_row.size(); i > 1; --i)
                    std::swap(entry_row[i - 1], entry_row[gen.below(i)]);
                std::vector<uint32_t> entry_sample;
                std::vector<float> scale;
                for (size_t e = 0; e < entry_row.size(); ++e) {
                    entry_sample.push_back(uint32_t(gen.below(batch)));
                    scale.push_back(float(gen.normal()));
                }
                const float inv_batch = 1.0f / float(batch);
                gpu::testing::host_layer got = before;
                gpu::testing::rows_adam(got, first_layer, entry_row, entry_sample, scale, vectors,
                                        inv_batch, adam);
                gpu::testing::host_layer again = before;
                gpu::testing::rows_adam(again, first_layer, entry_row, entry_sample, scale, vectors,
                                        inv_batch, adam);
                const std::string where = "width " + std::to_string(width) +
                                          (first_layer ? " first" : " output") +
                                          (bf16 ? " bf16" : " fp32");
                EXPECT_EQ(got.weights, again.weights) << where << ": not deterministic";
                EXPECT_EQ(got.adam_v, again.adam_v) << where << ": not deterministic";
                // The reference: the gradient in double, then Adam in double.
                std::vector<double> grad(size_t(rows) * stride, 0.0), bias_grad(rows, 0.0);
                std::vector<bool> touched(rows, false);
                for (size_t e = 0; e < entry_row.size(); ++e) {
                    const uint32_t r = entry_row[e];
                    if (r == UINT32_MAX) continue;
                    touched[r] = true;
                    bias_grad[r] += double(scale[e]) * inv_batch;
                    for (uint32_t i = 0; i < stride; ++i)
                        grad[size_t(r) * stride + i] +=
                            double(scale[e]) * inv_batch *
                            vectors[size_t(entry_sample[e]) * stride + i];
                }
                auto step = [&](double w, double m, double v, double g, double& w2, double& m2,
                                double& v2) {
                    m2 = adam.beta1 * m + (1 - double(adam.beta1)) * g;
                    v2 = adam.beta2 * v + (1 - double(adam.beta2)) * g * g;
                    w2 = w - adam.lr * (m2 * adam.c1) / (std::sqrt(v2 * adam.c2) + adam.eps);
                };
                size_t bad = 0;
                for (uint32_t r = 0; r < rows; ++r) {
                    for (uint32_t i = 0; i < stride; ++i) {
                        const size_t at = size_t(r) * stride + i;
                        if (!touched[r]) {
                            bad += got.weights[at] != before.weights[at] ||
                                   got.adam_m[at] != before.adam_m[at] ||
                                   got.adam_v[at] != before.adam_v[at];
                            continue;
                        }
                        double w, m, v;
                        step(before.weights[at], before.adam_m[at], before.adam_v[at], grad[at], w,
                             m, v);
                        // A gradient within rounding of zero with a fresh moment steps by up to
                        // lr whichever its sign: compare the moments tightly and the weight
                        // within the step that sign could flip.
                        const double tiny = 1e-5 * (1 + std::abs(grad[at]));
                        bad += std::abs(got.adam_m[at] - m) > 1e-5 * (1 + std::abs(m));
                        bad += std::abs(got.adam_v[at] - v) > 1e-5 * (1 + std::abs(v));
                        const bool near_zero = std::abs(grad[at]) < tiny && before.adam_v[at] == 0;
                        bad += std::abs(got.weights[at] - w) >
                               (near_zero ? 2.1 * adam.lr : 1e-5 * (1 + std::abs(w)));
                        if (bf16) bad += got.weights16[at] != bf16_bits(got.weights[at]);
                    }
                    if (first_layer || !touched[r]) {
                        bad += got.bias[r] != before.bias[r] || got.bias_m[r] != before.bias_m[r];
                        continue;
                    }
                    double b, m, v;
                    step(before.bias[r], before.bias_m[r], before.bias_v[r], bias_grad[r], b, m, v);
                    bad += std::abs(got.bias[r] - b) > 1e-5 || std::abs(got.bias_m[r] - m) > 1e-5 ||
                           std::abs(got.bias_v[r] - v) > 1e-5 * (1 + v);
                }
                EXPECT_EQ(bad, 0u) << where;
            }
}

// Per sample sizes[s] entries (CSR offsets) of random rows below `rows` and small random deltas.
void random_entries(const std::vector<uint32_t>& sizes, uint32_t rows, rng& gen,
                    std::vector<uint32_t>& offsets, std::vector<uint32_t>& ids,
                    std::vector<float>& delta) {
    offsets.assign(1, 0);
    for (const uint32_t n : sizes) {
        for (uint32_t i = 0; i < n; ++i) {
            ids.push_back(uint32_t(gen.below(rows)));
            delta.push_back(float(gen.normal()) * 0.01f);
        }
        offsets.push_back(uint32_t(ids.size()));
    }
}

// The sparse backward against a double-precision reference: samples with no entries, one,
// fewer than a warp's 32, and thousands (every warp of the block busy, many rounds), on
// awkward widths, reading the fp32 weights or their bf16 copy; the ReLU mask applied; the
// same bits on a second run.
TEST(GpuLayers, SparseBackwardMatchesAReferenceOnAwkwardWidthsAndSetSizes) {
    HSLIDE_REQUIRE_GPU();
    rng gen(2212);
    for (const uint32_t width : {1u, 15u, 16u, 17u, 33u, 128u, 130u, 300u, 600u, 1000u})
        for (const bool bf16 : {false, true}) {
            const uint32_t stride = (width + 15) / 16 * 16, rows = 3001;
            const std::vector<uint32_t> sizes{0, 1, 5, 31, 32, 33, 100, 511, 513, 3000, 7};
            const uint32_t batch = uint32_t(sizes.size());
            const gpu::testing::host_layer layer =
                random_host_layer(rows, width, stride, bf16, gen);
            const std::vector<float> hidden = random_rows(batch, width, stride, gen);
            std::vector<uint32_t> offsets, ids;
            std::vector<float> delta;
            random_entries(sizes, rows, gen, offsets, ids, delta);
            const auto got = gpu::testing::sparse_output_backward(layer, bf16, offsets, ids, delta,
                                                                  hidden, batch);
            const auto again = gpu::testing::sparse_output_backward(layer, bf16, offsets, ids,
                                                                    delta, hidden, batch);
            const std::string where = "width " + std::to_string(width) + (bf16 ? " bf16" : " fp32");
            EXPECT_EQ(got, again) << where << ": not deterministic";
            size_t bad = 0;
            for (uint32_t s = 0; s < batch; ++s)
                for (uint32_t i = 0; i < stride; ++i) {
                    double sum = 0, magnitude = 0;
                    for (uint32_t e = offsets[s]; e < offsets[s + 1]; ++e) {
                        const size_t at = size_t(ids[e]) * stride + i;
                        const double w =
                            bf16 ? from_bf16_bits(layer.weights16[at]) : layer.weights[at];
                        sum += double(delta[e]) * w;
                        magnitude += std::abs(double(delta[e]) * w);
                    }
                    const size_t at = size_t(s) * stride + i;
                    const double want = hidden[at] > 0 ? sum : 0.0;
                    bad += std::abs(got[at] - want) > 1e-5 * (1 + magnitude);
                }
            EXPECT_EQ(bad, 0u) << where;
        }
}

// A GPU rank's share of the hidden gradient (hidden_gradient_share_f64) is the CPU ranks' in
// every bit: the CPU's scalar weighted_row_sum_f64 (the reference of its SIMD levels) over the
// same entries, on awkward widths and set sizes, fp32 and the bf16 copy. The products are exact
// in double and both add them in entry order, so no tolerance is needed.
TEST(GpuLayers, HiddenGradientShareIsTheCpuRanksBitForBit) {
    HSLIDE_REQUIRE_GPU();
    rng gen(3309);
    const cpu::kernel_table& reference = cpu::kernels_for(isa_level::scalar);
    for (const uint32_t width : {1u, 15u, 16u, 17u, 33u, 128u, 300u, 1000u})
        for (const bool bf16 : {false, true}) {
            const uint32_t stride = (width + 15) / 16 * 16, rows = 777;
            const std::vector<uint32_t> sizes{0, 1, 5, 31, 33, 700, 2};
            const uint32_t batch = uint32_t(sizes.size());
            const gpu::testing::host_layer layer =
                random_host_layer(rows, width, stride, bf16, gen);
            std::vector<uint32_t> offsets, ids;
            std::vector<float> delta;
            random_entries(sizes, rows, gen, offsets, ids, delta);
            const std::vector<double> got =
                gpu::testing::hidden_gradient_share(layer, width, bf16, offsets, ids, delta, batch);
            std::vector<double> want(size_t(batch) * width, 0.0);
            for (uint32_t s = 0; s < batch; ++s) {
                const uint32_t n = offsets[s + 1] - offsets[s];
                if (n == 0) continue;
                if (bf16)
                    reference.weighted_row_sum_bf16_f64(
                        layer.weights16.data(), stride, width, ids.data() + offsets[s],
                        delta.data() + offsets[s], n, want.data() + size_t(s) * width);
                else
                    reference.weighted_row_sum_f64(
                        layer.weights.data(), stride, width, ids.data() + offsets[s],
                        delta.data() + offsets[s], n, want.data() + size_t(s) * width);
            }
            EXPECT_EQ(got, want) << "width " << width << (bf16 ? " bf16" : " fp32");
        }
}

/// Inputs of the dense output losses (gpu_dense.cuh): batch rows of dense_ld(rows) logits
/// (the padding NaN; bf16: values the bf16 step's GEMM could have written), the bias, and the
/// labels in CSR form: sample 0 many (300, past a block's threads), every third none, the
/// others a few, sample 1 listing one twice.
struct dense_case {
    std::vector<float> logits, bias;
    std::vector<uint32_t> offsets{0}, labels;
};
dense_case make_dense_case(uint32_t rows, uint32_t batch, bool bf16, rng& gen) {
    const uint32_t ld = gpu::testing::dense_ld(rows);
    dense_case c;
    c.logits.assign(size_t(batch) * ld, std::nanf(""));
    c.bias.resize(rows);
    for (float& b : c.bias) b = float(gen.normal());
    for (uint32_t s = 0; s < batch; ++s) {
        for (uint32_t j = 0; j < rows; ++j)
            c.logits[size_t(s) * ld + j] =
                bf16 ? round_bf16(float(3.0 * gen.normal())) : float(3.0 * gen.normal());
        const uint32_t count = s == 0       ? std::min(rows, 300u)
                               : s % 3 == 2 ? 0u
                                            : uint32_t(1 + gen.below(std::min(rows, 40u)));
        std::vector<uint32_t> ids(rows);
        std::iota(ids.begin(), ids.end(), 0u);
        for (uint32_t i = 0; i < count; ++i) std::swap(ids[i], ids[i + gen.below(rows - i)]);
        c.labels.insert(c.labels.end(), ids.begin(), ids.begin() + count);
        if (s == 1) c.labels.push_back(c.labels.back());  // listed twice
        c.offsets.push_back(uint32_t(c.labels.size()));
    }
    return c;
}

/// Calls check(rows, batch, bf16, case) for each size the dense losses' tests cover (crossing
/// the kernels' chunks: 8,192 columns a partial, 1,024 a gradient block, samples in groups of
/// 4), in fp32 and bf16, with cases drawn from `seed`.
template <class Check>
void for_each_dense_case(uint64_t seed, Check&& check) {
    rng gen(seed);
    for (const uint32_t rows : {1u, 15u, 17u, 33u, 1001u, 8193u, 20011u})
        for (const uint32_t batch : {1u, 6u, 9u})
            for (const bool bf16 : {false, true}) {
                SCOPED_TRACE("rows " + std::to_string(rows) + ", batch " + std::to_string(batch) +
                             (bf16 ? ", bf16" : ", fp32"));
                ASSERT_GE(gpu::testing::dense_ld(rows), rows);
                check(rows, batch, bf16, make_dense_case(rows, batch, bf16, gen));
            }
}

TEST(GpuDenseSoftmax, MatchesASoftmaxInDoublePrecisionOnAwkwardSizes) {
    // The dense output layer's fused softmax (gpu_dense.cuh): per sample the loss, per entry
    // delta = softmax(logit + bias) - (1/|y|) on labels, per column the batch-mean bias
    // gradient; samples without labels have loss and delta 0; the padding columns are never
    // read (NaN here) and written as 0; in bf16 the logits and deltas are bf16. Sizes cross the
    // kernels' chunks (8,192 columns a partial, 1,024 a gradient block, samples in groups of 4); a
    // sample with 300 labels takes more than one pass of its block's threads, one lists a label
    // twice (it counts twice, as in the shared softmax_loss).
    HSLIDE_REQUIRE_GPU();
    for_each_dense_case(33, [](uint32_t rows, uint32_t batch, bool bf16, const dense_case& c) {
        const uint32_t ld = gpu::testing::dense_ld(rows);
        const std::vector<float>&logits = c.logits, &bias = c.bias;
        const std::vector<uint32_t>&offsets = c.offsets, &labels = c.labels;
        std::vector<float> delta, bias_gradient, loss;
        gpu::testing::dense_softmax_loss(logits, bias, rows, batch, offsets, labels, bf16, delta,
                                         bias_gradient, loss);
        ASSERT_EQ(delta.size(), size_t(batch) * ld);
        ASSERT_EQ(bias_gradient.size(), size_t(rows));
        ASSERT_EQ(loss.size(), size_t(batch));
        std::vector<double> want_bias(rows, 0.0), bias_tolerance(rows, 0.0);
        for (uint32_t s = 0; s < batch; ++s) {
            const float* l = &logits[size_t(s) * ld];
            const uint32_t n_labels = offsets[s + 1] - offsets[s];
            for (uint32_t j = rows; j < ld; ++j)
                ASSERT_EQ(delta[size_t(s) * ld + j], 0.0f) << "padding of sample " << s;
            if (n_labels == 0) {
                EXPECT_EQ(loss[s], 0.0f) << "sample " << s;
                for (uint32_t j = 0; j < rows; ++j)
                    ASSERT_EQ(delta[size_t(s) * ld + j], 0.0f) << "sample " << s;
                continue;
            }
            double m = -INFINITY, z = 0;
            for (uint32_t j = 0; j < rows; ++j) m = std::max(m, double(l[j]) + bias[j]);
            for (uint32_t j = 0; j < rows; ++j) z += std::exp(double(l[j]) + bias[j] - m);
            const double log_z = m + std::log(z), target = 1.0 / n_labels;
            std::vector<double> want(rows);
            double want_loss = 0;
            for (uint32_t j = 0; j < rows; ++j) want[j] = std::exp(double(l[j]) + bias[j] - log_z);
            for (uint32_t i = offsets[s]; i < offsets[s + 1]; ++i) {
                want[labels[i]] -= target;
                want_loss -= target * (double(l[labels[i]]) + bias[labels[i]] - log_z);
            }
            EXPECT_NEAR(loss[s], want_loss, 1e-4 * std::max(1.0, std::abs(want_loss)))
                << "sample " << s;
            for (uint32_t j = 0; j < rows; ++j) {
                // __expf and float sums: about 1e-5 relative of the probability.
                const double p = std::exp(double(l[j]) + bias[j] - log_z);
                const double tolerance = 1e-6 + 1e-4 * (p + std::abs(want[j])) +
                                         (bf16 ? std::ldexp(std::abs(want[j]), -8) : 0.0);
                ASSERT_NEAR(delta[size_t(s) * ld + j], want[j], tolerance)
                    << "sample " << s << ", column " << j;
                want_bias[j] += want[j] / batch;
                bias_tolerance[j] += (1e-6 + 1e-4 * (p + std::abs(want[j]))) / batch;
            }
        }
        // The bias gradient comes from the fp32 deltas, before any rounding to bf16.
        for (uint32_t j = 0; j < rows; ++j)
            ASSERT_NEAR(bias_gradient[j], want_bias[j], bias_tolerance[j] + 1e-7) << "column " << j;
    });
}

TEST(GpuDenseSoftmax, TheLogisticLossMatchesTheCpuReferenceOnAwkwardSizes) {
    // dense_logistic_loss: per entry delta = sigmoid(logit + bias) - 1 on each label (a label
    // listed twice counts twice), per sample the loss (softplus summed over the row less the
    // labels' logit + bias), per column the batch-mean bias gradient; the CPU's
    // logistic_loss_gradient over each row + bias is the reference (__expf against std::exp:
    // about 1e-6 relative; the loss a float sum of up to 20,011 terms).
    HSLIDE_REQUIRE_GPU();
    for_each_dense_case(35, [](uint32_t rows, uint32_t batch, bool bf16, const dense_case& c) {
        const uint32_t ld = gpu::testing::dense_ld(rows);
        std::vector<float> delta, bias_gradient, loss;
        gpu::testing::dense_softmax_loss(c.logits, c.bias, rows, batch, c.offsets, c.labels, bf16,
                                         delta, bias_gradient, loss,
                                         /*logistic=*/true);
        ASSERT_EQ(delta.size(), size_t(batch) * ld);
        std::vector<double> want_bias(rows, 0.0);
        for (uint32_t s = 0; s < batch; ++s) {
            for (uint32_t j = rows; j < ld; ++j)
                ASSERT_EQ(delta[size_t(s) * ld + j], 0.0f) << "padding of sample " << s;
            const uint32_t n_labels = c.offsets[s + 1] - c.offsets[s];
            if (n_labels == 0) {
                EXPECT_EQ(loss[s], 0.0f) << "sample " << s;
                for (uint32_t j = 0; j < rows; ++j)
                    ASSERT_EQ(delta[size_t(s) * ld + j], 0.0f) << "sample " << s;
                continue;
            }
            std::vector<float> z(rows), want(rows);
            double magnitude = 0;
            for (uint32_t j = 0; j < rows; ++j) {
                z[j] = c.logits[size_t(s) * ld + j] + c.bias[j];
                magnitude += std::abs(z[j]) + 1;
            }
            const double want_loss = logistic_loss_gradient(
                z.data(), rows, c.labels.data() + c.offsets[s], n_labels, want.data());
            EXPECT_NEAR(loss[s], want_loss, 1e-5 * magnitude) << "sample " << s;
            for (uint32_t j = 0; j < rows; ++j) {
                const double tolerance = 2e-6 + 1e-5 * std::abs(want[j]) +
                                         (bf16 ? std::ldexp(std::abs(double(want[j])), -8) : 0.0);
                ASSERT_NEAR(delta[size_t(s) * ld + j], want[j], tolerance)
                    << "sample " << s << ", column " << j;
                want_bias[j] += double(want[j]) / batch;
            }
        }
        for (uint32_t j = 0; j < rows; ++j)
            ASSERT_NEAR(bias_gradient[j], want_bias[j], 2e-6 + 1e-5 * std::abs(want_bias[j]))
                << "column " << j;
    });
}

TEST(GpuLayers, SetLogisticLossMatchesTheCpuReferenceOnAwkwardSizes) {
    // logistic_loss over sparse sets (labels first; an unlabelled sample and an empty set
    // among them), and over dense columns with the bias added (a label column listed twice),
    // against the CPU's logistic_loss_gradient. softmax_loss over the same sets: its deltas
    // sum to 0 per labelled set (the logistic loss's do not), so the two are not confused.
    HSLIDE_REQUIRE_GPU();
    rng gen(36);
    const std::vector<uint32_t> sizes{1, 15, 16, 17, 33, 0, 300, 1025, 5};
    std::vector<uint32_t> offsets{0}, label_offsets{0}, label_ids;
    for (size_t s = 0; s < sizes.size(); ++s) {
        offsets.push_back(offsets.back() + sizes[s]);
        const uint32_t labels = s == 3 || sizes[s] == 0 ? 0 : 1 + uint32_t(gen.below(sizes[s]));
        for (uint32_t i = 0; i < labels; ++i) label_ids.push_back(i);  // labels first
        label_offsets.push_back(uint32_t(label_ids.size()));
    }
    std::vector<float> logits(offsets.back());
    for (float& z : logits) z = float(4.0 * gen.normal());
    for (const bool logistic : {true, false}) {
        std::vector<float> delta, loss;
        gpu::testing::set_loss(logits, {}, offsets, 0, label_offsets, label_ids, logistic, delta,
                               loss);
        for (size_t s = 0; s < sizes.size(); ++s) {
            SCOPED_TRACE("set " + std::to_string(s) + " of " + std::to_string(sizes[s]) +
                         (logistic ? ", logistic" : ", softmax"));
            const uint32_t n = sizes[s], labels = label_offsets[s + 1] - label_offsets[s];
            const float* got = delta.data() + offsets[s];
            double sum = 0;
            for (uint32_t i = 0; i < n; ++i) sum += got[i];
            if (labels == 0) {
                EXPECT_EQ(loss[s], 0.0f);
                for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 0.0f);
                continue;
            }
            if (!logistic) {
                EXPECT_NEAR(sum, 0.0, 1e-5);
                continue;
            }
            std::vector<float> want(n);
            const double want_loss =
                logistic_loss_gradient(logits.data() + offsets[s], n, nullptr, labels, want.data());
            double magnitude = 0;
            for (uint32_t i = 0; i < n; ++i) magnitude += std::abs(logits[offsets[s] + i]) + 1;
            EXPECT_NEAR(loss[s], want_loss, 1e-5 * magnitude);
            for (uint32_t i = 0; i < n; ++i)
                ASSERT_NEAR(got[i], want[i], 2e-6 + 1e-5 * std::abs(want[i])) << "entry " << i;
        }
    }
    // Dense columns: n_columns a sample, the bias added to each labelled sample's logits.
    const uint32_t columns = 17, batch = 3;
    std::vector<float> dense(size_t(batch) * columns), bias(columns);
    for (float& z : dense) z = float(2.0 * gen.normal());
    for (float& b : bias) b = float(gen.normal());
    const std::vector<uint32_t> dense_label_offsets{0, 3, 3, 5}, dense_labels{4, 16, 4, 0, 9};
    std::vector<float> delta, loss;
    gpu::testing::set_loss(dense, bias, {}, columns, dense_label_offsets, dense_labels,
                           /*logistic=*/true, delta, loss);
    for (uint32_t s = 0; s < batch; ++s) {
        const uint32_t labels = dense_label_offsets[s + 1] - dense_label_offsets[s];
        std::vector<float> z(columns), want(columns, 0.0f);
        for (uint32_t j = 0; j < columns; ++j) z[j] = dense[size_t(s) * columns + j] + bias[j];
        const double want_loss =
            labels == 0 ? 0.0
                        : logistic_loss_gradient(z.data(), columns,
                                                 dense_labels.data() + dense_label_offsets[s],
                                                 labels, want.data());
        EXPECT_NEAR(loss[s], want_loss, 1e-4) << "sample " << s;
        for (uint32_t j = 0; j < columns; ++j)
            ASSERT_NEAR(delta[size_t(s) * columns + j], want[j], 2e-6 + 1e-5 * std::abs(want[j]))
                << "sample " << s << ", column " << j;
    }
}

#endif  // HSLIDE_HAVE_CUDA

}  // namespace
