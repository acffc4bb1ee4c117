// Prints the floor of one GPU training step (src/gpu/step_floor.hpp) for the presets' networks
// at full size: per kernel the bytes, FLOPs and least time at an H200's rates, and the step's
// and an epoch's total, for LSH, top-k and dense output layers. No GPU needed: the model is
// arithmetic; gpu_check.sh's Nsight table is read beside it.
//
//   build/bench_floor [bytes_per_s flops_per_s]     (default: 4.3e12 790e12, an H200)
#include "gpu/step_floor.hpp"
#include "hslide/config.hpp"
#include "hslide/fill_pool.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

using namespace hslide::gpu;
using hslide::fill_pool_size;
using hslide::layer_config;

namespace {

struct preset {
    const char* name;
    uint64_t inputs, outputs, train_points;
    double features, lsh_active;
    uint32_t tables;
};

void print(const preset& p, floor_selection selection, double active, const device_rates& d,
           double fill_pool_entries = 0) {
    step_shape s;
    s.fill_pool_entries = fill_pool_entries;
    s.input_rows = p.inputs;
    s.output_rows = p.outputs;
    s.features_per_sample = p.features;
    s.active_per_sample = active;
    s.selection = selection;
    s.lsh_tables = p.tables;
    const auto kernels = step_floor(s, d);
    const char* what = selection == floor_selection::lsh     ? "LSH"
                       : selection == floor_selection::top_k ? "top-k"
                                                             : "dense";
    std::printf("\n%s, %s%s (batch %u, hidden %u, %.0f active a sample)\n", p.name, what,
                fill_pool_entries > 0 ? " with the fill pool" : "", s.batch, s.hidden,
                selection == floor_selection::dense ? double(p.outputs) : active);
    std::printf("| kernel | MB | GFLOP | floor us |\n| --- | ---: | ---: | ---: |\n");
    for (const kernel_floor& k : kernels)
        std::printf("| %s | %.1f | %.2f | %.1f |\n", k.name.c_str(), k.bytes / 1e6, k.flops / 1e9,
                    k.seconds * 1e6);
    const double step = floor_seconds(kernels);
    std::printf("| **step** | | | **%.1f** |\nepoch of %llu points: %.2f s at the floor\n",
                step * 1e6, (unsigned long long)p.train_points,
                step * double(p.train_points) / s.batch);
    // The table is input-dense's; the GPU's default, input-catch-up, moves the batch's input
    // rows only.
    s.input_catch_up = true;
    std::printf("with input-catch-up: %.1f us a step, %.2f s an epoch at the floor\n",
                floor_seconds(step_floor(s, d)) * 1e6,
                floor_seconds(step_floor(s, d)) * double(p.train_points) / s.batch);
}

}  // namespace

int main(int argc, char** argv) {
    device_rates d;
    if (argc == 3) {
        d.bytes_per_s = std::atof(argv[1]);
        d.flops_per_s = std::atof(argv[2]);
    }
    std::printf("GPU step floors at %.2f TB/s and %.0f TFLOP/s\n", d.bytes_per_s / 1e12,
                d.flops_per_s / 1e12);
    // Sizes of the synthetic presets at full scale (synthetic.hpp); active sets as measured
    // (gpu-results/2026-11-25: ~6,300 at Amazon-670K, 5,500 at WikiLSHTC-325K, 1,330-1,670 at
    // Amazon-3M), top-k as its defaults (64 best, filled to 1,024).
    const preset presets[] = {
        {"amazon670k", 135909, 670091, 490449, 75.7, 6300, 50},
        {"wikilshtc325k", 1617899, 325056, 1778351, 42, 5500, 350},
        {"amazon3m", 337067, 2812281, 1717899, 75.7, 1500, 50},
    };
    for (const preset& p : presets) {
        print(p, floor_selection::lsh, p.lsh_active, d);
        print(p, floor_selection::top_k, 1024, d);
        // --fill-pool's default, where it applies (fill_pool.hpp).
        const double pool =
            fill_pool_size(layer_config{}.fill_pool, uint32_t(p.outputs), 1024, step_shape{}.batch);
        if (pool > 0) print(p, floor_selection::top_k, 1024, d, pool);
        print(p, floor_selection::dense, 0, d);
    }
    return 0;
}
