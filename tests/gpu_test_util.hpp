// Shared by the GPU test files (test_gpu_*.cpp): the skip rule of a test that needs a GPU,
// and random inputs with ties and zeros.
#pragma once

#include "hslide/gpu_devices.hpp"
#include "hslide/rng.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Skips a test that cannot run here, or fails it where HSLIDE_EXPECT_GPU is set (the GPU
// machine's check, scripts/gpu_check.sh: there a skipped GPU test is a broken setup).
#define HSLIDE_GPU_SKIP(why)                                                          \
    do {                                                                              \
        if (std::getenv("HSLIDE_EXPECT_GPU")) FAIL() << "HSLIDE_EXPECT_GPU: " << why; \
        GTEST_SKIP() << why;                                                          \
    } while (0)

#define HSLIDE_REQUIRE_GPU()                                                              \
    do {                                                                                  \
        if (!cuda_build()) HSLIDE_GPU_SKIP("built without CUDA: no GPU backend to test"); \
        std::string problem;                                                              \
        if (list_gpus(&problem).empty())                                                  \
            HSLIDE_GPU_SKIP("no usable GPU on this machine ("                             \
                            << (problem.empty() ? "no device" : problem)                  \
                            << "): the GPU tests run where one is");                      \
    } while (0)

namespace hslide::testing {

// Rows of random values with some exact zeros and repeated levels (ties).
inline std::vector<float> random_rows(uint32_t n_rows, uint32_t dim, size_t stride, rng& gen) {
    std::vector<float> rows(size_t(n_rows) * stride, 0.0f);
    for (uint32_t r = 0; r < n_rows; ++r)
        for (uint32_t i = 0; i < dim; ++i) {
            const double u = gen.uniform();
            rows[size_t(r) * stride + i] =
                u < 0.3 ? 0.0f : (u < 0.4 ? float(int(gen.below(3)) - 1) : float(gen.normal()));
        }
    return rows;
}

// A value rounded to bf16 (round to nearest even), as the GPU's to_bf16 rounds.
inline float round_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

}  // namespace hslide::testing
