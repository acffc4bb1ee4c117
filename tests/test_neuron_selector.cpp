// Tests of the CPU neuron selections on their own (src/cpu/neuron_selector.hpp): the exact
// top-k's sets and log-partitions against a brute-force reference; IVF with every cluster
// probed chooses exact top-k's sets; an LSH refresh after rows change equals a fresh build (and
// needs the rows_changed call); the IVF index's rhythm; the factory and the backend's seam;
// reused candidates.
#include "cpu/cpu_backend.hpp"
#include "cpu/lsh_selector.hpp"
#include "cpu/neuron_selector.hpp"
#include "cpu/top_k_selector.hpp"
#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

using namespace hslide;
using namespace hslide::cpu;

namespace {

/// A layer whose weights, biases and queries are small multiples of 1/8: every dot product is
/// exact in float whatever the summation order, so the blocked kernels' scores equal a plain
/// loop's bit for bit and the reference ranking is exact.
struct exact_layer {
    uint32_t rows, width, stride;
    std::vector<float> weights, bias;

    exact_layer(uint32_t rows_, uint32_t width_, uint64_t seed)
        : rows(rows_), width(width_), stride(padded_stride(width_)) {
        rng gen(seed);
        weights.assign(size_t(rows) * stride, 0.0f);
        bias.resize(rows);
        for (uint32_t r = 0; r < rows; ++r) {
            for (uint32_t i = 0; i < width; ++i) weights[size_t(r) * stride + i] = eighth(gen);
            bias[r] = eighth(gen);
        }
    }
    static float eighth(rng& gen) { return float(int(gen.below(9)) - 4) / 8.0f; }
    /// Draws rows first, first + every, ... anew from `gen`; returns their ids.
    std::vector<uint32_t> redraw_rows(uint32_t first, uint32_t every, rng& gen) {
        std::vector<uint32_t> moved;
        for (uint32_t r = first; r < rows; r += every) {
            moved.push_back(r);
            for (uint32_t i = 0; i < width; ++i) weights[size_t(r) * stride + i] = eighth(gen);
        }
        return moved;
    }
    layer_rows view() const {
        layer_rows v;
        v.weights = weights.data();
        v.stride = stride;
        v.bias = bias.data();
        v.rows = rows;
        v.width = width;
        return v;
    }
    rows_source source() const {
        return [this] { return view(); };
    }
    double logit(uint32_t r, const std::vector<float>& q) const {
        double z = bias[r];
        for (uint32_t i = 0; i < width; ++i) z += double(weights[size_t(r) * stride + i]) * q[i];
        return z;
    }
};

std::vector<std::vector<float>> eighth_queries(uint32_t n, uint32_t width, uint64_t seed) {
    rng gen(seed);
    std::vector<std::vector<float>> q(n, std::vector<float>(width));
    for (auto& v : q)
        for (float& x : v) x = exact_layer::eighth(gen);
    return q;
}

/// A batch of samples over `queries`, each with its own generator (seeded by `seed` and its
/// index) and set; every third sample labelled with two rows.
struct test_batch {
    std::vector<rng> gens;
    std::vector<std::vector<uint32_t>> ids;
    std::vector<std::vector<uint32_t>> labels;
    std::vector<selection_sample> samples;

    test_batch(const std::vector<std::vector<float>>& queries, uint32_t rows, uint64_t seed)
        : gens(queries.size()),
          ids(queries.size()),
          labels(queries.size()),
          samples(queries.size()) {
        for (size_t s = 0; s < queries.size(); ++s) {
            gens[s].reseed(derive_seed(seed, s));
            if (s % 3 == 0) labels[s] = {uint32_t(s * 7 % rows), uint32_t((s * 13 + 1) % rows)};
            samples[s].input = queries[s].data();
            samples[s].labels = {labels[s].data(), uint32_t(labels[s].size())};
            samples[s].gen = &gens[s];
            samples[s].ids = &ids[s];
        }
    }
    selection_batch batch(uint64_t step, uint32_t pool_batch) {
        return {samples.data(), uint32_t(samples.size()), true, step, pool_batch};
    }
};

layer_config top_k_config(top_k_search search, uint32_t clusters, uint32_t probes) {
    layer_config c;
    c.sparsity = sparsity_mode::topk;
    c.top_k = 9;
    c.active.min_active = 40;
    c.fill_pool = 0.5f;
    c.search = search;
    c.ivf_clusters = clusters;
    c.ivf_probes = probes;
    return c;
}

}  // namespace

