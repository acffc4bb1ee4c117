// The monotonic clock every stage timer of hslide reads (step reports, epochs, the hybrid's
// windows), and the one way to turn a start time into elapsed seconds.
#pragma once

#include <chrono>

namespace hslide {

using clock_type = std::chrono::steady_clock;

/// Seconds elapsed since `t0` (a clock_type::now() reading).
inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace hslide
