// The AVX-512 + AVX512_BF16 level: the AVX-512 kernels, with the bf16 active-neuron dot
// products done by vdpbf16ps (pairs of bf16 products summed into fp32 lanes) and, where the CPU
// has AVX512_VNNI (every CPU with AVX512_BF16 so far), exact scoring's int8 product by vpdpbusd.
// CMake compiles this file alone with -mavx512bf16 -mavx512vnni.
#include "kernels_avx512_int8.hpp"
#include "kernels_avx512_ops.hpp"

#include "hslide/system_info.hpp"

#include <cmath>

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

// R rows against the 16 inputs: per pair of elements, one load of the inputs' pairs and R
// broadcasts of a row's pair feed R vdpbf16ps, each lane one input.
template <uint32_t R>
void dots16_bf16_rows(const bf16* rows, size_t stride, uint32_t width, uint32_t a, const bf16* xp,
                      const float* bias, float* out) {
    __m512 acc[R];
    for (uint32_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const uint32_t pairs = width / 2;
    const bf16* w = rows + size_t(a) * stride;
    for (uint32_t p = 0; p < pairs; ++p) {
        const __m512bh x = load_pairs(xp + size_t(p) * 32);
        for (uint32_t r = 0; r < R; ++r) {
            uint32_t pair;
            __builtin_memcpy(&pair, w + r * stride + 2 * p, 4);
            acc[r] = _mm512_dpbf16_ps(acc[r],
                                      reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(pair))), x);
        }
    }
    if (width % 2) {  // the last element alone: the row's padding is never read
        const __m512bh x = load_pairs(xp + size_t(pairs) * 32);
        for (uint32_t r = 0; r < R; ++r) {
            const uint32_t pair = w[r * stride + width - 1];
            acc[r] = _mm512_dpbf16_ps(acc[r],
                                      reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(pair))), x);
        }
    }
    for (uint32_t r = 0; r < R; ++r) {
        const __m512 s = bias ? _mm512_add_ps(acc[r], _mm512_set1_ps(bias[a + r])) : acc[r];
        _mm512_storeu_ps(out + size_t(a + r) * 16, s);
    }
}

void dots16_dpbf16(const bf16* rows, size_t stride, uint32_t width, uint32_t n, const bf16* xp,
                   const float* bias, float* out) {
    constexpr uint32_t R = 8;  // independent chains to cover vdpbf16ps' latency
    uint32_t a = 0;
    for (; a + R <= n; a += R) dots16_bf16_rows<R>(rows, stride, width, a, xp, bias, out);
    for (; a < n; ++a) dots16_bf16_rows<1>(rows, stride, width, a, xp, bias, out);
}

}  // namespace

const kernel_table& avx512bf16_kernels() {
    static const kernel_table table = make_table<avx512_ops>(
        "avx512bf16", isa_level::avx512bf16, active_dots_dpbf16, dots16_dpbf16, to_int8_row_avx512,
        detect_cpu_features().avx512_vnni ? dots16_u8s8_vnni : nullptr);
    return table;
}

}  // namespace hslide::cpu
