// Scalar reference kernels: the definition every SIMD variant is tested against, and the
// dispatcher that hands out each level's table.
//
// CMake compiles this file without auto-vectorisation, so "scalar" is what it says: the
// baseline the SIMD levels are measured against. Reductions run in index order.
#include "kernels.hpp"

#include "adam_catch_up.hpp"
#include "keep_best.inl"

#include "hslide/error.hpp"

#include <algorithm>
#include <cmath>

namespace hslide::cpu {

#if HSLIDE_X86
const kernel_table& avx2_kernels();
const kernel_table& avx512_kernels();
const kernel_table& avx512bf16_kernels();
const kernel_table& amx_kernels();
#endif

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
    for (uint32_t i = 0; i < n; ++i) {
        const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g[i];
        const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        w[i] -= s.lr * (mi * s.c1) / (std::sqrt(vi * s.c2) + s.eps);
    }
}

void adam_bf16_moments_scalar(float* w, bf16* m, bf16* v, const float* g, uint32_t n,
                              const adam_step& s, uint32_t seed) {
    // adam's step on the widened moments, then the new ones rounded.
    for (uint32_t i = 0; i < n; ++i) {
        float mi = bf16_to_float(m[i]), vi = bf16_to_float(v[i]);
        adam_scalar(w + i, &mi, &vi, g + i, 1, s);
        const uint32_t r = stochastic_hash(seed, i);
        m[i] = float_to_bf16_stochastic(mi, r >> 16);
        v[i] = float_to_bf16_stochastic(vi, r & 0xffffu);
    }
}

double softmax_scalar(const float* logits, float* probs, uint32_t n) {
    float max_logit = logits[0];
    for (uint32_t i = 1; i < n; ++i) max_logit = logits[i] > max_logit ? logits[i] : max_logit;
    double sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
        probs[i] = std::exp(logits[i] - max_logit);
        sum += probs[i];
    }
    const float inv_sum = float(1.0 / sum);
    for (uint32_t i = 0; i < n; ++i) probs[i] *= inv_sum;
    return std::log(sum) + max_logit;
}

template <class T, class ToFloat>
void active_dots_impl(const T* rows, size_t stride, uint32_t width, const uint32_t* ids, uint32_t n,
                      const T* x, const float* bias, float* out, ToFloat to_float) {
    for (uint32_t a = 0; a < n; ++a) {
        const size_t r = ids ? ids[a] : a;
        const T* row = rows + r * stride;
        float s = 0.0f;
        for (uint32_t i = 0; i < width; ++i) s += to_float(row[i]) * to_float(x[i]);
        out[a] = bias ? s + bias[r] : s;
    }
}

template <class T, class ToFloat>
void weighted_row_sum_impl(const T* rows, size_t stride, uint32_t width, const uint32_t* ids,
                           const float* coef, uint32_t n, float* out, ToFloat to_float) {
    for (uint32_t k = 0; k < n; ++k) {
        const T* row = rows + size_t(ids ? ids[k] : k) * stride;
        for (uint32_t i = 0; i < width; ++i) out[i] += coef[k] * to_float(row[i]);
    }
}

template <class T, class ToFloat>
void weighted_row_sum_f64_impl(const T* rows, size_t stride, uint32_t width, const uint32_t* ids,
                               const float* coef, uint32_t n, double* out, ToFloat to_float) {
    for (uint32_t k = 0; k < n; ++k) {
        const T* row = rows + size_t(ids ? ids[k] : k) * stride;
        for (uint32_t i = 0; i < width; ++i) out[i] += double(coef[k]) * double(to_float(row[i]));
    }
}

void weighted_vector_sum_scalar(const float* const* vectors, const float* coef, uint32_t n,
                                uint32_t width, float* out) {
    for (uint32_t i = 0; i < width; ++i) out[i] = 0.0f;
    for (uint32_t k = 0; k < n; ++k)
        for (uint32_t i = 0; i < width; ++i) out[i] += coef[k] * vectors[k][i];
}

float identity(float x) {
    return x;
}

void weighted_vector_sum4_scalar(const float* const* vectors, const float* const* coef, uint32_t n,
                                 uint32_t width, float* const* out) {
    for (uint32_t j = 0; j < 4; ++j) weighted_vector_sum_scalar(vectors, coef[j], n, width, out[j]);
}

void active_dots_scalar(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                        uint32_t n, const float* x, const float* bias, float* out) {
    active_dots_impl(rows, stride, width, ids, n, x, bias, out, identity);
}

void dots16_scalar(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                   uint32_t n, const float* xt, const float* bias, float* out) {
    for (uint32_t a = 0; a < n; ++a) {
        const float* row = rows + size_t(ids ? ids[a] : a) * stride;
        for (uint32_t j = 0; j < 16; ++j) {
            float s = 0.0f;
            for (uint32_t i = 0; i < width; ++i) s += row[i] * xt[i * 16 + j];
            out[a * 16 + j] = bias ? s + bias[a] : s;
        }
    }
}

void weighted_row_sum_scalar(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                             const float* coef, uint32_t n, float* out) {
    weighted_row_sum_impl(rows, stride, width, ids, coef, n, out, identity);
}

