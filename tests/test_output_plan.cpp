// Tests of the automatic output layer (include/hslide/output_plan.hpp) and of what
// make_model_config makes of it: the set sizes at the shapes they were measured at, dense where
// a set would hold every row, given sizes kept, and automatic sizes resolved to numbers.
#include "hslide/model_options.hpp"
#include "hslide/output_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace hslide;

TEST(OutputPlan, AutomaticHiddenWidthIsWideOnlyUnderASmallOutputLayerOverFewFeatures) {
    // 512 up to wide_hidden_max_rows output rows over up to wide_hidden_max_features features
    // (Bibtex, Corel5k, Yeast), 256 above either (Debian-recs, the Amazon-670K shape; Debian's
    // Provides and debtags: bench/peers.md).
    for (uint32_t features : {1u, 103u, 1836u, wide_hidden_max_features}) {
        for (uint32_t rows : {1u, 14u, 159u, 374u, wide_hidden_max_rows})
            EXPECT_EQ(automatic_hidden_width(features, rows), wide_hidden_width) << rows;
        for (uint32_t rows : {wide_hidden_max_rows + 1, 6118u, 69410u})
            EXPECT_EQ(automatic_hidden_width(features, rows), narrow_hidden_width) << rows;
    }
    for (uint32_t features : {wide_hidden_max_features + 1, 7406u, 15941u})
        for (uint32_t rows : {1u, 480u, 575u, 6118u})
            EXPECT_EQ(automatic_hidden_width(features, rows), narrow_hidden_width) << features;
    // make_model_config: the default (0) resolves per layer; a given width is kept, also
    // beside an automatic one; the output layer is the labels' rows whatever the width.
    model_options o;
    ASSERT_EQ(o.hidden, std::vector<uint32_t>{0});
    EXPECT_EQ(make_model_config(o, 100, 159).layers[0].size, 512u);
    EXPECT_EQ(make_model_config(o, 100, 6118).layers[0].size, 256u);
    EXPECT_EQ(make_model_config(o, 100, 6118).layers.back().size, 6118u);
    EXPECT_EQ(make_model_config(o, 7406, 480).layers[0].size, 256u);
    o.hidden = {0, 64};
    const model_config mixed = make_model_config(o, 100, 159);
    ASSERT_EQ(mixed.layers.size(), 3u);
    EXPECT_EQ(mixed.layers[0].size, 512u);
    EXPECT_EQ(mixed.layers[1].size, 64u);
    o.hidden = {128};
    EXPECT_EQ(make_model_config(o, 100, 159).layers[0].size, 128u);
}

TEST(OutputPlan, TheOutputLayersRateFallsAsItsRowsGrowPastTheBound) {
    // 1 up to output_lr_scale_rows (every real set), then bound / rows: about 0.177 at the
    // Amazon-670K shape's 69,410 carried rows (bench/peers.md).
    for (uint32_t rows : {1u, 14u, 374u, 6118u, output_lr_scale_rows})
        EXPECT_EQ(automatic_output_lr_scale(rows), 1.0f) << rows;
    EXPECT_LT(automatic_output_lr_scale(output_lr_scale_rows + 1), 1.0f);
    EXPECT_NEAR(automatic_output_lr_scale(69410), 0.177, 0.001);
    EXPECT_NEAR(automatic_output_lr_scale(670091), 0.0183, 0.0001);
    // make_model_config: auto (0) resolves to the rule on the output layer only, and says so
    // on the output line; a given scale is kept.
    model_options o;
    std::string choice;
    const model_config wide = make_model_config(o, 100, 69410, &choice);
    EXPECT_FLOAT_EQ(wide.layers.back().lr_scale, automatic_output_lr_scale(69410));
    EXPECT_EQ(wide.layers.front().lr_scale, 1.0f);
    EXPECT_NE(choice.find("0.177 x lr"), std::string::npos) << choice;
    const model_config narrow = make_model_config(o, 100, 6118, &choice);
    EXPECT_EQ(narrow.layers.back().lr_scale, 1.0f);
    EXPECT_EQ(choice.find("x lr"), std::string::npos) << choice;
    o.output_lr_scale = 0.5f;
    EXPECT_EQ(make_model_config(o, 100, 69410).layers.back().lr_scale, 0.5f);
}

TEST(OutputPlan, SetSizesFollowTheRowsAsMeasured) {
    // The shapes of bench/peers.md and bench/topk.md at the default batch of 128: Bibtex,
    // Corel5k, Debian-recs (where a step of sets of 128 touched 88% of the rows), Amazon-670K.
    EXPECT_EQ(automatic_set_size(159, 128), 32u);
    EXPECT_EQ(automatic_set_size(374, 128), 32u);
    EXPECT_EQ(automatic_set_size(6118, 128), 32u);
    EXPECT_EQ(automatic_set_size(670091, 128), 1024u);
    EXPECT_EQ(automatic_set_size(1, 128), 32u);
    EXPECT_EQ(automatic_set_size(4000000000u, 128), 1024u);
    // Smaller batches touch fewer rows a step: the rows' rule again.
    EXPECT_EQ(automatic_set_size(6118, 32), 128u);
    EXPECT_EQ(automatic_set_size(15658, 128), 64u);
    EXPECT_TRUE(set_size_bounded_by_touch(6118, 128));
    EXPECT_FALSE(set_size_bounded_by_touch(6118, 32));
    EXPECT_FALSE(set_size_bounded_by_touch(670091, 128));
    for (const uint32_t batch : {1u, 32u, 128u, 1024u}) {
        uint32_t previous = 0;
        for (uint32_t rows = 1; rows < 2000000; rows = rows * 3 / 2 + 1) {
            const uint32_t size = automatic_set_size(rows, batch);
            EXPECT_EQ(size & (size - 1), 0u) << rows << " rows: a power of two";
            EXPECT_GE(size, previous) << rows << " rows: never smaller for more rows";
            EXPECT_GE(size, 32u);
            EXPECT_LE(size, 1024u);
            const bool by_touch = set_size_bounded_by_touch(rows, batch);
            if (!by_touch)
                EXPECT_GE(double(size), std::min(1024.0, 1.6 * std::sqrt(double(rows))))
                    << rows << " rows, batch " << batch;
            else if (size > 32)  // a step of these sets touches at most half the rows
                EXPECT_LE(1.0 - std::exp(-double(batch) * size / rows), 0.5)
                    << rows << " rows, batch " << batch;
            previous = size;
        }
    }
    EXPECT_EQ(automatic_top_k(32), 16u);
    EXPECT_EQ(automatic_top_k(128), 32u);
    EXPECT_EQ(automatic_top_k(1024), 64u);
}

