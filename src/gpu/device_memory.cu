// Allocation helpers of device_memory.hpp: errors that say what was asked and what is free.
#include "device_memory.hpp"

#include <atomic>

namespace hslide::gpu {

std::pair<size_t, size_t> device_memory_info() {
    size_t free_bytes = 0, total_bytes = 0;
    HSLIDE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return {free_bytes, total_bytes};
}

namespace {
std::string mib(size_t bytes) {
    return fmt::format("{:.1f} MiB", double(bytes) / (1024.0 * 1024.0));
}
}  // namespace

namespace {
std::atomic<size_t> largest_allocation{0};
}  // namespace

size_t largest_device_allocation() {
    return largest_allocation.load();
}
void reset_largest_device_allocation() {
    largest_allocation.store(0);
}

void* device_allocate(size_t bytes, const char* what) {
    for (size_t seen = largest_allocation.load();
         bytes > seen && !largest_allocation.compare_exchange_weak(seen, bytes);) {
    }
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaSuccess) return p;
    if (status != cudaErrorMemoryAllocation)
        // A sticky error of earlier work (a kernel's illegal address) surfaces at the next
        // allocation: it is not a shortage of memory.
        throw error(
            error_kind::runtime,
            fmt::format("CUDA error while allocating {} for {}: {} ({}), most likely "
                        "from earlier GPU work on this device",
                        mib(bytes), what, cudaGetErrorName(status), cudaGetErrorString(status)));
    cudaGetLastError();  // an allocation failure is not sticky: clear it before asking for info
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw error(error_kind::runtime,
                fmt::format("GPU out of memory: allocating {} for {} failed ({}); the device has "
                            "{} free of {} (use fewer labels, a smaller hidden layer or batch, "
                            "or fewer LSH tables)",
                            mib(bytes), what, cudaGetErrorString(status), mib(free_bytes),
                            mib(total_bytes)));
}

void* pinned_allocate(size_t bytes, const char* what) {
    void* p = nullptr;
    const cudaError_t status = cudaMallocHost(&p, bytes);
    if (status == cudaSuccess) return p;
    cudaGetLastError();
    throw error(error_kind::runtime, fmt::format("pinned host allocation of {} for {} failed: {}",
                                                 mib(bytes), what, cudaGetErrorString(status)));
}

}  // namespace hslide::gpu
