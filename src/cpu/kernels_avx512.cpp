// The AVX-512 kernels (F, BW, VL, DQ): 16 floats per vector, masked tails, native gathers and
// scatters. CMake compiles this file alone with -mavx512*; kernels_for() calls it only on a
// CPU that has them. kernels_avx512bf16.cpp reuses these operations.
#include "kernels_avx512_ops.hpp"

namespace hslide::cpu {

const kernel_table& avx512_kernels() {
    static const kernel_table table =
        make_table<avx512_ops>("avx512", isa_level::avx512, active_dots_simd<avx512_ops, bf16>);
    return table;
}

}  // namespace hslide::cpu