TEST(NeuronSelector, ExactTopKBuildsLabelsThenTheTrueTopKThenTheFill) {
    const exact_layer layer(3000, 21, 1);
    const auto queries = eighth_queries(37, layer.width, 2);
    exact_top_k selector(layer.source(), top_k_config(top_k_search::exact, 0, 0), 77,
                         best_kernels(), 2);
    ASSERT_TRUE(selector.computes_log_partition());
    ASSERT_FALSE(selector.searches_ivf());
    test_batch tb(queries, layer.rows, 5);
    selection_batch batch = tb.batch(11, 64);
    stage_times times;
    selector.select(batch, times);
    const fill_pool pool = selector.step_pool(11, 64);
    ASSERT_GT(pool.size, 0u);  // the fill draws from the step's pool
    for (size_t s = 0; s < queries.size(); ++s) {
        const std::vector<uint32_t>& set = tb.ids[s];
        const selection_sample& out = tb.samples[s];
        // The reference: every logit in double (exact here), ranked, ties to the smaller id.
        std::vector<uint32_t> order(layer.rows);
        std::iota(order.begin(), order.end(), 0u);
        std::vector<double> z(layer.rows);
        double max_z = -1e300;
        for (uint32_t r = 0; r < layer.rows; ++r)
            max_z = std::max(max_z, z[r] = layer.logit(r, queries[s]));
        std::stable_sort(order.begin(), order.end(),
                         [&](uint32_t a, uint32_t b) { return z[a] > z[b]; });
        double sum = 0;
        for (double v : z) sum += std::exp(v - max_z);
        EXPECT_NEAR(out.log_partition, max_z + std::log(sum), 1e-4) << "sample " << s;
        // Labels first, then the top 9 that are not labels, ascending, then the fill.
        const std::vector<uint32_t>& y = tb.labels[s];
        ASSERT_GE(set.size(), 40u);
        EXPECT_TRUE(std::equal(y.begin(), y.end(), set.begin()));
        std::vector<uint32_t> top;
        for (uint32_t i = 0; i < 9; ++i)
            if (std::find(y.begin(), y.end(), order[i]) == y.end()) top.push_back(order[i]);
        std::sort(top.begin(), top.end());
        ASSERT_EQ(out.fill_start, y.size() + top.size());
        EXPECT_TRUE(std::equal(top.begin(), top.end(), set.begin() + y.size()));
        EXPECT_EQ(set.size(), 40u);
        EXPECT_TRUE(std::is_sorted(set.begin() + out.fill_start, set.end()));
        std::vector<uint32_t> sorted = set;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
        // Every fill row is an entry of the step's pool.
        for (size_t i = out.fill_start; i < set.size(); ++i) {
            bool in_pool = false;
            for (uint32_t e = 0; e < pool.size && !in_pool; ++e)
                in_pool = fill_pool_row(pool.seed, e, layer.rows) == set[i];
            EXPECT_TRUE(in_pool) << "row " << set[i];
        }
    }
}

TEST(NeuronSelector, IvfProbingEveryClusterChoosesExactTopKsSets) {
    const exact_layer layer(1000, 19, 3);
    const auto queries = eighth_queries(300, layer.width, 4);  // two chunks of 256
    for (uint32_t clusters : {1u, 7u, 40u}) {
        exact_top_k exact(layer.source(), top_k_config(top_k_search::exact, 0, 0), 9,
                          best_kernels(), 2);
        // More probes than clusters: every cluster.
        ivf_top_k ivf(layer.source(), top_k_config(top_k_search::ivf, clusters, 1000), 9,
                      best_kernels(), 2);
        ASSERT_TRUE(ivf.searches_ivf());
        ASSERT_FALSE(ivf.computes_log_partition());
        ivf.refresh({3, 0});
        ASSERT_GE(ivf.index().clusters(), std::min(clusters, 2u));
        test_batch a(queries, layer.rows, 8), b(queries, layer.rows, 8);
        selection_batch ba = a.batch(3, 128), bb = b.batch(3, 128);
        stage_times times;
        exact.select(ba, times);
        ivf.select(bb, times);
        for (size_t s = 0; s < queries.size(); ++s) {
            EXPECT_EQ(a.ids[s], b.ids[s]) << clusters << " clusters, sample " << s;
            EXPECT_EQ(a.samples[s].fill_start, b.samples[s].fill_start);
            EXPECT_EQ(b.samples[s].log_partition, 0.0);
        }
        // Their candidates too, scores bit for bit.
        const uint32_t k = 12, n = 40;
        std::vector<const float*> q(n);
        for (uint32_t j = 0; j < n; ++j) q[j] = queries[j].data();
        std::vector<uint32_t> la(n * k), lb(n * k);
        std::vector<float> sa(n * k), sb(n * k);
        exact.search(q.data(), n, k, la.data(), sa.data(), nullptr);
        ivf.search(q.data(), n, k, lb.data(), sb.data(), nullptr);
        EXPECT_EQ(la, lb);
        EXPECT_EQ(sa, sb);
    }
}

