// The exponential moving average of the weights (see weight_average.hpp).
#include "hslide/weight_average.hpp"

#include "hslide/error.hpp"

#include <cmath>

namespace hslide {

float weight_average_keep(double epochs, uint32_t ticks_per_epoch) {
    HSLIDE_CHECK(epochs > 0 && std::isfinite(epochs) && ticks_per_epoch > 0,
                 "the weight average's time constant must be a positive number of epochs, not {}",
                 epochs);
    return float(std::exp(-1.0 / (epochs * double(ticks_per_epoch))));
}

bool weight_average_tick_after(uint64_t step, uint64_t steps, uint32_t ticks) {
    HSLIDE_ASSERT(step < steps && ticks > 0);
    // Step s ends share floor((s + 1) * ticks / steps) of the epoch when that passes a whole one.
    return (step + 1) * ticks / steps != step * ticks / steps;
}

void blend_into_average(model_state& average, const model_state& current, float keep) {
    if (average.layers.empty()) {
        average.copy_from(current, /*with_optimizer=*/false);
        return;
    }
    current.check_same_layout(average);
    const float take = 1.0f - keep;
    for (size_t l = 0; l < current.layers.size(); ++l) {
        const layer_state& from = current.layers[l];
        layer_state& to = average.layers[l];
        HSLIDE_CHECK(from.bias.size() == to.bias.size(), "layer {}: {} biases, the average has {}",
                     l, from.bias.size(), to.bias.size());
        const float* w = from.weights.data();
        float* a = to.weights.data();
        const int64_t n = int64_t(from.weights.size());
        // The padding is zero in both, and stays zero.
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) a[i] = keep * a[i] + take * w[i];
        for (size_t i = 0; i < from.bias.size(); ++i)
            to.bias[i] = keep * to.bias[i] + take * from.bias[i];
    }
    average.adam_step = current.adam_step;
    average.hash_seeds = current.hash_seeds;
}

}  // namespace hslide
