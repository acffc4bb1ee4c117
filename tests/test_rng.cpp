// Tests of hslide::rng: determinism, ranges, and rough uniformity.
#include "hslide/rng.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

TEST(Rng, SameSeedSameStream) {
    hslide::rng a(42), b(42), c(43);
    bool differs = false;
    for (int i = 0; i < 100; ++i) {
        const auto x = a(), y = b(), z = c();
        EXPECT_EQ(x, y);
        differs |= (x != z);
    }
    EXPECT_TRUE(differs);
}

TEST(Rng, BelowStaysInRangeAndCoversIt) {
    hslide::rng gen(7);
    std::vector<int> counts(17, 0);
    for (int i = 0; i < 17000; ++i) {
        const auto v = gen.below(17);
        ASSERT_LT(v, 17u);
        ++counts[v];
    }
    for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(Rng, ShuffleIsAPermutation) {
    hslide::rng gen(3);
    std::vector<int> v(1000);
    std::iota(v.begin(), v.end(), 0);
    hslide::shuffle(v.begin(), v.end(), gen);
    EXPECT_FALSE(std::is_sorted(v.begin(), v.end()));
    std::sort(v.begin(), v.end());
    for (int i = 0; i < 1000; ++i) EXPECT_EQ(v[i], i);
}

TEST(Rng, NormalHasUnitMoments) {
    hslide::rng gen(11);
    double sum = 0, sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double x = gen.normal();
        sum += x;
        sq += x * x;
    }
    EXPECT_NEAR(sum / n, 0.0, 0.01);
    EXPECT_NEAR(sq / n, 1.0, 0.02);
}
