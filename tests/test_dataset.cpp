// Tests of the dataset readers and the binary cache (hslide/dataset.hpp): every malformation
// is an input_error with the right line and reason, the accepted variants parse to the right
// arrays, random text round-trips, garbage never crashes, and the cache is used only when
// it is valid.
#include "hslide/dataset.hpp"

#include "hslide/error.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

using hslide::testing::read_text;
using hslide::testing::temp_dir;
using hslide::testing::write_text;

void expect_same(const hslide::dataset& a, const hslide::dataset& b) {
    EXPECT_EQ(a.n_features, b.n_features);
    EXPECT_EQ(a.n_labels, b.n_labels);
    EXPECT_EQ(a.feature_offsets, b.feature_offsets);
    EXPECT_EQ(a.feature_ids, b.feature_ids);
    EXPECT_EQ(a.feature_values, b.feature_values);
    EXPECT_EQ(a.label_offsets, b.label_offsets);
    EXPECT_EQ(a.label_ids, b.label_ids);
}

// The structural invariants every reader must establish.
void expect_valid(const hslide::dataset& d) {
    ASSERT_EQ(d.feature_offsets.size(), d.label_offsets.size());
    ASSERT_EQ(d.feature_offsets.front(), 0u);
    ASSERT_EQ(d.label_offsets.front(), 0u);
    ASSERT_EQ(d.feature_offsets.back(), d.feature_ids.size());
    ASSERT_EQ(d.feature_ids.size(), d.feature_values.size());
    ASSERT_EQ(d.label_offsets.back(), d.label_ids.size());
    for (size_t i = 0; i < d.size(); ++i) {
        const auto f = d.features(i);
        for (uint32_t j = 0; j < f.count; ++j) {
            ASSERT_LT(f.ids[j], d.n_features);
            if (j > 0) ASSERT_GT(f.ids[j], f.ids[j - 1]);
            ASSERT_TRUE(std::isfinite(f.values[j]));
        }
        const auto l = d.labels(i);
        for (uint32_t j = 0; j < l.count; ++j) {
            ASSERT_LT(l.ids[j], d.n_labels);
            for (uint32_t k = 0; k < j; ++k) ASSERT_NE(l.ids[j], l.ids[k]);
        }
    }
}

// Formats `d` as XC text (or LibSVM when `libsvm`), optionally with CRLF endings and the
// features of each point in a shuffled order.
std::string to_text(const hslide::dataset& d, bool libsvm, bool crlf, hslide::rng* shuffle_gen) {
    const char* eol = crlf ? "\r\n" : "\n";
    std::string out;
    if (!libsvm) out += fmt::format("{} {} {}{}", d.size(), d.n_features, d.n_labels, eol);
    std::vector<uint32_t> order;
    for (size_t i = 0; i < d.size(); ++i) {
        const auto l = d.labels(i);
        for (uint32_t j = 0; j < l.count; ++j) out += fmt::format(j ? ",{}" : "{}", l.ids[j]);
        const auto f = d.features(i);
        order.resize(f.count);
        for (uint32_t j = 0; j < f.count; ++j) order[j] = j;
        if (shuffle_gen) hslide::shuffle(order.begin(), order.end(), *shuffle_gen);
        for (const uint32_t j : order) {
            out += fmt::format(" {}:{}", f.ids[j] + (libsvm ? 1 : 0), f.values[j]);
        }
        out += eol;
    }
    return out;
}

// A random dataset with awkward sizes: empty label lists, label-only points, 0 values.
hslide::dataset random_dataset(uint64_t seed, size_t n, uint64_t d, uint64_t l) {
    hslide::rng gen(seed);
    hslide::dataset data;
    data.n_features = d;
    data.n_labels = l;
    std::vector<uint32_t> fids, lids;
    std::vector<float> fvals;
    for (size_t i = 0; i < n; ++i) {
        fids.clear();
        lids.clear();
        fvals.clear();
        const uint64_t nf = (i % 7 == 3) ? 0 : 1 + gen.below(std::min<uint64_t>(d, 40));
        const uint64_t nl = (i % 5 == 1) ? 0 : 1 + gen.below(std::min<uint64_t>(l, 6));
        while (fids.size() < nf) {
            const auto id = static_cast<uint32_t>(gen.below(d));
            if (std::find(fids.begin(), fids.end(), id) == fids.end()) fids.push_back(id);
        }
        std::sort(fids.begin(), fids.end());
        for (size_t j = 0; j < nf; ++j) {
            const double u = gen.uniform_double();
            fvals.push_back(j == 2 ? 0.0f : static_cast<float>((u - 0.3) * 1e3 * u * u));
        }
        // Points need a label or a feature: a blank line is not a point.
        const uint64_t nl_eff = (nf == 0 && nl == 0) ? 1 : nl;
        while (lids.size() < nl_eff) {
            const auto id = static_cast<uint32_t>(gen.below(l));
            if (std::find(lids.begin(), lids.end(), id) == lids.end()) lids.push_back(id);
        }
        data.push_back(fids.data(), fvals.data(), static_cast<uint32_t>(nf), lids.data(),
                       static_cast<uint32_t>(lids.size()));
    }
    return data;
}

// --- malformations ---------------------------------------------------------------------------

enum class reader { xc, libsvm, split };

