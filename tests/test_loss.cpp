// The output losses (loss.hpp): the logistic loss's value and gradient against their
// definition in double and against finite differences, its label layouts, the biases' prior,
// the names, and the backends that refuse it.
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/loss.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

using namespace hslide;

namespace {

// The loss from its definition, in double: -log sigmoid(z) for a label, -log(1 - sigmoid(z))
// for the others.
double reference_loss(const std::vector<double>& z, const std::vector<uint32_t>& labels) {
    double loss = 0;
    for (uint32_t i = 0; i < z.size(); ++i) {
        const bool label = std::find(labels.begin(), labels.end(), i) != labels.end();
        const double sigmoid = 1.0 / (1.0 + std::exp(-z[i]));
        loss -= std::log(label ? sigmoid : 1.0 - sigmoid);
    }
    return loss;
}

// 4 inputs, a dense hidden layer of 8, a dense output layer of 100.
model_config small_dense_model() {
    model_config c;
    c.input_dim = 4;
    layer_config l;
    l.sparsity = sparsity_mode::dense;
    for (uint32_t size : {8u, 100u}) {
        l.size = size;
        c.layers.push_back(l);
    }
    return c;
}

}  // namespace

TEST(LogisticLoss, ValueAndGradientMatchTheDefinitionAndFiniteDifferences) {
    rng gen(2024);
    for (uint32_t n : {1u, 15u, 16u, 17u, 33u, 100u}) {
        SCOPED_TRACE(n);
        std::vector<float> logits(n);
        for (float& z : logits) z = float(gen.uniform() * 16.0 - 8.0);
        std::vector<uint32_t> labels;
        for (uint32_t i = 0; i < n; ++i)
            if (gen.uniform() < 0.3 || (i == n - 1 && labels.empty())) labels.push_back(i);
        std::vector<float> delta(n);
        const double loss = logistic_loss_gradient(logits.data(), n, labels.data(),
                                                   uint32_t(labels.size()), delta.data());
        const std::vector<double> z(logits.begin(), logits.end());
        // The loss sums fp32 logits' softplus in double: 1e-6 relative.
        EXPECT_NEAR(loss, reference_loss(z, labels), 1e-6 * std::max(1.0, loss));
        const double eps = 1e-4;
        for (uint32_t i = 0; i < n; ++i) {
            std::vector<double> up = z, down = z;
            up[i] += eps;
            down[i] -= eps;
            const double numeric =
                (reference_loss(up, labels) - reference_loss(down, labels)) / (2 * eps);
            // fp32 sigmoid against central differences (O(eps^2) truncation).
            EXPECT_NEAR(delta[i], numeric, 1e-5) << "logit " << i;
        }
    }
}

TEST(LogisticLoss, LabelsFirstInPlaceIsLabelsById) {
    rng gen(7);
    const uint32_t n = 33, labels = 5;
    std::vector<float> logits(n);
    for (float& z : logits) z = float(gen.uniform() * 10.0 - 5.0);
    std::vector<uint32_t> first(labels);
    std::iota(first.begin(), first.end(), 0u);
    std::vector<float> by_id(n);
    const double a = logistic_loss_gradient(logits.data(), n, first.data(), labels, by_id.data());
    std::vector<float> in_place = logits;
    const double b = logistic_loss_gradient(in_place.data(), n, nullptr, labels, in_place.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(by_id, in_place);
    for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(by_id[i] < 0, i < labels) << i;
}

TEST(LogisticLoss, NoOverflowAtLargeLogits) {
    const std::vector<float> logits = {100.0f, -100.0f, 1e30f, -1e30f};
    const std::vector<uint32_t> labels = {1, 3};
    std::vector<float> delta(4);
    const double loss = logistic_loss_gradient(logits.data(), 4, labels.data(), 2, delta.data());
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_NEAR(loss, 100.0 + 100.0 + 1e30 + 1e30, 1e24);
    EXPECT_EQ(delta, (std::vector<float>{1.0f, -1.0f, 1.0f, -1.0f}));
}

TEST(LogisticLoss, BiasesStartAtTheLabelsPriorLogOdds) {
    dataset d;
    d.n_features = 4;
    d.n_labels = 100;
    const uint32_t f[] = {0};
    const float v[] = {1.0f};
    const uint32_t y[] = {3, 5, 7};
    d.push_back(f, v, 1, y, 3);  // 3 labels
    d.push_back(f, v, 1, y, 1);  // 1
    d.push_back(f, v, 1, y, 0);  // none: counts as a point
    const double p = 4.0 / 3.0 / 100.0;
    EXPECT_FLOAT_EQ(logistic_prior_bias(d, 100), float(std::log(p / (1 - p))));
    EXPECT_FLOAT_EQ(logistic_prior_bias(d, 2), 0.0f);  // clamped at p = 0.5
    EXPECT_FLOAT_EQ(logistic_prior_bias(d, 100'000'000'000ull), float(std::log(1e-6 / (1 - 1e-6))));
    dataset empty;
    EXPECT_EQ(logistic_prior_bias(empty, 100), 0.0f);

    model_state m = model_state::create(small_dense_model(), 1);
    start_at_label_prior(m, d);
    for (float b : m.layers.back().bias) EXPECT_EQ(b, logistic_prior_bias(d, 100));
    for (float b : m.layers.front().bias) EXPECT_EQ(b, 0.0f);
}

TEST(LogisticLoss, NamesRoundTripAndABadOneIsNamed) {
    for (const std::string& name : names_of(output_loss{}))
        EXPECT_EQ(to_string(parse_output_loss(name)), name);
    try {
        parse_output_loss("hinge");
        FAIL() << "no error";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("--loss"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("hinge"), std::string::npos) << e.what();
    }
}

TEST(LogisticLoss, EveryBackendTrainsItAndAutoPicksItWhereItIsTheDefault) {
    // The hybrid is checked worker by worker (each a cpu or gpu backend).
    const model_config c = small_dense_model();
    train_config tc;
    tc.loss = output_loss::logistic;
    for (backend_kind kind :
         {backend_kind::cpu, backend_kind::cpu_dense, backend_kind::gpu, backend_kind::gpu_dense})
        EXPECT_NO_THROW(check_supported(kind, c, tc, precision_mode::fp32, scoring_mode::exact))
            << to_string(kind);
    // --loss auto is the logistic loss where it is the backend's default: the CPU's; the GPU
    // backends keep the softmax until a GPU run has compared the two.
    for (backend_kind kind : {backend_kind::cpu, backend_kind::cpu_dense, backend_kind::gpu,
                              backend_kind::gpu_dense, backend_kind::hybrid}) {
        train_config automatic;
        automatic.loss = output_loss::automatic;
        resolve_auto_training(automatic, kind, /*sharded=*/false, 1000);
        const bool cpu = kind == backend_kind::cpu || kind == backend_kind::cpu_dense;
        EXPECT_EQ(automatic.loss, cpu ? output_loss::logistic : output_loss::softmax)
            << to_string(kind);
    }
}
