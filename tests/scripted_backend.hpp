// A scripted backend for the trainer's tests: its predictions get better or worse with the epochs
// as a script says, so that a test knows which epoch a validation rule must keep.
#pragma once

#include "hslide/backend.hpp"
#include "hslide/dataset.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace hslide::testing {

/// n points of 4 features (the same two values each) and 3 labels, point i labelled i % 3: the
/// data a scripted backend is trained and validated on.
inline dataset labelled_points(uint32_t n) {
    dataset d;
    d.source = "points";
    d.n_features = 4;
    d.n_labels = 3;
    const uint32_t f[] = {1, 3};
    const float v[] = {0.5f, 0.25f};
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t label = i % 3;
        d.push_back(f, v, 2, &label, 1);
    }
    return d;
}

/// A backend whose predictions get better or worse with the epochs as `quality` says: after
/// epoch e, the first quality[e-1] tenths of every ten points are predicted right (P@1 =
/// quality / 10). Its "model" is the epoch it has reached, which export/import carry. Where
/// `quality_at_lower_rate` is given, an epoch whose last batch ran below the first batch's
/// learning rate (after a drop) scores by it instead.
class scripted_backend final : public backend {
  public:
    explicit scripted_backend(std::vector<int> quality, uint32_t points,
                              std::vector<int> quality_at_lower_rate = {})
        : quality_(std::move(quality)),
          quality_at_lower_rate_(std::move(quality_at_lower_rate)),
          points_(points) {}
    std::vector<uint64_t> imported;  // the epochs import_state brought back
    std::vector<float> rates;        // the learning rate of every batch
    // Whether each export_state / import_state call asked for the Adam state.
    mutable std::vector<bool> exported_with_optimizer;
    std::vector<bool> imported_with_optimizer;

    step_report train_batch(const batch_view& batch, float learning_rate) override {
        rates.push_back(learning_rate);
        samples_ += batch.size;
        step_report r;
        r.samples = batch.size;
        r.loss_sum = batch.size;
        r.active_per_layer = {1, 1};
        return r;
    }
    void refresh_selections(bool) override {}
    void predict(const batch_view& batch, uint32_t k, scoring_mode, uint32_t* labels,
                 float* scores) override {
        const bool lower =
            !quality_at_lower_rate_.empty() && !rates.empty() && rates.back() < rates.front();
        const int q = (lower ? quality_at_lower_rate_ : quality_).at(size_t(epoch() - 1));
        for (uint32_t s = 0; s < batch.size; ++s) {
            const uint32_t row = batch.rows[s];
            const uint32_t truth = batch.data->labels(row).ids[0];
            for (uint32_t i = 0; i < k; ++i) {
                labels[size_t(s) * k + i] = UINT32_MAX;
                scores[size_t(s) * k + i] = -1;
            }
            labels[size_t(s) * k] = int(row % 10) < q ? truth : (truth + 1) % 3;
        }
    }
    void export_state(model_state& out, bool with_optimizer) const override {
        exported_with_optimizer.push_back(with_optimizer);
        out.adam_step = epoch();
    }
    void import_state(const model_state& in, bool with_optimizer) override {
        imported_with_optimizer.push_back(with_optimizer);
        imported.push_back(in.adam_step);
        samples_ = in.adam_step * points_;
    }
    backend_info info() const override { return {}; }
    uint64_t epoch() const { return samples_ / points_; }

  private:
    std::vector<int> quality_;
    std::vector<int> quality_at_lower_rate_;
    uint64_t samples_ = 0;
    uint32_t points_;
};

}  // namespace hslide::testing