struct bad_case {
    const char* name;
    reader kind;
    const char* text;  // nullptr: the file does not exist
    size_t line;
    const char* reason;  // a substring the reason must contain
};

const bad_case bad_cases[] = {
    // Point counts.
    {"fewer_points", reader::xc, "3 10 5\n0 1:1\n1 2:1\n", 1, "point count"},
    {"fewer_points_trailing_blank", reader::xc, "3 10 5\n0 1:1\n1 2:1\n\n  \n", 1, "point count"},
    {"more_points", reader::xc, "2 10 5\n0 1:1\n1 2:1\n2 3:1\n", 4, "more points"},
    {"more_points_crlf_blank", reader::xc, "1 10 5\r\n\r\n0 1:1\r\n\r\n1 2:1\r\n", 5,
     "more points"},
    // Truncated lines.
    {"feature_without_value", reader::xc, "1 10 5\n0 3:\n", 2, "truncated"},
    {"feature_without_value_mid", reader::xc, "1 10 5\n0 3: 4:1\n", 2, "truncated"},
    {"feature_without_value_crlf", reader::xc, "1 10 5\r\n0 3:\r\n", 2, "truncated"},
    {"feature_without_colon", reader::xc, "1 10 5\n0 1:1 3\n", 2, "truncated"},
    {"dangling_comma", reader::xc, "2 10 5\n0 1:1\n1,2, 3:1\n", 3, "truncated label list"},
    {"dangling_comma_eol", reader::xc, "1 10 5\n1,2,\n", 2, "truncated label list"},
    {"empty_label", reader::xc, "1 10 5\n1,,2 3:1\n", 2, "empty label id"},
    {"colon_in_labels", reader::xc, "1 10 5\n1,2:3 4:1\n", 2, "':' in label list"},
    // Ids out of range.
    {"feature_id_eq_D", reader::xc, "1 10 5\n0 10:1\n", 2, "D = 10"},
    {"feature_id_huge", reader::xc, "1 10 5\n0 99999999999999999999:1\n", 2, "out of range"},
    {"label_id_eq_L", reader::xc, "2 10 5\n0 1:1\n1,5 2:1\n", 3, "L = 5"},
    {"label_id_huge", reader::xc, "1 10 5\n99999999999 1:1\n", 2, "too large"},
    // Negative or non-numeric.
    {"negative_feature", reader::xc, "1 10 5\n0 -1:1\n", 2, "negative feature id"},
    {"negative_first_feature", reader::xc, "1 10 5\n-1:1\n", 2, "negative feature id"},
    {"negative_label", reader::xc, "1 10 5\n-1 1:1\n", 2, "negative label id"},
    {"negative_second_label", reader::xc, "1 10 5\n1,-2 1:1\n", 2, "negative label id"},
    {"non_numeric_feature", reader::xc, "1 10 5\n0 a:1\n", 2, "non-numeric feature id"},
    {"non_numeric_label", reader::xc, "1 10 5\nx 1:1\n", 2, "non-numeric label id"},
    {"non_numeric_value", reader::xc, "1 10 5\n0 1:abc\n", 2, "non-numeric value"},
    {"double_sign_value", reader::xc, "1 10 5\n0 1:+-3\n", 2, "non-numeric value"},
    {"garbage_after_value", reader::xc, "1 10 5\n0 1:0.5x\n", 2, "unexpected character"},
    {"second_colon", reader::xc, "1 10 5\n0 1:0.5:2\n", 2, "unexpected character"},
    {"stray_cr", reader::xc, "1 10 5\n0 1:1\r 2:1\n", 2, "unexpected character"},
    {"bad_char_in_labels", reader::xc, "1 10 5\n1;2 1:1\n", 2, "label list"},
    // Non-finite values.
    {"nan_value", reader::xc, "1 10 5\n0 1:nan\n", 2, "NaN or infinite"},
    {"NaN_value", reader::xc, "1 10 5\n0 1:NaN\n", 2, "NaN or infinite"},
    {"inf_value", reader::xc, "1 10 5\n0 1:inf\n", 2, "NaN or infinite"},
    {"minus_infinity_value", reader::xc, "1 10 5\n0 1:-Infinity\n", 2, "NaN or infinite"},
    {"overflow_value", reader::xc, "1 10 5\n0 1:1e39\n", 2, "float range"},
    // Duplicates.
    {"duplicate_feature", reader::xc, "1 10 5\n0 1:1 1:2\n", 2,
     "duplicate feature id 1 (column 7)"},
    {"duplicate_feature_unsorted", reader::xc, "1 10 5\n0 7:1 2:1 7:2\n", 2,
     "duplicate feature id 7 (column 11)"},
    {"duplicate_label", reader::xc, "2 10 5\n0 1:1\n1,3,1 2:1\n", 3, "duplicate label 1"},
    // Whole-file problems and headers.
    {"missing_file", reader::xc, nullptr, 0, "cannot open"},
    {"empty_file", reader::xc, "", 0, "empty"},
    {"only_blank_lines", reader::xc, "\n \r\n\t\n", 0, "empty"},
    {"header_two_fields", reader::xc, "3 10\n0 1:1\n", 1, "bad header"},
    {"header_four_fields", reader::xc, "1 10 5 7\n0 1:1\n", 1, "bad header"},
    {"header_non_numeric", reader::xc, "a b c\n", 1, "bad header"},
    {"header_negative", reader::xc, "-1 10 5\n", 1, "bad header"},
    {"header_garbage", reader::xc, "1 10 5x\n0 1:1\n", 1, "bad header"},
    {"header_after_blank", reader::xc, "\n\n1 10\n", 3, "bad header"},
    {"header_too_large", reader::xc, "99999999999 10 5\n", 1, "too large"},
    // LibSVM.
    {"libsvm_feature_zero", reader::libsvm, "0 1:1\n1 0:1\n", 2, "1-based"},
    {"libsvm_negative", reader::libsvm, "0 -3:1\n", 1, "negative feature id"},
    {"libsvm_truncated", reader::libsvm, "0 1:1\n1 2:\n", 2, "truncated"},
    {"libsvm_duplicate_label", reader::libsvm, "0,0 1:1\n", 1, "duplicate label"},
    // LibSVM's ids are 1-based: the id named is the one written, not the one stored.
    {"libsvm_duplicate_feature", reader::libsvm, "0,1 3:1 3:0.5\n", 1,
     "duplicate feature id 3 (column 9)"},
    {"libsvm_duplicate_feature_unsorted", reader::libsvm, "0 7:1 2:1 7:2\n", 1,
     "duplicate feature id 7 (column 11)"},
    {"libsvm_empty", reader::libsvm, "", 0, "empty"},
    {"libsvm_blank", reader::libsvm, "\n\n", 0, "empty"},
    {"libsvm_missing", reader::libsvm, nullptr, 0, "cannot open"},
    // Split files (read with column 2 of data with 10 points).
    {"split_missing_column", reader::split, "1\n2\n", 1, "missing column"},
    {"split_non_numeric", reader::split, "1 2\n3 x\n", 2, "non-numeric"},
    {"split_non_numeric_other_column", reader::split, "1 2\ny 3\n", 2, "non-numeric"},
    {"split_negative", reader::split, "1 -2\n", 1, "negative"},
    {"split_zero", reader::split, "1 2\r\n3 0\r\n", 2, "out of range"},
    {"split_too_big", reader::split, "1 2\n3 11\n", 2, "out of range"},
    {"split_ragged", reader::split, "1 2\n3 4 5\n", 2, "ragged"},
    {"split_ragged_short", reader::split, "1 2\n\n3\n", 3, "ragged"},
    {"split_empty", reader::split, "", 0, "empty"},
    {"split_repeated_row", reader::split, "1 4\n2 9\n3 4\n", 3, "'4' repeats line 1's"},
    {"split_missing", reader::split, nullptr, 0, "cannot open"},
};

