// The AVX-512 kernels (F, BW, VL, DQ): 16 floats per vector, masked tails, native gathers and
// scatters. CMake compiles this file alone with -mavx512*; kernels_for() calls it only on a
// CPU that has them. kernels_avx512bf16.cpp reuses these operations; both share the int8
// kernels of kernels_avx512_int8.hpp.
#include "kernels_avx512_int8.hpp"
#include "kernels_avx512_ops.hpp"

#include "hslide/system_info.hpp"

namespace hslide::cpu {

const kernel_table& avx512_kernels() {
    // Exact scoring's int8 products where the CPU has AVX512_VNNI (Cascade Lake, Ice Lake):
    // without them its search would score the fp32 rows, a quarter of vpdpbusd's products.
    static const kernel_table table = make_table<avx512_ops>(
        "avx512", isa_level::avx512, active_dots_simd<avx512_ops, bf16>, nullptr,
        to_int8_row_avx512, detect_cpu_features().avx512_vnni ? dots16_u8s8_vnni : nullptr);
    return table;
}

}  // namespace hslide::cpu
