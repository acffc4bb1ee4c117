// list_gpus() for builds without CUDA: no GPUs, ever. CMake compiles this file only when the
// CUDA backend is off (src/gpu/gpu_devices.cu defines the same functions otherwise).
#include "hslide/gpu_devices.hpp"

namespace hslide {
bool cuda_build() {
    return false;
}
std::vector<gpu_device> list_gpus(std::string* problem) {
    if (problem) *problem = "this build of hslide has no CUDA backend";
    return {};
}
int gpu_count() {
    return 0;
}
uint64_t gpu_free_memory(int) {
    return 0;
}
std::string cuda_versions() {
    return "";
}
}  // namespace hslide