class DatasetMalformed : public ::testing::TestWithParam<bad_case> {};

TEST_P(DatasetMalformed, IsAnInputErrorWithLineAndReason) {
    const bad_case& c = GetParam();
    temp_dir dir;
    const std::string path = dir.file("input.txt");
    if (c.text) write_text(path, c.text);
    try {
        switch (c.kind) {
            case reader::xc:
                hslide::read_xc(path);
                break;
            case reader::libsvm:
                hslide::read_libsvm(path);
                break;
            case reader::split:
                hslide::read_split(path, 2, 10);
                break;
        }
        FAIL() << "no error for " << c.name;
    } catch (const hslide::input_error& e) {
        EXPECT_EQ(e.file(), path);
        EXPECT_EQ(e.line(), c.line) << e.what();
        EXPECT_NE(e.reason().find(c.reason), std::string::npos)
            << "reason '" << e.reason() << "' does not mention '" << c.reason << "'";
        EXPECT_EQ(e.exit_code(), 2);
    }
    // load_dataset reports the same error (XC and LibSVM chosen explicitly).
    if (c.kind != reader::split) {
        hslide::load_options opt;
        opt.format = c.kind == reader::xc ? hslide::data_format::xc : hslide::data_format::libsvm;
        opt.cache_dir = dir.file("cache");
        try {
            hslide::load_dataset(path, opt);
            FAIL() << "load_dataset: no error for " << c.name;
        } catch (const hslide::input_error& e) {
            EXPECT_EQ(e.line(), c.line) << e.what();
            EXPECT_NE(e.reason().find(c.reason), std::string::npos) << e.reason();
        }
        EXPECT_FALSE(std::filesystem::exists(dir.file("cache")) &&
                     !std::filesystem::is_empty(dir.file("cache")))
            << "a cache was written for a bad file";
    }
}

INSTANTIATE_TEST_SUITE_P(Table, DatasetMalformed, ::testing::ValuesIn(bad_cases),
                         [](const auto& info) { return std::string(info.param.name); });

// --- accepted variants -----------------------------------------------------------------------

