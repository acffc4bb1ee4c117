// Tests of the dense baseline backend (`cpu-dense`): its gradient against finite differences of
// an independent double-precision reference, training steps against the CPU backend with every
// layer dense, exact top-k against brute force, export/import, the command line, and the
// rejection of bf16.
#include "cpu/cpu_backend.hpp"
#include "cpu/dense_backend.hpp"
#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <vector>

using namespace hslide;
using hslide::testing::random_dataset;
using hslide::testing::run_hslide;
using hslide::testing::temp_dir;

namespace {

/// input 20 -> 12 -> 10 -> `outputs`, every layer dense.
model_config dense_config(uint32_t outputs = 30) {
    model_config c;
    c.input_dim = 20;
    layer_config l;
    l.sparsity = sparsity_mode::dense;
    for (uint32_t size : {12u, 10u, outputs}) {
        l.size = size;
        c.layers.push_back(l);
    }
    return c;
}

/// The batch-mean loss from the definition, in double: ReLU hidden layers, softmax over every
/// output neuron, target 1/|y| on each label (or, `logistic`, a binary cross-entropy per output
/// neuron, target 1 on each label); points without labels add 0 but count.
struct reference_net {
    std::vector<std::vector<double>> w, b;  // w[l][row * width + i]
    std::vector<uint32_t> rows, width;
    bool logistic = false;

    explicit reference_net(const model_state& m, bool logistic_loss = false)
        : logistic(logistic_loss) {
        for (const auto& layer : m.layers) {
            std::vector<double> wl(size_t(layer.rows) * layer.width);
            for (uint32_t r = 0; r < layer.rows; ++r)
                for (uint32_t i = 0; i < layer.width; ++i)
                    wl[size_t(r) * layer.width + i] = layer.row(r)[i];
            w.push_back(std::move(wl));
            b.emplace_back(layer.bias.begin(), layer.bias.end());
            rows.push_back(layer.rows);
            width.push_back(layer.width);
        }
    }

    /// The output logits of one point.
    std::vector<double> logits(const dataset& d, uint32_t point) const {
        const feature_row x = d.features(point);
        std::vector<double> a(width[0]);
        for (uint32_t j = 0; j < width[0]; ++j) {
            double z = b[0][j];
            for (uint32_t k = 0; k < x.count; ++k)
                z += x.values[k] * w[0][size_t(x.ids[k]) * width[0] + j];
            a[j] = std::max(0.0, z);
        }
        for (size_t l = 1; l < w.size(); ++l) {
            std::vector<double> z(rows[l]);
            for (uint32_t j = 0; j < rows[l]; ++j) {
                double sum = b[l][j];
                for (uint32_t i = 0; i < width[l]; ++i)
                    sum += w[l][size_t(j) * width[l] + i] * a[i];
                z[j] = l + 1 < w.size() ? std::max(0.0, sum) : sum;
            }
            a = std::move(z);
        }
        return a;
    }

