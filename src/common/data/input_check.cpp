// The shared input-matrix check of hslide/input_check.hpp.
#include "hslide/input_check.hpp"

#include "hslide/error.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

namespace hslide {

namespace {

template <class Offset>
std::string offsets_problem(const Offset* o, size_t rows, uint64_t entries,
                            const std::string& what) {
    if (o[0] != 0) return fmt::format("{}'s CSR offsets start at {}, not 0", what, o[0]);
    for (size_t i = 0; i < rows; ++i) {
        // A negative int64 offset cannot pass: o[0] is 0 and the offsets never decrease.
        if (o[i + 1] < o[i])
            return fmt::format("{}'s CSR offsets decrease at row {} ({} after {})", what, i,
                               o[i + 1], o[i]);
        if (uint64_t(o[i + 1]) > entries)
            return fmt::format("{}'s CSR offset {} of row {} is past its {} entries", what,
                               o[i + 1], i, entries);
    }
    if (uint64_t(o[rows]) != entries)
        return fmt::format("{}'s CSR offsets end at {} but it has {} entries", what, o[rows],
                           entries);
    return "";
}

}  // namespace

std::string csr_offsets_problem(const int64_t* offsets, size_t rows, uint64_t entries,
                                const std::string& what) {
    return offsets_problem(offsets, rows, entries, what);
}

std::string csr_offsets_problem(const uint64_t* offsets, size_t rows, uint64_t entries,
                                const std::string& what) {
    return offsets_problem(offsets, rows, entries, what);
}

std::string point_problem(const uint32_t* fids, const float* fvals, uint32_t nf,
                          const uint32_t* lids, uint32_t nl, uint64_t n_features,
                          uint64_t n_labels) {
    for (uint32_t i = 0; i < nf; ++i) {
        if (fids[i] >= n_features)
            return fmt::format("feature id {} out of range: must be < D = {}", fids[i], n_features);
        if (i > 0 && fids[i] <= fids[i - 1])
            return fids[i] == fids[i - 1] ? fmt::format("duplicate feature id {}", fids[i])
                                          : fmt::format("feature ids not ascending ({} after {})",
                                                        fids[i], fids[i - 1]);
        if (!std::isfinite(fvals[i]))
            return fmt::format("NaN or infinite value {} of feature {}", fvals[i], fids[i]);
    }
    for (uint32_t i = 0; i < nl; ++i)
        if (lids[i] >= n_labels)
            return fmt::format("label id {} out of range: must be < L = {}", lids[i], n_labels);
    if (nl <= 1) return "";
    if (nl <= 32) {  // quadratic is faster than sorting for the usual few labels
        for (uint32_t i = 1; i < nl; ++i)
            for (uint32_t j = 0; j < i; ++j)
                if (lids[i] == lids[j]) return fmt::format("duplicate label {}", lids[i]);
        return "";
    }
    std::vector<uint32_t> sorted(lids, lids + nl);
    std::sort(sorted.begin(), sorted.end());
    const auto it = std::adjacent_find(sorted.begin(), sorted.end());
    return it == sorted.end() ? "" : fmt::format("duplicate label {}", *it);
}

std::string dataset_problem(const dataset& d) {
    if (d.feature_offsets.empty() || d.label_offsets.size() != d.feature_offsets.size())
        return fmt::format("{} feature offsets but {} label offsets (one per point, plus one)",
                           d.feature_offsets.size(), d.label_offsets.size());
    if (d.feature_values.size() != d.feature_ids.size())
        return fmt::format("{} feature ids but {} values", d.feature_ids.size(),
                           d.feature_values.size());
    if (d.n_features > (uint64_t{1} << 32) || d.n_labels > (uint64_t{1} << 32))
        return fmt::format("{} features and {} labels: ids are 32-bit (at most 2^32 of each)",
                           d.n_features, d.n_labels);
    const size_t n = d.size();
    std::string why =
        csr_offsets_problem(d.feature_offsets.data(), n, d.feature_ids.size(), "the features");
    if (why.empty())
        why = csr_offsets_problem(d.label_offsets.data(), n, d.label_ids.size(), "the labels");
    if (!why.empty()) return why;
    // The points in parallel (a cache of millions of points is checked on every load); the
    // first bad one by index is reported, so the message does not depend on the threads.
    int64_t first_bad = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : first_bad)
    for (int64_t p = 0; p < int64_t(n); ++p) {
        if (p > first_bad) continue;
        const feature_row f = d.features(size_t(p));
        const label_row l = d.labels(size_t(p));
        if (!point_problem(f.ids, f.values, f.count, l.ids, l.count, d.n_features, d.n_labels)
                 .empty())
            first_bad = std::min(first_bad, p);
    }
    if (first_bad == INT64_MAX) return "";
    const feature_row f = d.features(size_t(first_bad));
    const label_row l = d.labels(size_t(first_bad));
    return fmt::format(
        "point {}: {}", first_bad,
        point_problem(f.ids, f.values, f.count, l.ids, l.count, d.n_features, d.n_labels));
}

void check_model_dimensions(const dataset& d) {
    HSLIDE_CHECK(d.n_labels > 0 && d.n_features > 0,
                 "{}: the training data has {} labels and {} features: a model needs at least "
                 "one of each",
                 d.source, d.n_labels, d.n_features);
    HSLIDE_CHECK(d.n_labels <= UINT32_MAX && d.n_features <= UINT32_MAX,
                 "{}: too many labels or features for a model: {} labels and {} features, at "
                 "most {} of each (ids are 32-bit)",
                 d.source, d.n_labels, d.n_features, uint64_t(UINT32_MAX));
}

void check_dataset(const dataset& data, const std::string& name) {
    const std::string why = dataset_problem(data);
    if (!why.empty()) throw input_error(name, 0, why);
}

}  // namespace hslide