TEST(DatasetXc, CrlfNoLabelPointsTrailingBlankLinesAndUnsortedFeatures) {
    const std::string text =
        "\r\n5 8 6\r\n"
        "1,4 3:0.5 1:-2 7:1e-3\r\n"  // unsorted: sorted with values
        " 0:+0.25 5:0\r\n"           // no labels (leading space); a 0 value is kept
        "2:1.5\t6:.5\r\n"            // no labels, nothing before the first f:v; tab separator
        "\r\n"                       // a blank line inside the data is skipped
        "5,0,3\r\n"                  // labels, no features
        "2 4:7 \r\n"                 // trailing space
        "\r\n\r\n  \r\n";
    const auto d = hslide::parse_xc(text, "mem");
    expect_valid(d);
    ASSERT_EQ(d.size(), 5u);
    EXPECT_EQ(d.n_features, 8u);
    EXPECT_EQ(d.n_labels, 6u);
    EXPECT_EQ(d.source, "mem");
    EXPECT_EQ(d.feature_offsets, (std::vector<uint64_t>{0, 3, 5, 7, 7, 8}));
    EXPECT_EQ(d.feature_ids, (std::vector<uint32_t>{1, 3, 7, 0, 5, 2, 6, 4}));
    EXPECT_EQ(d.feature_values,
              (std::vector<float>{-2.0f, 0.5f, 1e-3f, 0.25f, 0.0f, 1.5f, 0.5f, 7.0f}));
    EXPECT_EQ(d.label_offsets, (std::vector<uint64_t>{0, 2, 2, 2, 5, 6}));
    EXPECT_EQ(d.label_ids, (std::vector<uint32_t>{1, 4, 5, 0, 3, 2}));
}

TEST(DatasetXc, NoFinalNewlineAndEmptyDataset) {
    const auto d = hslide::parse_xc("2 4 3\n0 1:1\n2 3:2", "mem");
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d.feature_ids, (std::vector<uint32_t>{1, 3}));
    const auto e = hslide::parse_xc("0 4 3\n\n", "mem");
    EXPECT_EQ(e.size(), 0u);
    EXPECT_EQ(e.n_features, 4u);
}

TEST(DatasetXc, ByteOrderMarkIsSkipped) {
    const auto d = hslide::parse_xc(
        "\xEF\xBB\xBF"
        "1 4 3\r\n2 3:1\r\n",
        "mem");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d.label_ids, (std::vector<uint32_t>{2}));
    EXPECT_EQ(hslide::detect_format("\xEF\xBB\xBF"
                                    "1 4 3\n"),
              hslide::data_format::xc);
    EXPECT_EQ(hslide::parse_libsvm("\xEF\xBB\xBF"
                                   "1 4:1\n",
                                   "mem")
                  .feature_ids,
              (std::vector<uint32_t>{3}));
}

TEST(DatasetXc, TinyValuesUnderflowInsteadOfFailing) {
    const auto d = hslide::parse_xc("1 4 3\n0 1:1e-50 2:-1e-40 3:3.4e38\n", "mem");
    ASSERT_EQ(d.feature_values.size(), 3u);
    EXPECT_EQ(d.feature_values[0], 0.0f);
    EXPECT_LE(d.feature_values[1], 0.0f);
    EXPECT_GT(d.feature_values[1], -1e-38f);
    EXPECT_FLOAT_EQ(d.feature_values[2], 3.4e38f);
}

TEST(DatasetXc, RandomDatasetsRoundTripThroughText) {
    hslide::rng shuffle_gen(99);
    // Awkward sizes: one point, a prime count, a tiny feature space, 2^32 features.
    const struct {
        size_t n;
        uint64_t d, l;
    } shapes[] = {{1, 3, 1}, {37, 5, 2}, {1013, 4099, 631}, {200, uint64_t{1} << 32, 1u << 20}};
    uint64_t seed = 11;
    for (const auto& s : shapes) {
        const auto d = random_dataset(seed++, s.n, s.d, s.l);
        for (int variant = 0; variant < 4; ++variant) {
            const bool crlf = variant & 1;
            const bool shuffled = variant & 2;
            const auto text = to_text(d, false, crlf, shuffled ? &shuffle_gen : nullptr);
            const auto back = hslide::parse_xc(text, "mem");
            expect_valid(back);
            expect_same(d, back);
        }
    }
}

TEST(DatasetLibsvm, OneBasedFeaturesAndBoundsFromTheData) {
    // Yeast-style trailing spaces; one point without labels.
    const std::string text = "2,3 1:0.5 4:-1 \n 2:2 \n0 103:1\n";
    const auto d = hslide::parse_libsvm(text, "mem");
    expect_valid(d);
    ASSERT_EQ(d.size(), 3u);
    EXPECT_EQ(d.feature_ids, (std::vector<uint32_t>{0, 3, 1, 102}));
    EXPECT_EQ(d.n_features, 103u);
    EXPECT_EQ(d.n_labels, 4u);
    EXPECT_EQ(d.label_ids, (std::vector<uint32_t>{2, 3, 0}));
    const auto m = hslide::parse_libsvm(text, "mem", 500, 20);
    EXPECT_EQ(m.n_features, 500u);
    EXPECT_EQ(m.n_labels, 20u);
    EXPECT_EQ(m.feature_ids, d.feature_ids);
}

TEST(DatasetLibsvm, RandomDatasetsRoundTrip) {
    hslide::rng shuffle_gen(5);
    auto d = random_dataset(77, 503, 1000, 97);
    const auto text = to_text(d, true, true, &shuffle_gen);
    const auto back = hslide::parse_libsvm(text, "mem", d.n_features, d.n_labels);
    expect_same(d, back);
}

