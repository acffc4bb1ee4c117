// The inverted-file index's build (two-level spherical k-means) and search (ivf_index.hpp).
#include "ivf_index.hpp"

#include "hslide/config.hpp"

#include "top_k.hpp"

#include "hslide/error.hpp"
#include "hslide/rng.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace hslide::cpu {

namespace {

constexpr uint32_t lloyd_iterations = 4;
// Centroids are trained on at most this many sampled rows each (FAISS: 256; fewer suffice for
// a partition that only has to keep a query's best rows together, and the build stays cheap).
constexpr uint32_t max_points_per_centroid = 64;
// Above this many clusters, two levels.
constexpr uint32_t flat_clusters_max = 256;
constexpr uint32_t lanes = 16;  // queries / points per dots16 call

uint32_t padded16(uint32_t n) {
    return (n + 15) / 16 * 16;
}

/// The values a point has: the row's width, its bias, the norm-equalising coordinate.
uint32_t point_dims(const ivf_rows& layer) {
    return layer.width + 2;
}

/// Row r as the point clustering sees: [w, bias, sqrt(M^2 - |w|^2 - bias^2)], every point of
/// norm M (the largest norm of a row with its bias). Inner products
/// with a query [h, 1, 0] are the logits, and on a sphere the highest inner product is the
/// nearest point: clusters by direction on it keep a query's best rows together whatever
/// their norms (the MIPS-to-nearest-neighbour reduction of Bachrach et al., 2014). Without
/// it, spherical clusters hold rows of every norm, and the probes by direction missed the
/// long rows of frequent labels once training had grown them (recall@32 0.07 in epoch 2).
/// `extra` holds each row's last value, computed once a build.
void point_of(const ivf_rows& layer, uint32_t r, const float* extra, float* out) {
    std::copy_n(layer.weights + size_t(r) * layer.stride, layer.width, out);
    out[layer.width] = layer.bias[r];
    out[layer.width + 1] = extra[r];
}

/// Writes points ids[0..n) (n <= 16) into xt transposed for dots16 over point_dims values;
/// missing points are zeros.
void pack_points(const ivf_rows& layer, const float* extra, const uint32_t* ids, uint32_t n,
                 float* xt) {
    const uint32_t d = point_dims(layer);
    std::fill(xt, xt + size_t(d) * lanes, 0.0f);
    float x[258];  // point_of's values when the width allows (else a vector)
    std::vector<float> wide(d > 258 ? d : 0);
    float* p = d > 258 ? wide.data() : x;
    for (uint32_t j = 0; j < n; ++j) {
        point_of(layer, ids[j], extra, p);
        for (uint32_t i = 0; i < d; ++i) xt[size_t(i) * lanes + j] = p[i];
    }
}

/// Of dots16's products of K centroids with 16 points (`out`, centroid-major), the centroid with
/// the highest product with point j, ties to the smaller centroid; 0 when every product is NaN.
uint32_t nearest_centroid(const float* out, uint32_t K, uint32_t j) {
    uint32_t best = 0;
    float best_score = -std::numeric_limits<float>::infinity();
    for (uint32_t a = 0; a < K; ++a)
        if (out[size_t(a) * lanes + j] > best_score) {
            best_score = out[size_t(a) * lanes + j];
            best = a;
        }
    return best;
}

/// assign[p] = the centroid (of K, `cstride` apart) with the highest inner product with point
/// ids[p], ties to the smaller centroid; centroid 0 when every product is NaN.
void assign_points(const ivf_rows& layer, const float* extra, const kernel_table& k,
                   const uint32_t* ids, uint32_t n, const float* centroids, size_t cstride,
                   uint32_t K, uint32_t* assign, bool parallel, int threads) {
    const uint32_t d = point_dims(layer);
    const int64_t groups = (int64_t(n) + lanes - 1) / lanes;
#pragma omp parallel num_threads(threads) if (parallel)
    {
        std::vector<float> xt(size_t(d) * lanes), out(size_t(K) * lanes);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
            const uint32_t p0 = uint32_t(g) * lanes, m = std::min(lanes, n - p0);
            for (uint32_t j = p0 + lanes; j < std::min(n, p0 + 2 * lanes); ++j)
                prefetch_bytes(layer.weights + size_t(ids[j]) * layer.stride,
                               size_t(layer.width) * sizeof(float));
            pack_points(layer, extra, ids + p0, m, xt.data());
            k.dots16(centroids, cstride, d, nullptr, K, xt.data(), nullptr, out.data());
            for (uint32_t j = 0; j < m; ++j) {
                assign[p0 + j] = nearest_centroid(out.data(), K, j);
            }
        }
    }
}

