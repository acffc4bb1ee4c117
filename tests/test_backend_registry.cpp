// Tests of the backend registry: one table of kinds, names, factories and capabilities, read
// by the CLI's help and checks and by the hybrid's worker parsing; and the rooms around it
// (includes run downwards, only the registry includes both backends).
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/row_transfer.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace hslide;
using hslide::testing::run_hslide;

constexpr backend_kind all_kinds[] = {backend_kind::cpu, backend_kind::cpu_dense, backend_kind::gpu,
                                      backend_kind::gpu_dense, backend_kind::hybrid};

/// input 30 -> `hidden` (one layer per entry) -> 40 (LSH output, `probes`).
model_config model_with(std::vector<uint32_t> hidden, uint32_t probes = 0) {
    model_config c = hslide::testing::two_layer_model(30, hidden[0], 40, sparsity_mode::lsh);
    for (size_t i = 1; i < hidden.size(); ++i) c.layers.insert(c.layers.end() - 1, c.layers[0]);
    for (size_t i = 0; i < hidden.size(); ++i) c.layers[i].size = hidden[i];
    c.layers.back().active.probes = probes;
    return c;
}

train_config with_adam(adam_mode mode) {
    train_config t;
    t.adam = mode;
    return t;
}

/// The message of the hslide::error `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F f) {
    try {
        f();
    } catch (const hslide::error& e) {
        return e.what();
    }
    return "";
}

TEST(BackendRegistry, OneRowPerKindInOrderAndNamesRoundTrip) {
    ASSERT_EQ(backend_registry().size(), std::size(all_kinds));
    for (backend_kind kind : all_kinds) {
        const backend_entry& e = backend_entry_of(kind);
        EXPECT_EQ(e.kind, kind);
        EXPECT_EQ(parse_backend_kind(to_string(kind)), kind);
        EXPECT_EQ(e.create == nullptr, kind == backend_kind::hybrid) << e.name;
    }
    EXPECT_EQ(std::string(to_string(backend_kind::cpu_dense)), "cpu-dense");
    const std::string unknown = error_of([] { parse_backend_kind("tpu"); });
    EXPECT_NE(unknown.find("unknown backend 'tpu'"), std::string::npos) << unknown;
    EXPECT_NE(unknown.find("cpu-dense"), std::string::npos) << unknown;
}

TEST(BackendRegistry, CapabilitiesSayWhatEachBackendTakes) {
    const backend_capabilities& gpu = backend_entry_of(backend_kind::gpu).caps;
    EXPECT_EQ(gpu.max_hidden_layers, 1u);
    EXPECT_TRUE(gpu.needs_gpu);
    EXPECT_TRUE(gpu.hybrid_worker);
    EXPECT_FALSE(gpu.multi_probe);
    // input-catch-up runs as itself (src/gpu/gpu_catch_up.cuh); dense and catch-up are
    // refused.
    EXPECT_EQ(adam_mode_run_by(backend_kind::gpu, adam_mode::input_catch_up),
              adam_mode::input_catch_up);
    EXPECT_EQ(adam_mode_run_by(backend_kind::gpu_dense, adam_mode::input_catch_up),
              adam_mode::input_catch_up);
    EXPECT_EQ(adam_mode_run_by(backend_kind::gpu, adam_mode::input_dense), adam_mode::input_dense);
    EXPECT_THROW(adam_mode_run_by(backend_kind::gpu, adam_mode::dense), hslide::error);
    EXPECT_THROW(adam_mode_run_by(backend_kind::gpu, adam_mode::catch_up), hslide::error);
    EXPECT_EQ(adam_mode_run_by(backend_kind::cpu, adam_mode::catch_up), adam_mode::catch_up);
    EXPECT_EQ(adam_mode_run_by(backend_kind::cpu_dense, adam_mode::catch_up), adam_mode::dense);
    const std::vector<std::string> workers =
        backend_names([](const backend_entry& e) { return e.caps.hybrid_worker; });
    EXPECT_EQ(workers, (std::vector<std::string>{"cpu", "gpu"}));
}

