// Tests of the CPU backend: gradients against finite differences of an independent
// double-precision reference, thread-count invariance, Adam against a hand-computed step,
// export/import, prediction.
#include "cpu/cpu_backend.hpp"
#include "cpu/top_k_selector.hpp"
#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/fill_pool.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

using namespace hslide;
using hslide::testing::max_parameter_difference;
using hslide::testing::random_dataset;

namespace {

/// input 20 -> 12 (dense) -> 10 (hidden, given sparsity) -> 30 (output, given sparsity).
model_config small_config(sparsity_mode hidden, sparsity_mode output) {
    model_config c;
    c.input_dim = 20;
    layer_config l;
    l.lsh.K = 2;
    l.lsh.L = 4;
    l.lsh.bits_per_hash = 2;
    l.lsh.bucket_capacity = 8;
    l.active.min_active = 5;
    l.size = 12;
    l.sparsity = sparsity_mode::dense;
    c.layers.push_back(l);
    l.size = 10;
    l.sparsity = hidden;
    c.layers.push_back(l);
    l.size = 30;
    l.sparsity = output;
    l.active.min_active = 8;
    l.top_k = 6;
    c.layers.push_back(l);
    return c;
}

/// Parameters as doubles, for the reference.
struct ref_params {
    std::vector<std::vector<double>> w, b;  // w[l][row * width + i]
    std::vector<uint32_t> width;
};

ref_params to_ref(const model_state& m) {
    ref_params p;
    for (const auto& layer : m.layers) {
        std::vector<double> w(size_t(layer.rows) * layer.width);
        for (uint32_t r = 0; r < layer.rows; ++r)
            for (uint32_t i = 0; i < layer.width; ++i)
                w[size_t(r) * layer.width + i] = layer.row(r)[i];
        p.w.push_back(std::move(w));
        p.b.emplace_back(layer.bias.begin(), layer.bias.end());
        p.width.push_back(layer.width);
    }
    return p;
}

/// The first layer's ReLU outputs for the sparse input `x`, from the definition.
std::vector<double> reference_first_layer(const ref_params& p, const model_config& c,
                                          const feature_row& x) {
    std::vector<double> a(c.layers[0].size);
    for (uint32_t j = 0; j < a.size(); ++j) {
        double z = p.b[0][j];
        for (uint32_t k = 0; k < x.count; ++k)
            z += x.values[k] * p.w[0][size_t(x.ids[k]) * p.width[0] + j];
        a[j] = std::max(0.0, z);
    }
    return a;
}

/// The mean loss of the batch with the given active sets (empty = all), written from the
/// definition: ReLU hidden layers, softmax over the output active set, target 1/|y|;
/// `output_shift` (per sample, per output set position) is added to the softmax's logits.
double reference_loss(const ref_params& p, const model_config& c, const dataset& d,
                      const std::vector<uint32_t>& rows,
                      const std::vector<std::vector<std::vector<uint32_t>>>& active,
                      const std::vector<std::vector<double>>* output_shift = nullptr) {
    double total = 0;
    for (size_t s = 0; s < rows.size(); ++s) {
        const feature_row x = d.features(rows[s]);
        const label_row y = d.labels(rows[s]);
        std::vector<double> a = reference_first_layer(p, c, x);
        for (size_t l = 1; l < c.layers.size(); ++l) {
            std::vector<uint32_t> ids = active[s][l];
            if (ids.empty()) {
                ids.resize(c.layers[l].size);
                std::iota(ids.begin(), ids.end(), 0u);
            }
            std::vector<double> next(c.layers[l].size, 0.0);  // inactive neurons output 0
            std::vector<double> z(ids.size());
            for (size_t t = 0; t < ids.size(); ++t) {
                double sum = p.b[l][ids[t]];
                for (uint32_t i = 0; i < p.width[l]; ++i)
                    sum += p.w[l][size_t(ids[t]) * p.width[l] + i] * a[i];
                z[t] = sum;
            }
            if (l + 1 < c.layers.size()) {
                for (size_t t = 0; t < ids.size(); ++t) next[ids[t]] = std::max(0.0, z[t]);
                a = next;
            } else {
                if (output_shift)
                    for (size_t t = 0; t < z.size(); ++t) z[t] += (*output_shift)[s][t];
                const double m = *std::max_element(z.begin(), z.end());
                double sum = 0;
                for (double v : z) sum += std::exp(v - m);
                const double log_sum = std::log(sum) + m;
                for (uint32_t k = 0; k < y.count; ++k) {
                    const auto it = std::find(ids.begin(), ids.end(), y.ids[k]);
                    EXPECT_NE(it, ids.end()) << "label missing from the active set";
                    total -= (z[it - ids.begin()] - log_sum) / y.count;
                }
            }
        }
    }
    return total / rows.size();
}

/// The logits of every output neuron of `point`, from the definition (one dense hidden layer
/// after the first, or none).
std::vector<double> reference_logits(const ref_params& p, const model_config& c, const dataset& d,
                                     uint32_t point) {
    const feature_row x = d.features(point);
    std::vector<double> a = reference_first_layer(p, c, x);
    for (size_t l = 1; l < c.layers.size(); ++l) {
        std::vector<double> z(c.layers[l].size);
        for (uint32_t r = 0; r < z.size(); ++r) {
            z[r] = p.b[l][r];
            for (uint32_t i = 0; i < p.width[l]; ++i)
                z[r] += p.w[l][size_t(r) * p.width[l] + i] * a[i];
        }
        if (l + 1 == c.layers.size()) return z;
        for (double& v : z) v = std::max(0.0, v);
        a = z;
    }
    return {};
}

/// random_dataset's labels, with every one of the `features` features on every point (fresh
/// values in [-1, 1)): a dense input, as Yeast's.
dataset dense_features_dataset(uint32_t n, uint32_t features, uint32_t labels, uint64_t seed) {
    const dataset sparse = random_dataset(n, features, labels, seed);
    dataset d;
    d.source = "dense features";
    d.n_features = features;
    d.n_labels = labels;
    rng gen(seed + 1);
    std::vector<uint32_t> ids(features);
    std::iota(ids.begin(), ids.end(), 0u);
    std::vector<float> values(features);
    for (uint32_t p = 0; p < n; ++p) {
        for (float& v : values) v = 2.0f * gen.uniform() - 1.0f;
        const label_row y = sparse.labels(p);
        d.push_back(ids.data(), values.data(), features, y.ids, y.count);
    }
    return d;
}

void check_gradient(sparsity_mode hidden, sparsity_mode output, uint64_t seed,
                    const cpu::kernel_table& kernels = cpu::best_kernels(),
                    float fill_correction = 0.0f, bool dense_features = false) {
    SCOPED_TRACE(kernels.name);
    model_config config = small_config(hidden, output);
    config.layers.back().fill_correction = fill_correction;
    if (fill_correction != 0.0f) config.layers.back().active.min_active = 16;  // a real fill
    const dataset data = dense_features ? dense_features_dataset(40, 20, 30, seed)
                                        : random_dataset(40, 20, 30, seed);
    const model_state initial = model_state::create(config, seed);
    train_config tc;
    tc.seed = seed;
    cpu::cpu_backend be(initial, tc, 1, kernels);
    // A few steps first so weights, biases and ReLU patterns are not at their initial values.
    std::vector<uint32_t> all(data.size());
    std::iota(all.begin(), all.end(), 0u);
    for (int step = 0; step < 3; ++step) be.train_batch({&data, all.data() + step * 8, 8}, 0.01f);

    const std::vector<uint32_t> rows = {3, 17, 25, 31, 8, 12};
    model_state grad;
    const double loss = be.compute_gradient({&data, rows.data(), uint32_t(rows.size())}, grad);
    std::vector<std::vector<std::vector<uint32_t>>> active(rows.size());
    for (size_t s = 0; s < rows.size(); ++s)
        for (size_t l = 0; l < config.layers.size(); ++l)
            active[s].push_back(be.last_active(uint32_t(s), l));

    ref_params p = to_ref(be.model());
    // A top-k layer's loss is the full softmax's (the gradient is its set's softmax's, below).
    auto loss_sets = active;
    if (output == sparsity_mode::topk)
        for (auto& sets : loss_sets) sets.back().clear();
    EXPECT_NEAR(reference_loss(p, config, data, rows, loss_sets), loss,
                1e-5 * std::max(1.0, std::abs(loss)));
    // Top-k with a fill correction: past the labels and the 6 best logits, the set's random
    // neurons, drawn from the other rows, enter the softmax raised by w log(others / drawn).
    std::vector<std::vector<double>> shift(rows.size());
    for (size_t s = 0; s < rows.size(); ++s) {
        const std::vector<uint32_t>& set = active[s].back();
        shift[s].assign(set.size(), 0.0);
        if (fill_correction == 0.0f) continue;
        const label_row y = data.labels(rows[s]);
        const std::vector<double> z = reference_logits(p, config, data, rows[s]);
        std::vector<uint32_t> order(z.size());
        std::iota(order.begin(), order.end(), 0u);
        std::stable_sort(order.begin(), order.end(),
                         [&](uint32_t a, uint32_t b) { return z[a] > z[b]; });
        size_t fixed = y.count;
        for (uint32_t i = 0; i < 6; ++i)
            fixed += std::find(y.ids, y.ids + y.count, order[i]) == y.ids + y.count;
        ASSERT_LT(fixed, set.size()) << "sample " << s << ": no random fill to correct";
        const double others = double(config.layers.back().size - fixed);
        for (size_t t = fixed; t < set.size(); ++t)
            shift[s][t] = fill_correction * std::log(others / double(set.size() - fixed));
    }

    // Central differences on every weight and bias of every layer.
    const double eps = 1e-5;
    int checked = 0, nonzero = 0;
    for (size_t l = 0; l < config.layers.size(); ++l) {
        const layer_state& g = grad.layers[l];
        for (uint32_t r = 0; r < g.rows; ++r) {
            for (uint32_t i = 0; i <= g.width; ++i) {
                const bool is_bias = i == g.width;  // i == width: the row's bias
                if (is_bias && l == 0) continue;    // layer 0's biases are per column: below
                double& param = is_bias ? p.b[l][r] : p.w[l][size_t(r) * g.width + i];
                const double saved = param;
                param = saved + eps;
                const double up = reference_loss(p, config, data, rows, active,
                                                 fill_correction != 0.0f ? &shift : nullptr);
                param = saved - eps;
                const double down = reference_loss(p, config, data, rows, active,
                                                   fill_correction != 0.0f ? &shift : nullptr);
                param = saved;
                const double numeric = (up - down) / (2 * eps);
                const double analytic = is_bias ? g.bias[r] : g.row(r)[i];
                ASSERT_NEAR(analytic, numeric, 2e-4 + 2e-3 * std::abs(numeric))
                    << "layer " << l << " row " << r << (is_bias ? " bias" : " col ") << i;
                ++checked;
                nonzero += analytic != 0.0;
            }
        }
        if (l == 0) {
            for (uint32_t j = 0; j < g.width; ++j) {
                const double saved = p.b[0][j];
                p.b[0][j] = saved + eps;
                const double up = reference_loss(p, config, data, rows, active,
                                                 fill_correction != 0.0f ? &shift : nullptr);
                p.b[0][j] = saved - eps;
                const double down = reference_loss(p, config, data, rows, active,
                                                   fill_correction != 0.0f ? &shift : nullptr);
                p.b[0][j] = saved;
                ASSERT_NEAR(g.bias[j], (up - down) / (2 * eps),
                            2e-4 + 2e-3 * std::abs((up - down) / (2 * eps)))
                    << "layer 0 bias " << j;
            }
        }
    }
    EXPECT_GT(checked, 600);
    EXPECT_GT(nonzero, 100);  // the check is not vacuous
}

bool same_parameters(const model_state& a, const model_state& b) {
    if (a.layers.size() != b.layers.size()) return false;
    for (size_t l = 0; l < a.layers.size(); ++l) {
        const auto& x = a.layers[l];
        const auto& y = b.layers[l];
        if (x.weights.size() != y.weights.size() || x.bias != y.bias) return false;
        if (std::memcmp(x.weights.data(), y.weights.data(), x.weights.size() * sizeof(float)) != 0)
            return false;
    }
    return true;
}

}  // namespace

