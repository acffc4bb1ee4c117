// Scalar reference kernels: the definition every SIMD variant is tested against.
//
// Element-wise kernels take restrict pointers and copy constants to locals so the compiler may
// vectorise them (each element's arithmetic is the same either way); reductions keep their
// sequential order, which is the reference's definition.
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

void axpy_scalar(float alpha, const float* __restrict x, float* __restrict y, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void scatter_axpy_scalar(float alpha, const uint32_t* ids, const float* values, float* y,
                         uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) y[ids[i]] += alpha * values[i];
}

void adam_scalar(float* __restrict w, float* __restrict m, float* __restrict v,
                 const float* __restrict g, uint32_t n, const adam_step& s) {
    const float b1 = s.beta1, b2 = s.beta2, one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
    const float lr = s.lr, c1 = s.c1, c2 = s.c2, eps = s.eps;
    for (uint32_t i = 0; i < n; ++i) {
        const float mi = b1 * m[i] + one_minus_b1 * g[i];
        const float vi = b2 * v[i] + one_minus_b2 * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi * c1) / (std::sqrt(vi * c2) + eps);
    }
}

}  // namespace

const kernel_table& scalar_kernels() {
    static const kernel_table table{"scalar",    dot_scalar,          gather_dot_scalar,
                                    axpy_scalar, scatter_axpy_scalar, adam_scalar};
    return table;
}

const kernel_table& best_kernels() {
    return scalar_kernels();
}

}  // namespace hslide::cpu
