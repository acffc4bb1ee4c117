// Tests of the CPU kernel tables (src/cpu/kernels.hpp): every SIMD level against the scalar
// reference on awkward sizes, the bf16 conversion on hand-derived edge cases, the int8
// quantization and product of exact scoring (bit for bit, and end to end against fp32), and
// the process-wide ISA selection (isa.hpp).
//
// Every buffer handed to a kernel sits between guard elements. Guards of read-only inputs (and
// the padding of each row past `width`) hold NaN: a kernel that read them would turn its
// result into NaN and fail the comparison. Guards of outputs hold a finite canary that must
// come back bit-for-bit unchanged: a kernel that wrote past n (or before 0) is caught.
#include "cpu/kernels.hpp"
#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/rng.hpp"
#include "hslide/system_info.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace hslide {
// Readable isa_level values in gtest's messages.
void PrintTo(isa_level level, std::ostream* os) {
    *os << to_string(level);
}
}  // namespace hslide

using namespace hslide;
using namespace hslide::cpu;

namespace {

// --- tolerances ------------------------------------------------------------------------------
//
// The SIMD levels may legitimately differ from the scalar reference in two ways: they fuse
// multiply-adds (one rounding instead of two), and they sum reductions in a different order
// (several vector accumulators, then a horizontal sum). Both errors are bounded by a few units
// in the last place of the *magnitudes that went into* a result, not of the result itself
// (which may cancel to near zero), so every tolerance below is relative to `mag`, the sum of
// the absolute values of the terms feeding that element, computed in double.

/// Element-wise ops (axpy, scatter_axpy, adam, weighted_row_sum[_bf16]): FMA vs separate
/// multiply and add, ~1 ulp (6e-8) of mag per step. |got - want| <= tol * mag + floor.
/// weighted_row_sum chains up to 100 such steps per element, whose roundings add up like a
/// random walk; 1e-6 (~17 ulp of mag) leaves ample room and still catches any wrong term.
constexpr double elementwise_tol = 1e-6;
constexpr double elementwise_floor = 1e-9;

/// Reductions (dot, gather_dot, active_dots[_bf16]): summation order, bounded by about
/// n * 6e-8 * mag in the worst case and sqrt(n) * 6e-8 * mag typically (n <= 300 here).
/// |got - want| <= tol * mag + floor, mag = sum_i |a_i * b_i| (+ |bias|).
/// The bf16 dot products use the same bound: a bf16 x bf16 product is exact in fp32, so
/// vdpbf16ps (which adds products in pairs before accumulating) differs from the reference by
/// summation order only. Its flush of subnormal inputs to zero does not arise here: the
/// inputs are bf16 roundings of N(0, 1) values.
constexpr double reduction_tol = 1e-5;
constexpr double reduction_floor = 1e-6;

/// softmax probabilities: the SIMD exp is a degree-6 polynomial (relative error < 2e-7) and
/// the SIMD sum runs in float rather than double. |got - want| <= abs + rel * |want|.
constexpr double softmax_prob_abs_tol = 2e-6;
constexpr double softmax_prob_rel_tol = 1e-5;
/// The returned log-partition: |got - want| <= tol * max(1, |want|).
constexpr double softmax_logz_tol = 1e-5;

// --- test data -------------------------------------------------------------------------------

/// The sizes every kernel is tried on: around every multiple of the 8- and 16-lane vectors
/// and of the unrolled loops (4 x 16 floats, 128 bf16).
constexpr uint32_t test_sizes[] = {1,  2,  7,  8,   9,   15,  16,  17,  31,  32, 33,
                                   63, 64, 65, 127, 128, 129, 255, 256, 257, 300};
/// Row counts for the row-block kernels.
constexpr uint32_t row_counts[] = {0, 1, 3, 17, 100};

const float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr bf16 nan_bf16 = 0x7fc1;
constexpr float canary_f = -7777.25f;
constexpr bf16 canary_bf16 = 0x5a5a;
constexpr uint32_t guard_id = 0x7fffffffu;  // an index no kernel could dereference unharmed

uint32_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
float float_of(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

/// n elements with `head` guard elements before and `tail` after; head = 3 also makes the
/// data misaligned for every vector width.
template <class T>
class guarded {
  public:
    static constexpr size_t head = 3, tail = 37;

    guarded(size_t n, T guard) : buf_(head + n + tail, guard), n_(n), guard_(guard) {}

    T* data() { return buf_.data() + head; }
    const T* data() const { return buf_.data() + head; }
    size_t size() const { return n_; }
    T& operator[](size_t i) { return buf_[head + i]; }
    const T& operator[](size_t i) const { return buf_[head + i]; }

    /// Whether every guard element still holds the guard's exact bits.
    ::testing::AssertionResult guards_intact() const {
        for (size_t i = 0; i < buf_.size(); ++i) {
            if (i >= head && i < head + n_) continue;
            if (std::memcmp(&buf_[i], &guard_, sizeof(T)) != 0)
                return ::testing::AssertionFailure()
                       << "guard element " << (i < head ? "before" : "after") << " the data, at "
                       << (static_cast<long>(i) - static_cast<long>(head)) << " (n = " << n_
                       << "), was overwritten";
        }
        return ::testing::AssertionSuccess();
    }

  private:
    std::vector<T> buf_;
    size_t n_;
    T guard_;
};

/// A copy of `src` (data and guards alike).
template <class T>
guarded<T> copy_of(const guarded<T>& src) {
    return src;
}

float normal(rng& gen, float scale = 1.0f) {
    return scale * static_cast<float>(gen.normal());
}

guarded<float> random_vector(size_t n, rng& gen, float guard, float scale = 1.0f) {
    guarded<float> v(n, guard);
    for (size_t i = 0; i < n; ++i) v[i] = normal(gen, scale);
    return v;
}

/// `count` distinct ids from [0, universe), in random (unsorted) order.
guarded<uint32_t> distinct_ids(uint32_t count, uint32_t universe, rng& gen) {
    std::vector<uint32_t> all(universe);
    std::iota(all.begin(), all.end(), 0u);
    shuffle(all.begin(), all.end(), gen);
    guarded<uint32_t> ids(count, guard_id);
    for (uint32_t i = 0; i < count; ++i) ids[i] = all[i];
    return ids;
}

/// A rows block: `rows` rows of `width` values, `stride` = width rounded up to 16 plus 16
/// apart; the padding past `width` in every row holds NaN (a kernel must not read it).
template <class T>
struct rows_block {
    uint32_t rows, width;
    size_t stride;
    guarded<T> data;

    const T* row(size_t r) const { return data.data() + r * stride; }
};

size_t padded_stride(uint32_t width) {
    return (width + 15u) / 16u * 16u + 16u;
}

rows_block<float> random_rows(uint32_t rows, uint32_t width, rng& gen) {
    const size_t stride = padded_stride(width);
    rows_block<float> b{rows, width, stride, guarded<float>(rows * stride, nan_f)};
    for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t i = 0; i < width; ++i) b.data[r * stride + i] = normal(gen);
    return b;
}

rows_block<bf16> random_rows_bf16(uint32_t rows, uint32_t width, rng& gen) {
    const size_t stride = padded_stride(width);
    rows_block<bf16> b{rows, width, stride, guarded<bf16>(rows * stride, nan_bf16)};
    for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t i = 0; i < width; ++i) b.data[r * stride + i] = float_to_bf16(normal(gen));
        for (size_t i = width; i < stride; ++i) b.data[r * stride + i] = nan_bf16;
    }
    return b;
}

guarded<bf16> random_vector_bf16(size_t n, rng& gen) {
    guarded<bf16> v(n, nan_bf16);
    for (size_t i = 0; i < n; ++i) v[i] = float_to_bf16(normal(gen));
    return v;
}

float to_float(float x) {
    return x;
}
float to_float(bf16 h) {
    return bf16_to_float(h);
}

/// A random 32-bit pattern, biased towards the cases float -> bf16 can get wrong: NaNs
/// (quiet and signalling), infinities, subnormals, zeros, and low halves at or next to the
/// rounding tie (0x7fff, 0x8000, 0x8001), with either parity of the kept half.
uint32_t random_float_bits(rng& gen) {
    uint32_t u = static_cast<uint32_t>(gen());
    switch (gen.below(8)) {
        case 0:  // exponent all ones: infinity or NaN
            u |= 0x7f800000u;
            if (gen.below(4) == 0) u &= 0xff800000u;  // infinity
            break;
        case 1:  // exponent zero: subnormal or zero
            u &= 0x807fffffu;
            if (gen.below(8) == 0) u &= 0x80000000u;
            break;
        case 2: {  // a tie or a neighbour of one
            constexpr uint32_t lows[] = {0x7fffu, 0x8000u, 0x8001u};
            u = (u & 0xffff0000u) | lows[gen.below(3)];
            break;
        }
        case 3:  // largest magnitudes (round to infinity or not)
            u |= 0x7f7f0000u;
            u &= 0xff7fffffu;
            break;
        default:  // uniform bits
            break;
    }
    return u;
}

/// The float edge cases of the bf16 conversion, with their hand-derived bf16 bits.
struct bf16_case {
    uint32_t in;
    bf16 out;
    const char* what;
};
constexpr bf16_case bf16_cases[] = {
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0"},
    {0x3f800000u, 0x3f80, "1.0"},
    {0xc0000000u, 0xc000, "-2.0"},
    {0x7f800000u, 0x7f80, "+inf"},
    {0xff800000u, 0xff80, "-inf"},
    {0x7fc00000u, 0x7fc0, "quiet NaN"},
    {0x7fc00001u, 0x7fc0, "quiet NaN, payload in the dropped half"},
    {0xffc00000u, 0xffc0, "negative quiet NaN"},
    {0x7f800001u, 0x7fc0, "signalling NaN: quietened, not rounded to inf"},
    {0xff800001u, 0xffc0, "negative signalling NaN keeps its sign"},
    {0x7fa00000u, 0x7fe0, "signalling NaN with a payload in the kept half"},
    {0x7fffffffu, 0x7fff, "NaN, all ones: must not carry into the sign"},
    {0xffffffffu, 0xffff, "negative NaN, all ones"},
    {0x7f7fffffu, 0x7f80, "largest float rounds up to +inf"},
    {0xff7fffffu, 0xff80, "most negative float rounds down to -inf"},
    {0x7f7f7fffu, 0x7f7f, "large, just below the tie"},
    {0x3f808000u, 0x3f80, "tie, even half stays"},
    {0x3f818000u, 0x3f82, "tie, odd half rounds up"},
    {0x3f808001u, 0x3f81, "just above a tie"},
    {0x3f807fffu, 0x3f80, "just below a tie"},
    {0xbf818000u, 0xbf82, "negative tie, odd half rounds away from zero"},
    {0x00000001u, 0x0000, "smallest subnormal"},
    {0x00008000u, 0x0000, "subnormal tie to even (zero)"},
    {0x00018000u, 0x0002, "subnormal tie, odd rounds up"},
    {0x00010000u, 0x0001, "exact subnormal kept, not flushed"},
    {0x80010000u, 0x8001, "exact negative subnormal kept"},
    {0x007fffffu, 0x0080, "largest subnormal rounds to the smallest normal"},
    {0x807fffffu, 0x8080, "largest negative subnormal rounds to the smallest normal"},
    {0x00800000u, 0x0080, "smallest normal"},
};

// --- comparisons -----------------------------------------------------------------------------

