// The XC-format writer (hslide::write_xc): formats chunks of points in parallel and writes
// them in order to a temporary file that is renamed over the target at the end.
#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/input_check.hpp"

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

[[noreturn]] void io_failure(const std::string& what, const std::string& path, int err) {
    throw error(error_kind::io, fmt::format("cannot {} {}: {}", what, path, std::strerror(err)));
}

}  // namespace

void write_xc(const dataset& data, const std::string& path) {
    // What the readers would refuse is refused here, before a file is made (a NaN would be
    // written as "nan").
    check_dataset(data, data.source.empty() ? std::string("write_xc") : data.source);
    const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(getpid()));
    FILE* file = std::fopen(tmp.c_str(), "wb");
    if (!file) io_failure("open for writing", tmp, errno);

    const auto fail = [&](const char* what, int err) {
        std::fclose(file);
        std::remove(tmp.c_str());
        io_failure(what, path, err);
    };
    const std::string header =
        fmt::format("{} {} {}\n", data.size(), data.n_features, data.n_labels);
    if (std::fwrite(header.data(), 1, header.size(), file) != header.size()) fail("write", errno);

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
        for (size_t i = 0; i < count; ++i)
            if (std::fwrite(text[i].data(), 1, text[i].size(), file) != text[i].size())
                fail("write", errno);
    }
    if (std::fflush(file) != 0) fail("write", errno);
    if (std::fclose(file) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        io_failure("write", path, err);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        io_failure("rename a temporary file to", path, err);
    }
}

}  // namespace hslide