TEST(BackendRegistry, UnsupportedSettingsAreRefusedSayingWhy) {
    const train_config sparse = with_adam(adam_mode::sparse);
    const precision_mode fp32 = precision_mode::fp32;
    for (backend_kind kind : all_kinds)
        EXPECT_EQ(error_of([&] {
                      check_supported(kind, model_with({16}), sparse, fp32, scoring_mode::lsh);
                  }),
                  "")
            << to_string(kind);
    const std::string deep = error_of([&] {
        check_supported(backend_kind::gpu, model_with({16, 16}), sparse, fp32, scoring_mode::exact);
    });
    EXPECT_NE(deep.find("one hidden layer"), std::string::npos) << deep;
    EXPECT_NE(deep.find("has 2"), std::string::npos) << deep;
    EXPECT_EQ(error_of([&] {
                  check_supported(backend_kind::cpu, model_with({16, 16}), sparse, fp32,
                                  scoring_mode::exact);
              }),
              "");
    const std::string wide = error_of([&] {
        check_supported(backend_kind::gpu, model_with({2048}), sparse, fp32, scoring_mode::exact);
    });
    EXPECT_NE(wide.find("1024"), std::string::npos) << wide;
    const std::string adam = error_of([&] {
        check_supported(backend_kind::gpu, model_with({16}), with_adam(adam_mode::dense), fp32,
                        scoring_mode::exact);
    });
    EXPECT_NE(adam.find("--adam dense"), std::string::npos) << adam;
    const std::string bf16 = error_of([&] {
        check_supported(backend_kind::cpu_dense, model_with({16}), sparse, precision_mode::bf16,
                        scoring_mode::exact);
    });
    EXPECT_NE(bf16.find("--precision bf16"), std::string::npos) << bf16;
    // Multi-probe scoring: refused on the GPU only where the evaluation scores with LSH; the
    // dense kinds score exactly, so their probes are unused.
    const model_config probes = model_with({16}, 2);
    const std::string probed = error_of(
        [&] { check_supported(backend_kind::gpu, probes, sparse, fp32, scoring_mode::lsh); });
    EXPECT_NE(probed.find("--probes"), std::string::npos) << probed;
    EXPECT_EQ(error_of([&] {
                  check_supported(backend_kind::gpu, probes, sparse, fp32, scoring_mode::exact);
              }),
              "");
    EXPECT_EQ(error_of([&] {
                  check_supported(backend_kind::gpu_dense, probes, sparse, fp32, scoring_mode::lsh);
              }),
              "");
    EXPECT_EQ(error_of([&] {
                  check_supported(backend_kind::cpu, probes, sparse, fp32, scoring_mode::lsh);
              }),
              "");
    // Top-k selection: the CPU and the GPU select so; the dense kinds ignore it.
    model_config top_k = model_with({16});
    top_k.layers.back().sparsity = sparsity_mode::topk;
    for (backend_kind kind :
         {backend_kind::cpu, backend_kind::cpu_dense, backend_kind::gpu, backend_kind::gpu_dense})
        EXPECT_EQ(
            error_of([&] { check_supported(kind, top_k, sparse, fp32, scoring_mode::exact); }), "")
            << to_string(kind);
}

TEST(BackendRegistry, HelpListsEveryBackendAndWhatItSupports) {
    const std::string table = describe_backends();
    for (const backend_entry& e : backend_registry())
        EXPECT_NE(table.find(std::string("  ") + e.name + " "), std::string::npos) << table;
    EXPECT_NE(table.find("hidden layers: 1"), std::string::npos) << table;
    EXPECT_NE(table.find("input-catch-up (as input-dense)"), std::string::npos) << table;
    const auto help = run_hslide("train --help");
    ASSERT_EQ(help.exit_code, 0) << help.output;
    EXPECT_NE(help.output.find(table), std::string::npos) << help.output;
}

TEST(BackendRegistry, TheCliRefusesADeepNetworkOnTheGpuBeforeTraining) {
    const auto r = run_hslide("train --preset tiny -q --epochs 1 --hidden 32,32 --backend gpu");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("one hidden layer"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("epoch"), std::string::npos) << r.output;
    const auto w =
        run_hslide("train --preset tiny -q --epochs 1 --backend hybrid --workers cpu,tpu");
    EXPECT_EQ(w.exit_code, 2) << w.output;
    EXPECT_NE(w.output.find("unknown worker 'tpu' (cpu, gpu)"), std::string::npos) << w.output;
}

/// The source tree (HSLIDE_SHARED_DATA_DIR is "<source>/../shared/data").
std::filesystem::path source_dir() {
    const std::string data = HSLIDE_SHARED_DATA_DIR, suffix = "/../shared/data";
    EXPECT_GT(data.size(), suffix.size());
    return data.substr(0, data.size() - suffix.size());
}

/// The `#include "..."` targets of a file.
std::vector<std::string> includes_of(const std::filesystem::path& file) {
    std::ifstream in(file);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
        const size_t at = line.find("#include \"");
        if (at == std::string::npos) continue;
        const size_t begin = at + 10, end = line.find('"', begin);
        if (end != std::string::npos) out.push_back(line.substr(begin, end - begin));
    }
    return out;
}

bool starts_with(const std::string& text, const std::string& prefix) {
    return text.rfind(prefix, 0) == 0;
}

TEST(BackendRegistry, IncludesRunDownwardsAndOnlyTheRegistryIncludesBothBackends) {
    namespace fs = std::filesystem;
    const fs::path root = source_dir();
    ASSERT_TRUE(fs::exists(root / "src/backends/registry.cpp")) << root;
    int checked = 0;
    // Below the backends: src/common and the public headers.
    for (const char* room : {"src/common", "include/hslide"})
        for (const auto& entry : fs::recursive_directory_iterator(root / room)) {
            if (!entry.is_regular_file()) continue;
            for (const std::string& target : includes_of(entry.path()))
                for (const char* above : {"cpu/", "gpu/", "hybrid/", "backends/", "cli/"})
                    EXPECT_FALSE(starts_with(target, above))
                        << entry.path() << " includes " << target;
            ++checked;
        }
    EXPECT_GT(checked, 40);
    // The trainer takes the backend's name from the backend, not from the registry.
    for (const char* file : {"include/hslide/trainer.hpp", "src/common/train/trainer.cpp"})
        for (const std::string& target : includes_of(root / file))
            EXPECT_NE(target, "hslide/backend_registry.hpp") << file;
    // One file includes both backends.
    std::vector<std::string> both;
    for (const auto& entry : fs::recursive_directory_iterator(root / "src")) {
        if (!entry.is_regular_file()) continue;
        bool cpu = false, gpu = false;
        for (const std::string& target : includes_of(entry.path())) {
            cpu = cpu || starts_with(target, "cpu/");
            gpu = gpu || starts_with(target, "gpu/");
        }
        if (cpu && gpu) both.push_back(fs::relative(entry.path(), root).string());
    }
    EXPECT_EQ(both, std::vector<std::string>{"src/backends/registry.cpp"});
}

}  // namespace