TEST(NeuronSelector, ExactProbeSetsEqualTheTrainingSetsWithoutLabels) {
    // select_probe builds from a wider exact list than top_k: the same sets as select.
    const exact_layer layer(300, 16, 5);
    const auto queries = eighth_queries(20, layer.width, 6);
    exact_top_k selector(layer.source(), top_k_config(top_k_search::exact, 0, 0), 1, best_kernels(),
                         2);
    test_batch a(queries, layer.rows, 3), b(queries, layer.rows, 3);
    for (size_t s = 0; s < queries.size(); ++s)
        a.samples[s].labels = b.samples[s].labels = {nullptr, 0};
    selection_batch ba = a.batch(4, 8), bb = b.batch(4, 8);
    stage_times times;
    selector.select(ba, times);
    const uint32_t wide = 25;
    std::vector<const float*> q(queries.size());
    for (size_t j = 0; j < q.size(); ++j) q[j] = queries[j].data();
    std::vector<uint32_t> labels(q.size() * wide);
    std::vector<float> scores(q.size() * wide);
    selector.score_exactly(q.data(), uint32_t(q.size()), wide, labels.data(), scores.data(),
                           nullptr);
    selector.select_probe(bb, labels.data(), wide);
    for (size_t s = 0; s < queries.size(); ++s) EXPECT_EQ(a.ids[s], b.ids[s]) << s;
}

TEST(NeuronSelector, LshRefreshAfterRowsChangeEqualsAFreshBuild) {
    exact_layer layer(500, 32, 7);
    layer_config config;
    config.sparsity = sparsity_mode::lsh;
    config.lsh = hslide::testing::make_lsh_config(hash_kind::dwta, 3, 12, 3);
    config.active.min_active = 30;
    lsh_selector kept(layer.source(), config, best_kernels(), 2);
    lsh_selector unmarked(layer.source(), config, best_kernels(), 2);
    kept.refresh({0, 42});
    unmarked.refresh({0, 42});
    // 60 rows move; `kept` is told, `unmarked` is not.
    rng gen(9);
    const std::vector<uint32_t> moved = layer.redraw_rows(0, 8, gen);
    kept.rows_changed(moved.data(), moved.size());
    kept.refresh({5, 42});
    unmarked.refresh({5, 42});
    lsh_selector fresh(layer.source(), config, best_kernels(), 2);
    fresh.refresh({5, 42});
    // Whether a's buckets equal b's (the fresh build's) at every row's codes under b's functions.
    auto same_tables = [&](const lsh_selector& a, const lsh_selector& b) {
        std::vector<uint32_t> codes(size_t(config.lsh.L));
        for (uint32_t r = 0; r < layer.rows; ++r) {
            b.hash().codes_dense(layer.view().row(r), codes.data());
            for (int t = 0; t < config.lsh.L; ++t) {
                const bucket_view x = a.tables().bucket(t, codes[size_t(t)]);
                const bucket_view y = b.tables().bucket(t, codes[size_t(t)]);
                if (!std::equal(x.items, x.items + x.count, y.items, y.items + y.count))
                    return false;
            }
        }
        return true;
    };
    EXPECT_TRUE(same_tables(kept, fresh));
    EXPECT_FALSE(same_tables(unmarked, fresh));  // the stale codes are what rows_changed fixes
    // The same sets for the same queries and generators.
    const auto queries = eighth_queries(25, layer.width, 10);
    test_batch a(queries, layer.rows, 1), b(queries, layer.rows, 1);
    selection_batch ba = a.batch(5, 0), bb = b.batch(5, 0);
    stage_times times;
    kept.select(ba, times);
    fresh.select(bb, times);
    for (size_t s = 0; s < queries.size(); ++s) {
        EXPECT_EQ(a.ids[s], b.ids[s]) << s;
        EXPECT_TRUE(std::equal(a.labels[s].begin(), a.labels[s].end(), a.ids[s].begin()));
    }
    // New functions (another seed): every code recomputed, again a fresh build's tables.
    kept.refresh({6, 43});
    lsh_selector fresh43(layer.source(), config, best_kernels(), 2);
    fresh43.refresh({6, 43});
    EXPECT_EQ(kept.hash().seed(), 43u);
    EXPECT_TRUE(same_tables(kept, fresh43));
}