TEST(CpuBackendGradient, DenseLayersMatchFiniteDifferences) {
    check_gradient(sparsity_mode::dense, sparsity_mode::dense, 11);
}

TEST(CpuBackendGradient, DenseFeaturesMatchFiniteDifferences) {
    // Every point has every feature: the forward sums four samples' input layer together and
    // the update four feature rows' gradients together (weighted_row_sum4,
    // weighted_vector_sum4), on every level.
    for (const isa_level level : {isa_level::scalar, isa_level::avx2, isa_level::avx512,
                                  isa_level::avx512bf16, isa_level::amx})
        if (isa_supported(level))
            check_gradient(sparsity_mode::dense, sparsity_mode::dense, 17, cpu::kernels_for(level),
                           0.0f, /*dense_features=*/true);
}

TEST(CpuBackendGradient, SparseOutputMatchesFiniteDifferences) {
    check_gradient(sparsity_mode::dense, sparsity_mode::lsh, 12);
}

TEST(CpuBackendGradient, SparseHiddenAndOutputMatchFiniteDifferences) {
    check_gradient(sparsity_mode::lsh, sparsity_mode::lsh, 13);
}

TEST(CpuBackendGradient, TopKOutputMatchesFiniteDifferences) {
    // The gradient of the softmax over each sample's set (labels and its 6 best logits).
    check_gradient(sparsity_mode::dense, sparsity_mode::topk, 16);
}

TEST(CpuBackendGradient, TopKOutputWithAFillCorrectionMatchesFiniteDifferences) {
    // The same sets; the random fill's logits raised by log(rows outside / drawn) in the
    // gradient's softmax.
    check_gradient(sparsity_mode::dense, sparsity_mode::topk, 16, cpu::best_kernels(), 1.0f);
}

TEST(CpuBackendGradient, EveryIsaLevelMatchesFiniteDifferences) {
    for (const isa_level level : {isa_level::scalar, isa_level::avx2, isa_level::avx512,
                                  isa_level::avx512bf16, isa_level::amx})
        if (isa_supported(level))
            check_gradient(sparsity_mode::lsh, sparsity_mode::lsh, 14, cpu::kernels_for(level));
}

TEST(CpuBackendGradient, Bf16GradientIsCloseToFp32) {
    // Dense layers, so both precisions compute the same neurons. bf16 keeps 8 significant bits
    // of the weights and layer inputs, so one sample's gradient agrees to about 1% in norm (a
    // batch's mean gradient cancels between samples and would magnify the relative error).
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::dense);
    const dataset data = random_dataset(40, 20, 30, 15);
    const model_state initial = model_state::create(config, 15);
    train_config tc;
    const auto& k = cpu::best_kernels();
    cpu::cpu_backend fp32(initial, tc, 1, k, precision_mode::fp32);
    cpu::cpu_backend bf16(initial, tc, 1, k, precision_mode::bf16);
    for (const uint32_t row : {0u, 7u, 19u, 33u}) {
        model_state g32, g16;
        const double loss32 = fp32.compute_gradient({&data, &row, 1}, g32);
        const double loss16 = bf16.compute_gradient({&data, &row, 1}, g16);
        EXPECT_NEAR(loss16, loss32, 5e-3 * loss32);
        for (size_t l = 0; l < config.layers.size(); ++l) {
            double diff = 0, norm = 0;
            const layer_state& a = g32.layers[l];
            const layer_state& b = g16.layers[l];
            for (size_t i = 0; i < a.weights.size(); ++i) {
                diff += (a.weights[i] - b.weights[i]) * double(a.weights[i] - b.weights[i]);
                norm += a.weights[i] * double(a.weights[i]);
            }
            ASSERT_GT(norm, 0.0);
            EXPECT_LT(std::sqrt(diff / norm), 0.02) << "row " << row << " layer " << l;
            EXPECT_GT(diff, 0.0) << "layer " << l << ": bf16 changed nothing";
        }
    }
}

TEST(CpuBackend, SparseOutputActiveSetHoldsLabelsFirstAndIsSparse) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    const dataset data = random_dataset(16, 20, 30, 5);
    cpu::cpu_backend be(model_state::create(config, 5), train_config{}, 1);
    std::vector<uint32_t> rows(16);
    std::iota(rows.begin(), rows.end(), 0u);
    model_state grad;
    be.compute_gradient({&data, rows.data(), 16}, grad);
    for (uint32_t s = 0; s < 16; ++s) {
        const auto& ids = be.last_active(s, 2);
        const label_row y = data.labels(s);
        ASSERT_GE(ids.size(), std::max<size_t>(y.count, 8));
        EXPECT_LT(ids.size(), 30u);
        for (uint32_t k = 0; k < y.count; ++k) EXPECT_EQ(ids[k], y.ids[k]);
    }
}

/// Neuron ids by decreasing logit (ties: the smaller id first, as the backend ranks them).
static std::vector<uint32_t> ranking(const std::vector<double>& z) {
    std::vector<uint32_t> order(z.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return z[a] > z[b]; });
    return order;
}

TEST(CpuBackend, TopKSetsAreTheLabelsThenTheExactTopKAndReportTheDroppedMass) {
    model_config config = small_config(sparsity_mode::dense, sparsity_mode::topk);
    const dataset data = random_dataset(40, 20, 30, 7, /*unlabelled_every=*/9);
    cpu::cpu_backend be(model_state::create(config, 7), train_config{}, 2);
    std::vector<uint32_t> rows(40);
    std::iota(rows.begin(), rows.end(), 0u);
    for (uint32_t b = 0; b < 24; b += 8) be.train_batch({&data, rows.data() + b, 8}, 0.02f);
    model_state now;  // the model the next step selects with (input rows caught up)
    be.export_state(now, false);
    const ref_params p = to_ref(now);
    const step_report report = be.train_batch({&data, rows.data() + 24, 16}, 0.02f);
    double dropped = 0;
    uint32_t labelled = 0;
    for (uint32_t s = 0; s < 16; ++s) {
        const uint32_t point = 24 + s;
        const std::vector<double> z = reference_logits(p, config, data, point);
        const std::vector<uint32_t> order = ranking(z);
        const label_row y = data.labels(point);
        std::vector<uint32_t> expected(y.ids, y.ids + y.count), best;
        for (uint32_t i = 0; i < 6; ++i)
            if (std::find(y.ids, y.ids + y.count, order[i]) == y.ids + y.count)
                best.push_back(order[i]);
        std::sort(best.begin(), best.end());
        // The labels, then the best 6 in increasing id order, then random ones up to
        // min_active (8) in increasing id order, each once.
        const std::vector<uint32_t>& set = be.last_active(s, 2);
        ASSERT_EQ(set.size(), std::max<size_t>(8, y.count + best.size())) << "point " << point;
        EXPECT_TRUE(std::equal(y.ids, y.ids + y.count, set.begin())) << "point " << point;
        EXPECT_TRUE(std::equal(best.begin(), best.end(), set.begin() + y.count))
            << "point " << point << ": the top-k after the labels";
        EXPECT_TRUE(std::is_sorted(set.begin() + y.count + best.size(), set.end()));
        EXPECT_EQ(std::set<uint32_t>(set.begin(), set.end()).size(), set.size());
        if (y.count == 0) continue;
        const double m = *std::max_element(z.begin(), z.end());
        double all = 0, kept = 0;
        for (double v : z) all += std::exp(v - m);
        for (uint32_t id : set) kept += std::exp(z[id] - m);
        dropped += 1 - kept / all;
        ++labelled;
    }
    ASSERT_GT(labelled, 10u);
    EXPECT_EQ(report.full_softmax_samples, labelled);
    EXPECT_NEAR(report.dropped_mass_sum, dropped, 1e-5 * labelled);
    EXPECT_GT(dropped, 0.05 * labelled);  // 6 of 30 neurons leave a real share out
}