TEST(OutputPlan, AutoIsDenseWhereASetWouldHoldEveryRow) {
    const output_plan yeast = plan_output_layer(14, 128, sparsity_mode::automatic, 0, 0);
    EXPECT_EQ(yeast.sparsity, sparsity_mode::dense);
    EXPECT_NE(yeast.reason.find("dense"), std::string::npos) << yeast.reason;
    const output_plan bibtex = plan_output_layer(159, 128, sparsity_mode::automatic, 0, 0);
    EXPECT_EQ(bibtex.sparsity, sparsity_mode::topk);
    EXPECT_EQ(bibtex.min_active, 32u);
    EXPECT_EQ(bibtex.top_k, 16u);
    EXPECT_NE(bibtex.reason.find("32"), std::string::npos) << bibtex.reason;
    // Asked for top-k, a layer stays top-k even where the set covers it.
    EXPECT_EQ(plan_output_layer(14, 128, sparsity_mode::topk, 0, 0).sparsity, sparsity_mode::topk);
    // Given sizes are kept; the other one still follows.
    const output_plan given = plan_output_layer(6118, 128, sparsity_mode::automatic, 0, 512);
    EXPECT_EQ(given.min_active, 512u);
    EXPECT_EQ(given.top_k, 64u);
    const output_plan given_k = plan_output_layer(6118, 32, sparsity_mode::automatic, 8, 0);
    EXPECT_EQ(given_k.min_active, 128u);
    EXPECT_EQ(given_k.top_k, 8u);
    EXPECT_NE(given_k.reason.find("1.6 sqrt(rows)"), std::string::npos) << given_k.reason;
    // Where the rows' rule would touch most of the layer a step, the reason says so.
    const output_plan bounded = plan_output_layer(6118, 128, sparsity_mode::automatic, 0, 0);
    EXPECT_EQ(bounded.min_active, 32u);
    EXPECT_EQ(bounded.top_k, 16u);
    EXPECT_NE(bounded.reason.find("half the rows"), std::string::npos) << bounded.reason;
    EXPECT_EQ(plan_output_layer(100, 128, sparsity_mode::automatic, 0, 100).sparsity,
              sparsity_mode::dense);
}

TEST(OutputPlan, ModelConfigResolvesAutoToNumbers) {
    model_options o;  // the defaults: output auto, --top-k and --min-active auto
    std::string choice;
    const model_config debian = make_model_config(o, 100, 6118, &choice);
    const layer_config& out = debian.layers.back();
    EXPECT_EQ(out.sparsity, sparsity_mode::topk);
    EXPECT_EQ(out.top_k, 16u);
    EXPECT_EQ(out.active.min_active, 32u);
    EXPECT_EQ(debian.selection(1), neuron_selection::top_k);
    EXPECT_NE(choice.find("sets of 32"), std::string::npos) << choice;
    o.batch_size = 32;  // the batch the options carry sizes the sets
    const model_config small_batch = make_model_config(o, 100, 6118, &choice);
    EXPECT_EQ(small_batch.layers.back().active.min_active, 128u);
    EXPECT_EQ(small_batch.layers.back().top_k, 32u);
    o.batch_size = model_options{}.batch_size;

    const model_config yeast = make_model_config(o, 100, 14, &choice);
    EXPECT_EQ(yeast.layers.back().sparsity, sparsity_mode::dense);
    EXPECT_EQ(yeast.selection(1), neuron_selection::all);
    EXPECT_NE(choice.find("dense"), std::string::npos) << choice;

    // LSH layers' automatic fill is SLIDE's; an LSH output layer says nothing of a plan.
    o.output_sparsity = "lsh";
    o.hidden = {64, 64};
    o.hidden_sparsity = "lsh";
    const model_config lsh = make_model_config(o, 100, 6118, &choice);
    EXPECT_TRUE(choice.empty());
    EXPECT_EQ(lsh.layers[1].active.min_active, lsh_min_active);
    EXPECT_EQ(lsh.layers[2].active.min_active, lsh_min_active);

    // Given sizes are the user's.
    o = model_options{};
    o.min_active = {300};
    o.top_k = 5;
    const model_config given = make_model_config(o, 100, 6118);
    EXPECT_EQ(given.layers.back().active.min_active, 300u);
    EXPECT_EQ(given.layers.back().top_k, 5u);
}
