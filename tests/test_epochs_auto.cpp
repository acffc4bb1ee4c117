// Tests of --epochs auto (train_config::epochs_auto; validation.hpp's auto_epochs_defaults):
// parsing --epochs, the capped seeded hold-out, the trainer's stop on patience and its final
// record, that the CPU backend ends with exactly the model of a run of best-epoch epochs, that
// an interrupted auto run resumed from its checkpoint ends where the uninterrupted one does,
// and the command line's defaults, messages and --metrics-out records.
#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/error.hpp"
#include "hslide/model.hpp"
#include "hslide/model_options.hpp"
#include "hslide/synthetic.hpp"
#include "hslide/trainer.hpp"
#include "hslide/validation.hpp"
#include "scripted_backend.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

using namespace hslide;
using hslide::testing::expect_same_parameters;
using hslide::testing::generated_data_dir;
using hslide::testing::labelled_points;
using hslide::testing::run_hslide;
using hslide::testing::same_bytes;
using hslide::testing::scripted_backend;
using hslide::testing::temp_dir;

namespace {

trainer_options auto_options() {
    trainer_options o;
    parse_epochs("auto", o.train);
    o.train.batch_size = 10;
    o.train.seed = 7;
    o.show_progress = false;
    o.eval.show_progress = false;
    o.selection_probe_points = 0;
    return o;
}

/// The tiny synthetic preset's training points (deterministic).
const dataset& tiny_train() {
    static const dataset data = hslide::testing::tiny_synthetic_train(7);
    return data;
}

/// A CPU backend with a small network for tiny_train(), at a learning rate that overfits.
std::unique_ptr<backend> tiny_backend(const train_config& tc) {
    model_options mo;
    mo.hidden = {16};
    mo.min_active = {64};
    const model_config config =
        make_model_config(mo, uint32_t(tiny_train().n_features), uint32_t(tiny_train().n_labels));
    backend_options bo;
    bo.kind = backend_kind::cpu;
    bo.threads = 2;
    return create_backend(bo, model_state::create(config, tc.seed, tc.adam_moments), tc);
}

train_config tiny_train_config() {
    train_config tc;
    parse_epochs("auto", tc);
    tc.learning_rate = 0.03f;
    tc.batch_size = 32;
    tc.seed = 3;
    return tc;
}

/// Puts a scripted backend at epoch e's model (its "model" is the epoch it reached, which
/// export and import carry): where a run resumed from that epoch's checkpoint starts.
void start_at_epoch(scripted_backend& be, uint64_t e) {
    model_state at;
    at.adam_step = e;
    be.import_state(at, false);
}

model_state exported(const backend& be) {
    model_state m;
    be.export_state(m, /*with_optimizer=*/true);
    return m;
}

void expect_identical(const model_state& a, const model_state& b) {
    expect_same_parameters(a, b);
    ASSERT_EQ(a.layers.size(), b.layers.size());
    EXPECT_EQ(a.adam_step, b.adam_step);
    for (size_t l = 0; l < a.layers.size(); ++l) {
        const layer_state &x = a.layers[l], &y = b.layers[l];
        EXPECT_TRUE(same_bytes(x.adam_m, y.adam_m)) << "layer " << l;
        EXPECT_TRUE(same_bytes(x.adam_v, y.adam_v)) << "layer " << l;
    }
}

}  // namespace

TEST(EpochsAuto, EpochsParseAsAutoOrAPositiveCount) {
    train_config tc;
    parse_epochs("auto", tc);
    EXPECT_TRUE(tc.epochs_auto);
    EXPECT_EQ(tc.epochs, auto_epochs_defaults::max_epochs);
    EXPECT_EQ(epochs_to_string(tc), "auto");
    parse_epochs("7", tc);
    EXPECT_FALSE(tc.epochs_auto);
    EXPECT_EQ(tc.epochs, 7u);
    EXPECT_EQ(epochs_to_string(tc), "7");
    for (const char* bad : {"0", "foo", "-3", "", " 7", "7x", "2.5", "AUTO", "99999999999"}) {
        try {
            parse_epochs(bad, tc);
            ADD_FAILURE() << "accepted --epochs '" << bad << "'";
        } catch (const error& e) {
            EXPECT_NE(std::string(e.what()).find("--epochs"), std::string::npos) << e.what();
            EXPECT_EQ(e.kind(), error_kind::invalid_argument);
        }
    }
    EXPECT_EQ(tc.epochs, 7u) << "a refused value leaves the setting as it was";
}

