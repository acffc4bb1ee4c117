// What machine this is: CPU model and SIMD features, cores, memory, OS and compiler, for
// `hslide info`, benchmark records and run-time kernel dispatch; plus the process's memory use.
//
// SIMD features come from CPUID and count only when the OS also saves the registers they need
// (XGETBV: XMM/YMM state for AVX, and opmask/ZMM state for AVX-512), so a feature reported
// here is safe to execute. On non-x86 machines every x86 feature is false.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// SIMD features usable by this process (CPU support and OS register-state support).
struct cpu_features {
    bool sse42 = false;
    bool avx = false;
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    bool avx512f = false;
    bool avx512dq = false;
    bool avx512cd = false;
    bool avx512bw = false;
    bool avx512vl = false;
    bool avx512_vnni = false;
    bool avx512_bf16 = false;  ///< CPUID leaf 7 subleaf 1, EAX bit 5
    bool avx512_fp16 = false;
    bool amx_bf16 = false;  ///< CPUID leaf 7 EDX bit 22, with the OS saving the tile state
    bool amx_tile = false;  ///< CPUID leaf 7 EDX bit 24, with the OS saving the tile state
};

/// Whether this process may use AMX tiles: the CPU has AMX-TILE and AMX-BF16, and (Linux) the
/// kernel granted the process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, requested
/// here on the first call). False off Linux x86-64.
bool amx_usable();

/// The features of this machine (detected once, then cached).
const cpu_features& detect_cpu_features();

/// Names of the features present, in the order of the fields above, e.g.
/// {"sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", ..., "avx512_bf16"}.
std::vector<std::string> simd_feature_names(const cpu_features& features);

/// A description of the machine and build.
struct system_info {
    std::string cpu_model;    ///< CPUID brand string, else /proc/cpuinfo, else "unknown"
    int logical_cores = 0;    ///< online logical CPUs
    int available_cores = 0;  ///< CPUs this process may run on (affinity mask)
    int omp_max_threads = 0;  ///< omp_get_max_threads()
    std::vector<std::string> simd_levels;  ///< simd_feature_names(detect_cpu_features())
    uint64_t total_memory_bytes = 0;       ///< physical memory (MemTotal)
    std::string os;                        ///< e.g. "Linux 6.1.0-18-amd64 (Debian GNU/Linux 12)"
    std::string compiler;                  ///< e.g. "GCC 12.2.0"
};

/// Reads the description of this machine (CPUID, /proc, uname; cheap, not cached).
system_info read_system_info();

/// Several lines, `key: value`, for `hslide info`.
std::string describe(const system_info& info);

/// The largest resident set size this process has had (getrusage ru_maxrss), in bytes.
uint64_t peak_rss_bytes();

/// The resident set size now (/proc/self/statm), in bytes; 0 where unavailable.
uint64_t current_rss_bytes();

}  // namespace hslide