/// Compares got[i] with want[i] for i < n against tol(i); reports the first mismatches.
template <class Tol>
::testing::AssertionResult all_close(const float* got, const float* want, size_t n, Tol tol) {
    size_t bad = 0;
    std::ostringstream msg;
    for (size_t i = 0; i < n; ++i) {
        const double t = tol(i);
        const double err = std::fabs(double(got[i]) - double(want[i]));
        if (!(err <= t)) {  // also catches NaN
            if (bad < 5)
                msg << "\n  [" << i << "] got " << got[i] << ", want " << want[i] << " (error "
                    << err << " > tolerance " << t << ")";
            ++bad;
        }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " of " << n << " elements differ:" << msg.str();
}

/// Success where got[i] == want[i] for every i < n; else the count and the first five
/// differences, each described by describe(stream, i).
template <class T, class Describe>
::testing::AssertionResult elements_equal(const T* got, const T* want, size_t n,
                                          Describe describe) {
    size_t bad = 0;
    std::ostringstream msg;
    for (size_t i = 0; i < n; ++i) {
        if (got[i] != want[i]) {
            if (bad < 5) describe(msg, i);
            ++bad;
        }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " of " << n << " elements differ:" << msg.str();
}

::testing::AssertionResult bits_equal(const bf16* got, const bf16* want, const float* in,
                                      size_t n) {
    return elements_equal(got, want, n, [&](std::ostream& msg, size_t i) {
        msg << "\n  [" << i << "] input 0x" << std::hex << bits_of(in[i]) << ": got 0x" << got[i]
            << ", want 0x" << want[i] << std::dec;
    });
}

double reduction_bound(double mag) {
    return reduction_tol * mag + reduction_floor;
}
double elementwise_bound(double mag) {
    return elementwise_tol * mag + elementwise_floor;
}

// --- the per-level comparison against the scalar reference -----------------------------------

class kernel_level : public ::testing::TestWithParam<isa_level> {
  protected:
    void SetUp() override {
        if (!isa_supported(GetParam()))
            GTEST_SKIP() << "this CPU does not support " << to_string(GetParam())
                         << " (best: " << to_string(detected_isa()) << ")";
        k_ = &kernels_for(GetParam());
    }

    const kernel_table& k() const { return *k_; }
    const kernel_table& ref() const { return scalar_kernels(); }
    /// A generator seeded per test and level, so every test draws fresh but fixed inputs.
    rng gen(uint64_t stream) const {
        return rng(derive_seed(0x6b65726e656c73ull + static_cast<uint64_t>(GetParam()), stream));
    }

  private:
    const kernel_table* k_ = nullptr;
};

std::string level_name(const ::testing::TestParamInfo<isa_level>& info) {
    return to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(levels, kernel_level,
                         ::testing::Values(isa_level::avx2, isa_level::avx512,
                                           isa_level::avx512bf16, isa_level::amx),
                         level_name);

TEST_P(kernel_level, table_identity) {
    EXPECT_EQ(k().level, GetParam());
    EXPECT_STREQ(k().name, to_string(GetParam()));
}

TEST_P(kernel_level, dot) {
    rng g = gen(1);
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        const auto a = random_vector(n, g, nan_f), b = random_vector(n, g, nan_f);
        double mag = 0;
        for (uint32_t i = 0; i < n; ++i) mag += std::fabs(double(a[i]) * b[i]);
        const float got = k().dot(a.data(), b.data(), n);
        const float want = ref().dot(a.data(), b.data(), n);
        EXPECT_TRUE(all_close(&got, &want, 1, [&](size_t) { return reduction_bound(mag); }));
    }
}

TEST_P(kernel_level, gather_dot) {
    rng g = gen(2);
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        const uint32_t row_size = 2 * n + 7;
        const auto row = random_vector(row_size, g, nan_f);
        const auto ids = distinct_ids(n, row_size, g);
        const auto values = random_vector(n, g, nan_f);
        double mag = 0;
        for (uint32_t i = 0; i < n; ++i) mag += std::fabs(double(row[ids[i]]) * values[i]);
        const float got = k().gather_dot(row.data(), ids.data(), values.data(), n);
        const float want = ref().gather_dot(row.data(), ids.data(), values.data(), n);
        EXPECT_TRUE(all_close(&got, &want, 1, [&](size_t) { return reduction_bound(mag); }));
    }
}

TEST_P(kernel_level, axpy) {
    rng g = gen(3);
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        const float alpha = normal(g);
        const auto x = random_vector(n, g, nan_f);
        const auto y0 = random_vector(n, g, canary_f);
        auto got = copy_of(y0), want = copy_of(y0);
        k().axpy(alpha, x.data(), got.data(), n);
        ref().axpy(alpha, x.data(), want.data(), n);
        EXPECT_TRUE(all_close(got.data(), want.data(), n, [&](size_t i) {
            return elementwise_bound(std::fabs(y0[i]) + std::fabs(double(alpha) * x[i]));
        }));
        EXPECT_TRUE(got.guards_intact());
    }
}

TEST_P(kernel_level, scatter_axpy) {
    rng g = gen(4);
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        const uint32_t y_size = 3 * n + 5;
        const float alpha = normal(g);
        const auto ids = distinct_ids(n, y_size, g);
        const auto values = random_vector(n, g, nan_f);
        const auto y0 = random_vector(y_size, g, canary_f);
        auto got = copy_of(y0), want = copy_of(y0);
        k().scatter_axpy(alpha, ids.data(), values.data(), got.data(), n);
        ref().scatter_axpy(alpha, ids.data(), values.data(), want.data(), n);
        std::vector<double> mag(y_size);
        for (uint32_t j = 0; j < y_size; ++j) mag[j] = std::fabs(y0[j]);
        for (uint32_t i = 0; i < n; ++i) mag[ids[i]] += std::fabs(double(alpha) * values[i]);
        EXPECT_TRUE(all_close(got.data(), want.data(), y_size,
                              [&](size_t j) { return elementwise_bound(mag[j]); }));
        // Elements no id names stay exactly as they were.
        std::vector<bool> named(y_size);
        for (uint32_t i = 0; i < n; ++i) named[ids[i]] = true;
        for (uint32_t j = 0; j < y_size; ++j) {
            if (!named[j]) {
                ASSERT_EQ(bits_of(got[j]), bits_of(y0[j])) << "untouched y[" << j << "]";
            }
        }
        EXPECT_TRUE(got.guards_intact());
    }
}

/// Adam's constants at step t, with the bias corrections of step t.
adam_step adam_step_at(int t, float lr, float beta1, float beta2, float eps) {
    return {lr,
            beta1,
            beta2,
            eps,
            float(1.0 / (1.0 - std::pow(double(beta1), t))),
            float(1.0 / (1.0 - std::pow(double(beta2), t)))};
}

TEST_P(kernel_level, adam) {
    rng g = gen(5);
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        auto w = random_vector(n, g, canary_f);
        auto m = random_vector(n, g, canary_f, 0.1f);
        guarded<float> v(n, canary_f);
        // v >= 0 and of the size m^2 that real Adam keeps it at (|m| <~ sqrt(v)).
        for (uint32_t i = 0; i < n; ++i) v[i] = m[i] * m[i] + 0.01f * std::pow(normal(g), 2.0f);
        // Several steps from the same state on both sides: each step is compared on
        // identical inputs (the reference's state carries on), with fresh gradients.
        for (int t = 3; t <= 6; ++t) {
            SCOPED_TRACE("t = " + std::to_string(t));
            const adam_step step = adam_step_at(t, lr, beta1, beta2, eps);
            const auto grad = random_vector(n, g, nan_f);
            auto w_got = copy_of(w), m_got = copy_of(m), v_got = copy_of(v);
            auto w_want = copy_of(w), m_want = copy_of(m), v_want = copy_of(v);
            k().adam(w_got.data(), m_got.data(), v_got.data(), grad.data(), n, step);
            ref().adam(w_want.data(), m_want.data(), v_want.data(), grad.data(), n, step);
            EXPECT_TRUE(all_close(m_got.data(), m_want.data(), n, [&](size_t i) {
                return elementwise_bound(beta1 * std::fabs(m[i]) +
                                         (1 - beta1) * std::fabs(grad[i]));
            })) << "m";
            EXPECT_TRUE(all_close(v_got.data(), v_want.data(), n, [&](size_t i) {
                return elementwise_bound(beta2 * v[i] + (1 - beta2) * grad[i] * grad[i]);
            })) << "v";
            // The step is a product and quotient of values that agree to a few ulp (and v is
            // kept >= ~m^2, so m's rounding cannot be blown up by a tiny sqrt(v)): relative to
            // |w| + |step|.
            EXPECT_TRUE(all_close(w_got.data(), w_want.data(), n, [&](size_t i) {
                return elementwise_bound(std::fabs(w[i]) + std::fabs(double(w[i]) - w_want[i]));
            })) << "w";
            EXPECT_TRUE(w_got.guards_intact());
            EXPECT_TRUE(m_got.guards_intact());
            EXPECT_TRUE(v_got.guards_intact());
            w = w_want;
            m = m_want;
            v = v_want;
        }
    }
}

TEST_P(kernel_level, catch_up) {
    // A row catching up on skipped steps (adam_catch_up.hpp): each operation is rounded as the
    // reference writes it (a quotient of a product and a sum; two products), with no fused
    // multiply-add to round differently, so every level gives the reference's bits.
    rng g = gen(17);
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        const auto w = random_vector(n, g, canary_f);
        const auto m = random_vector(n, g, canary_f, 0.1f);
        guarded<float> v(n, canary_f);
        for (uint32_t i = 0; i < n; ++i) v[i] = m[i] * m[i] + 0.01f * std::pow(normal(g), 2.0f);
        catch_up_step c;
        c.displacement = 1e-3f * (1.0f + g.uniform());
        c.m_decay = 0.9f - 0.5f * g.uniform();
        c.v_decay = 0.999f - 0.1f * g.uniform();
        c.eps = 1e-8f * (1.0f + g.uniform());
        auto w_got = copy_of(w), m_got = copy_of(m), v_got = copy_of(v);
        auto w_want = copy_of(w), m_want = copy_of(m), v_want = copy_of(v);
        k().catch_up(w_got.data(), m_got.data(), v_got.data(), n, c);
        ref().catch_up(w_want.data(), m_want.data(), v_want.data(), n, c);
        for (uint32_t i = 0; i < n; ++i) {
            ASSERT_EQ(w_got[i], w_want[i]) << "w[" << i << "]";
            ASSERT_EQ(m_got[i], m_want[i]) << "m[" << i << "]";
            ASSERT_EQ(v_got[i], v_want[i]) << "v[" << i << "]";
        }
        // And it moved: the weights by the momentum's displacement, the moments by their decay.
        for (uint32_t i = 0; i < n; ++i) {
            const double step = double(c.displacement) * m[i] / (std::sqrt(double(v[i])) + c.eps);
            EXPECT_NEAR(w_want[i], w[i] - step, 1e-6 * (std::fabs(w[i]) + std::fabs(step)));
            EXPECT_NEAR(m_want[i], m[i] * c.m_decay, 1e-6 * std::fabs(m[i]));
        }
        EXPECT_TRUE(w_got.guards_intact());
        EXPECT_TRUE(m_got.guards_intact());
        EXPECT_TRUE(v_got.guards_intact());
    }
}