TEST(NeuronSelector, IvfBeforeStepFollowsItsRhythm) {
    exact_layer layer(800, 16, 11);
    layer_config config = top_k_config(top_k_search::ivf, 12, 4);
    config.ivf_refresh = 2;
    ivf_top_k selector(layer.source(), config, 3, best_kernels(), 2);
    selector.refresh({0, 0});
    ivf_index expected = selector.index();
    auto same = [](const ivf_index& a, const ivf_index& b) {
        return a.members == b.members && a.offsets == b.offsets && a.centroids == b.centroids;
    };
    rng gen(2);
    auto move_rows = [&](uint32_t first) {
        const std::vector<uint32_t> moved = layer.redraw_rows(first, 5, gen);
        selector.rows_changed(moved.data(), moved.size());
        return moved;
    };
    std::vector<uint32_t> moved = move_rows(0);
    EXPECT_EQ(selector.before_step(1), 0.0);  // not a refresh step
    EXPECT_TRUE(same(selector.index(), expected));
    // Step 2: the moved rows reassigned, no Lloyd step.
    selector.before_step(2);
    reassign_ivf_rows(expected, layer.view(), best_kernels(), moved.data(), uint32_t(moved.size()),
                      2);
    EXPECT_TRUE(same(selector.index(), expected));
    EXPECT_FALSE(expected.members.empty());
    // The ivf_lloyd_every-th pass (step 8 with a refresh every 2 steps): a whole refresh with
    // a Lloyd step.
    move_rows(2);
    selector.before_step(uint64_t(config.ivf_refresh) * ivf_top_k::ivf_lloyd_every);
    refresh_ivf_index(expected, layer.view(), best_kernels(), 2);
    EXPECT_TRUE(same(selector.index(), expected));
}

TEST(NeuronSelector, EveryNeuronLeavesTheSetsEmptyAndTopKRefusesOneSample) {
    const exact_layer layer(50, 8, 1);
    all_neurons all(layer.source(), best_kernels(), 1);
    const auto queries = eighth_queries(3, layer.width, 1);
    test_batch tb(queries, layer.rows, 1);
    for (auto& ids : tb.ids) ids = {1, 2, 3};
    selection_batch batch = tb.batch(0, 3);
    stage_times times;
    all.select(batch, times);
    for (const auto& ids : tb.ids) EXPECT_TRUE(ids.empty());
    exact_top_k top(layer.source(), top_k_config(top_k_search::exact, 0, 0), 1, best_kernels(), 1);
    EXPECT_THROW(top.select_one(tb.samples[0], true, 0), error);
}

TEST(NeuronSelector, TheBackendKeepsTheSelectionItsConfigNames) {
    // 200 output rows: an automatic index has 7 clusters, so its default 48 probes would scan
    // every one, and automatic searches exactly; with 4 probes of 100 clusters (fewer than an
    // eighth even on amx) it searches the index.
    struct expected {
        sparsity_mode output;
        top_k_search search;
        uint32_t probes;
        neuron_selection kind;
        bool ivf;
    };
    for (const expected& e :
         {expected{sparsity_mode::dense, top_k_search::exact, 48, neuron_selection::all, false},
          expected{sparsity_mode::lsh, top_k_search::exact, 48, neuron_selection::lsh, false},
          expected{sparsity_mode::topk, top_k_search::exact, 48, neuron_selection::top_k, false},
          expected{sparsity_mode::topk, top_k_search::ivf, 48, neuron_selection::top_k, true},
          expected{sparsity_mode::topk, top_k_search::automatic, 48, neuron_selection::top_k,
                   false},
          expected{sparsity_mode::topk, top_k_search::automatic, 4, neuron_selection::top_k,
                   true}}) {
        model_config config = hslide::testing::two_layer_model(30, 16, 200, e.output);
        config.layers.back().search = e.search;
        config.layers.back().ivf_probes = e.probes;
        if (e.probes == 4) config.layers.back().ivf_clusters = 100;
        train_config train;
        train.adam = adam_mode::sparse;
        cpu_backend backend(model_state::create(config, 1), train, 1);
        ASSERT_EQ(config.layers.size(), 2u);  // layer 0 takes the features: no selection
        EXPECT_EQ(backend.selection(1).kind(), e.kind);
        EXPECT_EQ(backend.selection(1).searches_ivf(), e.ivf);
        // automatic's exact search on an AMX CPU scores a bf16 copy: the set's loss then
        const isa_level best = best_kernels().level;
        const bool copy = e.search == top_k_search::automatic &&
                          (cpu_exact_search_in_bf16(best) || cpu_exact_search_in_int8(best));
        EXPECT_EQ(backend.selection(1).computes_log_partition(),
                  e.kind == neuron_selection::top_k && !e.ivf && !copy);
    }
}

