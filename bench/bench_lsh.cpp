// Benchmarks of the LSH layer: hashing 256-wide dense vectors (the hidden activation of a
// sample, and an output neuron's weight row at a rebuild), hashing every row of an
// Amazon-670K-sized output layer, building its tables, and active-set queries.
//
// Run: build/bench_lsh --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include "hslide/lsh.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <memory>
#include <vector>

using namespace hslide;

namespace {

constexpr uint32_t hidden = 256;  // the default hidden layer of `hslide train`
constexpr uint32_t amazon_items = 670091;

lsh_config slide_config(hash_kind kind) {
    lsh_config c;  // hslide's defaults (see hslide/lsh.hpp)
    c.kind = kind;
    return c;
}

// `count` random vectors of `hidden` floats; relu = true zeroes the negatives (a hidden
// activation), otherwise Gaussian (a weight row).
std::vector<float> random_rows(uint32_t count, bool relu, uint64_t seed) {
    rng gen(seed);
    std::vector<float> rows(static_cast<size_t>(count) * hidden);
    for (auto& v : rows) {
        v = static_cast<float>(gen.normal());
        if (relu && v < 0) v = 0;
    }
    return rows;
}

void hash_dense(benchmark::State& state, hash_kind kind, bool relu) {
    const lsh_config c = slide_config(kind);
    const auto family = hash_family::create(c, hidden, 1);
    const uint32_t n = 1024;
    const auto rows = random_rows(n, relu, 2);
    std::vector<uint32_t> codes(c.L);
    uint32_t r = 0;
    for (auto _ : state) {
        family->codes_dense(rows.data() + static_cast<size_t>(r) * hidden, codes.data());
        benchmark::DoNotOptimize(codes.data());
        r = (r + 1) & (n - 1);
    }
    state.counters["vectors/s"] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
    state.counters["hashes/s"] = benchmark::Counter(
        static_cast<double>(state.iterations()) * c.K * c.L, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(hash_dense, dwta_weights, hash_kind::dwta, false);
BENCHMARK_CAPTURE(hash_dense, dwta_relu, hash_kind::dwta, true);
BENCHMARK_CAPTURE(hash_dense, wta_weights, hash_kind::wta, false);
BENCHMARK_CAPTURE(hash_dense, simhash_weights, hash_kind::simhash, false);
BENCHMARK_CAPTURE(hash_dense, simhash_relu, hash_kind::simhash, true);
BENCHMARK_CAPTURE(hash_dense, minhash_weights, hash_kind::minhash, false);

// Sparse-path hashing of the same vectors (what a caller with sparse activations pays).
void hash_sparse(benchmark::State& state, hash_kind kind) {
    const lsh_config c = slide_config(kind);
    const auto family = hash_family::create(c, hidden, 1);
    const uint32_t n = 1024;
    const auto rows = random_rows(n, true, 2);
    std::vector<std::vector<uint32_t>> ids(n);
    std::vector<std::vector<float>> vals(n);
    for (uint32_t r = 0; r < n; ++r)
        for (uint32_t i = 0; i < hidden; ++i)
            if (rows[static_cast<size_t>(r) * hidden + i] != 0)
                ids[r].push_back(i), vals[r].push_back(rows[static_cast<size_t>(r) * hidden + i]);
    std::vector<uint32_t> codes(c.L);
    uint32_t r = 0;
    for (auto _ : state) {
        family->codes_sparse(ids[r].data(), vals[r].data(), static_cast<uint32_t>(ids[r].size()),
                             codes.data());
        benchmark::DoNotOptimize(codes.data());
        r = (r + 1) & (n - 1);
    }
    state.counters["vectors/s"] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(hash_sparse, dwta_relu, hash_kind::dwta);
BENCHMARK_CAPTURE(hash_sparse, simhash_relu, hash_kind::simhash);

// The codes of every output neuron of an Amazon-670K-sized layer (random weight rows),
// computed once and shared by the table and query benchmarks.
struct amazon_layer {
    lsh_config config = slide_config(hash_kind::dwta);
    std::unique_ptr<hash_family> family = hash_family::create(config, hidden, 7);
    std::vector<uint32_t> codes;
    amazon_layer() {
        codes.resize(static_cast<size_t>(amazon_items) * config.L);
        const uint32_t chunk = 65536;
        for (uint32_t first = 0; first < amazon_items; first += chunk) {
            const uint32_t n = std::min(chunk, amazon_items - first);
            const auto rows = random_rows(n, false, 1000 + first);
            family->codes_dense_rows(rows.data(), n, hidden,
                                     codes.data() + static_cast<size_t>(first) * config.L);
        }
    }
};
const amazon_layer& layer() {
    static const amazon_layer instance;
    return instance;
}

// Hashing all 670,091 weight rows (the hashing part of a rebuild), all threads.
void hash_all_rows(benchmark::State& state) {
    const lsh_config c = slide_config(hash_kind::dwta);
    const auto family = hash_family::create(c, hidden, 7);
    const auto rows = random_rows(amazon_items, false, 3);
    std::vector<uint32_t> codes(static_cast<size_t>(amazon_items) * c.L);
    for (auto _ : state) {
        family->codes_dense_rows(rows.data(), amazon_items, hidden, codes.data());
        benchmark::DoNotOptimize(codes.data());
    }
    state.counters["threads"] = omp_get_max_threads();
    state.counters["rows/s"] = benchmark::Counter(
        static_cast<double>(state.iterations()) * amazon_items, benchmark::Counter::kIsRate);
}
BENCHMARK(hash_all_rows)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

// Building the 50 tables over 670,091 items; arg 0 = threads (0 = all), arg 1 = policy.
void table_build(benchmark::State& state) {
    const amazon_layer& l = layer();
    lsh_config c = l.config;
    c.policy = state.range(1) ? insertion_policy::reservoir : insertion_policy::fifo;
    const int saved = omp_get_max_threads();
    if (state.range(0) > 0) omp_set_num_threads(static_cast<int>(state.range(0)));
    lsh_tables tables(c);
    uint64_t seed = 1;
    for (auto _ : state) tables.build(l.codes.data(), amazon_items, seed++);
    state.counters["threads"] = omp_get_max_threads();
    omp_set_num_threads(saved);
    state.counters["MiB"] = static_cast<double>(tables.memory_bytes()) / (1 << 20);
    double buckets = 0;
    for (int t = 0; t < c.L; ++t) buckets += tables.n_buckets(t);
    state.counters["buckets/table"] = buckets / c.L;
}
BENCHMARK(table_build)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

// Active-set queries against the Amazon-sized tables: hash a sample's hidden vector, then
// the union of its 50 buckets with 10 forced labels. arg 0 = min_active, arg 1 = max_active.
void active_set_query(benchmark::State& state) {
    const amazon_layer& l = layer();
    static lsh_tables tables = [&] {
        lsh_tables t(l.config);
        t.build(l.codes.data(), amazon_items, 1);
        return t;
    }();
    const uint32_t n = 1024;
    const auto samples = random_rows(n, true, 5);
    active_set_builder builder(amazon_items);
    active_set_config cfg;
    cfg.min_active = static_cast<uint32_t>(state.range(0));
    cfg.max_active = static_cast<uint32_t>(state.range(1));
    rng gen(9);
    std::vector<uint32_t> codes(l.config.L), out, forced(10);
    double total_active = 0;
    uint32_t r = 0;
    for (auto _ : state) {
        l.family->codes_dense(samples.data() + static_cast<size_t>(r) * hidden, codes.data());
        for (auto& f : forced) f = static_cast<uint32_t>(gen.below(amazon_items));
        builder.build(tables, codes.data(), forced.data(), 10, cfg, gen, out);
        total_active += static_cast<double>(out.size());
        r = (r + 1) & (n - 1);
    }
    state.counters["queries/s"] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
    state.counters["active"] = total_active / static_cast<double>(state.iterations());
}
BENCHMARK(active_set_query)->Args({0, 0})->Args({1000, 0})->Args({0, 2000})->Args({4000, 4000});

}  // namespace

BENCHMARK_MAIN();
