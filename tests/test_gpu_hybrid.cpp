// A hybrid of a CPU and a GPU worker training Bibtex together (hybrid_backend with a real
// GPU worker). Skips (GTEST_SKIP) without a usable GPU or without CUDA.
#include "gpu_test_util.hpp"
#include "hslide/backend.hpp"
#include "hslide/lsh.hpp"
#include "test_util.hpp"
#if HSLIDE_HAVE_CUDA
#include "gpu/gpu_backend.hpp"
#endif

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <vector>

using namespace hslide;

namespace {

TEST(GpuHybrid, CpuAndGpuWorkersTrainBibtexTogether) {
    // The hybrid with a real GPU worker: its changed rows leave the device and the others'
    // come back through the row transfers, the first layer every other merge. Parking is off
    // so that both workers train throughout, and both take batches of 128, as the CPU backend
    // does (Bibtex is step-limited: 1024-sample GPU batches would learn less in 10 epochs).
    HSLIDE_REQUIRE_GPU();
    HSLIDE_REQUIRE_SHARED_DATA();
    hslide::testing::temp_dir out;
    const std::string common =
        "train " + hslide::testing::bibtex_train_flags() +
        "--split-column 1 --epochs 10 --output-sparsity lsh --no-progress -q --loss softmax ";
    const std::string single = out.file("cpu.jsonl"), hybrid = out.file("hybrid.jsonl");
    auto r = hslide::testing::run_hslide(common + "--backend cpu --metrics-out " + single);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = hslide::testing::run_hslide(
        common +
        "--backend hybrid --workers cpu,gpu --schedule hogbatch --worker-batch 128 "
        "--park-below-share 0 --metrics-out " +
        hybrid);
    if (r.exit_code != 0 && r.output.find("cuBLAS") != std::string::npos)
        HSLIDE_GPU_SKIP(r.output);  // evaluation scores every label, through cuBLAS
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NEAR(hslide::testing::last_p_at_1(hybrid), hslide::testing::last_p_at_1(single), 0.02);
    std::ifstream in(hybrid);
    uint64_t samples[2] = {0, 0}, merges[2] = {0, 0};
    for (std::string line; std::getline(in, line);) {
        const auto record = nlohmann::json::parse(line);
        ASSERT_EQ(record["workers"].size(), 2u) << line;
        for (size_t i = 0; i < 2; ++i) {
            samples[i] += record["workers"][i]["samples"].get<uint64_t>();
            merges[i] += record["workers"][i]["merges"].get<uint64_t>();
        }
    }
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_GT(samples[i], 0u) << "worker " << i;
        EXPECT_GT(merges[i], 0u) << "worker " << i;
    }
    EXPECT_EQ(samples[0] + samples[1], 10u * 4880u);
}

}  // namespace
