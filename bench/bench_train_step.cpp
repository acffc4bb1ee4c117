// Training-step cost of an Amazon-670K-shaped network on the CPU backend, with the output
// layer LSH-sparse and with the same output layer dense, and on the dense baseline backend
// (`cpu-dense`: every neuron through OpenBLAS SGEMMs), measured in one run (see
// bench/training.md).
//
// Network: 135,909 inputs -> 256 (ReLU) -> 670,091 outputs (the `hslide train` defaults).
// Data: the amazon670k synthetic preset with 50,000 training points. Each iteration is one
// batch of 128 samples (forward, backward, Adam). The dense output layer costs seconds a
// batch, so it runs a few batches; the counters give the extrapolated epoch time over the
// 50,000 points, excluding table rebuilds (the LSH layer's rebuild cost is in bench_lsh).
//
// Run: build/bench_train_step --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
// Configurations (one run, so their ratios are measured together): the LSH output layer at
// the CPU's best ISA level in fp32 and bf16, at the scalar level, and at the best level on one
// thread; the dense output layer at the best level with hslide's own kernels (backend `cpu`,
// output sparsity dense), and the cpu-dense backend (BLAS GEMMs, same network and batches).
// Environment: HSLIDE_BENCH_THREADS (default: all), HSLIDE_BENCH_DENSE_BATCHES (default 3).
#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"
#include "hslide/synthetic.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
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

/// One configuration: the output layer's sparsity, the kernel level, precision, threads and
/// the backend kind.
struct step_config {
    sparsity_mode output;
    isa_level isa;
    precision_mode precision;
    int threads;
    backend_kind kind = backend_kind::cpu;
};

void train_step(benchmark::State& state, step_config sc) {
    const dataset& data = train_data();
    model_config config;
    config.input_dim = uint32_t(data.n_features);
    layer_config hidden;
    hidden.size = 256;
    hidden.sparsity = sparsity_mode::dense;
    config.layers.push_back(hidden);
    layer_config out;  // lsh_config and active_set_config defaults, as `hslide train` uses
    out.size = uint32_t(data.n_labels);
    out.sparsity = sc.output;
    out.active.min_active = 1024;
    config.layers.push_back(out);
    train_config tc;
    backend_options bo;
    bo.kind = sc.kind;
    bo.threads = sc.threads;
    bo.precision = sc.precision;
    bo.isa = sc.isa;
    set_active_isa(sc.isa);  // the LSH hash kernels follow the process-wide level
    auto engine = create_backend(bo, model_state::create(config, 1), tc);
    clear_active_isa();

    std::vector<uint32_t> order(data.size());
    std::iota(order.begin(), order.end(), 0u);
    size_t next = 0;
    uint64_t samples = 0, active = 0;
    stage_times times;
    for (auto _ : state) {
        if (next + batch_size > order.size()) next = 0;
        const step_report r =
            engine->train_batch({&data, order.data() + next, batch_size}, tc.learning_rate);
        next += batch_size;
        samples += r.samples;
        if (!r.active_per_layer.empty()) active += r.active_per_layer.back();
        times += r.times;
    }
    // Milliseconds per batch in each stage (CPU time per thread, averaged over threads).
    const double per_batch_ms = 1e3 / double(state.iterations());
    state.counters["hash_ms"] = times.hashing * per_batch_ms;
    state.counters["active_ms"] = times.active_sets * per_batch_ms;
    state.counters["fwd_ms"] = times.forward * per_batch_ms;
    state.counters["bwd_ms"] = times.backward * per_batch_ms;
    state.counters["update_ms"] = times.update * per_batch_ms;
    state.counters["samples/s"] = benchmark::Counter(double(samples), benchmark::Counter::kIsRate);
    // (samples / points) / time, inverted: the seconds one epoch over the points would take.
    state.counters["epoch_s_50k"] =
        benchmark::Counter(double(samples) / double(train_points),
                           benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
    state.counters["active"] = double(active) / double(samples);
    state.counters["model_GiB"] = double(engine->info().memory_bytes) / double(1 << 30);
}

void register_benchmarks() {
    const int threads = env_int("HSLIDE_BENCH_THREADS", omp_get_max_threads());
    const isa_level best = detected_isa();
    auto add = [](const std::string& name, step_config sc, int iterations) {
        benchmark::RegisterBenchmark(name.c_str(), train_step, sc)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->Iterations(iterations);
    };
    // One run holds every comparison: best level vs scalar, bf16 vs fp32, 2 threads vs 1.
    const std::string t = "/threads:" + std::to_string(threads);
    add(std::string("train_step/lsh_output/") + to_string(best) + "/fp32" + t,
        {sparsity_mode::lsh, best, precision_mode::fp32, threads}, 40);
    add(std::string("train_step/lsh_output/") + to_string(best) + "/bf16" + t,
        {sparsity_mode::lsh, best, precision_mode::bf16, threads}, 40);
    add("train_step/lsh_output/scalar/fp32" + t,
        {sparsity_mode::lsh, isa_level::scalar, precision_mode::fp32, threads}, 20);
    if (threads > 1)
        add(std::string("train_step/lsh_output/") + to_string(best) + "/fp32/threads:1",
            {sparsity_mode::lsh, best, precision_mode::fp32, 1}, 20);
    add(std::string("train_step/dense_output/") + to_string(best) + "/fp32" + t,
        {sparsity_mode::dense, best, precision_mode::fp32, threads},
        env_int("HSLIDE_BENCH_DENSE_BATCHES", 3));
    // The dense baseline: cpu-dense (OpenBLAS). Its Adam and gathers use the best level's kernels.
    add("train_step/cpu_dense_openblas/fp32" + t,
        {sparsity_mode::dense, best, precision_mode::fp32, threads, backend_kind::cpu_dense},
        env_int("HSLIDE_BENCH_DENSE_BATCHES", 3));
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    register_benchmarks();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