TEST(DatasetFormat, Detection) {
    using hslide::data_format;
    EXPECT_EQ(hslide::detect_format("3 10 5\n0 1:1\n"), data_format::xc);
    EXPECT_EQ(hslide::detect_format("\r\n 3\t10 5 \r\n"), data_format::xc);
    EXPECT_EQ(hslide::detect_format("0 1:1\n"), data_format::libsvm);
    EXPECT_EQ(hslide::detect_format("1,2 3:1\n"), data_format::libsvm);
    EXPECT_EQ(hslide::detect_format("3 10 -5\n"), data_format::libsvm);
    EXPECT_EQ(hslide::detect_format("3 10 5 6\n"), data_format::libsvm);
    EXPECT_EQ(hslide::detect_format(""), data_format::libsvm);
}

TEST(DatasetFormat, AFirstLineOfNumbersThatIsNoHeaderIsReportedAsAHeader) {
    // Detected as LibSVM (an XC header is three whole numbers), such a line failed on a LibSVM
    // complaint ("truncated feature '6'"): the user wrote a header, and the error says so.
    temp_dir dir;
    hslide::load_options opt;
    opt.use_cache = false;
    const std::pair<const char*, size_t> headers[] = {
        {"10 6\n0 1:1\n", 1}, {"10 6.0 4\n0 1:1\n", 1}, {"\n\n10 -6 4\n0 1:1\n", 3}};
    for (const auto& [text, line] : headers) {
        write_text(dir.file("d.txt"), text);
        try {
            hslide::load_dataset(dir.file("d.txt"), opt);
            FAIL() << text;
        } catch (const hslide::input_error& e) {
            EXPECT_EQ(e.line(), line) << e.what();
            EXPECT_NE(e.reason().find("bad header"), std::string::npos) << e.what();
        }
    }
    // A LibSVM file whose first line is a point of labels alone fails later on its own error.
    write_text(dir.file("d.txt"), "1\n0 1:1\n0 x\n");
    try {
        hslide::load_dataset(dir.file("d.txt"), opt);
        FAIL();
    } catch (const hslide::input_error& e) {
        EXPECT_EQ(e.line(), 3u) << e.what();
        EXPECT_NE(e.reason().find("feature id"), std::string::npos) << e.what();
    }
}

TEST(DatasetFormat, ANulByteEndsTheReadAtOnceEvenFromADeviceThatNeverEnds) {
    // /dev/zero was read until the memory ran out, before the parser saw its first line.
    temp_dir dir;
    write_text(dir.file("nul.txt"), std::string("1 10 5\n0 1:1\0 2:1\n", 17));
    hslide::load_options opt;
    opt.use_cache = false;
    for (const auto& [path, line] :
         {std::pair<std::string, size_t>{dir.file("nul.txt"), 2}, {"/dev/zero", 1}}) {
        try {
            hslide::load_dataset(path, opt);
            FAIL() << path;
        } catch (const hslide::input_error& e) {
            EXPECT_EQ(e.line(), line) << e.what();
            EXPECT_NE(e.reason().find("a NUL byte"), std::string::npos) << e.what();
        }
    }
}

TEST(DatasetSplit, ReadsTheColumnAsZeroBasedRows) {
    temp_dir dir;
    const auto path = dir.file("split.txt");
    write_text(path, "3 1 7\r\n7\t2   1\r\n\r\n");
    EXPECT_EQ(hslide::read_split(path, 1, 7), (std::vector<uint32_t>{2, 6}));
    EXPECT_EQ(hslide::read_split(path, 3, 7), (std::vector<uint32_t>{6, 0}));
    EXPECT_THROW(hslide::read_split(path, 0, 7), hslide::error);
    EXPECT_THROW(hslide::read_split(path, 1, 6), hslide::input_error);
}

TEST(DatasetOps, SubsetAndPushBack) {
    const auto d = random_dataset(3, 50, 300, 40);
    const std::vector<uint32_t> rows = {49, 0, 7, 7, 22};
    const auto s = hslide::subset(d, rows);
    expect_valid(s);
    ASSERT_EQ(s.size(), rows.size());
    EXPECT_EQ(s.n_features, d.n_features);
    for (size_t i = 0; i < rows.size(); ++i) {
        const auto a = s.features(i), b = d.features(rows[i]);
        ASSERT_EQ(a.count, b.count);
        EXPECT_TRUE(std::equal(a.ids, a.ids + a.count, b.ids));
        EXPECT_TRUE(std::equal(a.values, a.values + a.count, b.values));
        const auto la = s.labels(i), lb = d.labels(rows[i]);
        ASSERT_EQ(la.count, lb.count);
        EXPECT_TRUE(std::equal(la.ids, la.ids + la.count, lb.ids));
    }
    EXPECT_THROW(hslide::subset(d, {50}), hslide::error);

    hslide::dataset e;
    e.n_features = 10;
    e.n_labels = 4;
    const uint32_t f_ok[] = {1, 5}, f_unsorted[] = {5, 1}, f_big[] = {10};
    const float v[] = {1.0f, 2.0f};
    const uint32_t l_ok[] = {3, 0}, l_dup[] = {2, 2}, l_big[] = {4};
    e.push_back(f_ok, v, 2, l_ok, 2);
    EXPECT_THROW(e.push_back(f_unsorted, v, 2, l_ok, 2), hslide::error);
    EXPECT_THROW(e.push_back(f_big, v, 1, l_ok, 2), hslide::error);
    EXPECT_THROW(e.push_back(f_ok, v, 2, l_dup, 2), hslide::error);
    EXPECT_THROW(e.push_back(f_ok, v, 2, l_big, 1), hslide::error);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(e.label_ids, (std::vector<uint32_t>{3, 0}));
    expect_valid(e);
}

