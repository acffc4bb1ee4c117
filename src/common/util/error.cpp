// Out-of-line part of the error tiers: the abort path of HSLIDE_ASSERT.
#include "hslide/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace hslide::detail {

void assert_failed(const char* expr, const char* file, int line) {
    std::fprintf(stderr, "hslide: internal error: assertion `%s` failed at %s:%d\n", expr, file,
                 line);
    std::fflush(stderr);
    std::abort();
}

}  // namespace hslide::detail