/// Scales v (n values) to unit norm; a zero vector stays zero.
void normalize(float* v, uint32_t n) {
    double sq = 0;
    for (uint32_t i = 0; i < n; ++i) sq += double(v[i]) * v[i];
    if (sq > 0) {
        const float inv = float(1.0 / std::sqrt(sq));
        for (uint32_t i = 0; i < n; ++i) v[i] *= inv;
    }
}

/// Spherical k-means centroids: each the normalised sum of its points (in point order). An
/// empty cluster takes the largest one's centroid, the two nudged apart (as FAISS splits).
void update_centroids(const ivf_rows& layer, const float* extra, const kernel_table& k,
                      const uint32_t* ids, uint32_t n, const uint32_t* assign, uint32_t K,
                      float* centroids, size_t cstride) {
    const uint32_t d = point_dims(layer);
    std::vector<float> sums(size_t(K) * d, 0.0f);
    std::vector<uint32_t> count(K, 0);
    for (uint32_t p = 0; p < n; ++p) {
        float* s = sums.data() + size_t(assign[p]) * d;
        const uint32_t r = ids[p];
        k.axpy(1.0f, layer.weights + size_t(r) * layer.stride, s, layer.width);
        s[layer.width] += layer.bias[r];
        s[layer.width + 1] += extra[r];
        ++count[assign[p]];
    }
    for (uint32_t c = 0; c < K; ++c) {
        if (count[c] == 0) continue;
        float* out = centroids + size_t(c) * cstride;
        std::copy_n(sums.data() + size_t(c) * d, d, out);
        normalize(out, d);
    }
    for (uint32_t c = 0; c < K; ++c) {
        if (count[c] != 0) continue;
        const uint32_t big = uint32_t(std::max_element(count.begin(), count.end()) - count.begin());
        if (count[big] < 2) break;  // nothing to split
        float* a = centroids + size_t(big) * cstride;
        float* b = centroids + size_t(c) * cstride;
        constexpr float eps = 1.0f / 1024;
        for (uint32_t i = 0; i < d; ++i) {
            b[i] = a[i] * (i % 2 ? 1 - eps : 1 + eps);
            a[i] *= i % 2 ? 1 + eps : 1 - eps;
        }
        normalize(a, d);
        normalize(b, d);
        count[c] = count[big] / 2;  // so a second empty cluster splits another
        count[big] -= count[c];
    }
}

/// K spherical k-means clusters of points ids[0..n) (K <= n): centroids trained on a sample,
/// then every point assigned (assign[p] in [0, K)).
void kmeans(const ivf_rows& layer, const float* extra, const kernel_table& k, const uint32_t* ids,
            uint32_t n, uint32_t K, uint64_t seed, float* centroids, size_t cstride,
            uint32_t* assign, bool parallel, int threads) {
    HSLIDE_ASSERT(K >= 1 && K <= n);
    const uint32_t d = point_dims(layer);
    rng gen(seed);
    // The sample: a random subset (its first K the initial centroids), then in row order.
    const uint32_t m = uint32_t(std::min<uint64_t>(n, uint64_t(K) * max_points_per_centroid));
    std::vector<uint32_t> pick(n);
    std::iota(pick.begin(), pick.end(), 0u);
    for (uint32_t i = 0; i < m; ++i) std::swap(pick[i], pick[i + gen.below(n - i)]);
    std::fill(centroids, centroids + size_t(K) * cstride, 0.0f);
    for (uint32_t c = 0; c < K; ++c) {
        float* out = centroids + size_t(c) * cstride;
        point_of(layer, ids[pick[c]], extra, out);
        normalize(out, d);
    }
    std::vector<uint32_t> sample(m);
    for (uint32_t i = 0; i < m; ++i) sample[i] = ids[pick[i]];
    std::sort(sample.begin(), sample.end());
    std::vector<uint32_t> sample_assign(m);
    for (uint32_t it = 0; it < lloyd_iterations; ++it) {
        assign_points(layer, extra, k, sample.data(), m, centroids, cstride, K,
                      sample_assign.data(), parallel, threads);
        update_centroids(layer, extra, k, sample.data(), m, sample_assign.data(), K, centroids,
                         cstride);
    }
    assign_points(layer, extra, k, ids, n, centroids, cstride, K, assign, parallel, threads);
}

}  // namespace