// --- robustness ------------------------------------------------------------------------------

// Parses `text` both ways: it must either succeed with a valid dataset or throw input_error.
void parse_or_input_error(const std::string& text) {
    for (int libsvm = 0; libsvm < 2; ++libsvm) {
        try {
            const auto d =
                libsvm ? hslide::parse_libsvm(text, "fuzz") : hslide::parse_xc(text, "fuzz");
            expect_valid(d);
        } catch (const hslide::input_error&) {
        }
    }
}

TEST(DatasetRobustness, RandomBytesGiveInputErrorsNotCrashes) {
    hslide::rng gen(2024);
    const std::string alphabet = "0123456789:, \t\r\n-+.eEnaif";
    int errors = 0;
    for (int round = 0; round < 3000; ++round) {
        std::string text(1 + gen.below(200), '\0');
        const bool bytes = round % 2 == 0;
        for (auto& c : text) {
            c = bytes ? static_cast<char>(gen.below(256)) : alphabet[gen.below(alphabet.size())];
        }
        if (round % 3 == 0) text = "4 50 20\n" + text;
        try {
            hslide::parse_xc(text, "fuzz");
        } catch (const hslide::input_error&) {
            ++errors;
        }
        parse_or_input_error(text);
    }
    EXPECT_GT(errors, 2900);  // almost all garbage must be rejected
    // Random bytes as a file, through every reader.
    temp_dir dir;
    std::string bytes(4096, '\0');
    for (auto& c : bytes) c = static_cast<char>(gen.below(256));
    write_text(dir.file("junk"), bytes);
    EXPECT_THROW(hslide::read_xc(dir.file("junk")), hslide::input_error);
    EXPECT_THROW(hslide::read_libsvm(dir.file("junk")), hslide::input_error);
    EXPECT_THROW(hslide::read_split(dir.file("junk"), 1, 100), hslide::input_error);
    hslide::load_options opt;
    opt.cache_dir = dir.file("cache");
    EXPECT_THROW(hslide::load_dataset(dir.file("junk"), opt), hslide::input_error);
}

TEST(DatasetRobustness, MutatedValidTextNeverCrashes) {
    hslide::rng gen(31337);
    const auto d = random_dataset(8, 40, 60, 12);
    const auto base = to_text(d, false, false, nullptr);
    for (int round = 0; round < 2000; ++round) {
        std::string text = base;
        const int edits = 1 + static_cast<int>(gen.below(4));
        for (int k = 0; k < edits; ++k) {
            const size_t at = gen.below(text.size());
            switch (gen.below(3)) {
                case 0:
                    text[at] = static_cast<char>(gen.below(256));
                    break;
                case 1:
                    text.erase(at, 1 + gen.below(5));
                    break;
                default:
                    text.insert(at, 1, ":, \n-0"[gen.below(6)]);
                    break;
            }
            if (text.empty()) text = "x";
        }
        parse_or_input_error(text);
    }
}

// --- the binary cache ------------------------------------------------------------------------

struct cache_fixture {
    temp_dir dir;
    std::string source = dir.file("data.txt");
    hslide::load_options opt;
    hslide::dataset original = random_dataset(21, 301, 2000, 150);
    cache_fixture() {
        opt.cache_dir = dir.file("cache");
        write_text(source, to_text(original, false, false, nullptr));
    }
    std::string cache() const { return hslide::cache_path_for(source, opt); }
};

TEST(DatasetCache, SecondLoadUsesTheCacheAndEqualsTheParse) {
    cache_fixture f;
    const auto first = hslide::load_dataset(f.source, f.opt);
    expect_same(first, f.original);
    ASSERT_TRUE(std::filesystem::exists(f.cache()));
    EXPECT_NE(f.cache().find(f.dir.file("cache/data.txt-")), std::string::npos) << f.cache();
    const auto second = hslide::load_dataset(f.source, f.opt);
    expect_same(second, f.original);
    EXPECT_EQ(second.source, f.source);
    // The cache bytes are stable: a third load does not rewrite it.
    const auto before = read_text(f.cache());
    hslide::load_dataset(f.source, f.opt);
    EXPECT_EQ(read_text(f.cache()), before);
    // A cache for the source with use_cache = false is neither read nor needed.
    hslide::load_options no_cache = f.opt;
    no_cache.use_cache = false;
    no_cache.cache_dir = f.dir.file("unused");
    expect_same(hslide::load_dataset(f.source, no_cache), f.original);
    EXPECT_FALSE(std::filesystem::exists(f.dir.file("unused")));
}

