// The output layer's row ranges per rank (output_shard.hpp).
#include "hslide/output_shard.hpp"

#include "hslide/error.hpp"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace hslide {

std::vector<double> parse_shard_weights(const std::string& text, int ranks) {
    std::vector<double> weights;
    if (text.empty()) return weights;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
        char* end = nullptr;
        const double w = std::strtod(item.c_str(), &end);
        HSLIDE_CHECK(!item.empty() && end && *end == '\0' && std::isfinite(w) && w > 0,
                     "--shard-weights {}: '{}' is not a positive number (one share per rank, "
                     "e.g. 3,1)",
                     text, item);
        weights.push_back(w);
    }
    HSLIDE_CHECK(int(weights.size()) == ranks,
                 "--shard-weights {}: {} shares for {} ranks (give one per rank)", text,
                 weights.size(), ranks);
    return weights;
}

std::vector<uint32_t> shard_bounds(uint32_t rows, int ranks, const std::vector<double>& weights) {
    HSLIDE_ASSERT(ranks >= 1);
    HSLIDE_ASSERT(weights.empty() || int(weights.size()) == ranks);
    std::vector<uint32_t> bounds(size_t(ranks) + 1, rows);
    double total = 0, before = 0;
    for (double w : weights) total += w;
    for (int r = 0; r < ranks; ++r) {
        if (weights.empty()) {
            bounds[size_t(r)] = uint32_t(uint64_t(rows) * uint64_t(r) / uint64_t(ranks));
        } else {
            bounds[size_t(r)] = uint32_t(std::llround(double(rows) * before / total));
            before += weights[size_t(r)];
        }
    }
    for (int r = 0; r < ranks; ++r)
        HSLIDE_CHECK(bounds[size_t(r) + 1] > bounds[size_t(r)],
                     "rank {} of {} would hold none of the output layer's {} rows{}: fewer "
                     "ranks, or a larger share for it (--shard-weights)",
                     r, ranks, rows, weights.empty() ? "" : " with these --shard-weights");
    return bounds;
}

output_shard make_output_shard(shard_comm& comm, uint32_t rows, const std::string& weights_text) {
    return make_output_shard(
        comm, shard_bounds(rows, comm.size(), parse_shard_weights(weights_text, comm.size())));
}

output_shard make_output_shard(shard_comm& comm, std::vector<uint32_t> bounds) {
    HSLIDE_ASSERT(bounds.size() == size_t(comm.size()) + 1 && bounds.front() == 0);
    output_shard shard;
    shard.comm = &comm;
    shard.total = bounds.back();
    shard.bounds = std::move(bounds);
    shard.first = shard.bounds[size_t(comm.rank())];
    shard.count = shard.bounds[size_t(comm.rank()) + 1] - shard.first;
    return shard;
}

}  // namespace hslide