TEST(EpochsAuto, TheHoldOutIsAFewSeededPointsCappedWhateverTheSize) {
    const dataset data = labelled_points(1000);
    const auto a = hold_out_for_auto_epochs(data, 5), b = hold_out_for_auto_epochs(data, 5);
    EXPECT_EQ(a.second.size(), 50u);  // 5%
    EXPECT_EQ(a.first.size(), 950u);
    EXPECT_EQ(a.second.label_ids, b.second.label_ids);
    // The cap keeps the first points of the uncapped draw.
    const auto capped = hold_out(data, 0.05, 5, 20);
    EXPECT_EQ(capped.second.size(), 20u);
    EXPECT_EQ(capped.first.size(), 980u);
    const auto big = hold_out_for_auto_epochs(labelled_points(100000), 1);
    EXPECT_EQ(big.second.size(), auto_epochs_defaults::holdout_max_points);
    // A handful of points still leaves one for validation and the rest for training.
    const auto few = hold_out_for_auto_epochs(labelled_points(3), 1);
    EXPECT_EQ(few.second.size(), 1u);
    EXPECT_EQ(few.first.size(), 2u);
    EXPECT_THROW(hold_out_for_auto_epochs(labelled_points(1), 1), error);
}

TEST(EpochsAuto, StopsOncePatienceRunsOutAndEndsWithTheBestModel) {
    const dataset train = labelled_points(40), valid = labelled_points(20);
    // Validation P@1 0.3, 0.7 (best), 0.5, 0.6, then better: the default patience (2 on this
    // 20-point hold-out; 1 on 200 points or more) stops after epoch 4, well before the cap,
    // and the model of epoch 2 is kept.
    scripted_backend be({3, 7, 5, 6, 9, 9, 9}, 40);
    trainer_options o = auto_options();
    o.validation.valid = &valid;
    o.validation.lr_drops = 0;  // stop at the first plateau (below: what a drop does)
    trainer run(be, train, nullptr, o);
    EXPECT_TRUE(run.options().validation.keep_best) << "auto keeps the best";
    EXPECT_EQ(to_string(run.options().validation.metric), "ndcg@5");
    const uint32_t patience = auto_epochs_defaults::patience_for(valid.size());
    EXPECT_EQ(patience, auto_epochs_defaults::small_holdout_patience);
    EXPECT_EQ(run.options().validation.patience, patience);
    const auto records = run.run();
    static_assert(auto_epochs_defaults::small_holdout_patience <= 2,
                  "the script has two worse epochs");
    ASSERT_EQ(records.size(), 2u + patience);
    EXPECT_EQ(run.best_epoch(), 2u);
    EXPECT_DOUBLE_EQ(run.best_value(), 0.7);
    EXPECT_EQ(run.epochs_run(), 2u + patience);
    ASSERT_EQ(be.imported, std::vector<uint64_t>{2});
    EXPECT_EQ(run.state().epochs_done, 2u);
    EXPECT_EQ(run.state().best_epoch, 2u);
    EXPECT_TRUE(run.state().epochs_auto);
    ASSERT_TRUE(run.final_record());
    EXPECT_EQ(run.final_record()->epoch, 2u);
    EXPECT_DOUBLE_EQ(run.final_record()->valid_metrics.p_at(1), 0.7);
    EXPECT_NE(run.record_json(records[0]).find("\"epochs\":\"auto\""), std::string::npos);

    // An explicit metric or patience replaces the default: patience 3 runs into epoch 5,
    // which is better.
    scripted_backend patient({3, 7, 5, 6, 9, 8, 8, 8, 8}, 40);
    o.validation.patience = 3;
    o.validation.keep_best = true;
    o.validation.metric = parse_selection_metric("p@3");
    trainer run3(patient, train, nullptr, o);
    EXPECT_EQ(to_string(run3.options().validation.metric), "p@3");
    EXPECT_EQ(run3.run().size(), 8u);
    EXPECT_EQ(run3.best_epoch(), 5u);

    // Without a validation set auto cannot choose: the front ends hold one out.
    trainer_options none = auto_options();
    try {
        trainer(be, train, nullptr, none);
        FAIL() << "auto without a validation set";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("--epochs auto needs a validation set"),
                  std::string::npos)
            << e.what();
    }
}

