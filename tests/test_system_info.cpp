// Tests of the machine description: sensible values, SIMD detection consistent with itself,
// with the compiler's CPU checks and with the kernel's /proc/cpuinfo flags, and memory use
// that follows a large allocation.
#include "hslide/system_info.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

namespace {

bool has(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(SystemInfo, SensibleValues) {
    const auto info = hslide::read_system_info();
    EXPECT_GE(info.logical_cores, 1);
    EXPECT_GE(info.available_cores, 1);
    EXPECT_LE(info.available_cores, info.logical_cores);
    EXPECT_GE(info.omp_max_threads, 1);
    EXPECT_FALSE(info.cpu_model.empty());
    EXPECT_NE(info.cpu_model, "unknown");
    EXPECT_GT(info.total_memory_bytes, 64ull << 20);
    EXPECT_NE(info.os.find("Linux"), std::string::npos) << info.os;
    EXPECT_FALSE(info.compiler.empty());
    const std::string text = hslide::describe(info);
    EXPECT_NE(text.find("cpu:      " + info.cpu_model + "\n"), std::string::npos) << text;
    EXPECT_NE(text.find("memory:   "), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6) << text;
}

TEST(SystemInfo, SimdFeaturesAreConsistent) {
    const auto& f = hslide::detect_cpu_features();
    // Each level implies the ones it builds on (and the OS state they need).
    if (f.avx2 || f.fma || f.f16c) {
        EXPECT_TRUE(f.avx);
    }
    if (f.avx512f) {
        EXPECT_TRUE(f.avx2);
        EXPECT_TRUE(f.fma);
    }
    for (bool sub : {f.avx512dq, f.avx512cd, f.avx512bw, f.avx512vl, f.avx512_vnni, f.avx512_bf16,
                     f.avx512_fp16})
        if (sub) {
            EXPECT_TRUE(f.avx512f);
        }
    // The names list is exactly the flags that are set.
    const auto names = hslide::simd_feature_names(f);
    EXPECT_EQ(has(names, "avx2"), f.avx2);
    EXPECT_EQ(has(names, "avx512f"), f.avx512f);
    EXPECT_EQ(has(names, "avx512_bf16"), f.avx512_bf16);
    EXPECT_EQ(hslide::read_system_info().simd_levels, names);
    EXPECT_EQ(&hslide::detect_cpu_features(), &f);  // cached
}

#if defined(__x86_64__)
TEST(SystemInfo, SimdFeaturesMatchCompilerAndKernel) {
    const auto& f = hslide::detect_cpu_features();
    // The compiler runtime also checks CPUID and XCR0.
    EXPECT_EQ(f.sse42, bool(__builtin_cpu_supports("sse4.2")));
    EXPECT_EQ(f.avx, bool(__builtin_cpu_supports("avx")));
    EXPECT_EQ(f.avx2, bool(__builtin_cpu_supports("avx2")));
    EXPECT_EQ(f.fma, bool(__builtin_cpu_supports("fma")));
    EXPECT_EQ(f.avx512f, bool(__builtin_cpu_supports("avx512f")));
    EXPECT_EQ(f.avx512bw, bool(__builtin_cpu_supports("avx512bw")));
    EXPECT_EQ(f.avx512vl, bool(__builtin_cpu_supports("avx512vl")));

    // Linux lists a feature only where the CPU has it and the kernel enabled its state.
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    std::set<std::string> flags;
    while (std::getline(in, line)) {
        if (line.rfind("flags", 0) == 0) {
            std::istringstream words(line.substr(line.find(':') + 1));
            for (std::string w; words >> w;) flags.insert(w);
            break;
        }
    }
    if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
    const std::pair<bool, const char*> checks[] = {
        {f.sse42, "sse4_2"},
        {f.avx, "avx"},
        {f.avx2, "avx2"},
        {f.fma, "fma"},
        {f.f16c, "f16c"},
        {f.avx512f, "avx512f"},
        {f.avx512dq, "avx512dq"},
        {f.avx512cd, "avx512cd"},
        {f.avx512bw, "avx512bw"},
        {f.avx512vl, "avx512vl"},
        {f.avx512_vnni, "avx512_vnni"},
        {f.avx512_bf16, "avx512_bf16"},
        {f.avx512_fp16, "avx512_fp16"},
        {f.amx_bf16, "amx_bf16"},
    };
    for (const auto& [detected, flag] : checks) EXPECT_EQ(detected, flags.count(flag) == 1) << flag;
}
#endif

TEST(SystemInfo, RssFollowsALargeAllocation) {
    const uint64_t before = hslide::peak_rss_bytes();
    EXPECT_GT(before, 0u);
    EXPECT_GT(hslide::current_rss_bytes(), 0u);
    const size_t size = size_t{160} << 20;
    std::unique_ptr<char[]> block(new char[size]);
    // Touch every page with non-zero data so it is really resident.
    for (size_t i = 0; i < size; i += 4096) block[i] = static_cast<char>(i / 4096 + 1);
    volatile char sink = block[size - 4096];
    (void)sink;
    const uint64_t current = hslide::current_rss_bytes();
    const uint64_t peak = hslide::peak_rss_bytes();
    EXPECT_GE(current, uint64_t{150} << 20);
    EXPECT_GE(peak, current - (uint64_t{4} << 20));  // ru_maxrss lags statm by at most a little
    EXPECT_GE(peak, before);
    if (before < (uint64_t{100} << 20)) {
        EXPECT_GT(peak, before + (uint64_t{100} << 20));
    }
}

}  // namespace