TEST(CpuBackend, SelectionQualityMeasuresTheSetsAgainstTheExactTopLogits) {
    // Top-6 sets without fill against the exact top 10: every point's recall is 6/10, and
    // its labels are found when they rank among its 6 best.
    model_config config = small_config(sparsity_mode::dense, sparsity_mode::topk);
    config.layers.back().active.min_active = 1;
    const dataset data = random_dataset(40, 20, 30, 17, /*unlabelled_every=*/7);
    cpu::cpu_backend be(model_state::create(config, 17), train_config{}, 2);
    std::vector<uint32_t> rows(40);
    std::iota(rows.begin(), rows.end(), 0u);
    for (uint32_t b = 0; b < 40; b += 8) be.train_batch({&data, rows.data() + b, 8}, 0.02f);
    const selection_quality q = be.measure_selection({&data, rows.data(), 20}, 10);
    EXPECT_EQ(q.points, 20u);
    EXPECT_EQ(q.top, 10u);
    EXPECT_DOUBLE_EQ(q.top_recall, 0.6);
    EXPECT_DOUBLE_EQ(q.mean_set_size, 6.0);
    const ref_params p = to_ref(be.model());  // up to date: the measurement caught it up
    double label_recall = 0;
    int labelled = 0;
    for (uint32_t point = 0; point < 20; ++point) {
        const label_row y = data.labels(point);
        if (y.count == 0) continue;
        const std::vector<double> z = reference_logits(p, config, data, point);
        const std::vector<uint32_t> order = ranking(z);
        uint32_t found = 0;
        for (uint32_t i = 0; i < y.count; ++i)
            found += std::find(order.begin(), order.begin() + 6, y.ids[i]) != order.begin() + 6;
        label_recall += double(found) / y.count;
        ++labelled;
    }
    EXPECT_NEAR(q.label_recall, label_recall / labelled, 1e-12);
    EXPECT_GT(q.label_recall, 0.0);
    EXPECT_LT(q.label_recall, 1.0);
    // A dense output layer's set is every neuron; an LSH set lies in between.
    cpu::cpu_backend dense(
        model_state::create(small_config(sparsity_mode::dense, sparsity_mode::dense), 17),
        train_config{}, 2);
    const selection_quality all = dense.measure_selection({&data, rows.data(), 20}, 10);
    EXPECT_EQ(all.top_recall, 1.0);
    EXPECT_EQ(all.label_recall, 1.0);
    EXPECT_EQ(all.mean_set_size, 30.0);
    cpu::cpu_backend lsh(
        model_state::create(small_config(sparsity_mode::dense, sparsity_mode::lsh), 17),
        train_config{}, 2);
    const selection_quality some = lsh.measure_selection({&data, rows.data(), 20}, 10);
    EXPECT_GT(some.top_recall, 0.0);
    EXPECT_LT(some.mean_set_size, 30.0);
    EXPECT_GE(some.mean_set_size, 8.0);  // filled to min_active
    // The trainer's automatic probe runs where the selection may miss (selection_is_exact):
    // LSH, not a dense layer nor an exact top-k (IVF: test_ivf_index.cpp).
    EXPECT_TRUE(be.selection_is_exact());
    EXPECT_TRUE(dense.selection_is_exact());
    EXPECT_FALSE(lsh.selection_is_exact());
}

TEST(CpuBackend, TopKOverEveryNeuronTrainsAsTheDenseLayer) {
    // k = the layer: every neuron is in every set, its softmax the full one, so the model
    // is the dense layer's (the set's order and the exact log-partition round differently).
    model_config dense = small_config(sparsity_mode::dense, sparsity_mode::dense);
    model_config top = small_config(sparsity_mode::dense, sparsity_mode::topk);
    top.layers.back().top_k = 30;
    const dataset data = random_dataset(64, 20, 30, 8);
    cpu::cpu_backend a(model_state::create(dense, 8), train_config{}, 2);
    cpu::cpu_backend b(model_state::create(top, 8), train_config{}, 2);
    std::vector<uint32_t> rows(64);
    std::iota(rows.begin(), rows.end(), 0u);
    for (uint32_t s = 0; s < 64; s += 16) {
        const step_report ra = a.train_batch({&data, rows.data() + s, 16}, 0.01f);
        const step_report rb = b.train_batch({&data, rows.data() + s, 16}, 0.01f);
        EXPECT_NEAR(ra.loss_sum, rb.loss_sum, 1e-5 * ra.loss_sum);
        EXPECT_LT(rb.dropped_mass_sum, 1e-5);
    }
    EXPECT_LT(max_parameter_difference(a.model(), b.model()), 1e-5);
}

TEST(CpuBackend, TopKRefusesWhatItCannotRun) {
    train_config catch_up;
    catch_up.adam = adam_mode::catch_up;
    EXPECT_THROW(cpu::cpu_backend(model_state::create(
                                      small_config(sparsity_mode::dense, sparsity_mode::topk), 1),
                                  catch_up, 1),
                 hslide::error);
    // Its exact scoring needs whole hidden vectors.
    EXPECT_THROW(cpu::cpu_backend(
                     model_state::create(small_config(sparsity_mode::lsh, sparsity_mode::topk), 1),
                     train_config{}, 1),
                 hslide::error);
    // A hidden layer has no logits to rank.
    EXPECT_THROW(validate(small_config(sparsity_mode::topk, sparsity_mode::dense)), hslide::error);
    model_config zero = small_config(sparsity_mode::dense, sparsity_mode::topk);
    zero.layers.back().top_k = 0;
    EXPECT_THROW(validate(zero), hslide::error);
}

TEST(CpuBackend, TopKFillDrawsFromTheStepsPool) {
    // 3,000 output rows, sets of 40 (4 of them the top-k), batches of 32: a pool of 0.125 an
    // entry is 0.125 x 32 x 40 = 160 rows, so a batch's fills, 32 x about 35 draws, land on
    // at most 160 distinct rows (from the whole layer: about 940), and the next step's pool
    // is another 160.
    ASSERT_EQ(fill_pool_size(0.125f, 3000, 40, 32), 160u);
    EXPECT_EQ(fill_pool_size(0.0f, 3000, 40, 32), 0u);      // no pool
    EXPECT_EQ(fill_pool_size(0.125f, 3000, 40, 64), 320u);  // twice the batch, twice the pool
    EXPECT_EQ(fill_pool_size(0.01f, 3000, 40, 32), 160u);   // at least 4 x the fill
    EXPECT_EQ(fill_pool_size(1.0f, 3000, 40, 128), 0u);     // a pool would be the whole layer
    // No pool where the draws would touch at most a fifth of the rows: 16 x 40 = 640 draws
    // touch 1 - e^-(640 / 3000) = 19% of them, 17 x 40 = 680 draws 20.3%.
    EXPECT_EQ(fill_pool_size(0.5f, 3000, 40, 16), 0u);
    EXPECT_EQ(fill_pool_size(0.5f, 3000, 40, 17), 340u);
    const dataset data = random_dataset(64, 20, 30, 13);
    std::vector<uint32_t> rows(64);
    std::iota(rows.begin(), rows.end(), 0u);
    auto fill_rows = [&](float per_draw) {
        model_config config = small_config(sparsity_mode::dense, sparsity_mode::topk);
        config.layers.back().size = 3000;
        config.layers.back().active.min_active = 40;
        config.layers.back().top_k = 4;
        config.layers.back().fill_pool = per_draw;
        cpu::cpu_backend be(model_state::create(config, 15), train_config{}, 2);
        std::vector<std::set<uint32_t>> per_step;
        for (uint32_t b = 0; b < 64; b += 32) {
            be.train_batch({&data, rows.data() + b, 32}, 0.02f);
            std::set<uint32_t> fill;
            for (uint32_t s = 0; s < 32; ++s) {
                const std::vector<uint32_t>& set = be.last_active(s, 2);
                EXPECT_EQ(set.size(), 40u);
                EXPECT_EQ(std::set<uint32_t>(set.begin(), set.end()).size(), set.size());
                const uint32_t from = be.last_fill_start(s);
                EXPECT_TRUE(std::is_sorted(set.begin() + from, set.end()));
                fill.insert(set.begin() + from, set.end());
            }
            per_step.push_back(fill);
        }
        return per_step;
    };
    const auto pooled = fill_rows(0.125f), whole = fill_rows(0.0f);
    for (const auto& step : pooled) {
        EXPECT_LE(step.size(), 160u);
        EXPECT_GT(step.size(), 120u);  // most of the pool is drawn
    }
    for (const auto& step : whole) EXPECT_GT(step.size(), 600u);
    std::set<uint32_t> both = pooled[0];
    both.insert(pooled[1].begin(), pooled[1].end());
    EXPECT_GT(both.size(), 240u);  // each step its own pool
}

