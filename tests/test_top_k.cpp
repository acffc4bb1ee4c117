// Tests of the top-k helpers every CPU selection and prediction ends with (src/cpu/top_k.hpp):
// select_top_k, and the heap offers under it, against a full sort on awkward sizes, with ties
// (broken by the smaller id) and NaNs (skipped); merge_thread_top_k of per-thread heaps.
#include "cpu/top_k.hpp"
#include "hslide/rng.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using namespace hslide;
using namespace hslide::cpu;

namespace {

/// Random scores; with `levels` > 0, drawn from that many values (many ties), and every
/// `nan_every`-th one NaN.
std::vector<float> random_scores(uint32_t n, uint64_t seed, int levels, uint32_t nan_every) {
    rng gen(seed);
    std::vector<float> z(n);
    for (uint32_t i = 0; i < n; ++i) {
        z[i] = levels > 0 ? float(int(gen.uniform() * levels)) : float(gen.normal());
        if (nan_every && i % nan_every == nan_every - 1)
            z[i] = std::numeric_limits<float>::quiet_NaN();
    }
    return z;
}

/// The k best of (z[i], ids[i]), best first, by a full sort: the reference.
std::vector<scored_label> sorted_top_k(const std::vector<float>& z,
                                       const std::vector<uint32_t>& ids, uint32_t k) {
    std::vector<scored_label> all;
    for (size_t i = 0; i < z.size(); ++i)
        if (!std::isnan(z[i])) all.push_back({z[i], ids[i]});
    std::sort(all.begin(), all.end(), ranks_above);
    all.resize(std::min<size_t>(all.size(), k));
    return all;
}

}  // namespace

TEST(TopK, SelectTopKMatchesAFullSortWithTiesAndNaNs) {
    for (uint32_t n : {1u, 15u, 16u, 17u, 33u, 100u, 1000u, 6118u})
        for (uint32_t k : {1u, 5u, 16u, 32u, 33u, 128u})
            for (int levels : {0, 7})
                for (uint32_t nan_every : {0u, 5u}) {
                    const uint64_t seed = n * 1000003ull + k * 101 + uint64_t(levels) + nan_every;
                    const std::vector<float> z = random_scores(n, seed, levels, nan_every);
                    // Shuffled ids, so that ties are broken by an order other than position.
                    std::vector<uint32_t> ids(n);
                    for (uint32_t i = 0; i < n; ++i) ids[i] = (i * 7919u + 13u) % 100003u;
                    const std::vector<scored_label> want = sorted_top_k(z, ids, k);
                    std::vector<uint32_t> labels(k);
                    std::vector<float> scores(k);
                    std::vector<scored_label> heap;
                    select_top_k(z.data(), ids.data(), n, k, labels.data(), scores.data(), heap);
                    for (uint32_t i = 0; i < k; ++i) {
                        SCOPED_TRACE(testing::Message()
                                     << "n " << n << " k " << k << " levels " << levels << " nan "
                                     << nan_every << " i " << i);
                        if (i < want.size()) {
                            ASSERT_EQ(labels[i], want[i].second);
                            ASSERT_EQ(scores[i], want[i].first);
                        } else {
                            ASSERT_EQ(labels[i], std::numeric_limits<uint32_t>::max());
                            ASSERT_EQ(scores[i], -std::numeric_limits<float>::infinity());
                        }
                    }
                }
}

TEST(TopK, OfferedOneByOneTheHeapKeepsTheBestAndItsWorstOnTop) {
    const uint32_t n = 777, k = 33;
    const std::vector<float> z = random_scores(n, 42, 11, 0);
    std::vector<uint32_t> ids(n);
    for (uint32_t i = 0; i < n; ++i) ids[i] = n - i;
    std::vector<scored_label> heap(k);
    uint32_t count = 0;
    for (uint32_t i = 0; i < n; ++i) {
        offer_top_k(heap.data(), count, k, {z[i], ids[i]});
        // After every offer: a heap under rank_order (its worst on top) of the best so far.
        ASSERT_TRUE(std::is_heap(heap.begin(), heap.begin() + count, rank_order{})) << i;
        const std::vector<float> seen(z.begin(), z.begin() + i + 1);
        const std::vector<uint32_t> seen_ids(ids.begin(), ids.begin() + i + 1);
        std::vector<scored_label> kept(heap.begin(), heap.begin() + count);
        std::sort(kept.begin(), kept.end(), ranks_above);
        ASSERT_EQ(kept, sorted_top_k(seen, seen_ids, k)) << i;
    }
}

TEST(TopK, MergedThreadHeapsGiveTheSingleHeapsResult) {
    const uint32_t n = 1000, k = 32;
    const std::vector<float> z = random_scores(n, 7, 9, 0);
    std::vector<uint32_t> ids(n);
    for (uint32_t i = 0; i < n; ++i) ids[i] = i;
    for (int team : {1, 2, 3}) {
        // Thread t offers the rows i with i % team == t to its own heap (one point, p = 0).
        std::vector<std::vector<scored_label>> best(static_cast<size_t>(team),
                                                    std::vector<scored_label>(k));
        std::vector<std::vector<uint32_t>> count(static_cast<size_t>(team),
                                                 std::vector<uint32_t>{0});
        for (uint32_t i = 0; i < n; ++i)
            offer_top_k(best[i % team].data(), count[i % team][0], k, {z[i], ids[i]});
        std::vector<uint32_t> labels(k);
        std::vector<float> scores(k), cand_score;
        std::vector<uint32_t> cand_id;
        std::vector<scored_label> heap;
        merge_thread_top_k(best, count, team, 0, k, k, labels.data(), scores.data(), cand_score,
                           cand_id, heap);
        const std::vector<scored_label> want = sorted_top_k(z, ids, k);
        for (uint32_t i = 0; i < k; ++i) {
            EXPECT_EQ(labels[i], want[i].second) << "team " << team << " i " << i;
            EXPECT_EQ(scores[i], want[i].first) << "team " << team << " i " << i;
        }
    }
}
