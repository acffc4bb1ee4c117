// The AVX-512 + AVX512_BF16 level: the AVX-512 kernels, with the bf16 active-neuron dot
// products done by vdpbf16ps (pairs of bf16 products summed into fp32 lanes). CMake compiles
// this file alone with -mavx512bf16.
#include "kernels_avx512_ops.hpp"

namespace hslide::cpu {
namespace {

__m512bh load_pairs(const bf16* p) {
    return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}
__m512bh load_pairs_n(const bf16* p, uint32_t n) {
    const __mmask32 m = n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1u);
    return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, p));
}

// vdpbf16ps does not round its products (bf16 x bf16 is exact in fp32) but adds each pair
// before accumulating, and treats subnormal inputs as zero: agreement with the reference is
// to fp32 summation-order tolerance, not bit-exact.
float row_dot_bf16(const bf16* row, const bf16* x, uint32_t width) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    uint32_t i = 0;
    for (; i + 128 <= width; i += 128) {
        a0 = _mm512_dpbf16_ps(a0, load_pairs(row + i), load_pairs(x + i));
        a1 = _mm512_dpbf16_ps(a1, load_pairs(row + i + 32), load_pairs(x + i + 32));
        a2 = _mm512_dpbf16_ps(a2, load_pairs(row + i + 64), load_pairs(x + i + 64));
        a3 = _mm512_dpbf16_ps(a3, load_pairs(row + i + 96), load_pairs(x + i + 96));
    }
    for (; i < width; i += 32)
        a0 = _mm512_dpbf16_ps(a0, load_pairs_n(row + i, width - i), load_pairs_n(x + i, width - i));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

void active_dots_dpbf16(const bf16* rows, size_t stride, uint32_t width, const uint32_t* ids,
                        uint32_t n, const bf16* x, const float* bias, float* out) {
    active_dots_with(row_dot_bf16, rows, stride, width, ids, n, x, bias, out);
}

}  // namespace

const kernel_table& avx512bf16_kernels() {
    static const kernel_table table =
        make_table<avx512_ops>("avx512bf16", isa_level::avx512bf16, active_dots_dpbf16);
    return table;
}

}  // namespace hslide::cpu