    double loss(const dataset& d, const std::vector<uint32_t>& points) const {
        double total = 0;
        for (uint32_t p : points) {
            const label_row y = d.labels(p);
            if (y.count == 0) continue;
            const std::vector<double> z = logits(d, p);
            if (logistic) {
                for (uint32_t j = 0; j < z.size(); ++j) {
                    const bool label = std::find(y.ids, y.ids + y.count, j) != y.ids + y.count;
                    const double sigmoid = 1.0 / (1.0 + std::exp(-z[j]));
                    total -= std::log(label ? sigmoid : 1.0 - sigmoid);
                }
                continue;
            }
            const double m = *std::max_element(z.begin(), z.end());
            double sum = 0;
            for (double v : z) sum += std::exp(v - m);
            const double log_sum = std::log(sum) + m;
            for (uint32_t k = 0; k < y.count; ++k) total -= (z[y.ids[k]] - log_sum) / y.count;
        }
        return total / double(points.size());
    }
};

std::vector<uint32_t> iota_rows(size_t n) {
    std::vector<uint32_t> rows(n);
    std::iota(rows.begin(), rows.end(), 0u);
    return rows;
}

/// |a - b| / (|b| + floor) over every weight and bias of two models of one shape: the largest
/// and the fraction above `threshold`.
struct model_difference {
    double max = 0, fraction_above = 0;
};
model_difference relative_difference(const model_state& a, const model_state& b, double floor,
                                     double threshold = 1e-4) {
    model_difference d;
    size_t n = 0, above = 0;
    auto add = [&](double x, double y) {
        const double r = std::abs(x - y) / (std::abs(y) + floor);
        d.max = std::max(d.max, r);
        above += r > threshold;
        ++n;
    };
    for (size_t l = 0; l < a.layers.size(); ++l) {
        const layer_state& x = a.layers[l];
        const layer_state& y = b.layers[l];
        for (uint32_t r = 0; r < x.rows; ++r)
            for (uint32_t i = 0; i < x.width; ++i) add(x.row(r)[i], y.row(r)[i]);
        for (size_t j = 0; j < x.bias.size(); ++j) add(x.bias[j], y.bias[j]);
    }
    d.fraction_above = double(above) / double(n);
    return d;
}

bool same_state(const model_state& a, const model_state& b) {
    if (a.layers.size() != b.layers.size() || a.adam_step != b.adam_step) return false;
    for (size_t l = 0; l < a.layers.size(); ++l) {
        const auto& x = a.layers[l];
        const auto& y = b.layers[l];
        auto same = [](const aligned_floats& p, const aligned_floats& q) {
            return p.size() == q.size() &&
                   (p.size() == 0 || std::memcmp(p.data(), q.data(), p.size() * 4) == 0);
        };
        if (!same(x.weights, y.weights) || !same(x.adam_m, y.adam_m) || !same(x.adam_v, y.adam_v) ||
            x.bias != y.bias || x.bias_m != y.bias_m || x.bias_v != y.bias_v)
            return false;
    }
    return true;
}

}  // namespace

class DenseBackendGradient : public ::testing::TestWithParam<output_loss> {};

TEST_P(DenseBackendGradient, EveryLayerMatchesFiniteDifferences) {
    const model_config config = dense_config();
    const dataset data = random_dataset(40, 20, 30, 101, 7);
    train_config tc;
    tc.loss = GetParam();
    cpu::dense_backend be(model_state::create(config, 101), tc, 2);
    // A few steps first, so weights, biases and ReLU patterns are not at their initial values.
    const std::vector<uint32_t> all = iota_rows(data.size());
    for (int step = 0; step < 3; ++step) be.train_batch({&data, all.data() + step * 8, 8}, 0.01f);

    const std::vector<uint32_t> rows = {3, 17, 25, 31, 6, 12};  // 6 has no labels
    ASSERT_EQ(data.labels(6).count, 0u);
    model_state grad;
    const double loss = be.compute_gradient({&data, rows.data(), uint32_t(rows.size())}, grad);
    reference_net ref(be.model(), tc.loss == output_loss::logistic);
    // fp32 forward against the double reference.
    EXPECT_NEAR(ref.loss(data, rows), loss, 1e-5 * std::max(1.0, std::abs(loss)));

    // Central differences of the double reference, on every weight and bias of every layer
    // (the network is tiny): |analytic - numeric| <= 2e-4 + 2e-3 |numeric|, the fp32
    // gradient's rounding plus the O(eps^2) truncation of the differences.
    const double eps = 1e-5;
    auto numeric = [&](double& param) {
        const double saved = param;
        param = saved + eps;
        const double up = ref.loss(data, rows);
        param = saved - eps;
        const double down = ref.loss(data, rows);
        param = saved;
        return (up - down) / (2 * eps);
    };
    for (size_t l = 0; l < config.layers.size(); ++l) {
        const layer_state& g = grad.layers[l];
        int nonzero = 0;
        for (uint32_t r = 0; r < g.rows; ++r) {
            for (uint32_t i = 0; i < g.width; ++i) {
                const double n = numeric(ref.w[l][size_t(r) * g.width + i]);
                ASSERT_NEAR(g.row(r)[i], n, 2e-4 + 2e-3 * std::abs(n))
                    << "layer " << l << " row " << r << " col " << i;
                nonzero += g.row(r)[i] != 0.0f;
            }
        }
        for (size_t j = 0; j < g.bias.size(); ++j) {
            const double n = numeric(ref.b[l][j]);
            ASSERT_NEAR(g.bias[j], n, 2e-4 + 2e-3 * std::abs(n)) << "layer " << l << " bias " << j;
        }
        EXPECT_GT(nonzero, 10) << "layer " << l << ": the check is not vacuous";
    }
}

