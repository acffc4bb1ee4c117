// Instruction-set level detection and the process-wide choice (see isa.hpp).
#include "hslide/isa.hpp"

#include "common/util/enum_names.hpp"
#include "hslide/error.hpp"
#include "hslide/system_info.hpp"

#include <atomic>
#include <cstdlib>
#include <utility>

namespace hslide {
namespace {

constexpr std::pair<const char*, isa_level> isa_names[] = {
    {"scalar", isa_level::scalar},         {"avx2", isa_level::avx2}, {"avx512", isa_level::avx512},
    {"avx512bf16", isa_level::avx512bf16}, {"amx", isa_level::amx},
};

// -1: nothing forced.
std::atomic<int> forced_level{-1};

void check_supported(isa_level level, const char* asked_by) {
    HSLIDE_CHECK(isa_supported(level), "{} asks for ISA level {}, but this CPU supports at most {}",
                 asked_by, to_string(level), to_string(detected_isa()));
}

}  // namespace

const char* to_string(isa_level level) {
    return detail::name_of(level, isa_names);
}

std::vector<std::string> names_of(isa_level) {
    return detail::names_in(isa_names);
}

isa_level parse_isa(const std::string& name) {
    return detail::parse_named(name, "ISA level", isa_names);
}

isa_level detected_isa() {
    static const isa_level level = [] {
        const cpu_features f = detect_cpu_features();
        const bool avx2 = f.avx2 && f.fma;
        const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
        if (avx512 && f.avx512_bf16 && amx_usable()) return isa_level::amx;
        if (avx512 && f.avx512_bf16) return isa_level::avx512bf16;
        if (avx512) return isa_level::avx512;
        if (avx2) return isa_level::avx2;
        return isa_level::scalar;
    }();
    return level;
}

isa_level active_isa() {
    const int forced = forced_level.load(std::memory_order_relaxed);
    if (forced >= 0) return static_cast<isa_level>(forced);
    if (const char* env = std::getenv("HSLIDE_ISA"); env && *env) {
        const isa_level level = parse_isa(env);
        check_supported(level, "HSLIDE_ISA");
        return level;
    }
    return detected_isa();
}

void set_active_isa(isa_level level) {
    check_supported(level, "--isa");
    forced_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void clear_active_isa() {
    forced_level.store(-1, std::memory_order_relaxed);
}

}  // namespace hslide
