// The SIMD kernels, written once over a vector-operations type `V` (see kernels_avx2.cpp and
// kernels_avx512.cpp, which define V and include this file). Everything here sits in an
// anonymous namespace: each including file compiles it with its own ISA flags, and internal
// linkage keeps the linker from swapping one level's copy of a function for another's.
//
// V provides: vec, lanes, zero, set1, load/load_n (float and bf16 sources), load_n_fill,
// store/store_n, store_bf16/store_bf16_n, ivec with stochastic_hash, high_half, low_half and
// store_bf16_stochastic, fmadd, add, sub, mul, div, sqrt, max, round,
// scale2 (x * 2^n for integral n), reduce_add, reduce_max, gather/gather_n, has_scatter and
// scatter_fmadd; and for double accumulation dvec (lanes / 2 doubles), dset1, dload, dstore,
// dfmadd, widen_low/widen_high (a vec's first or last lanes / 2 floats as doubles). A `_n`
// operation touches only the first n < lanes elements.
#pragma once

#include "keep_best.inl"

#include <type_traits>

namespace hslide::cpu {
namespace {

constexpr uint32_t prefetch_rows_ahead = 4;

template <class T>
inline void prefetch_span(const T* p, uint32_t count) {
    const char* c = reinterpret_cast<const char*>(p);
    for (uint32_t off = 0; off < count * sizeof(T); off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// <row, x> over `width` elements, four accumulators (the FMA latency needs independent chains).
template <class V, class T>
inline float row_dot(const T* row, const T* x, uint32_t width) {
    constexpr uint32_t L = V::lanes;
    auto a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
    uint32_t i = 0;
    for (; i + 4 * L <= width; i += 4 * L) {
        a0 = V::fmadd(V::load(row + i), V::load(x + i), a0);
        a1 = V::fmadd(V::load(row + i + L), V::load(x + i + L), a1);
        a2 = V::fmadd(V::load(row + i + 2 * L), V::load(x + i + 2 * L), a2);
        a3 = V::fmadd(V::load(row + i + 3 * L), V::load(x + i + 3 * L), a3);
    }
    for (; i + L <= width; i += L) a0 = V::fmadd(V::load(row + i), V::load(x + i), a0);
    if (i < width) a1 = V::fmadd(V::load_n(row + i, width - i), V::load_n(x + i, width - i), a1);
    return V::reduce_add(V::add(V::add(a0, a1), V::add(a2, a3)));
}

template <class V>
float dot_simd(const float* a, const float* b, uint32_t n) {
    return row_dot<V>(a, b, n);
}

template <class V>
float gather_dot_simd(const float* row, const uint32_t* ids, const float* values, uint32_t n) {
    constexpr uint32_t L = V::lanes;
    auto a0 = V::zero(), a1 = V::zero();
    uint32_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
        a0 = V::fmadd(V::gather(row, ids + i), V::load(values + i), a0);
        a1 = V::fmadd(V::gather(row, ids + i + L), V::load(values + i + L), a1);
    }
    for (; i + L <= n; i += L) a0 = V::fmadd(V::gather(row, ids + i), V::load(values + i), a0);
    if (i < n) a1 = V::fmadd(V::gather_n(row, ids + i, n - i), V::load_n(values + i, n - i), a1);
    return V::reduce_add(V::add(a0, a1));
}

template <class V>
void axpy_simd(float alpha, const float* x, float* y, uint32_t n) {
    constexpr uint32_t L = V::lanes;
    const auto va = V::set1(alpha);
    uint32_t i = 0;
    for (; i + L <= n; i += L) V::store(y + i, V::fmadd(va, V::load(x + i), V::load(y + i)));
    if (i < n)
        V::store_n(y + i, V::fmadd(va, V::load_n(x + i, n - i), V::load_n(y + i, n - i)), n - i);
}

template <class V>
void scatter_axpy_simd(float alpha, const uint32_t* ids, const float* values, float* y,
                       uint32_t n) {
    uint32_t i = 0;
    if constexpr (V::has_scatter) {
        constexpr uint32_t L = V::lanes;
        const auto va = V::set1(alpha);
        for (; i + L <= n; i += L) V::scatter_fmadd(va, V::load(values + i), y, ids + i);
    }
    for (; i < n; ++i) y[ids[i]] += alpha * values[i];
}

// A step's constants, broadcast once a call: adam_vec's stores through float pointers could
// alias the adam_step's floats, so read from it they were loaded and broadcast again for every
// vector.
template <class V>
struct adam_constants {
    typename V::vec b1, b2, omb1, omb2, lr, c1, c2, eps;
    explicit adam_constants(const adam_step& s)
        : b1(V::set1(s.beta1)),
          b2(V::set1(s.beta2)),
          omb1(V::set1(1.0f - s.beta1)),
          omb2(V::set1(1.0f - s.beta2)),
          lr(V::set1(s.lr)),
          c1(V::set1(s.c1)),
          c2(V::set1(s.c2)),
          eps(V::set1(s.eps)) {}
};

// Adam on `count` elements (one vector or less). Moments M are fp32, or bf16 stored rounded
// stochastically with the bits of stochastic_hash(seed, first + lane) (high half for m, low
// half for v); the weight steps with the new fp32 moments either way.
template <class V, class M>
inline void adam_vec(float* w, M* m, M* v, const float* g, uint32_t count,
                     const adam_constants<V>& c, uint32_t seed = 0, uint32_t first = 0) {
    auto load = [count](const auto* p) {
        return count == V::lanes ? V::load(p) : V::load_n(p, count);
    };
    auto store = [count](float* p, typename V::vec x) {
        if (count == V::lanes)
            V::store(p, x);
        else
            V::store_n(p, x, count);
    };
    const auto gi = load(g);
    const auto mi = V::fmadd(c.b1, load(m), V::mul(c.omb1, gi));
    const auto vi = V::fmadd(c.b2, load(v), V::mul(c.omb2, V::mul(gi, gi)));
    if constexpr (std::is_same_v<M, float>) {
        store(m, mi);
        store(v, vi);
    } else {
        const auto r = V::stochastic_hash(seed, first);
        V::store_bf16_stochastic(m, mi, V::high_half(r), count);
        V::store_bf16_stochastic(v, vi, V::low_half(r), count);
    }
    const auto step =
        V::div(V::mul(c.lr, V::mul(mi, c.c1)), V::add(V::sqrt(V::mul(vi, c.c2)), c.eps));
    store(w, V::sub(load(w), step));
}

template <class V>
void adam_simd(float* w, float* m, float* v, const float* g, uint32_t n, const adam_step& s) {
    constexpr uint32_t L = V::lanes;
    const adam_constants<V> c(s);
    uint32_t i = 0;
    for (; i + L <= n; i += L) adam_vec<V>(w + i, m + i, v + i, g + i, L, c);
    if (i < n) adam_vec<V>(w + i, m + i, v + i, g + i, n - i, c);
}

template <class V>
void catch_up_simd(float* w, float* m, float* v, uint32_t n, const catch_up_step& c) {
    constexpr uint32_t L = V::lanes;
    const auto displacement = V::set1(c.displacement), m_decay = V::set1(c.m_decay),
               v_decay = V::set1(c.v_decay), eps = V::set1(c.eps);
    for (uint32_t i = 0; i < n; i += L) {
        const uint32_t count = n - i < L ? n - i : L;
        auto load = [count](const float* p) {
            return count == V::lanes ? V::load(p) : V::load_n(p, count);
        };
        auto store = [count](float* p, typename V::vec x) {
            if (count == V::lanes)
                V::store(p, x);
            else
                V::store_n(p, x, count);
        };
        const auto mi = load(m + i), vi = load(v + i);
        // The reference's order: (S * m) / (sqrt(v) + eps), then w minus that.
        const auto step = V::div(V::mul(displacement, mi), V::add(V::sqrt(vi), eps));
        store(w + i, V::sub(load(w + i), step));
        store(m + i, V::mul(mi, m_decay));
        store(v + i, V::mul(vi, v_decay));
    }
}

template <class V>
void adam_bf16_moments_simd(float* w, bf16* m, bf16* v, const float* g, uint32_t n,
                            const adam_step& s, uint32_t seed) {
    constexpr uint32_t L = V::lanes;
    const adam_constants<V> c(s);
    for (uint32_t i = 0; i < n; i += L)
        adam_vec<V>(w + i, m + i, v + i, g + i, n - i < L ? n - i : L, c, seed, i);
}

// exp(x) for x <= 0 as in softmax: n = round(x / ln 2), r = x - n ln 2 (in two parts, so r is
// exact), e^r by its degree-6 Taylor polynomial on |r| <= ln2 / 2 (relative error < 2e-7),
// times 2^n. Below -87.3 the result stays at about 1e-38 instead of going subnormal.
template <class V>
inline typename V::vec exp_vec(typename V::vec x) {
    x = V::max(x, V::set1(-87.3f));
    const auto n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    auto r = V::fmadd(n, V::set1(-0.693145751953125f), x);
    r = V::fmadd(n, V::set1(-1.428606765330187e-06f), r);
    auto p = V::set1(1.0f / 720.0f);
    p = V::fmadd(p, r, V::set1(1.0f / 120.0f));
    p = V::fmadd(p, r, V::set1(1.0f / 24.0f));
    p = V::fmadd(p, r, V::set1(1.0f / 6.0f));
    p = V::fmadd(p, r, V::set1(0.5f));
    p = V::fmadd(p, r, V::set1(1.0f));
    p = V::fmadd(p, r, V::set1(1.0f));
    return V::scale2(p, n);
}

template <class V>
double softmax_simd(const float* logits, float* probs, uint32_t n) {
    constexpr uint32_t L = V::lanes;
    const float minus_inf = -__builtin_inff();
    auto vmax = V::set1(minus_inf);
    uint32_t i = 0;
    for (; i + L <= n; i += L) vmax = V::max(vmax, V::load(logits + i));
    if (i < n) vmax = V::max(vmax, V::load_n_fill(logits + i, n - i, minus_inf));
    const float max_logit = V::reduce_max(vmax);
    const auto vm = V::set1(max_logit);
    auto vsum = V::zero();
    for (i = 0; i + L <= n; i += L) {
        const auto e = exp_vec<V>(V::sub(V::load(logits + i), vm));
        V::store(probs + i, e);
        vsum = V::add(vsum, e);
    }
    if (i < n) {
        // Lanes past n read as the max (exp = 1) and are dropped: only n - i are stored and summed.
        const auto e = exp_vec<V>(V::sub(V::load_n_fill(logits + i, n - i, max_logit), vm));
        V::store_n(probs + i, e, n - i);
        vsum = V::add(vsum, V::load_n(probs + i, n - i));
    }
    const double sum = V::reduce_add(vsum);
    const auto inv = V::set1(float(1.0 / sum));
    for (i = 0; i + L <= n; i += L) V::store(probs + i, V::mul(V::load(probs + i), inv));
    if (i < n) V::store_n(probs + i, V::mul(V::load_n(probs + i, n - i), inv), n - i);
    return __builtin_log(sum) + max_logit;
}

// Active-neuron dot products with any row-dot function, prefetching the rows ahead.
template <class T, class RowDot>
inline void active_dots_with(RowDot row_dot_fn, const T* rows, size_t stride, uint32_t width,
                             const uint32_t* ids, uint32_t n, const T* x, const float* bias,
                             float* out) {
    for (uint32_t a = 0; a < n; ++a) {
        if (a + prefetch_rows_ahead < n) {
            const size_t ahead = ids ? ids[a + prefetch_rows_ahead] : a + prefetch_rows_ahead;
            prefetch_span(rows + ahead * stride, width);
        }
        const size_t r = ids ? ids[a] : a;
        const float s = row_dot_fn(rows + r * stride, x, width);
        out[a] = bias ? s + bias[r] : s;
    }
}

template <class V, class T>
void active_dots_simd(const T* rows, size_t stride, uint32_t width, const uint32_t* ids, uint32_t n,
                      const T* x, const float* bias, float* out) {
    active_dots_with(row_dot<V, T>, rows, stride, width, ids, n, x, bias, out);
}

// R rows at a time against the 16 inputs (16 / lanes vectors): per element, one load of the
// inputs' vectors and R broadcasts of row elements feed R * 16 / lanes FMAs.
template <class V, uint32_t R>
inline void dots16_rows(const float* const* w, uint32_t width, uint32_t a, const float* xt,
                        const float* bias, float* out) {
    constexpr uint32_t L = V::lanes, NV = 16 / L;
    typename V::vec acc[R][NV];
    for (uint32_t r = 0; r < R; ++r)
        for (uint32_t v = 0; v < NV; ++v) acc[r][v] = V::zero();
    for (uint32_t i = 0; i < width; ++i) {
        typename V::vec x[NV];
        for (uint32_t v = 0; v < NV; ++v) x[v] = V::load(xt + size_t(i) * 16 + v * L);
        for (uint32_t r = 0; r < R; ++r) {
            const auto wb = V::set1(w[r][i]);
            for (uint32_t v = 0; v < NV; ++v) acc[r][v] = V::fmadd(wb, x[v], acc[r][v]);
        }
    }
    for (uint32_t r = 0; r < R; ++r)
        for (uint32_t v = 0; v < NV; ++v) {
            const auto s = bias ? V::add(acc[r][v], V::set1(bias[a + r])) : acc[r][v];
            V::store(out + size_t(a + r) * 16 + v * L, s);
        }
}

template <class V>
void dots16_simd(const float* rows, size_t stride, uint32_t width, const uint32_t* ids, uint32_t n,
                 const float* xt, const float* bias, float* out) {
    // 8 accumulators: enough independent FMA chains to cover the FMA latency on two ports.
    constexpr uint32_t R = V::lanes == 16 ? 8 : 4;
    auto row_at = [&](uint32_t a) { return rows + size_t(ids ? ids[a] : a) * stride; };
    const float* w[R];
    uint32_t a = 0;
    for (; a + R <= n; a += R) {
        // Rows by id are scattered: the next block's are requested while this one is summed.
        if (ids)
            for (uint32_t r = 0; r < R && a + R + r < n; ++r)
                prefetch_span(row_at(a + R + r), width);
        for (uint32_t r = 0; r < R; ++r) w[r] = row_at(a + r);
        dots16_rows<V, R>(w, width, a, xt, bias, out);
    }
    // The tail in halving blocks: a row alone is one chain of dependent FMAs, bound by their
    // latency (an IVF group of 20 centroids leaves 4 rows after two blocks of 8).
    auto tail = [&](auto rows_at_once) {
        constexpr uint32_t T = decltype(rows_at_once)::value;
        for (; a + T <= n; a += T) {
            for (uint32_t r = 0; r < T; ++r) w[r] = row_at(a + r);
            dots16_rows<V, T>(w, width, a, xt, bias, out);
        }
    };
    tail(std::integral_constant<uint32_t, R / 2>{});
    tail(std::integral_constant<uint32_t, R / 4>{});
    tail(std::integral_constant<uint32_t, 1>{});
}

// out[0..width) += sum_k coef[k] * row_at(k)[0..width) (Accumulate; else out = the sum, from
// 0). The output is held in registers, 8 vectors at a time, while the rows stream past: out is
// read and written once per block of 8 vectors, not once per row.
template <class V, class T, bool Accumulate = true, class RowAt>
inline void weighted_sum(RowAt row_at, uint32_t width, const float* coef, uint32_t n, float* out) {
    constexpr uint32_t L = V::lanes, B = 8;
    uint32_t c = 0;
    for (; c + B * L <= width; c += B * L) {
        typename V::vec acc[B];
        for (uint32_t j = 0; j < B; ++j) acc[j] = Accumulate ? V::load(out + c + j * L) : V::zero();
        for (uint32_t k = 0; k < n; ++k) {
            if (k + prefetch_rows_ahead < n)
                prefetch_span(row_at(k + prefetch_rows_ahead) + c, B * L);
            const T* row = row_at(k) + c;
            const auto ck = V::set1(coef[k]);
            for (uint32_t j = 0; j < B; ++j) acc[j] = V::fmadd(ck, V::load(row + j * L), acc[j]);
        }
        for (uint32_t j = 0; j < B; ++j) V::store(out + c + j * L, acc[j]);
    }
    // The remainder, one vector (the last one partial) at a time.
    for (; c < width; c += L) {
        const uint32_t m = width - c < L ? width - c : L;
        auto acc = !Accumulate ? V::zero() : m == L ? V::load(out + c) : V::load_n(out + c, m);
        for (uint32_t k = 0; k < n; ++k) {
            const T* row = row_at(k) + c;
            acc = V::fmadd(V::set1(coef[k]), m == L ? V::load(row) : V::load_n(row, m), acc);
        }
        if (m == L)
            V::store(out + c, acc);
        else
            V::store_n(out + c, acc, m);
    }
}

template <class V, class T>
void weighted_row_sum_simd(const T* rows, size_t stride, uint32_t width, const uint32_t* ids,
                           const float* coef, uint32_t n, float* out) {
    weighted_sum<V, T>([&](uint32_t k) { return rows + size_t(ids ? ids[k] : k) * stride; }, width,
                       coef, n, out);
}

template <class V>
void weighted_vector_sum_simd(const float* const* vectors, const float* coef, uint32_t n,
                              uint32_t width, float* out) {
    weighted_sum<V, float, false>([&](uint32_t k) { return vectors[k]; }, width, coef, n, out);
}

// weighted_sum for four outputs over the same rows: out[j] (+)= sum_k coef[j][k] * row_at(k).
// Each element sees weighted_sum's operations in its order (from out or 0, one FMA per k in
// order), so each output is the same bits as weighted_sum alone gives it; a row's vectors are
// loaded once for the four, which takes a quarter of the single kernel's row traffic. B
// vectors of each output are held: 4 x 3 accumulators and 3 row vectors fill AVX2's 16
// registers (on Zen 3: 9.2 us for four 512-wide sums of 128 vectors, against 12.5 with
// B = 2 and a prefetch per row, and 18 for four weighted_sum calls; bench/kernels.md).
// The rows of these shapes are in L2 already: no prefetch.
template <class V, bool Accumulate, class RowAt>
inline void weighted_sum4(RowAt row_at, uint32_t width, const float* const* coef, uint32_t n,
                          float* const* out) {
    constexpr uint32_t L = V::lanes, B = L >= 16 ? 4 : 3, G = 4;
    uint32_t c = 0;
    for (; c + B * L <= width; c += B * L) {
        typename V::vec acc[G][B];
        for (uint32_t g = 0; g < G; ++g)
            for (uint32_t j = 0; j < B; ++j)
                acc[g][j] = Accumulate ? V::load(out[g] + c + j * L) : V::zero();
        for (uint32_t k = 0; k < n; ++k) {
            const float* row = row_at(k) + c;
            typename V::vec x[B];
            for (uint32_t j = 0; j < B; ++j) x[j] = V::load(row + j * L);
            for (uint32_t g = 0; g < G; ++g) {
                const auto ck = V::set1(coef[g][k]);
                for (uint32_t j = 0; j < B; ++j) acc[g][j] = V::fmadd(ck, x[j], acc[g][j]);
            }
        }
        for (uint32_t g = 0; g < G; ++g)
            for (uint32_t j = 0; j < B; ++j) V::store(out[g] + c + j * L, acc[g][j]);
    }
    for (; c < width; c += L) {
        const uint32_t m = width - c < L ? width - c : L;
        typename V::vec acc[G];
        for (uint32_t g = 0; g < G; ++g)
            acc[g] = !Accumulate ? V::zero()
                     : m == L    ? V::load(out[g] + c)
                                 : V::load_n(out[g] + c, m);
        for (uint32_t k = 0; k < n; ++k) {
            const float* row = row_at(k) + c;
            const auto x = m == L ? V::load(row) : V::load_n(row, m);
            for (uint32_t g = 0; g < G; ++g) acc[g] = V::fmadd(V::set1(coef[g][k]), x, acc[g]);
        }
        for (uint32_t g = 0; g < G; ++g) {
            if (m == L)
                V::store(out[g] + c, acc[g]);
            else
                V::store_n(out[g] + c, acc[g], m);
        }
    }
}

template <class V>
void weighted_row_sum4_simd(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                            const float* const* coef, uint32_t n, float* const* out) {
    weighted_sum4<V, true>([&](uint32_t k) { return rows + size_t(ids ? ids[k] : k) * stride; },
                           width, coef, n, out);
}

template <class V>
void weighted_vector_sum4_simd(const float* const* vectors, const float* const* coef, uint32_t n,
                               uint32_t width, float* const* out) {
    weighted_sum4<V, false>([&](uint32_t k) { return vectors[k]; }, width, coef, n, out);
}

inline float as_float(float x) {
    return x;
}
inline float as_float(bf16 x) {
    return bf16_to_float(x);
}

// out[0..width) (double) += sum_k coef[k] * row_at(k)[0..width), k in order: each row vector
// widened to two double vectors, whose products with the coefficient are exact, so an FMA
// rounds as the scalar reference's add. Blocks of B row vectors (2B double accumulators) are
// held in registers while the rows stream past; the last width % lanes elements are summed
// one by one, in the same order.
template <class V, class T, class RowAt>
inline void weighted_sum_f64(RowAt row_at, uint32_t width, const float* coef, uint32_t n,
                             double* out) {
    constexpr uint32_t L = V::lanes, H = L / 2;
    uint32_t c = 0;
    auto blocks = [&](auto vectors) {
        constexpr uint32_t B = decltype(vectors)::value;
        for (; c + B * L <= width; c += B * L) {
            typename V::dvec acc[2 * B];
            for (uint32_t j = 0; j < 2 * B; ++j) acc[j] = V::dload(out + c + j * H);
            for (uint32_t k = 0; k < n; ++k) {
                if (k + prefetch_rows_ahead < n)
                    prefetch_span(row_at(k + prefetch_rows_ahead) + c, B * L);
                const T* row = row_at(k) + c;
                const auto ck = V::dset1(double(coef[k]));
                for (uint32_t j = 0; j < B; ++j) {
                    const auto x = V::load(row + j * L);
                    acc[2 * j] = V::dfmadd(ck, V::widen_low(x), acc[2 * j]);
                    acc[2 * j + 1] = V::dfmadd(ck, V::widen_high(x), acc[2 * j + 1]);
                }
            }
            for (uint32_t j = 0; j < 2 * B; ++j) V::dstore(out + c + j * H, acc[j]);
        }
    };
    blocks(std::integral_constant<uint32_t, 4>{});
    blocks(std::integral_constant<uint32_t, 1>{});
    for (; c < width; ++c) {
        double s = out[c];
        for (uint32_t k = 0; k < n; ++k) s += double(coef[k]) * double(as_float(row_at(k)[c]));
        out[c] = s;
    }
}

template <class V, class T>
void weighted_row_sum_f64_simd(const T* rows, size_t stride, uint32_t width, const uint32_t* ids,
                               const float* coef, uint32_t n, double* out) {
    weighted_sum_f64<V, T>([&](uint32_t k) { return rows + size_t(ids ? ids[k] : k) * stride; },
                           width, coef, n, out);
}

template <class V>
void to_bf16_simd(const float* x, bf16* out, uint32_t n) {
    constexpr uint32_t L = V::lanes;
    uint32_t i = 0;
    for (; i + L <= n; i += L) V::store_bf16(out + i, V::load(x + i));
    if (i < n) V::store_bf16_n(out + i, V::load_n(x + i, n - i), n - i);
}

// The table of one level; `dots_bf16` and `dots16_bf16` let a level put native bf16 products in
// place (none: exact scoring in bf16 takes dots_bf16 per input).
template <class V>
constexpr kernel_table make_table(
    const char* name, isa_level level, decltype(kernel_table::active_dots_bf16) dots_bf16,
    decltype(kernel_table::dots16_bf16) dots16_bf16 = nullptr,
    decltype(kernel_table::to_int8_row) to_int8_row = to_int8_row_reference,
    decltype(kernel_table::dots16_u8s8) dots16_u8s8 = nullptr, uint8_t u8s8_input_max = 255) {
    return kernel_table{name,
                        level,
                        dot_simd<V>,
                        gather_dot_simd<V>,
                        axpy_simd<V>,
                        scatter_axpy_simd<V>,
                        adam_simd<V>,
                        adam_bf16_moments_simd<V>,
                        catch_up_simd<V>,
                        softmax_simd<V>,
                        keep_best_by_rank,
                        active_dots_simd<V, float>,
                        dots16_simd<V>,
                        weighted_row_sum_simd<V, float>,
                        weighted_vector_sum_simd<V>,
                        weighted_row_sum4_simd<V>,
                        weighted_vector_sum4_simd<V>,
                        to_bf16_simd<V>,
                        dots_bf16,
                        dots16_bf16,
                        weighted_row_sum_simd<V, bf16>,
                        weighted_row_sum_f64_simd<V, float>,
                        weighted_row_sum_f64_simd<V, bf16>,
                        to_int8_row,
                        dots16_u8s8,
                        u8s8_input_max};
}

}  // namespace
}  // namespace hslide::cpu