/// keep_best against a full sort by rank, on n candidates for each kept: scores drawn from a few
/// values (ties, broken by id), with -0 and +0 (equal), infinities, and shuffled distinct ids;
/// n past keep_best_rank_limit takes the nth_element path.
void check_keep_best(const kernel_table& k, rng& g) {
    using candidate = std::pair<float, uint32_t>;
    auto ranks_above = [](const candidate& a, const candidate& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    auto same_float = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    const float specials[] = {-0.0f, 0.0f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (uint32_t kept : {1u, 2u, 7u, 8u, 15u, 16u, 17u, 33u, 63u, 64u, 65u, 100u}) {
        for (uint32_t n : {kept + 1, 2 * kept, 2 * kept + 3}) {
            SCOPED_TRACE("kept " + std::to_string(kept) + " of " + std::to_string(n));
            std::vector<uint32_t> ids(n);
            std::iota(ids.begin(), ids.end(), 1000u);
            for (uint32_t i = n - 1; i > 0; --i) std::swap(ids[i], ids[g.below(i + 1)]);
            std::vector<candidate> c(n);
            for (uint32_t i = 0; i < n; ++i) {
                const uint64_t pick = g.below(10);
                c[i] = {pick < 2 ? specials[g.below(4)] : std::round(normal(g) * 4.0f) / 4.0f,
                        ids[i]};
            }
            std::vector<candidate> want = c, got = c;
            std::sort(want.begin(), want.end(), ranks_above);
            const float floor = k.keep_best(got.data(), n, kept);
            got.resize(kept);
            std::sort(got.begin(), got.end(), ranks_above);
            want.resize(kept);
            for (uint32_t i = 0; i < kept; ++i) {
                ASSERT_EQ(got[i].second, want[i].second) << "rank " << i;
                ASSERT_TRUE(same_float(got[i].first, want[i].first)) << "rank " << i;
            }
            EXPECT_TRUE(same_float(floor, want[kept - 1].first))
                << floor << " against " << want[kept - 1].first;
        }
    }
}

TEST(keep_best_reference, KeepsWhatASortByRankPutsFirst) {
    rng g(derive_seed(0x6b656570ull, 1));
    check_keep_best(scalar_kernels(), g);
}

TEST_P(kernel_level, keep_best) {
    rng g = gen(23);
    check_keep_best(k(), g);
}

TEST_P(kernel_level, adam_bf16_moments) {
    // bf16 moments, stochastically rounded: every level against the scalar definition on the
    // same states. The new fp32 moments may differ in their last bit (a fused multiply-add),
    // which can move a stochastic rounding by one bf16 unit; the weights agree as adam's do.
    rng g = gen(16);
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    for (uint32_t n : test_sizes) {
        SCOPED_TRACE("n = " + std::to_string(n));
        auto w = random_vector(n, g, canary_f);
        guarded<bf16> m(n, nan_bf16), v(n, nan_bf16);
        for (uint32_t i = 0; i < n; ++i) {
            const float mi = normal(g, 0.1f);
            m[i] = float_to_bf16(mi);
            v[i] = float_to_bf16(mi * mi + 0.01f * std::pow(normal(g), 2.0f));
        }
        for (int t = 3; t <= 6; ++t) {
            SCOPED_TRACE("t = " + std::to_string(t));
            const adam_step step = adam_step_at(t, lr, beta1, beta2, eps);
            const auto grad = random_vector(n, g, nan_f);
            const uint32_t seed = uint32_t(g());
            auto w_got = copy_of(w), w_want = copy_of(w);
            auto m_got = copy_of(m), m_want = copy_of(m), v_got = copy_of(v), v_want = copy_of(v);
            k().adam_bf16_moments(w_got.data(), m_got.data(), v_got.data(), grad.data(), n, step,
                                  seed);
            ref().adam_bf16_moments(w_want.data(), m_want.data(), v_want.data(), grad.data(), n,
                                    step, seed);
            for (uint32_t i = 0; i < n; ++i) {
                ASSERT_LE(std::abs(int(m_got[i]) - int(m_want[i])), 1) << "m " << i;
                ASSERT_LE(std::abs(int(v_got[i]) - int(v_want[i])), 1) << "v " << i;
            }
            EXPECT_TRUE(all_close(w_got.data(), w_want.data(), n, [&](size_t i) {
                return elementwise_bound(std::fabs(w[i]) + std::fabs(double(w[i]) - w_want[i]));
            })) << "w";
            // The same steps as fp32 Adam's from the widened moments.
            auto w_fp32 = copy_of(w);
            guarded<float> m32(n, canary_f), v32(n, canary_f);
            for (uint32_t i = 0; i < n; ++i) {
                m32[i] = bf16_to_float(m[i]);
                v32[i] = bf16_to_float(v[i]);
            }
            ref().adam(w_fp32.data(), m32.data(), v32.data(), grad.data(), n, step);
            for (uint32_t i = 0; i < n; ++i) {
                EXPECT_EQ(w_fp32[i], w_want[i]) << "w " << i;
                // Rounded to one of the two bf16 values around the fp32 moment.
                EXPECT_LE(std::fabs(bf16_to_float(m_want[i]) - m32[i]),
                          std::ldexp(std::fabs(m32[i]), -7))
                    << "m " << i;
                EXPECT_LE(std::fabs(bf16_to_float(v_want[i]) - v32[i]), std::ldexp(v32[i], -7))
                    << "v " << i;
            }
            EXPECT_TRUE(w_got.guards_intact());
            EXPECT_TRUE(m_got.guards_intact());
            EXPECT_TRUE(v_got.guards_intact());
            w = w_want;
            m = m_want;
            v = v_want;
        }
    }
}

TEST_P(kernel_level, adam_bf16_moments_keep_a_slowly_growing_v) {
    // beta2 = 0.999 moves v by 0.1% a step, under half a bf16 unit (0.2%): rounded to nearest,
    // v from 0 under a constant gradient would stop far below g^2; rounded stochastically it
    // follows (1 - beta2^t) g^2 in expectation. 3,000 steps over 64 elements.
    const uint32_t n = 64;
    std::vector<float> w(n, 0.0f), grad(n, 0.5f);
    std::vector<bf16> m(n, 0), v(n, 0);
    const float beta1 = 0.9f, beta2 = 0.999f;
    const int steps = 3000;
    for (int t = 1; t <= steps; ++t) {
        const adam_step step{1e-3f, beta1, beta2, 1e-8f, 1.0f, 1.0f};
        k().adam_bf16_moments(w.data(), m.data(), v.data(), grad.data(), n, step,
                              uint32_t(derive_seed(17, uint64_t(t))));
    }
    double mean_v = 0;
    for (bf16 x : v) mean_v += bf16_to_float(x) / n;
    const double want = (1.0 - std::pow(double(beta2), steps)) * 0.25;
    EXPECT_NEAR(mean_v, want, 0.02 * want);
    // m converges to g within bf16 rounding.
    for (bf16 x : m) EXPECT_NEAR(bf16_to_float(x), 0.5f, 0.01f);
}

TEST(StochasticRounding, IsUnbiasedAndPicksANeighbour) {
    // Between two bf16 neighbours, the rounding lands on one of them, up with probability
    // (x - lower) / (upper - lower): the mean over 2^16 draws is x within a few parts in 10^5.
    for (const float x : {1.0f + 0.3f / 128, -3.7e-5f, 2.5e-9f, 1234.56f}) {
        double sum = 0;
        for (uint32_t i = 0; i < 65536; ++i) {
            const float r =
                bf16_to_float(float_to_bf16_stochastic(x, stochastic_hash(99, i) >> 16));
            const bool neighbour = r == bf16_to_float(float_to_bf16_stochastic(x, 0)) ||
                                   r == bf16_to_float(float_to_bf16_stochastic(x, 0xffff));
            ASSERT_TRUE(neighbour) << x << " rounded to " << r;
            sum += r;
        }
        EXPECT_NEAR(sum / 65536, x, 3e-5 * std::fabs(x)) << x;
    }
    // NaN stays NaN; a value bf16 holds exactly stays as it is.
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16_stochastic(std::nanf(""), 0xffff))));
    EXPECT_EQ(float_to_bf16_stochastic(1.5f, 0xffff), float_to_bf16(1.5f));
}

TEST_P(kernel_level, softmax) {
    rng g = gen(6);
    for (int very_negative = 0; very_negative < 2; ++very_negative) {
        for (uint32_t n : test_sizes) {
            SCOPED_TRACE("n = " + std::to_string(n) +
                         (very_negative ? ", with logits near -200" : ""));
            guarded<float> logits(n, nan_f);
            for (uint32_t i = 0; i < n; ++i) {
                logits[i] = -30.0f + 40.0f * g.uniform();
                // Every third logit (never all of them) far below the rest: exp underflows.
                if (very_negative && n > 1 && i % 3 == 1) logits[i] = -200.0f - 10 * g.uniform();
            }
            guarded<float> got(n, canary_f), want(n, canary_f);
            const double logz_got = k().softmax(logits.data(), got.data(), n);
            const double logz_want = ref().softmax(logits.data(), want.data(), n);
            EXPECT_TRUE(all_close(got.data(), want.data(), n, [&](size_t i) {
                return softmax_prob_abs_tol + softmax_prob_rel_tol * std::fabs(want[i]);
            }));
            EXPECT_NEAR(logz_got, logz_want,
                        softmax_logz_tol * std::max(1.0, std::fabs(logz_want)));
            double total = 0;
            for (uint32_t i = 0; i < n; ++i) total += got[i];
            EXPECT_NEAR(total, 1.0, 1e-5);
            EXPECT_TRUE(got.guards_intact());
        }
    }
}

/// A random rows block of fp32 or bf16 values.
template <class T>
rows_block<T> random_rows_of(uint32_t rows, uint32_t width, rng& g) {
    if constexpr (std::is_same_v<T, bf16>)
        return random_rows_bf16(rows, width, g);
    else
        return random_rows(rows, width, g);
}

/// active_dots or active_dots_bf16 of one level against the scalar one, on every width, row
/// count, with and without ids and bias.
template <class T, class Dots>
void check_active_dots(Dots got_fn, Dots want_fn, rng& g) {
    for (uint32_t width : test_sizes) {
        for (uint32_t n : row_counts) {
            const uint32_t rows = 2 * n + 3;
            rows_block<T> block = random_rows_of<T>(rows, width, g);
            const guarded<T> x = [&] {
                if constexpr (std::is_same_v<T, bf16>)
                    return random_vector_bf16(width, g);
                else
                    return random_vector(width, g, nan_f);
            }();
            const auto bias = random_vector(rows, g, nan_f);
            const auto ids = distinct_ids(n, rows, g);
            for (int use_ids = 0; use_ids < 2; ++use_ids) {
                for (int use_bias = 0; use_bias < 2; ++use_bias) {
                    SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n) +
                                 (use_ids ? ", ids" : ", ids = nullptr") +
                                 (use_bias ? ", bias" : ", bias = nullptr"));
                    const uint32_t* id_ptr = use_ids ? ids.data() : nullptr;
                    const float* bias_ptr = use_bias ? bias.data() : nullptr;
                    guarded<float> got(n, canary_f), want(n, canary_f);
                    got_fn(block.data.data(), block.stride, width, id_ptr, n, x.data(), bias_ptr,
                           got.data());
                    want_fn(block.data.data(), block.stride, width, id_ptr, n, x.data(), bias_ptr,
                            want.data());
                    EXPECT_TRUE(all_close(got.data(), want.data(), n, [&](size_t a) {
                        const size_t r = use_ids ? ids[a] : a;
                        double mag = use_bias ? std::fabs(bias[r]) : 0.0;
                        for (uint32_t i = 0; i < width; ++i)
                            mag += std::fabs(double(to_float(block.row(r)[i])) * to_float(x[i]));
                        return reduction_bound(mag);
                    }));
                    EXPECT_TRUE(got.guards_intact());
                }
            }
        }
    }
}

/// weighted_row_sum or weighted_row_sum_bf16 of one level against the scalar one.
template <class T, class Sum>
void check_weighted_row_sum(Sum got_fn, Sum want_fn, rng& g) {
    for (uint32_t width : test_sizes) {
        for (uint32_t n : row_counts) {
            const uint32_t rows = 2 * n + 3;
            rows_block<T> block = random_rows_of<T>(rows, width, g);
            const auto coef = random_vector(n, g, nan_f);
            const auto ids = distinct_ids(n, rows, g);
            const auto out0 = random_vector(width, g, canary_f);
            for (int use_ids = 0; use_ids < 2; ++use_ids) {
                SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n) +
                             (use_ids ? ", ids" : ", ids = nullptr"));
                const uint32_t* id_ptr = use_ids ? ids.data() : nullptr;
                auto got = copy_of(out0), want = copy_of(out0);
                got_fn(block.data.data(), block.stride, width, id_ptr, coef.data(), n, got.data());
                want_fn(block.data.data(), block.stride, width, id_ptr, coef.data(), n,
                        want.data());
                if (n == 0) {
                    for (uint32_t i = 0; i < width; ++i)
                        ASSERT_EQ(bits_of(got[i]), bits_of(out0[i]))
                            << "n = 0 changed out[" << i << "]";
                }
                EXPECT_TRUE(all_close(got.data(), want.data(), width, [&](size_t i) {
                    double mag = std::fabs(out0[i]);
                    for (uint32_t kk = 0; kk < n; ++kk) {
                        const size_t r = use_ids ? ids[kk] : kk;
                        mag += std::fabs(double(coef[kk]) * to_float(block.row(r)[i]));
                    }
                    return elementwise_bound(mag);
                }));
                EXPECT_TRUE(got.guards_intact());
            }
        }
    }
}

TEST_P(kernel_level, active_dots) {
    rng g = gen(7);
    check_active_dots<float>(k().active_dots, ref().active_dots, g);
}

