// list_gpus() for builds without CUDA: no GPUs, ever.
#include "hslide/gpu_devices.hpp"

#if !HSLIDE_HAVE_CUDA
namespace hslide {
bool cuda_build() {
    return false;
}
std::vector<gpu_device> list_gpus(std::string* problem) {
    if (problem) *problem = "this build of hslide has no CUDA backend";
    return {};
}
std::string cuda_versions() {
    return "";
}
}  // namespace hslide
#endif