TEST(CpuBackend, TopKLayerPredictsExactlyUnderEveryScoringAndRoundTripsItsConfig) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::topk);
    const model_config back = model_config_from_json(model_config_to_json(config));
    EXPECT_EQ(back.layers.back().sparsity, sparsity_mode::topk);
    EXPECT_EQ(back.layers.back().top_k, 6u);
    EXPECT_EQ(back.layers.back().fill_pool, config.layers.back().fill_pool);
    EXPECT_EQ(back.selection(2), neuron_selection::top_k);
    // A configuration saved before --fill-pool drew its fill from the whole layer.
    std::string old = model_config_to_json(config);
    const size_t at = old.rfind(",\"fill_pool\":");  // the output layer's
    ASSERT_NE(at, std::string::npos) << old;
    old.erase(at, old.find_first_of(",}", at + 1) - at);
    EXPECT_EQ(model_config_from_json(old).layers.back().fill_pool, 0.0f);
    const dataset data = random_dataset(40, 20, 30, 9);
    cpu::cpu_backend be(model_state::create(config, 9), train_config{}, 2);
    std::vector<uint32_t> rows(40);
    std::iota(rows.begin(), rows.end(), 0u);
    for (uint32_t b = 0; b < 40; b += 8) be.train_batch({&data, rows.data() + b, 8}, 0.02f);
    const uint32_t k = 5;
    std::vector<uint32_t> exact(40 * k), lsh(40 * k);
    std::vector<float> exact_scores(40 * k), lsh_scores(40 * k);
    be.predict({&data, rows.data(), 40}, k, scoring_mode::exact, exact.data(), exact_scores.data());
    be.predict({&data, rows.data(), 40}, k, scoring_mode::lsh, lsh.data(), lsh_scores.data());
    EXPECT_EQ(exact, lsh);
    EXPECT_EQ(exact_scores, lsh_scores);
}

/// Trains one backend on 1 thread and one on `threads` through the same batches (tables
/// rebuilt with new functions after `rebuild_after` batches); per-row reductions in sample
/// order make the result independent of the thread count: not merely within tolerance, but
/// bit for bit. Returns the smallest active-entry count of the output layer seen in a batch.
uint64_t expect_thread_count_invariance(const model_config& config, const dataset& data,
                                        uint32_t batch, int threads, uint32_t rebuild_after,
                                        const train_config& tc = {}) {
    const model_state initial = model_state::create(config, 21);
    cpu::cpu_backend one(initial, tc, 1), many(initial, tc, threads);
    std::vector<uint32_t> rows(data.size());
    std::iota(rows.begin(), rows.end(), 0u);
    uint64_t fewest = UINT64_MAX;
    for (uint32_t b = 0; b + batch <= rows.size(); b += batch) {
        const auto r1 = one.train_batch({&data, rows.data() + b, batch}, 0.01f);
        const auto rn = many.train_batch({&data, rows.data() + b, batch}, 0.01f);
        EXPECT_EQ(r1.loss_sum, rn.loss_sum);
        fewest = std::min(fewest, r1.active_per_layer.back());
        if (b / batch + 1 == rebuild_after) {
            one.refresh_selections(true);
            many.refresh_selections(true);
        }
    }
    model_state a, b;
    one.export_state(a, true);
    many.export_state(b, true);
    EXPECT_TRUE(same_parameters(a, b));
    EXPECT_FALSE(same_parameters(a, initial));
    return fewest;
}

TEST(CpuBackend, TwoThreadsGiveTheSameModelAsOneThread) {
    expect_thread_count_invariance(small_config(sparsity_mode::lsh, sparsity_mode::lsh),
                                   random_dataset(200, 20, 30, 21), 16, 2, 7);
}

TEST(CpuBackend, TopKTrainingDoesNotDependOnTheThreadCount) {
    expect_thread_count_invariance(small_config(sparsity_mode::dense, sparsity_mode::topk),
                                   random_dataset(200, 20, 30, 23), 16, 3, 7);
}

TEST(CpuBackend, CatchUpAdamGivesTheSameModelOnAnyThreadCount) {
    // Threads race to claim the rows they read; whichever wins, the row's catch-up is the same.
    train_config tc;
    tc.adam = adam_mode::catch_up;
    expect_thread_count_invariance(small_config(sparsity_mode::lsh, sparsity_mode::lsh),
                                   random_dataset(200, 20, 30, 22), 16, 3, 7, tc);
}

TEST(CpuBackend, Bf16MomentsDoNotDependOnTheThreadCount) {
    // The stochastic roundings draw from the step and the row, not from the thread.
    train_config tc;
    tc.adam_moments = moment_storage::bf16;
    expect_thread_count_invariance(small_config(sparsity_mode::dense, sparsity_mode::topk),
                                   random_dataset(200, 20, 30, 24), 16, 3, 7, tc);
}

TEST(CpuBackend, Bf16MomentsTrainLikeFp32AndRoundTripThroughExports) {
    // The same batches with fp32 and bf16 moments: the models stay close (a moment differs by
    // at most a bf16 unit per step, and Adam's step is a ratio of the two); the bf16 ones
    // export as floats that bf16 holds exactly (the output layer's; the input layer's and the
    // biases' stay fp32), and an import of the export exports the same state again.
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::topk);
    const model_state initial = model_state::create(config, 31);
    train_config fp32_tc, bf16_tc;
    bf16_tc.adam_moments = moment_storage::bf16;
    cpu::cpu_backend fp32(initial, fp32_tc, 2), bf16(initial, bf16_tc, 2);
    const dataset data = random_dataset(160, 20, 30, 25);
    std::vector<uint32_t> rows(data.size());
    std::iota(rows.begin(), rows.end(), 0u);
    for (uint32_t b = 0; b + 16 <= rows.size(); b += 16) {
        fp32.train_batch({&data, rows.data() + b, 16}, 0.01f);
        bf16.train_batch({&data, rows.data() + b, 16}, 0.01f);
    }
    model_state a, b;
    fp32.export_state(a, true);
    bf16.export_state(b, true);
    ASSERT_EQ(b.layers.back().adam_m.size(), a.layers.back().adam_m.size());
    double worst = 0;
    for (size_t l = 0; l < a.layers.size(); ++l)
        for (size_t i = 0; i < a.layers[l].weights.size(); ++i)
            worst =
                std::max(worst, double(std::fabs(a.layers[l].weights[i] - b.layers[l].weights[i])));
    EXPECT_LT(worst, 0.02) << "10 steps of at most 0.01 each";
    EXPECT_GT(worst, 0.0) << "the roundings changed nothing";
    const layer_state& out = b.layers.back();
    bool moved = false;
    for (size_t i = 0; i < out.adam_m.size(); ++i) {
        ASSERT_EQ(cpu::bf16_to_float(cpu::float_to_bf16(out.adam_m[i])), out.adam_m[i]) << i;
        ASSERT_EQ(cpu::bf16_to_float(cpu::float_to_bf16(out.adam_v[i])), out.adam_v[i]) << i;
        moved = moved || out.adam_v[i] > 0;
    }
    EXPECT_TRUE(moved);
    // Checkpoints read the replica in place: its moments are widened there for them, and
    // dropped at the next step (the training after it is unchanged: see the CLI test).
    const model_state* held = bf16.host_state();
    ASSERT_NE(held, nullptr);
    EXPECT_TRUE(same_parameters(*held, b));
    ASSERT_EQ(held->layers.back().adam_m.size(), out.adam_m.size());
    EXPECT_TRUE(std::equal(out.adam_m.data(), out.adam_m.data() + out.adam_m.size(),
                           held->layers.back().adam_m.data()));
    cpu::cpu_backend resumed(initial, bf16_tc, 1);
    resumed.import_state(b, true);
    model_state c;
    resumed.export_state(c, true);
    EXPECT_TRUE(same_parameters(b, c));
    auto same = [](const aligned_floats& x, const aligned_floats& y) {
        return x.size() == y.size() && std::equal(x.data(), x.data() + x.size(), y.data());
    };
    EXPECT_TRUE(same(c.layers.back().adam_m, out.adam_m));
    EXPECT_TRUE(same(c.layers.back().adam_v, out.adam_v));
    EXPECT_TRUE(same(c.layers[0].adam_m, b.layers[0].adam_m));  // the input layer's: fp32
}

TEST(CpuBackend, Bf16MomentsRefuseCatchUpAdam) {
    train_config tc;
    tc.adam_moments = moment_storage::bf16;
    tc.adam = adam_mode::catch_up;
    try {
        validate(tc);
        FAIL() << "accepted";
    } catch (const hslide::error& e) {
        EXPECT_NE(std::string(e.what()).find("--adam-moments bf16"), std::string::npos) << e.what();
    }
}

TEST(CpuBackend, LargeBatchesGroupRowsInParallelWithTheSameResult) {
    // Batches with tens of thousands of (sample, row) entries: the update's row grouping then
    // splits the rows between threads, at a thread count that does not divide them evenly.
    model_config config = hslide::testing::two_layer_model(300, 32, 2999, sparsity_mode::lsh);
    config.layers[1].lsh = hslide::testing::make_lsh_config(hash_kind::dwta, 3, 8, 3);
    config.layers[1].active.min_active = 600;
    const uint64_t fewest =
        expect_thread_count_invariance(config, random_dataset(192, 300, 2999, 31), 64, 3, 2);
    EXPECT_GE(fewest, 64u * 600u);  // the parallel grouping's case
}