TEST_P(kernel_level, weighted_row_sum) {
    rng g = gen(8);
    check_weighted_row_sum<float>(k().weighted_row_sum, ref().weighted_row_sum, g);
}

TEST_P(kernel_level, weighted_sums_of_four) {
    // Four outputs over the same rows (vectors) are each the bits the single kernel of the same
    // level gives (the batched dense-input forward and the update rely on it: training is the
    // same whichever path a step takes), on awkward widths; the single kernels are checked
    // against the scalar definition above. Rows by id and in place; vectors in separate
    // allocations with NaN guards.
    rng g = gen(21);
    for (uint32_t width : test_sizes) {
        for (uint32_t n : row_counts) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            const uint32_t rows = 2 * n + 3;
            const rows_block<float> block = random_rows(rows, width, g);
            const auto ids = distinct_ids(n, rows, g);
            std::vector<guarded<float>> coefs, outs, singles;
            for (int j = 0; j < 4; ++j) {
                coefs.push_back(random_vector(n, g, nan_f));
                outs.push_back(random_vector(width, g, canary_f));
            }
            const float* coef[4];
            float* out[4];
            for (int use_ids = 0; use_ids < 2; ++use_ids) {
                SCOPED_TRACE(use_ids ? "ids" : "ids = nullptr");
                const uint32_t* id_ptr = use_ids ? ids.data() : nullptr;
                std::vector<guarded<float>> got, want;
                for (int j = 0; j < 4; ++j) {
                    got.push_back(copy_of(outs[size_t(j)]));
                    want.push_back(copy_of(outs[size_t(j)]));
                    coef[j] = coefs[size_t(j)].data();
                    out[j] = got.back().data();
                    k().weighted_row_sum(block.data.data(), block.stride, width, id_ptr, coef[j], n,
                                         want.back().data());
                }
                k().weighted_row_sum4(block.data.data(), block.stride, width, id_ptr, coef, n, out);
                for (int j = 0; j < 4; ++j) {
                    for (uint32_t i = 0; i < width; ++i)
                        ASSERT_EQ(bits_of(got[size_t(j)][i]), bits_of(want[size_t(j)][i]))
                            << "row sum " << j << " differs from weighted_row_sum at " << i;
                    EXPECT_TRUE(got[size_t(j)].guards_intact());
                }
            }
            std::vector<guarded<float>> vectors;
            std::vector<const float*> pointers;
            for (uint32_t i = 0; i < n; ++i) vectors.push_back(random_vector(width, g, nan_f));
            for (const auto& v : vectors) pointers.push_back(v.data());
            std::vector<guarded<float>> got, want;
            for (int j = 0; j < 4; ++j) {
                got.push_back(copy_of(outs[size_t(j)]));  // canaries: overwritten, never read
                want.push_back(copy_of(outs[size_t(j)]));
                out[j] = got.back().data();
                k().weighted_vector_sum(pointers.data(), coef[j], n, width, want.back().data());
            }
            k().weighted_vector_sum4(pointers.data(), coef, n, width, out);
            for (int j = 0; j < 4; ++j) {
                for (uint32_t i = 0; i < width; ++i)
                    ASSERT_EQ(bits_of(got[size_t(j)][i]), bits_of(want[size_t(j)][i]))
                        << "vector sum " << j << " differs from weighted_vector_sum at " << i;
                EXPECT_TRUE(got[size_t(j)].guards_intact());
            }
        }
    }
}

TEST_P(kernel_level, dots16) {
    // 16 inputs stored transposed against rows with NaN in their padding (a read past `width`
    // poisons the sums), the rows in place or by id (scattered, some twice: an IVF cluster's
    // members read where they are); every level against the scalar definition.
    rng g = gen(14);
    for (uint32_t width : test_sizes) {
        for (uint32_t n : {0u, 1u, 3u, 7u, 8u, 9u, 17u, 100u}) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            const uint32_t stored = 2 * n + 1;
            const rows_block<float> block = random_rows(stored, width, g);
            const auto xt = random_vector(size_t(width) * 16, g, nan_f);
            const auto bias = random_vector(n + 1, g, nan_f);
            std::vector<uint32_t> ids(n);
            for (uint32_t& id : ids) id = uint32_t(g.below(stored));
            for (int mode = 0; mode < 4; ++mode) {
                const float* b = mode & 1 ? bias.data() : nullptr;
                const uint32_t* by_id = mode & 2 ? ids.data() : nullptr;
                SCOPED_TRACE(std::string(b ? "bias" : "no bias") + (by_id ? ", by id" : ""));
                guarded<float> got(size_t(n) * 16, canary_f), want(size_t(n) * 16, canary_f);
                k().dots16(block.data.data(), block.stride, width, by_id, n, xt.data(), b,
                           got.data());
                ref().dots16(block.data.data(), block.stride, width, by_id, n, xt.data(), b,
                             want.data());
                EXPECT_TRUE(all_close(got.data(), want.data(), got.size(), [&](size_t e) {
                    const size_t a = e / 16, j = e % 16;
                    const float* row = block.row(by_id ? by_id[a] : uint32_t(a));
                    double mag = b ? std::fabs(bias[a]) : 0.0;
                    for (uint32_t i = 0; i < width; ++i)
                        mag += std::fabs(double(row[i]) * xt[size_t(i) * 16 + j]);
                    return reduction_bound(mag);
                }));
                EXPECT_TRUE(got.guards_intact());
            }
            // By id, the product is the in-place one of the same rows, bit for bit.
            if (n > 0) {
                std::vector<float> in_place(size_t(n) * 16), by_id(size_t(n) * 16);
                std::vector<uint32_t> first(n);
                std::iota(first.begin(), first.end(), 0u);
                k().dots16(block.data.data(), block.stride, width, nullptr, n, xt.data(),
                           bias.data(), in_place.data());
                k().dots16(block.data.data(), block.stride, width, first.data(), n, xt.data(),
                           bias.data(), by_id.data());
                EXPECT_EQ(in_place, by_id);
            }
        }
    }
}

TEST_P(kernel_level, dots16_bf16) {
    // bf16 rows with NaN in their padding against 16 bf16 inputs in pairs (the odd width's last
    // pair padded with zeros, as the layout says); the native level against the scalar one.
    if (!k().dots16_bf16) {
        EXPECT_LT(k().level, isa_level::avx512bf16) << "the bf16 levels have a native kernel";
        GTEST_SKIP() << k().name << " has no native dots16_bf16 (exact scoring takes "
                     << "active_dots_bf16 per input there)";
    }
    rng g = gen(15);
    for (uint32_t width : test_sizes) {
        // amx: passes of 64 rows as tiles (64, 100, 200), the rest a tile at a time
        for (uint32_t n : {0u, 1u, 7u, 8u, 9u, 17u, 64u, 100u, 200u}) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            const rows_block<bf16> block = random_rows_bf16(n + 1, width, g);
            const uint32_t pairs = (width + 1) / 2;
            guarded<bf16> xp(size_t(pairs) * 32, nan_bf16);
            for (uint32_t i = 0; i < 2 * pairs; ++i)
                for (uint32_t j = 0; j < 16; ++j)
                    xp[(i / 2) * 32 + j * 2 + i % 2] =
                        i < width ? float_to_bf16(normal(g)) : bf16{0};
            const auto bias = random_vector(n + 1, g, nan_f);
            for (int use_bias = 0; use_bias < 2; ++use_bias) {
                const float* b = use_bias ? bias.data() : nullptr;
                guarded<float> got(size_t(n) * 16, canary_f), want(size_t(n) * 16, canary_f);
                k().dots16_bf16(block.data.data(), block.stride, width, n, xp.data(), b,
                                got.data());
                ref().dots16_bf16(block.data.data(), block.stride, width, n, xp.data(), b,
                                  want.data());
                EXPECT_TRUE(all_close(got.data(), want.data(), got.size(), [&](size_t e) {
                    const size_t a = e / 16, j = e % 16;
                    double mag = use_bias ? std::fabs(bias[a]) : 0.0;
                    for (uint32_t i = 0; i < width; ++i)
                        mag += std::fabs(double(bf16_to_float(block.row(a)[i])) *
                                         bf16_to_float(xp[(i / 2) * 32 + j * 2 + i % 2]));
                    return reduction_bound(mag);
                }));
                EXPECT_TRUE(got.guards_intact());
                // A row's sums do not depend on where it falls in a call (exact scoring splits
                // the rows into blocks): the rows from `skip` on, scored by a call of their own.
                const uint32_t skip = n / 3 + 1;
                if (skip >= n) continue;
                guarded<float> rest(size_t(n - skip) * 16, canary_f);
                k().dots16_bf16(block.row(skip), block.stride, width, n - skip, xp.data(),
                                b ? b + skip : nullptr, rest.data());
                for (size_t e = 0; e < rest.size(); ++e)
                    ASSERT_EQ(rest[e], got[size_t(skip) * 16 + e]) << "row " << skip + e / 16;
            }
        }
    }
}

TEST_P(kernel_level, weighted_vector_sum) {
    // Vectors in separate allocations, each with NaN guards (a read past `width` poisons the
    // sum); the update relies on the result equalling n axpy calls of the same level on a
    // zeroed vector bit for bit, which is checked too, and on `out`'s old values (canaries
    // here) mattering not at all.
    rng g = gen(13);
    for (uint32_t width : test_sizes) {
        for (uint32_t n : row_counts) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            std::vector<guarded<float>> vectors;
            std::vector<const float*> pointers;
            for (uint32_t i = 0; i < n; ++i) vectors.push_back(random_vector(width, g, nan_f));
            for (const auto& v : vectors) pointers.push_back(v.data());
            const auto coef = random_vector(n, g, nan_f);
            const auto out0 = random_vector(width, g, canary_f);
            auto got = copy_of(out0), want = copy_of(out0), by_axpy = copy_of(out0);
            for (uint32_t i = 0; i < width; ++i) by_axpy[i] = 0.0f;
            k().weighted_vector_sum(pointers.data(), coef.data(), n, width, got.data());
            ref().weighted_vector_sum(pointers.data(), coef.data(), n, width, want.data());
            for (uint32_t i = 0; i < n; ++i) k().axpy(coef[i], pointers[i], by_axpy.data(), width);
            for (uint32_t i = 0; i < width; ++i)
                ASSERT_EQ(bits_of(got[i]), bits_of(by_axpy[i])) << "differs from axpy at " << i;
            EXPECT_TRUE(all_close(got.data(), want.data(), width, [&](size_t i) {
                double mag = 0.0;
                for (uint32_t kk = 0; kk < n; ++kk)
                    mag += std::fabs(double(coef[kk]) * vectors[kk][i]);
                return elementwise_bound(mag);
            }));
            EXPECT_TRUE(got.guards_intact());
        }
    }
}

TEST_P(kernel_level, active_dots_bf16) {
    rng g = gen(9);
    check_active_dots<bf16>(k().active_dots_bf16, ref().active_dots_bf16, g);
}

TEST_P(kernel_level, weighted_row_sum_bf16) {
    rng g = gen(10);
    check_weighted_row_sum<bf16>(k().weighted_row_sum_bf16, ref().weighted_row_sum_bf16, g);
}

