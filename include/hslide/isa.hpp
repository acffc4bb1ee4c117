// Instruction-set levels of the CPU kernels, and the process-wide choice among them.
//
// Every SIMD kernel (the CPU backend's kernel tables, the LSH hash scans) exists once per
// level and is picked when its owner is created, from active_isa(): the level forced by
// set_active_isa (the CLI's --isa), else the HSLIDE_ISA environment variable, else the best
// level this CPU and OS support. A binary built on one machine therefore runs on an older
// one at the best level that one has.
#pragma once

#include <string>
#include <vector>

namespace hslide {

/// Kernel levels, each including the ones before it.
enum class isa_level {
    scalar,      ///< plain C++: the reference every other level is tested against
    avx2,        ///< AVX2 + FMA (8-wide)
    avx512,      ///< AVX-512 F/BW/VL/DQ (16-wide, masked tails)
    avx512bf16,  ///< AVX-512 plus AVX512_BF16 (vdpbf16ps dot products in --precision bf16)
    /// avx512bf16 plus AMX-BF16 tiles (amx_usable()): exact scoring's bf16 products (dots16_bf16)
    /// as tile products, 16 rows by 16 queries by 32 elements an instruction
    amx,
};

/// "scalar" | "avx2" | "avx512" | "avx512bf16" | "amx".
const char* to_string(isa_level level);
/// Parses a level name; throws hslide::error listing the names otherwise.
isa_level parse_isa(const std::string& name);
/// Every level's name, lowest first (the argument only picks the overload).
std::vector<std::string> names_of(isa_level);

/// The best level this CPU and OS support (CPUID, XCR0 and, for amx, the OS's grant; scalar off
/// x86).
isa_level detected_isa();

/// True when this machine can run `level`.
inline bool isa_supported(isa_level level) {
    return static_cast<int>(level) <= static_cast<int>(detected_isa());
}

/// The level new kernel users pick: the forced one, else HSLIDE_ISA, else detected_isa().
/// Throws hslide::error when HSLIDE_ISA names a bad level or one this CPU lacks.
isa_level active_isa();

/// Forces the level for everything created afterwards; throws hslide::error when this CPU
/// lacks it. Not thread-safe against concurrent creation (set it at start-up or in tests).
void set_active_isa(isa_level level);
/// Drops a forced level (HSLIDE_ISA or detection decide again).
void clear_active_isa();

}  // namespace hslide
