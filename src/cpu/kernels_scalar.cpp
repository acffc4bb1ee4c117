// Scalar reference kernels: the definition every SIMD variant is tested against.
#include "kernels.hpp"

#include <cmath>

namespace hslide::cpu {
namespace {

float dot_scalar(const float* a, const float* b, uint32_t n) {
    float s = 0.0f;
    for (uint32_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

float gather_dot_scalar(const float* row, const uint32_t* ids, const float* values, uint32_t n) {
    float s = 0.0f;
    for (uint32_t i = 0; i < n; ++i) s += row[ids[i]] * values[i];
    return s;
}

void axpy_scalar(float alpha, const float* x, float* y, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void scatter_axpy_scalar(float alpha, const uint32_t* ids, const float* values, float* y,
                         uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) y[ids[i]] += alpha * values[i];
}

void adam_scalar(float* w, float* m, float* v, const float* g, uint32_t n, const adam_step& s) {
    const float one_minus_b1 = 1.0f - s.beta1, one_minus_b2 = 1.0f - s.beta2;
    for (uint32_t i = 0; i < n; ++i) {
        m[i] = s.beta1 * m[i] + one_minus_b1 * g[i];
        v[i] = s.beta2 * v[i] + one_minus_b2 * g[i] * g[i];
        w[i] -= s.lr * (m[i] * s.c1) / (std::sqrt(v[i] * s.c2) + s.eps);
    }
}

}  // namespace

const kernel_table& scalar_kernels() {
    static const kernel_table table{"scalar",    dot_scalar,   gather_dot_scalar,
                                    axpy_scalar, scatter_axpy_scalar, adam_scalar};
    return table;
}

const kernel_table& best_kernels() { return scalar_kernels(); }

}  // namespace hslide::cpu