/// weighted_row_sum_f64 or its bf16 variant of one level against the scalar one: the same bits
/// (each product is exact in double, so an FMA rounds as the reference's add), the output's
/// guards intact; and split-independence: the rows summed in two parts (as two ranks would),
/// the parts added in double and rounded to float, equal the float rounding of the whole sum.
template <class T, class Sum>
void check_weighted_row_sum_f64(Sum got_fn, Sum want_fn, rng& g) {
    const double canary_d = -7777.25;
    for (uint32_t width : test_sizes) {
        for (uint32_t n : row_counts) {
            const uint32_t rows = 2 * n + 3;
            rows_block<T> block = random_rows_of<T>(rows, width, g);
            const auto coef = random_vector(n, g, nan_f);
            const auto ids = distinct_ids(n, rows, g);
            guarded<double> out0(width, canary_d);
            for (uint32_t i = 0; i < width; ++i) out0[i] = double(normal(g));
            for (int use_ids = 0; use_ids < 2; ++use_ids) {
                SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n) +
                             (use_ids ? ", ids" : ", ids = nullptr"));
                const uint32_t* id_ptr = use_ids ? ids.data() : nullptr;
                auto got = copy_of(out0), want = copy_of(out0);
                got_fn(block.data.data(), block.stride, width, id_ptr, coef.data(), n, got.data());
                want_fn(block.data.data(), block.stride, width, id_ptr, coef.data(), n,
                        want.data());
                EXPECT_EQ(std::memcmp(got.data(), want.data(), width * sizeof(double)), 0);
                EXPECT_TRUE(got.guards_intact());
                if (!use_ids || n < 2) continue;
                // The first n/2 ids from zero, the rest from zero, added: as two ranks' shares.
                guarded<double> whole(width, canary_d), part0(width, canary_d),
                    part1(width, canary_d);
                for (uint32_t i = 0; i < width; ++i) whole[i] = part0[i] = part1[i] = 0;
                const uint32_t half = n / 2;
                got_fn(block.data.data(), block.stride, width, id_ptr, coef.data(), n,
                       whole.data());
                got_fn(block.data.data(), block.stride, width, id_ptr, coef.data(), half,
                       part0.data());
                got_fn(block.data.data(), block.stride, width, id_ptr + half, coef.data() + half,
                       n - half, part1.data());
                for (uint32_t i = 0; i < width; ++i)
                    EXPECT_EQ(bits_of(float(whole[i])), bits_of(float(part0[i] + part1[i])))
                        << "element " << i;
            }
        }
    }
}

TEST_P(kernel_level, weighted_row_sum_f64) {
    rng g = gen(17);
    check_weighted_row_sum_f64<float>(k().weighted_row_sum_f64, ref().weighted_row_sum_f64, g);
}

TEST_P(kernel_level, weighted_row_sum_bf16_f64) {
    rng g = gen(18);
    check_weighted_row_sum_f64<bf16>(k().weighted_row_sum_bf16_f64, ref().weighted_row_sum_bf16_f64,
                                     g);
}

TEST_P(kernel_level, to_bf16_random_floats_and_bit_patterns) {
    rng g = gen(11);
    for (int patterns = 0; patterns < 2; ++patterns) {
        for (uint32_t n : test_sizes) {
            SCOPED_TRACE("n = " + std::to_string(n) +
                         (patterns ? ", random bit patterns" : ", N(0, 1) values"));
            guarded<float> x(n, nan_f);
            for (uint32_t i = 0; i < n; ++i)
                x[i] = patterns ? float_of(random_float_bits(g)) : normal(g);
            guarded<bf16> got(n, canary_bf16), want(n, canary_bf16);
            k().to_bf16(x.data(), got.data(), n);
            ref().to_bf16(x.data(), want.data(), n);
            EXPECT_TRUE(bits_equal(got.data(), want.data(), x.data(), n));
            EXPECT_TRUE(got.guards_intact());
        }
    }
}

TEST_P(kernel_level, to_bf16_edge_cases) {
    // Every edge case in every lane position, through full vectors and masked tails alike.
    constexpr size_t cases = sizeof(bf16_cases) / sizeof(bf16_cases[0]);
    for (uint32_t n : test_sizes) {
        for (size_t shift = 0; shift < cases; ++shift) {
            guarded<float> x(n, nan_f);
            for (uint32_t i = 0; i < n; ++i) x[i] = float_of(bf16_cases[(i + shift) % cases].in);
            guarded<bf16> got(n, canary_bf16);
            k().to_bf16(x.data(), got.data(), n);
            for (uint32_t i = 0; i < n; ++i) {
                const bf16_case& c = bf16_cases[(i + shift) % cases];
                ASSERT_EQ(got[i], c.out) << std::hex << "input 0x" << c.in << " (" << c.what
                                         << ") in lane " << std::dec << i << " of n = " << n;
            }
            ASSERT_TRUE(got.guards_intact()) << "n = " << n;
        }
    }
}

TEST_P(kernel_level, to_bf16_many_random_bit_patterns) {
    rng g = gen(12);
    constexpr uint32_t n = 100003;  // not a multiple of any vector width
    guarded<float> x(n, nan_f);
    for (uint32_t i = 0; i < n; ++i) x[i] = float_of(random_float_bits(g));
    guarded<bf16> got(n, canary_bf16);
    k().to_bf16(x.data(), got.data(), n);
    std::vector<bf16> want(n);
    for (uint32_t i = 0; i < n; ++i) want[i] = float_to_bf16(x[i]);
    EXPECT_TRUE(bits_equal(got.data(), want.data(), x.data(), n));
    EXPECT_TRUE(got.guards_intact());
}

// --- int8: to_int8_row and dots16_u8s8 -------------------------------------------------------
//
// An exact search's int8 copy of the rows: to_int8_row quantizes a row symmetrically (a scale
// and the sum of the int8 values per row), dots16_u8s8 scores 16 u8-quantized inputs against
// such rows. int8 and u8 have no poison value like NaN, so reads past a row's `width` are
// caught two ways instead: the padding between rows holds garbage that must not change a
// score, and (dots16_u8s8_reads_nothing_past_its_buffers) every buffer ends where an
// inaccessible page begins, so one byte read or written past it faults.

using to_int8_fn = decltype(kernel_table::to_int8_row);
using u8s8_fn = decltype(kernel_table::dots16_u8s8);

constexpr int8_t canary_i8 = 0x5a;
constexpr int32_t canary_sum = 0x5a5a5a5a;  // *sum before the call: never a plausible sum

/// The row lengths to_int8_row is tried on: around the 16-lane vectors, and one long row.
constexpr uint32_t int8_sizes[] = {1, 15, 16, 17, 33, 100, 256, 257, 4099};

/// dots16_u8s8's widths (around the fours of the layout and the 16- and 64-byte vectors) and
/// row counts (around its blocks of 8 rows).
constexpr uint32_t u8s8_widths[] = {1, 3, 4, 5, 15, 16, 17, 33, 64, 255, 256};
constexpr uint32_t u8s8_row_counts[] = {0, 1, 7, 8, 9, 17};

/// dots16_u8s8 of a level against the scalar one. The integer sums are exact on both sides and
/// float(int32) rounds the same everywhere, so they can differ only in the float epilogue,
/// where the scale multiply and the bias add may fuse into one rounding (~6e-8 of the
/// magnitude): |got - want| <= u8s8_tol * (|c| * row_scale * query_scale + |bias|), c the exact
/// integer sum (computed by the test in int64).
constexpr double u8s8_tol = 1e-6;

/// `n` elements of T that end exactly where an inaccessible page begins: a kernel that reads or
/// writes one byte past the end faults (and the test dies) instead of passing unnoticed.
template <class T>
class page_end_buffer {
  public:
    explicit page_end_buffer(size_t n) {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        const size_t bytes = n * sizeof(T), data_pages = (bytes + page - 1) / page;
        size_ = (data_pages + 1) * page;
        base_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base_ == MAP_FAILED) throw std::runtime_error("mmap failed");
        char* guard = static_cast<char*>(base_) + data_pages * page;
        if (mprotect(guard, page, PROT_NONE) != 0) throw std::runtime_error("mprotect failed");
        data_ = reinterpret_cast<T*>(guard - bytes);
    }
    /// A copy of src[0..n).
    page_end_buffer(const T* src, size_t n) : page_end_buffer(n) { std::copy(src, src + n, data_); }
    ~page_end_buffer() { munmap(base_, size_); }
    page_end_buffer(const page_end_buffer&) = delete;
    page_end_buffer& operator=(const page_end_buffer&) = delete;

    T* data() { return data_; }
    T& operator[](size_t i) { return data_[i]; }

  private:
    size_t size_ = 0;
    void* base_ = nullptr;
    T* data_ = nullptr;
};

/// The rows to_int8_row is tried on.
enum class int8_row_kind {
    normal,            // N(0, 1): both signs
    negative_max,      // N(0, 1) with one negative element of the largest magnitude
    ties,              // x * (127 / m) exact and at k + 0.5: the rounding's ties
    mixed_magnitudes,  // N(0, 1) * 2^[-30, 30]: most elements round to 0 or +-1
    huge,              // N(0, 1) * 1e37
    near_overflow,     // N(0, 1) * 3e-37: 127 / m finite or not, m / 127 subnormal
    tiny,              // N(0, 1) * 1e-38 (subnormals too): 127 / m overflows, all zeros
    zero,              // +0 and -0: scale 0, all zeros
};
constexpr int8_row_kind int8_row_kinds[] = {int8_row_kind::normal, int8_row_kind::negative_max,
                                            int8_row_kind::ties,   int8_row_kind::mixed_magnitudes,
                                            int8_row_kind::huge,   int8_row_kind::near_overflow,
                                            int8_row_kind::tiny,   int8_row_kind::zero};
const char* to_string(int8_row_kind kind) {
    static const char* const names[] = {"normal", "negative_max",  "ties", "mixed_magnitudes",
                                        "huge",   "near_overflow", "tiny", "zero"};
    return names[int(kind)];
}

