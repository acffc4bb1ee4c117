// The int8 kernels of the AVX-512 levels (exact scoring's int8 copy: to_int8_row, and
// dots16_u8s8 by vpdpbusd). Included by kernels_avx512.cpp and kernels_avx512bf16.cpp, whose
// tables take dots16_u8s8_vnni where the CPU has AVX512_VNNI: Cascade Lake and Ice Lake have
// it without AVX512_BF16 (the avx512 level), Zen 4 and later with it. The VNNI functions carry
// their target themselves, as the avx512 level's file is compiled without -mavx512vnni.
#pragma once

#include "kernels.hpp"

#include <immintrin.h>

#include <cmath>

namespace hslide::cpu {
namespace {

float to_int8_row_avx512(const float* x, int8_t* out, uint32_t n, int32_t* sum) {
    auto mask = [n](uint32_t i) {
        return n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    };
    __m512 vmax = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n; i += 16)
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask(i), x + i)));
    const float m = _mm512_reduce_max_ps(vmax);
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;  // as to_int8_row_reference
    const __m512 scale = _mm512_set1_ps(std::isfinite(inv) ? inv : 0.0f);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512i vsum = _mm512_setzero_si512();
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 k = mask(i);
        // The conversion rounds to nearest even (MXCSR's default), as nearbyint does.
        const __m512i q = _mm512_min_epi32(
            hi, _mm512_max_epi32(
                    lo, _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), scale))));
        _mm512_mask_cvtsepi32_storeu_epi8(out + i, k, q);
        vsum = _mm512_add_epi32(vsum, q);  // masked-off lanes loaded 0
    }
    *sum = _mm512_reduce_add_epi32(vsum);
    return m / 127.0f;
}

// R int8 rows against the 16 inputs: per four elements, one load of the inputs' fours and R
// broadcasts of a row's four feed R vpdpbusd, each lane one input (dots16_bf16_rows' scheme at
// twice the products an instruction).
template <uint32_t R>
__attribute__((target("avx512vnni"))) void dots16_u8s8_rows(
    const int8_t* rows, size_t stride, uint32_t width, uint32_t a, const uint8_t* xq,
    const float* row_scale, const int32_t* row_sum, __m512 query_scale, __m512i query_zero,
    const float* bias, float* out) {
    __m512i acc[R];
    for (uint32_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
    const uint32_t fours = width / 4, rest = width % 4;
    const int8_t* w = rows + size_t(a) * stride;
    for (uint32_t p = 0; p < fours; ++p) {
        const __m512i x = _mm512_loadu_si512(xq + size_t(p) * 64);
        for (uint32_t r = 0; r < R; ++r) {
            int32_t four;
            __builtin_memcpy(&four, w + r * stride + 4 * p, 4);
            acc[r] = _mm512_dpbusd_epi32(acc[r], x, _mm512_set1_epi32(four));
        }
    }
    if (rest) {  // the row's last values alone: nothing past the width is read
        const __m512i x = _mm512_loadu_si512(xq + size_t(fours) * 64);
        for (uint32_t r = 0; r < R; ++r) {
            int32_t four = 0;
            __builtin_memcpy(&four, w + r * stride + 4 * fours, rest);
            acc[r] = _mm512_dpbusd_epi32(acc[r], x, _mm512_set1_epi32(four));
        }
    }
    for (uint32_t r = 0; r < R; ++r) {
        const __m512i c = _mm512_sub_epi32(
            acc[r], _mm512_mullo_epi32(query_zero, _mm512_set1_epi32(row_sum[a + r])));
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(row_scale[a + r]), query_scale);
        // One fused rounding with a bias, written out: the compiler may contract a mul and an
        // add in one instance of this template and not in another, and a row's score would
        // then depend on where it falls in a call.
        const __m512 s =
            bias ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), scale, _mm512_set1_ps(bias[a + r]))
                 : _mm512_mul_ps(_mm512_cvtepi32_ps(c), scale);
        _mm512_storeu_ps(out + size_t(a + r) * 16, s);
    }
}

__attribute__((target("avx512vnni"))) void dots16_u8s8_vnni(
    const int8_t* rows, size_t stride, uint32_t width, uint32_t n, const uint8_t* xq,
    const float* row_scale, const int32_t* row_sum, const float* query_scale,
    const int32_t* query_zero, const float* bias, float* out) {
    constexpr uint32_t R = 8;  // independent chains to cover vpdpbusd's latency
    const __m512 qs = _mm512_loadu_ps(query_scale);
    const __m512i qz = _mm512_loadu_si512(query_zero);
    uint32_t a = 0;
    for (; a + R <= n; a += R)
        dots16_u8s8_rows<R>(rows, stride, width, a, xq, row_scale, row_sum, qs, qz, bias, out);
    for (; a < n; ++a)
        dots16_u8s8_rows<1>(rows, stride, width, a, xq, row_scale, row_sum, qs, qz, bias, out);
}

}  // namespace
}  // namespace hslide::cpu
