// The floor of one training step on a GPU: the bytes each kernel of the step must move and the
// FLOPs it must do, from the step's shape, and the least time they take at a card's memory
// bandwidth and tensor rate. Host C++ only (no CUDA types), so it builds everywhere:
// bench/bench_floor.cpp prints it for the presets, and scripts/gpu_check.sh's Nsight Compute
// table of one step is read beside it (the measured kernel against its floor).
//
// The model, per kernel (B batch, H hidden, R output rows, A active neurons a sample, F
// features a sample, D input rows; w the bytes of a product's operand, 2 in bf16, 4 in fp32;
// U = R (1 - exp(-B A / R)), the expected union of the batch's sets, B A uniform draws: LSH's
// sets overlap less than that, popular labels more; with a top-k fill pool of P entries
// (fill_pool.hpp), R is the pool's distinct rows, R (1 - exp(-P / R)), the labels and top-k
// outside it left out):
//  - input forward: the samples' feature rows, B F H w read, 2 B F H FLOPs.
//  - selection: LSH, the bucket lists (B L c 4 bytes, c the bucket capacity) and the sets
//    written; top-k, a GEMM of the batch against every row (R H w read, 2 B R H FLOPs; the
//    chunked scores stay on chip at the floor, where the implementation writes and reads them,
//    B R 4 bytes each way); dense, none.
//  - output forward and backward: the union's rows once a pass (U H w; today's kernels read a
//    sample's rows per sample, B A H w: the gap is row reuse across samples), the logits and
//    deltas (B A 4), 2 B A H FLOPs forward, 4 B A H backward. Dense: GEMMs reading the weights
//    once, the forward writing the B x R logits (w: bf16 in a bf16 step, as gpu_dense.cuh
//    builds it), the backward reading the gradient (w) twice and writing the weight gradient
//    (w).
//  - softmax: the logits read and their gradient written (B A 4 each). Dense (gpu_dense.cuh):
//    the logits (w) read twice (once for the maximum and partition sum, once for the gradient),
//    the gradient written once in w, the bias gradient (R 4) with it.
//  - output Adam: U rows (dense: R), each value's weight and two moments read and written (24
//    bytes), its gradient read (4; dense: w) and its bf16 copy written (2): U H 30 bytes (dense
//    bf16: R H 28).
//  - input Adam: input-dense moves every input row (D H 24 bytes), the sparse modes the batch's
//    features (at most B F rows); plus the batch's gradient rows (B F H 4).
//  - input catch-up (input-catch-up, gpu_catch_up.cuh): the batch's rows brought up to date
//    before the forward pass, weights and moments read and written and the bf16 copy written
//    (at most B F rows, 26 bytes a value); no other row moves during training (every row
//    catches up once before predictions and exports, not a step's cost).
// Measured on an H200, 2026-11-25 (Amazon-670K preset, LSH, A ~ 6,300): the output Adam moved
// 2.16 GB a step (the model: 2.34 GB), the input Adam 0.38 GB (0.43).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace hslide::gpu {

/// How a step chooses its output neurons, for the floor.
enum class floor_selection { lsh, top_k, dense };

/// The shape of one step.
struct step_shape {
    uint32_t batch = 256, hidden = 128;
    uint64_t input_rows = 0, output_rows = 0;
    double features_per_sample = 75;  ///< nonzero features of a sample (F)
    double active_per_sample = 0;     ///< output neurons a sample computes (A; dense: R)
    floor_selection selection = floor_selection::lsh;
    uint32_t lsh_tables = 50, bucket_capacity = 128;
    bool bf16 = true;               ///< the products read bf16 weights
    bool input_dense = true;        ///< Adam moves every input row (input-dense)
    bool input_catch_up = false;    ///< input-catch-up (the GPU's default): overrides input_dense
    double fill_pool_entries = 0;   ///< top-k: the step's fill pool (0: the whole layer)
};

/// A card's rates.
struct device_rates {
    double bytes_per_s = 4.3e12;  ///< a device-to-device copy on an H200 (measured)
    double flops_per_s = 790e12;  ///< dense bf16 tensor-core GEMMs (H200, measured)
};

/// One kernel's share of the floor.
struct kernel_floor {
    std::string name;
    double bytes = 0, flops = 0;
    double seconds = 0;  ///< max(bytes / bandwidth, flops / rate)
};

/// The expected number of distinct rows among `draws` uniform draws of `rows` rows.
inline double expected_union(double rows, double draws) {
    return rows <= 0 ? 0 : rows * (1.0 - std::exp(-draws / rows));
}

/// The step's kernels and their floors, in step order.
inline std::vector<kernel_floor> step_floor(const step_shape& s, const device_rates& d) {
    const double B = s.batch, H = s.hidden, R = double(s.output_rows), F = s.features_per_sample;
    const double w = s.bf16 ? 2.0 : 4.0;
    const bool dense = s.selection == floor_selection::dense;
    const double A = dense ? R : s.active_per_sample;
    std::vector<kernel_floor> k;
    auto add = [&](const char* name, double bytes, double flops) {
        k.push_back({name, bytes, flops, std::max(bytes / d.bytes_per_s, flops / d.flops_per_s)});
    };
    const bool pooled = s.selection == floor_selection::top_k && s.fill_pool_entries > 0;
    const double drawn_from = pooled ? expected_union(R, s.fill_pool_entries) : R;
    const double union_rows = dense ? R : expected_union(drawn_from, B * A);
    add("input forward", B * F * H * w, 2 * B * F * H);
    if (s.selection == floor_selection::lsh)
        add("LSH active sets", B * s.lsh_tables * s.bucket_capacity * 4.0 + B * A * 4, 0);
    if (s.selection == floor_selection::top_k)
        add("top-k scoring GEMM", R * H * w + B * H * w, 2 * B * R * H);
    if (dense) {
        add("output forward", R * H * w + B * H * w + B * R * w, 2 * B * R * H);
        add("softmax", 3 * B * R * w + R * 4, 5 * B * R);
        add("output backward", R * H * w + 2 * B * R * w + R * H * w + B * H * 4, 4 * B * R * H);
    } else {
        add("output forward", union_rows * H * w + B * A * 4, 2 * B * A * H);
        add("softmax", 2 * B * A * 4, 5 * B * A);
        add("output backward", union_rows * H * w + B * A * 4 + B * H * 4, 4 * B * A * H);
    }
    add("output Adam", union_rows * H * (26.0 + (dense ? w : 4.0)), 10 * union_rows * H);
    const double batch_rows = std::min(double(s.input_rows), B * F);
    if (s.input_catch_up) add("input catch-up", batch_rows * H * 26.0, 6 * batch_rows * H);
    const double input_rows =
        s.input_dense && !s.input_catch_up ? double(s.input_rows) : batch_rows;
    add("input Adam", input_rows * H * 24.0 + B * F * H * 4, 10 * input_rows * H);
    return k;
}

/// The sum of the kernels' floors: the least a step can take with these kernels on that card.
inline double floor_seconds(const std::vector<kernel_floor>& kernels) {
    double total = 0;
    for (const kernel_floor& k : kernels) total += k.seconds;
    return total;
}

}  // namespace hslide::gpu