TEST(EpochsAuto, TheBestSnapshotKeepsAdamStateOnlyWhereSomethingTrainsOnFromIt) {
    const dataset train = labelled_points(40), valid = labelled_points(20);
    // Best at epoch 2, then two worse: the run goes back to epoch 2's snapshot at its end.
    struct flags {
        std::vector<bool> exported, imported;  // with_optimizer of each export and import
    };
    auto run_with = [&](bool after_run, int32_t drops) {
        scripted_backend be({3, 7, 5, 6, 9, 9, 9}, 40);
        trainer_options o = auto_options();
        o.validation.valid = &valid;
        o.validation.lr_drops = drops;
        o.optimizer_after_run = after_run;
        trainer(be, train, nullptr, o).run();
        EXPECT_FALSE(be.imported.empty()) << "the run went back to its best epoch";
        return flags{be.exported_with_optimizer, be.imported_with_optimizer};
    };
    auto all_are = [](const std::vector<bool>& f, bool value) {
        return !f.empty() && std::all_of(f.begin(), f.end(), [&](bool x) { return x == value; });
    };
    // The command line's case: nothing trains on from the snapshot, which holds weights alone.
    const flags bare = run_with(false, 0);
    EXPECT_TRUE(all_are(bare.exported, false));
    EXPECT_TRUE(all_are(bare.imported, false));
    // A caller that may save or train on after run(), or a drop: with Adam state.
    const flags caller = run_with(true, 0), dropping = run_with(false, 1);
    EXPECT_TRUE(all_are(caller.exported, true));
    EXPECT_TRUE(all_are(caller.imported, true));
    EXPECT_TRUE(all_are(dropping.exported, true));
    EXPECT_TRUE(all_are(dropping.imported, true));
}

TEST(EpochsAuto, APlateauGoesBackToTheBestModelAtATenthOfTheRate) {
    const dataset train = labelled_points(40), valid = labelled_points(20);
    // Validation P@1 0.3, 0.7 (best), 0.5: a plateau. Auto's default (one drop) goes back to
    // epoch 2's model and state, and trains epoch 3 again at a tenth of the rate (this script
    // scores a model by its epoch: 0.5 again), then stops at the second plateau.
    scripted_backend be({3, 7, 5, 6, 9}, 40);
    trainer_options o = auto_options();
    o.validation.valid = &valid;
    o.validation.patience = 1;  // a plateau after one epoch (this 20-point hold-out's default: 2)
    o.train.batch_size = 40;    // a batch an epoch
    trainer run(be, train, nullptr, o);
    EXPECT_EQ(run.options().validation.lr_drops, auto_epochs_defaults::lr_drops);
    const auto records = run.run();
    ASSERT_EQ(records.size(), 4u);
    EXPECT_EQ(records[2].epoch, 3u);
    EXPECT_EQ(records[3].epoch, 3u) << "epoch 3 undone and trained again";
    EXPECT_EQ(run.best_epoch(), 2u);
    EXPECT_EQ(run.epochs_run(), 3u);
    EXPECT_EQ(run.epochs_undone(), 1u);
    EXPECT_EQ(run.state().lr_drops, 1u);
    // Back to epoch 2 at the plateau, and again at the end (the kept model).
    EXPECT_EQ(be.imported, (std::vector<uint64_t>{2, 2}));
    ASSERT_EQ(be.rates.size(), 4u);
    EXPECT_EQ(be.rates[1], be.rates[0]);
    EXPECT_FLOAT_EQ(be.rates[3], be.rates[0] * float(auto_epochs_defaults::lr_drop_factor));

    // Drops need a plateau to answer: without keep_best and patience they are refused.
    trainer_options fixed = auto_options();
    parse_epochs("3", fixed.train);
    fixed.validation.valid = &valid;
    fixed.validation.lr_drops = 1;
    EXPECT_THROW(trainer(be, train, nullptr, fixed), error);
}

