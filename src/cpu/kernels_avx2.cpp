// The AVX2 + FMA kernels: 8 floats per vector, masked loads and stores for tails, gathers but
// no scatters. CMake compiles this file alone with -mavx2 -mfma; kernels_for() calls it only
// on a CPU that has them.
#include "kernels.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

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

namespace {

// to_int8_row_reference's rounding, eight values at a time: the update rewrites a row's int8
// copy each time it moves the row, as often as the search reads it.
float to_int8_row_avx2(const float* x, int8_t* out, uint32_t n, int32_t* sum) {
    using V = avx2_ops;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = V::zero();
    for (uint32_t i = 0; i < n; i += V::lanes) {
        const __m256 v = n - i >= V::lanes ? V::load(x + i) : V::load_n(x + i, n - i);
        vmax = V::max(vmax, _mm256_and_ps(v, abs_mask));  // the lanes past n loaded 0
    }
    const float m = V::reduce_max(vmax);
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;  // as to_int8_row_reference
    const __m256 scale = V::set1(std::isfinite(inv) ? inv : 0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i vsum = _mm256_setzero_si256();
    for (uint32_t i = 0; i < n; i += V::lanes) {
        const uint32_t count = std::min(n - i, V::lanes);
        const __m256 v = count == V::lanes ? V::load(x + i) : V::load_n(x + i, count);
        // The conversion rounds to nearest even (MXCSR's default), as nearbyint does.
        const __m256i q =
            _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(V::mul(v, scale))));
        vsum = _mm256_add_epi32(vsum, q);  // the lanes past n are 0
        const __m128i q16 =
            _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        const __m128i q8 = _mm_packs_epi16(q16, q16);  // in -127..127: nothing saturates
        if (count == V::lanes) {
            _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), q8);
        } else {
            alignas(16) int8_t part[16];
            _mm_store_si128(reinterpret_cast<__m128i*>(part), q8);
            for (uint32_t j = 0; j < count; ++j) out[i + j] = part[j];
        }
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(vsum), _mm256_extracti128_si256(vsum, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    *sum = _mm_cvtsi128_si32(s);
    return m / 127.0f;
}

// A row's four values (`bytes` of them, the rest 0) in each 32-bit lane: a load that
// broadcasts (vbroadcastss) where all four are there, with no shuffle.
inline __m256i broadcast_four(const int8_t* p, uint32_t bytes) {
    if (bytes == 4)
        return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
    int32_t values = 0;
    __builtin_memcpy(&values, p, bytes);
    return _mm256_set1_epi32(values);
}

// dots16_u8s8 without 8-bit dot products: vpmaddubsw multiplies the inputs' bytes (lane j of
// vector t: input 8t + j's four) by a row's four broadcast, summing each pair into 16 bits,
// and vpmaddwd by ones sums the pairs into the int32 lane. With inputs at most 15
// (kernel_table::u8s8_input_max) and rows in [-127, 127], a pair is at most 3,810 in
// magnitude, so eight fours' pairs add in 16 bits (30,480) before one vpmaddwd widens them:
// 18 multiplies for 512 products a row, where 6-bit inputs, widened every two fours, took 24
// (and whole bytes, widened every four, 32). Past 15 the 16-bit sums could wrap.
constexpr uint32_t avx2_u8s8_fours_a_widening = 8;

// A row's sums against the 16 inputs: lane j of v0 is input j's, of v1 input 8 + j's; p0 and
// p1 hold the 16-bit pair sums of the fours since the last widening.
struct u8s8_sums {
    __m256i v0 = _mm256_setzero_si256(), v1 = v0, p0 = v0, p1 = v0;

    // One four of the row (broadcast in r) against the inputs' fours x0 and x1.
    void add(__m256i r, __m256i x0, __m256i x1) {
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(x0, r));
        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(x1, r));
    }

    // The pair sums into the int32 lanes, at most avx2_u8s8_fours_a_widening fours after the
    // last.
    void widen() {
        const __m256i ones = _mm256_set1_epi16(1);
        v0 = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), v0);
        v1 = _mm256_add_epi32(_mm256_madd_epi16(p1, ones), v1);
        p0 = p1 = _mm256_setzero_si256();
    }

    // The epilogue of dots16_u8s8 for row a (widened): out[a * 16 + j].
    void store(uint32_t a, const float* row_scale, const int32_t* row_sum, const float* query_scale,
               const int32_t* query_zero, const float* bias, float* out) const {
        const __m256i sums[2] = {v0, v1};
        for (uint32_t h = 0; h < 2; ++h) {
            const __m256i zero =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(query_zero + 8 * h));
            const __m256i c =
                _mm256_sub_epi32(sums[h], _mm256_mullo_epi32(zero, _mm256_set1_epi32(row_sum[a])));
            const __m256 scale =
                _mm256_mul_ps(_mm256_set1_ps(row_scale[a]), _mm256_loadu_ps(query_scale + 8 * h));
            // One fused rounding with a bias, written out (as the VNNI kernel, for the same
            // reason: a row's score must not depend on where it falls in a call).
            const __m256 score =
                bias ? _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), scale, _mm256_set1_ps(bias[a]))
                     : _mm256_mul_ps(_mm256_cvtepi32_ps(c), scale);
            _mm256_storeu_ps(out + size_t(a) * 16 + 8 * h, score);
        }
    }
};