TEST(CpuBackend, AdamStepMatchesHandComputation) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    const dataset data = random_dataset(8, 20, 30, 31);
    const model_state initial = model_state::create(config, 31);
    train_config tc;
    tc.adam_beta1 = 0.8f;
    tc.adam_beta2 = 0.95f;
    tc.adam_epsilon = 1e-6f;
    const float lr = 0.05f;
    std::vector<uint32_t> rows = {0, 1, 2, 3}, rows2 = {4, 5, 6, 7};
    cpu::cpu_backend be(initial, tc, 1);
    // compute_gradient does not change the model, so the step that follows sees the same
    // active sets and the same gradient.
    model_state grad, grad2;
    be.compute_gradient({&data, rows.data(), 4}, grad);
    be.train_batch({&data, rows.data(), 4}, lr);
    // First step: m = (1-b1) g, v = (1-b2) g^2, m_hat = g, v_hat = g^2,
    // so w' = w - lr * g / (|g| + eps).
    const model_state after = be.model();  // a copy: be moves on below
    int moved = 0;
    for (size_t l = 0; l < config.layers.size(); ++l) {
        for (uint32_t r = 0; r < initial.layers[l].rows; ++r) {
            for (uint32_t i = 0; i < initial.layers[l].width; ++i) {
                const double g = grad.layers[l].row(r)[i];
                const double expected = initial.layers[l].row(r)[i] - lr * g / (std::abs(g) + 1e-6);
                ASSERT_NEAR(after.layers[l].row(r)[i], expected, 1e-6) << l << " " << r << " " << i;
                moved += g != 0.0;
            }
        }
    }
    EXPECT_GT(moved, 50);
    // Second step: the Adam recursion written out, for every weight of layer 0 column 0.
    be.compute_gradient({&data, rows2.data(), 4}, grad2);
    be.train_batch({&data, rows2.data(), 4}, lr);
    int both = 0;
    for (uint32_t r = 0; r < initial.layers[0].rows; ++r) {
        const double g1 = grad.layers[0].row(r)[0], g2 = grad2.layers[0].row(r)[0];
        const double m = 0.8 * (0.2 * g1) + 0.2 * g2;
        const double v = 0.95 * (0.05 * g1 * g1) + 0.05 * g2 * g2;
        // Sparse Adam: a row the second batch did not touch stays; a touched one moves even
        // when its gradient is zero (its momentum carries it).
        bool touched = false;
        for (uint32_t p : rows2) {
            const feature_row x = data.features(p);
            touched = touched || std::find(x.ids, x.ids + x.count, r) != x.ids + x.count;
        }
        double expected = after.layers[0].row(r)[0];
        if (touched) expected -= lr * (m / (1 - 0.64)) / (std::sqrt(v / (1 - 0.9025)) + 1e-6);
        EXPECT_NEAR(be.model().layers[0].row(r)[0], expected, 1e-6) << "row " << r;
        both += g1 != 0.0 && g2 != 0.0;
    }
    EXPECT_GT(both, 0);
}

TEST(CpuBackend, SparseAdamLeavesUntouchedRowsDenseAdamMovesThem) {
    // 200 outputs, so a sample's active set (at most L x capacity = 32 plus labels) leaves most
    // of them untouched.
    model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    config.layers.back().size = 200;
    const uint32_t out = uint32_t(config.layers.size() - 1);
    const dataset data = random_dataset(8, 20, 200, 41);
    const model_state initial = model_state::create(config, 41);
    std::vector<uint32_t> first = {0, 1}, second = {2};
    for (adam_mode mode : {adam_mode::sparse, adam_mode::dense, adam_mode::input_dense}) {
        SCOPED_TRACE(to_string(mode));
        train_config tc;
        tc.adam = mode;
        cpu::cpu_backend be(initial, tc, 1);
        be.train_batch({&data, first.data(), 2}, 0.01f);
        std::set<uint32_t> active_first;
        for (uint32_t s = 0; s < 2; ++s)
            for (uint32_t id : be.last_active(s, out)) active_first.insert(id);
        const model_state after_first = be.model();
        model_state grad;
        cpu::cpu_backend probe(after_first, tc, 1);
        probe.compute_gradient({&data, second.data(), 1}, grad);
        be.train_batch({&data, second.data(), 1}, 0.01f);
        // Input rows touched by the first batch only: gradient zero in the second. They
        // move with their momentum unless Adam is sparse on the input layer (whole rows are
        // compared: a hidden unit the first batch left at 0 gives its weight no momentum).
        const feature_row x0 = data.features(0);
        const layer_state &input_was = after_first.layers[0], &input_is = be.model().layers[0];
        int compared = 0;
        for (uint32_t k = 0; k < x0.count; ++k) {
            const uint32_t f = x0.ids[k];
            const float* g = grad.layers[0].row(f);
            if (std::any_of(g, g + input_was.width, [](float x) { return x != 0.0f; })) continue;
            const bool moved =
                !std::equal(input_was.row(f), input_was.row(f) + input_was.width, input_is.row(f));
            EXPECT_EQ(moved, mode != adam_mode::sparse) << "row " << f;
            ++compared;
        }
        EXPECT_GT(compared, 0);
        // Output rows active in the first batch only: only dense Adam moves them (whole rows
        // are compared: an input unit that was 0 leaves its weight's momentum at 0).
        const auto& active_second = be.last_active(0, out);
        const layer_state &was = after_first.layers[out], &is = be.model().layers[out];
        int compared_out = 0;
        for (uint32_t r : active_first) {
            if (std::count(active_second.begin(), active_second.end(), r)) continue;
            const bool moved = was.bias[r] != is.bias[r] ||
                               !std::equal(was.row(r), was.row(r) + was.width, is.row(r));
            EXPECT_EQ(moved, mode == adam_mode::dense) << "output row " << r;
            ++compared_out;
        }
        EXPECT_GT(compared_out, 0);
    }
}

/// Trains a fresh backend with Adam mode `mode` through `steps` batches of 4 and returns its
/// model as export_state gives it.
model_state train_with(const model_config& config, const dataset& data, adam_mode mode, int steps,
                       int threads = 1) {
    train_config tc;
    tc.adam = mode;
    cpu::cpu_backend be(model_state::create(config, 61), tc, threads);
    for (int t = 0; t < steps; ++t) {
        std::vector<uint32_t> rows;
        for (uint32_t i = 0; i < 4; ++i) rows.push_back(uint32_t(t * 4 + i) % data.size());
        be.train_batch({&data, rows.data(), 4}, 0.01f);
    }
    model_state out;
    be.export_state(out, true);
    return out;
}

TEST(CpuBackend, CatchUpAdamTrainsLikeDenseAdam) {
    // 300 input features, 2-6 a point, and 200 outputs of which a sample's LSH active set holds
    // a few dozen: most rows skip most of the 40 steps, then catch up when read (or at export).
    // The tables are never rebuilt, so the modes draw the same active sets, and the eager mode
    // is the reference: catch-up (every layer) must reach dense's model and input-catch-up
    // input-dense's, to float rounding (and epsilon's share, tiny here), where sparse Adam is
    // far from both.
    const std::pair<adam_mode, adam_mode> lazy_and_eager[] = {
        {adam_mode::catch_up, adam_mode::dense},
        {adam_mode::input_catch_up, adam_mode::input_dense}};
    // The last case gives the layers their own rates (layer_config::lr_scale): the catch-up's
    // displacement scales with the rate.
    for (int variant = 0; variant < 3; ++variant) {
        const sparsity_mode output = variant == 0 ? sparsity_mode::dense : sparsity_mode::lsh;
        SCOPED_TRACE(variant == 0   ? "dense output layer"
                     : variant == 1 ? "LSH output layer"
                                    : "LSH output layer, layers at 2, 1 and 0.25 x lr");
        model_config config = small_config(sparsity_mode::lsh, output);
        if (variant == 2) {
            config.layers[0].lr_scale = 2.0f;
            config.layers.back().lr_scale = 0.25f;
        }
        config.input_dim = 300;
        config.layers.back().size = 200;
        const dataset data = random_dataset(160, 300, 200, 62);
        const model_state sparse = train_with(config, data, adam_mode::sparse, 40);
        for (const auto& [lazy_mode, eager_mode] : lazy_and_eager) {
            SCOPED_TRACE(to_string(lazy_mode));
            const model_state eager = train_with(config, data, eager_mode, 40);
            const model_state lazy = train_with(config, data, lazy_mode, 40);
            // At most 1e-4 (1% of a step at lr 0.01), where a weight's gradients were ~1e-9
            // and epsilon is half of its steps (the closed form's one approximation), 1e-5
            // elsewhere; sparse Adam is 0.1 away.
            const double off = max_parameter_difference(lazy, eager);
            EXPECT_LT(off, 2e-4);
            EXPECT_GT(max_parameter_difference(sparse, eager), 300 * off);
            // The Adam moments too (export_state brought every row's up to date), against
            // the layer's largest: the gradients of the last steps differ as the weights do.
            for (size_t l = 0; l < eager.layers.size(); ++l) {
                const auto &m = lazy.layers[l].adam_m, &want = eager.layers[l].adam_m;
                double largest = 0, worst = 0;
                for (size_t i = 0; i < want.size(); ++i) {
                    largest = std::max(largest, double(std::abs(want[i])));
                    worst = std::max(worst, double(std::abs(m[i] - want[i])));
                }
                EXPECT_LT(worst, 1e-3 * largest) << "layer " << l;
            }
        }
    }
}

