// Benchmarks of the CPU kernel tables (src/cpu/kernels.hpp) at every ISA level this CPU runs,
// on shapes taken from Amazon-670K training (135,909 features -> 256 hidden -> 670,091
// outputs), next to the memory-bandwidth limits they run into: STREAM copy/scale/add/triad
// over arrays larger than the last-level cache, and a read of 1 KiB / 512 B rows at random
// ids (the access pattern of active_dots on the output layer).
//
// Every kernel benchmark reports the bytes the kernel must move (bytes_per_second, and "GB/s"
// in units of 1e9 bytes) and, where the kernel is multiply-adds, "GFLOP/s" (2 FLOP per
// multiply-add; adam counts 14 FLOP per element, sqrt and divide as one each). softmax and
// to_bf16 report "Gelem/s" instead of FLOPs. The kernel and random-row benchmarks are
// single-threaded and use CPU time; the STREAM runs (one and two OpenMP threads) use wall time.
// The big blocks, Adam moments and STREAM arrays take about 4.2 GB, allocated on first use.
//
// Run: build/bench_kernels --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
//          --benchmark_min_time=0.2
// Results: bench/kernels.md.
#include "cpu/kernels.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"
#include "hslide/rng.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

using namespace hslide;
using cpu::bf16;
using cpu::kernel_table;

