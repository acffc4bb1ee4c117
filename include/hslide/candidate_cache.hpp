// A top-k output layer's reused candidates (train_config::reuse_candidates_steps): each
// training point's top-k rows as its last search found them, and the step of that search. It is
// training state, like Adam's: a checkpoint carries it, so that a resumed run reuses what the
// uninterrupted run would and ends bit for bit as it does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hslide {

struct candidate_cache {
    /// Candidates a point keeps (the layer's top-k); 0: an empty cache.
    uint32_t width = 0;
    /// Point p's candidates at ids[p * width..], best first (UINT32_MAX pads a short list).
    std::vector<uint32_t> ids;
    /// The training step (the model's Adam step) of point p's search; never_searched where
    /// the point has no candidates kept.
    std::vector<uint64_t> steps;
    static constexpr uint64_t never_searched = ~uint64_t(0);

    bool empty() const { return width == 0; }
    /// Points it has room for.
    size_t points() const { return steps.size(); }
};

}  // namespace hslide
