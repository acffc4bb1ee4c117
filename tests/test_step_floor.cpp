// Tests of the GPU step's floor model (src/gpu/step_floor.hpp): the expected union of a
// batch's sets, the figures the issues quote, and the model against what Nsight Compute
// measured on an H200 (gpu-results/2026-11-25).
#include "gpu/step_floor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>

using namespace hslide::gpu;

namespace {

step_shape amazon670k(floor_selection selection, double active) {
    step_shape s;
    s.input_rows = 135909;
    s.output_rows = 670091;
    s.features_per_sample = 75.7;
    s.selection = selection;
    s.active_per_sample = active;
    return s;
}

const kernel_floor& find(const std::vector<kernel_floor>& kernels, const std::string& name) {
    const auto it = std::find_if(kernels.begin(), kernels.end(),
                                 [&](const kernel_floor& k) { return k.name == name; });
    EXPECT_NE(it, kernels.end()) << name;
    return *it;
}

}  // namespace

TEST(StepFloor, ExpectedUnionMatchesUniformDraws) {
    std::mt19937_64 gen(3);
    for (const auto& [rows, draws] : {std::pair{1000u, 100u}, {1000u, 3000u}, {50000u, 40000u}}) {
        std::uniform_int_distribution<uint32_t> pick(0, rows - 1);
        double mean = 0;
        for (int trial = 0; trial < 20; ++trial) {
            std::set<uint32_t> seen;
            for (uint32_t i = 0; i < draws; ++i) seen.insert(pick(gen));
            mean += double(seen.size()) / 20;
        }
        EXPECT_NEAR(expected_union(rows, draws), mean, 0.01 * mean) << rows << " " << draws;
    }
    EXPECT_EQ(expected_union(0, 10), 0.0);
    EXPECT_LE(expected_union(10, 1e6), 10.0);
}

TEST(StepFloor, QuotesTheIssuesGemmFiguresAndTheMeasuredAdamTraffic) {
    const device_rates h200;
    // Top-k's scoring GEMM: 2 B R H = 43.9 GFLOP (issue #19); the dense step's three GEMMs
    // 132 GFLOP (issue #22).
    const auto top = step_floor(amazon670k(floor_selection::top_k, 1024), h200);
    EXPECT_NEAR(find(top, "top-k scoring GEMM").flops, 43.9e9, 0.1e9);
    const auto dense = step_floor(amazon670k(floor_selection::dense, 0), h200);
    const double gemms = find(dense, "output forward").flops + find(dense, "output backward").flops;
    EXPECT_NEAR(gemms, 131.7e9, 0.5e9);
    // LSH at ~6,300 active: the output Adam moved 2.16 GB and the input Adam 0.38 GB a step
    // (Nsight Compute); the model's union assumes uniform sets, so within 10-15%.
    const auto lsh = step_floor(amazon670k(floor_selection::lsh, 6300), h200);
    EXPECT_NEAR(find(lsh, "output Adam").bytes, 2.16e9, 0.15 * 2.16e9);
    EXPECT_NEAR(find(lsh, "input Adam").bytes, 0.38e9, 0.15 * 0.38e9);
    // Smaller sets touch fewer rows, so top-k's update floor is below LSH's, and every step's
    // floor is the sum of its kernels'.
    EXPECT_LT(find(top, "output Adam").bytes, 0.5 * find(lsh, "output Adam").bytes);
    double sum = 0;
    for (const kernel_floor& k : lsh) {
        EXPECT_GE(k.seconds, k.bytes / h200.bytes_per_s);
        EXPECT_GE(k.seconds, k.flops / h200.flops_per_s);
        sum += k.seconds;
    }
    EXPECT_DOUBLE_EQ(floor_seconds(lsh), sum);
    // The dense step is bound by its update and logits, not its GEMMs. As built (bf16 logits
    // written once and read twice, bf16 deltas and weight gradient, gpu_dense.cuh) its floor
    // is 2.41 s an epoch with input-dense Adam (2.28 with the GPU's default input-catch-up),
    // against the 10.9 s measured before the rewrite: issue #22's target of 3.0 s leaves
    // 20-30% for what the kernels do not reach. fp32 logits and weight gradient (the form
    // before, still the fp32 step's) would have a floor above 3.0 s.
    const double epoch = 490449.0 / 256;
    EXPECT_NEAR(floor_seconds(dense) * epoch, 2.41, 0.02);
    step_shape fp32 = amazon670k(floor_selection::dense, 0);
    fp32.bf16 = false;
    EXPECT_GT(floor_seconds(step_floor(fp32, h200)) * epoch, 3.0);
}

TEST(StepFloor, InputCatchUpRemovesWikiLshtcsInputLayerFloor) {
    // WikiLSHTC-325K: 1.6M input rows of 128. Input-dense moves all of them a step (5 GB);
    // input-catch-up the batch's rows twice (caught up, then Adam): under 0.1 GB.
    const device_rates h200;
    step_shape s;
    s.input_rows = 1617899;
    s.output_rows = 325056;
    s.features_per_sample = 42;
    s.selection = floor_selection::top_k;
    s.active_per_sample = 1024;
    const auto dense_inputs = step_floor(s, h200);
    EXPECT_NEAR(find(dense_inputs, "input Adam").bytes, 1617899.0 * 128 * 24, 256 * 42 * 128 * 4);
    s.input_catch_up = true;
    const auto catch_up = step_floor(s, h200);
    const double moved =
        find(catch_up, "input catch-up").bytes + find(catch_up, "input Adam").bytes;
    EXPECT_LT(moved, 0.1e9);
    EXPECT_GT(moved, 2 * 256 * 42 * 128 * 24.0);
    EXPECT_LT(floor_seconds(catch_up), floor_seconds(dense_inputs) - 1e-3);
}

namespace {

TEST(StepFloor, AFillPoolShrinksTheTopKUpdateToThePoolsRows) {
    // 131,072 pool entries over 670,091 rows are about 119,000 distinct rows; the batch's
    // 262,144 draws from them touch about 106,000 (15.8%): the update's rows, where the whole
    // layer gives about 217,000.
    step_shape s = amazon670k(floor_selection::top_k, 1024);
    const double whole = find(step_floor(s, device_rates{}), "output Adam").bytes;
    s.fill_pool_entries = 131072;
    const double pooled = find(step_floor(s, device_rates{}), "output Adam").bytes;
    const double rows = expected_union(expected_union(670091, 131072), 256.0 * 1024);
    EXPECT_NEAR(pooled, rows * 128 * 30.0, 1.0);
    EXPECT_NEAR(rows / 670091, 0.158, 0.002);  // the CPU measured 15.6-16.2% (bench/topk.md)
    EXPECT_NEAR(whole / pooled, 2.05, 0.02);
    // Dense and LSH steps ignore it.
    step_shape lsh = amazon670k(floor_selection::lsh, 6300);
    const double lsh_bytes = find(step_floor(lsh, device_rates{}), "output Adam").bytes;
    lsh.fill_pool_entries = 131072;
    EXPECT_EQ(find(step_floor(lsh, device_rates{}), "output Adam").bytes, lsh_bytes);
}

}  // namespace
