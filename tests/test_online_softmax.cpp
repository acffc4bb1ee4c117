// The fused softmax's online maximum (src/gpu/online_softmax.hpp, the code the CUDA kernel
// runs, with std::exp where the device has __expf) on the host, in the kernel's order: 256
// threads striding over a sample's logits, then butterfly combines within each warp and
// across the warps. Checked against a two-pass maximum and partition sum in double precision,
// on awkward sizes and value ranges. Runs without a GPU.
#include "gpu/online_softmax.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

using hslide::gpu::max_sum;
using hslide::gpu::max_sum_add;
using hslide::gpu::max_sum_combine;

namespace {

constexpr int threads = 256, warp = 32;

// __shfl_xor_sync butterfly over one warp's values: every lane ends with the warp's pair.
void warp_combine(max_sum* lanes) {
    for (int o = warp / 2; o > 0; o /= 2) {
        std::array<max_sum, warp> before;
        std::copy(lanes, lanes + warp, before.begin());
        for (int lane = 0; lane < warp; ++lane)
            lanes[lane] = max_sum_combine(before[size_t(lane)], before[size_t(lane ^ o)]);
    }
}

// The kernel's block reduction of the logits x.
max_sum block_max_sum(const std::vector<float>& x) {
    std::vector<max_sum> per_thread(threads);
    for (size_t e = 0; e < x.size(); ++e)
        per_thread[e % threads] = max_sum_add(per_thread[e % threads], x[e]);
    std::array<max_sum, warp> warp_pairs{};  // lanes past the last warp hold empty pairs
    for (int w = 0; w < threads / warp; ++w) {
        warp_combine(per_thread.data() + w * warp);
        warp_pairs[size_t(w)] = per_thread[size_t(w * warp)];
    }
    warp_combine(warp_pairs.data());
    return warp_pairs[0];  // lane 0's, which the kernel gives every thread
}

}  // namespace

TEST(OnlineSoftmax, MatchesTwoPassSumOnAwkwardSizes) {
    std::mt19937 rng(20261123);
    for (const size_t n : {1, 2, 15, 16, 17, 31, 33, 255, 256, 257, 1000, 4099}) {
        for (const float spread : {0.5f, 8.0f, 80.0f}) {
            std::normal_distribution<float> value(1.5f, spread);
            std::vector<float> x(n);
            for (float& v : x) v = value(rng);
            // Ascending order makes every thread rescale at each value.
            if (spread == 8.0f) std::sort(x.begin(), x.end());
            const double m = *std::max_element(x.begin(), x.end());
            double sum = 0;
            for (const float v : x) sum += std::exp(double(v) - m);

            const max_sum got = block_max_sum(x);
            EXPECT_EQ(got.max, float(m)) << "n " << n << " spread " << spread;
            // float exp and about log2(n) + 8 rounded additions per term
            EXPECT_NEAR(got.sum, sum, 1e-5 * sum) << "n " << n << " spread " << spread;
            EXPECT_NEAR(got.max + std::log(got.sum), m + std::log(sum), 1e-5)
                << "log partition, n " << n << " spread " << spread;
        }
    }
}

TEST(OnlineSoftmax, EmptyPairsAreNeutral) {
    const max_sum empty;
    const max_sum one = max_sum_add(empty, -3.25f);
    EXPECT_EQ(one.max, -3.25f);
    EXPECT_FLOAT_EQ(one.sum, 1.0f);
    for (const max_sum& m : {max_sum_combine(one, empty), max_sum_combine(empty, one)}) {
        EXPECT_EQ(m.max, one.max);
        EXPECT_FLOAT_EQ(m.sum, 1.0f);
    }
    const max_sum none = max_sum_combine(empty, empty);
    EXPECT_EQ(none.sum, 0.0f);
    // A value far above an existing maximum rescales the old sum to nothing, not to NaN.
    const max_sum big = max_sum_add(max_sum_add(empty, -1e30f), 1e30f);
    EXPECT_EQ(big.max, 1e30f);
    EXPECT_FLOAT_EQ(big.sum, 1.0f);
}
