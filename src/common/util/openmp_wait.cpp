// settle_openmp_wait of hslide/openmp_wait.hpp.
#include "hslide/openmp_wait.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

namespace hslide {

namespace {
// Set in the re-executed process, so that openmp_wait_setting can tell hslide's choice from the
// user's, and so that a process that somehow lost GOMP_SPINCOUNT does not run itself again.
constexpr const char* marker = "HSLIDE_SET_GOMP_SPINCOUNT";

constexpr bool runtime_is_libgomp() {
#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__)
    return true;
#else
    return false;  // LLVM's and Intel's runtimes spin far less before they yield
#endif
}
}  // namespace

void settle_openmp_wait(char** argv) {
    if (!runtime_is_libgomp() || std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") ||
        std::getenv(marker))
        return;
    const char* keep = std::getenv("HSLIDE_KEEP_OPENMP_WAIT");
    if (keep && std::strcmp(keep, "0") != 0) return;
    if (setenv("GOMP_SPINCOUNT", default_gomp_spin_count, 1) != 0 || setenv(marker, "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    // Not run again (no /proc, say): go on with the runtime's default, and leave the
    // environment as the user had it for anything this process starts.
    unsetenv("GOMP_SPINCOUNT");
    unsetenv(marker);
}

const char* openmp_wait_setting() {
    static const std::string setting = [] {
        if (std::getenv(marker) && std::getenv("GOMP_SPINCOUNT"))
            return "GOMP_SPINCOUNT=" + std::string(std::getenv("GOMP_SPINCOUNT")) + " (hslide's)";
        std::string yours;
        for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
            if (const char* value = std::getenv(name))
                yours += (yours.empty() ? "" : ", ") + std::string(name) + "=" + value;
        return yours.empty() ? std::string("the OpenMP runtime's default") : yours + " (yours)";
    }();
    return setting.c_str();
}

}  // namespace hslide
