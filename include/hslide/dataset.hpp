// Sparse multi-label datasets: the in-memory form, the readers (XC, XC split files, LibSVM),
// the XC writer, and the binary cache.
//
// In memory a dataset is two CSR matrices over the same points: features (id, value) and
// labels (id). Feature ids within a point are sorted ascending and unique; label ids are
// unique (in file order).
//
// Accepted input (everything else is an hslide::input_error naming file, line and reason):
//  - XC format: header `N D L`, then one line per point `l1,l2,... f:v f:v ...` with 0-based
//    ids; a point with no labels starts with a space (or has nothing before the first f:v);
//    CRLF or LF endings; trailing blank lines after the N points.
//  - XC split files: whitespace-separated columns of 1-based row numbers into the data file's
//    points (header not counted); one column per random split.
//  - LibSVM multi-label: no header; `l1,l2 f:v ...` with 0-based labels and 1-based features.
//  - Unsorted features within a line are accepted and sorted. A feature or label repeated
//    within a line, an id out of range, a negative or non-numeric id, a NaN or infinite value,
//    a truncated line, a point count that disagrees with the header, and a missing or empty
//    file are errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// A view of one point's features: `count` (id, value) pairs, ids sorted ascending.
struct feature_row {
    const uint32_t* ids;
    const float* values;
    uint32_t count;
};

/// A view of one point's labels.
struct label_row {
    const uint32_t* ids;
    uint32_t count;
};

/// A sparse multi-label dataset held as two CSR matrices.
struct dataset {
    std::string source;      ///< where it came from (a path, or "synthetic:<preset>")
    uint64_t n_features = 0; ///< D: feature ids are < n_features
    uint64_t n_labels = 0;   ///< L: label ids are < n_labels

    std::vector<uint64_t> feature_offsets{0};  ///< size() + 1 entries
    std::vector<uint32_t> feature_ids;
    std::vector<float> feature_values;
    std::vector<uint64_t> label_offsets{0};  ///< size() + 1 entries
    std::vector<uint32_t> label_ids;

    /// Number of points.
    size_t size() const { return feature_offsets.size() - 1; }

    feature_row features(size_t point) const {
        const uint64_t b = feature_offsets[point];
        return {feature_ids.data() + b, feature_values.data() + b,
                static_cast<uint32_t>(feature_offsets[point + 1] - b)};
    }
    label_row labels(size_t point) const {
        const uint64_t b = label_offsets[point];
        return {label_ids.data() + b, static_cast<uint32_t>(label_offsets[point + 1] - b)};
    }

    /// Appends one point (ids must already be valid; features sorted and unique).
    void push_back(const uint32_t* fids, const float* fvals, uint32_t nf, const uint32_t* lids,
                   uint32_t nl);
};

/// Which text format a file is in.
enum class data_format { automatic, xc, libsvm };

/// Options for load_dataset.
struct load_options {
    data_format format = data_format::automatic;  ///< automatic: XC if the first line is `N D L`
    bool use_cache = true;       ///< read/write the binary cache beside the file (or cache_dir)
    std::string cache_dir;       ///< where caches go when not beside the source ("" = beside it)
    uint64_t min_features = 0;   ///< LibSVM only: D is at least this (files have no header)
    uint64_t min_labels = 0;     ///< LibSVM only: L is at least this
};

/// Parses an XC-format file (see the file comment for what is accepted).
dataset read_xc(const std::string& path);

/// Parses a LibSVM multi-label file; D and L are one past the largest ids seen (or the minima).
dataset read_libsvm(const std::string& path, uint64_t min_features = 0, uint64_t min_labels = 0);

/// Reads column `column` (1-based) of an XC split file and returns 0-based point indices,
/// each checked to be < n_points.
std::vector<uint32_t> read_split(const std::string& path, int column, size_t n_points);

/// The points `rows` of `data`, in that order.
dataset subset(const dataset& data, const std::vector<uint32_t>& rows);

/// Loads a dataset through the binary cache: the cache is used when the source file's size,
/// modification time and content checksum match those recorded in it; otherwise the text is
/// parsed and a new cache written (a cache that cannot be written is skipped with a warning).
dataset load_dataset(const std::string& path, const load_options& options = {});

/// The path of the binary cache used for `path` under `options`.
std::string cache_path_for(const std::string& path, const load_options& options = {});

/// Writes `data` in XC format (LF endings, values printed with enough digits to round-trip).
/// Writes to a temporary file and renames it, so a reader never sees half a file.
void write_xc(const dataset& data, const std::string& path);

}  // namespace hslide
