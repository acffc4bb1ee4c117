// Tests of the XC metrics: hand-computed P@k / nDCG@k / PSP@k, inverse propensities, merging,
// and the awkward cases (fewer predictions than k, duplicates, points without labels).
#include "hslide/metrics.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

namespace {

using hslide::metrics_accumulator;

// Discount of rank i (1-based): 1/log2(i+1).
double d(int i) {
    return 1.0 / std::log2(i + 1.0);
}

void add(metrics_accumulator& acc, std::vector<uint32_t> pred, std::vector<uint32_t> truth) {
    acc.add(pred.data(), static_cast<uint32_t>(pred.size()), truth.data(),
            static_cast<uint32_t>(truth.size()));
}

using hslide::testing::label_dataset;

TEST(Metrics, HandComputedPrecisionAndNdcg) {
    metrics_accumulator acc(5);
    // Point A: relevance of the ranking [1,2,3,4,5] against {2,5,9} is [0,1,0,0,1].
    //   hits@1 = 0, hits@3 = 1, hits@5 = 2 -> P@1 = 0, P@3 = 1/3, P@5 = 2/5.
    //   DCG@3 = d(2) = 0.63093, DCG@5 = d(2) + d(5) = 1.01778;
    //   IDCG@3 = IDCG@5 = d(1)+d(2)+d(3) = 2.13093 (|y| = 3)
    //   -> nDCG@1 = 0, nDCG@3 = 0.29608, nDCG@5 = 0.47762.
    add(acc, {1, 2, 3, 4, 5}, {2, 5, 9});
    // Point B: one prediction, correct: P@1 = 1, P@3 = 1/3, P@5 = 1/5; nDCG@k = 1 (|y| = 1).
    add(acc, {7}, {7});
    // Point C: no true labels: 0 everywhere, but it counts in the means.
    add(acc, {1, 2}, {});

    const auto r = acc.result();
    ASSERT_EQ(r.n, 3u);
    ASSERT_EQ(r.precision.size(), 5u);
    EXPECT_TRUE(r.psp.empty());
    EXPECT_NEAR(r.p_at(1), (0.0 + 1.0 + 0.0) / 3, 1e-12);          // 0.3333
    EXPECT_NEAR(r.p_at(3), (1.0 / 3 + 1.0 / 3 + 0.0) / 3, 1e-12);  // 0.2222
    EXPECT_NEAR(r.p_at(5), (2.0 / 5 + 1.0 / 5 + 0.0) / 3, 1e-12);  // 0.2
    EXPECT_NEAR(r.ndcg_at(1), (0.0 + 1.0 + 0.0) / 3, 1e-12);
    const double idcg_a = d(1) + d(2) + d(3);
    EXPECT_NEAR(d(2) / idcg_a, 0.2960819109658652, 1e-12);
    EXPECT_NEAR(r.ndcg_at(3), (d(2) / idcg_a + 1.0) / 3, 1e-12);           // 0.43203
    EXPECT_NEAR(r.ndcg_at(5), ((d(2) + d(5)) / idcg_a + 1.0) / 3, 1e-12);  // 0.49254
    // k = 2: A has hits@2 = 1, DCG@2 = d(2), IDCG@2 = d(1) + d(2).
    EXPECT_NEAR(r.p_at(2), (0.5 + 0.5 + 0.0) / 3, 1e-12);
    EXPECT_NEAR(r.ndcg_at(2), (d(2) / (d(1) + d(2)) + 1.0) / 3, 1e-12);
    EXPECT_THROW(r.p_at(6), hslide::error);
    EXPECT_THROW(r.psp_at(1), hslide::error);
}

TEST(Metrics, HandComputedPspIsRatioOfMeans) {
    // Inverse propensities chosen by hand: label l has 1/p = l + 1.
    metrics_accumulator acc(3, {1, 2, 3, 4, 5, 6});
    // Point 1: ranking [0,5,2] against {2,3,0}: rel = [1,0,1].
    //   numerator@1 = w0 = 1, @2 = 1, @3 = 1 + w2 = 4.
    //   ideal ranking by descending 1/p: 3 (4), 2 (3), 0 (1): denominator 4, 7, 8.
    add(acc, {0, 5, 2}, {2, 3, 0});
    // Point 2: ranking [4] against {4,1}: numerator 5, 5, 5; ideal 4 (5), 1 (2): 5, 7, 7.
    add(acc, {4}, {4, 1});
    const auto r = acc.result();
    ASSERT_EQ(r.psp.size(), 3u);
    EXPECT_NEAR(r.psp_at(1), (1.0 + 5.0) / (4.0 + 5.0), 1e-12);  // 0.6667, not (1/4 + 1)/2
    EXPECT_NEAR(r.psp_at(2), (1.0 + 5.0) / (7.0 + 7.0), 1e-12);  // 0.4286
    EXPECT_NEAR(r.psp_at(3), (4.0 + 5.0) / (8.0 + 7.0), 1e-12);  // 0.6
    // P@k is unaffected by propensities: P@1 = (1 + 1)/2, P@3 = (2/3 + 1/3)/2.
    EXPECT_NEAR(r.p_at(1), 1.0, 1e-12);
    EXPECT_NEAR(r.p_at(3), 0.5, 1e-12);
}

TEST(Metrics, InversePropensitiesMatchXcFormula) {
    // N = 4 points; label frequencies N_0 = 3, N_1 = 1, N_2 = 1, N_3 = 0.
    const auto data = label_dataset({{0, 1}, {0}, {0, 2}, {}}, 4);
    const auto w = hslide::inverse_propensities(data, 0.55, 1.5);
    ASSERT_EQ(w.size(), 4u);
    // C = (ln 4 - 1) * 2.5^0.55 = 0.63943; 1/p = 1 + C (N_l + 1.5)^-0.55.
    EXPECT_NEAR(w[0], 1.2795879764399811, 1e-12);
    // A label seen once: (1 + B)^-A cancels (B + 1)^A, so 1/p = 1 + ln N - 1 = ln 4.
    EXPECT_NEAR(w[1], std::log(4.0), 1e-12);
    EXPECT_NEAR(w[2], std::log(4.0), 1e-12);
    EXPECT_NEAR(w[3], 1.5116054719900802, 1e-12);
    EXPECT_THROW(hslide::inverse_propensities(label_dataset({}, 4), 0.55, 1.5), hslide::error);
}

TEST(Metrics, ASavedModelsPropensitiesWidenOnlyWithALabelMap) {
    // Counts 3, 1, 1 of 4 points, test data of 5 label ids: with a map, ids 3 and 4 were
    // carried by no training point (1/p as for N_l = 0); without one the counts are kept.
    const std::vector<uint32_t> counts = {3, 1, 1};
    const auto widened = hslide::saved_inverse_propensities(counts, 4, 5, true, 0.55, 1.5);
    ASSERT_EQ(widened.size(), 5u);
    EXPECT_NEAR(widened[0], 1.2795879764399811, 1e-12);
    EXPECT_NEAR(widened[3], 1.5116054719900802, 1e-12);
    EXPECT_EQ(widened[4], widened[3]);
    EXPECT_EQ(hslide::saved_inverse_propensities(counts, 4, 5, false, 0.55, 1.5).size(), 3u);
    EXPECT_TRUE(hslide::saved_inverse_propensities({}, 4, 5, false, 0.55, 1.5).empty());
    EXPECT_TRUE(hslide::saved_inverse_propensities(counts, 0, 5, true, 0.55, 1.5).empty());
}

TEST(Metrics, FewerPredictionsThanK) {
    metrics_accumulator acc(5, {1, 1, 2, 1, 3});
    add(acc, {2}, {2, 4});
    const auto r = acc.result();
    // The missing predictions are misses: P@k = 1/k.
    EXPECT_NEAR(r.p_at(1), 1.0, 1e-12);
    EXPECT_NEAR(r.p_at(3), 1.0 / 3, 1e-12);
    EXPECT_NEAR(r.p_at(5), 1.0 / 5, 1e-12);
    // IDCG@k stops at |y| = 2.
    EXPECT_NEAR(r.ndcg_at(3), 1.0 / (d(1) + d(2)), 1e-12);
    EXPECT_NEAR(r.ndcg_at(5), 1.0 / (d(1) + d(2)), 1e-12);
    // PSP: got w2 = 2 of the ideal w4 + w2 = 5 (@2..5); @1 the ideal is w4 = 3.
    EXPECT_NEAR(r.psp_at(1), 2.0 / 3.0, 1e-12);
    EXPECT_NEAR(r.psp_at(5), 2.0 / 5.0, 1e-12);
}

TEST(Metrics, DuplicatesAreNotDoubleCounted) {
    metrics_accumulator acc(3, {1, 1, 1, 7});
    // Predicting label 3 three times is one hit, not three.
    add(acc, {3, 3, 3}, {3});
    auto r = acc.result();
    EXPECT_NEAR(r.p_at(3), 1.0 / 3, 1e-12);
    EXPECT_NEAR(r.ndcg_at(3), 1.0, 1e-12);
    EXPECT_NEAR(r.psp_at(3), 1.0, 1e-12);

    // A duplicated true label counts once: |y| = 1, so one correct prediction is perfect.
    metrics_accumulator acc2(3, {1, 1, 1, 7});
    add(acc2, {3, 0}, {3, 3});
    r = acc2.result();
    EXPECT_NEAR(r.ndcg_at(3), 1.0, 1e-12);
    EXPECT_NEAR(r.psp_at(3), 1.0, 1e-12);
    EXPECT_NEAR(r.p_at(2), 0.5, 1e-12);
}

TEST(Metrics, EmptyInputs) {
    metrics_accumulator acc(5, {1, 2});
    auto r = acc.result();
    EXPECT_EQ(r.n, 0u);
    EXPECT_EQ(r.p_at(5), 0.0);
    EXPECT_EQ(r.psp_at(1), 0.0);
    // Only points without labels: everything is 0 (no division by zero).
    add(acc, {0, 1}, {});
    add(acc, {}, {});
    r = acc.result();
    EXPECT_EQ(r.n, 2u);
    for (int k = 1; k <= 5; ++k) {
        EXPECT_EQ(r.p_at(k), 0.0);
        EXPECT_EQ(r.ndcg_at(k), 0.0);
        EXPECT_EQ(r.psp_at(k), 0.0);
    }
    // A point with labels but no predictions.
    add(acc, {}, {1});
    r = acc.result();
    EXPECT_EQ(r.p_at(1), 0.0);
}

TEST(Metrics, TrueLabelWithoutPropensityIsAnError) {
    metrics_accumulator acc(3, {1, 2});
    const std::vector<uint32_t> pred{0}, truth{5};
    EXPECT_THROW(acc.add(pred.data(), 1, truth.data(), 1), hslide::error);
    EXPECT_THROW(metrics_accumulator(0), hslide::error);
}

// Random points: predictions are a noisy ranking with occasional repeats.
struct random_points {
    std::vector<std::vector<uint32_t>> pred, truth;
};

random_points make_points(size_t n, uint32_t n_labels, uint64_t seed) {
    hslide::rng gen(seed);
    random_points pts;
    for (size_t i = 0; i < n; ++i) {
        std::vector<uint32_t> t, p;
        const auto nt = gen.below(7);
        for (uint64_t j = 0; j < nt; ++j) t.push_back(static_cast<uint32_t>(gen.below(n_labels)));
        const auto np = gen.below(8);
        for (uint64_t j = 0; j < np; ++j) {
            if (!t.empty() && gen.below(2) == 0)
                p.push_back(t[gen.below(t.size())]);
            else
                p.push_back(static_cast<uint32_t>(gen.below(n_labels)));
        }
        pts.truth.push_back(std::move(t));
        pts.pred.push_back(std::move(p));
    }
    return pts;
}

TEST(Metrics, MergeEqualsSequential) {
    const uint32_t n_labels = 53;
    const auto pts = make_points(1001, n_labels, 11);
    std::vector<double> w(n_labels);
    hslide::rng gen(5);
    for (auto& x : w) x = 1.0 + 4.0 * gen.uniform_double();

    metrics_accumulator all(5, w), a(5, w), b(5, w), c(5, w);
    for (size_t i = 0; i < pts.pred.size(); ++i) {
        add(all, pts.pred[i], pts.truth[i]);
        add(i % 3 == 0 ? a : (i < 500 ? b : c), pts.pred[i], pts.truth[i]);
    }
    a.merge(b);
    a.merge(c);
    const auto r1 = all.result(), r2 = a.result();
    EXPECT_EQ(r1.n, r2.n);
    bool nonzero = false;
    for (int k = 1; k <= 5; ++k) {
        EXPECT_EQ(r1.p_at(k), r2.p_at(k));  // integer hit counts: exact
        EXPECT_NEAR(r1.ndcg_at(k), r2.ndcg_at(k), 1e-12);
        EXPECT_NEAR(r1.psp_at(k), r2.psp_at(k), 1e-12);
        EXPECT_GT(r1.p_at(k), 0.0);
        EXPECT_LT(r1.p_at(k), 1.0);
        nonzero |= r1.psp_at(k) > 0.0;
    }
    EXPECT_TRUE(nonzero);
    EXPECT_THROW(a.merge(metrics_accumulator(3, w)), hslide::error);
}

TEST(Metrics, PerfectPredictorScoresOne) {
    const uint32_t n_labels = 97;
    const auto pts = make_points(300, n_labels, 23);
    std::vector<double> w(n_labels);
    hslide::rng gen(9);
    for (auto& x : w) x = 1.0 + 9.0 * gen.uniform_double();
    metrics_accumulator acc(5, w);
    size_t with_labels = 0;
    for (const auto& truth : pts.truth) {
        // Best possible ranking: unique true labels by descending 1/p.
        std::vector<uint32_t> pred = truth;
        std::sort(pred.begin(), pred.end());
        pred.erase(std::unique(pred.begin(), pred.end()), pred.end());
        std::stable_sort(pred.begin(), pred.end(),
                         [&](uint32_t x, uint32_t y) { return w[x] > w[y]; });
        with_labels += !truth.empty();
        add(acc, pred, truth);
    }
    const auto r = acc.result();
    const double share = static_cast<double>(with_labels) / r.n;  // points without labels score 0
    for (int k = 1; k <= 5; ++k) {
        EXPECT_NEAR(r.psp_at(k), 1.0, 1e-12);
        EXPECT_NEAR(r.ndcg_at(k), share, 1e-12);
    }
    EXPECT_NEAR(r.p_at(1), share, 1e-12);
}

TEST(Metrics, FormatMetrics) {
    hslide::metrics_result r;
    r.n = 10;
    r.precision = {0.64123, 0.5, 0.39214, 0.3, 0.28531};
    r.ndcg = {0.64123, 0.55, 0.5, 0.45, 0.4};
    EXPECT_EQ(hslide::format_metrics(r),
              "P@1 0.6412 P@3 0.3921 P@5 0.2853 nDCG@1 0.6412 nDCG@3 0.5000 nDCG@5 0.4000");
    r.psp = {0.1, 0.2, 0.3, 0.4, 0.5};
    EXPECT_NE(hslide::format_metrics(r).find("PSP@1 0.1000 PSP@3 0.3000 PSP@5 0.5000"),
              std::string::npos);
    r.precision = {0.5, 0.25};
    r.ndcg = {0.5, 0.25};
    r.psp.clear();
    EXPECT_EQ(hslide::format_metrics(r), "P@1 0.5000 P@2 0.2500 nDCG@1 0.5000 nDCG@2 0.2500");
}

}  // namespace