namespace {

/// Each row's norm-equalising value (point_of): sqrt(M^2 - |row|^2 - bias^2), M the largest
/// norm (a max: the same on any thread count).
std::vector<float> norm_coordinates(const ivf_rows& layer, const kernel_table& k, int threads,
                                    float& largest) {
    std::vector<float> extra(layer.rows);
    float max_norm2 = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(max : max_norm2)
    for (int64_t r = 0; r < int64_t(layer.rows); ++r) {
        const float* w = layer.weights + size_t(r) * layer.stride;
        const float b = layer.bias[size_t(r)];
        extra[size_t(r)] = k.dot(w, w, layer.width) + b * b;
        max_norm2 = std::max(max_norm2, extra[size_t(r)]);
    }
    for (float& e : extra) e = std::sqrt(std::max(0.0f, max_norm2 - e));
    largest = max_norm2;
    return extra;
}

/// The index's members from each row's cluster: CSR, ascending row ids within a cluster.
void set_members(ivf_index& index, const std::vector<uint32_t>& cluster_of, uint32_t clusters) {
    index.offsets.assign(size_t(clusters) + 1, 0);
    for (uint32_t c : cluster_of) ++index.offsets[c + 1];
    for (uint32_t c = 0; c < clusters; ++c) index.offsets[c + 1] += index.offsets[c];
    index.members.resize(cluster_of.size());
    std::vector<uint32_t> at(index.offsets.begin(), index.offsets.end() - 1);
    for (uint32_t r = 0; r < uint32_t(cluster_of.size()); ++r)
        index.members[at[cluster_of[r]]++] = r;
}

/// The groups in parallel, larger first (by clusters), each on one thread: whichever thread
/// takes a group, its result is the same.
template <class Body>
void for_each_group(const std::vector<uint32_t>& group_first, int threads, Body&& body) {
    const uint32_t groups = uint32_t(group_first.size() - 1);
    std::vector<uint32_t> order(groups);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return group_first[a + 1] - group_first[a] > group_first[b + 1] - group_first[b];
    });
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (groups > 1)
    for (int64_t i = 0; i < int64_t(groups); ++i) body(order[size_t(i)], groups == 1);
}

}  // namespace

