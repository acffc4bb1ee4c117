// The GPU's top-k fill, checked on the host (no GPU needed): hslide::rng's below() as kernels
// compute it, and fill_pool.hpp's draw_fill, which the GPU's sets kernel runs one
// thread a sample, reproduces the CPU backend's sets exactly: its fill ids (with and without
// the step's pool) after the labels and the top-k it chose, from the seeds the step names.
#include "cpu/cpu_backend.hpp"
#include "hslide/fill_pool.hpp"
#include "hslide/rng.hpp"
#include "hslide/seed_streams.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <unordered_set>
#include <vector>

using namespace hslide;

namespace {

/// The high 64 bits of a * b from 32-bit halves: what __umul64hi computes on the device.
uint64_t high_word(uint64_t a, uint64_t b) {
    const uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
    const uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi;
    const uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
    return a_hi * b_hi + (hi_lo >> 32) + (middle >> 32);
}

TEST(GpuFill, BelowIsTheHighWordOfTheProductAsTheDeviceTakesIt) {
    // hslide::rng::below runs in kernels too, where it takes the high word with __umul64hi
    // instead of a 128-bit product: both must give the same draw on awkward bounds (1, powers
    // of two and their neighbours, a 670k layer, 2^63, the largest).
    for (const uint64_t seed : {0ull, 1ull, 42ull, 0x5eedf111ull, ~0ull}) {
        rng draws(seed), words(seed);
        for (const uint64_t bound :
             {1ull, 2ull, 3ull, 7ull, 64ull, 65ull, 1000ull, 670091ull, (1ull << 32) - 1,
              1ull << 32, (1ull << 32) + 1, 1ull << 63, ~0ull})
            for (int i = 0; i < 200; ++i) {
                const uint64_t got = draws.below(bound), want = high_word(words(), bound);
                ASSERT_EQ(got, want) << "seed " << seed << ", bound " << bound;
                ASSERT_LT(got, bound);
            }
    }
}

TEST(GpuFill, DrawFillStopsAtItsTargetAndSkipsWhatTheSetHas) {
    // A set of 10 of 12 rows, filled to all 12: only the two missing rows can be accepted,
    // and the draws go on (rejected) until both came.
    rng gen(7);
    std::vector<bool> member(12, false);
    for (uint32_t r = 0; r < 10; ++r) member[r] = true;
    std::vector<uint32_t> fill;
    const uint64_t drawn = draw_fill(gen, fill_pool{}, 12, 10, 12, [&](uint32_t r) {
        EXPECT_LT(r, 12u);
        if (member[r]) return false;
        member[r] = true;
        fill.push_back(r);
        return true;
    });
    std::sort(fill.begin(), fill.end());
    EXPECT_EQ(fill, (std::vector<uint32_t>{10, 11}));
    EXPECT_GE(drawn, 2u);
    // A set at its target draws nothing.
    EXPECT_EQ(draw_fill(gen, fill_pool{}, 12, 12, 12, [](uint32_t) { return true; }), 0u);
}

// Trains a CPU backend with a top-k output layer a few steps and rebuilds every set's fill
// with draw_fill from the part before it: the same ids.
void expect_cpu_fill(uint32_t rows, uint32_t min_active, float pool_per_draw, bool expect_pool) {
    model_config config = hslide::testing::two_layer_model(40, 16, rows, sparsity_mode::topk);
    config.layers[1].top_k = 8;
    config.layers[1].active.min_active = min_active;
    config.layers[1].fill_pool = pool_per_draw;
    const model_state initial = model_state::create(config, 3);
    train_config tc;
    tc.seed = 11;
    cpu::cpu_backend cpu(initial, tc, 1, cpu::scalar_kernels(), precision_mode::fp32);
    const uint32_t batch = 32;
    const dataset data = hslide::testing::random_dataset(96, 40, rows, 5, /*unlabelled_every=*/9);
    std::vector<uint32_t> points(data.size());
    std::iota(points.begin(), points.end(), 0u);
    const uint32_t fill = std::min(min_active, rows);
    size_t checked = 0;
    for (uint32_t step = 0; step < 3; ++step) {
        const uint64_t adam_step = cpu.model().adam_step;
        const batch_view view{&data, points.data() + step * batch, batch};
        cpu.train_batch(view, 0.01f);
        // The step's seeds, as the GPU backend passes them to build_top_k_sets.
        const uint64_t sample_seed = step_seed(tc.seed, seed_stream::train_sample, adam_step);
        const fill_pool pool{step_seed(tc.seed, seed_stream::fill_pool, adam_step),
                             fill_pool_size(pool_per_draw, rows, fill, batch)};
        EXPECT_EQ(pool.size > 0, expect_pool);
        for (uint32_t s = 0; s < batch; ++s) {
            const std::vector<uint32_t>& set = cpu.last_active(s, 1);
            if (data.labels(view.rows[s]).count == 0) continue;  // the GPU builds no set
            const uint32_t drawn_from = cpu.last_fill_start(s);
            ASSERT_LE(drawn_from, set.size());
            ASSERT_EQ(set.size(), std::max<size_t>(drawn_from, fill)) << "step " << step;
            std::unordered_set<uint32_t> member(set.begin(), set.begin() + drawn_from);
            std::vector<uint32_t> ours;
            rng gen(derive_seed(sample_seed, s));
            draw_fill(gen, pool, rows, drawn_from, fill, [&](uint32_t r) {
                if (!member.insert(r).second) return false;
                ours.push_back(r);
                return true;
            });
            std::sort(ours.begin(), ours.end());
            const std::vector<uint32_t> theirs(set.begin() + drawn_from, set.end());
            ASSERT_EQ(ours, theirs) << "step " << step << ", sample " << s;
            if (pool.size > 0) {
                std::unordered_set<uint32_t> in_pool;
                for (uint32_t i = 0; i < pool.size; ++i)
                    in_pool.insert(fill_pool_row(pool.seed, i, rows));
                for (uint32_t r : ours) EXPECT_TRUE(in_pool.count(r)) << r;
            }
            checked += theirs.size();
        }
    }
    EXPECT_GT(checked, 0u);
}

TEST(GpuFill, DrawFillGivesTheCpuBackendsFillWithAPool) {
    // 32 x 64 draws over 3,000 rows: a pool of 1,024 entries.
    expect_cpu_fill(3000, 64, 0.5f, /*expect_pool=*/true);
}

TEST(GpuFill, DrawFillGivesTheCpuBackendsFillWithoutAPool) {
    expect_cpu_fill(3000, 64, 0.0f, /*expect_pool=*/false);
    // A fill of most of a small layer (many rejections), and one of the whole layer.
    expect_cpu_fill(70, 60, 0.5f, /*expect_pool=*/false);
    expect_cpu_fill(70, 70, 0.0f, /*expect_pool=*/false);
}

}  // namespace