INSTANTIATE_TEST_SUITE_P(Losses, DenseBackendGradient,
                         ::testing::Values(output_loss::softmax, output_loss::logistic),
                         [](const auto& info) { return std::string(to_string(info.param)); });

/// Several steps of cpu-dense and of the CPU backend with every layer dense, from the same
/// initial model: losses per step and the final weights must agree. The two sum in different
/// orders (BLAS blocking against per-row axpy), so they agree to fp32 rounding, not bit for bit.
/// Weights are compared as |dense - cpu| / (|cpu| + 1e-2): at most `max_relative`, and all but
/// a fraction `outliers` within 1e-4.
void expect_same_training(const model_config& config, adam_mode adam, int dense_threads,
                          double max_relative, double outliers,
                          output_loss loss = output_loss::softmax) {
    SCOPED_TRACE(std::string("adam ") + to_string(adam) + ", loss " + to_string(loss));
    const dataset data = random_dataset(160, 20, config.output_dim(), 202, 9);
    const model_state initial = model_state::create(config, 202);
    train_config tc;
    tc.adam = adam;
    tc.loss = loss;
    cpu::cpu_backend reference(initial, tc, 1);
    cpu::dense_backend dense(initial, tc, dense_threads);
    const std::vector<uint32_t> rows = iota_rows(data.size());
    const uint32_t batch = 16;
    for (uint32_t b = 0; b + batch <= rows.size(); b += batch) {
        const step_report r1 = reference.train_batch({&data, rows.data() + b, batch}, 0.01f);
        const step_report r2 = dense.train_batch({&data, rows.data() + b, batch}, 0.01f);
        // Losses: relative 1e-5 (fp32 logits summed in another order).
        EXPECT_NEAR(r2.loss_sum, r1.loss_sum, 1e-5 * std::abs(r1.loss_sum)) << "batch " << b;
        EXPECT_EQ(r2.samples, batch);
        ASSERT_EQ(r2.active_per_layer.size(), config.layers.size());
        for (size_t l = 0; l < config.layers.size(); ++l)
            EXPECT_EQ(r2.active_per_layer[l], uint64_t(batch) * config.layers[l].size);
    }
    // host_state(): the reference's rows brought up to date (the catch-up modes).
    const model_difference diff = relative_difference(dense.model(), *reference.host_state(), 1e-2);
    EXPECT_LT(diff.max, max_relative);
    EXPECT_LE(diff.fraction_above, outliers);
    EXPECT_EQ(dense.model().adam_step, reference.model().adam_step);
    EXPECT_GT(relative_difference(dense.model(), initial, 1e-2).max, 0.05);
}

TEST(DenseBackend, TrainingMatchesCpuBackendWithDenseLayers) {
    // Measured: at most 1.2e-6 after 10 steps.
    // input-catch-up: the CPU backend catches the input layer's rows up lazily, the dense
    // backend moves them every step (as input-dense).
    for (adam_mode adam : {adam_mode::sparse, adam_mode::dense, adam_mode::input_catch_up})
        expect_same_training(dense_config(), adam, 2, 1e-4, 0.0);
}

TEST(DenseBackend, LogisticTrainingMatchesCpuBackendWithDenseLayers) {
    for (adam_mode adam : {adam_mode::sparse, adam_mode::input_catch_up})
        expect_same_training(dense_config(), adam, 2, 1e-4, 0.0, output_loss::logistic);
}

TEST(DenseBackend, WideOutputLayerSpansSeveralGradientBlocks) {
    // 40,000 outputs over 10 inputs (stride 16): the dW SGEMM and Adam run in blocks of whole
    // multiples of 16 rows, 16 blocks or more a layer, so this layer takes 16 blocks of 2,512
    // rows, the last one partial.
    // Tolerance: 3 of its 440k weights (measured) differ by up to 3.8e-4 relative, not 1e-4.
    // Their column belongs to a hidden unit at the ReLU boundary, whose tiny activations differ
    // by a large relative amount between the two summation orders; Adam divides each step by
    // sqrt(v), so a weight's step is ~lr whatever its gradient's size, and that relative
    // difference reaches the weight. So: every weight within 1e-3, and 99.99% within 1e-4.
    expect_same_training(dense_config(40000), adam_mode::sparse, 1, 1e-3, 1e-4);
}

