// Resolves the cuBLAS entry points of cublas_loader.hpp with dlopen.
#include "cublas_loader.hpp"

#include "hslide/error.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace hslide::gpu {

namespace {

cublas_api load() {
    std::vector<std::string> names;
    if (const char* env = std::getenv("HSLIDE_CUBLAS")) names.emplace_back(env);
    // The version the headers came from first: a newer one beside it may need a newer driver.
    for (const std::string& n :
         {"libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), std::string("libcublas.so"),
          std::string("libcublas.so.13"), std::string("libcublas.so.12")})
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    void* lib = nullptr;
    std::string tried;
    for (const std::string& name : names) {
        lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib) break;
        tried += (tried.empty() ? "" : ", ") + name;
    }
    if (!lib)
        throw error(error_kind::unsupported,
                    "cuBLAS (for a dense GPU output layer, and for exact scoring: "
                    "--scoring lsh goes without it) could not be loaded: none of " +
                        tried + " loads (set HSLIDE_CUBLAS to the library's path)");
    auto symbol = [&](const char* name) {
        void* p = dlsym(lib, name);
        if (!p)
            throw error(error_kind::unsupported,
                        std::string("the cuBLAS library found lacks ") + name);
        return p;
    };
    cublas_api api{};
    api.create = reinterpret_cast<decltype(api.create)>(symbol("cublasCreate_v2"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(symbol("cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(symbol("cublasSetStream_v2"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(symbol("cublasSgemm_v2"));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(symbol("cublasGemmEx"));
    return api;  // the library stays loaded for the life of the process
}

}  // namespace

const cublas_api& cublas() {
    static const cublas_api api = load();
    return api;
}

}  // namespace hslide::gpu
