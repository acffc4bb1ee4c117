// The merge of a label-sharded output layer's candidates across ranks (issue 32): each rank
// found the k best of its own rows for a chunk of queries (a top-k step's candidates, or a
// prediction's labels); one all-gather of their ids and scores, then every rank keeps each
// query's k best of all ranks' (select_top_k's rule: higher score, ties to the smaller id), so
// that every rank holds the same list. The log-partitions of exact top-k combine by
// log-sum-exp in rank order.
#pragma once

#include "hslide/shard_comm.hpp"

#include <cstdint>
#include <vector>

namespace hslide::cpu {

/// labels/scores[q * k..] (q < n) hold this rank's k best of its rows (ids local to the shard,
/// whose first row is `first`; padded with UINT32_MAX / -inf); on return, on every rank, the k
/// best of every rank's, as ids of the whole layer. With log_partition != null, log_partition[q]
/// (this rank's log-sum-exp over its rows) becomes the whole layer's. Every rank calls it with
/// the same n and k. `scratch` is kept by the caller between calls.
void merge_shard_top_k(shard_comm& comm, uint32_t first, uint32_t n, uint32_t k, uint32_t* labels,
                       float* scores, double* log_partition, std::vector<unsigned char>& scratch);

/// The queries a step's selection merges in one call for top k: a batch is merged in chunks of
/// this many (the last shorter), by every rank whatever its backend, so that the ranks'
/// collectives pair up (the CPU's exact search's chunk, exact_scoring::chunk).
uint32_t shard_merge_chunk(uint32_t k);

}  // namespace hslide::cpu
