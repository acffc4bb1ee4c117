// An inverted-file index over a layer's rows for approximate top-k by inner product: the CPU
// top-k selection's `--top-k-search ivf` (FAISS's IndexIVFFlat is the model).
//
// A logit is <row, h> + bias = <[row, bias, 0], [h, 1, e]>: the index works on the rows
// augmented with their bias and a value e = sqrt(M^2 - |row|^2 - bias^2) that puts every row on
// the sphere of radius M (the largest norm), where the largest inner product with a query
// [h, 1, 0] is the nearest row (the MIPS-to-nearest-neighbour reduction). Building partitions
// the rows into clusters by spherical k-means on these points (a row goes to the unit centroid
// with the highest inner product; a centroid is its members' normalised sum). Above 256 clusters it
// is two-level, as FAISS's two_level_clustering: about sqrt(C) coarse clusters, then each coarse
// cluster split in proportion to its size, so a build costs about 2 sqrt(C) products a row instead
// of C. Centroids are trained on at most 64 sampled rows each, then every row is assigned once. The
// members are kept in CSR, ascending row ids.
//
// A search scores the centroids against each query, takes its `probes` best clusters, and
// scores their rows exactly (live weights: between builds the centroids go stale, the row ids
// stay valid; refresh_ivf_index catches up cheaply). A chunk of queries is inverted to (cluster ->
// queries probing it), so a cluster's rows are gathered once into an L1/L2-sized block and scored
// against its queries with the same blocked kernels (dots16, dots16_bf16) the exact scoring uses: a
// row's score is bit-identical to exact scoring's, and with probes >= clusters the result is the
// exact top-k.
//
// Both are deterministic functions of the rows, the seed and the kernel table, whatever the
// thread count (per-point results; sums in member order; ties to the smaller id).
#pragma once

#include "kernels.hpp"
#include "layer_rows.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hslide::cpu {

/// The rows an index covers (a layer's, not owned): clustering reads the fp32 rows; a search
/// scores the bf16 copies when `weights16` is set (as exact scoring does in bf16 precision).
using ivf_rows = layer_rows;

/// The clusters of an index: centroids and members.
struct ivf_index {
    uint32_t rows = 0;              ///< rows indexed (0: not built)
    uint32_t width = 0;             ///< row width; centroids have width + 2 values (bias, norm's)
    uint32_t stride = 0;            ///< floats between centroid starts
    std::vector<float> centroids;   ///< clusters() unit vectors of width + 2 values
    std::vector<uint32_t> offsets;  ///< cluster c's members: members[offsets[c]..offsets[c+1])
    std::vector<uint32_t> members;  ///< every row once, ascending within a cluster
    /// The coarse groups' clusters: group g's are [group_first[g], group_first[g + 1]) (one
    /// group when the index is flat).
    std::vector<uint32_t> group_first;
    /// The largest squared norm of a row with its bias when the index last read the rows.
    float max_norm2 = 0;

    uint32_t clusters() const { return offsets.empty() ? 0 : uint32_t(offsets.size() - 1); }
    const float* centroid(uint32_t c) const { return centroids.data() + size_t(c) * stride; }
};

/// Clusters `layer`'s rows into about `clusters` clusters (0: automatic; at most the rows;
/// two-level above 256, where the coarse clusters' shares are rounded), drawing samples and
/// seeds from `seed`.
void build_ivf_index(ivf_index& index, const ivf_rows& layer, uint32_t clusters, uint64_t seed,
                     const kernel_table& k, int threads);

/// Brings a built index up to the rows as they are now, cheaply, in one pass over the rows:
/// each group's rows are reassigned among the group's clusters with the centroids as they
/// are, and the centroids recomputed from their new members (one Lloyd step; no sampling, no
/// coarse pass; a row keeps its coarse group). A flat index's one group runs on one thread.
/// Training moves the rows fast enough that an index a few steps old misses most of a sample's best
/// rows (bench/topk.md), and a build costs 3-5 refreshes.
void refresh_ivf_index(ivf_index& index, const ivf_rows& layer, const kernel_table& k, int threads);

/// Reassigns the n given rows (ascending) among their groups' clusters with the centroids as
/// they are, the others staying where they are: what refresh_ivf_index does to those rows,
/// without its Lloyd step, at the cost of those rows only. Between Lloyd steps, the rows a
/// training step changed are the ones that can have left their clusters (the others were
/// placed by a pass with centroids at most one Lloyd step older).
void reassign_ivf_rows(ivf_index& index, const ivf_rows& layer, const kernel_table& k,
                       const uint32_t* rows, uint32_t n, int threads);

/// For each of the n queries (width floats each): the `top` best rows among the members of its
/// `probes` best clusters (all clusters when probes >= clusters()), best first, ties to the
/// smaller id, NaN scores skipped, padded with UINT32_MAX / -inf (select_top_k's contract),
/// into labels/scores[q * top..]. Scores are exact scoring's, bit for bit. At most 256
/// queries a call keeps the working set small.
void ivf_search(const ivf_index& index, const ivf_rows& layer, const kernel_table& k,
                const float* const* queries, uint32_t n, uint32_t probes, uint32_t top,
                uint32_t* labels, float* scores, int threads);

}  // namespace hslide::cpu
