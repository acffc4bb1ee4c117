// Out-of-line parts of hslide::rng.
#include "hslide/rng.hpp"

#include <cmath>

namespace hslide {

double rng::normal() {
    // Box-Muller without caching the second value, so the state alone defines the stream.
    double u1 = uniform_double();
    while (u1 <= 0.0) u1 = uniform_double();
    const double u2 = uniform_double();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace hslide
