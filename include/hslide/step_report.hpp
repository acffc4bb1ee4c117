// What a training step reports: its samples, loss, active neurons and the time of each stage.
#pragma once

#include <cstdint>
#include <vector>

namespace hslide {

/// Seconds spent in each stage of a step (for breakdowns and benchmarks).
struct stage_times {
    double hashing = 0;      ///< LSH codes of the layer inputs
    double active_sets = 0;  ///< active-set queries: bucket unions, forced labels, random fill
    double forward = 0;      ///< forward pass (dot products, softmax, loss)
    double backward = 0;     ///< backpropagation of deltas
    double update = 0;       ///< gradient reduction and the optimizer
    double rebuild = 0;      ///< table rebuilds
    double transfer = 0;     ///< host<->device copies (GPU backends), collectives across ranks
    double average = 0;      ///< the weight average's ticks, and its swaps in and out for scoring

    stage_times& operator+=(const stage_times& o);
    double total() const {
        return hashing + active_sets + forward + backward + update + rebuild + transfer + average;
    }
};

/// What one training step did.
struct step_report {
    uint32_t samples = 0;
    double loss_sum = 0;                     ///< summed over the batch's samples
    std::vector<uint64_t> active_per_layer;  ///< neurons computed, summed over samples
    /// Samples whose loss is the exact full-softmax cross-entropy (a top-k output layer, which
    /// knows the log-partition over every neuron), and the softmax mass of the output rows
    /// their active sets left out (whose gradient was dropped), summed over them.
    uint64_t full_softmax_samples = 0;
    double dropped_mass_sum = 0;
    /// The share of the output layer's rows each reported step's update touched, summed over
    /// the steps, and the steps counted (0 when the backend does not count them).
    double output_touched_share_sum = 0;
    uint64_t steps_counted = 0;
    stage_times times;
    double seconds = 0;  ///< wall time of the step
    /// A sharded step's collectives across ranks (shard_comm.hpp): how many, and the bytes this
    /// rank received (times.transfer holds their seconds).
    uint64_t collectives = 0;
    uint64_t transfer_bytes = 0;

    /// Sums another report into this one (per-layer counts elementwise).
    step_report& operator+=(const step_report& o);
};

}  // namespace hslide
