// Top-k selection over one sample's scores: what every CPU backend's predict ends with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace hslide::cpu {

/// A scored label: (score, id).
using scored_label = std::pair<float, uint32_t>;

/// Whether a ranks above b: a higher score, or an equal one and a smaller id.
inline bool ranks_above(const scored_label& a, const scored_label& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}
/// ranks_above as a type: the heap algorithms inline it (through a function pointer they call
/// it, which was a tenth of a top-k step's time).
struct rank_order {
    bool operator()(const scored_label& a, const scored_label& b) const {
        return ranks_above(a, b);
    }
};

/// Puts c, which ranks above the worst of the full heap heap[0..k), in the worst's place: one
/// sift down from the top, where std::pop_heap and std::push_heap walk down to a leaf and back
/// up (twice the comparisons; the replacement was a tenth of a Debian-recs epoch).
inline void replace_worst(scored_label* heap, uint32_t k, const scored_label& c) {
    uint32_t at = 0;
    for (;;) {
        uint32_t child = 2 * at + 1;
        if (child >= k) break;
        if (child + 1 < k && ranks_above(heap[child], heap[child + 1])) ++child;  // the worse
        if (!ranks_above(c, heap[child])) break;
        heap[at] = heap[child];
        at = child;
    }
    heap[at] = c;
}

/// Offers c to `heap`, a heap of the best `count` <= k labels so far with the worst on top
/// (std heap order under ranks_above): kept when there is room or it ranks above the worst.
/// NaN scores are skipped.
inline void offer_top_k(scored_label* heap, uint32_t& count, uint32_t k, const scored_label& c) {
    if (std::isnan(c.first)) return;
    if (count < k) {
        heap[count++] = c;
        std::push_heap(heap, heap + count, rank_order{});
    } else if (ranks_above(c, heap[0])) {
        replace_worst(heap, k, c);
    }
}

/// offer_top_k of n scores, scores[a * stride] with id ids[a] (first_id + a when ids ==
/// nullptr): the same heap, but a score below the worst kept (most of them, once the heap is
/// full) is passed over with one comparison, before the pair is built and the heap read. NaN
/// fails it.
inline void offer_scores_top_k(scored_label* heap, uint32_t& count, uint32_t k, const float* scores,
                               size_t stride, const uint32_t* ids, uint32_t n,
                               uint32_t first_id = 0) {
    if (k == 0) return;
    float floor = count < k ? -std::numeric_limits<float>::infinity() : heap[0].first;
    for (uint32_t a = 0; a < n; ++a) {
        const float s = scores[size_t(a) * stride];
        if (!(s >= floor)) continue;  // an equal score may still win on its id
        offer_top_k(heap, count, k, {s, ids ? ids[a] : first_id + a});
        if (count == k) floor = heap[0].first;
    }
}

/// Writes the k best (score, id) pairs of scores[0..n), best first, ties to the smaller id;
/// ids[i] is entry i's label (ids == nullptr: i itself). NaN scores are skipped. Slots past
/// the scored count get UINT32_MAX / -inf. `heap` is scratch (kept by the caller, so a loop
/// over samples allocates once).
inline void select_top_k(const float* scores, const uint32_t* ids, uint32_t n, uint32_t k,
                         uint32_t* out_labels, float* out_scores, std::vector<scored_label>& heap) {
    // A min-heap of the best k so far: O(n log k), and exact scoring over 670k labels stays cheap.
    heap.resize(std::min(n, k));
    uint32_t count = 0;
    offer_scores_top_k(heap.data(), count, k, scores, 1, ids, n);
    heap.resize(count);
    std::sort_heap(heap.begin(), heap.end(), rank_order{});
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

/// Point p's k best over the candidates that `team` threads each kept of the rows they scored
/// (thread t's: best[t][p * stride + j] for j < count[t][p] <= stride), written as select_top_k
/// writes them. cand_score, cand_id and heap are scratch.
inline void merge_thread_top_k(const std::vector<std::vector<scored_label>>& best,
                               const std::vector<std::vector<uint32_t>>& count, int team, size_t p,
                               uint32_t stride, uint32_t k, uint32_t* out_labels, float* out_scores,
                               std::vector<float>& cand_score, std::vector<uint32_t>& cand_id,
                               std::vector<scored_label>& heap) {
    cand_score.clear();
    cand_id.clear();
    for (int t = 0; t < team; ++t)
        for (uint32_t j = 0; j < count[size_t(t)][p]; ++j) {
            const scored_label& c = best[size_t(t)][p * stride + j];
            cand_score.push_back(c.first);
            cand_id.push_back(c.second);
        }
    select_top_k(cand_score.data(), cand_id.data(), uint32_t(cand_score.size()), k, out_labels,
                 out_scores, heap);
}

}  // namespace hslide::cpu
