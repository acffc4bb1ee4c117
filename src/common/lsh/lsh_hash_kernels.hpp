// The SIMD kernels of the LSH hash families (lsh_hash.cpp), one set per instruction-set level.
//
// lsh_hash.cpp holds the scalar versions and picks a level's kernels from active_isa() when a
// family is created; lsh_hash_avx2.cpp and lsh_hash_avx512.cpp hold the others, each compiled
// with its own level's flags only. Those files therefore instantiate no inline function or
// template that another translation unit also instantiates (the linker could keep the
// AVX-512 copy for every caller): they use intrinsics and plain code, and the one shared
// helper below has internal linkage, so each file compiles its own copy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hslide::detail {

/// The bins of a DWTA / WTA / MinHash family, as the winner-take-all scans read them.
struct bin_layout {
    const uint32_t* bins;         ///< bin h = bins[h * w .. + w)
    const uint32_t* interleaved;  ///< [(g * w + j) * 16 + lane] = coordinate j of hash 16g+lane
    uint32_t w, n_hashes, dim;
};

/// The winner-take-all scan: values[h] = position of the largest nonzero value in bin h (the
/// first on ties), or -1 when the bin has none. Every version makes the same comparisons in
/// the same order, so they agree exactly.
using wta_scan_fn = void (*)(const float* x, const bin_layout& b, int32_t* values);

/// SimHash projections: acc[p] += sum over the nonzeros, in order, of xs[n] *
/// signs[ids[n] * stride + p], for p < P. Every version gives the same sums (see project_impl).
using project_fn = void (*)(const uint32_t* ids, const float* xs, uint32_t nnz, const int8_t* signs,
                            size_t stride, float* acc, uint32_t P);

#if HSLIDE_X86
// lsh_hash_avx2.cpp (AVX2 + FMA)
void wta_scan_avx2(const float* x, const bin_layout& b, int32_t* values);
void project_avx2(const uint32_t* ids, const float* xs, uint32_t nnz, const int8_t* signs,
                  size_t stride, float* acc, uint32_t P);

// lsh_hash_avx512.cpp (AVX-512 F/BW/VL/DQ). wta_scan_avx512_small needs b.dim <= 128.
void wta_scan_avx512_small(const float* x, const bin_layout& b, int32_t* values);
void project_avx512(const uint32_t* ids, const float* xs, uint32_t nnz, const int8_t* signs,
                    size_t stride, float* acc, uint32_t P);
#endif

// Internal linkage on purpose: every file that includes this gets its own copy, compiled with
// that file's instruction set (see the top of the file).
namespace {

/// The body of every project_* kernel. Each product is exact (the sign is -1, 0 or 1), so
/// fused or unfused, scalar or vector, the sums are the same, and the dense and sparse paths
/// (which both call this on the list of nonzeros) agree bit for bit. Four rows per pass keep
/// the accumulators in registers for longer.
inline __attribute__((always_inline)) void project_impl(const uint32_t* ids, const float* xs,
                                                        uint32_t nnz, const int8_t* signs,
                                                        size_t stride, float* acc, uint32_t P) {
    uint32_t n = 0;
    for (; n + 4 <= nnz; n += 4) {
        const int8_t* s0 = signs + ids[n] * stride;
        const int8_t* s1 = signs + ids[n + 1] * stride;
        const int8_t* s2 = signs + ids[n + 2] * stride;
        const int8_t* s3 = signs + ids[n + 3] * stride;
        const float x0 = xs[n], x1 = xs[n + 1], x2 = xs[n + 2], x3 = xs[n + 3];
        for (uint32_t p = 0; p < P; ++p) {
            float a = acc[p];
            a += x0 * static_cast<float>(s0[p]);
            a += x1 * static_cast<float>(s1[p]);
            a += x2 * static_cast<float>(s2[p]);
            a += x3 * static_cast<float>(s3[p]);
            acc[p] = a;
        }
    }
    for (; n < nnz; ++n) {
        const int8_t* s = signs + ids[n] * stride;
        const float x = xs[n];
        for (uint32_t p = 0; p < P; ++p) acc[p] += x * static_cast<float>(s[p]);
    }
}

}  // namespace
}  // namespace hslide::detail
