// Sparse multi-label datasets: the in-memory form, the readers (XC, XC split files, LibSVM),
// the XC writer, and the binary cache.
//
// In memory a dataset is two CSR matrices over the same points: features (id, value) and
// labels (id). Feature ids within a point are sorted ascending and unique; label ids are
// unique (in file order).
//
// Accepted input (everything else is an hslide::input_error naming file, 1-based line and
// reason; line 0 only for whole-file problems such as a missing or empty file):
//  - XC format: header `N D L`, then one line per point `l1,l2,... f:v f:v ...` with 0-based
//    ids; a point with no labels starts with a space (or has nothing before the first f:v);
//    a point may have labels and no features. CRLF or LF endings. Tokens are separated by
//    spaces or tabs. Blank lines (empty or only spaces/tabs) are not points: they are
//    skipped wherever they occur (so trailing blank lines after the N points are fine, and a
//    point with neither labels nor features cannot be written down). Blank lines before the
//    header are skipped too. A UTF-8 byte-order mark at the start of any file is skipped.
//  - XC split files: whitespace-separated columns of 1-based row numbers into the data file's
//    points (header not counted); one column per random split.
//  - LibSVM multi-label: no header; `l1,l2 f:v ...` with 0-based labels and 1-based features
//    (stored 0-based). D and L are one past the largest ids seen, or the given minima.
//  - Unsorted features within a line are accepted and sorted (with their values). A value of
//    0 is kept as an explicit entry (it is not dropped). Values are parsed as float
//    (std::from_chars: decimal or exponent notation, an optional leading '+'); a value too
//    small for a float becomes the nearest float (possibly 0).
//  - Errors: a feature or label repeated within a line, a feature id >= D or label id >= L, a
//    negative or non-numeric id, an id above 2^32-1, a NaN or infinite value (also when
//    spelled `nan`/`inf` in the text) or one beyond the float range, a truncated line (`3:`,
//    `1,2,`, `1,,2`), any other unexpected character, a point count that disagrees with the
//    header (reported on the header line when there are fewer points, on the first extra
//    point's line when there are more), a bad header, and a missing or empty file.
//
// The readers read the whole file into memory and parse it with hand-written loops and
// std::from_chars (over 100 MB/s of XC text on one core; see bench/parsing.md).
//
// The binary cache (load_dataset) stores the parsed CSR arrays with the source's size,
// modification time (ns) and an XXH3-64 checksum of its content (every byte up to 16 MiB; 256
// evenly spread 16 KiB blocks above, so a hit stays >= 20x faster than parsing), a checksum of
// every byte (for verify_cache), the format and the LibSVM minima; it is used only when all of
// them match, its own payload checksum verifies and its arrays pass the shared input check
// (input_check.hpp: a forged cache cannot hand the trainer what no reader would). What this does
// not catch: a source over 16 MiB edited outside the sampled blocks while keeping its size and
// modification time (touch -r); load_options::verify_cache (--verify-cache) closes that gap.
// A missing, stale, truncated, corrupt or forged cache is ignored (the text is parsed and a new
// cache written through hslide::output_file); a FIFO or device at the cache's path is left
// alone. See cache_path_for for where caches go.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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
    std::string source;       ///< where it came from (a path, or "synthetic:<preset>")
    uint64_t n_features = 0;  ///< D: feature ids are < n_features
    uint64_t n_labels = 0;    ///< L: label ids are < n_labels

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

    /// Appends one point. Set n_features and n_labels first: the ids are checked (an
    /// hslide::error when a feature id is >= n_features, a label id >= n_labels, the feature
    /// ids are not strictly ascending, or a label repeats; nothing is appended then).
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
    bool show_progress = false;  ///< a progress bar (or log lines) over the bytes parsed
    /// Use a cache only when a checksum of every byte of the source matches (by default a
    /// source over 16 MiB is checked by size, time and 256 sampled blocks; see the file
    /// comment). Costs a read of the whole file, still well under a parse.
    bool verify_cache = false;
};

class progress;

/// Parses an XC-format file (see the file comment for what is accepted).
dataset read_xc(const std::string& path);

/// Parses a LibSVM multi-label file; D and L are one past the largest ids seen (or the minima).
dataset read_libsvm(const std::string& path, uint64_t min_features = 0, uint64_t min_labels = 0);

/// Parses XC text held in memory; `name` is used in error messages and as `source`.
/// `bar` (optional) is advanced by the bytes parsed.
dataset parse_xc(std::string_view text, const std::string& name, progress* bar = nullptr);

/// Parses LibSVM multi-label text held in memory; `name` as for parse_xc.
dataset parse_libsvm(std::string_view text, const std::string& name, uint64_t min_features = 0,
                     uint64_t min_labels = 0, progress* bar = nullptr);

/// The format of `text` by the rule load_dataset uses: XC when its first non-blank line is
/// exactly three non-negative integers, LibSVM otherwise. Never returns automatic.
data_format detect_format(std::string_view text);

/// Reads column `column` (1-based) of an XC split file and returns 0-based point indices,
/// each checked to be < n_points. A column the file lacks, a non-numeric or negative entry,
/// 0 or a row number > n_points, a row number listed twice in the column, and rows with
/// differing column counts are input_errors;
/// blank lines are skipped. column < 1 is an hslide::error (invalid argument).
std::vector<uint32_t> read_split(const std::string& path, int column, size_t n_points);

/// The points `rows` of `data`, in that order (an hslide::error when a row is out of range).
dataset subset(const dataset& data, const std::vector<uint32_t>& rows);

/// Loads a dataset through the binary cache: the cache is used when the source file's size,
/// modification time and content checksum match those recorded in it; otherwise the text is
/// parsed and a new cache written (a cache that cannot be written is skipped with a warning).
/// options.format = automatic picks the format with detect_format.
dataset load_dataset(const std::string& path, const load_options& options = {});

/// The path of the binary cache used for `path` under `options`:
///  - options.cache_dir set: `<cache_dir>/<file name>-<16 hex digits of XXH3(absolute
///  path)>.hscache`;
///  - otherwise `path + ".hscache"` when the source's directory is writable;
///  - otherwise the same hashed name under `$XDG_CACHE_HOME/hslide`, or `~/.cache/hslide`
///    (e.g. for the read-only shared data folder).
/// The directory is created when the cache is written, not here.
std::string cache_path_for(const std::string& path, const load_options& options = {});

/// Scales every point's feature values to unit L2 norm (points without features, or with
/// all-zero values, are left as they are).
void normalize_rows_l2(dataset& data);

/// Writes `data` in XC format (LF endings, values printed with enough digits to round-trip).
/// Writes to a temporary file and renames it, so a reader never sees half a file.
void write_xc(const dataset& data, const std::string& path);

}  // namespace hslide