TEST(CpuBackend, CatchUpAdamBringsTheModelUpToDateBeforeReadingIt) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    const dataset data = random_dataset(64, 20, 30, 63);
    train_config tc;
    tc.adam = adam_mode::catch_up;
    cpu::cpu_backend be(model_state::create(config, 63), tc, 2);
    std::vector<uint32_t> rows = {0, 1, 2, 3}, later = {4, 5};
    be.train_batch({&data, rows.data(), 4}, 0.01f);
    be.train_batch({&data, later.data(), 2}, 0.01f);
    // Rows of the first batch only are behind until something reads the model.
    const model_state raw = be.model();
    row_sets changed;
    ASSERT_TRUE(be.take_changed_rows(changed));
    const model_state* held = be.host_state();
    EXPECT_GT(max_parameter_difference(raw, *held), 0.0);
    // The rows it moved are changes, for row-sparse merges.
    ASSERT_TRUE(be.take_changed_rows(changed));
    size_t moved = 0;
    for (const auto& layer_rows : changed) moved += layer_rows.size();
    EXPECT_GT(moved, 0u);
    // Up to date now: exporting or predicting changes nothing more.
    model_state exported;
    be.export_state(exported, true);
    EXPECT_EQ(max_parameter_difference(exported, *held), 0.0);
    std::vector<uint32_t> labels(4 * 3);
    std::vector<float> scores(4 * 3);
    be.predict({&data, rows.data(), 4}, 3, scoring_mode::exact, labels.data(), scores.data());
    EXPECT_EQ(max_parameter_difference(be.model(), exported), 0.0);
}

TEST(CpuBackend, SwapParametersExchangesTheWeightsAsAnExportAndAnImportWould) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    const dataset data = random_dataset(64, 20, 30, 64);
    train_config tc;
    tc.adam = adam_mode::catch_up;  // rows left behind, which the swap must bring up to date
    const auto& k = cpu::best_kernels();
    cpu::cpu_backend be(model_state::create(config, 64), tc, 2, k, precision_mode::bf16);
    cpu::cpu_backend twin(model_state::create(config, 64), tc, 2, k, precision_mode::bf16);
    std::vector<uint32_t> rows = {0, 1, 2, 3}, later = {4, 5};
    for (cpu::cpu_backend* b : {&be, &twin}) {
        b->train_batch({&data, rows.data(), 4}, 0.01f);
        b->train_batch({&data, later.data(), 2}, 0.01f);
    }
    model_state trained;
    twin.export_state(trained, /*with_optimizer=*/false);
    const model_state other_before = model_state::create(config, 77).parameters();
    model_state other = other_before;

    ASSERT_TRUE(be.swap_parameters(other));
    EXPECT_TRUE(same_parameters(other, trained)) << "the swap hands out every row up to date";
    EXPECT_TRUE(same_parameters(be.model(), other_before));
    // Its derived copies follow (bf16 rows for exact scoring): it predicts as a replica that
    // imported the same weights.
    cpu::cpu_backend imported(model_state::create(config, 64), tc, 1, k, precision_mode::bf16);
    imported.import_state(other_before, /*with_optimizer=*/false);
    const uint32_t top = 3;
    std::vector<uint32_t> all(64), l1(64 * top), l2(64 * top);
    std::iota(all.begin(), all.end(), 0u);
    std::vector<float> s1(64 * top), s2(64 * top);
    be.predict({&data, all.data(), 64}, top, scoring_mode::exact, l1.data(), s1.data());
    imported.predict({&data, all.data(), 64}, top, scoring_mode::exact, l2.data(), s2.data());
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(s1, s2);

    ASSERT_TRUE(be.swap_parameters(other));
    EXPECT_TRUE(same_parameters(be.model(), trained));
    EXPECT_TRUE(same_parameters(other, other_before));
    model_state wrong = model_state::create(config, 5).parameters();
    wrong.layers.pop_back();
    EXPECT_THROW(be.swap_parameters(wrong), error);
}

TEST(CpuBackend, ExportImportRoundTripAndPredict) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::dense);
    const dataset data = random_dataset(64, 20, 30, 51);
    train_config tc;
    cpu::cpu_backend be(model_state::create(config, 51), tc, 2);
    std::vector<uint32_t> rows(64);
    std::iota(rows.begin(), rows.end(), 0u);
    for (int e = 0; e < 30; ++e)
        for (uint32_t b = 0; b < 64; b += 16) be.train_batch({&data, rows.data() + b, 16}, 0.02f);
    model_state state;
    be.export_state(state, true);
    cpu::cpu_backend copy(model_state::create(config, 99), tc, 1);
    copy.import_state(state, true);
    const uint32_t k = 5;
    std::vector<uint32_t> l1(64 * k), l2(64 * k);
    std::vector<float> s1(64 * k), s2(64 * k);
    be.predict({&data, rows.data(), 64}, k, scoring_mode::exact, l1.data(), s1.data());
    copy.predict({&data, rows.data(), 64}, k, scoring_mode::exact, l2.data(), s2.data());
    EXPECT_EQ(l1, l2);
    EXPECT_EQ(s1, s2);
    // Scores come best first, and after 30 epochs on 64 points the top label is mostly a true
    // label (more than 56 of 64 with sparse Adam, 56 with the default input-catch-up).
    int hits = 0;
    for (uint32_t s = 0; s < 64; ++s) {
        for (uint32_t i = 1; i < k; ++i) EXPECT_GE(s1[s * k + i - 1], s1[s * k + i]);
        const label_row y = data.labels(s);
        hits += std::find(y.ids, y.ids + y.count, l1[s * k]) != y.ids + y.count;
    }
    EXPECT_GT(hits, 52);
}

TEST(CpuBackend, ExportsIntoTheSameSnapshotKeepItsBuffersAndFollowTheModel) {
    // --epochs auto exports the best epoch's model into one snapshot every epoch: the
    // snapshot's blocks are reused, and each export still holds the model of its moment,
    // with the moments or (without the optimizer) none of them.
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::dense);
    const dataset data = random_dataset(48, 20, 30, 52);
    train_config tc;
    cpu::cpu_backend be(model_state::create(config, 52), tc, 2);
    std::vector<uint32_t> rows(48);
    std::iota(rows.begin(), rows.end(), 0u);
    model_state snapshot;
    be.export_state(snapshot, true);
    std::vector<const float*> blocks;
    for (const layer_state& layer : snapshot.layers)
        for (const aligned_floats* a : {&layer.weights, &layer.adam_m, &layer.adam_v})
            blocks.push_back(a->data());
    for (int e = 0; e < 2; ++e) {
        for (uint32_t b = 0; b < 48; b += 16) be.train_batch({&data, rows.data() + b, 16}, 0.02f);
        be.export_state(snapshot, true);
        model_state fresh;
        be.export_state(fresh, true);
        size_t i = 0;
        for (size_t l = 0; l < snapshot.layers.size(); ++l) {
            const layer_state& got = snapshot.layers[l];
            const layer_state& want = fresh.layers[l];
            for (auto [a, b] :
                 {std::pair{&got.weights, &want.weights}, std::pair{&got.adam_m, &want.adam_m},
                  std::pair{&got.adam_v, &want.adam_v}}) {
                EXPECT_EQ(a->data(), blocks[i++]) << "layer " << l << ": a new block";
                ASSERT_EQ(a->size(), b->size());
                EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0)
                    << "layer " << l;
            }
            EXPECT_EQ(got.bias, want.bias);
            EXPECT_EQ(got.bias_m, want.bias_m);
        }
        EXPECT_EQ(snapshot.adam_step, fresh.adam_step);
    }
    // Without the optimizer: the parameters() copy, moments dropped; the weights' block kept.
    const float* weights_block = snapshot.layers[0].weights.data();
    be.export_state(snapshot, false);
    const model_state parameters = [&] {
        model_state full;
        be.export_state(full, true);
        return full.parameters();
    }();
    EXPECT_EQ(snapshot.layers[0].weights.data(), weights_block);
    for (size_t l = 0; l < snapshot.layers.size(); ++l) {
        const layer_state& got = snapshot.layers[l];
        EXPECT_EQ(got.adam_m.size(), 0u);
        EXPECT_EQ(got.adam_v.size(), 0u);
        EXPECT_TRUE(got.bias_m.empty() && got.bias_v.empty());
        ASSERT_EQ(got.weights.size(), parameters.layers[l].weights.size());
        EXPECT_EQ(std::memcmp(got.weights.data(), parameters.layers[l].weights.data(),
                              got.weights.size() * sizeof(float)),
                  0);
        EXPECT_EQ(got.bias, parameters.layers[l].bias);
    }
    EXPECT_EQ(snapshot.adam_step, parameters.adam_step);
}

/// A dense model of `labels` labels (hidden 33) over 96 random points, trained 3 epochs in
/// batches of 32, on each CPU level this machine runs: check(backend, its kernels, the 96
/// points), for the tests of the scoring modes.
template <class Check>
void for_each_trained_level(uint32_t labels, uint64_t seed, Check check) {
    model_config config = small_config(sparsity_mode::dense, sparsity_mode::dense);
    config.layers[0].size = 33;
    config.layers.back().size = labels;
    const dataset data = random_dataset(96, 20, labels, seed);
    std::vector<uint32_t> rows(96);
    std::iota(rows.begin(), rows.end(), 0u);
    for (const isa_level level : {isa_level::scalar, isa_level::avx2, isa_level::avx512,
                                  isa_level::avx512bf16, isa_level::amx}) {
        if (!isa_supported(level)) continue;
        SCOPED_TRACE(to_string(level));
        const cpu::kernel_table& kernels = cpu::kernels_for(level);
        cpu::cpu_backend be(model_state::create(config, seed), train_config{}, 2, kernels);
        for (int e = 0; e < 3; ++e)
            for (uint32_t b = 0; b < 96; b += 32)
                be.train_batch({&data, rows.data() + b, 32}, 0.01f);
        check(be, kernels, batch_view{&data, rows.data(), 96});
    }
}