float max_abs(const float* x, uint32_t n) {
    float m = 0.0f;
    for (uint32_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

guarded<float> int8_test_row(int8_row_kind kind, uint32_t n, rng& g) {
    guarded<float> x(n, nan_f);
    const uint32_t at = uint32_t(g.below(n));  // where negative_max and ties put the maximum
    switch (kind) {
        case int8_row_kind::normal:
            for (uint32_t i = 0; i < n; ++i) x[i] = normal(g);
            break;
        case int8_row_kind::negative_max:
            for (uint32_t i = 0; i < n; ++i) x[i] = normal(g);
            x[at] = -(max_abs(x.data(), n) + 0.5f + g.uniform());
            break;
        case int8_row_kind::ties: {
            // m = 127 * unit, unit a power of two: 127 / m = 1 / unit and x * (1 / unit) are
            // exact, and every element but the maximum lands on k + 0.5.
            const float unit = std::ldexp(1.0f, int(g.below(5)) - 2);
            for (uint32_t i = 0; i < n; ++i)
                x[i] = (float(int(g.below(253)) - 126) + 0.5f) * unit;  // |x| <= 126.5 * unit
            x[at] = (g.below(2) ? 127.0f : -127.0f) * unit;
            break;
        }
        case int8_row_kind::mixed_magnitudes:
            for (uint32_t i = 0; i < n; ++i)
                x[i] = normal(g, std::ldexp(1.0f, int(g.below(61)) - 30));
            break;
        case int8_row_kind::huge:
            for (uint32_t i = 0; i < n; ++i) x[i] = normal(g, 1e37f);
            break;
        case int8_row_kind::near_overflow:
            for (uint32_t i = 0; i < n; ++i) x[i] = normal(g, 3e-37f);
            break;
        case int8_row_kind::tiny:
            // m < 127 / FLT_MAX = 3.7e-37 unless a N(0, 1) draw exceeded 37.
            for (uint32_t i = 0; i < n; ++i) x[i] = normal(g, 1e-38f);
            break;
        case int8_row_kind::zero:
            for (uint32_t i = 0; i < n; ++i) x[i] = i % 2 ? -0.0f : 0.0f;
            break;
    }
    return x;
}

::testing::AssertionResult int8_equal(const int8_t* got, const int8_t* want, const float* x,
                                      size_t n) {
    return elements_equal(got, want, n, [&](std::ostream& msg, size_t i) {
        msg << "\n  [" << i << "] input " << x[i] << ": got " << int(got[i]) << ", want "
            << int(want[i]);
    });
}

/// Whether 127 / m overflows (or m is 0): the rows to_int8_row leaves all zeros.
bool quantizes_to_zeros(float m) {
    return !(m > 0.0f) || !std::isfinite(127.0f / m);
}

TEST_P(kernel_level, to_int8_row) {
    // Every level against the scalar reference bit for bit: values, sum and scale; the output's
    // guards intact; once more with the row and the output ending at an inaccessible page.
    rng g = gen(19);
    for (int8_row_kind kind : int8_row_kinds) {
        for (uint32_t n : int8_sizes) {
            SCOPED_TRACE(std::string(to_string(kind)) + ", n = " + std::to_string(n));
            const guarded<float> x = int8_test_row(kind, n, g);
            guarded<int8_t> got(n, canary_i8), want(n, canary_i8);
            int32_t got_sum = canary_sum, want_sum = canary_sum;
            const float got_scale = k().to_int8_row(x.data(), got.data(), n, &got_sum);
            const float want_scale = to_int8_row_reference(x.data(), want.data(), n, &want_sum);
            EXPECT_TRUE(int8_equal(got.data(), want.data(), x.data(), n));
            EXPECT_EQ(got_sum, want_sum);
            EXPECT_EQ(bits_of(got_scale), bits_of(want_scale))
                << "got " << got_scale << ", want " << want_scale;
            EXPECT_TRUE(got.guards_intact());
            if (kind == int8_row_kind::zero || kind == int8_row_kind::tiny) {
                ASSERT_TRUE(quantizes_to_zeros(max_abs(x.data(), n)));
                for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 0) << "element " << i;
                EXPECT_EQ(got_sum, 0);
                if (kind == int8_row_kind::zero) EXPECT_EQ(got_scale, 0.0f);
            }

            page_end_buffer<float> x_end(x.data(), n);
            page_end_buffer<int8_t> out_end(n);
            int32_t end_sum = canary_sum;
            const float end_scale = k().to_int8_row(x_end.data(), out_end.data(), n, &end_sum);
            EXPECT_TRUE(int8_equal(out_end.data(), want.data(), x.data(), n)) << "at a page end";
            EXPECT_EQ(end_sum, want_sum);
            EXPECT_EQ(bits_of(end_scale), bits_of(want_scale));
        }
    }
}

TEST(int8_reference, to_int8_row_properties) {
    // The scalar reference's contract on many random rows of every kind: out[i] in
    // [-127, 127]; an element of the largest magnitude m maps to +-127 with its sign; *sum is
    // the sum of out; the scale returned is m / 127; and x[i] is within scale / 2 of
    // out[i] * scale (in double), up to the slack derived below. Rows where 127 / m is not
    // finite (m = 0, or m < 127 / FLT_MAX) are all zeros instead.
    //
    // Slack: q = round(y), y = fl(x * inv), inv = fl(127 / m), scale = fl(m / 127), each
    // rounding relative 2^-24 (or absolute 2^-150 for a subnormal scale, relative < 2^-22
    // since scale >= 2.9e-39). x - q * scale = (y - q) * scale + y * (x / y - scale), with
    // |y - q| <= 1/2 and |y| <= 127 (1 + 2^-23), and x / y - scale = scale * O(3 roundings):
    // |x - q * scale| <= scale * (1/2 + 127 * 6 * 2^-24) ~ scale * (1/2 + 4.5e-5). The test
    // allows scale * (1/2 + 2^-13) (1.2e-4): a rounding that truncated or rounded with a
    // wrong inverse (errors up to a whole step) fails it.
    rng g(derive_seed(0x696e7438, 1));
    const double slack = std::ldexp(1.0, -13);
    for (int8_row_kind kind : int8_row_kinds) {
        for (uint32_t n : int8_sizes) {
            for (int trial = 0; trial < 20; ++trial) {
                SCOPED_TRACE(std::string(to_string(kind)) + ", n = " + std::to_string(n) +
                             ", trial " + std::to_string(trial));
                const guarded<float> x = int8_test_row(kind, n, g);
                guarded<int8_t> out(n, canary_i8);
                int32_t sum = canary_sum;
                const float scale = to_int8_row_reference(x.data(), out.data(), n, &sum);
                ASSERT_TRUE(out.guards_intact());
                const float m = max_abs(x.data(), n);
                ASSERT_EQ(bits_of(scale), bits_of(m / 127.0f));
                if (quantizes_to_zeros(m)) {
                    ASSERT_NE(kind, int8_row_kind::normal);
                    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 0) << "element " << i;
                    ASSERT_EQ(sum, 0);
                    continue;
                }
                int64_t total = 0;
                for (uint32_t i = 0; i < n; ++i) {
                    ASSERT_GE(out[i], -127) << "element " << i;
                    ASSERT_LE(out[i], 127) << "element " << i;
                    total += out[i];
                    if (std::fabs(x[i]) == m) ASSERT_EQ(out[i], x[i] < 0 ? -127 : 127) << i;
                    const double err = std::fabs(double(x[i]) - double(out[i]) * double(scale));
                    ASSERT_LE(err, double(scale) * (0.5 + slack))
                        << "element " << i << ": " << x[i] << " -> " << int(out[i]) << " * "
                        << scale;
                }
                ASSERT_EQ(sum, total);
            }
        }
    }
}

TEST(int8_reference, to_int8_row_rounds_ties_to_even) {
    // By hand: m = 127 (127 / m = 1 exactly), the rest ties.
    const float x[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 127.0f, 3.25f};
    const int8_t want[] = {0, 2, 2, 0, -2, -2, 126, -126, 127, 3};
    int8_t out[10];
    int32_t sum = canary_sum;
    EXPECT_EQ(to_int8_row_reference(x, out, 10, &sum), 1.0f);
    EXPECT_TRUE(int8_equal(out, want, x, 10));
    EXPECT_EQ(sum, 0 + 2 + 2 + 0 - 2 - 2 + 126 - 126 + 127 + 3);
    // Random ties at scales 1/4 .. 4, against an independent round-half-even in double.
    rng g(derive_seed(0x696e7438, 2));
    for (uint32_t n : int8_sizes) {
        const guarded<float> row = int8_test_row(int8_row_kind::ties, n, g);
        guarded<int8_t> got(n, canary_i8);
        to_int8_row_reference(row.data(), got.data(), n, &sum);
        const double inv = 127.0 / double(max_abs(row.data(), n));  // a power of two
        for (uint32_t i = 0; i < n; ++i) {
            const double y = double(row[i]) * inv, fl = std::floor(y);
            const double r = y - fl < 0.5   ? fl
                             : y - fl > 0.5 ? fl + 1
                                            : (std::fmod(fl, 2.0) == 0 ? fl : fl + 1);
            ASSERT_EQ(int(got[i]), int(r)) << "n = " << n << ", element " << i << ": " << row[i];
        }
    }
}

/// int8 rows as an exact search keeps them: random N(0, 1) fp32 rows, each of a random
/// magnitude 1/8 .. 8, quantized by `quantize` `stride` apart (padding filled with 0x7f).
struct int8_block {
    uint32_t rows, width;
    size_t stride;
    std::vector<float> fp32;  // rows x width, before quantization
    std::vector<int8_t> data;
    std::vector<float> scale;
    std::vector<int32_t> sum;

    const int8_t* row(size_t r) const { return data.data() + r * stride; }
    void fill_padding(int8_t pad) {
        for (size_t r = 0; r < rows; ++r)
            std::fill(data.begin() + r * stride + width, data.begin() + (r + 1) * stride, pad);
    }
};

int8_block quantized_rows(uint32_t rows, uint32_t width, size_t stride, rng& g,
                          to_int8_fn quantize) {
    int8_block b{rows,
                 width,
                 stride,
                 std::vector<float>(size_t(rows) * width),
                 std::vector<int8_t>(size_t(rows) * stride, int8_t{0x7f}),
                 std::vector<float>(rows),
                 std::vector<int32_t>(rows)};
    for (uint32_t r = 0; r < rows; ++r) {
        const float magnitude = std::ldexp(1.0f, int(g.below(7)) - 3);
        float* x = b.fp32.data() + size_t(r) * width;
        for (uint32_t i = 0; i < width; ++i) x[i] = normal(g, magnitude);
        b.scale[r] = quantize(x, b.data.data() + size_t(r) * stride, width, &b.sum[r]);
    }
    return b;
}

/// 16 inputs quantized to u8 in dots16_u8s8's layout: element i of input j at
/// xq[(i / 4) * 64 + j * 4 + i % 4], the last four padded with zeros.
struct u8_queries {
    uint32_t width;
    std::vector<float> fp32;  // input j's element i at [j * width + i] (quantized_queries only)
    std::vector<uint8_t> xq;
    std::vector<float> scale;   // 16
    std::vector<int32_t> zero;  // 16

    uint8_t at(uint32_t i, uint32_t j) const { return xq[(i / 4) * 64 + j * 4 + i % 4]; }
};

size_t fours_bytes(uint32_t width) {
    return size_t(width + 3) / 4 * 64;
}

/// Random bytes and zero points in [0, max] (the kernels' u8s8_input_max), scales in
/// [0.005, 0.015).
u8_queries random_u8_queries(uint32_t width, uint8_t max, rng& g) {
    u8_queries q{width,
                 {},
                 std::vector<uint8_t>(fours_bytes(width), 0),
                 std::vector<float>(16),
                 std::vector<int32_t>(16)};
    for (uint32_t i = 0; i < width; ++i)
        for (uint32_t j = 0; j < 16; ++j)
            q.xq[(i / 4) * 64 + j * 4 + i % 4] = uint8_t(g.below(max + 1u));
    for (uint32_t j = 0; j < 16; ++j) {
        q.zero[j] = int32_t(g.below(max + 1u));
        q.scale[j] = 0.01f * (0.5f + g.uniform());
    }
    return q;
}

/// Exact scoring's integer: sum_i (xq_i - zero) * row_i as the kernel computes it, acc -
/// zero * row_sum, in int64.
int64_t exact_u8s8(const int8_t* row, const u8_queries& q, uint32_t j, int32_t row_sum) {
    int64_t acc = 0;
    for (uint32_t i = 0; i < q.width; ++i) acc += int64_t(q.at(i, j)) * row[i];
    return acc - int64_t(q.zero[j]) * row_sum;
}

/// The tolerance of out[a * 16 + j] (see u8s8_tol).
double u8s8_bound(const int8_block& block, const u8_queries& q, const float* bias, size_t a,
                  uint32_t j) {
    const double c = double(exact_u8s8(block.row(a), q, j, block.sum[a]));
    const double mag = std::fabs(c) * double(block.scale[a]) * double(q.scale[j]) +
                       (bias ? std::fabs(bias[a]) : 0);
    return u8s8_tol * mag;
}

/// Why `k` has no dots16_u8s8, or nullptr when it has one.
const char* no_u8s8_reason(const kernel_table& k) {
    if (k.dots16_u8s8) return nullptr;
    switch (k.level) {
        case isa_level::amx:
            return "amx scores a bf16 copy on its tiles instead (deliberately)";
        case isa_level::avx512:
        case isa_level::avx512bf16:
            return "this CPU has no AVX512_VNNI";
        default:
            return "the level has no 8-bit dot products";
    }
}

TEST(int8_reference, dots16_u8s8_matches_exact_integer_sums) {
    // The scalar definition itself: float(c) * (row_scale * query_scale) (+ bias), c the exact
    // integer sum computed here in int64, to u8s8_tol (the expected value is rounded in double).
    rng g(derive_seed(0x696e7438, 3));
    const kernel_table& ref = scalar_kernels();
    for (uint32_t width : u8s8_widths) {
        for (uint32_t n : u8s8_row_counts) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            const int8_block block =
                quantized_rows(n, width, padded_stride(width), g, to_int8_row_reference);
            const u8_queries q = random_u8_queries(width, 255, g);
            const auto bias = random_vector(n, g, nan_f);
            for (int use_bias = 0; use_bias < 2; ++use_bias) {
                const float* b = use_bias ? bias.data() : nullptr;
                guarded<float> got(size_t(n) * 16, canary_f);
                ref.dots16_u8s8(block.data.data(), block.stride, width, n, q.xq.data(),
                                block.scale.data(), block.sum.data(), q.scale.data(), q.zero.data(),
                                b, got.data());
                std::vector<float> want(size_t(n) * 16);
                for (size_t e = 0; e < want.size(); ++e) {
                    const size_t a = e / 16;
                    const uint32_t j = uint32_t(e % 16);
                    want[e] = float(double(exact_u8s8(block.row(a), q, j, block.sum[a])) *
                                        block.scale[a] * q.scale[j] +
                                    (b ? b[a] : 0.0));
                }
                EXPECT_TRUE(all_close(got.data(), want.data(), want.size(), [&](size_t e) {
                    return u8s8_bound(block, q, b, e / 16, uint32_t(e % 16)) + 1e-30;
                }));
                EXPECT_TRUE(got.guards_intact());
            }
        }
    }
}

