// Which rows of the output layer a rank holds: the output layer of a label-sharded run split
// into contiguous ranges, one per rank (issue 32, DESIGN.md "Past one device"). Equal by
// default; --shard-weights 3,1 gives rank 0 three quarters. The input and hidden layers are
// not split (every rank holds them whole and keeps them bit-identical).
#pragma once

#include "hslide/shard_comm.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// Rank comm->rank()'s rows [first, first + count) of an output layer of `total` rows. A
/// default one (no comm) is the whole layer: not sharded. One of a group of one rank holds the
/// whole layer and takes the sharded step all the same (its arithmetic, which does not depend
/// on the split: the reference N ranks are compared against in tests); the CLI makes one only
/// under more than one rank.
struct output_shard {
    shard_comm* comm = nullptr;
    uint32_t first = 0;
    uint32_t count = 0;
    uint32_t total = 0;
    /// Every rank's first row, and `total` last (size() + 1 values).
    std::vector<uint32_t> bounds;

    /// Whether the backend takes the sharded step (any group, one rank included).
    bool sharded() const { return comm != nullptr; }
};

/// The `weights` as --shard-weights spells them ("3,1"; "" = equal), one per rank, each a
/// positive finite number; throws hslide::error naming --shard-weights otherwise.
std::vector<double> parse_shard_weights(const std::string& text, int ranks);

/// The ranks' row boundaries: bounds[r] is rank r's first row, bounds[ranks] = rows. Equal
/// shares (weights empty: bounds[r] = rows * r / ranks) or shares proportional to `weights`
/// (one per rank). Throws hslide::error (naming --shard-weights) when a rank would get no row.
std::vector<uint32_t> shard_bounds(uint32_t rows, int ranks, const std::vector<double>& weights);

/// This rank's shard of an output layer of `rows` rows split by `weights_text` across `comm`.
output_shard make_output_shard(shard_comm& comm, uint32_t rows, const std::string& weights_text);
/// This rank's shard of the split `bounds` (shard_bounds' form: comm.size() + 1 values, the
/// last the layer's rows).
output_shard make_output_shard(shard_comm& comm, std::vector<uint32_t> bounds);

}  // namespace hslide
