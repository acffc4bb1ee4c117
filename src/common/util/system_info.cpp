// Machine description and process memory use (see include/hslide/system_info.hpp).
#include "hslide/system_info.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HSLIDE_X86 1
#else
#define HSLIDE_X86 0
#endif

#include <algorithm>
#include <cstring>
#include <fstream>
#include <utility>

#include "hslide/progress.hpp"

namespace hslide {

namespace {

#if HSLIDE_X86
struct cpuid_regs {
    unsigned a = 0, b = 0, c = 0, d = 0;
};

cpuid_regs cpuid(unsigned leaf, unsigned subleaf = 0) {
    cpuid_regs r;
    if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = {};
    return r;
}

// XCR0: which register states the OS saves on context switches. Inline asm, so this file
// needs no -mxsave.
uint64_t xgetbv0() {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t{hi} << 32) | lo;
}

bool bit(unsigned reg, int n) {
    return (reg >> n) & 1u;
}

cpu_features detect() {
    cpu_features f;
    const unsigned max_leaf = cpuid(0).a;
    if (max_leaf < 1) return f;
    const cpuid_regs l1 = cpuid(1);
    f.sse42 = bit(l1.c, 20);
    const bool osxsave = bit(l1.c, 27);
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    // The OS must save XMM and YMM state for AVX, and opmask + both ZMM halves for AVX-512.
    const bool avx_state = (xcr0 & 0x6) == 0x6;
    const bool avx512_state = avx_state && (xcr0 & 0xe0) == 0xe0;
    const bool amx_state = (xcr0 & 0x60000) == 0x60000;
    f.avx = avx_state && bit(l1.c, 28);
    f.fma = f.avx && bit(l1.c, 12);
    f.f16c = f.avx && bit(l1.c, 29);
    if (max_leaf >= 7) {
        const cpuid_regs l7 = cpuid(7, 0);
        f.avx2 = f.avx && bit(l7.b, 5);
        f.avx512f = avx512_state && bit(l7.b, 16);
        f.avx512dq = f.avx512f && bit(l7.b, 17);
        f.avx512cd = f.avx512f && bit(l7.b, 28);
        f.avx512bw = f.avx512f && bit(l7.b, 30);
        f.avx512vl = f.avx512f && bit(l7.b, 31);
        f.avx512_vnni = f.avx512f && bit(l7.c, 11);
        f.avx512_fp16 = f.avx512f && bit(l7.d, 23);
        f.amx_bf16 = amx_state && bit(l7.d, 22);
        f.amx_tile = amx_state && bit(l7.d, 24);
        if (l7.a >= 1) f.avx512_bf16 = f.avx512f && bit(cpuid(7, 1).a, 5);
    }
    return f;
}

std::string cpuid_brand() {
    if (cpuid(0x80000000).a < 0x80000004) return "";
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
        const cpuid_regs r = cpuid(0x80000002 + i);
        std::memcpy(brand + 16 * i, &r.a, 4);
        std::memcpy(brand + 16 * i + 4, &r.b, 4);
        std::memcpy(brand + 16 * i + 8, &r.c, 4);
        std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    return brand;
}
#else
cpu_features detect() {
    return {};
}
std::string cpuid_brand() {
    return "";
}
#endif

std::string trim(std::string s) {
    const auto b = s.find_first_not_of(" \t\r\n\"");
    const auto e = s.find_last_not_of(" \t\r\n\"");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The value of the first `key<sep>value` line of a text file whose key matches; "" if none.
std::string file_value(const char* path, const std::string& key, char sep) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        const auto colon = line.find(sep);
        if (colon != std::string::npos && trim(line.substr(0, colon)) == key)
            return trim(line.substr(colon + 1));
    }
    return "";
}

std::string compiler_name() {
#if defined(__clang__)
    return fmt::format("Clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    return fmt::format("GCC {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    return "unknown";
#endif
}

}  // namespace

const cpu_features& detect_cpu_features() {
    static const cpu_features features = detect();
    return features;
}

bool amx_usable() {
    static const bool usable = [] {
        const cpu_features& f = detect_cpu_features();
        if (!f.amx_bf16 || !f.amx_tile) return false;
#if HSLIDE_X86 && defined(__linux__) && defined(SYS_arch_prctl)
        // Linux leaves the tile data state off until a process asks for it; without the grant
        // the first tile instruction faults.
        constexpr int arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
        return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
        return false;
#endif
    }();
    return usable;
}

std::vector<std::string> simd_feature_names(const cpu_features& f) {
    std::vector<std::string> names;
    const std::pair<bool, const char*> all[] = {
        {f.sse42, "sse4.2"},
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
        {f.amx_tile, "amx_tile"},
    };
    for (const auto& [present, name] : all)
        if (present) names.emplace_back(name);
    return names;
}

system_info read_system_info() {
    system_info info;
    info.cpu_model = trim(cpuid_brand());
    if (info.cpu_model.empty()) info.cpu_model = file_value("/proc/cpuinfo", "model name", ':');
    if (info.cpu_model.empty()) info.cpu_model = "unknown";

    info.logical_cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    cpu_set_t set;
    CPU_ZERO(&set);
    info.available_cores =
        ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : info.logical_cores;
    info.omp_max_threads = omp_get_max_threads();
    info.simd_levels = simd_feature_names(detect_cpu_features());

    const std::string mem_kb = file_value("/proc/meminfo", "MemTotal", ':');
    if (!mem_kb.empty()) info.total_memory_bytes = std::stoull(mem_kb) * 1024;
    if (info.total_memory_bytes == 0) {
        const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) info.total_memory_bytes = uint64_t(pages) * uint64_t(page);
    }

    utsname u{};
    info.os =
        ::uname(&u) == 0 ? fmt::format("{} {} {}", u.sysname, u.release, u.machine) : "unknown";
    const std::string distro = file_value("/etc/os-release", "PRETTY_NAME", '=');
    if (!distro.empty()) info.os += " (" + distro + ")";
    info.compiler = compiler_name();
    return info;
}

std::string describe(const system_info& info) {
    std::string simd;
    for (const auto& s : info.simd_levels) simd += (simd.empty() ? "" : " ") + s;
    return fmt::format(
        "cpu:      {}\n"
        "cores:    {} logical, {} available to this process, OpenMP max threads {}\n"
        "simd:     {}\n"
        "memory:   {}\n"
        "os:       {}\n"
        "compiler: {}\n",
        info.cpu_model, info.logical_cores, info.available_cores, info.omp_max_threads,
        simd.empty() ? "none" : simd, human_bytes(static_cast<double>(info.total_memory_bytes)),
        info.os, info.compiler);
}

uint64_t peak_rss_bytes() {
    rusage usage{};
    if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
    return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

uint64_t current_rss_bytes() {
    std::ifstream in("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    if (!(in >> size >> resident)) return 0;
    return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace hslide
