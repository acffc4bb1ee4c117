// Ranking metrics of the extreme-classification (XC) repository: P@k, nDCG@k and
// propensity-scored P@k (PSP@k), accumulated point by point so that evaluation can stream over
// a test set from several threads.
//
// Definitions (they match pyxclib's xclib/evaluation/xc_metrics.py: compute_inv_propesity,
// precision/_precision, ndcg/_ndcg, psprecision; checked against kunaldahiya/pyxclib):
//
//  - Inverse propensity of label l (Jain et al., KDD 2016):
//        1/p_l = 1 + C * (N_l + B)^(-A),   C = (ln N - 1) * (B + 1)^A,
//    N = number of training points, N_l = training points carrying label l.
//    Typical (A, B): (0.55, 1.5) in general, (0.6, 2.6) for Amazon, (0.5, 0.4) for Wikipedia.
//
//  - P@k = mean over points of |top-k ∩ y| / k. The denominator is always k: a point with fewer
//    than k predictions counts the missing ones as misses, and a point with no true labels
//    scores 0 yet still counts in the mean (it is part of the test set; pyxclib keeps it too
//    unless remove_invalid is set).
//
//  - nDCG@k = mean over points of DCG@k / IDCG@k, with DCG@k = sum_{i<=k} rel_i / log2(i+1)
//    and IDCG@k = sum_{i<=min(k,|y|)} 1 / log2(i+1) (pyxclib: 1/min(n, cumsum_k)). A point
//    with no true labels scores 0.
//
//  - PSP@k is a ratio of averages, not an average of ratios (pyxclib:
//    _precision(eval_flags)/_precision(ps_eval_flags)):
//        PSP@k = mean_points( sum_{i<=k} rel_i / p_{l_i} / k )
//              / mean_points( same sum for the ideal ranking ),
//    where the ideal ranking of a point is its true labels sorted by descending 1/p (fewer
//    than k true labels: the rest count 0). A perfect predictor scores 1.
//
// Conventions for awkward input: a label predicted twice in one point's list counts once (the
// later copy is a miss); duplicate true labels are merged; predicted labels beyond k_max are
// ignored. Every true label must have an inverse propensity when propensities are given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

struct dataset;

/// Parameters of an evaluation.
struct metrics_config {
    int max_k = 5;               ///< metrics are reported for k = 1..max_k
    double propensity_a = 0.55;  ///< A of the propensity model (0.6 for Amazon-style data)
    double propensity_b = 1.5;   ///< B of the propensity model (2.6 for Amazon-style data)
};

/// Throws hslide::error (invalid_argument) unless A is finite and > 0 and B finite and > 0
/// (a NaN would print every PSP@k as 0; B = 0 makes an unseen label's propensity infinite).
void validate(const metrics_config& config);

/// How many points of `train` carry each label l < train.n_labels.
std::vector<uint32_t> label_counts(const dataset& train);

/// 1/p_l for every label l < train.n_labels, from the label frequencies of `train` (see the file
/// comment). Requires at least one training point.
std::vector<double> inverse_propensities(const dataset& train, double a, double b);

/// The same from label counts: label_counts[l] training points carry label l, out of n_points
/// (checkpoints keep these, so a saved model can be scored with PSP@k without its training set).
std::vector<double> inverse_propensities(const std::vector<uint32_t>& label_counts,
                                         uint64_t n_points, double a, double b);

/// A saved model's inverse propensities for test data of `n_labels` label ids: empty where the
/// model kept no counts (or no training points); with `widen` (a model with a label map, whose
/// test ids run past its training set's: label_map.hpp), the counts extended with zeros to
/// n_labels first, since no training point carried those labels.
std::vector<double> saved_inverse_propensities(std::vector<uint32_t> label_counts,
                                               uint64_t n_points, uint64_t n_labels, bool widen,
                                               double a, double b);

/// Metrics for k = 1..k_max: element k-1 of each vector is the value at k.
struct metrics_result {
    std::vector<double> precision;  ///< P@k
    std::vector<double> ndcg;       ///< nDCG@k
    std::vector<double> psp;        ///< PSP@k; empty when no propensities were given
    size_t n = 0;                   ///< number of points evaluated

    /// P@k, nDCG@k, PSP@k for 1 <= k <= k_max (checked).
    double p_at(int k) const;
    double ndcg_at(int k) const;
    double psp_at(int k) const;
};

/// Accumulates the metrics of one point at a time. Not thread-safe: give every thread its own
/// accumulator and merge() them at the end (the result does not depend on the split, up to
/// floating-point rounding of the sums).
class metrics_accumulator {
  public:
    /// `inverse_propensities` may be empty (then no PSP is computed).
    metrics_accumulator(int k_max, std::vector<double> inverse_propensities = {});

    /// Adds one point. `predicted_top` holds up to n_pred label ids sorted best first (only the
    /// first k_max are used; fewer than k_max is fine); `true_labels` holds the point's n_true
    /// true labels in any order.
    void add(const uint32_t* predicted_top, uint32_t n_pred, const uint32_t* true_labels,
             uint32_t n_true);

    /// Adds the points accumulated by `other` (same k_max and propensities, checked by size).
    void merge(const metrics_accumulator& other);

    /// The averages over the points added so far (all zeros when there are none).
    metrics_result result() const;

    int k_max() const { return k_max_; }
    size_t count() const { return n_; }

  private:
    int k_max_;
    std::vector<double> inv_prop_;
    size_t n_ = 0;
    std::vector<uint64_t> hits_;     // hits_[k-1]: sum over points of |top-k ∩ y|
    std::vector<double> ndcg_sum_;   // sum over points of nDCG@k
    std::vector<double> psp_num_;    // sum over points of sum_{i<=k} rel_i / p_{l_i}
    std::vector<double> psp_den_;    // the same for each point's ideal ranking
    std::vector<uint32_t> scratch_;  // sorted, unique true labels of the current point
    std::vector<double> scratch_w_;  // their inverse propensities
};

/// One line such as "P@1 0.6412 P@3 0.3921 P@5 0.2853 nDCG@1 ... nDCG@5 ... PSP@1 ... PSP@5 ..."
/// with k in {1, 3, 5} that are <= k_max (and k_max itself if not among them); PSP only when
/// computed.
std::string format_metrics(const metrics_result& result);

}  // namespace hslide
