// The AMX level: the avx512bf16 kernels, with exact scoring's bf16 product (dots16_bf16) done by
// AMX-BF16 tile products. CMake compiles this file alone with -mamx-tile -mamx-bf16; isa.cpp
// picks the level only where amx_usable() (the CPU has the tiles and the OS granted them).
//
// One tdpbf16ps multiplies a tile of 16 rows x 32 bf16 elements by one of 16 pair-rows x 16
// queries (the queries' pair layout of dots16_bf16 is the tile's: pair-row p holds element pair p
// of the 16 queries), adding 16 x 16 fp32 sums: 8,192 products an instruction where vdpbf16ps
// does 32. The row tile is loaded where the rows lie (their stride is the tile's); the sums tile
// is stored straight into out's row-major 16-wide layout.
#include "kernels.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace hslide::cpu {

const kernel_table& avx512bf16_kernels();

namespace {

/// The tile configuration (palette 1) in the layout ldtilecfg reads.
struct alignas(64) tile_config {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};

// Tiles: 0-3 sums of 4 row tiles (64 rows), 4 a row tile, 5 the queries' pair-rows, 6 and 7 the
// same two for the width's last 2-30 elements (a shorter tile).
constexpr int rows_per_pass = 64;

/// The configuration for passes whose row tiles (and sums) have `m` rows, 1..16, at a width
/// whose last `tail` elements (0..30, even) make the short tiles 6 and 7.
tile_config configure(uint32_t m, uint32_t tail) {
    tile_config config;
    for (int t = 0; t < 6; ++t) {
        config.rows[t] = uint8_t(t == 5 ? 16 : m);
        config.bytes_per_row[t] = 64;
    }
    if (tail > 0) {
        config.rows[6] = uint8_t(m);
        config.bytes_per_row[6] = uint16_t(tail * 2);
        config.rows[7] = uint8_t(tail / 2);
        config.bytes_per_row[7] = 64;
    }
    return config;
}

/// Adds bias[a] to the 16 sums of each of rows [0, m) of o.
void add_bias(float* o, const float* bias, uint32_t m) {
    for (uint32_t a = 0; a < m; ++a)
        _mm512_storeu_ps(o + size_t(a) * 16, _mm512_add_ps(_mm512_loadu_ps(o + size_t(a) * 16),
                                                           _mm512_set1_ps(bias[a])));
}

void dots16_amx(const bf16* rows, size_t stride, uint32_t width, uint32_t n, const bf16* xp,
                const float* bias, float* out) {
    // An odd width would need a tile that reads one element past it: the vdpbf16ps kernel
    // takes it whole.
    if (width % 2 != 0 || n == 0)
        return avx512bf16_kernels().dots16_bf16(rows, stride, width, n, xp, bias, out);
    const uint32_t full = width / 32 * 32, tail = width - full;
    const size_t row_bytes = stride * sizeof(bf16);
    tile_config config = configure(16, tail);
    _tile_loadconfig(&config);
    const uint32_t passes = n / rows_per_pass;
    for (uint32_t pass = 0; pass < passes; ++pass) {
        const uint32_t a0 = pass * rows_per_pass;
        const bf16* w = rows + size_t(a0) * stride;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (uint32_t k0 = 0; k0 < full; k0 += 32) {
            _tile_loadd(5, xp + size_t(k0 / 2) * 32, 64);
            _tile_loadd(4, w + k0, row_bytes);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(4, w + 16 * stride + k0, row_bytes);
            _tile_dpbf16ps(1, 4, 5);
            _tile_loadd(4, w + 32 * stride + k0, row_bytes);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(4, w + 48 * stride + k0, row_bytes);
            _tile_dpbf16ps(3, 4, 5);
        }
        // The same products through the short tiles (GCC's tile intrinsics paste their
        // tile numbers into the assembly: they must be literals, not parameters).
        if (tail > 0) {
            _tile_loadd(7, xp + size_t(full / 2) * 32, 64);
            _tile_loadd(6, w + full, row_bytes);
            _tile_dpbf16ps(0, 6, 7);
            _tile_loadd(6, w + 16 * stride + full, row_bytes);
            _tile_dpbf16ps(1, 6, 7);
            _tile_loadd(6, w + 32 * stride + full, row_bytes);
            _tile_dpbf16ps(2, 6, 7);
            _tile_loadd(6, w + 48 * stride + full, row_bytes);
            _tile_dpbf16ps(3, 6, 7);
        }
        float* o = out + size_t(a0) * 16;
        _tile_stored(0, o, 64);
        _tile_stored(1, o + 16 * 16, 64);
        _tile_stored(2, o + 32 * 16, 64);
        _tile_stored(3, o + 48 * 16, 64);
        if (bias) add_bias(o, bias + a0, rows_per_pass);
    }
    // The rest a tile at a time, the last one shorter: every row is summed by the tiles in the
    // same order wherever it falls in a call, so a row's score does not depend on how the rows
    // were split into calls (vdpbf16ps rounds some rows' sums an ulp apart from the tiles: exact
    // scoring's blocks moved scores in its top k).
    for (uint32_t a0 = passes * rows_per_pass; a0 < n; a0 += 16) {
        const uint32_t m = std::min(16u, n - a0);
        if (m < 16) {
            config = configure(m, tail);
            _tile_loadconfig(&config);
        }
        const bf16* w = rows + size_t(a0) * stride;
        _tile_zero(0);
        for (uint32_t k0 = 0; k0 < full; k0 += 32) {
            _tile_loadd(5, xp + size_t(k0 / 2) * 32, 64);
            _tile_loadd(4, w + k0, row_bytes);
            _tile_dpbf16ps(0, 4, 5);
        }
        if (tail > 0) {
            _tile_loadd(7, xp + size_t(full / 2) * 32, 64);
            _tile_loadd(6, w + full, row_bytes);
            _tile_dpbf16ps(0, 6, 7);
        }
        float* o = out + size_t(a0) * 16;
        _tile_stored(0, o, 64);
        if (bias) add_bias(o, bias + a0, m);
    }
    _tile_release();
}

}  // namespace

const kernel_table& amx_kernels() {
    static const kernel_table table = [] {
        kernel_table t = avx512bf16_kernels();
        t.name = "amx";
        t.level = isa_level::amx;
        t.dots16_bf16 = dots16_amx;
        // The tiles' bf16 products outrun vpdpbusd's int8 ones several times over: an exact
        // search here scores a bf16 copy (exact_top_k).
        t.dots16_u8s8 = nullptr;
        return t;
    }();
    return table;
}

}  // namespace hslide::cpu
