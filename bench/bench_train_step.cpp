// Training-step cost of an Amazon-670K-shaped network on the CPU backend, with the output
// layer LSH-sparse and with the same output layer dense, measured in one run (see
// bench/training.md).
//
// Network: 135,909 inputs -> 256 (ReLU) -> 670,091 outputs (the `hslide train` defaults).
// Data: the amazon670k synthetic preset with 50,000 training points. Each iteration is one
// batch of 128 samples (forward, backward, Adam). The dense output layer costs seconds a
// batch, so it runs a few batches; the counters give the extrapolated epoch time over the
// 50,000 points, excluding table rebuilds (the LSH layer's rebuild cost is in bench_lsh).
//
// Run: build/bench_train_step --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Environment: HSLIDE_BENCH_THREADS (default: all), HSLIDE_BENCH_DENSE_BATCHES (default 3),
// HSLIDE_BENCH_PRECISION (fp32 | bf16), HSLIDE_ISA (the kernel level, default the best).
#include "hslide/backend.hpp"
#include "hslide/model.hpp"
#include "hslide/synthetic.hpp"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

using namespace hslide;

namespace {

constexpr uint32_t batch_size = 128;
constexpr uint64_t train_points = 50000;

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

const dataset& train_data() {
    static const dataset data = [] {
        synthetic_config sc;
        sc.preset = "amazon670k";
        sc.n_train = train_points;
        sc.n_test = 1;
        sc.seed = 2024;
        dataset d = generate_synthetic(sc).train;
        normalize_rows_l2(d);
        return d;
    }();
    return data;
}

void train_step(benchmark::State& state, sparsity_mode output) {
    const dataset& data = train_data();
    model_config config;
    config.input_dim = uint32_t(data.n_features);
    layer_config hidden;
    hidden.size = 256;
    hidden.sparsity = sparsity_mode::dense;
    config.layers.push_back(hidden);
    layer_config out;  // lsh_config and active_set_config defaults, as `hslide train` uses
    out.size = uint32_t(data.n_labels);
    out.sparsity = output;
    out.active.min_active = 1024;
    config.layers.push_back(out);
    train_config tc;
    backend_options bo;
    bo.threads = env_int("HSLIDE_BENCH_THREADS", 0);
    if (const char* p = std::getenv("HSLIDE_BENCH_PRECISION")) bo.precision = parse_precision(p);
    auto model = create_backend(bo, model_state::create(config, 1), tc);

    std::vector<uint32_t> order(data.size());
    std::iota(order.begin(), order.end(), 0u);
    size_t next = 0;
    uint64_t samples = 0, active = 0;
    stage_times times;
    for (auto _ : state) {
        if (next + batch_size > order.size()) next = 0;
        const step_report r =
            model->train_batch({&data, order.data() + next, batch_size}, tc.learning_rate);
        next += batch_size;
        samples += r.samples;
        active += r.active_per_layer.back();
        times += r.times;
    }
    // Milliseconds per batch in each stage (CPU time per thread, averaged over threads).
    const double per_batch_ms = 1e3 / double(state.iterations());
    state.counters["hash_ms"] = times.hashing * per_batch_ms;
    state.counters["fwd_ms"] = times.forward * per_batch_ms;
    state.counters["bwd_ms"] = times.backward * per_batch_ms;
    state.counters["update_ms"] = times.update * per_batch_ms;
    state.counters["samples/s"] = benchmark::Counter(double(samples), benchmark::Counter::kIsRate);
    // (samples / points) / time, inverted: the seconds one epoch over the points would take.
    state.counters["epoch_s_50k"] =
        benchmark::Counter(double(samples) / double(train_points),
                           benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
    state.counters["active"] = double(active) / double(samples);
    state.counters["model_GiB"] = double(model->info().memory_bytes) / double(1 << 30);
}

void register_benchmarks() {
    benchmark::RegisterBenchmark("train_step/lsh_output", train_step, sparsity_mode::lsh)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(40);
    benchmark::RegisterBenchmark("train_step/dense_output", train_step, sparsity_mode::dense)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(env_int("HSLIDE_BENCH_DENSE_BATCHES", 3));
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    register_benchmarks();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
