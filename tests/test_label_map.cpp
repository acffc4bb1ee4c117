// Tests of the output rows' label map: which labels get rows, the rewrite of label ids into row
// ids (a bijection that keeps unseen labels countable), a checkpoint round trip, and the CLI
// end to end (eval of a saved model equals training's final line; predict writes label ids).
#include "hslide/label_map.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include "hslide/checkpoint.hpp"
#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

namespace {

using namespace hslide;

using hslide::testing::label_dataset;

TEST(LabelMap, RowsAreTheCarriedLabelsAscendingAndEveryLabelCarriedIsTheIdentity) {
    const dataset some = label_dataset({{7, 2}, {}, {2, 9}}, 12);
    EXPECT_EQ(carried_labels(some).labels, (std::vector<uint32_t>{2, 7, 9}));
    const dataset all = label_dataset({{1, 0}, {2}}, 3);
    EXPECT_TRUE(carried_labels(all).identity());
}

TEST(LabelMap, AutoIsCarriedOnlyWhereMostLabelIdsHaveNoPoint) {
    const dataset few = label_dataset({{7, 2}, {}, {2, 9}}, 12);      // 3 of 12 carried
    const dataset most = label_dataset({{0, 1, 2}, {3, 4}, {6}}, 8);  // 6 of 8
    const dataset half = label_dataset({{0, 1}}, 4);                  // 2 of 4
    EXPECT_EQ(output_label_rows(few, "auto").labels, (std::vector<uint32_t>{2, 7, 9}));
    EXPECT_TRUE(output_label_rows(most, "auto").identity());
    EXPECT_EQ(output_label_rows(half, "auto").labels, (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(output_label_rows(most, "carried").labels, (std::vector<uint32_t>{0, 1, 2, 3, 4, 6}));
    EXPECT_TRUE(output_label_rows(few, "all").identity());
    EXPECT_THROW(output_label_rows(few, "some"), error);
}

TEST(LabelMap, RewriteIsABijectionThatPutsLabelsWithoutRowsAtOrAboveTheRowCount) {
    for (const uint64_t n_labels : {1u, 15u, 16u, 17u, 33u, 1000u}) {
        rng r(n_labels * 7 + 1);
        label_map map;
        for (uint32_t l = 0; l < n_labels; ++l)
            if (r() % 3 == 0) map.labels.push_back(l);
        if (map.labels.empty()) map.labels.push_back(uint32_t(n_labels - 1));
        // Every label once, in a shuffled order, one to a point.
        std::vector<std::vector<uint32_t>> rows;
        for (uint32_t l = 0; l < n_labels; ++l) rows.push_back({l});
        for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[r() % i]);
        dataset data = label_dataset(rows, n_labels);
        labels_to_rows(data, map);
        EXPECT_EQ(data.n_labels, n_labels);
        std::set<uint32_t> seen;
        for (size_t p = 0; p < rows.size(); ++p) {
            const uint32_t label = rows[p][0], id = data.label_ids[p];
            ASSERT_LT(id, n_labels);
            seen.insert(id);
            const auto at = std::lower_bound(map.labels.begin(), map.labels.end(), label);
            if (at != map.labels.end() && *at == label) {
                EXPECT_EQ(id, uint32_t(at - map.labels.begin()));
                EXPECT_EQ(map.label_of_row(id), label);
            } else {
                EXPECT_GE(id, map.labels.size()) << "label " << label;
            }
        }
        EXPECT_EQ(seen.size(), n_labels) << "two labels share an id";
    }
}

TEST(LabelMap, TheIdentityLeavesTheDataAndAMapNotAscendingIsRefused) {
    dataset data = label_dataset({{3, 1}}, 4);
    labels_to_rows(data, label_map{});
    EXPECT_EQ(data.label_ids, (std::vector<uint32_t>{3, 1}));
    label_map bad;
    bad.labels = {1, 1};
    EXPECT_THROW(labels_to_rows(data, bad), hslide::error);
    bad.labels = {2, 1};
    EXPECT_THROW(labels_to_rows(data, bad), hslide::error);
}

TEST(LabelMap, DataWithFewerLabelsThanTheMapNamesGrowsToHoldThem) {
    label_map map;
    map.labels = {0, 40};
    dataset data = label_dataset({{5}, {0}}, 6);  // a LibSVM file knows only its largest id
    labels_to_rows(data, map);
    EXPECT_EQ(data.n_labels, 41u);
    EXPECT_EQ(data.label_ids, (std::vector<uint32_t>{2 + 4, 0}));
}

TEST(LabelMap, TheTrainCommandsCheckpointKeepsTheMapAndEvalAndPredictUseIt) {
    const std::string dir = ::testing::TempDir() + "hslide_label_map";
    std::filesystem::create_directories(dir);
    const std::string data = dir + "/data";
    ASSERT_EQ(
        hslide::testing::run_hslide("gen --preset amazon670k --scale 0.001 --labels 4000 --seed 3 "
                                    "--out " +
                                    data)
            .exit_code,
        0);
    const std::string model = dir + "/model.ck";
    const auto trained = hslide::testing::run_hslide(
        "train --train " + data + "/train.txt --test " + data +
        "/test.txt --epochs 1 --threads 2 --no-progress --label-rows carried "
        "--hidden 32 --save " +
        model);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    load_options no_cache;
    no_cache.use_cache = false;
    const dataset train = load_dataset(data + "/train.txt", no_cache);
    const label_map carried = carried_labels(train);
    ASSERT_FALSE(carried.identity()) << "the test needs labels no training point carries";
    const checkpoint_contents ck = load_checkpoint(model);
    EXPECT_EQ(ck.rows.labels, carried.labels);
    EXPECT_EQ(ck.model.config.output_dim(), carried.labels.size());
    // eval's metrics are training's final ones: the test set rewritten alike.
    const auto evaluated = hslide::testing::run_hslide("eval --model " + model + " --test " + data +
                                                       "/test.txt --threads 2");
    ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
    const auto p1 = [](const std::string& text) {
        const size_t at = text.rfind("P@1 ");
        return at == std::string::npos ? std::string() : text.substr(at, 10);
    };
    EXPECT_FALSE(p1(evaluated.output).empty());
    EXPECT_EQ(p1(evaluated.output), p1(trained.output));
    // predict writes label ids, each one a training point carries.
    const std::string out = dir + "/pred.txt";
    ASSERT_EQ(hslide::testing::run_hslide("predict --model " + model + " --data " + data +
                                          "/test.txt --out " + out + " --threads 2")
                  .exit_code,
              0);
    uint32_t above_rows = 0;
    for (const std::string& line : hslide::testing::read_lines(out)) {
        size_t begin = 0;
        while (begin < line.size()) {
            const uint32_t label = uint32_t(std::stoul(line.substr(begin)));
            EXPECT_TRUE(std::binary_search(carried.labels.begin(), carried.labels.end(), label));
            above_rows += label >= carried.labels.size();
            const size_t space = line.find(' ', begin);
            begin = space == std::string::npos ? line.size() : space + 1;
        }
    }
    EXPECT_GT(above_rows, 0u) << "predict wrote row ids, not labels";
}

}  // namespace