TEST(NeuronSelector, AutomaticExactSearchWithBf16ProductsScoresAFreshBf16CopyOfTheRows) {
    const std::vector<isa_level> levels = hslide::testing::bf16_search_levels();
    if (levels.empty())
        GTEST_SKIP() << "this CPU has no bf16 products (best: " << to_string(detected_isa()) << ")";
    for (isa_level level : levels) {
        SCOPED_TRACE(to_string(level));
        // Eighths are exact in bf16 and their sums in fp32, so the copy's top-k is the true
        // one; width 48 takes a whole tile (or 24 pairs) and a 16-element tail, 3,000 rows 46
        // tile passes and a tail.
        exact_layer layer(3000, 48, 3);
        const auto queries = eighth_queries(40, layer.width, 4);
        // Without 8-bit products (which take an int8 copy instead: the next test).
        kernel_table k = kernels_for(level);
        k.dots16_u8s8 = nullptr;
        exact_top_k copy(layer.source(), top_k_config(top_k_search::automatic, 0, 0), 77, k, 2);
        exact_top_k reference(layer.source(), top_k_config(top_k_search::exact, 0, 0), 77, k, 2);
        ASSERT_TRUE(copy.scores_bf16_copy());
        ASSERT_FALSE(reference.scores_bf16_copy());
        EXPECT_FALSE(copy.computes_log_partition());
        auto sets = [&](exact_top_k& selector, uint64_t step) {
            test_batch tb(queries, layer.rows, 5);
            selection_batch batch = tb.batch(step, 64);
            stage_times times;
            selector.select(batch, times);
            return tb.ids;
        };
        EXPECT_EQ(sets(copy, 11), sets(reference, 11));
        // Rows change: the copy follows the rows it is told of, and only those.
        rng gen(9);
        const std::vector<uint32_t> changed = layer.redraw_rows(0, 7, gen);
        const auto stale = sets(copy, 12);
        const auto fresh = sets(reference, 12);
        EXPECT_NE(stale, fresh) << "a copy not told of the changes should miss some";
        copy.rows_changed(changed.data(), changed.size());
        EXPECT_EQ(sets(copy, 12), fresh);
    }
}

/// The layer's top `top` rows for each query as the scalar kernels score an int8 copy: each
/// row quantized by to_int8_row, each query by quantize_query_u8 to [0, input_max] (the
/// searching level's u8s8_input_max), products by dots16_u8s8, best first, ties to the smaller
/// id.
std::vector<uint32_t> int8_reference_top_k(const exact_layer& layer,
                                           const std::vector<std::vector<float>>& queries,
                                           uint32_t top, uint8_t input_max) {
    const kernel_table& ref = scalar_kernels();
    int8_copy copy(layer.rows, layer.width);
    quantize_rows_to_int8(layer.view(), ref, copy.view(), nullptr, layer.rows, 1);
    const uint32_t fours = (layer.width + 3) / 4;
    std::vector<uint32_t> best;
    std::vector<float> out(size_t(layer.rows) * 16);
    std::vector<uint32_t> order(layer.rows);
    for (size_t q0 = 0; q0 < queries.size(); q0 += 16) {
        std::vector<uint8_t> xq(size_t(fours) * 64, 0);
        float query_scale[16] = {};
        int32_t query_zero[16] = {};
        const size_t group = std::min<size_t>(16, queries.size() - q0);
        for (size_t j = 0; j < group; ++j)
            quantize_query_u8_reference(queries[q0 + j].data(), layer.width, input_max,
                                        xq.data() + j * 4, &query_scale[j], &query_zero[j]);
        ref.dots16_u8s8(copy.values.data(), copy.stride, layer.width, layer.rows, xq.data(),
                        copy.scale.data(), copy.sum.data(), query_scale, query_zero,
                        layer.bias.data(), out.data());
        for (size_t j = 0; j < group; ++j) {
            std::iota(order.begin(), order.end(), 0u);
            std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
                return out[size_t(a) * 16 + j] > out[size_t(b) * 16 + j];
            });
            best.insert(best.end(), order.begin(), order.begin() + top);
        }
    }
    return best;
}