// R rows (1 to 3) from row a against the inputs. Named sums, not an array: GCC kept an
// array's accumulators on the stack.
template <uint32_t R>
void dots16_u8s8_rows_avx2(const int8_t* rows, size_t stride, uint32_t width, uint32_t a,
                           const uint8_t* xq, const float* row_scale, const int32_t* row_sum,
                           const float* query_scale, const int32_t* query_zero, const float* bias,
                           float* out) {
    static_assert(R >= 1 && R <= 3);
    u8s8_sums first, second, third;
    const int8_t* w = rows + size_t(a) * stride;
    const uint32_t fours = (width + 3) / 4, whole = width / 4;
    // One four against the inputs: the last four's values alone where the width is not a
    // multiple of 4 (nothing past it is read).
    auto add_four = [&](uint32_t p, uint32_t bytes) {
        const __m256i x0 =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + size_t(p) * 64));
        const __m256i x1 =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + size_t(p) * 64 + 32));
        first.add(broadcast_four(w + 4 * p, bytes), x0, x1);
        if constexpr (R >= 2) second.add(broadcast_four(w + stride + 4 * p, bytes), x0, x1);
        if constexpr (R >= 3) third.add(broadcast_four(w + 2 * stride + 4 * p, bytes), x0, x1);
    };
    auto widen = [&] {
        first.widen();
        if constexpr (R >= 2) second.widen();
        if constexpr (R >= 3) third.widen();
    };
    constexpr uint32_t block = avx2_u8s8_fours_a_widening;
    uint32_t p = 0;
    for (; p + block <= whole; p += block) {
        // Not unrolled whole: GCC then computed the block's 48 products first and spilled
        // them to sum them as a tree.
#pragma GCC unroll 2
        for (uint32_t q = 0; q < block; ++q) add_four(p + q, 4);
        widen();
    }
    if (p < fours) {
        for (; p < fours; ++p) add_four(p, p < whole ? 4u : width % 4);
        widen();
    }
    first.store(a, row_scale, row_sum, query_scale, query_zero, bias, out);
    if constexpr (R >= 2)
        second.store(a + 1, row_scale, row_sum, query_scale, query_zero, bias, out);
    if constexpr (R >= 3)
        third.store(a + 2, row_scale, row_sum, query_scale, query_zero, bias, out);
}

// The inputs' largest byte: eight fours' pairs, 8 * 2 * 15 * 127 = 30,480, stay in int16 (a
// 4-bit query loses no P@1 on the real sets: bench/kernels.md).
constexpr uint8_t avx2_u8s8_input_max = 15;
static_assert(avx2_u8s8_fours_a_widening * 2 * avx2_u8s8_input_max * 127 <= 32767);

void dots16_u8s8_avx2(const int8_t* rows, size_t stride, uint32_t width, uint32_t n,
                      const uint8_t* xq, const float* row_scale, const int32_t* row_sum,
                      const float* query_scale, const int32_t* query_zero, const float* bias,
                      float* out) {
    // Three rows at a time: their six 16-bit sums, the two input vectors, the broadcasts and
    // the products fill the 16 registers (the int32 sums wait in L1 between widenings); two
    // or four rows were 6-40% slower (bench/kernels.md).
    constexpr uint32_t R = 3;
    uint32_t a = 0;
    for (; a + R <= n; a += R)
        dots16_u8s8_rows_avx2<R>(rows, stride, width, a, xq, row_scale, row_sum, query_scale,
                                 query_zero, bias, out);
    for (; a < n; ++a)
        dots16_u8s8_rows_avx2<1>(rows, stride, width, a, xq, row_scale, row_sum, query_scale,
                                 query_zero, bias, out);
}

}  // namespace

const kernel_table& avx2_kernels() {
    static const kernel_table table =
        make_table<avx2_ops>("avx2", isa_level::avx2, active_dots_simd<avx2_ops, bf16>, nullptr,
                             to_int8_row_avx2, dots16_u8s8_avx2, avx2_u8s8_input_max);
    return table;
}

}  // namespace hslide::cpu
