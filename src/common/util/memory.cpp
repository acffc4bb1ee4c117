// Out-of-memory errors that say how much (see memory.hpp).
#include "hslide/memory.hpp"

#include "hslide/progress.hpp"

#include <fstream>
#include <sstream>

namespace hslide {

uint64_t available_host_bytes() {
    std::ifstream in("/proc/meminfo");
    uint64_t available_kb = 0, swap_kb = 0;
    bool found = false;
    for (std::string line; std::getline(in, line);) {
        std::istringstream fields(line);
        std::string key;
        uint64_t kb = 0;
        if (!(fields >> key >> kb)) continue;
        if (key == "MemAvailable:") {
            available_kb = kb;
            found = true;
        } else if (key == "SwapFree:") {
            swap_kb = kb;
        }
    }
    return found ? (available_kb + swap_kb) * 1024 : 0;
}

out_of_memory_error::out_of_memory_error(const std::string& what, uint64_t bytes,
                                         uint64_t available, const std::string& where)
    : error(
          error_kind::runtime,
          bytes == 0 ? fmt::format("out of memory: {}: an allocation failed, {} available ({})",
                                   what, human_bytes(double(available)), where)
          : available > 0
              ? fmt::format("out of memory: {} needs {} bytes ({}), {} available ({})", what, bytes,
                            human_bytes(double(bytes)), human_bytes(double(available)), where)
              : fmt::format("out of memory: {} needs {} bytes ({}), more than {} could give", what,
                            bytes, human_bytes(double(bytes)), where)),
      bytes_(bytes),
      available_(available) {}

void throw_host_out_of_memory(const std::string& what, uint64_t bytes) {
    throw out_of_memory_error(what, bytes, available_host_bytes(),
                              "host memory: MemAvailable + SwapFree");
}

void check_host_allocation(const std::string& what, uint64_t bytes) {
    const uint64_t available = available_host_bytes();
    if (available > 0 && bytes > available) throw_host_out_of_memory(what, bytes);
}

}  // namespace hslide
