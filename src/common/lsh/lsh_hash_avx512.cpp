// The AVX-512 LSH hash kernels (lsh_hash_kernels.hpp). Compiled with the AVX-512 F/BW/VL/DQ
// flags only; intrinsics and plain code only, no shared inline functions or templates (see
// the header).
#include "common/lsh/lsh_hash_kernels.hpp"

#include <immintrin.h>

namespace hslide::detail {
namespace {

// The mask of the first n lanes (n <= 16).
__mmask16 first_lanes(uint32_t n) {
    return static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace

// For dim <= 128 (SLIDE's hidden width): the whole vector sits in 8 registers and each
// position's 16 values come from register permutes instead of gathers, about twice as fast.
void wta_scan_avx512_small(const float* x, const bin_layout& b, int32_t* values) {
    __m512 xr[8];
    for (uint32_t q = 0; q < 8; ++q) {
        const uint32_t first = q * 16;
        const uint32_t left = first >= b.dim ? 0 : b.dim - first;
        // A masked load reads nothing from the masked-off lanes; the address stays in range.
        const uint32_t at = first < b.dim ? first : b.dim - 1;
        xr[q] = _mm512_maskz_loadu_ps(first_lanes(left < 16 ? left : 16), x + at);
    }
    const uint32_t n_groups = (b.n_hashes + 15) / 16;
    const __m512 zero = _mm512_setzero_ps();
    const __m512i bit5 = _mm512_set1_epi32(32), bit6 = _mm512_set1_epi32(64);
    for (uint32_t g = 0; g < n_groups; ++g) {
        const uint32_t* gi = b.interleaved + static_cast<size_t>(g) * b.w * 16;
        __m512 best = _mm512_set1_ps(-__builtin_inff());
        __m512i pos = _mm512_set1_epi32(-1);
        for (uint32_t j = 0; j < b.w; ++j) {
            const __m512i iv = _mm512_loadu_si512(gi + j * 16);
            // Each permute picks from 32 floats by the index's low 5 bits; bits 5 and 6 pick
            // which 32.
            const __m512 v0 = _mm512_permutex2var_ps(xr[0], iv, xr[1]);
            const __m512 v1 = _mm512_permutex2var_ps(xr[2], iv, xr[3]);
            const __m512 v2 = _mm512_permutex2var_ps(xr[4], iv, xr[5]);
            const __m512 v3 = _mm512_permutex2var_ps(xr[6], iv, xr[7]);
            const __mmask16 m5 = _mm512_test_epi32_mask(iv, bit5);
            const __mmask16 m6 = _mm512_test_epi32_mask(iv, bit6);
            const __m512 v = _mm512_mask_blend_ps(m6, _mm512_mask_blend_ps(m5, v0, v1),
                                                  _mm512_mask_blend_ps(m5, v2, v3));
            const __mmask16 nz = _mm512_cmp_ps_mask(v, zero, _CMP_NEQ_OQ);
            const __mmask16 gt = _mm512_mask_cmp_ps_mask(nz, v, best, _CMP_GT_OQ);
            best = _mm512_mask_mov_ps(best, gt, v);
            pos = _mm512_mask_mov_epi32(pos, gt, _mm512_set1_epi32(static_cast<int32_t>(j)));
        }
        const uint32_t left = b.n_hashes - g * 16;
        _mm512_mask_storeu_epi32(values + g * 16, first_lanes(left < 16 ? left : 16), pos);
    }
}

void project_avx512(const uint32_t* ids, const float* xs, uint32_t nnz, const int8_t* signs,
                    size_t stride, float* acc, uint32_t P) {
    project_impl(ids, xs, nnz, signs, stride, acc, P);
}

}  // namespace hslide::detail
