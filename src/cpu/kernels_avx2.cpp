// The AVX2 + FMA kernels: 8 floats per vector, masked loads and stores for tails, gathers but
// no scatters. CMake compiles this file alone with -mavx2 -mfma; kernels_for() calls it only
// on a CPU that has them.
#include "kernels.hpp"

#include <immintrin.h>

namespace hslide::cpu {
namespace {

struct avx2_ops {
    using vec = __m256;
    static constexpr uint32_t lanes = 8;
    static constexpr bool has_scatter = false;

    static __m256i mask(uint32_t n) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }

    static vec zero() { return _mm256_setzero_ps(); }
    static vec set1(float x) { return _mm256_set1_ps(x); }
    static vec load(const float* p) { return _mm256_loadu_ps(p); }
    static vec load_n(const float* p, uint32_t n) { return _mm256_maskload_ps(p, mask(n)); }
    static vec load_n_fill(const float* p, uint32_t n, float fill) {
        const __m256i m = mask(n);
        return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m),
                                _mm256_castsi256_ps(m));
    }
    static vec widen_bf16(__m128i h) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static vec load(const bf16* p) {
        return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    static vec load_n(const bf16* p, uint32_t n) {
        // AVX2 has no 16-bit masked load.
        alignas(16) bf16 part[8] = {};
        for (uint32_t i = 0; i < n; ++i) part[i] = p[i];
        return widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
    }
    static void store(float* p, vec x) { _mm256_storeu_ps(p, x); }
    static void store_n(float* p, vec x, uint32_t n) { _mm256_maskstore_ps(p, mask(n), x); }

    // Round-to-nearest-even on the bits, NaN quietened: exactly float_to_bf16.
    static __m128i narrow_bf16(vec x) {
        const __m256i u = _mm256_castps_si256(x);
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                 _mm256_and_si256(hi, _mm256_set1_epi32(1)))),
            16);
        // Both sides are below 2^31, so the signed compare is the unsigned one.
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                               _mm256_set1_epi32(0x7f800000));
        const __m256i bits =
            _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
        // Values are 0..0xffff, so the unsigned-saturating pack keeps them as they are.
        return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
    }
    static void store_bf16(bf16* p, vec x) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow_bf16(x));
    }
    static void store_bf16_n(bf16* p, vec x, uint32_t n) {
        alignas(16) bf16 part[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(part), narrow_bf16(x));
        for (uint32_t i = 0; i < n; ++i) p[i] = part[i];
    }

    using ivec = __m256i;
    // stochastic_hash(seed, index0 + lane) for the 8 lanes (kernels.hpp's hash).
    static ivec stochastic_hash(uint32_t seed, uint32_t index0) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i x = _mm256_xor_si256(_mm256_set1_epi32(int(seed)),
                                     _mm256_add_epi32(_mm256_set1_epi32(int(index0)), lane));
        x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
        x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
        x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
        x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846ca68bu)));
        return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    }
    static ivec high_half(ivec r) { return _mm256_srli_epi32(r, 16); }
    static ivec low_half(ivec r) { return _mm256_and_si256(r, _mm256_set1_epi32(0xffff)); }
    // float_to_bf16_stochastic on the first n lanes, lane l adding random16's lane l.
    static void store_bf16_stochastic(bf16* p, vec x, ivec random16, uint32_t n) {
        const __m256i u = _mm256_castps_si256(x);
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, random16), 16);
        // Both sides are below 2^31, so the signed compare is the unsigned one.
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                               _mm256_set1_epi32(0x7f800000));
        const __m256i bits = _mm256_blendv_epi8(
            rounded, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
        const __m128i packed =
            _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
        if (n == lanes) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
        } else {
            alignas(16) bf16 part[8];
            _mm_store_si128(reinterpret_cast<__m128i*>(part), packed);
            for (uint32_t i = 0; i < n; ++i) p[i] = part[i];
        }
    }

    using dvec = __m256d;
    static dvec dset1(double x) { return _mm256_set1_pd(x); }
    static dvec dload(const double* p) { return _mm256_loadu_pd(p); }
    static void dstore(double* p, dvec x) { _mm256_storeu_pd(p, x); }
    static dvec dfmadd(dvec a, dvec b, dvec c) { return _mm256_fmadd_pd(a, b, c); }
    static dvec widen_low(vec x) { return _mm256_cvtps_pd(_mm256_castps256_ps128(x)); }
    static dvec widen_high(vec x) { return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); }

    static vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
    static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
    static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
    static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
    static vec div(vec a, vec b) { return _mm256_div_ps(a, b); }
    static vec sqrt(vec a) { return _mm256_sqrt_ps(a); }
    static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
    static vec round(vec a) {
        return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    // n is integral and >= -126 here (exp_vec clamps x), so 2^n is a normal float.
    static vec scale2(vec x, vec n) {
        const __m256i e =
            _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(x, _mm256_castsi256_ps(e));
    }
    static float reduce_add(vec a) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static float reduce_max(vec a) {
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }

    static vec gather(const float* base, const uint32_t* ids) {
        return _mm256_i32gather_ps(base, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids)),
                                   4);
    }
    static vec gather_n(const float* base, const uint32_t* ids, uint32_t n) {
        const __m256i m = mask(n);
        const __m256i idx = _mm256_maskload_epi32(reinterpret_cast<const int*>(ids), m);
        return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, idx, _mm256_castsi256_ps(m), 4);
    }
    static void scatter_fmadd(vec, vec, float*, const uint32_t*) {}
};

}  // namespace
}  // namespace hslide::cpu

#include "kernels_simd.inl"

namespace hslide::cpu {

const kernel_table& avx2_kernels() {
    static const kernel_table table =
        make_table<avx2_ops>("avx2", isa_level::avx2, active_dots_simd<avx2_ops, bf16>);
    return table;
}

}  // namespace hslide::cpu