void build_ivf_index(ivf_index& index, const ivf_rows& layer, uint32_t clusters, uint64_t seed,
                     const kernel_table& k, int threads) {
    HSLIDE_ASSERT(layer.rows > 0 && layer.width > 0);
    const uint32_t rows = layer.rows, d = point_dims(layer);
    const uint32_t C = ivf_cluster_count(clusters, rows);
    index.rows = rows;
    index.width = layer.width;
    index.stride = padded16(d);
    const std::vector<float> extra = norm_coordinates(layer, k, threads, index.max_norm2);
    std::vector<uint32_t> all(rows), cluster_of(rows);
    std::iota(all.begin(), all.end(), 0u);
    // The coarse groups (one above flat_clusters_max clusters: every row).
    std::vector<uint32_t> group_of(rows, 0);
    uint32_t groups = 1;
    std::vector<float> coarse;
    if (C > flat_clusters_max) {
        groups = std::max(1u, uint32_t(std::lround(std::sqrt(double(C)))));
        coarse.resize(size_t(groups) * index.stride);
        kmeans(layer, extra.data(), k, all.data(), rows, groups, derive_seed(seed, 0),
               coarse.data(), index.stride, group_of.data(), /*parallel=*/true, threads);
    }
    // The groups' rows (ascending) in CSR.
    std::vector<uint32_t> group_offsets(groups + 1, 0), group_rows(rows);
    for (uint32_t r = 0; r < rows; ++r) ++group_offsets[group_of[r] + 1];
    for (uint32_t g = 0; g < groups; ++g) group_offsets[g + 1] += group_offsets[g];
    {
        std::vector<uint32_t> at(group_offsets.begin(), group_offsets.end() - 1);
        for (uint32_t r = 0; r < rows; ++r) group_rows[at[group_of[r]]++] = r;
    }
    // Each group's share of the C clusters, at least 1 (a non-empty group), at most its rows;
    // group g's clusters are [group_first[g], group_first[g + 1]).
    index.group_first.assign(groups + 1, 0);
    for (uint32_t g = 0; g < groups; ++g) {
        const uint32_t n = group_offsets[g + 1] - group_offsets[g];
        if (n == 0) continue;
        const double share = double(C) * double(n) / double(rows);
        index.group_first[g + 1] = std::clamp<uint32_t>(uint32_t(std::lround(share)), 1u, n);
    }
    for (uint32_t g = 0; g < groups; ++g) index.group_first[g + 1] += index.group_first[g];
    const uint32_t total = index.group_first[groups];
    index.centroids.assign(size_t(total) * index.stride, 0.0f);
    for_each_group(index.group_first, threads, [&](uint32_t g, bool only) {
        const uint32_t n = group_offsets[g + 1] - group_offsets[g];
        if (n == 0) return;
        const uint32_t* ids = group_rows.data() + group_offsets[g];
        const uint32_t first = index.group_first[g];
        std::vector<uint32_t> local(n);
        kmeans(layer, extra.data(), k, ids, n, index.group_first[g + 1] - first,
               derive_seed(seed, uint64_t(g) + 1),
               index.centroids.data() + size_t(first) * index.stride, index.stride, local.data(),
               /*parallel=*/only, threads);
        for (uint32_t p = 0; p < n; ++p) cluster_of[ids[p]] = first + local[p];
    });
    set_members(index, cluster_of, total);
}

