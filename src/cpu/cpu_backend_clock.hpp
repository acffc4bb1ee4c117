// The stage clock the CPU backend's files share (step reports time every stage).
#pragma once

#include <chrono>

namespace hslide::cpu {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace hslide::cpu
