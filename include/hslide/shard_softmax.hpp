// The set softmax and cross-entropy of a label-sharded output layer (issue 32, DESIGN.md "Past
// one device"): Megatron's vocab-parallel cross-entropy over a sample's active set, whose
// members are split across ranks. Each rank holds its members' logits; the softmax needs the
// set's maximum (all-reduced) and sum of exponentials (all-reduced in rank order), after which
// every rank writes its members' deltas and every rank computes the same loss. Host code over
// host arrays, shared by the CPU backend and the GPU backend's ranks (which stage their
// logits through the host), so that the two compute the same bits. The logistic loss
// (loss.hpp) needs no softmax: each member's delta is its own, and only the loss is summed.
#pragma once

#include "hslide/dataset.hpp"
#include "hslide/shard_comm.hpp"

#include <cstdint>
#include <vector>

namespace hslide {

/// One sample's part on this rank.
struct shard_softmax_sample {
    const float* logits = nullptr;  ///< this rank's members' logits
    float* delta = nullptr;         ///< out: softmax over the whole set minus the targets
    uint32_t members = 0;           ///< this rank's members of the sample's set
    /// This rank's labels as indices into its members, in the sample's label order; null: its
    /// first `label_members` members (a set built labels first).
    const uint32_t* label_index = nullptr;
    uint32_t label_members = 0;  ///< this rank's labels among its members
    uint32_t labels = 0;         ///< the sample's labels on every rank (0: not trained)
    /// The whole layer's log-partition (exact top-k), read when the loss is the full softmax's.
    double log_partition = 0;
    double loss = 0;          ///< out: the sample's cross-entropy (0 when not trained)
    double dropped_mass = 0;  ///< out: the full softmax's mass outside the set (full_partition)
};

/// The buffers sharded_set_softmax keeps between calls.
struct shard_softmax_scratch {
    std::vector<float> max;
    std::vector<double> sums;
};

/// Every-row layers (a rank's members are all its rows, indexed by row): for points[0..n) of
/// `data`, each point's labels that fall in the rank's rows [first, first + count), as rows of
/// the rank, in label order, into `rows`; point s's are rows[begin[s]..begin[s + 1]) (the
/// label_index and label_members of its shard_softmax_sample).
void shard_label_rows(const dataset& data, const uint32_t* points, uint32_t n, uint32_t first,
                      uint32_t count, std::vector<uint32_t>& rows, std::vector<uint32_t>& begin);

/// For samples[0..n) (every rank calls it with the same n, a collective): each trained
/// sample's deltas (softmax over the whole set, its maximum and sum of exponentials all-reduced,
/// the exponentials in float summed in double; minus 1/labels on each label), its loss (the
/// set's log-sum-exp, or with `full_partition` the whole layer's log_partition, less the
/// labels' mean logit) and, with `full_partition`, the full softmax's mass outside the set. An
/// untrained sample's deltas are 0. Every rank gets the same losses. `threads` OpenMP threads;
/// returns the seconds spent in the collectives.
double sharded_set_softmax(shard_comm& comm, shard_softmax_sample* samples, uint32_t n,
                           bool full_partition, int threads, shard_softmax_scratch& scratch);

/// The logistic loss over samples[0..n) (a collective, as sharded_set_softmax): each trained
/// sample's deltas are its members' own (sigmoid minus 1 on a label, 0 elsewhere:
/// logistic_loss_gradient, the bits one process computes), and its loss, the sum of its
/// members' binary cross-entropies, is summed over ranks in rank order, so that every rank
/// gets the same losses. Reads neither log_partition nor a maximum; dropped_mass is 0. An
/// untrained sample's deltas are 0. Returns the seconds spent in the collective.
double sharded_set_logistic(shard_comm& comm, shard_softmax_sample* samples, uint32_t n,
                            int threads, shard_softmax_scratch& scratch);

}  // namespace hslide
