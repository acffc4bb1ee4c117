// Out-of-memory errors say what was being allocated, how many bytes and what is free
// (hslide/memory.hpp): a model too large for the machine, a failed allocation, and the CLI
// on a file whose header declares 4,000,000,000 labels (the example).
#include "hslide/memory.hpp"
#include "hslide/model.hpp"
#include "hslide/model_options.hpp"

#include "test_util.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <string>

using namespace hslide;
using hslide::testing::run_hslide;
using hslide::testing::temp_dir;

namespace {
bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}
}  // namespace

TEST(Memory, AvailableHostMemoryIsRead) {
    EXPECT_GT(available_host_bytes(), uint64_t(1) << 20);
}

TEST(Memory, AModelTooLargeSaysWhatAndHowManyBytes) {
    model_options mo;
    const model_config config = make_model_config(mo, 10, 4000000000u);
    try {
        model_state::create(config, 1);
        FAIL() << "an 11 TiB model must not be allocated";
    } catch (const out_of_memory_error& e) {
        const std::string m = e.what();
        EXPECT_TRUE(contains(m, "the model 10 -> 256 -> 4000000000")) << m;
        EXPECT_TRUE(contains(m, "needs 12336000033792 bytes")) << m;
        EXPECT_TRUE(contains(m, "available (host memory")) << m;
        EXPECT_EQ(e.bytes(), 12336000033792u);
        EXPECT_EQ(e.exit_code(), 1);
    }
}

TEST(Memory, AFailedAllocationBecomesTheSameError) {
    try {
        allocate_checked("a test buffer", 123, []() -> int { throw std::bad_alloc(); });
        FAIL();
    } catch (const out_of_memory_error& e) {
        EXPECT_TRUE(contains(e.what(), "a test buffer needs 123 bytes")) << e.what();
    }
    EXPECT_EQ(allocate_checked("a small buffer", 8, [] { return 42; }), 42);
}

TEST(Memory, TheCliNamesTheAllocationForFourBillionLabels) {
    temp_dir dir;
    hslide::testing::write_text(dir.file("big.txt"),
                                "2 10 4000000000\n1,3999999999 0:1 2:0.5\n5 1:1\n");
    const auto r =
        run_hslide("train --train " + dir.file("big.txt") + " --no-cache -q --label-rows all");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    // The run's check, before the model is made: the model with Adam state (11.2 TiB), its
    // weight average and best epoch's snapshot (3.7 TiB each) and a step's activations.
    EXPECT_TRUE(contains(r.output,
                         "out of memory: the run (the model 10 -> 256 -> 4000000000 "
                         "(1028000002816 parameters, with Adam state), 2 copies of its weights "
                         "and a step's activations) needs"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "(18.7 TiB)")) << r.output;
}

TEST(Memory, LabelsAHeaderDeclaresAreCountedBeforeTheirCountsAreMade) {
    // 2^32 - 1 labels for two points, rows only for the two carried: the model is tiny, the
    // labels' counts (16 GiB) and propensities (32 GiB) are not, and are refused together at
    // once (the counts alone took half a minute to fill before the propensities failed).
    temp_dir dir;
    hslide::testing::write_text(dir.file("labels.txt"), "2 10 4294967295\n1,3 0:1 2:0.5\n5 1:1\n");
    if (available_host_bytes() > (uint64_t(48) << 30))
        GTEST_SKIP() << "this machine has the 48 GiB the counts need";
    const auto r = run_hslide("train --train " + dir.file("labels.txt") + " --test " +
                              dir.file("labels.txt") + " --no-cache -q --epochs 1");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "out of memory: the labels' counts and propensities (" +
                                       dir.file("labels.txt") +
                                       " declares 4294967295 labels) needs 51539607540 bytes"))
        << r.output;
}

TEST(Memory, AlignedArraysAreZeroAndBlocksFrom2MiBStartOnAHugePageBoundary) {
    constexpr size_t huge = size_t(2) << 20;
    // Below 2 MiB, 64-byte aligned; from 2 MiB (the output layer of a few thousand rows),
    // 2 MiB aligned so that huge pages can back them.
    for (size_t floats :
         {size_t(1), size_t(17), huge / 4 - 1, huge / 4, huge / 4 + 1, 3 * huge / 4 + 5}) {
        aligned_floats a(floats);
        ASSERT_EQ(a.size(), floats);
        const auto at = reinterpret_cast<uintptr_t>(a.data());
        EXPECT_EQ(at % 64, 0u) << floats << " floats";
        if (floats * sizeof(float) >= huge) EXPECT_EQ(at % huge, 0u) << floats << " floats";
        size_t nonzero = 0;
        for (size_t i = 0; i < floats; ++i) nonzero += a[i] != 0.0f;
        EXPECT_EQ(nonzero, 0u) << floats << " floats";
        // A copy of a written array (into a block not zeroed first, and into one of another
        // size that held other values) is the same, and a fresh one of its size zero again.
        for (size_t i = 0; i < floats; i += 97) a[i] = float(i + 1);
        const aligned_floats copy = a;
        aligned_floats reused(floats + 1);
        for (size_t i = 0; i < floats + 1; ++i) reused[i] = -1.0f;
        reused = a;
        ASSERT_EQ(copy.size(), floats);
        ASSERT_EQ(reused.size(), floats);
        EXPECT_EQ(std::memcmp(copy.data(), a.data(), floats * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(reused.data(), a.data(), floats * sizeof(float)), 0);
        // A snapshot's copy on normal pages: the same values and alignment; one of the same
        // size writes into the block it holds.
        aligned_floats snapshot(floats + 3);
        snapshot.copy_from(a, detail::page_size::normal);
        ASSERT_EQ(snapshot.size(), floats);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(snapshot.data()) % 64, 0u);
        if (floats * sizeof(float) >= huge)
            EXPECT_EQ(reinterpret_cast<uintptr_t>(snapshot.data()) % huge, 0u);
        EXPECT_EQ(std::memcmp(snapshot.data(), a.data(), floats * sizeof(float)), 0);
        const float* held = snapshot.data();
        a[floats - 1] = 42.0f;
        snapshot.copy_from(a, detail::page_size::normal);
        EXPECT_EQ(snapshot.data(), held);
        EXPECT_EQ(snapshot[floats - 1], 42.0f);
        a.resize(floats);
        for (size_t i = 0; i < floats; i += 97) ASSERT_EQ(a[i], 0.0f);
    }
}