TEST(NeuronSelector, QuantizeQueryU8WritesTheReferencesBytesScaleAndZeroPoint) {
    // Awkward widths (a partial last four, one value, a whole 64-byte group), ReLU outputs
    // (zero point 0), affine values of either sign, a constant and an all-zero query, at the
    // avx2 kernels' range (15, and the 63 it was), and VNNI's (255). The bytes past each four's 4
    // must stay as they were (they are other queries' lanes).
    rng g(31);
    for (uint32_t width : {1u, 2u, 3u, 4u, 5u, 15u, 16u, 17u, 33u, 64u, 255u, 256u, 257u})
        for (uint8_t max : {uint8_t{15}, uint8_t{63}, uint8_t{255}})
            for (int kind = 0; kind < 4; ++kind) {
                SCOPED_TRACE(::testing::Message()
                             << "width " << width << ", max " << int(max) << ", kind " << kind);
                std::vector<float> x(width);
                const float shift = 2.0f * g.uniform() - 1.0f;
                for (float& v : x) {
                    const float n = 3.0f * (g.uniform() - 0.5f);
                    v = kind == 0   ? std::max(0.0f, n)
                        : kind == 1 ? n + shift
                        : kind == 2 ? 0.7f
                                    : 0.0f;
                }
                const size_t bytes = size_t((width + 3) / 4) * 64;
                std::vector<uint8_t> fast(bytes, 0xA5), reference(bytes, 0xA5);
                float scale_fast = -1, scale_reference = -2;
                int32_t zero_fast = -1, zero_reference = -2;
                quantize_query_u8(x.data(), width, max, fast.data(), &scale_fast, &zero_fast);
                quantize_query_u8_reference(x.data(), width, max, reference.data(),
                                            &scale_reference, &zero_reference);
                EXPECT_EQ(fast, reference);
                EXPECT_EQ(scale_fast, scale_reference);
                EXPECT_EQ(zero_fast, zero_reference);
                // The reference against the contract: x ~ scale * (u - zero) within half a step.
                for (uint32_t i = 0; i < width; ++i) {
                    const uint8_t u = reference[size_t(i / 4) * 64 + i % 4];
                    ASSERT_LE(u, max);
                    EXPECT_NEAR(scale_reference * (float(u) - float(zero_reference)), x[i],
                                0.5f * scale_reference + 1e-6f);
                }
            }
}

TEST(NeuronSelector, AutomaticExactSearchWithInt8ProductsScoresAFreshInt8CopyOfTheRows) {
    std::vector<isa_level> levels;
    for (isa_level level : hslide::testing::copy_search_levels())
        if (cpu_exact_search_in_int8(level)) levels.push_back(level);
    if (levels.empty())
        GTEST_SKIP() << "this CPU's best kernels (" << to_string(detected_isa())
                     << ") have no 8-bit products for an exact search";
    for (isa_level level : levels) {
        SCOPED_TRACE(to_string(level));
        // Width 50: twelve fours and a tail of two; 3,000 rows: 375 blocks of 8 rows.
        exact_layer layer(3000, 50, 3);
        const auto queries = eighth_queries(40, layer.width, 4);
        const kernel_table& k = kernels_for(level);
        exact_top_k copy(layer.source(), top_k_config(top_k_search::automatic, 0, 0), 77, k, 2);
        ASSERT_TRUE(copy.scores_int8_copy());
        ASSERT_FALSE(copy.scores_bf16_copy());
        EXPECT_FALSE(copy.computes_log_partition());
        constexpr uint32_t top = 9;
        auto search = [&] {
            std::vector<const float*> q;
            for (const auto& v : queries) q.push_back(v.data());
            std::vector<uint32_t> labels(queries.size() * top);
            std::vector<float> scores(queries.size() * top);
            copy.search(q.data(), uint32_t(q.size()), top, labels.data(), scores.data(), nullptr);
            return labels;
        };
        const std::vector<uint32_t> first = search();
        EXPECT_EQ(first, int8_reference_top_k(layer, queries, top, k.u8s8_input_max));
        // The quantized ranking is near the true one: of each query's 9 best rows by exact
        // logit (ties to the smaller id), the int8 top-9 holds at least 90% (98% here).
        size_t hits = 0;
        for (size_t q = 0; q < queries.size(); ++q) {
            std::vector<uint32_t> order(layer.rows);
            std::iota(order.begin(), order.end(), 0u);
            std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
                return layer.logit(a, queries[q]) > layer.logit(b, queries[q]);
            });
            for (uint32_t i = 0; i < top; ++i)
                hits +=
                    std::count(first.begin() + q * top, first.begin() + (q + 1) * top, order[i]);
        }
        EXPECT_GE(double(hits) / double(queries.size() * top), 0.9);
        // Rows change: the copy follows the rows it is told of, and only those.
        rng gen(9);
        const std::vector<uint32_t> changed = layer.redraw_rows(0, 7, gen);
        const std::vector<uint32_t> fresh =
            int8_reference_top_k(layer, queries, top, k.u8s8_input_max);
        EXPECT_NE(search(), fresh) << "a copy not told of the changes should miss some";
        copy.rows_changed(changed.data(), changed.size());
        EXPECT_EQ(search(), fresh);
    }
}

