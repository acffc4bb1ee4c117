// Top-k selection over one sample's scores: what every CPU backend's predict ends with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace hslide::cpu {

/// Writes the k best (score, id) pairs of scores[0..n), best first, ties to the smaller id;
/// ids[i] is entry i's label (ids == nullptr: i itself). NaN scores are skipped. Slots past
/// the scored count get UINT32_MAX / -inf. `heap` is scratch (kept by the caller, so a loop
/// over samples allocates once).
inline void select_top_k(const float* scores, const uint32_t* ids, uint32_t n, uint32_t k,
                         uint32_t* out_labels, float* out_scores,
                         std::vector<std::pair<float, uint32_t>>& heap) {
    // A min-heap of the best k so far: O(n log k), and exact scoring over 670k labels stays cheap.
    heap.clear();
    auto worse = [](const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    for (uint32_t i = 0; i < n; ++i) {
        const float s = scores[i];
        if (std::isnan(s)) continue;
        const uint32_t id = ids ? ids[i] : i;
        if (heap.size() < k) {
            heap.emplace_back(s, id);
            std::push_heap(heap.begin(), heap.end(), worse);
        } else if (worse({s, id}, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), worse);
            heap.back() = {s, id};
            std::push_heap(heap.begin(), heap.end(), worse);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), worse);
    for (uint32_t i = 0; i < k; ++i) {
        if (i < heap.size()) {
            out_labels[i] = heap[i].second;
            out_scores[i] = heap[i].first;
        } else {
            out_labels[i] = std::numeric_limits<uint32_t>::max();
            out_scores[i] = -std::numeric_limits<float>::infinity();
        }
    }
}

}  // namespace hslide::cpu
