// The top-k sets' random fill, written once for the host and the kernels: the draws of the
// CPU backend's add_random_fill (src/cpu/cpu_backend_selection.cpp), so that the GPU's sets
// are the CPU's. Per sample s of a step, from rng(derive_seed(sample_seed, s)) with
// sample_seed = step_seed(seed, seed_stream::train_sample, step): rejection draws, first of
// uniform entries of the step's pool (fill_pool.hpp; at most 64 x target of them, and only
// where the step has a pool), then of uniform rows of the whole layer, each kept unless the
// set has it already (labels, top-k, earlier fill). The caller sorts the fill afterwards.
// One thread a sample: the draws are sequential (each depends on what came before through
// the membership test); tests/test_gpu_fill.cpp checks the sets against the CPU backend's.
#pragma once

#include "host_device.hpp"
#include "hslide/fill_pool.hpp"
#include "hslide/rng.hpp"

#include <cstdint>

namespace hslide::gpu {

/// Draws until the set holds `target` ids (it holds `have` now; target <= rows). `insert(id)`
/// adds id to the set and returns true if it was not there yet (the caller appends it to the
/// fill), false if it was. Returns the number of ids drawn (accepted or not).
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

}  // namespace hslide::gpu
