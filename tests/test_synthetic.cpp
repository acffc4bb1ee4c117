// Tests of the synthetic data generator (hslide/synthetic.hpp): output depends only on the
// config (not on the thread count), the shapes and structural invariants hold, the per-point
// statistics and the label prior match the presets, the data is learnable but not trivially,
// the written files read back identical, and bad configs are rejected with a clear message.
#include "hslide/synthetic.hpp"

#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>

using namespace hslide;

namespace {

using hslide::testing::temp_dir;
using hslide::testing::write_text;

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();

synthetic_config make_config(const std::string& preset, uint64_t n_train, uint64_t n_test,
                             uint64_t seed = 1) {
    synthetic_config c;
    c.preset = preset;
    c.n_train = n_train;
    c.n_test = n_test;
    c.seed = seed;
    return c;
}

bool same(const dataset& a, const dataset& b) {
    return a.n_features == b.n_features && a.n_labels == b.n_labels &&
           a.feature_offsets == b.feature_offsets && a.feature_ids == b.feature_ids &&
           a.feature_values == b.feature_values && a.label_offsets == b.label_offsets &&
           a.label_ids == b.label_ids;
}

// Ids in range, feature ids strictly ascending, labels unique and present, values finite,
// each point of unit L2 norm up to the 5-decimal rounding of its values.
void expect_valid(const dataset& d) {
    ASSERT_EQ(d.feature_offsets.size(), d.label_offsets.size());
    ASSERT_EQ(d.feature_offsets.back(), d.feature_ids.size());
    ASSERT_EQ(d.feature_ids.size(), d.feature_values.size());
    ASSERT_EQ(d.label_offsets.back(), d.label_ids.size());
    for (size_t i = 0; i < d.size(); ++i) {
        const feature_row f = d.features(i);
        ASSERT_GE(f.count, 1u) << "point " << i;
        double norm = 0;
        for (uint32_t j = 0; j < f.count; ++j) {
            ASSERT_LT(f.ids[j], d.n_features);
            if (j > 0) ASSERT_GT(f.ids[j], f.ids[j - 1]) << "point " << i;
            ASSERT_TRUE(std::isfinite(f.values[j]));
            ASSERT_GT(f.values[j], 0.0f);
            norm += static_cast<double>(f.values[j]) * f.values[j];
        }
        ASSERT_NEAR(std::sqrt(norm), 1.0, 1e-3) << "point " << i;
        const label_row l = d.labels(i);
        ASSERT_GE(l.count, 1u) << "point " << i;
        for (uint32_t j = 0; j < l.count; ++j) {
            ASSERT_LT(l.ids[j], d.n_labels);
            for (uint32_t k = 0; k < j; ++k) ASSERT_NE(l.ids[j], l.ids[k]) << "point " << i;
        }
    }
}

// Runs `f`, which must throw hslide::error with a message containing `needle`.
void expect_error(const std::function<void()>& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const error& e) {
        EXPECT_EQ(e.kind(), error_kind::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(Synthetic, DeterministicInConfigNotThreadCount) {
    // 3000 points: three chunks, the last one partial.
    const synthetic_config c = make_config("tiny", 3000, 700);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const synthetic_data one = generate_synthetic(c);
    omp_set_num_threads(2);
    const synthetic_data two = generate_synthetic(c);
    omp_set_num_threads(saved);
    EXPECT_TRUE(same(one.train, two.train));
    EXPECT_TRUE(same(one.test, two.test));
    EXPECT_FALSE(same(one.train, one.test));
    EXPECT_EQ(one.test.source, "synthetic:tiny");

    synthetic_config other = c;
    other.seed = 2;
    const synthetic_data different = generate_synthetic(other);
    EXPECT_FALSE(same(one.train, different.train));
    EXPECT_FALSE(same(one.test, different.test));
}

TEST(Synthetic, ShapesAndInvariants) {
    for (const synthetic_preset& p : synthetic_presets()) {
        SCOPED_TRACE(p.name);
        synthetic_config c;
        c.preset = p.name;
        c.scale = 0.25;
        const synthetic_preset r = resolve_synthetic(c);
        EXPECT_EQ(r.n_features, p.n_features);
        EXPECT_EQ(r.n_labels, p.n_labels);
        EXPECT_EQ(r.n_train, std::max<uint64_t>(1, std::llround(p.n_train * 0.25)));
        EXPECT_EQ(r.n_test, std::max<uint64_t>(1, std::llround(p.n_test * 0.25)));
        c.scale = 1e-9;  // rounds to zero points: at least one
        const synthetic_preset r1 = resolve_synthetic(c);
        EXPECT_EQ(r1.n_train + r1.n_test, 2u);
    }

    synthetic_config c;
    c.preset = "tiny";
    c.scale = 0.5;
    const synthetic_data d = generate_synthetic(c);
    EXPECT_EQ(d.train.size(), 1000u);
    EXPECT_EQ(d.test.size(), 250u);
    EXPECT_EQ(d.train.n_features, 2000u);
    EXPECT_EQ(d.train.n_labels, 500u);
    expect_valid(d.train);
    expect_valid(d.test);

    // --labels / --features overrides; explicit point counts take precedence over scale.
    synthetic_config o = make_config("amazon670k", 1500, 300);
    o.scale = 7;
    o.n_labels = 3000;
    o.n_features = 5000;
    const synthetic_preset r = resolve_synthetic(o);
    EXPECT_EQ(r.n_labels, 3000u);
    EXPECT_EQ(r.n_features, 5000u);
    const synthetic_data od = generate_synthetic(o);
    EXPECT_EQ(od.train.size(), 1500u);
    EXPECT_EQ(od.test.size(), 300u);
    EXPECT_EQ(od.train.n_labels, 3000u);
    EXPECT_EQ(od.test.n_features, 5000u);
    expect_valid(od.train);
    expect_valid(od.test);
}

// Measured (seeds 1-3): amazon670k 75.8-76.4 features and 5.41-5.47 labels per point,
// delicious200k 293.5-299.5 and 75.34-75.45; wikilshtc325k 42.7 and 3.20; tiny 30.5 and 3.06.
// Features per point vary by ~53% (log-normal, sigma 0.5), so the mean's standard error is
// ~0.8% at 4000 points and ~1.4% for delicious200k at 1500: 5% is over 3 standard errors.
TEST(Synthetic, PerPointStatisticsMatchPresets) {
    for (const auto& [name, n] : {std::pair<std::string, uint64_t>{"amazon670k", 4000},
                                  {"delicious200k", 1500},
                                  {"wikilshtc325k", 4000},
                                  {"tiny", 2000}}) {
        SCOPED_TRACE(name);
        const synthetic_preset& p = find_synthetic_preset(name);
        const synthetic_data d = generate_synthetic(make_config(name, n, 1));
        expect_valid(d.train);
        const double features = double(d.train.feature_ids.size()) / n;
        const double labels = double(d.train.label_ids.size()) / n;
        EXPECT_NEAR(features, p.features_per_point, 0.05 * p.features_per_point);
        EXPECT_NEAR(labels, p.labels_per_point, 0.05 * p.labels_per_point);
    }
}

// Measured at 4000 train points: top label on 0.0065 of points (prior predicts ~0.006), top 1%
// of labels 0.557 of occurrences. top5pct_coverage is 1.0 here: only 2.4% of the 670091
// labels occur at all, so the top 5% holds every occurrence; the 20000-point data of the next
// test (9.2% of labels seen) gives a meaningful 0.74 (0.65 at 60000 points).
TEST(Synthetic, LabelPriorHasFlatHeadAndHeavyTop) {
    const synthetic_data d = generate_synthetic(make_config("amazon670k", 4000, 1));
    const learnability_report r = measure_learnability(d.train, d.test);
    EXPECT_LT(r.top_label_point_fraction, 0.02);
    EXPECT_GT(r.top1pct_coverage, 0.4);
    EXPECT_GT(r.top5pct_coverage, 0.4);
}

// Measured over seeds 1-5 (500 test points): amazon670k (20000 train) most-frequent P@1
// 0.002-0.006, centroid P@1 0.67-0.72; tiny (2000 train) most-frequent 0.06-0.096 (L = 500, so
// the head is necessarily heavier; the < 0.02 design target is for amazon670k only), centroid
// 0.67-0.75, at least 8x the most-frequent guess.
TEST(Synthetic, LearnableButNotTrivially) {
    const synthetic_data a = generate_synthetic(make_config("amazon670k", 20000, 500));
    const learnability_report r = measure_learnability(a.train, a.test);
    EXPECT_EQ(r.test_points, 500u);
    EXPECT_LT(r.p1_most_frequent, 0.02);
    EXPECT_GT(r.p1_centroid, 0.3);
    EXPECT_GT(r.top5pct_coverage, 0.6);

    const synthetic_data t = generate_synthetic(make_config("tiny", 2000, 500));
    const learnability_report rt = measure_learnability(t.train, t.test, 400);
    EXPECT_EQ(rt.test_points, 400u);
    EXPECT_LT(rt.p1_most_frequent, 0.2);
    EXPECT_GT(rt.p1_centroid, 0.3);
    EXPECT_GT(rt.p1_centroid, 4 * rt.p1_most_frequent);
}

TEST(Synthetic, FilesReadBackIdentical) {
    const temp_dir dir;
    const synthetic_config c = make_config("tiny", 1100, 300, 7);
    const std::string out = dir.file("nested/data");  // created by generate_synthetic_files
    generate_synthetic_files(c, out);
    const synthetic_data d = generate_synthetic(c);
    EXPECT_TRUE(same(read_xc(out + "/train.txt"), d.train));
    EXPECT_TRUE(same(read_xc(out + "/test.txt"), d.test));

    // A path under a regular file cannot be created: an io error naming the path.
    write_text(dir.file("plain"), "x");
    try {
        generate_synthetic_files(c, dir.file("plain/sub"));
        ADD_FAILURE() << "no error";
    } catch (const error& e) {
        EXPECT_EQ(e.kind(), error_kind::io);
        EXPECT_NE(std::string(e.what()).find("plain/sub"), std::string::npos) << e.what();
    }
}

TEST(Synthetic, BadConfigsAreRejected) {
    const auto rejects = [](const std::function<void(synthetic_config&)>& edit,
                            const std::string& needle) {
        synthetic_config c;
        c.preset = "tiny";
        edit(c);
        expect_error([&] { resolve_synthetic(c); }, needle);
        expect_error([&] { generate_synthetic(c); }, needle);
    };
    rejects([](auto& c) { c.preset = "amazon"; }, "'amazon'");
    for (const synthetic_preset& p : synthetic_presets())
        rejects([](auto& c) { c.preset = "nope"; }, p.name);
    expect_error([] { find_synthetic_preset(""); }, "amazon670k, delicious200k");

    for (const double s : {0.0, -1.0, not_a_number, std::numeric_limits<double>::infinity()})
        rejects([s](auto& c) { c.scale = s; }, "scale");
    // Huge scales must not overflow the point count (32-bit point indices).
    for (const double s : {1e7, 1e30}) rejects([s](auto& c) { c.scale = s; }, "at most");
    rejects([](auto& c) { c.n_train = uint64_t(UINT32_MAX) + 5; }, "point counts");
    rejects([](auto& c) { c.n_labels = uint64_t(UINT32_MAX) + 1; }, "labels and features");
    rejects([](auto& c) { c.n_features = uint64_t(UINT32_MAX) + 1; }, "labels and features");

    using model_edit = std::function<void(synthetic_model&)>;
    const std::pair<model_edit, std::string> bad_models[] = {
        {[](auto& m) { m.label_exponent = -1; }, "exponents and offsets"},
        {[](auto& m) { m.feature_exponent = not_a_number; }, "exponents and offsets"},
        {[](auto& m) { m.prototype_decay = -1; }, "exponents and offsets"},
        {[](auto& m) { m.prototype_size = 0; }, "prototype_size"},
        {[](auto& m) { m.topic_size = 0; }, "topic_size"},
        {[](auto& m) { m.topic_pool_size = 0; }, "topic_pool_size"},
        {[](auto& m) { m.topic_share = 1.5; }, "[0, 1]"},
        {[](auto& m) { m.label_coherence = -0.1; }, "[0, 1]"},
        {[](auto& m) { m.signal = not_a_number; }, "[0, 1]"},
        {[](auto& m) { m.features_sigma = 3.5; }, "features_sigma"},
    };
    for (const auto& [edit, needle] : bad_models) {
        SCOPED_TRACE(needle);
        rejects(
            [&edit = edit](auto& c) {
                synthetic_model m;
                edit(m);
                c.model = m;
            },
            needle);
    }
}