TEST(NeuronSelector, AutomaticSearchIsExactWhereAnIndexWouldProbeEveryCluster) {
    layer_config layer;
    layer.search = top_k_search::automatic;
    layer.ivf_probes = 48;
    // automatic_ivf_clusters(rows) = round(sqrt(rows) / 2), and the index must save half the
    // products (ivf_min_product_saving): exact while 48 x 2 probes reach the clusters, 96
    // clusters from 37,248 rows, 97 from 37,249.
    ASSERT_EQ(ivf_min_product_saving, 2u);
    const isa_level fp32 = isa_level::scalar;
    for (const auto& [rows, want] :
         {std::pair{1u, top_k_search::exact}, std::pair{6118u, top_k_search::exact},
          std::pair{9409u, top_k_search::exact}, std::pair{37248u, top_k_search::exact},
          std::pair{37249u, top_k_search::ivf}, std::pair{670091u, top_k_search::ivf}}) {
        layer.size = rows;
        EXPECT_EQ(cpu_top_k_search(layer, fp32), want) << rows << " rows";
    }
    // AMX tiles score 8 rows in an IVF row's time: exact while 48 x 8 x 2 probes reach the
    // clusters (768 clusters from 2,362,368 rows; 769 from 2,362,369).
    for (const auto& [rows, want] :
         {std::pair{9409u, top_k_search::exact}, std::pair{15658u, top_k_search::exact},
          std::pair{670091u, top_k_search::exact}, std::pair{2362368u, top_k_search::exact},
          std::pair{2362369u, top_k_search::ivf}, std::pair{2812281u, top_k_search::ivf}}) {
        layer.size = rows;
        EXPECT_EQ(cpu_top_k_search(layer, isa_level::amx), want) << rows << " rows on amx";
    }
    // The AVX-512 levels whose exact search is in vpdpbusd's int8 products (a CPU with
    // AVX512_VNNI) score 8 as AMX does; the other SIMD levels 4 (avx2's int8, bf16 products):
    // exact while 48 x 4 x 2 probes reach the clusters (384 clusters from 591,360 rows; 385
    // from 591,361).
    for (isa_level level : {isa_level::avx2, isa_level::avx512, isa_level::avx512bf16}) {
        const bool vnni = level >= isa_level::avx512 && cpu_exact_search_in_int8(level);
        EXPECT_EQ(cpu_exact_rows_per_ivf_row(level), vnni ? 8u : 4u) << to_string(level);
        for (const auto& [rows, want] :
             {std::pair{9409u, top_k_search::exact}, std::pair{72295u, top_k_search::exact},
              std::pair{205443u, top_k_search::exact}, std::pair{591360u, top_k_search::exact},
              std::pair{591361u, vnni ? top_k_search::exact : top_k_search::ivf},
              std::pair{670091u, vnni ? top_k_search::exact : top_k_search::ivf},
              std::pair{2362368u, vnni ? top_k_search::exact : top_k_search::ivf},
              std::pair{2362369u, top_k_search::ivf}}) {
            layer.size = rows;
            EXPECT_EQ(cpu_top_k_search(layer, level), want)
                << rows << " rows on " << to_string(level) << (vnni ? " with VNNI" : "");
        }
    }
    // A rank weighs the search over its shard, with its index's clusters: the whole layer's
    // count times sqrt(its share of the rows).
    EXPECT_EQ(ivf_shard_cluster_count(0, 670091, 670091), ivf_cluster_count(0, 670091));
    EXPECT_EQ(ivf_shard_cluster_count(0, 4000000, 1000000), 500u);
    EXPECT_EQ(ivf_shard_cluster_count(100, 4000000, 40000), 10u);  // a given count alike
    EXPECT_EQ(ivf_shard_cluster_count(0, 4000000, 1), 1u);
    layer.size = 670091;  // 409 clusters: ivf on avx2
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::avx2), top_k_search::ivf);
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::avx2, 670091), top_k_search::ivf);
    // Two ranks of equal shares: 289 clusters each, 48 x 4 x 2 probes reach them.
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::avx2, 335046), top_k_search::exact);
    layer.size = 2812281;  // the Amazon-3M shape's labels: 839 clusters
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::amx), top_k_search::ivf);
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::amx, 1406141), top_k_search::exact);
    layer.size = 6118;
    layer.ivf_clusters = 100;  // given clusters count as given
    EXPECT_EQ(cpu_top_k_search(layer, fp32), top_k_search::ivf);
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::amx), top_k_search::exact);
    layer.ivf_probes = 50;
    EXPECT_EQ(cpu_top_k_search(layer, fp32), top_k_search::exact);
    layer.ivf_probes = 100;
    EXPECT_EQ(cpu_top_k_search(layer, fp32), top_k_search::exact);
    // A search that is not automatic is what it says.
    layer.search = top_k_search::ivf;
    EXPECT_EQ(cpu_top_k_search(layer, isa_level::amx), top_k_search::ivf);
    layer.size = 1;
    layer.search = top_k_search::exact;
    EXPECT_EQ(cpu_top_k_search(layer, fp32), top_k_search::exact);
}

