// The named seed streams of a training run: one place for every purpose a backend draws
// random numbers for, so that the CPU and the GPU backends derive the same seeds.
//
// Every random decision of a step derives its seed from the user's --seed, a purpose and the
// model's Adam step: step_seed(seed, purpose, step) = derive_seed(seed ^ purpose, step). A
// resumed run (whose step is restored) therefore draws exactly what the uninterrupted run
// drew, and two backends with the same seed and step draw the same numbers. The values are
// arbitrary but fixed: changing one changes every trained model, so they never move.
#pragma once

#include "hslide/rng.hpp"

#include <cstdint>

namespace hslide {

/// What a step's random numbers are for.
enum class seed_stream : uint64_t {
    /// The per-sample generators of a training step: sample s of the step draws its active
    /// sets' random fills from rng(derive_seed(step_seed(.., train_sample, step), s)).
    train_sample = 0x5eedf111ULL,
    /// The fill pool of a training step (fill_pool.hpp).
    fill_pool = 0xf111b001ULL,
    /// Prediction's random fills (LSH sets): point i of a chunk beginning at `begin` draws
    /// from derive_seed(step_seed(.., predict, step), begin + i).
    predict = 0x9e3d1c7ULL,
    /// The IVF index's k-means initialisation when it is built.
    ivf_build = 0x1f1dc0deULL,
    /// measure_selection's random fills (selection_quality.hpp).
    selection_probe = 0x5e1ec7ULL,
    /// --adam-moments bf16: the stochastic roundings of a layer's moments.
    bf16_moments = 0xada3b16ULL,
};

/// The seed of stream `purpose` at Adam step `step` of a run seeded with `seed`.
constexpr uint64_t step_seed(uint64_t seed, seed_stream purpose, uint64_t step) {
    return derive_seed(seed ^ static_cast<uint64_t>(purpose), step);
}

}  // namespace hslide