TEST(EpochsAuto, ADropTrainsItsEpochsAtTheLowerRateAndThenStops) {
    const dataset train = labelled_points(40), valid = labelled_points(20);
    // Validation P@1 0.3, 0.7 (best), 0.5: a plateau, and the drop from epoch 2 scores 0.8,
    // then 0.9, 0.9 at the lower rate.
    const std::vector<int> quality{3, 7, 5, 6, 6}, lower{0, 0, 8, 9, 9};
    trainer_options o = auto_options();
    o.validation.valid = &valid;
    o.validation.patience = 1;  // a plateau after one epoch (this 20-point hold-out's default: 2)
    o.train.batch_size = 40;    // a batch an epoch

    // Auto's default: one epoch at the dropped rate, which improves and ends the run.
    scripted_backend one(quality, 40, lower);
    trainer run(one, train, nullptr, o);
    EXPECT_EQ(run.options().validation.epochs_per_drop, auto_epochs_defaults::epochs_per_drop);
    ASSERT_EQ(auto_epochs_defaults::epochs_per_drop, 1);
    const auto records = run.run();
    ASSERT_EQ(records.size(), 4u);
    EXPECT_EQ(records[3].epoch, 3u);
    EXPECT_EQ(run.best_epoch(), 3u) << "the drop's epoch";
    EXPECT_EQ(run.epochs_run(), 3u);
    EXPECT_EQ(run.epochs_undone(), 1u);
    EXPECT_EQ(run.state().lr_dropped_after, 2u);
    EXPECT_EQ(one.imported, (std::vector<uint64_t>{2})) << "only at the drop: the last is best";

    // A run resumed from that end (its checkpoint holds the drop's epoch) trains nothing more.
    trainer_options again = o;
    again.resume = run.state();
    scripted_backend resumed_backend(quality, 40, lower);
    start_at_epoch(resumed_backend, 3);
    trainer resumed(resumed_backend, train, nullptr, again);
    EXPECT_TRUE(resumed.run().empty());
    EXPECT_EQ(resumed.best_epoch(), 3u);

    // 0: on at the lower rate until the next plateau (epoch 4 improves, epoch 5 does not).
    o.validation.epochs_per_drop = 0;
    scripted_backend until(quality, 40, lower);
    trainer longer(until, train, nullptr, o);
    EXPECT_EQ(longer.run().size(), 6u);
    EXPECT_EQ(longer.best_epoch(), 4u);
    EXPECT_EQ(longer.epochs_run(), 5u);
}

TEST(EpochsAuto, TheDropsEpochWinsUnlessTheHoldOutFindsItWorseBeyondItsNoise) {
    // Validation P@1 0.3, 0.7 (best), 0.5: a plateau; the drop from epoch 2 then scores `after`.
    // The hold-out's noise at 0.7 on 20 points is sqrt(0.7 * 0.3 / 20) = 0.102.
    EXPECT_NEAR(holdout_noise(0.7, 20), 0.1025, 1e-4);
    EXPECT_EQ(holdout_noise(1.5, 20), 0.0) << "clamped to [0, 1]";
    EXPECT_EQ(holdout_noise(0.5, 0), 0.0);
    const dataset train = labelled_points(40);
    for (const auto& [points, after, kept] :
         std::vector<std::tuple<uint32_t, int, uint32_t>>{
             {20, 7, 3},    // a tie: the drop's epoch
             {20, 6, 3},    // 0.1 lower, within the noise: the drop's epoch
             {20, 5, 2},    // 0.2 lower: the best before the drop
             {200, 6, 2}})  // 0.1 lower on 200 points (noise 0.032): the best before the drop
    {
        const dataset valid = labelled_points(points);
        trainer_options o = auto_options();
        o.validation.valid = &valid;
        o.validation.patience = 1;  // a plateau after one epoch (a 20-point hold-out's default: 2)
        o.train.batch_size = 40;    // a batch an epoch
        scripted_backend be({3, 7, 5, 6}, 40, {0, 0, after, 0});
        trainer run(be, train, nullptr, o);
        const auto records = run.run();
        ASSERT_EQ(records.size(), 4u);
        EXPECT_EQ(run.best_epoch(), kept) << points << " points, the drop's epoch at " << after;
        EXPECT_NEAR(run.best_value(), kept == 3 ? after / 10.0 : 0.7, 1e-9);
        // At the drop back to epoch 2; at the end again only where epoch 2 is kept.
        EXPECT_EQ(be.imported.size(), kept == 3 ? 1u : 2u);
    }
}

