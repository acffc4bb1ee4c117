// list_gpus() and friends over the CUDA runtime (built only with CUDA).
#include "hslide/gpu_devices.hpp"

#include <cuda_runtime.h>

#include <string>

namespace hslide {

bool cuda_build() {
    return true;
}

int gpu_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

uint64_t gpu_free_memory(int device) {
    int current = 0;
    const bool restore = cudaGetDevice(&current) == cudaSuccess;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        cudaGetLastError();
        free_bytes = 0;
    }
    if (restore) cudaSetDevice(current);
    return free_bytes;
}

std::vector<gpu_device> list_gpus(std::string* problem) {
    std::vector<gpu_device> devices;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        if (problem) *problem = cudaGetErrorString(status);
        cudaGetLastError();  // clear the sticky-free error so later calls start clean
        return devices;
    }
    // Reading free memory makes each device current (and creates its context): the caller's
    // current device is put back after.
    int current = 0;
    const bool restore = cudaGetDevice(&current) == cudaSuccess;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        gpu_device d;
        d.index = i;
        d.name = prop.name;
        d.compute_major = prop.major;
        d.compute_minor = prop.minor;
        d.total_memory = prop.totalGlobalMem;
        size_t free_bytes = 0, total_bytes = 0;
        if (cudaSetDevice(i) == cudaSuccess &&
            cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
            d.free_memory = free_bytes;
        devices.push_back(d);
    }
    if (restore) cudaSetDevice(current);
    cudaGetLastError();
    return devices;
}

std::string cuda_versions() {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    auto fmt = [](int v) {
        return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
    };
    return "runtime " + fmt(runtime) + ", driver " + (driver ? fmt(driver) : std::string("none"));
}

}  // namespace hslide
