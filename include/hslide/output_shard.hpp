// Which rows of the output layer a rank holds: the output layer of a label-sharded run split
// into contiguous ranges, one per rank (issue 32, DESIGN.md "Past one device"). Equal by
// default; --shard-weights 3,1 gives rank 0 three quarters; --shard-weights auto gives each rank
// a share in proportion to its measured scoring rate, within the memory it can spare. The input
// and hidden layers are not split (every rank holds them whole and keeps them bit-identical).
#pragma once

#include "hslide/model.hpp"
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

/// What one rank can take of the output layer (--shard-weights auto).
struct rank_capacity {
    /// Row scores a second of its backend's exact scoring at the layer's width (measured:
    /// scoring is nearly all of a sharded step's work that the split divides).
    double scores_per_second = 0;
    /// Bytes it can give the output layer: its share of its host's available memory (ranks on
    /// one host share it) less the replicated layers it holds whole.
    double memory_bytes = 0;
};

/// Whether --shard-weights asks for auto's shares.
inline bool is_auto_shard_weights(const std::string& text) {
    return text == "auto";
}

/// auto's shares of `rows` rows of `bytes_per_row` bytes each (weights, Adam state, copies):
/// proportional to the ranks' scores_per_second, except that a rank gets no more rows than its
/// memory_bytes hold, the rest going to the others by their rates. Each share is a multiple of
/// 1 / (16 * ranks) of the layer (at least one), so that the small differences between two
/// measurements of the same machines give the same split. Throws hslide::error
/// (error_kind::runtime) when the ranks together cannot hold the layer.
std::vector<double> auto_shard_weights(const std::vector<rank_capacity>& ranks, uint32_t rows,
                                       double bytes_per_row);

/// The memory a rank draws its rows from, for auto's split: ranks naming the same pool divide
/// its `available_bytes` equally (a host's memory among its CPU ranks, a GPU's among the ranks
/// on it).
struct memory_pool {
    std::string name;  ///< e.g. "node7", "node7 GPU 0" (at most 63 characters count)
    double available_bytes = 0;
};

/// This host's memory: its name, and MemAvailable + SwapFree.
memory_pool host_memory_pool();

/// auto's split across `comm` (a collective): this rank offers `scores_per_second` (its
/// backend's measured rate) and its share of `pool` (default: host_memory_pool()), less
/// `replicated_bytes` (the layers every rank holds whole); every rank computes the same bounds
/// from all the ranks' offers (auto_shard_weights), and rank 0 logs each rank's offer and
/// share.
std::vector<uint32_t> auto_shard_bounds(shard_comm& comm, uint32_t rows, double bytes_per_row,
                                        double replicated_bytes, double scores_per_second,
                                        const memory_pool* pool = nullptr);

/// This rank's shard of an output layer of `rows` rows split by `weights_text` across `comm`.
output_shard make_output_shard(shard_comm& comm, uint32_t rows, const std::string& weights_text);
/// This rank's shard of the split `bounds` (shard_bounds' form: comm.size() + 1 values, the
/// last the layer's rows).
output_shard make_output_shard(shard_comm& comm, std::vector<uint32_t> bounds);

/// The checksum the ranks compare to check that their replicas of the layers every rank holds
/// whole are the same (the backends' synchronize()): XXH3 of `adam_step` and layers[0..n)'s
/// weights, Adam moments and biases, in that order (the same on every backend, so that the
/// bits, not where they live, are compared).
uint64_t replicated_layers_checksum(uint64_t adam_step, const layer_state* layers, size_t n);

}  // namespace hslide
