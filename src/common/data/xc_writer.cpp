// The XC-format writer (hslide::write_xc): formats chunks of points in parallel and writes
// them in order through an hslide::output_file (a temporary file renamed over the target).
#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/input_check.hpp"
#include "hslide/output_file.hpp"

#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace hslide {

namespace {

constexpr size_t points_per_chunk = 4096;

// Appends one point's line. Every feature is preceded by a space, so a point without labels
// starts with one, as the format requires.
void format_point(const dataset& data, size_t p, std::string& out) {
    const label_row labels = data.labels(p);
    const feature_row features = data.features(p);
    // Upper bound: 11 chars per label, 1 + 10 + 1 + 16 per feature, space and newline.
    const size_t need = 11 * labels.count + 28 * static_cast<size_t>(features.count) + 2;
    const size_t old = out.size();
    out.resize(old + need);
    char* at = out.data() + old;
    char* const end = out.data() + out.size();
    for (uint32_t i = 0; i < labels.count; ++i) {
        if (i) *at++ = ',';
        at = std::to_chars(at, end, labels.ids[i]).ptr;
    }
    for (uint32_t i = 0; i < features.count; ++i) {
        *at++ = ' ';
        at = std::to_chars(at, end, features.ids[i]).ptr;
        *at++ = ':';
        at = std::to_chars(at, end, features.values[i]).ptr;  // shortest round-trip form
    }
    if (labels.count == 0 && features.count == 0) *at++ = ' ';  // never a blank line
    *at++ = '\n';
    out.resize(static_cast<size_t>(at - out.data()));
}

}  // namespace

void write_xc(const dataset& data, const std::string& path) {
    // What the readers would refuse is refused here, before a file is made (a NaN would be
    // written as "nan").
    check_dataset(data, data.source.empty() ? std::string("write_xc") : data.source);
    // Its line would be blank, which the readers skip: the file would hold a point fewer than
    // its header says.
    for (size_t p = 0; p < data.size(); ++p)
        HSLIDE_CHECK(data.features(p).count > 0 || data.labels(p).count > 0,
                     "write_xc: point {} has no labels and no features, which an XC line cannot "
                     "hold (it would be a blank line, which readers skip)",
                     p);
    output_file file(path);
    file.write(fmt::format("{} {} {}\n", data.size(), data.n_features, data.n_labels));

    // Rounds of a few chunks per thread bound the memory held in formatted text.
    const size_t n = data.size();
    const size_t n_chunks = (n + points_per_chunk - 1) / points_per_chunk;
    const size_t round = static_cast<size_t>(4 * omp_get_max_threads());
    std::vector<std::string> text(std::min(round, n_chunks));
    for (size_t first = 0; first < n_chunks; first += round) {
        const size_t count = std::min(round, n_chunks - first);
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
            std::string& out = text[i];
            out.clear();
            const size_t begin = (first + i) * points_per_chunk;
            const size_t end = std::min(n, begin + points_per_chunk);
            for (size_t p = begin; p < end; ++p) format_point(data, p, out);
        }
        for (size_t i = 0; i < count; ++i) file.write(text[i]);
    }
    file.commit();
}

}  // namespace hslide
