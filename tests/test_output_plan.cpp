// Tests of the automatic output layer (include/hslide/output_plan.hpp) and of what
// make_model_config makes of it: the set sizes at the shapes they were measured at, dense where
// a set would hold every row, given sizes kept, and automatic sizes resolved to numbers.
#include "hslide/model_options.hpp"
#include "hslide/output_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

using namespace hslide;

TEST(OutputPlan, SetSizesFollowTheRowsAsMeasured) {
    // The shapes of bench/peers.md and bench/topk.md: Bibtex, Corel5k, Debian-recs, Amazon-670K.
    EXPECT_EQ(automatic_set_size(159), 32u);
    EXPECT_EQ(automatic_set_size(374), 32u);
    EXPECT_EQ(automatic_set_size(6118), 128u);
    EXPECT_EQ(automatic_set_size(670091), 1024u);
    EXPECT_EQ(automatic_set_size(1), 32u);
    EXPECT_EQ(automatic_set_size(4000000000u), 1024u);
    uint32_t previous = 0;
    for (uint32_t rows = 1; rows < 2000000; rows = rows * 3 / 2 + 1) {
        const uint32_t size = automatic_set_size(rows);
        EXPECT_EQ(size & (size - 1), 0u) << rows << " rows: a power of two";
        EXPECT_GE(size, previous) << rows << " rows: never smaller for more rows";
        EXPECT_GE(double(size), std::min(1024.0, 1.6 * std::sqrt(double(rows)))) << rows;
        previous = size;
    }
    EXPECT_EQ(automatic_top_k(32), 16u);
    EXPECT_EQ(automatic_top_k(128), 32u);
    EXPECT_EQ(automatic_top_k(1024), 64u);
}

TEST(OutputPlan, AutoIsDenseWhereASetWouldHoldEveryRow) {
    const output_plan yeast = plan_output_layer(14, sparsity_mode::automatic, 0, 0);
    EXPECT_EQ(yeast.sparsity, sparsity_mode::dense);
    EXPECT_NE(yeast.reason.find("dense"), std::string::npos) << yeast.reason;
    const output_plan bibtex = plan_output_layer(159, sparsity_mode::automatic, 0, 0);
    EXPECT_EQ(bibtex.sparsity, sparsity_mode::topk);
    EXPECT_EQ(bibtex.min_active, 32u);
    EXPECT_EQ(bibtex.top_k, 16u);
    EXPECT_NE(bibtex.reason.find("32"), std::string::npos) << bibtex.reason;
    // Asked for top-k, a layer stays top-k even where the set covers it.
    EXPECT_EQ(plan_output_layer(14, sparsity_mode::topk, 0, 0).sparsity, sparsity_mode::topk);
    // Given sizes are kept; the other one still follows.
    const output_plan given = plan_output_layer(6118, sparsity_mode::automatic, 0, 512);
    EXPECT_EQ(given.min_active, 512u);
    EXPECT_EQ(given.top_k, 64u);
    const output_plan given_k = plan_output_layer(6118, sparsity_mode::automatic, 8, 0);
    EXPECT_EQ(given_k.min_active, 128u);
    EXPECT_EQ(given_k.top_k, 8u);
    EXPECT_EQ(plan_output_layer(100, sparsity_mode::automatic, 0, 100).sparsity,
              sparsity_mode::dense);
}

TEST(OutputPlan, ModelConfigResolvesAutoToNumbers) {
    model_options o;  // the defaults: output auto, --top-k and --min-active auto
    std::string choice;
    const model_config debian = make_model_config(o, 100, 6118, &choice);
    const layer_config& out = debian.layers.back();
    EXPECT_EQ(out.sparsity, sparsity_mode::topk);
    EXPECT_EQ(out.top_k, 32u);
    EXPECT_EQ(out.active.min_active, 128u);
    EXPECT_EQ(debian.selection(1), neuron_selection::top_k);
    EXPECT_NE(choice.find("128"), std::string::npos) << choice;

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