TEST(CpuBackend, ExactBf16ScoringIsExactScoringInBf16Products) {
    // exact-bf16 (and so exact-fast, the hold-out's scoring under --epochs auto, where the
    // search is not int8): on a level with bf16 products (the scalar reference's included),
    // each returned score is the label's exact score within bf16's rounding of rows and inputs
    // (8 significant bits each; logits up to ~2 here, errors up to 0.003 measured: tolerance
    // 0.01), the top label's exact score is within twice that of the best, and the top label
    // is the exact one for 90% of the points and more; on the others (AVX2, AVX-512 without
    // BF16) it is exact scoring, bit for bit.
    for_each_trained_level(
        300, 61,
        [](cpu::cpu_backend& be, const cpu::kernel_table& kernels, const batch_view& points) {
            const uint32_t n = 96, all = 300, k = 5;
            std::vector<uint32_t> exact(n * all), fast(n * k);
            std::vector<float> exact_scores(n * all), fast_scores(n * k);
            be.predict(points, all, scoring_mode::exact, exact.data(), exact_scores.data());
            be.predict(points, k, scoring_mode::exact_bf16, fast.data(), fast_scores.data());
            if (!kernels.dots16_bf16) {
                for (uint32_t p = 0; p < n; ++p)
                    for (uint32_t i = 0; i < k; ++i) {
                        EXPECT_EQ(fast[p * k + i], exact[p * all + i]);
                        EXPECT_EQ(fast_scores[p * k + i], exact_scores[p * all + i]);
                    }
                return;
            }
            constexpr float tolerance = 0.01f;
            uint32_t same_top = 0;
            for (uint32_t p = 0; p < n; ++p) {
                std::vector<float> exact_of(all, 0.0f);
                for (uint32_t i = 0; i < all; ++i)
                    exact_of[exact[p * all + i]] = exact_scores[p * all + i];
                for (uint32_t i = 0; i < k; ++i)
                    EXPECT_NEAR(fast_scores[p * k + i], exact_of[fast[p * k + i]], tolerance)
                        << "point " << p << " rank " << i;
                EXPECT_GE(exact_of[fast[p * k]], exact_scores[p * all] - 2 * tolerance) << p;
                same_top += fast[p * k] == exact[p * all];
            }
            EXPECT_GT(same_top, n * 9 / 10);
        });
}

TEST(CpuBackend, ExactFastScoringReScoresInt8CandidatesInFp32) {
    // exact-fast (the hold-out's scoring under --epochs auto): on kernels whose exact search
    // scores int8, each returned score is the fp32 score of its label (active_dots sums in
    // another order than exact scoring's tiles: 1e-4 here), the labels are the exact top k for
    // 95% of the points and more (the int8 candidates may miss a near-tie), and no returned
    // label is worse than the exact k-th by more than the int8 rounding can explain; on the
    // others it is exact-bf16's scoring, bit for bit (ExactBf16ScoringIsExactScoringInBf16Products
    // holds that to exact scoring). 301 labels: not a whole number of 16-row blocks; k 5 and 20
    // (16 and 40 candidates).
    for_each_trained_level(
        301, 67,
        [](cpu::cpu_backend& be, const cpu::kernel_table& kernels, const batch_view& points) {
            const uint32_t n = 96, all = 301;
            std::vector<uint32_t> exact(n * all);
            std::vector<float> exact_scores(n * all);
            be.predict(points, all, scoring_mode::exact, exact.data(), exact_scores.data());
            for (const uint32_t k : {5u, 20u}) {
                std::vector<uint32_t> fast(n * k), bf16(n * k);
                std::vector<float> fast_scores(n * k), bf16_scores(n * k);
                be.predict(points, k, scoring_mode::exact_fast, fast.data(), fast_scores.data());
                if (!cpu::searches_int8_copy(kernels)) {
                    be.predict(points, k, scoring_mode::exact_bf16, bf16.data(),
                               bf16_scores.data());
                    EXPECT_EQ(fast, bf16);
                    EXPECT_EQ(fast_scores, bf16_scores);
                    continue;
                }
                uint32_t same = 0;
                for (uint32_t p = 0; p < n; ++p) {
                    std::vector<float> exact_of(all, 0.0f);
                    for (uint32_t i = 0; i < all; ++i)
                        exact_of[exact[p * all + i]] = exact_scores[p * all + i];
                    bool all_same = true;
                    for (uint32_t i = 0; i < k; ++i) {
                        const uint32_t label = fast[p * k + i];
                        ASSERT_LT(label, all) << "point " << p << " rank " << i;
                        EXPECT_NEAR(fast_scores[p * k + i], exact_of[label], 1e-4f)
                            << "point " << p << " rank " << i;
                        if (i > 0) EXPECT_GE(fast_scores[p * k + i - 1], fast_scores[p * k + i]);
                        // Logits here are ~1: the queries' bytes (4 bits on avx2, 8 with VNNI)
                        // and int8 rows err by a few hundredths of that at most.
                        EXPECT_GE(exact_of[label], exact_scores[p * all + k - 1] - 0.05f)
                            << "point " << p << " rank " << i;
                        all_same = all_same && label == exact[p * all + i];
                    }
                    same += all_same;
                }
                EXPECT_GE(same, n * 95 / 100) << "k " << k;
            }
        });
}

TEST(CpuBackend, Bf16TrainsLikeFp32AndImportRefreshesItsCopy) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::dense);
    const dataset data = random_dataset(64, 20, 30, 52);
    train_config tc;
    const auto& k = cpu::best_kernels();
    const uint32_t n = 64, top = 3;
    std::vector<uint32_t> rows(n);
    std::iota(rows.begin(), rows.end(), 0u);
    // Top-1 hits on the training points after 30 epochs.
    auto train_and_count = [&](cpu::cpu_backend& be, std::vector<uint32_t>& labels,
                               std::vector<float>& scores) {
        for (int e = 0; e < 30; ++e)
            for (uint32_t b = 0; b < n; b += 16)
                be.train_batch({&data, rows.data() + b, 16}, 0.02f);
        labels.resize(n * top);
        scores.resize(n * top);
        be.predict({&data, rows.data(), n}, top, scoring_mode::exact, labels.data(), scores.data());
        int hits = 0;
        for (uint32_t s = 0; s < n; ++s) {
            const label_row y = data.labels(s);
            hits += std::find(y.ids, y.ids + y.count, labels[s * top]) != y.ids + y.count;
        }
        return hits;
    };
    cpu::cpu_backend be32(model_state::create(config, 52), tc, 2, k, precision_mode::fp32);
    cpu::cpu_backend be16(model_state::create(config, 52), tc, 2, k, precision_mode::bf16);
    EXPECT_EQ(be16.info().precision, "bf16");
    std::vector<uint32_t> l32, l16;
    std::vector<float> s32, s16;
    const int hits32 = train_and_count(be32, l32, s32);
    const int hits16 = train_and_count(be16, l16, s16);
    // Widths of 10-12 leave bf16's rounding little room to average out: a few points of 64.
    EXPECT_GT(hits32, 50);
    EXPECT_GT(hits16, 50);
    EXPECT_NEAR(hits16, hits32, 6);

    model_state state;
    be16.export_state(state, true);
    // A differently initialised replica: its bf16 weights must be re-rounded from the import.
    cpu::cpu_backend copy(model_state::create(config, 98), tc, 1, k, precision_mode::bf16);
    copy.import_state(state, true);
    std::vector<uint32_t> l2(n * top);
    std::vector<float> s2(n * top);
    copy.predict({&data, rows.data(), n}, top, scoring_mode::exact, l2.data(), s2.data());
    EXPECT_EQ(l16, l2);
    EXPECT_EQ(s16, s2);
}

TEST(CpuBackend, LshScoringRanksASubsetWithTheExactScores) {
    const model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    const dataset data = random_dataset(40, 20, 30, 61);
    train_config tc;
    cpu::cpu_backend be(model_state::create(config, 61), tc, 2);
    std::vector<uint32_t> rows(40);
    std::iota(rows.begin(), rows.end(), 0u);
    for (int e = 0; e < 10; ++e)
        for (uint32_t b = 0; b < 40; b += 8) be.train_batch({&data, rows.data() + b, 8}, 0.02f);
    const uint32_t k = 30;  // every label: the exact ranking is complete
    std::vector<uint32_t> exact_labels(40 * k), lsh_labels(40 * k);
    std::vector<float> exact_scores(40 * k), lsh_scores(40 * k);
    be.predict({&data, rows.data(), 40}, k, scoring_mode::exact, exact_labels.data(),
               exact_scores.data());
    be.predict({&data, rows.data(), 40}, k, scoring_mode::lsh, lsh_labels.data(),
               lsh_scores.data());
    int padded = 0;
    for (uint32_t s = 0; s < 40; ++s) {
        std::vector<float> logit(30, 0.0f);
        for (uint32_t i = 0; i < k; ++i) {
            ASSERT_LT(exact_labels[s * k + i], 30u);
            logit[exact_labels[s * k + i]] = exact_scores[s * k + i];
        }
        // LSH scoring computes a subset of the logits: the same values, never more than
        // the exact maximum, padded when the active set is smaller than k.
        for (uint32_t i = 0; i < k; ++i) {
            const uint32_t label = lsh_labels[s * k + i];
            if (label == UINT32_MAX) {
                ++padded;
                EXPECT_EQ(lsh_scores[s * k + i], -std::numeric_limits<float>::infinity());
                continue;
            }
            EXPECT_NEAR(lsh_scores[s * k + i], logit[label], 1e-5f) << "point " << s;
        }
        EXPECT_LE(lsh_scores[s * k], exact_scores[s * k] + 1e-5f);
    }
    EXPECT_GT(padded, 0) << "the LSH active sets (min 8 of 30) should leave some slots empty";
}

