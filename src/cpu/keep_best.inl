// kernel_table::keep_best's one definition (kernels.hpp), included by the scalar reference's file
// and by each SIMD level's. `static` gives each including file its own copy, compiled with that
// file's flags: the scalar one without auto-vectorisation (the reference), a level's with its
// vectors, and no linker may swap one for another.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace hslide::cpu {

/// The most candidates keep_best ranks by counting; more go to std::nth_element.
inline constexpr uint32_t keep_best_rank_limit = 128;

static inline float keep_best_by_rank(std::pair<float, uint32_t>* candidates, uint32_t n,
                                      uint32_t kept) {
    if (n > keep_best_rank_limit) {
        std::nth_element(
            candidates, candidates + (kept - 1), candidates + n,
            [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
                return a.first > b.first || (a.first == b.first && a.second < b.second);
            });
        return candidates[kept - 1].first;
    }
    // nth_element's comparisons branch on random scores, and half of them mispredicted: here
    // every candidate counts the candidates that rank above it, one candidate j against all at
    // once (a loop with no branch, which a vector level turns into compares and masked adds).
    alignas(64) float score[keep_best_rank_limit];
    alignas(64) uint32_t id[keep_best_rank_limit];
    alignas(64) uint32_t above[keep_best_rank_limit];
    for (uint32_t i = 0; i < n; ++i) {
        score[i] = candidates[i].first;
        id[i] = candidates[i].second;
        above[i] = 0;
    }
    for (uint32_t j = 0; j < n; ++j) {
        const float s = score[j];
        const uint32_t r = id[j];
        for (uint32_t i = 0; i < n; ++i)
            above[i] += uint32_t(s > score[i]) | (uint32_t(s == score[i]) & uint32_t(r < id[i]));
    }
    // The kept ones forward, in their order, with no branch either: each candidate is written
    // at the next free place, which moves on only when it is kept.
    float floor = 0.0f;
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; ++i) {
        candidates[at] = {score[i], id[i]};
        at += uint32_t(above[i] < kept);
        floor = above[i] == kept - 1 ? score[i] : floor;
    }
    return floor;
}

}  // namespace hslide::cpu
