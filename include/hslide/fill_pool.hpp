// The random fill's pool: the rows that one training step's top-k sets draw their random
// neurons from (layer_config::fill_pool), shared by the CPU and the GPU backends.
//
// A pool smaller than the layer bounds the rows a step touches, and with them the row-sparse
// Adam update: a batch of 256 filled to 1,024 neurons from all of a 670k-row layer touches 31%
// of it, from a pool of half as many entries as the step draws 16%. The pool grows with the
// batch, so a row is drawn about as often per epoch at any batch size (a pool of fixed size
// left most rows out of most of a large batch's few steps, and its first epoch learnt
// nothing). Where a step's draws would touch at most a fifth of the layer there is no pool:
// the update is small already, and a layer whose rows are drawn rarely needs every draw (at
// the Amazon-3M shape, 8% of the rows a step, a pool sank the first epoch's P@1 from 0.030 to
// 0.003; bench/topk.md). The pool is stored nowhere: entry i of a step's pool is a hash of
// (seed, i), so a draw picks an entry index and hashes it, on the host and in a kernel alike.
#pragma once

#include "hslide/host_device.hpp"
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
HSLIDE_HD constexpr uint32_t fill_pool_row(uint64_t seed, uint32_t i, uint32_t rows) {
    return uint32_t(((splitmix64(seed + i) >> 32) * rows) >> 32);
}

/// Entries of the pool of a step of `batch` samples whose sets are filled to `fill` neurons
/// from a layer of `rows` rows, for `per_draw` (layer_config::fill_pool) entries per neuron
/// the step could draw: per_draw * batch * fill, at least 4 * fill, so that a sample's draws
/// rarely meet a row twice. 0 (no pool) where per_draw is 0, where batch * fill uniform draws
/// would touch at most a fifth of the rows (1 - e^-(batch * fill / rows) <= 0.2), or where
/// the pool would hold as many entries as the layer has rows.
inline uint32_t fill_pool_size(float per_draw, uint32_t rows, uint32_t fill, uint32_t batch) {
    if (per_draw <= 0.0f) return 0;
    const double draws = double(batch) * fill;
    if (draws <= 0.2231435513142098 * rows) return 0;  // -ln(0.8): a fifth of the rows
    const uint64_t size =
        std::max<uint64_t>(uint64_t(double(per_draw) * batch * fill), uint64_t{4} * fill);
    return size >= rows ? 0 : uint32_t(size);
}

/// The random fill of a top-k set, the one routine the CPU backend and the GPU's kernel run (so
/// the GPU's sets are the CPU's): rejection draws from the sample's generator, first of uniform
/// entries of `pool` (at most 64 x target of them, and only where the step has a pool: a pool
/// is at least 4x the fill, so its draws end long before the bound), then of uniform rows of
/// the whole layer, until the set holds `target` ids (it holds `have` now; target <= rows).
/// `insert(id)` adds id to the set and returns true if it was not there yet, false if it was
/// (labels, top-k, earlier fill). Returns the number of ids drawn, accepted or not. The draws
/// are sequential (each depends on the ones before through the membership test): one thread a
/// sample.
template <class Insert>
HSLIDE_HD uint64_t draw_fill(rng& gen, const fill_pool& pool, uint32_t rows, uint32_t have,
                             uint32_t target, Insert&& insert) {
    uint64_t pool_draws = pool.size ? uint64_t{64} * target : 0;
    uint64_t drawn = 0;
    while (have < target) {
        uint32_t r;
        if (pool_draws > 0) {
            --pool_draws;
            r = fill_pool_row(pool.seed, uint32_t(gen.below(pool.size)), rows);
        } else {
            r = uint32_t(gen.below(rows));
        }
        ++drawn;
        if (insert(r)) ++have;
    }
    return drawn;
}

}  // namespace hslide