TEST(EpochsAuto, AnEpochThatGainsUnderMinGainIsAPlateauAndItsDropUndoesNothing) {
    // The rule: a gain counts when it is over min_gain x the noise at the reference's value.
    // At 0.5 on 200 points the noise is sqrt(0.25 / 200) = 0.0354.
    EXPECT_FALSE(epoch_improves(0.6, 0.5, 200, 3.0)) << "0.1 < 3 x 0.0354";
    EXPECT_TRUE(epoch_improves(0.62, 0.5, 200, 3.0));
    EXPECT_TRUE(epoch_improves(0.5001, 0.5, 200, 0.0)) << "0: any gain";
    EXPECT_FALSE(epoch_improves(0.5, 0.5, 200, 0.0));

    // Validation P@1 0.3, 0.5 (a gain of 0.2 > 3 x 0.032), 0.6 (0.1 < 3 x 0.035: the best, but
    // no improvement), and 0.7 after a drop from epoch 3, which undoes nothing.
    const dataset train = labelled_points(40), valid = labelled_points(200);
    const std::vector<int> quality{3, 5, 6, 8, 7, 7}, lower{0, 0, 0, 7, 9, 9};
    trainer_options o = auto_options();
    o.validation.valid = &valid;
    o.train.batch_size = 40;  // a batch an epoch
    o.validation.min_gain = 3.0;
    scripted_backend be(quality, 40, lower);
    trainer run(be, train, nullptr, o);
    const auto records = run.run();
    ASSERT_EQ(records.size(), 4u);
    for (uint32_t e = 0; e < 4; ++e) EXPECT_EQ(records[e].epoch, e + 1) << "nothing undone";
    EXPECT_EQ(run.epochs_undone(), 0u);
    EXPECT_EQ(run.best_epoch(), 4u) << "the drop's epoch";
    EXPECT_EQ(run.state().lr_dropped_after, 3u);
    EXPECT_TRUE(be.imported.empty()) << "the model the backend held went on";
    ASSERT_EQ(be.rates.size(), 4u);
    EXPECT_EQ(be.rates[2], be.rates[0]);
    EXPECT_FLOAT_EQ(be.rates[3], be.rates[0] * float(auto_epochs_defaults::lr_drop_factor));

    // Stopped at epoch 3, the state already carries the drop (as the checkpoint saved there
    // would): the run resumed from it trains epoch 4 at the lower rate, as this one did.
    scripted_backend first_half(quality, 40, lower);
    trainer interrupted(first_half, train, nullptr, o);
    interrupted.run([&](const epoch_record& r) {
        if (r.epoch == 3) interrupted.request_stop();
    });
    EXPECT_EQ(interrupted.state().epochs_done, 3u);
    EXPECT_EQ(interrupted.state().lr_drops, 1u);
    EXPECT_EQ(interrupted.state().improved_epoch, 2u);
    trainer_options again = o;
    again.resume = interrupted.state();
    scripted_backend second_half(quality, 40, lower);
    start_at_epoch(second_half, 3);
    trainer resumed(second_half, train, nullptr, again);
    EXPECT_EQ(resumed.run().size(), 1u);
    ASSERT_EQ(second_half.rates.size(), 1u);
    EXPECT_EQ(second_half.rates[0], be.rates[3]);

    // With any gain counted, epoch 3 improves and the plateau comes after epoch 4: back to it,
    // epoch 5 undone and trained again at the lower rate.
    o.validation.min_gain = 0;
    scripted_backend strict(quality, 40, lower);
    trainer strict_run(strict, train, nullptr, o);
    EXPECT_EQ(strict_run.run().size(), 6u);
    EXPECT_EQ(strict_run.epochs_undone(), 1u);
    EXPECT_EQ(strict_run.best_epoch(), 5u);
    EXPECT_EQ(strict.imported, (std::vector<uint64_t>{4}));

    // A bar for patience where nothing counts epochs is refused, not ignored.
    trainer_options fixed = auto_options();
    parse_epochs("3", fixed.train);
    fixed.validation.valid = &valid;
    fixed.validation.min_gain = 0.5;
    scripted_backend unused(quality, 40);
    EXPECT_THROW(trainer(unused, train, nullptr, fixed), error);

    // Auto's default: min_gain on a hold-out of min_gain_points or more, any gain below.
    for (const uint32_t points :
         {auto_epochs_defaults::min_gain_points - 1, auto_epochs_defaults::min_gain_points}) {
        const dataset hold_out = labelled_points(uint32_t(points));
        trainer_options d = auto_options();
        d.validation.valid = &hold_out;
        scripted_backend any(quality, 40);
        trainer defaults(any, train, nullptr, d);
        EXPECT_EQ(
            defaults.options().validation.min_gain,
            points < auto_epochs_defaults::min_gain_points ? 0.0 : auto_epochs_defaults::min_gain)
            << points << " points";
    }
}

