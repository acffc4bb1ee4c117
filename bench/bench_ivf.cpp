// Benchmarks of the IVF index behind --top-k-search ivf (src/cpu/ivf_index.hpp) on an
// Amazon-670K-sized output layer of --hidden 128 (random rows): building it (two-level
// spherical k-means, the automatic 409 clusters), refreshing it, and searching a chunk of 256 ReLU
// queries for their top 64 with a few probe counts. bench/topk.md has the numbers.
//
// Run: build/bench_ivf --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include "cpu/ivf_index.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <vector>

using namespace hslide;
using namespace hslide::cpu;

namespace {

constexpr uint32_t width = 128, rows = 670091, chunk = 256, top = 64;

struct layer {
    std::vector<float> weights, bias;
    ivf_rows view;
    layer() : weights(size_t(rows) * padded_stride(width)), bias(rows, 0.0f) {
        rng gen(1);
        for (float& v : weights) v = float(gen.normal()) * 0.05f;
        view.weights = weights.data();
        view.stride = padded_stride(width);
        view.bias = bias.data();
        view.rows = rows;
        view.width = width;
    }
};

const layer& the_layer() {
    static const layer l;
    return l;
}

void build(benchmark::State& state) {
    ivf_index index;
    the_layer();  // made before the clock starts
    for (auto _ : state)
        build_ivf_index(index, the_layer().view, 0, 7, best_kernels(), omp_get_max_threads());
    state.counters["clusters"] = index.clusters();
}

void refresh(benchmark::State& state) {
    ivf_index index;
    build_ivf_index(index, the_layer().view, 0, 7, best_kernels(), omp_get_max_threads());
    for (auto _ : state)
        refresh_ivf_index(index, the_layer().view, best_kernels(), omp_get_max_threads());
}

void search(benchmark::State& state) {
    ivf_index index;
    build_ivf_index(index, the_layer().view, 0, 7, best_kernels(), omp_get_max_threads());
    rng gen(2);
    std::vector<std::vector<float>> q(chunk, std::vector<float>(width));
    std::vector<const float*> qp;
    for (auto& v : q) {
        for (float& x : v) x = std::max(0.0f, float(gen.normal()));
        qp.push_back(v.data());
    }
    std::vector<uint32_t> labels(size_t(chunk) * top);
    std::vector<float> scores(size_t(chunk) * top);
    for (auto _ : state)
        ivf_search(index, the_layer().view, best_kernels(), qp.data(), chunk,
                   uint32_t(state.range(0)), top, labels.data(), scores.data(),
                   omp_get_max_threads());
    state.SetItemsProcessed(int64_t(state.iterations()) * chunk);
}

BENCHMARK(build)->Unit(benchmark::kMillisecond);
BENCHMARK(refresh)->Unit(benchmark::kMillisecond);
BENCHMARK(search)->Arg(16)->Arg(48)->Arg(96)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