void weighted_row_sum4_scalar(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                              const float* const* coef, uint32_t n, float* const* out) {
    for (uint32_t j = 0; j < 4; ++j)
        weighted_row_sum_impl(rows, stride, width, ids, coef[j], n, out[j], identity);
}

void to_bf16_scalar(const float* x, bf16* out, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
}

void active_dots_bf16_scalar(const bf16* rows, size_t stride, uint32_t width, const uint32_t* ids,
                             uint32_t n, const bf16* x, const float* bias, float* out) {
    active_dots_impl(rows, stride, width, ids, n, x, bias, out, bf16_to_float);
}

void dots16_bf16_scalar(const bf16* rows, size_t stride, uint32_t width, uint32_t n, const bf16* xp,
                        const float* bias, float* out) {
    for (uint32_t a = 0; a < n; ++a)
        for (uint32_t j = 0; j < 16; ++j) {
            float s = 0.0f;
            for (uint32_t i = 0; i < width; ++i)
                s += bf16_to_float(rows[a * stride + i]) *
                     bf16_to_float(xp[(i / 2) * 32 + j * 2 + i % 2]);
            out[a * 16 + j] = bias ? s + bias[a] : s;
        }
}

void weighted_row_sum_bf16_scalar(const bf16* rows, size_t stride, uint32_t width,
                                  const uint32_t* ids, const float* coef, uint32_t n, float* out) {
    weighted_row_sum_impl(rows, stride, width, ids, coef, n, out, bf16_to_float);
}

void weighted_row_sum_f64_scalar(const float* rows, size_t stride, uint32_t width,
                                 const uint32_t* ids, const float* coef, uint32_t n, double* out) {
    weighted_row_sum_f64_impl(rows, stride, width, ids, coef, n, out, identity);
}

void weighted_row_sum_bf16_f64_scalar(const bf16* rows, size_t stride, uint32_t width,
                                      const uint32_t* ids, const float* coef, uint32_t n,
                                      double* out) {
    weighted_row_sum_f64_impl(rows, stride, width, ids, coef, n, out, bf16_to_float);
}

void dots16_u8s8_scalar(const int8_t* rows, size_t stride, uint32_t width, uint32_t n,
                        const uint8_t* xq, const float* row_scale, const int32_t* row_sum,
                        const float* query_scale, const int32_t* query_zero, const float* bias,
                        float* out) {
    for (uint32_t a = 0; a < n; ++a)
        for (uint32_t j = 0; j < 16; ++j) {
            int32_t acc = 0;
            for (uint32_t i = 0; i < width; ++i)
                acc += int32_t(xq[(i / 4) * 64 + j * 4 + i % 4]) * int32_t(rows[a * stride + i]);
            const float s =
                float(acc - query_zero[j] * row_sum[a]) * (row_scale[a] * query_scale[j]);
            out[a * 16 + j] = bias ? s + bias[a] : s;
        }
}

}  // namespace

float to_int8_row_reference(const float* x, int8_t* out, uint32_t n, int32_t* sum) {
    float m = 0.0f;
    for (uint32_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    // A row whose largest value is too small for 127 / m to be finite is all zeros.
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    const float scale = std::isfinite(inv) ? inv : 0.0f;
    int32_t s = 0;
    for (uint32_t i = 0; i < n; ++i) {
        const float q = std::clamp(std::nearbyint(x[i] * scale), -127.0f, 127.0f);
        out[i] = int8_t(q);
        s += int32_t(q);
    }
    *sum = s;
    return m / 127.0f;
}

const kernel_table& scalar_kernels() {
    static const kernel_table table{"scalar",
                                    isa_level::scalar,
                                    dot_scalar,
                                    gather_dot_scalar,
                                    axpy_scalar,
                                    scatter_axpy_scalar,
                                    adam_scalar,
                                    adam_bf16_moments_scalar,
                                    apply_catch_up,
                                    softmax_scalar,
                                    keep_best_by_rank,
                                    active_dots_scalar,
                                    dots16_scalar,
                                    weighted_row_sum_scalar,
                                    weighted_vector_sum_scalar,
                                    weighted_row_sum4_scalar,
                                    weighted_vector_sum4_scalar,
                                    to_bf16_scalar,
                                    active_dots_bf16_scalar,
                                    dots16_bf16_scalar,
                                    weighted_row_sum_bf16_scalar,
                                    weighted_row_sum_f64_scalar,
                                    weighted_row_sum_bf16_f64_scalar,
                                    to_int8_row_reference,
                                    dots16_u8s8_scalar,
                                    255};
    return table;
}

const kernel_table& kernels_for(isa_level level) {
    HSLIDE_CHECK(isa_supported(level), "ISA level {} is not supported by this CPU (best: {})",
                 to_string(level), to_string(detected_isa()));
#if HSLIDE_X86
    switch (level) {
        case isa_level::amx:
            return amx_kernels();
        case isa_level::avx512bf16:
            return avx512bf16_kernels();
        case isa_level::avx512:
            return avx512_kernels();
        case isa_level::avx2:
            return avx2_kernels();
        case isa_level::scalar:
            break;
    }
#endif
    return scalar_kernels();
}

}  // namespace hslide::cpu