TEST(DatasetCache, HitKeepsTheCacheFileAndMissReplacesIt) {
    // A hit reads the cache and leaves the file alone; a miss writes a new file through a
    // rename, which gives it a new inode.
    cache_fixture f;
    hslide::load_dataset(f.source, f.opt);
    struct stat a {
    }, b{}, c{};
    ASSERT_EQ(stat(f.cache().c_str(), &a), 0);
    expect_same(hslide::load_dataset(f.source, f.opt), f.original);
    ASSERT_EQ(stat(f.cache().c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << "the second load did not use the cache";
    write_text(f.source, to_text(f.original, false, true, nullptr));  // same points, CRLF
    expect_same(hslide::load_dataset(f.source, f.opt), f.original);
    ASSERT_EQ(stat(f.cache().c_str(), &c), 0);
    EXPECT_NE(b.st_ino, c.st_ino) << "a changed source did not rewrite the cache";
}

TEST(DatasetCache, ModifiedSourceInvalidatesTheCache) {
    cache_fixture f;
    hslide::load_dataset(f.source, f.opt);
    // New content of a different size.
    const auto other = random_dataset(22, 120, 2000, 150);
    write_text(f.source, to_text(other, false, true, nullptr));
    expect_same(hslide::load_dataset(f.source, f.opt), other);
    // Same size and the old mtime, different content: only the checksum can tell.
    struct stat st {};
    ASSERT_EQ(stat(f.source.c_str(), &st), 0);
    std::string text = read_text(f.source);
    const size_t at = text.find(':', text.size() / 2);
    ASSERT_NE(at, std::string::npos);
    ASSERT_TRUE(text[at + 1] >= '0' && text[at + 1] <= '9');
    text[at + 1] = text[at + 1] == '7' ? '8' : '7';
    write_text(f.source, text);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, f.source.c_str(), times, 0), 0);
    expect_same(hslide::load_dataset(f.source, f.opt), hslide::parse_xc(text, f.source));
}

TEST(DatasetCache, CorruptOrTruncatedCacheIsRebuilt) {
    cache_fixture f;
    hslide::load_dataset(f.source, f.opt);
    const std::string good = read_text(f.cache());
    hslide::rng gen(4);
    const std::vector<std::function<std::string()>> damage = {
        [&] { return std::string(); },                    // empty
        [&] { return good.substr(0, 100); },              // inside the header
        [&] { return good.substr(0, good.size() / 2); },  // truncated payload
        [&] { return good + "x"; },                       // trailing byte
        [&] {
            std::string b = good;
            b[20] ^= 1;
            return b;
        },  // header bit
        [&] {
            std::string b = good;
            b[200] ^= 0x10;
            return b;
        },  // offsets bit
        [&] {
            std::string b = good;
            b[good.size() / 2] ^= 0x80;
            return b;
        },  // payload bit
        [&] {
            std::string b(good.size(), '\0');
            for (auto& c : b) c = static_cast<char>(gen.below(256));
            return b;
        },
        [&] {
            std::string b = good;
            b[0] = 'X';
            return b;
        },  // magic
    };
    for (size_t i = 0; i < damage.size(); ++i) {
        write_text(f.cache(), damage[i]());
        const auto d = hslide::load_dataset(f.source, f.opt);
        expect_same(d, f.original);
        EXPECT_EQ(read_text(f.cache()), good) << "damage " << i << ": cache not rebuilt";
    }
}

TEST(DatasetCache, FormatAndLibsvmMinimaAreRecorded) {
    temp_dir dir;
    const auto d = random_dataset(9, 80, 300, 30);
    const auto path = dir.file("train.svm");
    write_text(path, to_text(d, true, false, nullptr));
    hslide::load_options opt;
    opt.cache_dir = dir.file("cache");
    const auto a = hslide::load_dataset(path, opt);  // automatic: LibSVM
    EXPECT_LE(a.n_features, 300u);
    EXPECT_EQ(a.feature_ids, d.feature_ids);
    opt.min_features = 1000;
    opt.min_labels = 64;
    const auto b = hslide::load_dataset(path, opt);
    EXPECT_EQ(b.n_features, 1000u);
    EXPECT_EQ(b.n_labels, 64u);
    const auto c = hslide::load_dataset(path, opt);  // from the cache, same minima
    expect_same(b, c);
    opt.format = hslide::data_format::libsvm;
    expect_same(hslide::load_dataset(path, opt), b);
    // Asking for XC explicitly must not reuse the LibSVM cache: the text has no header.
    opt.format = hslide::data_format::xc;
    EXPECT_THROW(hslide::load_dataset(path, opt), hslide::input_error);
}