namespace {

/// Reassigns rows among their groups' clusters with the centroids as they are: all of them
/// (ids null), or the n ascending `ids`. With `lloyd` (every row), the centroids become
/// their new members' sums, normalised (one Lloyd step), an emptied cluster keeping its
/// centroid. Each row is packed with its norm-equalising value from the largest norm the
/// index last saw (a row grown past it getting 0) and scored against its group's centroids
/// 16 at a time; the largest norm seen updates the index's.
void reassign_rows(ivf_index& index, const ivf_rows& layer, const kernel_table& k,
                   const uint32_t* ids, uint32_t n, bool lloyd, int threads) {
    HSLIDE_ASSERT(index.rows == layer.rows && index.width == layer.width &&
                  !index.group_first.empty() && (ids == nullptr || !lloyd));
    const uint32_t d = point_dims(layer), width = layer.width;
    const float max_norm2 = index.max_norm2;
    const uint32_t groups = uint32_t(index.group_first.size() - 1);
    std::vector<uint32_t> cluster_of(layer.rows);
    std::vector<float> group_max(groups, 0.0f);
    // Each row's cluster and group as the index has them.
    std::vector<uint32_t> group_of(layer.rows);
    for (uint32_t g = 0; g < groups; ++g)
        for (uint32_t c = index.group_first[g]; c < index.group_first[g + 1]; ++c)
            for (uint32_t i = index.offsets[c]; i < index.offsets[c + 1]; ++i) {
                group_of[index.members[i]] = g;
                cluster_of[index.members[i]] = c;
            }
    // Each group's rows to reassign, ascending (the sums' order): a counting sort by group.
    const uint32_t count = ids ? n : layer.rows;
    auto row_at = [&](uint32_t i) { return ids ? ids[i] : i; };
    std::vector<uint32_t> group_offsets(size_t(groups) + 1, 0), group_rows(count);
    for (uint32_t i = 0; i < count; ++i) ++group_offsets[group_of[row_at(i)] + 1];
    for (uint32_t g = 0; g < groups; ++g) group_offsets[g + 1] += group_offsets[g];
    {
        std::vector<uint32_t> at(group_offsets.begin(), group_offsets.end() - 1);
        for (uint32_t i = 0; i < count; ++i) group_rows[at[group_of[row_at(i)]]++] = row_at(i);
    }
    for_each_group(index.group_first, threads, [&](uint32_t g, bool) {
        const uint32_t first = index.group_first[g], K = index.group_first[g + 1] - first;
        const uint32_t* rows = group_rows.data() + group_offsets[g];
        const uint32_t m_rows = group_offsets[g + 1] - group_offsets[g];
        if (m_rows == 0) return;
        float* centroids = index.centroids.data() + size_t(first) * index.stride;
        std::vector<float> xt(size_t(d) * lanes), out(size_t(K) * lanes), extra(lanes);
        std::vector<float> sums(lloyd ? size_t(K) * d : 0, 0.0f);
        std::vector<uint32_t> members(lloyd ? K : 0, 0);
        float seen_max = 0;
        for (uint32_t p0 = 0; p0 < m_rows; p0 += lanes) {
            const uint32_t m = std::min(lanes, m_rows - p0);
            // A group's rows are scattered over the layer, which the hardware prefetchers do
            // not follow: the next 16 rows are requested while these are scored (the pass is
            // bound by reading the rows: 1.5x faster so).
            for (uint32_t j = p0 + lanes; j < std::min(m_rows, p0 + 2 * lanes); ++j)
                prefetch_bytes(layer.weights + size_t(rows[j]) * layer.stride,
                               size_t(width) * sizeof(float));
            std::fill(xt.begin(), xt.end(), 0.0f);
            for (uint32_t j = 0; j < m; ++j) {
                const uint32_t r = rows[p0 + j];
                const float* w = layer.weights + size_t(r) * layer.stride;
                const float b = layer.bias[r], n2 = k.dot(w, w, width) + b * b;
                seen_max = std::max(seen_max, n2);
                extra[j] = std::sqrt(std::max(0.0f, max_norm2 - n2));
                for (uint32_t i = 0; i < width; ++i) xt[size_t(i) * lanes + j] = w[i];
                xt[size_t(width) * lanes + j] = b;
                xt[size_t(width + 1) * lanes + j] = extra[j];
            }
            k.dots16(centroids, index.stride, d, nullptr, K, xt.data(), nullptr, out.data());
            for (uint32_t j = 0; j < m; ++j) {
                const uint32_t best = nearest_centroid(out.data(), K, j);
                const uint32_t r = rows[p0 + j];
                cluster_of[r] = first + best;
                if (!lloyd) continue;
                float* sum = sums.data() + size_t(best) * d;
                k.axpy(1.0f, layer.weights + size_t(r) * layer.stride, sum, width);
                sum[width] += layer.bias[r];
                sum[width + 1] += extra[j];
                ++members[best];
            }
        }
        for (uint32_t c = 0; lloyd && c < K; ++c) {
            if (members[c] == 0) continue;
            std::copy_n(sums.data() + size_t(c) * d, d, centroids + size_t(c) * index.stride);
            normalize(centroids + size_t(c) * index.stride, d);
        }
        group_max[g] = seen_max;
    });
    // The largest norm seen, for the next pass (a max: the same on any thread count).
    for (float m : group_max) index.max_norm2 = std::max(index.max_norm2, m);
    set_members(index, cluster_of, index.clusters());
}

}  // namespace

void refresh_ivf_index(ivf_index& index, const ivf_rows& layer, const kernel_table& k,
                       int threads) {
    reassign_rows(index, layer, k, nullptr, 0, /*lloyd=*/true, threads);
}

void reassign_ivf_rows(ivf_index& index, const ivf_rows& layer, const kernel_table& k,
                       const uint32_t* rows, uint32_t n, int threads) {
    reassign_rows(index, layer, k, rows, n, /*lloyd=*/false, threads);
}