TEST(EpochsAuto, ACheckpointKeepsTheLastImprovingEpochApartFromTheBest) {
    temp_dir dir;
    model_options mo;
    mo.hidden = {8};
    const model_state model = model_state::create(make_model_config(mo, 20, 10), 7);
    trainer_state t;
    t.epochs_done = t.best_epoch = 5;
    t.best_value = 0.46;
    t.improved_epoch = 4;
    t.improved_value = 0.45;
    save_checkpoint(dir.file("apart.ckpt"), model, t);
    const trainer_state apart = load_checkpoint(dir.file("apart.ckpt")).trainer;
    EXPECT_EQ(apart.improved_epoch, 4u);
    EXPECT_DOUBLE_EQ(apart.improved_value, 0.45);
    // Where they are the same epoch (every run with min_gain 0, and every checkpoint written
    // before min_gain) the best is read as the last improving epoch.
    t.improved_epoch = 5;
    t.improved_value = 0.46;
    save_checkpoint(dir.file("same.ckpt"), model, t);
    const trainer_state same = load_checkpoint(dir.file("same.ckpt")).trainer;
    EXPECT_EQ(same.improved_epoch, 5u);
    EXPECT_DOUBLE_EQ(same.improved_value, 0.46);
}

TEST(EpochsAuto, AFixedCountTrainsExactlyThatManyEpochs) {
    const dataset train = labelled_points(40);
    scripted_backend be({3, 7, 5, 6, 9, 9, 9}, 40);
    trainer_options o = auto_options();
    parse_epochs("6", o.train);
    trainer run(be, train, nullptr, o);
    const auto records = run.run();
    EXPECT_EQ(records.size(), 6u);
    EXPECT_EQ(run.state().epochs_done, 6u);
    EXPECT_FALSE(records.back().validated);
    EXPECT_FALSE(run.final_record());
    EXPECT_TRUE(be.imported.empty());
}

TEST(EpochsAuto, TheCpuBackendEndsWithTheModelOfARunOfBestEpochEpochs) {
    // The same hold-out for both runs; the fixed run trains exactly the best epoch's count.
    train_config tc = tiny_train_config();
    const auto parts = hold_out_for_auto_epochs(tiny_train(), tc.seed);
    trainer_options o = auto_options();
    o.train = tc;
    o.validation.valid = &parts.second;
    o.validation.lr_drops = 0;  // a drop's epochs run at another rate than a fixed run's
    auto automatic = tiny_backend(tc);
    trainer run(*automatic, parts.first, nullptr, o);
    const auto records = run.run();
    const uint32_t best = run.best_epoch();
    ASSERT_GE(best, 1u);
    EXPECT_LT(run.epochs_run(), tc.epochs) << "this learning rate overfits: auto stops early";
    EXPECT_EQ(run.epochs_run(), best + auto_epochs_defaults::patience_for(parts.second.size()));
    EXPECT_EQ(records.size(), run.epochs_run());

    // Validated every epoch too (nothing kept, no stop): predictions catch up the input
    // layer's lazy Adam rows (--adam input-catch-up), so a run without them rounds otherwise.
    train_config fixed_tc = tc;
    parse_epochs(std::to_string(best), fixed_tc);
    trainer_options fixed = auto_options();
    fixed.train = fixed_tc;
    fixed.validation.valid = &parts.second;
    auto exact = tiny_backend(fixed_tc);
    trainer(*exact, parts.first, nullptr, fixed).run();
    expect_identical(exported(*automatic), exported(*exact));

    // The command line's run, whose snapshot keeps no Adam state: the same weights.
    trainer_options bare = o;
    bare.optimizer_after_run = false;
    auto weights_only = tiny_backend(tc);
    trainer bare_run(*weights_only, parts.first, nullptr, bare);
    bare_run.run();
    EXPECT_EQ(bare_run.best_epoch(), best);
    EXPECT_GT(bare_run.epochs_run(), best) << "it went back to the best epoch";
    expect_same_parameters(exported(*weights_only), exported(*exact));
}

static void resumes_as_uninterrupted(const train_config& tc);

