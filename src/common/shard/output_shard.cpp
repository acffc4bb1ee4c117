// The output layer's row ranges per rank (output_shard.hpp).
#include "hslide/output_shard.hpp"

#include "hslide/error.hpp"
#include "hslide/memory.hpp"
#include "hslide/progress.hpp"  // human_bytes

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
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

std::vector<double> auto_shard_weights(const std::vector<rank_capacity>& ranks, uint32_t rows,
                                       double bytes_per_row) {
    const size_t n = ranks.size();
    HSLIDE_ASSERT(n >= 1 && bytes_per_row > 0);
    std::vector<double> caps(n);  // the most rows each rank's memory holds
    double room = 0;
    for (size_t r = 0; r < n; ++r) {
        HSLIDE_CHECK_KIND(
            std::isfinite(ranks[r].scores_per_second) && ranks[r].scores_per_second > 0,
            error_kind::runtime,
            "--shard-weights auto: rank {} measured no scoring rate ({} scores a "
            "second)",
            r, ranks[r].scores_per_second);
        caps[r] = std::floor(std::max(0.0, ranks[r].memory_bytes) / bytes_per_row);
        room += caps[r];
    }
    HSLIDE_CHECK_KIND(room >= double(rows), error_kind::runtime,
                      "--shard-weights auto: the output layer's {} rows need {} ({} bytes a row) "
                      "and the {} ranks can spare {} in all: more ranks or hosts, or a smaller "
                      "layer",
                      rows, human_bytes(double(rows) * bytes_per_row), bytes_per_row, n,
                      human_bytes(room * bytes_per_row));
    // Water-filling: shares by rate among the ranks not yet full; a rank whose share would pass
    // its memory gets what its memory holds, and the others share the rest again.
    std::vector<double> share(n, 0.0);
    std::vector<bool> full(n, false);
    for (bool again = true; again;) {
        again = false;
        double left = double(rows), rate = 0;
        for (size_t r = 0; r < n; ++r)
            if (full[r])
                left -= caps[r];
            else
                rate += ranks[r].scores_per_second;
        for (size_t r = 0; r < n; ++r) {
            if (full[r]) continue;
            share[r] = left * ranks[r].scores_per_second / rate;
            if (share[r] > caps[r]) {
                share[r] = caps[r];
                full[r] = true;
                again = true;
            }
        }
    }
    // In units of 1 / (16 n) of the layer, by largest remainder, each rank at least one unit
    // and at most what its memory holds; where the memory is too tight for whole units, the
    // shares as they are.
    const uint32_t units = uint32_t(16 * n);
    const double unit_rows = double(rows) / units;
    std::vector<double> weights(n);
    std::vector<double> limit(n);
    uint32_t given = 0;
    for (size_t r = 0; r < n; ++r) {
        limit[r] = std::floor(caps[r] / unit_rows);
        weights[r] = std::clamp(std::floor(share[r] / unit_rows), 1.0, std::max(1.0, limit[r]));
        given += uint32_t(weights[r]);
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return share[a] / unit_rows - weights[a] > share[b] / unit_rows - weights[b];
    });
    for (size_t pass = 0; given < units && pass < units; ++pass)
        for (size_t r : order)
            if (given < units && weights[r] < limit[r]) {
                weights[r] += 1;
                ++given;
            }
    for (size_t r = 0; r < n; ++r)
        if (weights[r] > limit[r] || given != units) return share;
    return weights;
}

memory_pool host_memory_pool() {
    char host[64] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    return {host, double(available_host_bytes())};
}

std::vector<uint32_t> auto_shard_bounds(shard_comm& comm, uint32_t rows, double bytes_per_row,
                                        double replicated_bytes, double scores_per_second,
                                        const memory_pool* pool) {
    const int ranks = comm.size();
    // Each rank's memory pool and offer; the ranks of one pool divide its memory.
    struct offer {
        char host[64];
        double scores_per_second;
        double available_bytes;
    };
    const memory_pool from = pool ? *pool : host_memory_pool();
    offer mine{};
    std::snprintf(mine.host, sizeof mine.host, "%s", from.name.c_str());
    mine.scores_per_second = scores_per_second;
    mine.available_bytes = from.available_bytes;
    std::vector<offer> all(static_cast<size_t>(ranks));
    comm.all_gather(&mine, sizeof mine, all.data());
    std::vector<rank_capacity> capacity(all.size());
    for (size_t r = 0; r < all.size(); ++r) {
        const auto on_host = std::count_if(all.begin(), all.end(), [&](const offer& o) {
            return std::strncmp(o.host, all[r].host, sizeof o.host) == 0;
        });
        capacity[r].scores_per_second = all[r].scores_per_second;
        capacity[r].memory_bytes = all[r].available_bytes / double(on_host) - replicated_bytes;
    }
    const std::vector<double> weights = auto_shard_weights(capacity, rows, bytes_per_row);
    std::vector<uint32_t> bounds = shard_bounds(rows, ranks, weights);
    if (comm.rank() == 0)
        for (int r = 0; r < ranks; ++r) {
            const uint32_t first = bounds[size_t(r)], end = bounds[size_t(r) + 1];
            spdlog::info(
                "--shard-weights auto: rank {} ({}) scores {:.3g} rows a second and can "
                "spare {}: rows [{}, {}), {:.1f}%",
                r, all[size_t(r)].host, capacity[size_t(r)].scores_per_second,
                human_bytes(std::max(0.0, capacity[size_t(r)].memory_bytes)), first, end,
                100.0 * double(end - first) / double(rows));
        }
    return bounds;
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

uint64_t replicated_layers_checksum(uint64_t adam_step, const layer_state* layers, size_t n) {
    XXH3_state_t* state = XXH3_createState();
    HSLIDE_ASSERT(state);
    XXH3_64bits_reset(state);
    auto add = [&](const void* p, size_t bytes) {
        if (bytes) XXH3_64bits_update(state, p, bytes);
    };
    add(&adam_step, sizeof adam_step);
    for (size_t l = 0; l < n; ++l) {
        const layer_state& layer = layers[l];
        add(layer.weights.data(), layer.weights.size() * sizeof(float));
        add(layer.adam_m.data(), layer.adam_m.size() * sizeof(float));
        add(layer.adam_v.data(), layer.adam_v.size() * sizeof(float));
        add(layer.bias.data(), layer.bias.size() * sizeof(float));
        add(layer.bias_m.data(), layer.bias_m.size() * sizeof(float));
        add(layer.bias_v.data(), layer.bias_v.size() * sizeof(float));
    }
    const uint64_t hash = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return hash;
}

}  // namespace hslide
