// A top-k layer's training set from its candidates: the labels, the candidates, the random
// fill. One routine for the CPU's selection and the GPU backend's ranks (which build their sets
// on the host from the ranks' merged candidates), so that both draw the same sets.
#pragma once

#include "hslide/dataset.hpp"
#include "hslide/fill_pool.hpp"
#include "hslide/rng.hpp"

#include <cstdint>
#include <vector>

namespace hslide::cpu {

/// The marks build_top_k_set keeps between calls (one per thread): a row is in the set being
/// built when its stamp is the current one.
struct set_member_marks {
    std::vector<uint32_t> stamp;
    uint32_t current = 0;
};

/// A training set of a top-k layer of `rows` rows from candidates best[0..k) (ranked, padded
/// with UINT32_MAX): `labels` first, then the other candidates in increasing id order, then,
/// while the set is under `fill`, random rows drawn from `pool` (size 0: the whole layer) by
/// `gen` (fill_pool.hpp's draw_fill), in increasing id order. Returns where the fill begins.
uint32_t build_top_k_set(const uint32_t* best, uint32_t k, const label_row& labels, uint32_t fill,
                         const fill_pool& pool, uint32_t rows, rng& gen, set_member_marks& marks,
                         std::vector<uint32_t>& ids);

}  // namespace hslide::cpu
