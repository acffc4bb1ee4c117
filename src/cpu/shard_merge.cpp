// The merge of sharded candidates across ranks (shard_merge.hpp).
#include "shard_merge.hpp"

#include "exact_scoring.hpp"
#include "top_k.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace hslide::cpu {

void merge_shard_top_k(shard_comm& comm, uint32_t first, uint32_t n, uint32_t k, uint32_t* labels,
                       float* scores, double* log_partition, std::vector<unsigned char>& scratch) {
    constexpr uint32_t none = std::numeric_limits<uint32_t>::max();
    const int ranks = comm.size();
    const size_t nk = size_t(n) * k;
    // One message a rank: its ids (made global), scores and log-partitions, in that order
    // (ids and scores are 4 bytes each, so the doubles start 8-byte aligned).
    const size_t bytes = nk * (sizeof(uint32_t) + sizeof(float)) + size_t(n) * sizeof(double);
    scratch.resize(bytes * size_t(ranks + 1));
    unsigned char* mine = scratch.data();
    unsigned char* all = scratch.data() + bytes;
    uint32_t* ids = reinterpret_cast<uint32_t*>(mine);
    for (size_t i = 0; i < nk; ++i) ids[i] = labels[i] == none ? none : labels[i] + first;
    std::memcpy(mine + nk * sizeof(uint32_t), scores, nk * sizeof(float));
    if (log_partition)
        std::memcpy(mine + nk * 8, log_partition, size_t(n) * sizeof(double));
    else
        std::memset(mine + nk * 8, 0, size_t(n) * sizeof(double));
    comm.all_gather(mine, bytes, all);

    std::vector<float> cand_score;
    std::vector<uint32_t> cand_id;
    std::vector<scored_label> heap;
    for (uint32_t q = 0; q < n; ++q) {
        cand_score.clear();
        cand_id.clear();
        double top = -std::numeric_limits<double>::infinity();
        for (int r = 0; r < ranks; ++r) {
            const unsigned char* base = all + size_t(r) * bytes;
            const uint32_t* r_ids = reinterpret_cast<const uint32_t*>(base) + size_t(q) * k;
            const float* r_scores =
                reinterpret_cast<const float*>(base + nk * sizeof(uint32_t)) + size_t(q) * k;
            for (uint32_t j = 0; j < k && r_ids[j] != none; ++j) {
                cand_id.push_back(r_ids[j]);
                cand_score.push_back(r_scores[j]);
            }
            if (log_partition)
                top = std::max(top, reinterpret_cast<const double*>(base + nk * 8)[q]);
        }
        select_top_k(cand_score.data(), cand_id.data(), uint32_t(cand_score.size()), k,
                     labels + size_t(q) * k, scores + size_t(q) * k, heap);
        if (log_partition) {
            double sum = 0;
            for (int r = 0; r < ranks; ++r)
                sum += std::exp(
                    reinterpret_cast<const double*>(all + size_t(r) * bytes + nk * 8)[q] - top);
            log_partition[q] = top + std::log(sum);
        }
    }
}

uint32_t shard_merge_chunk(uint32_t k) {
    return exact_scoring::chunk(k);
}

}  // namespace hslide::cpu