TEST(EpochsAuto, AnInterruptedRunResumedFromItsCheckpointEndsAsTheUninterruptedOne) {
    // As it is, and with the output layer's candidates reused for an epoch (training state
    // that the checkpoint carries).
    for (const bool reuse : {false, true}) {
        SCOPED_TRACE(reuse ? "candidates reused" : "searched every step");
        train_config tc = tiny_train_config();
        if (reuse) {
            tc.reuse_candidates_epochs = 1;
            tc.reuse_candidates_steps = (tiny_train().size() + tc.batch_size - 1) / tc.batch_size;
        }
        resumes_as_uninterrupted(tc);
    }
}

static void resumes_as_uninterrupted(const train_config& tc) {
    temp_dir dir;
    const auto parts = hold_out_for_auto_epochs(tiny_train(), tc.seed);
    trainer_options o = auto_options();
    o.train = tc;
    o.validation.valid = &parts.second;

    auto straight = tiny_backend(tc);
    trainer_options saved = o;
    saved.save_path = dir.file("whole.ckpt");
    trainer whole(*straight, parts.first, nullptr, saved);
    whole.run();
    const uint32_t best = whole.best_epoch(), ran = whole.epochs_run();
    ASSERT_GE(ran, 2u);
    // The kept model's checkpoint carries the drop's state.
    EXPECT_EQ(whole.state().lr_drops, 1u) << "this rate meets a plateau";
    const checkpoint_contents end = load_checkpoint(saved.save_path);
    EXPECT_EQ(end.trainer.lr_drops, whole.state().lr_drops);
    EXPECT_EQ(end.trainer.lr_dropped_after, whole.state().lr_dropped_after);

    // Interrupted after the epoch before the last: its checkpoint holds the best so far.
    trainer_options first = o;
    first.save_path = dir.file("auto.ckpt");
    auto half = tiny_backend(tc);
    trainer interrupted(*half, parts.first, nullptr, first);
    interrupted.run([&](const epoch_record& r) {
        if (r.epoch == ran - 1) interrupted.request_stop();
    });
    checkpoint_contents ck = load_checkpoint(first.save_path);
    EXPECT_TRUE(ck.trainer.epochs_auto);
    EXPECT_EQ(ck.trainer.best_epoch, ck.trainer.epochs_done) << "the best so far";
    EXPECT_LE(ck.trainer.epochs_done, ran - 1);

    trainer_options second = o;
    second.resume = ck.trainer;
    check_resume_epochs(tc, ck.trainer, first.save_path);
    backend_options bo;
    bo.kind = backend_kind::cpu;
    bo.threads = 2;
    auto resumed_backend = create_backend(bo, std::move(ck.model), tc);
    EXPECT_EQ(ck.candidates.empty(), tc.reuse_candidates_steps == 0);
    resumed_backend->import_candidates(ck.candidates);
    trainer resumed(*resumed_backend, parts.first, nullptr, second);
    resumed.run();
    EXPECT_EQ(resumed.best_epoch(), best);
    EXPECT_EQ(resumed.epochs_run(), ran);
    expect_identical(exported(*resumed_backend), exported(*straight));
    const candidate_cache a = resumed_backend->candidates(), b = straight->candidates();
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.steps, b.steps);

    // A fixed run cannot resume an auto run's checkpoint, nor auto a fixed one's.
    train_config fixed = tc;
    parse_epochs("20", fixed);
    EXPECT_THROW(check_resume_epochs(fixed, ck.trainer, first.save_path), error);
    trainer_state fixed_state;
    fixed_state.epochs_done = 2;
    try {
        check_resume_epochs(tc, fixed_state, "x.ckpt");
        FAIL() << "auto resumed a fixed run's checkpoint";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("--epochs N"), std::string::npos) << e.what();
    }
}

namespace {

std::string tiny_args() {
    return " --train " + generated_data_dir() + "/train.txt --test " + generated_data_dir() +
           "/test.txt --no-cache --no-progress --threads 2 --hidden 16 --min-active 64 ";
}

}  // namespace