TEST(CpuBackend, BlockedExactScoringMatchesScoringEveryNeuronPerPoint) {
    // Exact scoring runs blocks of output rows against chunks of points. An LSH output layer
    // whose fill makes every neuron active scores every row per point with the per-point
    // kernel: the two must agree on every score (within float rounding: the blocked products,
    // dots16 and dots16_bf16, sum in another order; bit for bit where bf16 has no dots16_bf16
    // and the per-point kernel serves both) and
    // on the labels wherever no near-tie makes the order a matter of rounding. 20,000 output
    // rows (three row blocks of 512 KiB at this width, the last partial) and 300 points (two
    // chunks of 256, the second not a multiple of 16); k from 1 to past the layer size; 1 and 3
    // threads.
    model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    config.layers.back().size = 20000;
    config.layers.back().active.min_active = 20000;
    const dataset data = random_dataset(300, 20, 20000, 62);
    std::vector<uint32_t> rows(300);
    std::iota(rows.begin(), rows.end(), 0u);
    for (const precision_mode precision : {precision_mode::fp32, precision_mode::bf16}) {
        // bf16 on a level without dots16_bf16 scores with the per-point kernel itself.
        const bool same_kernel =
            precision == precision_mode::bf16 && !cpu::best_kernels().dots16_bf16;
        for (const int threads : {1, 3}) {
            train_config tc;
            cpu::cpu_backend be(model_state::create(config, 62), tc, threads, cpu::best_kernels(),
                                precision);
            for (uint32_t b = 0; b < 300; b += 50)
                be.train_batch({&data, rows.data() + b, 50}, 0.01f);
            for (const uint32_t k : {1u, 5u, 20001u}) {
                SCOPED_TRACE("precision " + std::string(to_string(precision)) + ", threads " +
                             std::to_string(threads) + ", k " + std::to_string(k));
                const uint32_t n = k > 20000 ? 8 : 300;  // a full ranking costs O(rows log k)
                std::vector<uint32_t> blocked_labels(n * k), every_labels(n * k);
                std::vector<float> blocked_scores(n * k), every_scores(n * k);
                be.predict({&data, rows.data(), n}, k, scoring_mode::exact, blocked_labels.data(),
                           blocked_scores.data());
                be.predict({&data, rows.data(), n}, k, scoring_mode::lsh, every_labels.data(),
                           every_scores.data());
                const float tol = same_kernel ? 0.0f : 1e-5f;
                for (uint32_t s = 0; s < n; ++s)
                    for (uint32_t i = 0; i < k; ++i) {
                        const size_t at = size_t(s) * k + i;
                        if (i >= 20000) {  // past the layer: padding in both
                            ASSERT_EQ(blocked_labels[at], UINT32_MAX);
                            ASSERT_EQ(every_labels[at], UINT32_MAX);
                            continue;
                        }
                        ASSERT_NEAR(blocked_scores[at], every_scores[at], tol)
                            << "point " << s << " rank " << i;
                        // A rank's label is fixed unless a neighbour's score is within 2 tol.
                        const bool near_tie =
                            (i > 0 && every_scores[at - 1] - every_scores[at] <= 2 * tol) ||
                            (i + 1 < std::min(k, 20000u) &&
                             every_scores[at] - every_scores[at + 1] <= 2 * tol);
                        if (same_kernel || !near_tie)
                            ASSERT_EQ(blocked_labels[at], every_labels[at])
                                << "point " << s << " rank " << i;
                    }
            }
        }
    }
}

TEST(CpuBackend, MultiProbeScoringScoresASupersetOfTheSingleProbeSet) {
    // No random fill, so an LSH prediction scores exactly the union of the point's buckets:
    // with probes, every label scored without them is scored too (with the same value), and
    // some points gain labels.
    model_config config = small_config(sparsity_mode::dense, sparsity_mode::lsh);
    config.layers.back().active.min_active = 0;
    const dataset data = random_dataset(60, 20, 30, 63);
    std::vector<uint32_t> rows(60);
    std::iota(rows.begin(), rows.end(), 0u);
    train_config tc;
    const model_state initial = model_state::create(config, 63);
    cpu::cpu_backend plain(initial, tc, 2);
    config.layers.back().active.probes = 2;
    model_state probing_state = initial;
    probing_state.config = config;
    cpu::cpu_backend probing(probing_state, tc, 2);
    const uint32_t k = 30;
    std::vector<uint32_t> l0(60 * k), l2(60 * k);
    std::vector<float> s0(60 * k), s2(60 * k);
    plain.predict({&data, rows.data(), 60}, k, scoring_mode::lsh, l0.data(), s0.data());
    probing.predict({&data, rows.data(), 60}, k, scoring_mode::lsh, l2.data(), s2.data());
    int gained = 0;
    for (uint32_t s = 0; s < 60; ++s) {
        std::map<uint32_t, float> with_probes;
        for (uint32_t i = 0; i < k; ++i)
            if (l2[s * k + i] != UINT32_MAX) with_probes[l2[s * k + i]] = s2[s * k + i];
        size_t without = 0;
        for (uint32_t i = 0; i < k; ++i) {
            const uint32_t label = l0[s * k + i];
            if (label == UINT32_MAX) continue;
            ++without;
            ASSERT_TRUE(with_probes.count(label)) << "point " << s << " lost label " << label;
            EXPECT_EQ(with_probes[label], s0[s * k + i]);
        }
        gained += with_probes.size() > without;
    }
    EXPECT_GT(gained, 0) << "probes found no extra label for any point";
}

TEST(CpuBackend, TheExactSearchsCopyFollowsEveryUpdatedRow) {
    // An automatic exact search scores a copy of the output rows, int8 where the kernels have
    // 8-bit products (avx2 up) and bf16 where they have bf16 products otherwise, which the update
    // writes as it changes each row (rows changed by other means, an import, are marked and
    // rounded before the next search). After training with sparse, dense (every row moves) and
    // input-catch-up Adam, every row of the copy is the rounding of the model's row: bf16 by
    // float_to_bf16, int8 by the scalar reference's to_int8_row (values, scale and sum).
    const std::vector<isa_level> levels = hslide::testing::copy_search_levels();
    if (levels.empty())
        GTEST_SKIP() << "this CPU's exact search scores no copy (best: "
                     << to_string(detected_isa()) << ")";
    const dataset data = random_dataset(64, 20, 500, 31);
    std::vector<uint32_t> rows(64);
    std::iota(rows.begin(), rows.end(), 0u);
    for (isa_level level : levels)
        for (bool int8 : {false, true}) {
            // The bf16 copy on a level with 8-bit products: its table without them.
            cpu::kernel_table k = cpu::kernels_for(level);
            if (int8 && !cpu_exact_search_in_int8(level)) continue;
            if (!int8 && !cpu_exact_search_in_bf16(level)) continue;
            if (!int8) k.dots16_u8s8 = nullptr;
            for (adam_mode adam :
                 {adam_mode::sparse, adam_mode::dense, adam_mode::input_catch_up}) {
                SCOPED_TRACE(std::string(to_string(level)) + ", " + to_string(adam) +
                             (int8 ? ", int8" : ", bf16"));
                model_config config = small_config(sparsity_mode::dense, sparsity_mode::topk);
                config.layers.back().size = 500;
                config.layers.back().active.min_active = 40;
                config.layers.back().top_k = 8;
                config.layers.back().search = top_k_search::automatic;
                train_config tc;
                tc.adam = adam;
                cpu::cpu_backend be(model_state::create(config, 7), tc, 2, k);
                for (uint32_t b = 0; b < 64; b += 16)
                    be.train_batch({&data, rows.data() + b, 16}, 0.02f);
                const size_t out = config.layers.size() - 1;
                auto* search = dynamic_cast<cpu::exact_top_k*>(
                    &const_cast<cpu::neuron_selector&>(be.selection(out)));
                ASSERT_NE(search, nullptr);
                ASSERT_EQ(search->scores_int8_copy(), int8);
                ASSERT_EQ(search->scores_bf16_copy(), !int8);
                model_state now;
                be.export_state(now, false);
                // A search rounds the rows marked since the last one.
                const layer_state& layer = now.layers[out];
                std::vector<float> query(layer.width, 0.5f);
                const float* q = query.data();
                uint32_t label;
                float score;
                search->search(&q, 1, 1, &label, &score, nullptr);
                const cpu::neuron_selector::search_copy copy = search->writable_search_copy();
                std::vector<int8_t> want8(layer.width);
                for (uint32_t r = 0; r < layer.rows; ++r) {
                    if (int8) {
                        ASSERT_TRUE(copy.rows8);
                        int32_t sum = 0;
                        const float scale = cpu::to_int8_row_reference(layer.row(r), want8.data(),
                                                                       layer.width, &sum);
                        ASSERT_EQ(copy.rows8.scale[r], scale) << "row " << r;
                        ASSERT_EQ(copy.rows8.sum[r], sum) << "row " << r;
                        for (uint32_t i = 0; i < layer.width; ++i)
                            ASSERT_EQ(copy.rows8.row(r)[i], want8[i])
                                << "row " << r << ", element " << i;
                        continue;
                    }
                    ASSERT_NE(copy.rows16, nullptr);
                    for (uint32_t i = 0; i < layer.width; ++i)
                        ASSERT_EQ(copy.rows16[r * copy.stride16 + i],
                                  cpu::float_to_bf16(layer.row(r)[i]))
                            << "row " << r << ", element " << i;
                }
            }
        }
}
