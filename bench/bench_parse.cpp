// Throughput of the dataset readers and the binary cache (see bench/parsing.md).
//
// Generates an Amazon-670K-shaped XC text once (100k points, 75 features and 5 labels per
// point, D = 135909, L = 670091, values printed like the XC files: `0.123456`), writes it to
// a temporary folder, and times: parse_xc from memory, read_xc from the file, LibSVM parsing
// of the same points, load_dataset without a cache (parse + checksum + cache write) and
// load_dataset from the cache. Every benchmark reports bytes/s of *source text*, so the two
// load_dataset figures divide into the cache's speed-up.
//
// Environment: HSLIDE_BENCH_POINTS overrides the point count.
#include "hslide/dataset.hpp"
#include "hslide/rng.hpp"

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

constexpr uint64_t n_features = 135909;
constexpr uint64_t n_labels = 670091;
constexpr int features_per_point = 75;
constexpr int labels_per_point = 5;

// The generated corpus, built on first use and removed at exit.
struct corpus {
    std::string dir;
    std::string xc_text, libsvm_text;
    std::string xc_path;

    corpus() {
        const char* env = std::getenv("HSLIDE_BENCH_POINTS");
        const size_t points = env ? std::strtoull(env, nullptr, 10) : 100000;
        std::string pattern =
            (std::filesystem::temp_directory_path() / "hslide_bench_XXXXXX").string();
        if (!mkdtemp(pattern.data())) std::abort();
        dir = pattern;

        hslide::rng gen(12345);
        std::vector<uint32_t> ids;
        std::string body_xc, body_svm;
        body_xc.reserve(points * 1200);
        for (size_t i = 0; i < points; ++i) {
            std::vector<uint64_t> lab;
            while (lab.size() < labels_per_point) {
                // Skewed label ids, as in real data where a few labels are frequent.
                const double u = gen.uniform_double();
                const auto id = std::min(static_cast<uint64_t>(u * u * u * n_labels), n_labels - 1);
                if (std::find(lab.begin(), lab.end(), id) == lab.end()) lab.push_back(id);
            }
            const std::string labels = fmt::format("{}", fmt::join(lab, ","));
            ids.clear();
            while (ids.size() < features_per_point) {
                const auto id = static_cast<uint32_t>(gen.below(n_features));
                if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
            }
            std::sort(ids.begin(), ids.end());
            std::string xc = labels, svm = labels;
            for (const uint32_t id : ids) {
                const double v = gen.uniform_double() * 0.4;
                xc += fmt::format(" {}:{:.6f}", id, v);
                svm += fmt::format(" {}:{:.6f}", id + 1, v);
            }
            body_xc += xc + "\n";
            body_svm += svm + "\n";
        }
        xc_text = fmt::format("{} {} {}\n", points, n_features, n_labels) + body_xc;
        libsvm_text = std::move(body_svm);
        xc_path = dir + "/data.txt";
        std::ofstream(xc_path, std::ios::binary) << xc_text;
    }
    ~corpus() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

const corpus& get_corpus() {
    static const corpus c;
    return c;
}

void set_bytes(benchmark::State& state, size_t bytes) {
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void BM_parse_xc_memory(benchmark::State& state) {
    const auto& c = get_corpus();
    for (auto _ : state) {
        auto d = hslide::parse_xc(c.xc_text, "bench");
        benchmark::DoNotOptimize(d.feature_ids.data());
    }
    set_bytes(state, c.xc_text.size());
}

void BM_read_xc_file(benchmark::State& state) {
    const auto& c = get_corpus();
    for (auto _ : state) {
        auto d = hslide::read_xc(c.xc_path);
        benchmark::DoNotOptimize(d.feature_ids.data());
    }
    set_bytes(state, c.xc_text.size());
}

void BM_parse_libsvm_memory(benchmark::State& state) {
    const auto& c = get_corpus();
    for (auto _ : state) {
        auto d = hslide::parse_libsvm(c.libsvm_text, "bench");
        benchmark::DoNotOptimize(d.feature_ids.data());
    }
    set_bytes(state, c.libsvm_text.size());
}

// First load: no cache yet, so parse, checksum and write the cache.
void BM_load_dataset_first(benchmark::State& state) {
    const auto& c = get_corpus();
    hslide::load_options opt;
    opt.cache_dir = c.dir + "/cache";
    const std::string cache = hslide::cache_path_for(c.xc_path, opt);
    for (auto _ : state) {
        state.PauseTiming();
        std::remove(cache.c_str());
        state.ResumeTiming();
        auto d = hslide::load_dataset(c.xc_path, opt);
        benchmark::DoNotOptimize(d.feature_ids.data());
    }
    set_bytes(state, c.xc_text.size());
}

// Second and later loads: from the cache (checksum of the source + reading the arrays).
void BM_load_dataset_cached(benchmark::State& state) {
    const auto& c = get_corpus();
    hslide::load_options opt;
    opt.cache_dir = c.dir + "/cache";
    hslide::load_dataset(c.xc_path, opt);  // make sure the cache exists
    const auto cache_size = std::filesystem::file_size(hslide::cache_path_for(c.xc_path, opt));
    for (auto _ : state) {
        auto d = hslide::load_dataset(c.xc_path, opt);
        benchmark::DoNotOptimize(d.feature_ids.data());
    }
    set_bytes(state, c.xc_text.size());
    state.counters["cache_MB"] = static_cast<double>(cache_size) / 1e6;
    state.counters["text_MB"] = static_cast<double>(c.xc_text.size()) / 1e6;
}

BENCHMARK(BM_parse_xc_memory)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_read_xc_file)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_parse_libsvm_memory)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_load_dataset_first)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_load_dataset_cached)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
