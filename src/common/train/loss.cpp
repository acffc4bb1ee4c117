// The output losses' names, the logistic loss's gradient and its biases' starting value
// (loss.hpp).
#include "hslide/loss.hpp"

#include "hslide/error.hpp"
#include "hslide/model.hpp"

#include <algorithm>
#include <cmath>

namespace hslide {

namespace {
const std::pair<const char*, output_loss> loss_names[] = {{"auto", output_loss::automatic},
                                                          {"softmax", output_loss::softmax},
                                                          {"logistic", output_loss::logistic}};
}

output_loss parse_output_loss(const std::string& name) {
    for (const auto& [text, loss] : loss_names)
        if (name == text) return loss;
    HSLIDE_CHECK(false, "--loss must be auto, softmax or logistic, got '{}'", name);
    return output_loss::softmax;
}

const char* to_string(output_loss loss) {
    for (const auto& [text, value] : loss_names)
        if (value == loss) return text;
    return "?";
}

std::vector<std::string> names_of(output_loss) {
    std::vector<std::string> names;
    for (const auto& entry : loss_names) names.emplace_back(entry.first);
    return names;
}

double logistic_loss_gradient(const float* logits, uint32_t n, const uint32_t* label_ids,
                              uint32_t labels, float* delta) {
    // A label's cross-entropy is softplus(z) - z: its logit is read before delta, which may
    // alias the logits, overwrites it.
    double loss = 0;
    for (uint32_t j = 0; j < labels; ++j) {
        const uint32_t i = label_ids ? label_ids[j] : j;
        HSLIDE_ASSERT(i < n);
        loss -= logits[i];
    }
    for (uint32_t i = 0; i < n; ++i) {
        const float z = logits[i];
        // softplus(z) = log(1 + e^z), written so that neither side overflows.
        loss += std::max(double(z), 0.0) + std::log1p(std::exp(-std::fabs(double(z))));
        delta[i] = 1.0f / (1.0f + std::exp(-z));
    }
    for (uint32_t j = 0; j < labels; ++j) delta[label_ids ? label_ids[j] : j] -= 1.0f;
    return loss;
}

uint32_t automatic_batch_size(output_loss loss, uint64_t training_points) {
    return loss == output_loss::logistic && training_points >= large_batch_points
               ? 2 * base_batch_size
               : base_batch_size;
}

float automatic_learning_rate(output_loss loss, uint32_t batch) {
    HSLIDE_ASSERT(loss != output_loss::automatic && batch > 0);
    const float rate =
        loss == output_loss::logistic ? logistic_learning_rate : softmax_learning_rate;
    return batch == base_batch_size ? rate
                                    : float(rate * std::sqrt(double(batch) / base_batch_size));
}

float logistic_prior_bias(const dataset& train, uint64_t rows) {
    if (train.size() == 0 || rows == 0) return 0.0f;
    uint64_t labels = 0;
    for (size_t i = 0; i < train.size(); ++i) labels += train.labels(i).count;
    if (labels == 0) return 0.0f;
    const double p = std::clamp(double(labels) / double(train.size()) / double(rows), 1e-6, 0.5);
    return float(std::log(p / (1 - p)));
}

void start_at_label_prior(model_state& model, const dataset& train) {
    HSLIDE_ASSERT(!model.layers.empty());
    layer_state& out = model.layers.back();
    // A rank's shard holds some of the rows; the prior is over the whole layer's.
    std::fill(out.bias.begin(), out.bias.end(),
              logistic_prior_bias(train, model.config.output_dim()));
}

}  // namespace hslide
