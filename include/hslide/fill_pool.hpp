// The random fill's pool: the rows that one training step's top-k sets draw their random
// neurons from (layer_config::fill_pool), shared by the CPU and the GPU backends.
//
// A pool smaller than the layer bounds the rows a step touches, and with them the row-sparse
// Adam update, whatever the fill's size: a batch of 256 filled to 1,024 neurons from all of
// a 670k-row layer touches 31% of it, from a pool of a fifth of the rows 16%.
// The pool is stored nowhere: entry i of a step's pool is a hash of (seed, i), so a draw
// picks an entry index and hashes it, on the host and in a kernel alike.
#pragma once

#include "hslide/rng.hpp"

#include <algorithm>
#include <cstdint>

namespace hslide {

/// One step's pool: `size` entries, entry i being row fill_pool_row(seed, i, rows) (drawn
/// with replacement, so a few rows appear twice). size 0: no pool, the fill draws from the
/// whole layer.
struct fill_pool {
    uint64_t seed = 0;
    uint32_t size = 0;
};

/// Entry i of the pool with this seed, over a layer of `rows` rows.
constexpr uint32_t fill_pool_row(uint64_t seed, uint32_t i, uint32_t rows) {
    return uint32_t(((splitmix64(seed + i) >> 32) * rows) >> 32);
}

/// Entries of the pool for `share` (0..1) of a layer of `rows` rows whose sets are filled to
/// `fill` neurons: at least 4 * fill, so that a sample's draws rarely meet a row twice; 0 (no
/// pool) where share is 0 or the pool would hold as many entries as the layer has rows.
inline uint32_t fill_pool_size(float share, uint32_t rows, uint32_t fill) {
    if (share <= 0.0f) return 0;
    const uint64_t size = std::max<uint64_t>(uint64_t(double(share) * rows), uint64_t{4} * fill);
    return size >= rows ? 0 : uint32_t(size);
}

}  // namespace hslide
