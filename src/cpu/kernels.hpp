// The CPU kernels every training and prediction step is made of, behind one dispatch table
// per instruction-set level (isa.hpp).
//
// kernels_scalar.cpp holds the plain reference versions (compiled without auto-vectorisation);
// kernels_avx2.cpp, kernels_avx512.cpp and kernels_avx512bf16.cpp fill the same table, each
// compiled with its own flags only. Every variant is tested against the scalar table on
// awkward sizes (tests/test_kernels.cpp).
//
// Conventions. A "rows" block holds rows `stride` elements apart, of which the first `width`
// carry data; `ids == nullptr` means rows 0..n-1. Kernels never read past `width` in a row or
// in a vector, so callers need no padding; SIMD variants use masked tails.
#pragma once

#include "hslide/isa.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>

namespace hslide::cpu {

/// A bfloat16 value as its bits: the top half of an IEEE float.
using bf16 = uint16_t;

/// float -> bf16 with round-to-nearest-even; NaN stays NaN (quietened, sign kept), infinities
/// and subnormals are rounded like any other value (no flush to zero).
inline bf16 float_to_bf16(float x) {
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16>(u >> 16);
}
/// bf16 -> float (exact).
inline float bf16_to_float(bf16 h) {
    const uint32_t u = uint32_t{h} << 16;
    float x;
    __builtin_memcpy(&x, &u, 4);
    return x;
}

/// The random bits of stochastic rounding for element i of the stream `seed`: a 32-bit
/// integer hash (lowbias32) of seed ^ i, which every kernel level computes lane by lane, so
/// all draw the same bits. Each half rounds one value (16 bits are added below a bf16's kept
/// bits).
inline uint32_t stochastic_hash(uint32_t seed, uint32_t i) {
    uint32_t x = seed ^ i;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
/// float -> bf16 rounded stochastically with `random16` (0..0xffff): up with probability (the
/// dropped bits) / 2^16, so the expected result is x; NaN as float_to_bf16.
inline bf16 float_to_bf16_stochastic(float x, uint32_t random16) {
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16>((u >> 16) | 0x0040u);
    return static_cast<bf16>((u + random16) >> 16);
}

/// Requests `bytes` from `p` into the cache, a line at a time (for writing when `for_write`):
/// rows read by id are scattered over a layer, which the hardware prefetchers do not follow.
template <bool for_write = false>
inline void prefetch_bytes(const void* p, size_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, for_write ? 1 : 0);
}

/// Adam constants for one step: w -= lr * (m * c1) / (sqrt(v * c2) + eps),
/// with c1 = 1 / (1 - beta1^t) and c2 = 1 / (1 - beta2^t).
struct adam_step {
    float lr, beta1, beta2, eps, c1, c2;
};

/// What a row does to catch up on the steps after the one it was last brought up to date at
/// (catch-up Adam, adam_catch_up.hpp).
struct catch_up_step {
    float displacement = 0;  ///< S: w -= S * m / (sqrt(v) + eps)
    float m_decay = 1;       ///< beta1^d
    float v_decay = 1;       ///< beta2^d
    float eps = 1;           ///< eps' = S / E (adam_catch_up.hpp)
};

/// Function pointers to one instruction-set level's kernels.
struct kernel_table {
    const char* name;  ///< to_string(level)
    isa_level level;

    // --- vector primitives ---
    /// sum_i a[i] * b[i]
    float (*dot)(const float* a, const float* b, uint32_t n);
    /// sum_i row[ids[i]] * values[i]  (a dense row times a sparse vector)
    float (*gather_dot)(const float* row, const uint32_t* ids, const float* values, uint32_t n);
    /// y[i] += alpha * x[i]
    void (*axpy)(float alpha, const float* x, float* y, uint32_t n);
    /// y[ids[i]] += alpha * values[i]  (ids distinct)
    void (*scatter_axpy)(float alpha, const uint32_t* ids, const float* values, float* y,
                         uint32_t n);
    /// Adam on n weights with gradient g (moments m, v updated in place).
    void (*adam)(float* w, float* m, float* v, const float* g, uint32_t n, const adam_step& step);
    /// adam with bf16 moments (--adam-moments bf16): m and v are read as floats, the weight
    /// steps with the new fp32 moments, and they are stored rounded stochastically, element i
    /// of m with the high half of stochastic_hash(seed, i), of v with its low half.
    void (*adam_bf16_moments)(float* w, bf16* m, bf16* v, const float* g, uint32_t n,
                              const adam_step& step, uint32_t seed);
    /// A catch-up on n elements: w[i] -= c.displacement * m[i] / (sqrt(v[i]) + c.eps), then
    /// m[i] *= c.m_decay, v[i] *= c.v_decay, each operation rounded as written (every level
    /// gives the scalar reference's bits, apply_catch_up).
    void (*catch_up)(float* w, float* m, float* v, uint32_t n, const catch_up_step& c);
    /// probs[i] = exp(logits[i] - max) / sum_j exp(logits[j] - max); returns log sum_j
    /// exp(logits[j]) (the log-partition, for the loss). n >= 1; logits finite. probs may be
    /// logits (in place): every variant reads logits[i] before it writes probs[i].
    double (*softmax)(const float* logits, float* probs, uint32_t n);
    /// Of n distinct (score, id) candidates (no two ids alike, no NaN score), keeps the best
    /// `kept` (1 <= kept < n) at candidates[0..kept), in an order each level may choose, and
    /// returns the score of the kept-th best: a higher score ranks above, and of equal scores
    /// the smaller id (top_k.hpp's ranks_above). Elements past kept are left unspecified. The
    /// cut of the exact search's candidate buffers (exact_scoring.cpp).
    float (*keep_best)(std::pair<float, uint32_t>* candidates, uint32_t n, uint32_t kept);

