// The CPU kernels every training and prediction step is made of, behind one dispatch table.
//
// kernels_scalar.cpp holds the plain reference versions; SIMD variants (AVX2, AVX-512,
// AVX-512-BF16) fill the same table in their own files, compiled with their own flags, and
// are chosen at run time from CPUID. Every variant is tested against the scalar table.
#pragma once

#include <cstdint>

namespace hslide::cpu {

/// Adam constants for one step: w -= lr * (m * c1) / (sqrt(v * c2) + eps),
/// with c1 = 1 / (1 - beta1^t) and c2 = 1 / (1 - beta2^t).
struct adam_step {
    float lr, beta1, beta2, eps, c1, c2;
};

/// Function pointers to one instruction-set level's kernels.
struct kernel_table {
    const char* name;
    /// sum_i a[i] * b[i]
    float (*dot)(const float* a, const float* b, uint32_t n);
    /// sum_i row[ids[i]] * values[i]
    float (*gather_dot)(const float* row, const uint32_t* ids, const float* values, uint32_t n);
    /// y[i] += alpha * x[i]
    void (*axpy)(float alpha, const float* x, float* y, uint32_t n);
    /// y[ids[i]] += alpha * values[i]
    void (*scatter_axpy)(float alpha, const uint32_t* ids, const float* values, float* y,
                         uint32_t n);
    /// Adam on n weights with gradient g (moments m, v updated in place).
    void (*adam)(float* w, float* m, float* v, const float* g, uint32_t n, const adam_step& step);
};

/// The scalar reference kernels.
const kernel_table& scalar_kernels();

/// The kernels for this machine (the scalar table until SIMD levels are added).
const kernel_table& best_kernels();

}  // namespace hslide::cpu