TEST(DenseBackend, PredictReturnsTheBruteForceTopK) {
    const model_config config = dense_config(300);
    const dataset data = random_dataset(50, 20, 300, 303);
    train_config tc;
    cpu::dense_backend be(model_state::create(config, 303), tc, 2);
    const std::vector<uint32_t> rows = iota_rows(data.size());
    for (int step = 0; step < 3; ++step)
        be.train_batch({&data, rows.data() + 16 * step, 16}, 0.01f);

    const uint32_t k = 7;
    for (scoring_mode scoring : {scoring_mode::exact, scoring_mode::lsh}) {
        std::vector<uint32_t> labels(rows.size() * k);
        std::vector<float> scores(rows.size() * k);
        be.predict({&data, rows.data(), uint32_t(rows.size())}, k, scoring, labels.data(),
                   scores.data());
        reference_net ref(be.model());
        for (uint32_t s = 0; s < rows.size(); ++s) {
            const std::vector<double> z = ref.logits(data, rows[s]);
            std::vector<uint32_t> order = iota_rows(z.size());
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](uint32_t a, uint32_t b) { return z[a] > z[b]; });
            for (uint32_t i = 0; i < k; ++i) {
                EXPECT_EQ(labels[s * k + i], order[i]) << "sample " << s << " rank " << i;
                // Scores are the logits: fp32 against double, 1e-5 relative.
                EXPECT_NEAR(scores[s * k + i], z[order[i]],
                            1e-5 * std::max(1.0, std::abs(z[order[i]])));
            }
        }
    }
    // More labels asked than the model has: padded.
    std::vector<uint32_t> labels(301);
    std::vector<float> scores(301);
    be.predict({&data, rows.data(), 1}, 301, scoring_mode::exact, labels.data(), scores.data());
    EXPECT_EQ(labels[300], UINT32_MAX);
    EXPECT_TRUE(std::isinf(scores[300]) && scores[300] < 0);
}

TEST(DenseBackend, ExportImportRoundTrip) {
    const model_config config = dense_config();
    const dataset data = random_dataset(80, 20, 30, 404, 5);
    train_config tc;
    const std::vector<uint32_t> rows = iota_rows(data.size());
    cpu::dense_backend a(model_state::create(config, 404), tc, 2);
    for (int step = 0; step < 3; ++step) a.train_batch({&data, rows.data() + 16 * step, 16}, 0.01f);

    model_state full, params;
    a.export_state(full, true);
    a.export_state(params, false);
    EXPECT_TRUE(same_state(full, *a.host_state()));
    EXPECT_EQ(params.layers[1].adam_m.size(), 0u) << "parameters only";
    EXPECT_EQ(std::memcmp(params.layers[1].weights.data(), full.layers[1].weights.data(),
                          full.layers[1].weights.size() * 4),
              0);

    // A backend from another initialisation takes the state and then trains exactly as `a`.
    cpu::dense_backend b(model_state::create(config, 999), tc, 1);
    b.import_state(full, true);
    EXPECT_TRUE(same_state(*b.host_state(), full));
    for (int step = 3; step < 5; ++step) {
        const auto ra = a.train_batch({&data, rows.data() + 16 * step, 16}, 0.01f);
        const auto rb = b.train_batch({&data, rows.data() + 16 * step, 16}, 0.01f);
        EXPECT_EQ(ra.loss_sum, rb.loss_sum);
    }
    model_state ea, eb;
    a.export_state(ea, true);
    b.export_state(eb, true);
    // Row sums in sample order and BLAS with the same inputs: 2 threads and 1 give the same bits.
    EXPECT_TRUE(same_state(ea, eb));

    // Without the optimizer, only the parameters move.
    cpu::dense_backend c(model_state::create(config, 7), tc, 1);
    c.import_state(params, false);
    EXPECT_EQ(c.model().adam_step, 0u);
    EXPECT_EQ(c.model().layers[2].bias, full.layers[2].bias);

    // A model of another shape is refused.
    model_state other = model_state::create(dense_config(31), 1);
    EXPECT_THROW(c.import_state(other, false), hslide::error);
}