TEST_P(kernel_level, dots16_u8s8) {
    // int8 rows from to_int8_row (their scales and sums), 0x7f bytes in the padding past
    // `width`, against 16 inputs of random bytes with random zero points; every level that has
    // the kernel against the scalar definition. The padding refilled with 0x80 must leave every
    // score's bits as they were; a row's scores do not depend on where it falls in a call.
    // nullptr exactly where the table says: amx (deliberately) and the AVX-512 levels without
    // VNNI; avx2 has it (vpmaddubsw's pairs summed by vpmaddwd), for inputs up to 15.
    if (k().level == isa_level::amx) EXPECT_EQ(k().dots16_u8s8, nullptr);
    if (k().level == isa_level::avx2) EXPECT_NE(k().dots16_u8s8, nullptr);
    EXPECT_EQ(k().u8s8_input_max, k().level == isa_level::avx2 ? 15 : 255);
    if (k().level == isa_level::avx512 || k().level == isa_level::avx512bf16)
        EXPECT_EQ(k().dots16_u8s8 != nullptr, detect_cpu_features().avx512_vnni);
    if (const char* why = no_u8s8_reason(k()))
        GTEST_SKIP() << k().name << ": no dots16_u8s8 (" << why << ")";
    rng g = gen(20);
    for (uint32_t width : u8s8_widths) {
        for (uint32_t n : u8s8_row_counts) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            int8_block block =
                quantized_rows(n, width, padded_stride(width), g, to_int8_row_reference);
            const u8_queries q = random_u8_queries(width, k().u8s8_input_max, g);
            const auto bias = random_vector(n, g, nan_f);
            auto call = [&](const kernel_table& kt, uint32_t first, uint32_t count, const float* b,
                            float* out) {
                kt.dots16_u8s8(block.row(first), block.stride, width, count, q.xq.data(),
                               block.scale.data() + first, block.sum.data() + first, q.scale.data(),
                               q.zero.data(), b ? b + first : nullptr, out);
            };
            for (int use_bias = 0; use_bias < 2; ++use_bias) {
                SCOPED_TRACE(use_bias ? "bias" : "no bias");
                const float* b = use_bias ? bias.data() : nullptr;
                guarded<float> got(size_t(n) * 16, canary_f), want(size_t(n) * 16, canary_f);
                call(k(), 0, n, b, got.data());
                call(ref(), 0, n, b, want.data());
                EXPECT_TRUE(all_close(got.data(), want.data(), got.size(), [&](size_t e) {
                    return u8s8_bound(block, q, b, e / 16, uint32_t(e % 16));
                }));
                EXPECT_TRUE(got.guards_intact());

                block.fill_padding(int8_t(0x80));
                guarded<float> again(size_t(n) * 16, canary_f);
                call(k(), 0, n, b, again.data());
                block.fill_padding(int8_t{0x7f});
                for (size_t e = 0; e < got.size(); ++e)
                    ASSERT_EQ(bits_of(again[e]), bits_of(got[e]))
                        << "the padding past width changed row " << e / 16 << ", input " << e % 16;

                // A row's scores do not depend on where it falls in a call (exact scoring
                // splits the rows into blocks; the kernel into blocks of rows and a rest): the
                // rows from `skip` on, scored by a call of their own, bit for bit.
                const uint32_t skip = n / 3 + 1;
                if (skip >= n) continue;
                guarded<float> rest(size_t(n - skip) * 16, canary_f);
                call(k(), skip, n - skip, b, rest.data());
                size_t moved = 0;
                std::ostringstream first;
                for (size_t e = 0; e < rest.size(); ++e) {
                    const float alone = rest[e], in_call = got[size_t(skip) * 16 + e];
                    if (bits_of(alone) == bits_of(in_call)) continue;
                    if (moved++ == 0)
                        first << "row " << skip + e / 16 << ", input " << e % 16 << ": "
                              << std::hexfloat << in_call << " in the whole call, " << alone
                              << " from row " << skip << " on" << std::defaultfloat;
                }
                EXPECT_EQ(moved, 0u) << "of " << rest.size()
                                     << " scores, these moved with the row's position in the "
                                        "call; the first: "
                                     << first.str();
                EXPECT_TRUE(rest.guards_intact());
            }
        }
    }
}

TEST_P(kernel_level, dots16_u8s8_reads_nothing_past_its_buffers) {
    // Rows packed with no padding (stride = width) and every buffer (rows, inputs, scales, sums,
    // zero points, bias, out) ending where an inaccessible page begins: reading a byte past
    // the last row's `width`, past the inputs' last four, or writing past out faults.
    if (const char* why = no_u8s8_reason(k()))
        GTEST_SKIP() << k().name << ": no dots16_u8s8 (" << why << ")";
    rng g = gen(21);
    for (uint32_t width : u8s8_widths) {
        for (uint32_t n : {1u, 7u, 8u, 9u, 17u}) {
            SCOPED_TRACE("width = " + std::to_string(width) + ", n = " + std::to_string(n));
            const int8_block block = quantized_rows(n, width, width, g, to_int8_row_reference);
            const u8_queries q = random_u8_queries(width, k().u8s8_input_max, g);
            const auto bias = random_vector(n, g, nan_f);
            page_end_buffer<int8_t> rows(block.data.data(), block.data.size());
            page_end_buffer<uint8_t> xq(q.xq.data(), q.xq.size());
            page_end_buffer<float> row_scale(block.scale.data(), n),
                query_scale(q.scale.data(), 16), b(bias.data(), n);
            page_end_buffer<int32_t> row_sum(block.sum.data(), n), query_zero(q.zero.data(), 16);
            page_end_buffer<float> got(size_t(n) * 16);
            std::vector<float> want(size_t(n) * 16);
            k().dots16_u8s8(rows.data(), width, width, n, xq.data(), row_scale.data(),
                            row_sum.data(), query_scale.data(), query_zero.data(), b.data(),
                            got.data());
            ref().dots16_u8s8(block.data.data(), width, width, n, q.xq.data(), block.scale.data(),
                              block.sum.data(), q.scale.data(), q.zero.data(), bias.data(),
                              want.data());
            EXPECT_TRUE(all_close(got.data(), want.data(), want.size(), [&](size_t e) {
                return u8s8_bound(block, q, bias.data(), e / 16, uint32_t(e % 16));
            }));
        }
    }
}

TEST_P(kernel_level, dots16_u8s8_extremes_at_max_width) {
    // width 65536, the most the doc allows: rows all +127, all -127 or random +-127, inputs all
    // at the level's u8s8_input_max (255: vpdpbusd; 15: avx2), all 0 or random 0 / max, zero
    // points 0 or max, so that acc, zero * row_sum and their difference reach +-max * 127 *
    // 65536 (at 255 +-2,122,383,360, just under 2^31; at 15 avx2's 16-bit sums of eight fours'
    // pairs at their largest, 30,480). Scales 1, no bias: every score is float(c) of the exact
    // int64 c, bit for bit, at every level and in the reference.
    if (const char* why = no_u8s8_reason(k()))
        GTEST_SKIP() << k().name << ": no dots16_u8s8 (" << why << ")";
    rng g = gen(22);
    const uint8_t max = k().u8s8_input_max;
    constexpr uint32_t width = 65536, n = 9;  // a block of 8 rows and one alone
    std::vector<int8_t> rows(size_t(n) * width);
    std::vector<int32_t> row_sum(n);
    for (uint32_t a = 0; a < n; ++a) {
        int64_t s = 0;
        for (uint32_t i = 0; i < width; ++i) {
            const int8_t v = a % 3 == 0 ? 127 : a % 3 == 1 ? -127 : (g.below(2) ? 127 : -127);
            rows[size_t(a) * width + i] = v;
            s += v;
        }
        row_sum[a] = int32_t(s);
    }
    u8_queries q{width,
                 {},
                 std::vector<uint8_t>(fours_bytes(width)),
                 std::vector<float>(16, 1.0f),
                 std::vector<int32_t>(16)};
    for (uint32_t j = 0; j < 16; ++j) {
        q.zero[j] = (j / 4) % 2 ? max : 0;
        for (uint32_t i = 0; i < width; ++i)
            q.xq[(i / 4) * 64 + j * 4 + i % 4] = j % 4 == 0   ? max
                                                 : j % 4 == 1 ? 0
                                                              : (g.below(2) ? max : 0);
    }
    const std::vector<float> row_scale(n, 1.0f);
    for (const kernel_table* kt : {&k(), &ref()}) {
        SCOPED_TRACE(kt->name);
        guarded<float> got(size_t(n) * 16, canary_f);
        kt->dots16_u8s8(rows.data(), width, width, n, q.xq.data(), row_scale.data(), row_sum.data(),
                        q.scale.data(), q.zero.data(), nullptr, got.data());
        for (uint32_t a = 0; a < n; ++a)
            for (uint32_t j = 0; j < 16; ++j) {
                int64_t c = 0;
                for (uint32_t i = 0; i < width; ++i)
                    c += (int64_t(q.at(i, j)) - q.zero[j]) * rows[size_t(a) * width + i];
                ASSERT_LE(std::abs(c), int64_t(max) * 127 * width);
                ASSERT_EQ(bits_of(got[size_t(a) * 16 + j]), bits_of(float(c)))
                    << "row " << a << ", input " << j << ": got " << got[size_t(a) * 16 + j]
                    << ", want " << c;
            }
        EXPECT_TRUE(got.guards_intact());
    }
}

/// 16 inputs quantized to u8 in [0, levels] (the kernels' u8s8_input_max) from fp32: ReLU
/// outputs (N(0, 1) clipped at 0) with scale max / levels and zero point 0, or (affine) N(0, 1)
/// plus a shift, with scale (max - min) / levels and zero point round(-min / scale) over the
/// range widened to hold 0 (so the zero point is in [0, levels]). u = clamp(round(x / scale) +
/// zero, 0, levels), each input of its own magnitude.
u8_queries quantized_queries(uint32_t width, bool affine, uint8_t levels, rng& g) {
    u8_queries q{width, std::vector<float>(size_t(16) * width),
                 std::vector<uint8_t>(fours_bytes(width), 0), std::vector<float>(16),
                 std::vector<int32_t>(16)};
    for (uint32_t j = 0; j < 16; ++j) {
        const float magnitude = std::ldexp(1.0f, int(g.below(5)) - 2);
        const float shift = affine ? magnitude * (2.0f * g.uniform() - 1.0f) : 0.0f;
        float* x = q.fp32.data() + size_t(j) * width;
        float lo = 0.0f, hi = 0.0f;
        for (uint32_t i = 0; i < width; ++i) {
            const float v = normal(g, magnitude) + shift;
            x[i] = affine ? v : std::max(0.0f, v);
            lo = std::min(lo, x[i]);
            hi = std::max(hi, x[i]);
        }
        q.scale[j] = hi > lo ? float((double(hi) - double(lo)) / levels) : 1.0f;
        q.zero[j] = int32_t(std::nearbyint(-double(lo) / q.scale[j]));
        for (uint32_t i = 0; i < width; ++i) {
            const double u = std::nearbyint(double(x[i]) / q.scale[j]) + q.zero[j];
            q.xq[(i / 4) * 64 + j * 4 + i % 4] = uint8_t(std::clamp(u, 0.0, double(levels)));
        }
    }
    return q;
}

