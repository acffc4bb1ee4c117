// Benchmarks of the IVF index behind --top-k-search ivf (src/cpu/ivf_index.hpp) on an
// Amazon-670K-sized output layer of --hidden 128 (the preset network) or 256 (the default run),
// random rows in the model's storage: building it (two-level spherical k-means, the automatic
// 409 clusters), refreshing it (a whole pass with its Lloyd step, or a third of the rows
// reassigned), and searching a chunk of 256 ReLU queries for their top 64 with a few probe
// counts. bench/topk.md has the numbers. `exact` is the exact search it competes with, at a
// smaller layer (Debian's Depends: 15,591 rows of 256, 256 queries for their top 16) in the int8
// copy the CPU searches where it has 8-bit products: its row scores a second beside the
// kernel's alone (bench_kernels' dots16_u8s8) say what the blocking and the offers cost.
//
// Run: build/bench_ivf --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include "cpu/exact_scoring.hpp"
#include "cpu/ivf_index.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <vector>

using namespace hslide;
using namespace hslide::cpu;

namespace {

constexpr uint32_t rows = 670091, chunk = 256, top = 64;

/// The layer's rows in the model's own storage (huge pages where the kernel allows: a cluster's
/// members are scattered over the layer, and on 4-KiB pages nearly every row read would miss
/// the TLB, which training does not see).
struct layer {
    aligned_array<float> weights;
    std::vector<float> bias;
    ivf_rows view;
    explicit layer(uint32_t width)
        : weights(size_t(rows) * padded_stride(width)), bias(rows, 0.0f) {
        rng gen(1);
        for (size_t i = 0; i < weights.size(); ++i) weights[i] = float(gen.normal()) * 0.05f;
        view.weights = weights.data();
        view.stride = padded_stride(width);
        view.bias = bias.data();
        view.rows = rows;
        view.width = width;
    }
};

/// The layer of the preset network (hidden 128) or the default run's (hidden 256).
const layer& the_layer(uint32_t width) {
    static const layer narrow(128);
    if (width == 128) return narrow;
    static const layer wide(256);
    return wide;
}

void build(benchmark::State& state) {
    ivf_index index;
    const layer& l = the_layer(uint32_t(state.range(0)));  // made before the clock starts
    for (auto _ : state)
        build_ivf_index(index, l.view, 0, 7, best_kernels(), omp_get_max_threads());
    state.counters["clusters"] = index.clusters();
}

void refresh(benchmark::State& state) {
    ivf_index index;
    const layer& l = the_layer(uint32_t(state.range(0)));
    build_ivf_index(index, l.view, 0, 7, best_kernels(), omp_get_max_threads());
    for (auto _ : state) refresh_ivf_index(index, l.view, best_kernels(), omp_get_max_threads());
}

/// The partial refresh between Lloyd steps: a third of the rows (what a few steps change at
/// the Amazon-670K shape with the fill pool), scattered.
void reassign(benchmark::State& state) {
    ivf_index index;
    const layer& l = the_layer(uint32_t(state.range(0)));
    build_ivf_index(index, l.view, 0, 7, best_kernels(), omp_get_max_threads());
    std::vector<uint32_t> moved;
    for (uint32_t r = 0; r < rows; ++r)
        if (derive_seed(3, r) % 3 == 0) moved.push_back(r);
    for (auto _ : state)
        reassign_ivf_rows(index, l.view, best_kernels(), moved.data(), uint32_t(moved.size()),
                          omp_get_max_threads());
}

/// A chunk of ReLU'd normal queries of `width`, drawn from `seed`.
struct relu_queries {
    std::vector<std::vector<float>> values;
    std::vector<const float*> pointers;
    relu_queries(uint32_t width, uint64_t seed) : values(chunk, std::vector<float>(width)) {
        rng gen(seed);
        for (auto& v : values) {
            for (float& x : v) x = std::max(0.0f, float(gen.normal()));
            pointers.push_back(v.data());
        }
    }
};

void search(benchmark::State& state) {
    ivf_index index;
    const uint32_t width = uint32_t(state.range(1));
    const layer& l = the_layer(width);
    build_ivf_index(index, l.view, 0, 7, best_kernels(), omp_get_max_threads());
    const relu_queries q(width, 2);
    std::vector<uint32_t> labels(size_t(chunk) * top);
    std::vector<float> scores(size_t(chunk) * top);
    for (auto _ : state)
        ivf_search(index, l.view, best_kernels(), q.pointers.data(), chunk,
                   uint32_t(state.range(0)), top, labels.data(), scores.data(),
                   omp_get_max_threads());
    state.SetItemsProcessed(int64_t(state.iterations()) * chunk);
}

/// The exact search of a chunk of 256 ReLU queries over `rows` random rows of `width`, for
/// their top 16, through the int8 copy where the kernels have 8-bit products.
void exact(benchmark::State& state) {
    const uint32_t n_rows = uint32_t(state.range(0)), width = uint32_t(state.range(1));
    constexpr uint32_t k = 16;
    const kernel_table& kernels = best_kernels();
    rng gen(3);
    aligned_array<float> weights(size_t(n_rows) * padded_stride(width));
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = float(gen.normal()) * 0.05f;
    std::vector<float> bias(n_rows, 0.0f);
    const layer_rows view{
        weights.data(), padded_stride(width), bias.data(), n_rows, width, nullptr, 0};
    int8_copy copy;
    int8_rows copy8;
    if (searches_int8_copy(kernels)) {
        copy = int8_copy(n_rows, width);
        copy8 = copy.view();
        quantize_rows_to_int8(view, kernels, copy8, nullptr, n_rows, omp_get_max_threads());
    }
    const relu_queries q(width, 4);
    std::vector<uint32_t> labels(size_t(chunk) * k);
    std::vector<float> scores(size_t(chunk) * k);
    exact_scoring scorer;
    for (auto _ : state)
        scorer.score(view, kernels, omp_get_max_threads(), q.pointers.data(), chunk, k,
                     labels.data(), scores.data(), nullptr, copy8 ? &copy8 : nullptr);
    state.counters["row_scores_per_s"] = benchmark::Counter(
        double(state.iterations()) * chunk * n_rows, benchmark::Counter::kIsRate);
}

BENCHMARK(build)->ArgName("width")->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK(refresh)->ArgName("width")->Arg(128)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(reassign)->ArgName("width")->Arg(128)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(search)
    ->ArgNames({"probes", "width"})
    ->Args({16, 128})
    ->Args({48, 128})
    ->Args({96, 128})
    ->Args({48, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(exact)
    ->ArgNames({"rows", "width"})
    ->Args({15591, 256})
    ->Args({2048, 256})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