    // --- layer kernels (fp32 weights) ---
    /// Active-neuron dot products: out[a] = bias[r] + <row r, x> for a < n, r = ids[a]
    /// (bias == nullptr: no bias). Prefetches the rows a few ahead.
    void (*active_dots)(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                        uint32_t n, const float* x, const float* bias, float* out);
    /// Rows r_0..r_{n-1} (r_a = ids[a], or a when ids == nullptr) times 16 inputs stored
    /// transposed (xt[i * 16 + j] is input j's element i): out[a * 16 + j] = bias[a] +
    /// <row r_a, input j> (bias == nullptr: no bias; indexed by position, not row), each sum
    /// in order i = 0..width-1. Exact scoring's product: a row element is broadcast against 16
    /// inputs at once, so no horizontal sums and no reloads of the row per input; with ids, the
    /// rows are read where they are (an IVF cluster's members: no gathering copy), prefetched
    /// a few ahead.
    void (*dots16)(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                   uint32_t n, const float* xt, const float* bias, float* out);
    /// Weighted row sum: out[0..width) += sum_i coef[i] * row ids[i]. The sparse-input layer's
    /// forward (rows = feature rows, coef = feature values) and the backward of a layer
    /// (rows = active neurons' weights, coef = their deltas).
    void (*weighted_row_sum)(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                             const float* coef, uint32_t n, float* out);
    /// Weighted vector sum: out[0..width) = sum_i coef[i] * vectors[i][0..width), summed from 0
    /// in order i = 0..n-1 (the same roundings as n axpy calls on a zeroed out; n = 0 writes
    /// zeros). A row's gradient in the update: its samples' input vectors (or layer-0 deltas)
    /// times their coefficients, written over what `out` held (no zeroing pass first).
    void (*weighted_vector_sum)(const float* const* vectors, const float* coef, uint32_t n,
                                uint32_t width, float* out);
    /// Four weighted row sums over the same rows: out[j][0..width) += sum_i coef[j][i] *
    /// row ids[i] for j = 0..3, each the same bits as weighted_row_sum gives it alone. The
    /// input layer's forward of four samples with the same features (dense inputs): each row
    /// is read once for the four.
    void (*weighted_row_sum4)(const float* rows, size_t stride, uint32_t width, const uint32_t* ids,
                              const float* const* coef, uint32_t n, float* const* out);
    /// Four weighted vector sums over the same vectors: out[j][0..width) = sum_i coef[j][i] *
    /// vectors[i][0..width) for j = 0..3, each the same bits as weighted_vector_sum gives it
    /// alone. The gradients of four rows whose samples are the same (a dense input's feature
    /// rows, a dense layer's rows): each vector is read once for the four.
    void (*weighted_vector_sum4)(const float* const* vectors, const float* const* coef, uint32_t n,
                                 uint32_t width, float* const* out);