namespace {

constexpr uint32_t width = 256;  // the default hidden layer of `hslide train`
constexpr size_t stride = 256;   // padded_stride(256)
constexpr uint32_t amazon_items = 670091;
constexpr uint32_t amazon_features = 135909;
constexpr uint32_t active_outputs = 4096;  // active output neurons per sample
constexpr uint32_t active_features = 75;   // non-zero features per sample
constexpr uint32_t adam_rows = 100000;     // rows Adam touches in one update
constexpr uint32_t small_rows = 1024;      // 1 MiB of fp32 rows: L2-resident (2 MiB per core)

// --- data ------------------------------------------------------------------------------------

// Fills p[0..n) with uniform values in [lo, hi), in parallel, reproducibly.
template <class T, class Convert>
void fill_uniform(T* p, size_t n, float lo, float hi, uint64_t seed, Convert convert) {
    constexpr size_t chunk = size_t(1) << 16;
    const int64_t chunks = int64_t((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        rng gen(seed * 1000003u + uint64_t(c));
        const size_t end = std::min(n, size_t(c + 1) * chunk);
        for (size_t i = size_t(c) * chunk; i < end; ++i)
            p[i] = convert(lo + (hi - lo) * gen.uniform());
    }
}
void fill_floats(float* p, size_t n, float lo, float hi, uint64_t seed) {
    fill_uniform(p, n, lo, hi, seed, [](float x) { return x; });
}
void fill_bf16(bf16* p, size_t n, float lo, float hi, uint64_t seed) {
    fill_uniform(p, n, lo, hi, seed, cpu::float_to_bf16);
}
std::vector<float> random_floats(size_t n, float lo, float hi, uint64_t seed) {
    std::vector<float> v(n);
    fill_floats(v.data(), n, lo, hi, seed);
    return v;
}

// A random permutation of 0..n-1, cut into consecutive batches: every batch holds distinct,
// unsorted ids, and a row comes back only after every other row has been visited, so neither
// the hardware prefetcher nor the caches can learn the ids.
struct id_pool {
    std::vector<uint32_t> ids;
    size_t next = 0;
    id_pool(uint32_t n, uint64_t seed) : ids(n) {
        for (uint32_t i = 0; i < n; ++i) ids[i] = i;
        rng gen(seed);
        for (uint32_t i = n - 1; i > 0; --i) std::swap(ids[i], ids[gen.below(i + 1)]);
    }
    // The next `count` ids (count <= ids.size()).
    const uint32_t* batch(uint32_t count) {
        if (next + count > ids.size()) next = 0;
        const uint32_t* p = ids.data() + next;
        next += count;
        return p;
    }
};

// The output layer of the Amazon-670K network: 670,091 rows of 256 weights (686 MB fp32,
// 343 MB bf16), plus its bias; and the input layer: 135,909 feature rows of 256. Allocated and
// filled once, on first use (huge pages where the kernel allows, like the model's blocks).
struct blocks {
    aligned_floats out_w{size_t(amazon_items) * stride};
    aligned_array<bf16> out_w16{size_t(amazon_items) * stride};
    aligned_floats out_bias{amazon_items};
    aligned_floats in_w{size_t(amazon_features) * stride};
    aligned_array<bf16> in_w16{size_t(amazon_features) * stride};
    blocks() {
        fill_floats(out_w.data(), out_w.size(), -0.05f, 0.05f, 1);
        fill_bf16(out_w16.data(), out_w16.size(), -0.05f, 0.05f, 2);
        fill_floats(out_bias.data(), out_bias.size(), -0.01f, 0.01f, 3);
        fill_floats(in_w.data(), in_w.size(), -0.05f, 0.05f, 4);
        fill_bf16(in_w16.data(), in_w16.size(), -0.05f, 0.05f, 5);
    }
};
blocks& big() {
    static blocks instance;
    return instance;
}

// Adam moments for the output layer (the weights are big().out_w) and a gradient row for
// each of the adam_rows rows an update touches.
struct adam_state {
    aligned_floats m{size_t(amazon_items) * stride};
    aligned_floats v{size_t(amazon_items) * stride};
    aligned_floats g{size_t(adam_rows) * stride};
    adam_state() {
        fill_floats(m.data(), m.size(), -1e-3f, 1e-3f, 11);
        fill_floats(v.data(), v.size(), 1e-8f, 1e-6f, 12);
        fill_floats(g.data(), g.size(), -1e-2f, 1e-2f, 13);
    }
};
adam_state& adam_big() {
    static adam_state instance;
    return instance;
}

// Reports bytes moved and FLOPs (or elements) per iteration as rates.
void report(benchmark::State& state, double bytes, double flops, double elements = 0) {
    const double it = double(state.iterations());
    state.SetBytesProcessed(int64_t(it * bytes));
    state.counters["GB/s"] = benchmark::Counter(it * bytes * 1e-9, benchmark::Counter::kIsRate);
    if (flops > 0)
        state.counters["GFLOP/s"] =
            benchmark::Counter(it * flops * 1e-9, benchmark::Counter::kIsRate);
    if (elements > 0)
        state.counters["Gelem/s"] =
            benchmark::Counter(it * elements * 1e-9, benchmark::Counter::kIsRate);
}

const cpu::adam_step adam_constants{1e-3f, 0.9f, 0.999f, 1e-8f, 1.1f, 1.01f};

// --- layer kernels ---------------------------------------------------------------------------

// active_dots over `n_active` random rows of the 670,091-row output layer.
template <class T>
void active_dots_big(benchmark::State& state, const kernel_table& k) {
    blocks& b = big();
    id_pool pool(amazon_items, 21);
    const auto xf = random_floats(width, 0.0f, 1.0f, 22);
    std::vector<bf16> x16(width);
    for (uint32_t i = 0; i < width; ++i) x16[i] = cpu::float_to_bf16(xf[i]);
    std::vector<float> out(active_outputs);
    for (auto _ : state) {
        const uint32_t* ids = pool.batch(active_outputs);
        if constexpr (std::is_same_v<T, bf16>)
            k.active_dots_bf16(b.out_w16.data(), stride, width, ids, active_outputs, x16.data(),
                               b.out_bias.data(), out.data());
        else
            k.active_dots(b.out_w.data(), stride, width, ids, active_outputs, xf.data(),
                          b.out_bias.data(), out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    // Rows and x; ids, bias and out at 4 bytes each per active row.
    const double bytes = double(active_outputs) * (width * sizeof(T) + 12) + width * sizeof(T);
    report(state, bytes, 2.0 * active_outputs * width);
}

// active_dots over all rows of an L2-resident block, in a fresh random order each call.
template <class T>
void active_dots_small(benchmark::State& state, const kernel_table& k) {
    aligned_floats wf(size_t(small_rows) * stride);
    aligned_array<bf16> w16(size_t(small_rows) * stride);
    fill_floats(wf.data(), wf.size(), -0.05f, 0.05f, 31);
    fill_bf16(w16.data(), w16.size(), -0.05f, 0.05f, 32);
    const auto bias = random_floats(small_rows, -0.01f, 0.01f, 33);
    const auto xf = random_floats(width, 0.0f, 1.0f, 34);
    std::vector<bf16> x16(width);
    for (uint32_t i = 0; i < width; ++i) x16[i] = cpu::float_to_bf16(xf[i]);
    // 16 shuffles of the block's rows.
    std::vector<uint32_t> orders;
    for (uint64_t s = 0; s < 16; ++s) {
        id_pool p(small_rows, 40 + s);
        orders.insert(orders.end(), p.ids.begin(), p.ids.end());
    }
    std::vector<float> out(small_rows);
    uint32_t turn = 0;
    for (auto _ : state) {
        const uint32_t* ids = orders.data() + size_t(turn) * small_rows;
        turn = (turn + 1) & 15;
        if constexpr (std::is_same_v<T, bf16>)
            k.active_dots_bf16(w16.data(), stride, width, ids, small_rows, x16.data(), bias.data(),
                               out.data());
        else
            k.active_dots(wf.data(), stride, width, ids, small_rows, xf.data(), bias.data(),
                          out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double bytes = double(small_rows) * (width * sizeof(T) + 12) + width * sizeof(T);
    report(state, bytes, 2.0 * small_rows * width);
}

// dots16 of an L2-resident block of rows against 16 inputs: exact scoring's product (beside
// active_dots_small, which scores the same block for one input).
void dots16_small(benchmark::State& state, const kernel_table& k) {
    aligned_floats wf(size_t(small_rows) * stride);
    fill_floats(wf.data(), wf.size(), -0.05f, 0.05f, 35);
    const auto bias = random_floats(small_rows, -0.01f, 0.01f, 36);
    const uint32_t inputs = 16;
    const auto xt = random_floats(size_t(inputs) * width, 0.0f, 1.0f, 37);
    std::vector<float> out(size_t(inputs) * small_rows);
    for (auto _ : state) {
        k.dots16(wf.data(), stride, width, nullptr, small_rows, xt.data(), bias.data(), out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    // Rows once, bias and out per row and input, the inputs once.
    const double bytes =
        double(small_rows) * (width * 4.0 + 4.0 * (1 + inputs)) + double(inputs) * width * 4.0;
    report(state, bytes, 2.0 * inputs * small_rows * width);
}

// dots16_bf16 on the same block in bf16, the inputs in pairs: exact scoring's product in bf16
// precision (levels without it score per input with active_dots_bf16, as the row beside).
void dots16_bf16_small(benchmark::State& state, const kernel_table& k) {
    if (!k.dots16_bf16) {
        state.SkipWithError("no native dots16_bf16 on this level");
        return;
    }
    aligned_array<bf16> w16(size_t(small_rows) * stride);
    fill_bf16(w16.data(), w16.size(), -0.05f, 0.05f, 38);
    const auto bias = random_floats(small_rows, -0.01f, 0.01f, 39);
    const uint32_t inputs = 16;
    aligned_array<bf16> xp(size_t(inputs) * width);
    fill_bf16(xp.data(), xp.size(), 0.0f, 1.0f, 40);
    std::vector<float> out(size_t(inputs) * small_rows);
    for (auto _ : state) {
        k.dots16_bf16(w16.data(), stride, width, small_rows, xp.data(), bias.data(), out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double bytes =
        double(small_rows) * (width * 2.0 + 4.0 * (1 + inputs)) + double(inputs) * width * 2.0;
    report(state, bytes, 2.0 * inputs * small_rows * width);
}

// dots16_u8s8 on the same shape in int8: the rows quantized a row at a time by the level's
// to_int8_row (a scale and a sum per row), the inputs as u8 in fours with per-input scales and
// zero points (up to the level's u8s8_input_max): exact scoring's product over an int8 copy
// (vpdpbusd on avx512bf16, vpmaddubsw on avx2; levels without 8-bit products have none). GFLOP/s
// counts its integer multiply-adds as 2 each, comparable with the fp32 and bf16 rows beside it.
void dots16_u8s8_small(benchmark::State& state, const kernel_table& k) {
    if (!k.dots16_u8s8) {
        state.SkipWithError("no dots16_u8s8 on this level");
        return;
    }
    const auto wf = random_floats(size_t(small_rows) * width, -0.05f, 0.05f, 41);
    aligned_array<int8_t> w8(size_t(small_rows) * stride);
    std::vector<float> row_scale(small_rows);
    std::vector<int32_t> row_sum(small_rows);
    for (uint32_t r = 0; r < small_rows; ++r)
        row_scale[r] = k.to_int8_row(wf.data() + size_t(r) * width, w8.data() + size_t(r) * stride,
                                     width, &row_sum[r]);
    const auto bias = random_floats(small_rows, -0.01f, 0.01f, 42);
    const uint32_t inputs = 16;
    aligned_array<uint8_t> xq(size_t(inputs) * width);  // width % 4 == 0: no padding
    rng gen(43);
    const uint32_t levels = k.u8s8_input_max + 1u;  // the level's input range
    for (size_t i = 0; i < xq.size(); ++i) xq[i] = uint8_t(gen.below(levels));
    std::vector<float> query_scale(inputs, 1.0f / float(k.u8s8_input_max));
    std::vector<int32_t> query_zero(inputs);
    for (int32_t& z : query_zero) z = int32_t(gen.below(levels));
    std::vector<float> out(size_t(inputs) * small_rows);
    for (auto _ : state) {
        k.dots16_u8s8(w8.data(), stride, width, small_rows, xq.data(), row_scale.data(),
                      row_sum.data(), query_scale.data(), query_zero.data(), bias.data(),
                      out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    // Rows once, their scale, sum and bias and out per row and input, the inputs once.
    const double bytes =
        double(small_rows) * (width * 1.0 + 4.0 * (3 + inputs)) + double(inputs) * width * 1.0;
    report(state, bytes, 2.0 * inputs * small_rows * width);
}

// weighted_vector_sum of `n` vectors (a row's gradient over the samples of a batch that
// touched it; 128 = a dense layer's row in a batch of 128).
void weighted_vector_sum_bench(benchmark::State& state, const kernel_table& k, uint32_t n) {
    const auto vectors = random_floats(size_t(n) * stride, -1.0f, 1.0f, 38);
    const auto coef = random_floats(n, -1e-3f, 1e-3f, 39);
    std::vector<const float*> pointers(n);
    for (uint32_t i = 0; i < n; ++i) pointers[i] = vectors.data() + size_t(i) * stride;
    std::vector<float> out(width, 0.0f);
    for (auto _ : state) {
        k.weighted_vector_sum(pointers.data(), coef.data(), n, width, out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double bytes = double(n) * (width * 4.0 + 12.0) + 2.0 * width * 4.0;
    report(state, bytes, 2.0 * n * width);
}

// weighted_vector_sum4 against four weighted_vector_sum calls (`four` false) over the same `n`
// vectors of `w` floats: four rows of a dense layer (or a dense input's feature rows) in a
// batch of 128, Yeast's 512-wide hidden layer. Counted as four sums either way.
void weighted_vector_sum4_bench(benchmark::State& state, const kernel_table& k, uint32_t n,
                                uint32_t w, bool four) {
    const auto vectors = random_floats(size_t(n) * w, -1.0f, 1.0f, 38);
    const auto coefs = random_floats(size_t(n) * 4, -1e-3f, 1e-3f, 39);
    std::vector<const float*> pointers(n);
    for (uint32_t i = 0; i < n; ++i) pointers[i] = vectors.data() + size_t(i) * w;
    std::vector<float> out(size_t(4) * w, 0.0f);
    const float* coef[4];
    float* outs[4];
    for (int j = 0; j < 4; ++j) {
        coef[j] = coefs.data() + size_t(j) * n;
        outs[j] = out.data() + size_t(j) * w;
    }
    for (auto _ : state) {
        if (four) {
            k.weighted_vector_sum4(pointers.data(), coef, n, w, outs);
        } else {
            for (int j = 0; j < 4; ++j)
                k.weighted_vector_sum(pointers.data(), coef[j], n, w, outs[j]);
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double bytes = (four ? 1.0 : 4.0) * double(n) * w * 4.0 + 4.0 * (n * 4.0 + 2.0 * w * 4.0);
    report(state, bytes, 4 * 2.0 * n * w);
}

// weighted_row_sum of `n` random rows of a block of `rows` rows: the input layer's forward
// (75 feature rows of 135,909) and the output layer's backward (4,096 rows of 670,091).
template <class T>
void weighted_row_sum_rows(benchmark::State& state, const kernel_table& k, uint32_t rows,
                           uint32_t n) {
    blocks& b = big();
    const bool input_layer = rows == amazon_features;
    const float* wf = input_layer ? b.in_w.data() : b.out_w.data();
    const bf16* w16 = input_layer ? b.in_w16.data() : b.out_w16.data();
    id_pool pool(rows, 51);
    // Feature values (positive) or output deltas (either sign), a fresh set each call.
    const uint32_t coef_sets = 64;
    const auto coef = input_layer ? random_floats(size_t(n) * coef_sets, 0.0f, 0.2f, 52)
                                  : random_floats(size_t(n) * coef_sets, -1e-3f, 1e-3f, 53);
    std::vector<float> out(width, 0.0f);
    uint32_t turn = 0;
    for (auto _ : state) {
        const uint32_t* ids = pool.batch(n);
        const float* c = coef.data() + size_t(turn) * n;
        turn = (turn + 1) % coef_sets;
        if constexpr (std::is_same_v<T, bf16>)
            k.weighted_row_sum_bf16(w16, stride, width, ids, c, n, out.data());
        else
            k.weighted_row_sum(wf, stride, width, ids, c, n, out.data());
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    // Rows; ids and coefficients at 4 bytes each per row; out read and written.
    const double bytes = double(n) * (width * sizeof(T) + 8) + 2.0 * width * sizeof(float);
    report(state, bytes, 2.0 * n * width);
}

// Adam on 100,000 random rows of the output layer (w, m, v at random rows, g streamed).
void adam_rows_big(benchmark::State& state, const kernel_table& k) {
    blocks& b = big();
    adam_state& a = adam_big();
    id_pool pool(amazon_items, 61);
    for (auto _ : state) {
        const uint32_t* ids = pool.batch(adam_rows);
        for (uint32_t i = 0; i < adam_rows; ++i) {
            const size_t off = size_t(ids[i]) * stride;
            k.adam(b.out_w.data() + off, a.m.data() + off, a.v.data() + off,
                   a.g.data() + size_t(i) * stride, width, adam_constants);
        }
        benchmark::ClobberMemory();
    }
    // w, m, v read and written, g read: 7 x 4 bytes per element.
    const double elems = double(adam_rows) * width;
    report(state, elems * 28, elems * 14);
}

// Adam on one L1-resident row of 256, over and over.
void adam_row_l1(benchmark::State& state, const kernel_table& k) {
    auto w = random_floats(width, -0.05f, 0.05f, 71);
    auto m = random_floats(width, -1e-3f, 1e-3f, 72);
    auto v = random_floats(width, 1e-8f, 1e-6f, 73);
    const auto g = random_floats(width, -1e-2f, 1e-2f, 74);
    for (auto _ : state) {
        k.adam(w.data(), m.data(), v.data(), g.data(), width, adam_constants);
        benchmark::ClobberMemory();
    }
    report(state, double(width) * 28, double(width) * 14);
}

// adam_rows_big with bf16 moments (--adam-moments bf16): w read and written (8 bytes), m and v
// (4 each), g read (4): 20 bytes per element.
void adam_bf16_moments_rows_big(benchmark::State& state, const kernel_table& k) {
    blocks& b = big();
    static aligned_array<bf16> m16(size_t(amazon_items) * stride), v16(m16.size());
    adam_state& a = adam_big();
    id_pool pool(amazon_items, 61);
    uint32_t seed = 1;
    for (auto _ : state) {
        const uint32_t* ids = pool.batch(adam_rows);
        for (uint32_t i = 0; i < adam_rows; ++i) {
            const size_t off = size_t(ids[i]) * stride;
            k.adam_bf16_moments(b.out_w.data() + off, m16.data() + off, v16.data() + off,
                                a.g.data() + size_t(i) * stride, width, adam_constants, seed++);
        }
        benchmark::ClobberMemory();
    }
    const double elems = double(adam_rows) * width;
    report(state, elems * 20, elems * 14);
}

// adam_row_l1 with bf16 moments: the kernel's arithmetic and its stochastic rounding's hashes.
void adam_bf16_moments_row_l1(benchmark::State& state, const kernel_table& k) {
    auto w = random_floats(width, -0.05f, 0.05f, 71);
    std::vector<bf16> m(width), v(width);
    const auto m32 = random_floats(width, -1e-3f, 1e-3f, 72);
    const auto v32 = random_floats(width, 1e-8f, 1e-6f, 73);
    for (uint32_t i = 0; i < width; ++i) {
        m[i] = cpu::float_to_bf16(m32[i]);
        v[i] = cpu::float_to_bf16(v32[i]);
    }
    const auto g = random_floats(width, -1e-2f, 1e-2f, 74);
    uint32_t seed = 1;
    for (auto _ : state) {
        k.adam_bf16_moments(w.data(), m.data(), v.data(), g.data(), width, adam_constants, seed++);
        benchmark::ClobberMemory();
    }
    report(state, double(width) * 20, double(width) * 14);
}

// --- vector primitives (in cache) --------------------------------------------------------------

void dot_bench(benchmark::State& state, const kernel_table& k, uint32_t n) {
    const auto a = random_floats(n, -1.0f, 1.0f, 81);
    const auto b = random_floats(n, -1.0f, 1.0f, 82);
    for (auto _ : state) benchmark::DoNotOptimize(k.dot(a.data(), b.data(), n));
    report(state, 8.0 * n, 2.0 * n);
}

void axpy_bench(benchmark::State& state, const kernel_table& k, uint32_t n) {
    const auto x = random_floats(n, -1.0f, 1.0f, 83);
    auto y = random_floats(n, -1.0f, 1.0f, 84);
    float alpha = 1e-3f;
    for (auto _ : state) {
        k.axpy(alpha, x.data(), y.data(), n);
        alpha = -alpha;  // y stays bounded
        benchmark::ClobberMemory();
    }
    report(state, 12.0 * n, 2.0 * n);
}

// `nnz` random distinct ids into a vector of `dim` (a sparse hidden activation).
std::vector<uint32_t> sparse_ids(uint32_t dim, uint32_t nnz, uint64_t seed) {
    id_pool p(dim, seed);
    return {p.ids.begin(), p.ids.begin() + nnz};
}

void gather_dot_bench(benchmark::State& state, const kernel_table& k, uint32_t dim, uint32_t nnz) {
    const auto row = random_floats(dim, -0.05f, 0.05f, 85);
    const auto ids = sparse_ids(dim, nnz, 86);
    const auto values = random_floats(nnz, 0.0f, 1.0f, 87);
    for (auto _ : state)
        benchmark::DoNotOptimize(k.gather_dot(row.data(), ids.data(), values.data(), nnz));
    // id, value and the gathered element: 12 bytes per non-zero.
    report(state, 12.0 * nnz, 2.0 * nnz);
}

void scatter_axpy_bench(benchmark::State& state, const kernel_table& k, uint32_t dim,
                        uint32_t nnz) {
    auto y = random_floats(dim, -1.0f, 1.0f, 88);
    const auto ids = sparse_ids(dim, nnz, 89);
    const auto values = random_floats(nnz, 0.0f, 1.0f, 90);
    float alpha = 1e-3f;
    for (auto _ : state) {
        k.scatter_axpy(alpha, ids.data(), values.data(), y.data(), nnz);
        alpha = -alpha;
        benchmark::ClobberMemory();
    }
    // id, value, y read and written: 16 bytes per non-zero.
    report(state, 16.0 * nnz, 2.0 * nnz);
}

void softmax_bench(benchmark::State& state, const kernel_table& k, uint32_t n) {
    const auto logits = random_floats(n, -5.0f, 5.0f, 91);
    std::vector<float> probs(n);
    for (auto _ : state) {
        benchmark::DoNotOptimize(k.softmax(logits.data(), probs.data(), n));
        benchmark::ClobberMemory();
    }
    report(state, 8.0 * n, 0, n);  // logits read, probs written
}

/// keep_best on buffers of 2 * kept random candidates (the exact search's cut), each call on a
/// fresh copy of one of 8,192 buffers (too many for a branch predictor to learn their
/// comparisons); "nth_element" is the std::nth_element the kernel replaced.
void keep_best_bench(benchmark::State& state, const kernel_table* k, uint32_t kept) {
    using candidate = std::pair<float, uint32_t>;
    const uint32_t n = 2 * kept, buffers = 8192;
    const auto scores = random_floats(size_t(n) * buffers, -5.0f, 5.0f, 93);
    std::vector<candidate> source(scores.size()), work(n);
    for (size_t i = 0; i < source.size(); ++i) source[i] = {scores[i], uint32_t(i % 6118)};
    auto by_rank = [](const candidate& a, const candidate& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    uint32_t b = 0;
    for (auto _ : state) {
        std::copy_n(source.begin() + size_t(b) * n, n, work.begin());
        b = (b + 1) % buffers;
        if (k) {
            benchmark::DoNotOptimize(k->keep_best(work.data(), n, kept));
        } else {
            std::nth_element(work.begin(), work.begin() + (kept - 1), work.end(), by_rank);
            benchmark::DoNotOptimize(work[kept - 1].first);
        }
        benchmark::ClobberMemory();
    }
    report(state, 2.0 * n * sizeof(candidate), 0, n);
}

void to_bf16_bench(benchmark::State& state, const kernel_table& k, uint32_t n) {
    const auto x = random_floats(n, -1.0f, 1.0f, 92);
    std::vector<bf16> out(n);
    for (auto _ : state) {
        k.to_bf16(x.data(), out.data(), n);
        benchmark::ClobberMemory();
    }
    report(state, 6.0 * n, 0, n);
}

// --- bandwidth baselines ---------------------------------------------------------------------

// STREAM: three arrays of 64 Mi doubles (512 MiB each, 1.5 GiB in all; the LLC reports
// 300 MiB), bytes counted STREAM's way (no write-allocate traffic).
constexpr size_t stream_n = size_t(64) << 20;
struct stream_arrays {
    aligned_array<double> a{stream_n}, b{stream_n}, c{stream_n};
    stream_arrays() {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < int64_t(stream_n); ++i) a[i] = 1.0, b[i] = 2.0, c[i] = 0.0;
    }
};
stream_arrays& stream() {
    static stream_arrays instance;
    return instance;
}

enum class stream_op { copy, scale, add, triad };

// Plain loops, as STREAM writes them (GCC would otherwise turn copy into a memcpy call,
// whose non-temporal stores STREAM does not use).
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
void stream_pass(stream_op op, double* a, double* b, double* c, int threads) {
    const double q = 3.0;
    const int64_t n = int64_t(stream_n);
    switch (op) {
        case stream_op::copy:
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t i = 0; i < n; ++i) c[i] = a[i];
            break;
        case stream_op::scale:
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t i = 0; i < n; ++i) b[i] = q * c[i];
            break;
        case stream_op::add:
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
            break;
        case stream_op::triad:
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t i = 0; i < n; ++i) a[i] = b[i] + q * c[i];
            break;
    }
}

void stream_bench(benchmark::State& state, stream_op op, int threads) {
    stream_arrays& s = stream();
    for (auto _ : state) {
        stream_pass(op, s.a.data(), s.b.data(), s.c.data(), threads);
        benchmark::ClobberMemory();
    }
    const bool three = op == stream_op::add || op == stream_op::triad;
    report(state, double(stream_n) * sizeof(double) * (three ? 3 : 2), 0);
}

// Reads `row_bytes` rows at 4,096 random ids per call from the output layer (fp32: 1 KiB rows,
// bf16: 512 B rows; one word of every cache line, summed), prefetching every line of the row
// `ahead` rows ahead (0: none; active_dots prefetches 4 ahead). The ceiling of the random row
// access pattern on this machine.
void random_rows_bench(benchmark::State& state, uint32_t row_bytes, uint32_t ahead) {
    using word = uint64_t __attribute__((may_alias));  // the rows hold floats or bf16
    blocks& b = big();
    const char* base = row_bytes == width * sizeof(float)
                           ? reinterpret_cast<const char*>(b.out_w.data())
                           : reinterpret_cast<const char*>(b.out_w16.data());
    const size_t row_stride = row_bytes;  // both blocks have stride == width
    id_pool pool(amazon_items, 101);
    uint64_t total = 0;
    for (auto _ : state) {
        const uint32_t* ids = pool.batch(active_outputs);
        uint64_t sum = 0;
        for (uint32_t a = 0; a < active_outputs; ++a) {
            if (ahead && a + ahead < active_outputs) {
                const char* p = base + size_t(ids[a + ahead]) * row_stride;
                for (uint32_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
            }
            // One load per 64-byte line: the whole row comes in, with few instructions per
            // row, so the out-of-order window reaches many rows ahead.
            const char* row = base + size_t(ids[a]) * row_stride;
            for (uint32_t off = 0; off < row_bytes; off += 64)
                sum += *reinterpret_cast<const word*>(row + off);
        }
        total += sum;
        benchmark::DoNotOptimize(total);
    }
    report(state, double(active_outputs) * row_bytes, 0);
}

// --- registration ----------------------------------------------------------------------------

std::vector<const kernel_table*> supported_tables() {
    std::vector<const kernel_table*> tables;
    for (isa_level level : {isa_level::scalar, isa_level::avx2, isa_level::avx512,
                            isa_level::avx512bf16, isa_level::amx})
        if (isa_supported(level)) tables.push_back(&cpu::kernels_for(level));
    return tables;
}

template <class Fn>
void add(const std::string& name, Fn fn, bool wall_time = false) {
    auto* b = benchmark::RegisterBenchmark(name.c_str(), fn);
    if (wall_time) b->UseRealTime();
}

void register_all() {
    benchmark::AddCustomContext("hslide_detected_isa", to_string(detected_isa()));

    for (stream_op op : {stream_op::copy, stream_op::scale, stream_op::add, stream_op::triad})
        for (int threads : {1, 2}) {
            static const char* const names[] = {"copy", "scale", "add", "triad"};
            add(
                std::string("stream/") + names[int(op)] + "/threads:" + std::to_string(threads),
                [op, threads](benchmark::State& s) { stream_bench(s, op, threads); },
                /*wall_time=*/true);
        }
    for (uint32_t row_bytes : {1024u, 512u})
        for (uint32_t ahead : {0u, 4u, 16u})
            add("random_rows/read/rows:670091/row_bytes:" + std::to_string(row_bytes) +
                    "/prefetch:" + std::to_string(ahead),
                [row_bytes, ahead](benchmark::State& s) {
                    random_rows_bench(s, row_bytes, ahead);
                });

    const auto tables = supported_tables();
    auto each_level = [&](const std::string& kernel, const std::string& shape, auto fn) {
        for (const kernel_table* k : tables)
            add(kernel + "/" + k->name + "/" + shape, [k, fn](benchmark::State& s) { fn(s, *k); });
    };
    const std::string big_shape = "rows:670091/active:4096/width:256";
    const std::string small_shape = "rows:1024/active:1024/width:256";

    each_level("active_dots", big_shape,
               [](benchmark::State& s, const kernel_table& k) { active_dots_big<float>(s, k); });
    each_level("active_dots", small_shape,
               [](benchmark::State& s, const kernel_table& k) { active_dots_small<float>(s, k); });
    each_level("active_dots_bf16", big_shape,
               [](benchmark::State& s, const kernel_table& k) { active_dots_big<bf16>(s, k); });
    each_level("active_dots_bf16", small_shape,
               [](benchmark::State& s, const kernel_table& k) { active_dots_small<bf16>(s, k); });

    each_level("dots16", "rows:1024/inputs:16/width:256", dots16_small);
    each_level("dots16_bf16", "rows:1024/inputs:16/width:256", dots16_bf16_small);
    each_level("dots16_u8s8", "rows:1024/inputs:16/width:256", dots16_u8s8_small);
    each_level(
        "weighted_vector_sum", "n:128/width:256",
        [](benchmark::State& s, const kernel_table& k) { weighted_vector_sum_bench(s, k, 128); });

    each_level("weighted_vector_sum_x4", "n:128/width:512",
               [](benchmark::State& s, const kernel_table& k) {
                   weighted_vector_sum4_bench(s, k, 128, 512, false);
               });
    each_level("weighted_vector_sum4", "n:128/width:512",
               [](benchmark::State& s, const kernel_table& k) {
                   weighted_vector_sum4_bench(s, k, 128, 512, true);
               });
    each_level("weighted_row_sum", "rows:135909/active:75/width:256",
               [](benchmark::State& s, const kernel_table& k) {
                   weighted_row_sum_rows<float>(s, k, amazon_features, active_features);
               });
    each_level("weighted_row_sum", big_shape, [](benchmark::State& s, const kernel_table& k) {
        weighted_row_sum_rows<float>(s, k, amazon_items, active_outputs);
    });
    each_level("weighted_row_sum_bf16", "rows:135909/active:75/width:256",
               [](benchmark::State& s, const kernel_table& k) {
                   weighted_row_sum_rows<bf16>(s, k, amazon_features, active_features);
               });
    each_level("weighted_row_sum_bf16", big_shape, [](benchmark::State& s, const kernel_table& k) {
        weighted_row_sum_rows<bf16>(s, k, amazon_items, active_outputs);
    });

    each_level("adam", "rows:670091/active:100000/width:256", adam_rows_big);
    each_level("adam", "rows:1/width:256", adam_row_l1);
    each_level("adam_bf16_moments", "rows:670091/active:100000/width:256",
               adam_bf16_moments_rows_big);
    each_level("adam_bf16_moments", "rows:1/width:256", adam_bf16_moments_row_l1);

    each_level("dot", "n:256",
               [](benchmark::State& s, const kernel_table& k) { dot_bench(s, k, 256); });
    each_level("axpy", "n:256",
               [](benchmark::State& s, const kernel_table& k) { axpy_bench(s, k, 256); });
    each_level("gather_dot", "dim:4096/nnz:256", [](benchmark::State& s, const kernel_table& k) {
        gather_dot_bench(s, k, 4096, 256);
    });
    each_level("scatter_axpy", "dim:4096/nnz:256", [](benchmark::State& s, const kernel_table& k) {
        scatter_axpy_bench(s, k, 4096, 256);
    });
    for (uint32_t n : {4096u, 128u})
        each_level("softmax", "n:" + std::to_string(n),
                   [n](benchmark::State& s, const kernel_table& k) { softmax_bench(s, k, n); });
    each_level("to_bf16", "n:256",
               [](benchmark::State& s, const kernel_table& k) { to_bf16_bench(s, k, 256); });
    for (uint32_t kept : {16u, 32u, 64u}) {
        const std::string shape = "kept:" + std::to_string(kept);
        add("keep_best/nth_element/" + shape,
            [kept](benchmark::State& s) { keep_best_bench(s, nullptr, kept); });
        each_level("keep_best", shape, [kept](benchmark::State& s, const kernel_table& k) {
            keep_best_bench(s, &k, kept);
        });
    }
}

}  // namespace

int main(int argc, char** argv) {
    register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