/// Every score of `dots` over rows quantized by `quantize` and inputs by quantized_queries,
/// against the fp32 product (in double) within the quantizations' worst-case error:
///
/// Write x for an input, w for a row, x^ = s_x (u - z) and w^ = s_w q for their quantizations
/// (s_x the query scale, s_w the row scale) and f = x - x^, e = w - w^. Rounding to nearest
/// gives |f_i| <= s_x / 2 (lo <= 0 <= hi and |lo / s_x + z| <= 1/2 put every x / s_x + z in
/// [-1/2, levels + 1/2], so the clamp to [0, levels] moves nothing by more than half a step) and
/// |e_i| <= s_w / 2 (to_int8_row_properties). The kernel
/// computes sum_i x^_i w^_i = s_x s_w sum_i (u_i - z) q_i, and
///     x.w - x^.w^ = x.e + f.w - f.e,
///     |x.w - x^.w^| <= s_w/2 sum|x_i| + s_x/2 sum|w_i| + width s_x s_w / 4.
/// The factor 1.01 covers the few float roundings inside the quantizers (scales and inverses
/// rounded to float: a relative 1e-4 at most, see to_int8_row_properties); 1e-6 of
/// (1 + |bias| + sum|x_i w_i|) covers the kernel's float epilogue (float(c), the product of the
/// scales, the multiply and the bias add: ~4 roundings of 6e-8 of the magnitude). A kernel that
/// dropped the zero point's correction (z * row_sum, z ~ 128 here with affine inputs) is off by
/// z s_x s_w |row_sum| = z s_x |sum_i w^_i|, far beyond the bound (checked below); one that
/// misread the fours layout, or a scale, is off by the order of the product itself.
::testing::AssertionResult u8s8_end_to_end(u8s8_fn dots, to_int8_fn quantize, uint8_t levels,
                                           bool affine, rng& g) {
    for (uint32_t width : u8s8_widths) {
        constexpr uint32_t n = 17;
        const int8_block rows = quantized_rows(n, width, padded_stride(width), g, quantize);
        const u8_queries q = quantized_queries(width, affine, levels, g);
        const auto bias = random_vector(n, g, nan_f);
        for (int use_bias = 0; use_bias < 2; ++use_bias) {
            std::vector<float> out(size_t(n) * 16);
            dots(rows.data.data(), rows.stride, width, n, q.xq.data(), rows.scale.data(),
                 rows.sum.data(), q.scale.data(), q.zero.data(), use_bias ? bias.data() : nullptr,
                 out.data());
            for (uint32_t a = 0; a < n; ++a) {
                for (uint32_t j = 0; j < 16; ++j) {
                    const double b = use_bias ? double(bias[a]) : 0.0;
                    double exact = b, sum_x = 0, sum_w = 0, mag = 0;
                    for (uint32_t i = 0; i < width; ++i) {
                        const double x = q.fp32[size_t(j) * width + i];
                        const double w = rows.fp32[size_t(a) * width + i];
                        exact += x * w;
                        sum_x += std::fabs(x);
                        sum_w += std::fabs(w);
                        mag += std::fabs(x * w);
                    }
                    const double s_w = rows.scale[a], s_x = q.scale[j];
                    const double bound =
                        1.01 * (s_w / 2 * sum_x + s_x / 2 * sum_w + width * s_x * s_w / 4) +
                        1e-6 * (1 + std::fabs(b) + mag);
                    const double err = std::fabs(double(out[size_t(a) * 16 + j]) - exact);
                    if (!(err <= bound))
                        return ::testing::AssertionFailure()
                               << (affine ? "affine" : "ReLU") << " inputs, width " << width
                               << (use_bias ? ", bias" : "") << ", row " << a << ", input " << j
                               << " (zero point " << q.zero[j] << "): score "
                               << out[size_t(a) * 16 + j] << ", fp32 product " << exact
                               << ", error " << err << " > bound " << bound;
                }
            }
        }
    }
    return ::testing::AssertionSuccess();
}

TEST_P(kernel_level, dots16_u8s8_end_to_end) {
    // The level's to_int8_row and dots16_u8s8 on random fp32 rows and inputs: every score
    // within the quantizations' worst-case error of the fp32 product (u8s8_end_to_end).
    if (const char* why = no_u8s8_reason(k()))
        GTEST_SKIP() << k().name << ": no dots16_u8s8 (" << why << ")";
    rng g = gen(23);
    for (int affine = 0; affine < 2; ++affine) {
        EXPECT_TRUE(
            u8s8_end_to_end(k().dots16_u8s8, k().to_int8_row, k().u8s8_input_max, affine, g))
            << (affine ? "affine" : "ReLU");
    }
}

/// dots16_u8s8's definition with the zero point's correction left out (a plausible bug).
void dots16_u8s8_without_zero_point(const int8_t* rows, size_t stride, uint32_t width, uint32_t n,
                                    const uint8_t* xq, const float* row_scale,
                                    const int32_t* row_sum, const float* query_scale,
                                    const int32_t*, const float* bias, float* out) {
    const int32_t zeros[16] = {};
    scalar_kernels().dots16_u8s8(rows, stride, width, n, xq, row_scale, row_sum, query_scale, zeros,
                                 bias, out);
}

TEST(int8_reference, dots16_u8s8_end_to_end_bound_is_tight) {
    // The scalar definition passes the end-to-end bound; without the zero point's correction it
    // fails on affine inputs (zero points ~128). On ReLU inputs the zero point is 0 and the
    // correction vanishes: the same broken kernel passes there, as it should.
    rng g(derive_seed(0x696e7438, 4));
    const kernel_table& ref = scalar_kernels();
    for (int affine = 0; affine < 2; ++affine)
        EXPECT_TRUE(u8s8_end_to_end(ref.dots16_u8s8, ref.to_int8_row, 255, affine, g))
            << (affine ? "affine" : "ReLU");
    EXPECT_FALSE(u8s8_end_to_end(dots16_u8s8_without_zero_point, ref.to_int8_row, 255, true, g));
    EXPECT_TRUE(u8s8_end_to_end(dots16_u8s8_without_zero_point, ref.to_int8_row, 255, false, g));
}

// --- the scalar bf16 conversion --------------------------------------------------------------

TEST(bf16, float_to_bf16_edge_cases) {
    for (const bf16_case& c : bf16_cases)
        EXPECT_EQ(float_to_bf16(float_of(c.in)), c.out)
            << std::hex << "input 0x" << c.in << " (" << c.what << ")";
}

TEST(bf16, round_trip_of_every_bf16_value) {
    for (uint32_t h = 0; h <= 0xffffu; ++h) {
        const bf16 b = static_cast<bf16>(h);
        const float f = bf16_to_float(b);
        ASSERT_EQ(bits_of(f), h << 16) << std::hex << "bf16_to_float(0x" << h << ")";
        const bool is_nan = (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0;
        ASSERT_EQ(std::isnan(f), is_nan) << std::hex << "0x" << h;
        if (is_nan) {
            // NaN stays NaN, sign and payload kept, quiet bit set.
            ASSERT_EQ(float_to_bf16(f), static_cast<bf16>(h | 0x0040u)) << std::hex << "0x" << h;
        } else {
            ASSERT_EQ(float_to_bf16(f), b) << std::hex << "0x" << h;
        }
    }
}

TEST(bf16, float_to_bf16_matches_a_double_rounding_reference) {
    // An independent definition for finite values: round to the nearest bf16 (ties to the even
    // one) by comparing distances in double, where both neighbours are exact.
    rng g(derive_seed(0xbf16, 1));
    for (int trial = 0; trial < 100000; ++trial) {
        const uint32_t u = random_float_bits(g);
        const float x = float_of(u);
        if (!std::isfinite(x)) continue;
        const bf16 down = static_cast<bf16>(u >> 16);  // toward zero
        const bf16 up = static_cast<bf16>(down + 1);   // away from zero (may be infinity)
        const double d_down = std::fabs(double(x) - double(bf16_to_float(down)));
        // IEEE rounding overflows to infinity exactly when the value, rounded with an unbounded
        // exponent, would be 2^128: so infinity stands for 2^128 in the distance.
        const double up_value = (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), x)
                                                          : double(bf16_to_float(up));
        const double d_up = std::fabs(up_value - double(x));
        bf16 want;
        if (d_down < d_up)
            want = down;
        else if (d_up < d_down)
            want = up;
        else
            want = (down & 1u) ? up : down;
        ASSERT_EQ(float_to_bf16(x), want) << std::hex << "input 0x" << u;
    }
}

// --- ISA selection ---------------------------------------------------------------------------

constexpr isa_level all_levels[] = {isa_level::scalar, isa_level::avx2, isa_level::avx512,
                                    isa_level::avx512bf16, isa_level::amx};

/// Restores HSLIDE_ISA and clears any forced level when the test ends, pass or fail.
class isa_state_guard {
  public:
    isa_state_guard() {
        if (const char* env = std::getenv("HSLIDE_ISA")) saved_ = std::string(env);
        clear_active_isa();
    }
    ~isa_state_guard() {
        clear_active_isa();
        if (saved_)
            setenv("HSLIDE_ISA", saved_->c_str(), 1);
        else
            unsetenv("HSLIDE_ISA");
    }
    isa_state_guard(const isa_state_guard&) = delete;
    isa_state_guard& operator=(const isa_state_guard&) = delete;

  private:
    std::optional<std::string> saved_;
};

TEST(isa, names_round_trip) {
    EXPECT_STREQ(to_string(isa_level::scalar), "scalar");
    EXPECT_STREQ(to_string(isa_level::avx2), "avx2");
    EXPECT_STREQ(to_string(isa_level::avx512), "avx512");
    EXPECT_STREQ(to_string(isa_level::avx512bf16), "avx512bf16");
    EXPECT_STREQ(to_string(isa_level::amx), "amx");
    for (isa_level level : all_levels) EXPECT_EQ(parse_isa(to_string(level)), level);
    EXPECT_THROW(parse_isa("sse9"), hslide::error);
    EXPECT_THROW(parse_isa(""), hslide::error);
}

TEST(isa, levels_are_ordered_and_scalar_is_always_supported) {
    EXPECT_TRUE(isa_supported(isa_level::scalar));
    EXPECT_TRUE(isa_supported(detected_isa()));
    bool supported = true;
    for (isa_level level : all_levels) {
        // Once a level is unsupported, every later one is too.
        if (!isa_supported(level)) supported = false;
        EXPECT_EQ(isa_supported(level), supported) << to_string(level);
    }
}

TEST(isa, kernel_tables_name_their_level) {
    for (isa_level level : all_levels) {
        if (!isa_supported(level)) {
            EXPECT_THROW(kernels_for(level), hslide::error) << to_string(level);
            continue;
        }
        EXPECT_EQ(kernels_for(level).level, level);
        EXPECT_STREQ(kernels_for(level).name, to_string(level));
    }
    EXPECT_EQ(scalar_kernels().level, isa_level::scalar);
    EXPECT_STREQ(scalar_kernels().name, "scalar");
}

TEST(isa, forced_level) {
    isa_state_guard guard;
    unsetenv("HSLIDE_ISA");
    EXPECT_EQ(active_isa(), detected_isa());
    set_active_isa(detected_isa());
    EXPECT_EQ(active_isa(), detected_isa());
    for (isa_level level : all_levels) {
        if (isa_supported(level)) {
            set_active_isa(level);
            EXPECT_EQ(active_isa(), level);
            EXPECT_EQ(best_kernels().level, level);
        } else {
            EXPECT_THROW(set_active_isa(level), hslide::error) << to_string(level);
        }
    }
    if (detected_isa() < isa_level::avx512bf16) {
        EXPECT_THROW(set_active_isa(isa_level::avx512bf16), hslide::error);
    }
    clear_active_isa();
    EXPECT_EQ(active_isa(), detected_isa());
    EXPECT_EQ(best_kernels().level, detected_isa());
}

TEST(isa, environment_variable) {
    isa_state_guard guard;
    setenv("HSLIDE_ISA", "scalar", 1);
    EXPECT_EQ(active_isa(), isa_level::scalar);
    EXPECT_EQ(best_kernels().level, isa_level::scalar);

    // A forced level wins over the environment; clearing it hands the choice back.
    set_active_isa(detected_isa());
    EXPECT_EQ(active_isa(), detected_isa());
    clear_active_isa();
    EXPECT_EQ(active_isa(), isa_level::scalar);

    setenv("HSLIDE_ISA", "bogus", 1);
    EXPECT_THROW(active_isa(), hslide::error);

    // An empty value counts as unset.
    setenv("HSLIDE_ISA", "", 1);
    EXPECT_EQ(active_isa(), detected_isa());

    for (isa_level level : all_levels) {
        setenv("HSLIDE_ISA", to_string(level), 1);
        if (isa_supported(level)) {
            EXPECT_EQ(active_isa(), level) << to_string(level);
        } else {
            EXPECT_THROW(active_isa(), hslide::error) << to_string(level);
        }
    }

    unsetenv("HSLIDE_ISA");
    EXPECT_EQ(active_isa(), detected_isa());
}

}  // namespace