TEST(NeuronSelector, ReusedCandidatesAreTheKeptSearchsUntilTheyAgeAndSurviveAnExport) {
    // A search over a copy (int8 or bf16: no log-partition, which reuse leaves alone).
    exact_layer layer(3000, 21, 5);
    const auto queries = eighth_queries(37, layer.width, 6);
    const layer_config config = top_k_config(top_k_search::automatic, 0, 0);
    auto make = [&](uint64_t reuse) {
        auto s = std::make_unique<exact_top_k>(layer.source(), config, 77, best_kernels(), 2);
        if (reuse > 0) s->set_candidate_reuse(reuse);
        return s;
    };
    if (make(0)->computes_log_partition())
        GTEST_SKIP() << "this CPU's best kernels (" << to_string(detected_isa())
                     << ") search the fp32 rows, with the log-partition: no reuse there";
    constexpr uint64_t period = 10;
    // Sets of every sample at `step`, keyed by their index (the last one by none).
    auto select = [&](exact_top_k& selector, uint64_t step) {
        test_batch tb(queries, layer.rows, 5);
        for (size_t s = 0; s + 1 < queries.size(); ++s) tb.samples[s].key = uint32_t(s);
        selection_batch batch = tb.batch(step, 64);
        stage_times times;
        selector.select(batch, times);
        return tb.ids;
    };
    const auto reusing = make(period);
    EXPECT_EQ(select(*reusing, 5), select(*make(0), 5));
    EXPECT_EQ(reusing->candidates().points(), 0u) << "the first period's are not kept";
    EXPECT_EQ(select(*reusing, period), select(*make(0), period));
    const candidate_cache kept = reusing->candidates();
    ASSERT_EQ(kept.width, 9u);
    ASSERT_EQ(kept.points(), queries.size() - 1);  // the unkeyed sample is not kept
    for (uint64_t s : kept.steps) EXPECT_EQ(s, period);

    // The rows move: a fresh search finds other candidates, a reusing one keeps the kept ones
    // (its sets' top-k are their lists' rows that are not labels, ascending) until they are
    // `period` steps old, and searches for a sample without a key.
    rng gen(8);
    const std::vector<uint32_t> moved = layer.redraw_rows(0, 2, gen);
    reusing->rows_changed(moved.data(), moved.size());
    auto imported = make(period);
    imported->import_candidates(kept);
    const auto fresh_15 = select(*make(0), 15);
    const auto reused_15 = select(*reusing, 15);
    EXPECT_EQ(select(*imported, 15), reused_15) << "an imported cache reuses as the kept one";
    size_t differs = 0;
    test_batch labelled(queries, layer.rows, 5);
    for (size_t s = 0; s + 1 < queries.size(); ++s) {
        const std::vector<uint32_t>& y = labelled.labels[s];
        std::vector<uint32_t> want;
        for (uint32_t i = 0; i < kept.width; ++i) {
            const uint32_t r = kept.ids[s * kept.width + i];
            if (std::find(y.begin(), y.end(), r) == y.end()) want.push_back(r);
        }
        std::sort(want.begin(), want.end());
        EXPECT_TRUE(std::equal(want.begin(), want.end(), reused_15[s].begin() + y.size()))
            << "sample " << s;
        differs += reused_15[s] != fresh_15[s];
    }
    EXPECT_GT(differs, 0u) << "the rows moved: some fresh search should differ";
    EXPECT_EQ(reused_15.back(), fresh_15.back()) << "a sample without a key searches";
    EXPECT_EQ(reusing->candidates().steps, kept.steps) << "nothing searched, nothing kept";
    // At `period` steps old the kept ones search again, as a fresh selection does.
    EXPECT_EQ(select(*reusing, period + period), select(*make(0), period + period));
    for (uint64_t s : reusing->candidates().steps) EXPECT_EQ(s, 2 * period);
    // A cache of another width is refused by name.
    candidate_cache other = kept;
    other.width = 4;
    other.ids.resize(other.points() * 4);
    EXPECT_THROW(make(period)->import_candidates(other), hslide::error);
}