TEST(EpochsAutoCli, TheDefaultHoldsOutStopsAndSaysWhichEpochWon) {
    temp_dir dir;
    const std::string metrics = dir.file("m.jsonl"), model = dir.file("best.ckpt");
    auto r = run_hslide("train" + tiny_args() + "--lr 0.03 --metrics-out " + metrics + " --save " +
                        model);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("(--epochs auto; --epochs N uses them all)"), std::string::npos)
        << r.output;
    const auto lines = hslide::testing::read_lines(metrics);
    ASSERT_GE(lines.size(), 2u);
    const auto final_record = nlohmann::json::parse(lines.back());
    ASSERT_TRUE(final_record.value("final", false)) << lines.back();
    const uint32_t best = final_record.at("epoch"), ran = final_record.at("epochs_run");
    const uint32_t undone = final_record.value("epochs_undone", 0u);
    EXPECT_EQ(lines.size(), size_t(ran) + undone + 1);
    EXPECT_LT(ran, auto_epochs_defaults::max_epochs);
    // It ends at a plateau, or after the epoch at the dropped rate (which may be the best),
    // with the patience of its hold-out's size.
    const std::smatch held = [&] {
        std::smatch m;
        std::regex_search(r.output, m, std::regex("holding out ([0-9]+) of"));
        return m;
    }();
    ASSERT_EQ(held.size(), 2u) << r.output;
    const uint32_t patience = auto_epochs_defaults::patience_for(std::stoul(held[1].str()));
    EXPECT_TRUE(ran == best + patience || (undone > 0 && ran == best))
        << "best " << best << " of " << ran;
    EXPECT_LE(undone, patience * uint32_t(auto_epochs_defaults::lr_drops));
    // The epochs score the validation set, not the test set: only the kept model is tested.
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
        const auto j = nlohmann::json::parse(lines[i]);
        EXPECT_TRUE(j.contains("valid")) << lines[i];
        EXPECT_FALSE(j.contains("p@1")) << lines[i];
        EXPECT_EQ(j.at("epochs"), "auto");
    }
    const double p1 = final_record.at("p@1");
    // Chosen by nDCG@5 on the hold-out; the line gives its P@1 too.
    EXPECT_EQ(final_record.at("valid_metric"), "ndcg@5");
    EXPECT_NE(r.output.find(fmt::format("best epoch {} of {} (valid P@1 {:.4f} ndcg@5 {:.4f})",
                                        best, ran, double(final_record.at("valid").at("p@1")),
                                        double(final_record.at("valid").at("ndcg@5")))),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(fmt::format("final: P@1 {:.4f}", p1)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(fmt::format("epoch   1/auto")), std::string::npos) << r.output;
    // The checkpoint is the kept model: eval gives the final line's P@1.
    r = run_hslide("eval --model " + model + " --test " + generated_data_dir() +
                   "/test.txt --no-cache -q --metrics-out " + dir.file("eval.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto eval = nlohmann::json::parse(hslide::testing::read_lines(dir.file("eval.jsonl"))[0]);
    EXPECT_DOUBLE_EQ(double(eval.at("p@1")), p1);
    // Resuming it under auto ends at the same model (it redoes the epochs past the best).
    r = run_hslide("train" + tiny_args() + "--lr 0.03 --resume " + model + " --save " +
                   dir.file("again.ckpt"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(fmt::format("final: P@1 {:.4f}", p1)), std::string::npos) << r.output;
    // ... and a fixed run cannot resume it.
    r = run_hslide("train" + tiny_args() + "--epochs 20 -q --resume " + model);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("resume it with --epochs auto"), std::string::npos) << r.output;
}

TEST(EpochsAutoCli, EpochsNTrainsExactlyNOnEveryPoint) {
    temp_dir dir;
    const std::string metrics = dir.file("m.jsonl");
    auto r = run_hslide("train" + tiny_args() + "--epochs 3 --metrics-out " + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("holding out"), std::string::npos) << r.output;
    const auto lines = hslide::testing::read_lines(metrics);
    ASSERT_EQ(lines.size(), 3u);
    for (const std::string& line : lines) {
        const auto j = nlohmann::json::parse(line);
        EXPECT_FALSE(j.contains("valid")) << line;
        EXPECT_FALSE(j.contains("epochs")) << line;
        EXPECT_TRUE(j.contains("p@1")) << line << ": every epoch is tested, as before";
    }
    EXPECT_NE(r.output.find("epoch   3/3"), std::string::npos) << r.output;
}

TEST(EpochsAutoCli, BadEpochsAreRefusedNamingTheOption) {
    for (const char* bad : {"0", "foo", "-1"}) {
        const auto r = run_hslide(std::string("train --preset tiny -q --epochs ") + bad);
        EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
        EXPECT_NE(r.output.find("--epochs"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("'auto' or a positive"), std::string::npos) << r.output;
    }
}
