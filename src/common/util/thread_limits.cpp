// The thread-count check of hslide/thread_limits.hpp.
#include "hslide/thread_limits.hpp"

#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <thread>

namespace hslide {

namespace {
constexpr int threads_per_cpu = 8;
constexpr int min_cap = 64;

int hardware_cap() {
    const long long cpus = std::max(1u, std::thread::hardware_concurrency());
    return int(std::min<long long>(INT_MAX, std::max<long long>(min_cap, cpus * threads_per_cpu)));
}
}  // namespace

int max_thread_count() {
    return hardware_cap();
}

int check_thread_count(double threads, const std::string& what) {
    HSLIDE_CHECK(threads >= 0 && threads == std::floor(threads),
                 "{} must be a whole number >= 0 (0 = all), got {:.15g}", what, threads);
    const int cap = hardware_cap();
    // 0 is "all": as many as OMP_NUM_THREADS says, within the same cap.
    HSLIDE_CHECK(threads != 0 || omp_get_max_threads() <= cap,
                 "{} 0 means OMP_NUM_THREADS = {}, more than this machine can run usefully "
                 "(at most {}: {} per logical CPU, at least {})",
                 what, omp_get_max_threads(), cap, threads_per_cpu, min_cap);
    HSLIDE_CHECK(threads <= cap,
                 "{} {:.15g} is more than this machine can run usefully: it has {} logical CPUs "
                 "and hslide takes at most {} threads ({} per CPU, at least {}); give at most {} "
                 "(0 = all)",
                 what, threads, std::max(1u, std::thread::hardware_concurrency()), cap,
                 threads_per_cpu, min_cap, cap);
    return int(threads);
}

}  // namespace hslide