    // --- BF16 (weights and activations stored as bf16, arithmetic in fp32) ---
    /// out[i] = float_to_bf16(x[i]) (round-to-nearest-even, the scalar definition exactly).
    void (*to_bf16)(const float* x, bf16* out, uint32_t n);
    /// active_dots over bf16 rows and a bf16 x; products accumulate in fp32 (vdpbf16ps on the
    /// avx512bf16 level).
    void (*active_dots_bf16)(const bf16* rows, size_t stride, uint32_t width, const uint32_t* ids,
                             uint32_t n, const bf16* x, const float* bias, float* out);
    /// dots16 over bf16 rows and 16 bf16 inputs stored in pairs: element i of input j at
    /// xp[(i / 2) * 32 + j * 2 + i % 2], the odd width's last pair padded with zeros:
    /// out[a * 16 + j] = bias[a] + <row a, input j> (bias == nullptr: no bias), accumulated in
    /// fp32 (vdpbf16ps sums each pair of products before adding it). Exact scoring's product in
    /// bf16. nullptr on levels without native bf16 products: callers take active_dots_bf16 per
    /// input there.
    void (*dots16_bf16)(const bf16* rows, size_t stride, uint32_t width, uint32_t n, const bf16* xp,
                        const float* bias, float* out);
    /// weighted_row_sum over bf16 rows, accumulating into fp32 `out`.
    void (*weighted_row_sum_bf16)(const bf16* rows, size_t stride, uint32_t width,
                                  const uint32_t* ids, const float* coef, uint32_t n, float* out);

    // --- double accumulation (the split-independent sums of a label-sharded output layer) ---
    /// weighted_row_sum into double `out`: out[i] += double(coef[k]) * row_k[i] for k = 0..n-1
    /// in order. Each product is exact in double (24 x 24 bits), so an FMA rounds as the
    /// separate add does and every level returns the scalar reference's bits. A rank's share of
    /// the sharded output layer's hidden gradient (cpu_backend_shard.cpp): the shares are added
    /// in double and rounded to float once, so the result does not depend on how the rows were
    /// split across ranks.
    void (*weighted_row_sum_f64)(const float* rows, size_t stride, uint32_t width,
                                 const uint32_t* ids, const float* coef, uint32_t n, double* out);
    /// weighted_row_sum_f64 over bf16 rows.
    void (*weighted_row_sum_bf16_f64)(const bf16* rows, size_t stride, uint32_t width,
                                      const uint32_t* ids, const float* coef, uint32_t n,
                                      double* out);
    // --- int8 (an exact search's copy of the rows, quantized a row at a time) ---
    /// Quantizes a row of n values symmetrically: with m = max_i |x[i]| (x finite), out[i] =
    /// x[i] * (127 / m) rounded to nearest even (in [-127, 127]; all 0 where m is 0); writes
    /// the sum of out[0..n) to *sum and returns the scale m / 127 (x[i] ~ out[i] * scale).
    float (*to_int8_row)(const float* x, int8_t* out, uint32_t n, int32_t* sum);
    /// dots16 over int8 rows and 16 inputs quantized to u8 (input j ~ query_scale[j] *
    /// (u - query_zero[j])) stored in fours: element i of input j at xq[(i / 4) * 64 + j * 4 +
    /// i % 4], the last four padded with zeros. With acc the exact integer sum_i xq * row_a[i]
    /// (vpdpbusd; width <= 65536 keeps it in int32): out[a * 16 + j] = float(acc - query_zero[j]
    /// * row_sum[a]) * (row_scale[a] * query_scale[j]) + bias[a] (bias == nullptr: no bias;
    /// SIMD levels may round the product and the bias' sum once, the same for every row).
    /// Exact scoring's product over a to_int8_row copy: each score within the quantizations'
    /// rounding of the fp32 product. nullptr where the level has no 8-bit dot products (avx512
    /// without VNNI, amx); avx2 sums vpmaddubsw's 16-bit pairs instead, exact for inputs up
    /// to u8s8_input_max. Inputs (and zero points) past u8s8_input_max: undefined.
    void (*dots16_u8s8)(const int8_t* rows, size_t stride, uint32_t width, uint32_t n,
                        const uint8_t* xq, const float* row_scale, const int32_t* row_sum,
                        const float* query_scale, const int32_t* query_zero, const float* bias,
                        float* out);
    /// The largest input byte dots16_u8s8 takes (queries are quantized to [0, this]): 255 in
    /// the reference and vpdpbusd; 15 on avx2, where eight fours' 16-bit pair sums must not
    /// overflow (a 4-bit query loses no P@1 there: bench/kernels.md).
    uint8_t u8s8_input_max;
};

/// The scalar reference kernels.
const kernel_table& scalar_kernels();

/// The scalar reference's to_int8_row, which the levels without their own share.
float to_int8_row_reference(const float* x, int8_t* out, uint32_t n, int32_t* sum);

/// The kernels of `level`; throws hslide::error when this build or CPU cannot run it.
const kernel_table& kernels_for(isa_level level);

/// The kernels of active_isa().
inline const kernel_table& best_kernels() {
    return kernels_for(active_isa());
}

}  // namespace hslide::cpu