TEST(DatasetCache, CachePathRules) {
    temp_dir dir;
    const auto path = dir.file("d.txt");
    write_text(path, "1 3 2\n0 1:1\n");
    // Beside a writable source by default.
    EXPECT_EQ(hslide::cache_path_for(path), path + ".hscache");
    hslide::load_dataset(path);
    EXPECT_TRUE(std::filesystem::exists(path + ".hscache"));
    // cache_dir overrides, with a name derived from the absolute path.
    hslide::load_options opt;
    opt.cache_dir = "/some/where";
    const auto p1 = hslide::cache_path_for(path, opt);
    EXPECT_EQ(p1.rfind("/some/where/d.txt-", 0), 0u) << p1;
    EXPECT_NE(p1, hslide::cache_path_for(dir.file("sub/d.txt"), opt));
    // A read-only (r-x) folder falls back to $XDG_CACHE_HOME/hslide, even for root.
    const auto ro = dir.file("ro");
    std::filesystem::create_directory(ro);
    write_text(ro + "/d.txt", "1 3 2\n0 1:1\n");
    ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
    const char* old_xdg = std::getenv("XDG_CACHE_HOME");
    const std::string saved = old_xdg ? old_xdg : "";
    setenv("XDG_CACHE_HOME", dir.file("xdg").c_str(), 1);
    const auto p2 = hslide::cache_path_for(ro + "/d.txt");
    EXPECT_EQ(p2.rfind(dir.file("xdg/hslide/d.txt-"), 0), 0u) << p2;
    const auto d = hslide::load_dataset(ro + "/d.txt");
    EXPECT_EQ(d.size(), 1u);
    EXPECT_TRUE(std::filesystem::exists(p2));
    EXPECT_FALSE(std::filesystem::exists(ro + "/d.txt.hscache"));
    if (old_xdg) {
        setenv("XDG_CACHE_HOME", saved.c_str(), 1);
    } else {
        unsetenv("XDG_CACHE_HOME");
    }
    chmod(ro.c_str(), 0755);
}

// --- the real datasets -----------------------------------------------------------------------

TEST(DatasetReal, Bibtex) {
    HSLIDE_REQUIRE_SHARED_DATA();
    const auto dir = hslide::testing::shared_data_dir() + "/bibtex/";
    const auto d = hslide::read_xc(dir + "Bibtex_data.txt");
    expect_valid(d);
    EXPECT_EQ(d.size(), 7395u);
    EXPECT_EQ(d.n_features, 1836u);
    EXPECT_EQ(d.n_labels, 159u);
    // First point of the file: labels 48,131, first feature 44 with value 1.
    ASSERT_EQ(d.labels(0).count, 2u);
    EXPECT_EQ(d.labels(0).ids[0], 48u);
    EXPECT_EQ(d.labels(0).ids[1], 131u);
    EXPECT_EQ(d.features(0).ids[0], 44u);
    EXPECT_EQ(d.features(0).values[0], 1.0f);
    const auto train = hslide::read_split(dir + "bibtex_trSplit.txt", 1, d.size());
    const auto test = hslide::read_split(dir + "bibtex_tstSplit.txt", 1, d.size());
    EXPECT_EQ(train.size(), 4880u);
    EXPECT_EQ(test.size(), 2515u);
    EXPECT_EQ(hslide::read_split(dir + "bibtex_trSplit.txt", 10, d.size()).size(), 4880u);
    EXPECT_THROW(hslide::read_split(dir + "bibtex_trSplit.txt", 11, d.size()), hslide::input_error);
    // Train and test partition the points.
    std::vector<uint32_t> all = train;
    all.insert(all.end(), test.begin(), test.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
    EXPECT_EQ(all.front(), 0u);
    EXPECT_EQ(all.back(), 7394u);
    const auto tr = hslide::subset(d, train);
    EXPECT_EQ(tr.size(), 4880u);
    expect_valid(tr);

    // Through the cache (the shared folder is read-only, so use a temp cache_dir).
    temp_dir cache;
    hslide::load_options opt;
    opt.cache_dir = cache.path();
    expect_same(hslide::load_dataset(dir + "Bibtex_data.txt", opt), d);
    expect_same(hslide::load_dataset(dir + "Bibtex_data.txt", opt), d);
    // Never beside the read-only shared data.
    EXPECT_NE(hslide::cache_path_for(dir + "Bibtex_data.txt"), dir + "Bibtex_data.txt.hscache");
}

TEST(DatasetReal, Corel5kAndYeast) {
    HSLIDE_REQUIRE_SHARED_DATA();
    const auto root = hslide::testing::shared_data_dir();
    const auto tr = hslide::read_xc(root + "/corel5k/corel5k_train.txt");
    const auto te = hslide::read_xc(root + "/corel5k/corel5k_test.txt");
    expect_valid(tr);
    expect_valid(te);
    EXPECT_EQ(tr.size(), 4500u);
    EXPECT_EQ(te.size(), 500u);
    EXPECT_EQ(tr.n_features, 499u);
    EXPECT_EQ(tr.n_labels, 374u);

    const auto ytr = hslide::read_libsvm(root + "/yeast/yeast_train.txt");
    expect_valid(ytr);
    EXPECT_EQ(ytr.size(), 1500u);
    EXPECT_EQ(ytr.n_features, 103u);
    EXPECT_EQ(ytr.n_labels, 14u);
    EXPECT_EQ(ytr.features(0).count, 103u);  // dense rows
    EXPECT_EQ(ytr.features(0).ids[0], 0u);   // 1-based in the file
    const auto yte =
        hslide::read_libsvm(root + "/yeast/yeast_test.txt", ytr.n_features, ytr.n_labels);
    EXPECT_EQ(yte.size(), 917u);
    EXPECT_EQ(yte.n_features, 103u);
    EXPECT_EQ(yte.n_labels, 14u);
    // Auto-detection picks the right reader for both.
    temp_dir cache;
    hslide::load_options opt;
    opt.cache_dir = cache.path();
    expect_same(hslide::load_dataset(root + "/yeast/yeast_train.txt", opt), ytr);
    expect_same(hslide::load_dataset(root + "/corel5k/corel5k_test.txt", opt), te);
}

}  // namespace