void ivf_search(const ivf_index& index, const ivf_rows& layer, const kernel_table& k,
                const float* const* queries, uint32_t n, uint32_t probes, uint32_t top,
                uint32_t* labels, float* scores, int threads) {
    HSLIDE_ASSERT(index.rows == layer.rows && index.width == layer.width);
    if (n == 0) return;
    const uint32_t width = layer.width, d = point_dims(layer), C = index.clusters();
    const uint32_t P = std::min(probes, C), kept = std::min(top, layer.rows);
    const int64_t groups = (int64_t(n) + lanes - 1) / lanes;
    // The probes of each query: its P best centroids, scored by <[h, 1], centroid>.
    std::vector<uint32_t> probe(size_t(n) * P);
    std::vector<float> xt(size_t(groups) * d * lanes, 0.0f);
    const bool use_bf16 = layer.weights16 != nullptr, paired = use_bf16 && k.dots16_bf16;
    const uint32_t pairs = (width + 1) / 2;
    // Per thread: a heap of the best `kept` rows per query over the clusters it scores.
    std::vector<std::vector<scored_label>> best(static_cast<size_t>(threads));
    std::vector<std::vector<uint32_t>> best_count(static_cast<size_t>(threads));
    // The queries of each probed cluster, in query order (CSR), and the probed clusters.
    std::vector<uint32_t> cluster_offsets(size_t(C) + 1, 0), cluster_queries(size_t(n) * P);
    std::vector<uint32_t> probed;
#pragma omp parallel num_threads(threads)
    {
        const int thread = omp_get_thread_num();
        std::vector<float> cs(size_t(C) * lanes), column(C);
        std::vector<scored_label> heap;
        std::vector<float> unused_scores(P);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
            float* x = xt.data() + size_t(g) * d * lanes;
            const uint32_t q0 = uint32_t(g) * lanes, m = std::min(lanes, n - q0);
            for (uint32_t j = 0; j < m; ++j) {
                for (uint32_t i = 0; i < width; ++i) x[size_t(i) * lanes + j] = queries[q0 + j][i];
                x[size_t(width) * lanes + j] = 1.0f;  // the bias's; the last value stays 0
            }
            k.dots16(index.centroids.data(), index.stride, d, nullptr, C, x, nullptr, cs.data());
            for (uint32_t j = 0; j < m; ++j) {
                for (uint32_t c = 0; c < C; ++c) column[c] = cs[size_t(c) * lanes + j];
                select_top_k(column.data(), nullptr, C, P, probe.data() + size_t(q0 + j) * P,
                             unused_scores.data(), heap);
            }
        }
#pragma omp single
        {
            // NaN centroid scores leave UINT32_MAX probes: skipped.
            for (uint32_t v : probe)
                if (v != std::numeric_limits<uint32_t>::max()) ++cluster_offsets[v + 1];
            for (uint32_t c = 0; c < C; ++c) {
                if (cluster_offsets[c + 1] > 0) probed.push_back(c);
                cluster_offsets[c + 1] += cluster_offsets[c];
            }
            std::vector<uint32_t> at(cluster_offsets.begin(), cluster_offsets.end() - 1);
            for (uint32_t q = 0; q < n; ++q)
                for (uint32_t i = 0; i < P; ++i) {
                    const uint32_t c = probe[size_t(q) * P + i];
                    if (c != std::numeric_limits<uint32_t>::max()) cluster_queries[at[c]++] = q;
                }
            // Larger clusters first: the dynamic schedule then evens out the threads' work.
            std::stable_sort(probed.begin(), probed.end(), [&](uint32_t a, uint32_t b) {
                return index.offsets[a + 1] - index.offsets[a] >
                       index.offsets[b + 1] - index.offsets[b];
            });
        }
        std::vector<scored_label>& heaps = best[size_t(thread)];
        std::vector<uint32_t>& counts = best_count[size_t(thread)];
        heaps.resize(size_t(n) * kept);
        counts.assign(n, 0);
        // A cluster's biases, its queries packed as exact scoring packs them, the scores; in
        // bf16, its rows gathered into a block too (as exact scoring reads a block in place).
        std::vector<float> block_bias, qx, out;
        std::vector<bf16> block16, qx16(size_t(pairs) * 32), one16(width);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < int64_t(probed.size()); ++i) {
            const uint32_t c = probed[size_t(i)];
            const uint32_t* ids = index.members.data() + index.offsets[c];
            const uint32_t nb = index.offsets[c + 1] - index.offsets[c];
            const uint32_t* qs = cluster_queries.data() + cluster_offsets[c];
            const uint32_t nq = cluster_offsets[c + 1] - cluster_offsets[c];
            if (nb == 0) continue;
            block_bias.resize(nb);
            for (uint32_t a = 0; a < nb; ++a) block_bias[a] = layer.bias[ids[a]];
            if (paired) {
                block16.resize(size_t(nb) * layer.stride16);
                for (uint32_t a = 0; a < nb; ++a) {
                    if (a + 8 < nb)
                        prefetch_bytes(layer.weights16 + size_t(ids[a + 8]) * layer.stride16,
                                       layer.stride16 * sizeof(bf16));
                    std::copy_n(layer.weights16 + size_t(ids[a]) * layer.stride16, layer.stride16,
                                block16.data() + size_t(a) * layer.stride16);
                }
            }
            if (!use_bf16) {
                // fp32: the members are scored where they are (dots16 by id), 64 at a time
                // against every query group while they are in cache: each row is read from
                // memory once a chunk, not copied into a block first (the batch's probes cover
                // nearly every cluster, so the copies were a second pass over the layer).
                const uint32_t n_groups = (nq + lanes - 1) / lanes;
                qx.assign(size_t(n_groups) * width * lanes, 0.0f);
                for (uint32_t j = 0; j < nq; ++j) {
                    float* x = qx.data() + size_t(j / lanes) * width * lanes;
                    for (uint32_t e = 0; e < width; ++e)
                        x[size_t(e) * lanes + j % lanes] = queries[qs[j]][e];
                }
                constexpr uint32_t rows_in_cache = 64;
                out.resize(size_t(rows_in_cache) * lanes);
                for (uint32_t a0 = 0; a0 < nb; a0 += rows_in_cache) {
                    const uint32_t na = std::min(rows_in_cache, nb - a0);
                    for (uint32_t grp = 0; grp < n_groups; ++grp) {
                        k.dots16(layer.weights, layer.stride, width, ids + a0, na,
                                 qx.data() + size_t(grp) * width * lanes, block_bias.data() + a0,
                                 out.data());
                        const uint32_t q0 = grp * lanes, m = std::min(lanes, nq - q0);
                        for (uint32_t j = 0; j < m; ++j) {
                            const uint32_t q = qs[q0 + j];
                            offer_scores_top_k(heaps.data() + size_t(q) * kept, counts[q], kept,
                                               out.data() + j, lanes, ids + a0, na);
                        }
                    }
                }
                continue;
            }
            out.resize(size_t(nb) * lanes);
            for (uint32_t q0 = 0; q0 < nq; q0 += lanes) {
                const uint32_t m = std::min(lanes, nq - q0);
                // Score of row ids[a] for query qs[q0 + j]: out[a * row_step + j * col_step].
                size_t row_step = lanes, col_step = 1;
                if (paired) {
                    // Element e of query j at [(e / 2) * 32 + j * 2 + e % 2] (zeros past it).
                    std::fill(qx16.begin(), qx16.end(), bf16{0});
                    for (uint32_t j = 0; j < m; ++j) {
                        k.to_bf16(queries[qs[q0 + j]], one16.data(), width);
                        for (uint32_t e = 0; e < width; ++e)
                            qx16[size_t(e / 2) * 32 + j * 2 + e % 2] = one16[e];
                    }
                    k.dots16_bf16(block16.data(), layer.stride16, width, nb, qx16.data(),
                                  block_bias.data(), out.data());
                } else {
                    row_step = 1;
                    col_step = nb;
                    for (uint32_t j = 0; j < m; ++j) {
                        k.to_bf16(queries[qs[q0 + j]], one16.data(), width);
                        k.active_dots_bf16(layer.weights16, layer.stride16, width, ids, nb,
                                           one16.data(), layer.bias, out.data() + size_t(j) * nb);
                    }
                }
                for (uint32_t j = 0; j < m; ++j) {
                    const uint32_t q = qs[q0 + j];
                    offer_scores_top_k(heaps.data() + size_t(q) * kept, counts[q], kept,
                                       out.data() + size_t(j) * col_step, row_step, ids, nb);
                }
            }
        }
        // Merge the team's candidates per query (the team may be smaller than `threads`).
        const int team = omp_get_num_threads();
        std::vector<float> cand_score;
        std::vector<uint32_t> cand_id;
#pragma omp for schedule(static)
        for (int64_t q = 0; q < int64_t(n); ++q) {
            merge_thread_top_k(best, best_count, team, size_t(q), kept, top,
                               labels + size_t(q) * top, scores + size_t(q) * top, cand_score,
                               cand_id, heap);
        }
    }
}

}  // namespace hslide::cpu
