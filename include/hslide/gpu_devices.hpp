// What GPUs this process can use, without exposing CUDA types.
//
// Compiled against the CUDA runtime when the build has CUDA (src/gpu); otherwise the list is
// always empty and cuda_build() is false.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// One visible GPU.
struct gpu_device {
    int index = 0;
    std::string name;
    int compute_major = 0, compute_minor = 0;
    uint64_t total_memory = 0;  ///< bytes
    uint64_t free_memory = 0;   ///< bytes
};

/// True when this binary was built with the CUDA backend.
bool cuda_build();

/// The GPUs the CUDA runtime sees (empty without CUDA or without a device). Never throws:
/// a driver problem is reported in `problem` when given.
std::vector<gpu_device> list_gpus(std::string* problem = nullptr);

/// How many GPUs the CUDA runtime sees (0 without CUDA or without a device), creating no
/// context on any of them. Never throws.
int gpu_count();

/// GPU `device`'s free memory in bytes (0 without CUDA or without that device). Never throws.
uint64_t gpu_free_memory(int device);

/// The CUDA runtime and driver versions as "runtime X.Y, driver X.Y" ("" without CUDA).
std::string cuda_versions();

}  // namespace hslide
