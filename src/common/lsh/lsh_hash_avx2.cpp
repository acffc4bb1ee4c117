// The AVX2 + FMA LSH hash kernels (lsh_hash_kernels.hpp). Compiled with -mavx2 -mfma only;
// intrinsics and plain code only, no shared inline functions or templates (see the header).
#include "common/lsh/lsh_hash_kernels.hpp"

#include <immintrin.h>

#include <cstring>

namespace hslide::detail {

// Gathers 16 hashes' coordinates per position (two 8-wide gathers: on AMD Zen 4/5 these are
// faster than one 16-wide gather).
void wta_scan_avx2(const float* x, const bin_layout& b, int32_t* values) {
    const uint32_t n_groups = (b.n_hashes + 15) / 16;
    const __m256 zero = _mm256_setzero_ps();
    for (uint32_t g = 0; g < n_groups; ++g) {
        const uint32_t* gi = b.interleaved + static_cast<size_t>(g) * b.w * 16;
        __m256 best0 = _mm256_set1_ps(-__builtin_inff()), best1 = best0;
        __m256i pos0 = _mm256_set1_epi32(-1), pos1 = pos0;
        for (uint32_t j = 0; j < b.w; ++j) {
            const __m256i jv = _mm256_set1_epi32(static_cast<int32_t>(j));
            const __m256i i0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gi + j * 16));
            const __m256i i1 =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gi + j * 16 + 8));
            const __m256 v0 = _mm256_i32gather_ps(x, i0, 4);
            const __m256 v1 = _mm256_i32gather_ps(x, i1, 4);
            const __m256 gt0 = _mm256_and_ps(_mm256_cmp_ps(v0, zero, _CMP_NEQ_OQ),
                                             _mm256_cmp_ps(v0, best0, _CMP_GT_OQ));
            const __m256 gt1 = _mm256_and_ps(_mm256_cmp_ps(v1, zero, _CMP_NEQ_OQ),
                                             _mm256_cmp_ps(v1, best1, _CMP_GT_OQ));
            best0 = _mm256_blendv_ps(best0, v0, gt0);
            best1 = _mm256_blendv_ps(best1, v1, gt1);
            pos0 = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(pos0), _mm256_castsi256_ps(jv), gt0));
            pos1 = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(pos1), _mm256_castsi256_ps(jv), gt1));
        }
        alignas(32) int32_t pos[16];
        _mm256_store_si256(reinterpret_cast<__m256i*>(pos), pos0);
        _mm256_store_si256(reinterpret_cast<__m256i*>(pos + 8), pos1);
        const uint32_t left = b.n_hashes - g * 16;
        const uint32_t n = left < 16 ? left : 16;
        std::memcpy(values + g * 16, pos, n * sizeof(int32_t));
    }
}

void project_avx2(const uint32_t* ids, const float* xs, uint32_t nnz, const int8_t* signs,
                  size_t stride, float* acc, uint32_t P) {
    project_impl(ids, xs, nnz, signs, stride, acc, P);
}

}  // namespace hslide::detail
