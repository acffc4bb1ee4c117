// Tests of catch-up Adam's schedule (src/cpu/adam_catch_up.hpp): one closed-form catch-up
// against the zero-gradient Adam steps it replaces, written out step by step in double
// precision, on awkward gaps around the schedule's table horizon; split gaps adding up; the
// Adam kernel's own zero-gradient steps; settings it refuses.
#include "cpu/adam_catch_up.hpp"
#include "cpu/kernels.hpp"
#include "hslide/error.hpp"
#include "hslide/rng.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace hslide;
using namespace hslide::cpu;

namespace {

constexpr double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;

struct row {
    std::vector<float> w, m, v;
};

/// A row with moments such as training leaves: m ~ 0.1 g, v ~ 0.001 g^2 with |g| in
/// [1e-3, 1e-1], so sqrt(v-hat) >> eps (the regime the closed form is exact in).
row random_row(uint32_t n, rng& gen) {
    row r{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
    for (uint32_t i = 0; i < n; ++i) {
        const double g = (gen.uniform() < 0.5 ? -1 : 1) * std::pow(10.0, -1 - 2 * gen.uniform());
        r.w[i] = float(gen.uniform() - 0.5);
        r.m[i] = float(0.1 * g * (0.5 + gen.uniform()));
        r.v[i] = float(0.001 * g * g * (1 + gen.uniform()));
    }
    return r;
}

/// Dense Adam's steps first+1 .. first+lrs.size() with a zero gradient, in double precision
/// (the kernel's formula: w -= lr c1 m / (sqrt(c2 v) + eps)).
void zero_gradient_steps(row& r, uint64_t first, const std::vector<double>& lrs) {
    for (size_t i = 0; i < r.w.size(); ++i) {
        double w = r.w[i], m = r.m[i], v = r.v[i];
        for (size_t k = 0; k < lrs.size(); ++k) {
            const double t = double(first + 1 + k);
            m *= beta1;
            v *= beta2;
            w -= lrs[k] * (m / (1 - std::pow(beta1, t))) /
                 (std::sqrt(v / (1 - std::pow(beta2, t))) + eps);
        }
        r.w[i] = float(w);
        r.m[i] = float(m);
        r.v[i] = float(v);
    }
}

std::vector<double> random_rates(size_t n, rng& gen) {
    std::vector<double> lrs(n);
    for (double& lr : lrs) lr = 1e-3 + 9e-3 * gen.uniform();
    return lrs;
}

}  // namespace

TEST(AdamCatchUp, OneCatchUpEqualsTheSkippedZeroGradientSteps) {
    rng gen(11);
    const adam_catch_up probe(beta1, beta2, eps, 0);
    const uint32_t h = probe.horizon();
    EXPECT_GT(h, 200u);  // rho^h < 1e-12 with rho = 0.9 / sqrt(0.999)
    EXPECT_LT(h, 300u);
    const std::vector<uint64_t> gaps = {1, 2, 15, 16, 17, 33, h - 1, h, h + 1, 1000};
    for (uint64_t start : {0, 1, 7, 500}) {
        for (uint64_t gap : gaps) {
            SCOPED_TRACE(testing::Message()
                         << "row up to date at step " << start << ", gap " << gap);
            // The row was last updated at step `start`; the gap's steps follow.
            adam_catch_up schedule(beta1, beta2, eps, 0);
            for (uint64_t t = 0; t < start; ++t) schedule.record_step(1e-3 + 1e-5 * double(t));
            const std::vector<double> lrs = random_rates(gap, gen);
            for (double lr : lrs) schedule.record_step(lr);
            ASSERT_EQ(schedule.current(), start + gap);

            const uint32_t n = 37;
            row fast = random_row(n, gen), slow = fast;
            apply_catch_up(fast.w.data(), fast.m.data(), fast.v.data(), n, schedule.from(start));
            const row before = slow;
            zero_gradient_steps(slow, start, lrs);
            for (uint32_t i = 0; i < n; ++i) {
                const double moved = std::abs(double(slow.w[i]) - before.w[i]);
                ASSERT_GT(moved, 0.0);
                // Relative to the distance moved, plus float rounding of w.
                EXPECT_NEAR(fast.w[i], slow.w[i], 1e-5 * moved + 2e-7) << "element " << i;
                EXPECT_NEAR(fast.m[i], slow.m[i], 1e-5 * std::abs(before.m[i])) << i;
                EXPECT_NEAR(fast.v[i], slow.v[i], 1e-5 * std::abs(before.v[i])) << i;
            }
        }
    }
}

TEST(AdamCatchUp, GapsCaughtUpInPiecesAddUpToOne) {
    rng gen(12);
    adam_catch_up schedule(beta1, beta2, eps, 40);  // resumed at step 40
    const uint32_t n = 17;
    row once = random_row(n, gen), twice = once;
    for (int t = 0; t < 90; ++t) schedule.record_step(2e-3);
    apply_catch_up(twice.w.data(), twice.m.data(), twice.v.data(), n, schedule.from(40));
    for (int t = 0; t < 300; ++t) schedule.record_step(5e-3);
    apply_catch_up(twice.w.data(), twice.m.data(), twice.v.data(), n, schedule.from(130));
    apply_catch_up(once.w.data(), once.m.data(), once.v.data(), n, schedule.from(40));
    for (uint32_t i = 0; i < n; ++i) {
        EXPECT_NEAR(once.w[i], twice.w[i], 2e-6) << i;
        EXPECT_FLOAT_EQ(once.m[i], twice.m[i]) << i;
        EXPECT_FLOAT_EQ(once.v[i], twice.v[i]) << i;
    }
    // Up to date: nothing to do.
    const catch_up_step none = schedule.from(schedule.current());
    EXPECT_EQ(none.displacement, 0.0f);
    EXPECT_EQ(none.m_decay, 1.0f);
}

TEST(AdamCatchUp, MatchesTheAdamKernelWithZeroGradients) {
    // The float kernel, step by step, against one catch-up: the backend's dense mode against
    // its catch-up mode, on one row.
    rng gen(13);
    const kernel_table& k = scalar_kernels();
    for (uint32_t n : {1u, 15u, 16u, 17u, 33u}) {
        adam_catch_up schedule(beta1, beta2, eps, 0);
        row fast = random_row(n, gen), slow = fast;
        const row before = slow;
        const std::vector<float> zero(n, 0.0f);
        for (uint64_t t = 1; t <= 60; ++t) {
            const float lr = 0.01f;
            const adam_step step{lr,
                                 float(beta1),
                                 float(beta2),
                                 float(eps),
                                 float(1 / (1 - std::pow(beta1, double(t)))),
                                 float(1 / (1 - std::pow(beta2, double(t))))};
            k.adam(slow.w.data(), slow.m.data(), slow.v.data(), zero.data(), n, step);
            schedule.record_step(lr);
        }
        apply_catch_up(fast.w.data(), fast.m.data(), fast.v.data(), n, schedule.from(0));
        for (uint32_t i = 0; i < n; ++i) {
            const double moved = std::abs(double(slow.w[i]) - before.w[i]);
            EXPECT_NEAR(fast.w[i], slow.w[i], 1e-4 * moved + 1e-6) << n << " " << i;
            EXPECT_NEAR(fast.m[i], slow.m[i], 1e-5 * std::abs(before.m[i])) << n << " " << i;
        }
    }
}

TEST(AdamCatchUp, WithoutMomentumASkippedStepMovesNothing) {
    adam_catch_up schedule(0.0, beta2, eps, 0);
    for (int t = 0; t < 5; ++t) schedule.record_step(0.01);
    const catch_up_step c = schedule.from(1);
    EXPECT_EQ(c.displacement, 0.0f);
    EXPECT_EQ(c.m_decay, 0.0f);
}

TEST(AdamCatchUp, RefusesMomentumThatDoesNotDieOut) {
    EXPECT_THROW(adam_catch_up(0.999, 0.99, eps, 0), hslide::error);      // rho > 1
    EXPECT_THROW(adam_catch_up(0.9999, 0.99999, eps, 0), hslide::error);  // too slow to decay
}
