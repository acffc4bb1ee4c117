// Vector operations for AVX-512 (F, BW, VL, DQ) in the shape kernels_simd.inl expects.
// Included only by files compiled with AVX-512 flags (kernels_avx512*.cpp); everything is in
// an anonymous namespace so no AVX-512 code can leak into a baseline caller at link time.
#pragma once

#include "kernels.hpp"

#include <immintrin.h>

namespace hslide::cpu {
namespace {

struct avx512_ops {
    using vec = __m512;
    static constexpr uint32_t lanes = 16;
    static constexpr bool has_scatter = true;

    static __mmask16 mask(uint32_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

    static vec zero() { return _mm512_setzero_ps(); }
    static vec set1(float x) { return _mm512_set1_ps(x); }
    static vec load(const float* p) { return _mm512_loadu_ps(p); }
    static vec load_n(const float* p, uint32_t n) { return _mm512_maskz_loadu_ps(mask(n), p); }
    static vec load_n_fill(const float* p, uint32_t n, float fill) {
        return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), mask(n), p);
    }
    static vec widen_bf16(__m256i h) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static vec load(const bf16* p) {
        return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    static vec load_n(const bf16* p, uint32_t n) {
        return widen_bf16(_mm256_maskz_loadu_epi16(mask(n), p));
    }
    static void store(float* p, vec x) { _mm512_storeu_ps(p, x); }
    static void store_n(float* p, vec x, uint32_t n) { _mm512_mask_storeu_ps(p, mask(n), x); }

    // Round-to-nearest-even on the bits, NaN quietened: exactly float_to_bf16 (the hardware
    // vcvtneps2bf16 would flush subnormals, which the reference does not).
    static __m256i narrow_bf16(vec x) {
        const __m512i u = _mm512_castps_si512(x);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                 _mm512_and_si512(hi, _mm512_set1_epi32(1)))),
            16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        const __m512i bits =
            _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
        return _mm512_cvtepi32_epi16(bits);
    }
    static void store_bf16(bf16* p, vec x) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_bf16(x));
    }
    static void store_bf16_n(bf16* p, vec x, uint32_t n) {
        _mm256_mask_storeu_epi16(p, mask(n), narrow_bf16(x));
    }

    using ivec = __m512i;
    // stochastic_hash(seed, index0 + lane) for the 16 lanes (kernels.hpp's hash).
    static ivec stochastic_hash(uint32_t seed, uint32_t index0) {
        const __m512i lane =
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i x = _mm512_xor_si512(_mm512_set1_epi32(int(seed)),
                                     _mm512_add_epi32(_mm512_set1_epi32(int(index0)), lane));
        x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
        x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
        x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
        x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x846ca68bu)));
        return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    }
    static ivec high_half(ivec r) { return _mm512_srli_epi32(r, 16); }
    static ivec low_half(ivec r) { return _mm512_and_si512(r, _mm512_set1_epi32(0xffff)); }
    // float_to_bf16_stochastic on the first n lanes, lane l adding random16's lane l.
    static void store_bf16_stochastic(bf16* p, vec x, ivec random16, uint32_t n) {
        const __m512i u = _mm512_castps_si512(x);
        const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, random16), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        const __m512i bits = _mm512_mask_mov_epi32(
            rounded, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
        const __m256i h = _mm512_cvtepi32_epi16(bits);
        if (n == lanes)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
        else
            _mm256_mask_storeu_epi16(p, mask(n), h);
    }

    using dvec = __m512d;
    static dvec dset1(double x) { return _mm512_set1_pd(x); }
    static dvec dload(const double* p) { return _mm512_loadu_pd(p); }
    static void dstore(double* p, dvec x) { _mm512_storeu_pd(p, x); }
    static dvec dfmadd(dvec a, dvec b, dvec c) { return _mm512_fmadd_pd(a, b, c); }
    static dvec widen_low(vec x) { return _mm512_cvtps_pd(_mm512_castps512_ps256(x)); }
    static dvec widen_high(vec x) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)); }

    static vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
    static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
    static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
    static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
    static vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
    static vec sqrt(vec a) { return _mm512_sqrt_ps(a); }
    static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
    static vec round(vec a) {
        return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    static vec scale2(vec x, vec n) { return _mm512_scalef_ps(x, n); }
    static float reduce_add(vec a) { return _mm512_reduce_add_ps(a); }
    static float reduce_max(vec a) { return _mm512_reduce_max_ps(a); }

    static vec gather(const float* base, const uint32_t* ids) {
        return _mm512_i32gather_ps(_mm512_loadu_si512(ids), base, 4);
    }
    static vec gather_n(const float* base, const uint32_t* ids, uint32_t n) {
        return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask(n),
                                        _mm512_maskz_loadu_epi32(mask(n), ids), base, 4);
    }
    /// y[ids[i]] += a * x[i] for 16 distinct ids.
    static void scatter_fmadd(vec a, vec x, float* y, const uint32_t* ids) {
        const __m512i idx = _mm512_loadu_si512(ids);
        _mm512_i32scatter_ps(y, idx, _mm512_fmadd_ps(a, x, _mm512_i32gather_ps(idx, y, 4)), 4);
    }
};

}  // namespace
}  // namespace hslide::cpu

#include "kernels_simd.inl"
