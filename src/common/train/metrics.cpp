// XC ranking metrics (P@k, nDCG@k, PSP@k); definitions in include/hslide/metrics.hpp.
#include "hslide/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/memory.hpp"

namespace hslide {

std::vector<uint32_t> label_counts(const dataset& train) {
    std::vector<uint32_t> counts = allocate_checked(
        fmt::format("the label counts of {} ({} labels)", train.source, train.n_labels),
        train.n_labels * sizeof(uint32_t),
        [&] { return std::vector<uint32_t>(train.n_labels, 0); });
    for (uint32_t l : train.label_ids) {
        HSLIDE_CHECK(l < train.n_labels, "label {} out of range (L = {})", l, train.n_labels);
        ++counts[l];
    }
    return counts;
}

std::vector<double> inverse_propensities(const dataset& train, double a, double b) {
    HSLIDE_CHECK(train.size() > 0, "inverse propensities need at least one training point");
    return inverse_propensities(label_counts(train), train.size(), a, b);
}

void validate(const metrics_config& config) {
    HSLIDE_CHECK(config.propensity_a > 0 && std::isfinite(config.propensity_a),
                 "--propensity-a must be a finite number > 0, got {:g}", config.propensity_a);
    HSLIDE_CHECK(config.propensity_b > 0 && std::isfinite(config.propensity_b),
                 "--propensity-b must be a finite number > 0, got {:g}", config.propensity_b);
}

std::vector<double> inverse_propensities(const std::vector<uint32_t>& label_counts,
                                         uint64_t n_points, double a, double b) {
    HSLIDE_CHECK(n_points > 0, "inverse propensities need at least one training point");
    validate(metrics_config{0, a, b});
    const double c = (std::log(static_cast<double>(n_points)) - 1.0) * std::pow(b + 1.0, a);
    std::vector<double> inv =
        allocate_checked(fmt::format("the inverse propensities of {} labels", label_counts.size()),
                         label_counts.size() * sizeof(double),
                         [&] { return std::vector<double>(label_counts.size()); });
    for (size_t l = 0; l < label_counts.size(); ++l)
        inv[l] = 1.0 + c * std::pow(static_cast<double>(label_counts[l]) + b, -a);
    return inv;
}

double metrics_result::p_at(int k) const {
    HSLIDE_CHECK(k >= 1 && k <= static_cast<int>(precision.size()), "P@{} not computed", k);
    return precision[k - 1];
}

double metrics_result::ndcg_at(int k) const {
    HSLIDE_CHECK(k >= 1 && k <= static_cast<int>(ndcg.size()), "nDCG@{} not computed", k);
    return ndcg[k - 1];
}

double metrics_result::psp_at(int k) const {
    HSLIDE_CHECK(k >= 1 && k <= static_cast<int>(psp.size()), "PSP@{} not computed", k);
    return psp[k - 1];
}

std::vector<double> saved_inverse_propensities(std::vector<uint32_t> label_counts,
                                               uint64_t n_points, uint64_t n_labels, bool widen,
                                               double a, double b) {
    if (widen && label_counts.size() < n_labels) label_counts.resize(n_labels, 0);
    if (label_counts.empty() || n_points == 0) return {};
    return inverse_propensities(label_counts, n_points, a, b);
}

metrics_accumulator::metrics_accumulator(int k_max, std::vector<double> inverse_propensities)
    : k_max_(k_max), inv_prop_(std::move(inverse_propensities)) {
    HSLIDE_CHECK(k_max >= 1, "k_max must be >= 1, got {}", k_max);
    hits_.assign(k_max, 0);
    ndcg_sum_.assign(k_max, 0.0);
    if (!inv_prop_.empty()) {
        psp_num_.assign(k_max, 0.0);
        psp_den_.assign(k_max, 0.0);
    }
}

void metrics_accumulator::add(const uint32_t* predicted_top, uint32_t n_pred,
                              const uint32_t* true_labels, uint32_t n_true) {
    ++n_;
    if (n_true == 0) return;  // scores 0 everywhere, but counts in the means

    // Sorted unique true labels: binary search for relevance, and no double counting.
    scratch_.assign(true_labels, true_labels + n_true);
    std::sort(scratch_.begin(), scratch_.end());
    scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
    const bool with_psp = !inv_prop_.empty();
    if (with_psp) {
        HSLIDE_CHECK(scratch_.back() < inv_prop_.size(),
                     "true label {} has no inverse propensity ({} labels known)", scratch_.back(),
                     inv_prop_.size());
    }

    const int k_used = std::min<int>(k_max_, static_cast<int>(n_pred));
    uint64_t hits = 0;
    double dcg = 0.0, idcg = 0.0, psp_num = 0.0;
    for (int i = 0; i < k_max_; ++i) {
        const double discount = 1.0 / std::log2(static_cast<double>(i) + 2.0);
        if (i < static_cast<int>(scratch_.size())) idcg += discount;
        if (i < k_used) {
            const uint32_t label = predicted_top[i];
            bool relevant = std::binary_search(scratch_.begin(), scratch_.end(), label);
            // A repeated prediction is a miss: the label was already counted.
            for (int j = 0; relevant && j < i; ++j) relevant = predicted_top[j] != label;
            if (relevant) {
                ++hits;
                dcg += discount;
                if (with_psp) psp_num += inv_prop_[label];
            }
        }
        hits_[i] += hits;
        ndcg_sum_[i] += dcg / idcg;
        if (with_psp) psp_num_[i] += psp_num;
    }

    if (with_psp) {
        // The ideal ranking puts the true labels with the largest 1/p first.
        scratch_w_.resize(scratch_.size());
        for (size_t j = 0; j < scratch_.size(); ++j) scratch_w_[j] = inv_prop_[scratch_[j]];
        const size_t top = std::min<size_t>(k_max_, scratch_w_.size());
        std::partial_sort(scratch_w_.begin(), scratch_w_.begin() + top, scratch_w_.end(),
                          std::greater<double>());
        double ideal = 0.0;
        for (int i = 0; i < k_max_; ++i) {
            if (static_cast<size_t>(i) < top) ideal += scratch_w_[i];
            psp_den_[i] += ideal;
        }
    }
}

void metrics_accumulator::merge(const metrics_accumulator& other) {
    HSLIDE_CHECK(other.k_max_ == k_max_ && other.inv_prop_.size() == inv_prop_.size(),
                 "cannot merge metrics accumulators with different k_max or propensities");
    n_ += other.n_;
    for (int i = 0; i < k_max_; ++i) {
        hits_[i] += other.hits_[i];
        ndcg_sum_[i] += other.ndcg_sum_[i];
        if (!inv_prop_.empty()) {
            psp_num_[i] += other.psp_num_[i];
            psp_den_[i] += other.psp_den_[i];
        }
    }
}

metrics_result metrics_accumulator::result() const {
    metrics_result r;
    r.n = n_;
    r.precision.assign(k_max_, 0.0);
    r.ndcg.assign(k_max_, 0.0);
    if (!inv_prop_.empty()) r.psp.assign(k_max_, 0.0);
    if (n_ == 0) return r;
    const double n = static_cast<double>(n_);
    for (int i = 0; i < k_max_; ++i) {
        r.precision[i] = static_cast<double>(hits_[i]) / (static_cast<double>(i + 1) * n);
        r.ndcg[i] = ndcg_sum_[i] / n;
        // Both means share the 1/(k n) factor, so the ratio of sums is the ratio of means.
        if (!inv_prop_.empty()) r.psp[i] = psp_den_[i] > 0.0 ? psp_num_[i] / psp_den_[i] : 0.0;
    }
    return r;
}

std::string format_metrics(const metrics_result& result) {
    const int k_max = static_cast<int>(result.precision.size());
    std::vector<int> ks;
    for (int k : {1, 3, 5})
        if (k <= k_max) ks.push_back(k);
    if (k_max > 0 && (ks.empty() || ks.back() != k_max)) ks.push_back(k_max);

    std::string out;
    auto append = [&](const char* name, const std::vector<double>& values) {
        for (int k : ks) {
            if (!out.empty()) out += ' ';
            out += fmt::format("{}@{} {:.4f}", name, k, values[k - 1]);
        }
    };
    append("P", result.precision);
    append("nDCG", result.ndcg);
    if (!result.psp.empty()) append("PSP", result.psp);
    return out;
}

}  // namespace hslide