TEST(DenseBackend, CreatedByKindWithInfo) {
    backend_options bo;
    bo.kind = backend_kind::cpu_dense;
    bo.threads = 2;
    auto be = create_backend(bo, model_state::create(dense_config(), 5), train_config{});
    const backend_info bi = be->info();
    EXPECT_EQ(bi.kind, "cpu-dense");
    EXPECT_EQ(bi.precision, "fp32");
    EXPECT_NE(bi.device.find("2 threads"), std::string::npos) << bi.device;
    EXPECT_NE(bi.device.find(cpu::dense_backend::blas_name()), std::string::npos) << bi.device;
    EXPECT_GT(bi.memory_bytes, 0u);
    ASSERT_NE(be->host_state(), nullptr);
}

TEST(DenseBackend, Bf16MomentsAreRejected) {
    backend_options bo;
    bo.kind = backend_kind::cpu_dense;
    train_config tc;
    tc.adam_moments = moment_storage::bf16;
    try {
        create_backend(bo, model_state::create(dense_config(), 5), tc);
        FAIL() << "bf16 moments accepted";
    } catch (const hslide::error& e) {
        EXPECT_NE(std::string(e.what()).find("--adam-moments bf16"), std::string::npos) << e.what();
        EXPECT_EQ(e.kind(), error_kind::unsupported);
    }
}

TEST(DenseBackend, Bf16IsRejected) {
    backend_options bo;
    bo.kind = backend_kind::cpu_dense;
    bo.precision = precision_mode::bf16;
    try {
        create_backend(bo, model_state::create(dense_config(), 5), train_config{});
        FAIL() << "bf16 accepted";
    } catch (const hslide::error& e) {
        EXPECT_NE(std::string(e.what()).find("--precision bf16"), std::string::npos) << e.what();
        EXPECT_EQ(e.exit_code(), 2);
    }
    const auto r = run_hslide(
        "train --preset tiny --scale 0.05 --epochs 1 --backend cpu-dense "
        "--precision bf16 --no-progress");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--precision bf16"), std::string::npos) << r.output;
}

TEST(DenseBackend, SoftmaxInPlaceEqualsOutOfPlace) {
    // The backend runs the softmax in place over the logits; every kernel level must allow it.
    rng gen(55);
    std::vector<float> logits(1000);
    for (auto& v : logits) v = 8.0f * (gen.uniform() - 0.5f);
    for (const isa_level level : {isa_level::scalar, isa_level::avx2, isa_level::avx512,
                                  isa_level::avx512bf16, isa_level::amx}) {
        if (!isa_supported(level)) continue;
        const auto& k = cpu::kernels_for(level);
        for (uint32_t n : {1u, 7u, 16u, 999u}) {
            std::vector<float> out(n), in_place(logits.begin(), logits.begin() + n);
            const double a = k.softmax(logits.data(), out.data(), n);
            const double b = k.softmax(in_place.data(), in_place.data(), n);
            EXPECT_EQ(a, b) << k.name << " n=" << n;
            EXPECT_EQ(out, in_place) << k.name << " n=" << n;
        }
    }
}

