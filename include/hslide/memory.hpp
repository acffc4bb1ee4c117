// Out-of-memory errors that say how much: what was being allocated, how many bytes, and how
// much the machine has free. Everything that sizes a model or a dataset (model_state::create,
// checkpoint loading, dataset loading, label counts, the backends' buffers) checks its size
// against the memory available before allocating, and turns a failed allocation
// (std::bad_alloc) into the same error, so a file declaring 4 billion labels ends with a
// message naming the allocation and its bytes, never "out of memory" alone or a crash.
#pragma once

#include "hslide/error.hpp"

#include <cstdint>
#include <new>
#include <string>

namespace hslide {

/// Host memory a process can still get: MemAvailable + SwapFree of /proc/meminfo, in bytes
/// (0 when it cannot be read).
uint64_t available_host_bytes();

/// Not enough memory for an allocation (kind runtime: exit code 1). The message reads
/// "out of memory: <what> needs <bytes> (<human>), <free> available (<where>)"; `bytes` 0
/// (unknown: a failed allocation deep inside `what`) reads "<what>: an allocation failed".
class out_of_memory_error : public error {
  public:
    out_of_memory_error(const std::string& what, uint64_t bytes, uint64_t available,
                        const std::string& where);
    uint64_t bytes() const noexcept { return bytes_; }
    uint64_t available() const noexcept { return available_; }

  private:
    uint64_t bytes_, available_;
};

/// Throws out_of_memory_error for host memory (available: available_host_bytes()).
[[noreturn]] void throw_host_out_of_memory(const std::string& what, uint64_t bytes);

/// Throws out_of_memory_error when `bytes` exceed the host memory available (when that is
/// known); `what` names the allocation ("the model: layer 1's weights and Adam state").
void check_host_allocation(const std::string& what, uint64_t bytes);

/// check_host_allocation, then `allocate()`; a std::bad_alloc from it becomes the same error.
template <class F>
decltype(auto) allocate_checked(const std::string& what, uint64_t bytes, F&& allocate) {
    check_host_allocation(what, bytes);
    try {
        return allocate();
    } catch (const std::bad_alloc&) {
        throw_host_out_of_memory(what, bytes);
    }
}

}  // namespace hslide