TEST(DenseBackendCli, TrainEvalPredictOnTinyPreset) {
    temp_dir dir;
    auto r = run_hslide("gen --preset tiny --seed 5 --out " + dir.path() + " -q");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string data = " --no-cache --no-progress --threads 2 ";
    const std::string model = dir.file("model.ckpt"), metrics = dir.file("m.jsonl");
    r = run_hslide("train --backend cpu-dense --train " + dir.file("train.txt") + " --test " +
                   dir.file("test.txt") + data + "--epochs 3 --label-rows all --save " + model +
                   " --metrics-out " + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("backend: cpu-dense"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("final: P@1"), std::string::npos) << r.output;
    const std::vector<std::string> records = hslide::testing::read_lines(metrics);
    ASSERT_EQ(records.size(), 3u);
    const std::string& last = records.back();
    const auto j = nlohmann::json::parse(last);
    EXPECT_EQ(j["backend"], "cpu-dense");
    EXPECT_EQ(j["mean_active_output"].get<double>(), 500.0);  // every label
    // The CPU backend reaches P@1 of about 0.3 here (tests/test_cli.cpp asks for 0.2); chance
    // is about 0.01.
    EXPECT_GT(j["p@1"].get<double>(), 0.2) << last;

    // eval on cpu-dense and on the CPU backend (exact scoring) read the same checkpoint.
    r = run_hslide("eval --backend cpu-dense --model " + model + " --test " + dir.file("test.txt") +
                   data + "-q --metrics-out " + dir.file("e1.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_hslide("eval --backend cpu --scoring exact --model " + model + " --test " +
                   dir.file("test.txt") + data + "-q --metrics-out " + dir.file("e2.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream e1(dir.file("e1.jsonl")), e2(dir.file("e2.jsonl"));
    std::string l1, l2;
    std::getline(e1, l1);
    std::getline(e2, l2);
    EXPECT_NEAR(nlohmann::json::parse(l1)["p@1"].get<double>(),
                nlohmann::json::parse(l2)["p@1"].get<double>(), 0.005)
        << l1 << "\n"
        << l2;

    const std::string preds = dir.file("preds.txt");
    r = run_hslide("predict --backend cpu-dense --model " + model + " --data " +
                   dir.file("test.txt") + data + "-q --topk 3 --out " + preds);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::string> lines = hslide::testing::read_lines(preds);
    for (const std::string& line : lines) {
        std::istringstream ss(line);
        std::string item;
        int items = 0;
        while (ss >> item) ++items;
        EXPECT_EQ(items, 3) << line;
    }
    EXPECT_EQ(lines.size(), 500u);
}

TEST(LayerLearningRate, OneStepMovesEachLayerAtItsOwnRate) {
    // layer_config::lr_scale: after one step from the same weights (the same forward pass, the
    // same gradients), a model whose output layer trains at 0.25 x lr has that layer exactly
    // as a model trained at 0.25 x lr everywhere, and its other layers exactly as a model
    // trained at lr; the scale changes something (the output layer differs from lr's).
    const dataset data = random_dataset(40, 20, 30, 101, 11);
    const std::vector<uint32_t> rows = iota_rows(16);
    const float lr = 0.01f, scale = 0.25f;
    model_config topk = dense_config();
    topk.layers.back().sparsity = sparsity_mode::topk;
    topk.layers.back().top_k = 4;
    topk.layers.back().active.min_active = 8;
    struct backend_case {
        const char* name;
        model_config config;
        std::function<std::unique_ptr<backend>(model_state)> make;
    };
    const backend_case cases[] = {
        {"cpu, dense output", dense_config(),
         [](model_state m) {
             return std::make_unique<cpu::cpu_backend>(std::move(m), train_config{}, 1);
         }},
        {"cpu, top-k output", topk,
         [](model_state m) {
             return std::make_unique<cpu::cpu_backend>(std::move(m), train_config{}, 1);
         }},
        {"cpu-dense", dense_config(),
         [](model_state m) {
             return std::make_unique<cpu::dense_backend>(std::move(m), train_config{}, 1);
         }},
    };
    for (const backend_case& c : cases) {
        SCOPED_TRACE(c.name);
        auto one_step = [&](float output_scale, float rate) {
            model_config config = c.config;
            config.layers.back().lr_scale = output_scale;
            std::unique_ptr<backend> be = c.make(model_state::create(config, 71));
            be->train_batch({&data, rows.data(), uint32_t(rows.size())}, rate);
            model_state out;
            be->export_state(out, true);
            return out;
        };
        const model_state scaled = one_step(scale, lr), slow = one_step(1.0f, lr * scale),
                          plain = one_step(1.0f, lr);
        const size_t last = scaled.layers.size() - 1;
        auto same_layer = [](const layer_state& x, const layer_state& y) {
            return x.weights.size() == y.weights.size() &&
                   std::memcmp(x.weights.data(), y.weights.data(), x.weights.size() * 4) == 0 &&
                   x.bias == y.bias && x.bias_m == y.bias_m;
        };
        for (size_t l = 0; l < last; ++l)
            EXPECT_TRUE(same_layer(scaled.layers[l], plain.layers[l])) << "layer " << l;
        EXPECT_TRUE(same_layer(scaled.layers[last], slow.layers[last]));
        EXPECT_FALSE(same_layer(scaled.layers[last], plain.layers[last]));
    }
}

TEST(LayerLearningRate, SavedWithTheModelAndChecked) {
    model_config config = dense_config();
    config.layers.back().lr_scale = 0.25f;
    EXPECT_EQ(model_config_from_json(model_config_to_json(config)).layers.back().lr_scale, 0.25f);
    for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
        config.layers.back().lr_scale = bad;
        EXPECT_THROW(validate(config), error) << bad;
    }
}
