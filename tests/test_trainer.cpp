// Tests of the training loop (hslide/trainer.hpp) against a recording backend: every epoch
// visits every point once in a fresh seeded order, table rebuilds follow SLIDE's
// exponentially decaying schedule with new hash functions every `rehash` samples, the
// schedule survives a resume, the learning-rate schedules, and a diverging loss stops training
// with a clear error.
#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/trainer.hpp"
#include "scripted_backend.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

using namespace hslide;
using hslide::testing::scripted_backend;

namespace {

/// A backend that trains nothing and records what the trainer asked of it.
class recording_backend final : public backend {
  public:
    struct rebuild_call {
        uint64_t samples_before;  // samples trained when the rebuild was asked for
        bool new_functions;
    };
    std::vector<std::vector<uint32_t>> batches;
    std::vector<float> learning_rates;
    std::vector<rebuild_call> rebuilds;
    uint64_t samples = 0;
    double loss_per_sample = 1.0;
    std::vector<std::vector<uint32_t>> probes;  // points of each measure_selection call
    bool measures = true;
    bool exact = false;  // selection_is_exact

    step_report train_batch(const batch_view& batch, float learning_rate) override {
        batches.emplace_back(batch.rows, batch.rows + batch.size);
        learning_rates.push_back(learning_rate);
        samples += batch.size;
        step_report r;
        r.samples = batch.size;
        r.loss_sum = loss_per_sample * batch.size;
        r.active_per_layer = {1, 1};
        r.output_touched_share_sum = 2.0 / 3.0;  // 2 of the 3 labels
        r.steps_counted = 1;
        return r;
    }
    selection_quality measure_selection(const batch_view& batch, uint32_t top) override {
        probes.emplace_back(batch.rows, batch.rows + batch.size);
        if (!measures) return {};
        selection_quality q;
        q.points = batch.size;
        q.top = top;
        q.top_recall = 0.25;
        q.label_recall = 0.5;
        q.mean_set_size = 7;
        return q;
    }
    bool selection_is_exact() const override { return exact; }
    void refresh_selections(bool new_functions) override {
        rebuilds.push_back({samples, new_functions});
    }
    void predict(const batch_view&, uint32_t, scoring_mode, uint32_t*, float*) override {}
    void export_state(model_state&, bool) const override {}
    void import_state(const model_state&, bool) override {}
    backend_info info() const override { return {}; }
};

dataset points(uint32_t n) {
    return hslide::testing::labelled_points(n);
}

trainer_options options(uint32_t epochs) {
    trainer_options o;
    o.train.epochs = epochs;
    o.train.batch_size = 10;
    o.train.rebuild_every = 100;
    o.train.rebuild_decay = 0.5;
    o.train.rehash_every = 250;
    o.train.seed = 7;
    o.show_progress = false;
    o.eval.show_progress = false;
    return o;
}

/// The schedule written out independently: a rebuild once `next` samples are reached, the
/// period then multiplied by e^decay; new functions at the first rebuild `rehash` samples
/// after the last draw.
std::vector<recording_backend::rebuild_call> expected_rebuilds(uint64_t total, uint64_t batch) {
    std::vector<recording_backend::rebuild_call> calls;
    double period = 100;
    uint64_t next = 100, next_rehash = 250;
    for (uint64_t seen = batch; seen <= total; seen += batch) {
        if (seen < next) continue;
        const bool rehash = seen >= next_rehash;
        if (rehash) next_rehash = seen + 250;
        calls.push_back({seen, rehash});
        period *= std::exp(0.5);
        next = seen + uint64_t(std::llround(period));
    }
    return calls;
}

}  // namespace

TEST(Trainer, EveryEpochVisitsEveryPointInAFreshSeededOrder) {
    const dataset data = points(95);  // the last batch of an epoch is short
    recording_backend a, b;
    trainer(a, data, nullptr, options(3)).run();
    trainer(b, data, nullptr, options(3)).run();
    EXPECT_EQ(a.batches, b.batches) << "the order depends only on the seed";

    std::vector<std::vector<uint32_t>> epochs(3);
    size_t batch = 0;
    for (auto& order : epochs) {
        while (order.size() < data.size()) {
            ASSERT_LT(batch, a.batches.size());
            order.insert(order.end(), a.batches[batch].begin(), a.batches[batch].end());
            ++batch;
        }
        std::vector<uint32_t> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        std::vector<uint32_t> all(data.size());
        std::iota(all.begin(), all.end(), 0u);
        EXPECT_EQ(sorted, all) << "an epoch visits every point exactly once";
        std::vector<uint32_t> identity(order.size());
        std::iota(identity.begin(), identity.end(), 0u);
        EXPECT_NE(order, identity) << "the points are shuffled, not read in file order";
    }
    EXPECT_EQ(batch, a.batches.size());
    EXPECT_NE(epochs[0], epochs[1]);
    EXPECT_NE(epochs[1], epochs[2]);

    recording_backend c;
    trainer_options other = options(1);
    other.train.seed = 8;
    trainer(c, data, nullptr, other).run();
    EXPECT_NE(std::vector<uint32_t>(c.batches[0]), a.batches[0]) << "another seed, another order";
}

TEST(Trainer, RebuildsFollowTheDecayingScheduleWithRehashes) {
    const dataset data = points(500);
    recording_backend be;
    trainer(be, data, nullptr, options(2)).run();
    // Every epoch after the first starts with a rebuild of the current tables.
    std::vector<recording_backend::rebuild_call> scheduled;
    int epoch_starts = 0;
    for (const auto& call : be.rebuilds) {
        if (call.samples_before == 500 && !call.new_functions && epoch_starts == 0) {
            ++epoch_starts;
            continue;
        }
        scheduled.push_back(call);
    }
    EXPECT_EQ(epoch_starts, 1);
    const auto expected = expected_rebuilds(1000, 10);
    ASSERT_EQ(scheduled.size(), expected.size());
    ASSERT_GE(expected.size(), 4u);  // 100, 265, 537, 985: the period grows
    for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(scheduled[i].samples_before, expected[i].samples_before) << "rebuild " << i;
        EXPECT_EQ(scheduled[i].new_functions, expected[i].new_functions) << "rebuild " << i;
    }
}

TEST(Trainer, ResumedScheduleContinuesWhereItStopped) {
    const dataset data = points(500);
    recording_backend straight;
    trainer(straight, data, nullptr, options(2)).run();

    recording_backend first, second;
    trainer one(first, data, nullptr, options(1));
    one.run();
    trainer_options resumed = options(2);
    resumed.resume = one.state();
    second.samples = first.samples;
    trainer(second, data, nullptr, resumed).run();

    std::vector<std::vector<uint32_t>> batches = first.batches;
    batches.insert(batches.end(), second.batches.begin(), second.batches.end());
    EXPECT_EQ(batches, straight.batches);
    auto rebuilds = first.rebuilds;
    rebuilds.insert(rebuilds.end(), second.rebuilds.begin(), second.rebuilds.end());
    ASSERT_EQ(rebuilds.size(), straight.rebuilds.size());
    for (size_t i = 0; i < rebuilds.size(); ++i) {
        EXPECT_EQ(rebuilds[i].samples_before, straight.rebuilds[i].samples_before);
        EXPECT_EQ(rebuilds[i].new_functions, straight.rebuilds[i].new_functions);
    }
}

TEST(Trainer, DivergedLossStopsWithAClearError) {
    const dataset data = points(50);
    recording_backend be;
    be.loss_per_sample = std::numeric_limits<double>::quiet_NaN();
    try {
        trainer(be, data, nullptr, options(1)).run();
        FAIL() << "a NaN loss must stop training";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("learning rate"), std::string::npos) << e.what();
    }
    EXPECT_EQ(be.batches.size(), 1u);
}

TEST(Trainer, LearningRateIsConstantOrDecaysLinearlyToTheEnd) {
    const dataset data = points(100);
    recording_backend constant, linear;
    trainer_options o = options(2);
    o.train.learning_rate = 0.01f;
    trainer(constant, data, nullptr, o).run();
    for (const float lr : constant.learning_rates) EXPECT_EQ(lr, 0.01f);

    o.train.schedule = lr_schedule::linear;
    trainer(linear, data, nullptr, o).run();
    ASSERT_EQ(linear.learning_rates.size(), 20u);  // 2 epochs of 10 batches of 10
    for (size_t step = 0; step < 20; ++step) {
        // Samples seen before the step: 10 * step of 200.
        const double expected = 0.01 * (1.0 - double(step) / 20.0);
        EXPECT_NEAR(linear.learning_rates[step], expected, 1e-7) << "step " << step;
    }
    EXPECT_GT(linear.learning_rates.back(), 0.0f);
}

TEST(Trainer, MeasuresTheSelectionOnTheSameTrainingPointsEveryEpoch) {
    // After every epoch that is synchronised (evaluated, saved, or the last).
    const dataset data = points(95), test = points(10);
    recording_backend a;
    trainer_options o = options(3);
    o.selection_probe_points = 20;
    o.selection_probe_top = 5;
    const std::vector<epoch_record> records = trainer(a, data, &test, o).run();
    ASSERT_EQ(a.probes.size(), 3u);
    EXPECT_EQ(a.probes[0].size(), 20u);
    EXPECT_TRUE(std::is_sorted(a.probes[0].begin(), a.probes[0].end()));
    EXPECT_EQ(std::adjacent_find(a.probes[0].begin(), a.probes[0].end()), a.probes[0].end());
    EXPECT_LT(a.probes[0].back(), 95u);
    for (const auto& p : a.probes) EXPECT_EQ(p, a.probes[0]);
    ASSERT_TRUE(records.back().selection);
    EXPECT_EQ(records.back().selection->top, 5u);
    EXPECT_EQ(records.back().selection->top_recall, 0.25);
    ASSERT_TRUE(records.back().touched_share);
    EXPECT_NEAR(*records.back().touched_share, 2.0 / 3.0, 1e-12);
    // A backend that does not measure is asked once.
    recording_backend b;
    b.measures = false;
    const std::vector<epoch_record> none = trainer(b, data, &test, o).run();
    EXPECT_EQ(b.probes.size(), 1u);
    EXPECT_FALSE(none.back().selection);
    // Automatic (-1): trainer_options::auto_selection_probe_points where the selection is
    // approximate, no probe where the backend says its sets are exact; asked for, a probe of
    // an exact selection runs all the same.
    o.selection_probe_points = -1;
    recording_backend approximate;
    trainer(approximate, data, &test, o).run();
    ASSERT_EQ(approximate.probes.size(), 3u);
    EXPECT_EQ(approximate.probes[0].size(),
              std::min<size_t>(95, trainer_options::auto_selection_probe_points));
    recording_backend exact;
    exact.exact = true;
    EXPECT_FALSE(trainer(exact, data, &test, o).run().back().selection);
    EXPECT_TRUE(exact.probes.empty());
    o.selection_probe_points = 20;
    EXPECT_TRUE(trainer(exact, data, &test, o).run().back().selection);
    EXPECT_EQ(exact.probes.size(), 3u);
}

TEST(Trainer, LargeBatchRulesScaleTheRateAndTheWarmUpRampsItUp) {
    const dataset data = points(100);
    trainer_options o = options(1);  // batches of 10
    o.train.learning_rate = 0.01f;
    o.train.lr_base_batch = 40;
    for (const auto& [scaling, factor] :
         {std::pair{lr_batch_scaling::none, 1.0}, std::pair{lr_batch_scaling::sqrt, 0.5},
          std::pair{lr_batch_scaling::linear, 0.25}}) {
        recording_backend b;
        o.train.lr_scaling = scaling;
        trainer(b, data, nullptr, o).run();
        ASSERT_EQ(b.learning_rates.size(), 10u);
        for (const float lr : b.learning_rates) EXPECT_FLOAT_EQ(lr, float(0.01 * factor));
    }
    // A warm-up over 40 samples: steps 1..4 at 1/4..4/4 of the rate, then the rate; under the
    // linear schedule both apply.
    recording_backend warm, both;
    o.train.lr_scaling = lr_batch_scaling::none;
    o.train.warmup_samples = 40;
    trainer(warm, data, nullptr, o).run();
    for (size_t step = 0; step < 10; ++step)
        EXPECT_NEAR(warm.learning_rates[step], 0.01 * std::min(1.0, (step + 1) / 4.0), 1e-9)
            << "step " << step;
    o.train.schedule = lr_schedule::linear;
    trainer(both, data, nullptr, o).run();
    EXPECT_NEAR(both.learning_rates[1], 0.01 * 0.5 * (1.0 - 10.0 / 100.0), 1e-9);
    o.train.lr_base_batch = 0;
    EXPECT_THROW(validate(o.train), hslide::error);
}

TEST(Trainer, KeepBestEndsWithTheBestEpochsModelAndPatienceStopsEarly) {
    const dataset train = points(40), valid = points(20);
    // Validation P@1 0.3, 0.7 (best), 0.5, 0.6, 0.9: patience 2 stops after epoch 4.
    scripted_backend be({3, 7, 5, 6, 9}, 40);
    trainer_options o = options(5);
    o.validation.valid = &valid;
    o.validation.keep_best = true;
    o.validation.metric = parse_selection_metric("p@1");
    o.validation.patience = 2;
    trainer run(be, train, nullptr, o);
    const auto records = run.run();
    ASSERT_EQ(records.size(), 4u);
    EXPECT_EQ(run.best_epoch(), 2u);
    const uint32_t best[] = {1, 2, 2, 2};
    for (size_t i = 0; i < records.size(); ++i) {
        EXPECT_TRUE(records[i].validated);
        EXPECT_EQ(records[i].best_epoch, best[i]);
    }
    EXPECT_DOUBLE_EQ(records[1].valid_metrics.p_at(1), 0.7);
    // The backend holds epoch 2's model again, and the trainer's state is epoch 2's.
    ASSERT_EQ(be.imported.size(), 1u);
    EXPECT_EQ(be.imported[0], 2u);
    EXPECT_EQ(run.state().epochs_done, 2u);
    const std::string json = run.record_json(records.back());
    EXPECT_NE(json.find("\"best_epoch\":2"), std::string::npos) << json;
    EXPECT_NE(json.find("\"valid_metric\":\"p@1\""), std::string::npos) << json;
}

TEST(Trainer, WithoutKeepBestTheLastModelStaysAndPatienceNeedsAValidationSet) {
    const dataset train = points(40), valid = points(20);
    scripted_backend be({3, 7, 5, 6, 9}, 40);
    trainer_options o = options(5);
    o.validation.valid = &valid;
    trainer run(be, train, nullptr, o);
    EXPECT_EQ(run.run().size(), 5u);
    EXPECT_EQ(run.best_epoch(), 5u);
    EXPECT_TRUE(be.imported.empty());

    trainer_options no_valid = options(2);
    no_valid.validation.patience = 1;
    EXPECT_THROW(trainer(be, train, nullptr, no_valid), error);
}

TEST(Trainer, ACallbackCanStopTraining) {
    const dataset data = points(30);
    recording_backend be;
    trainer run(be, data, nullptr, options(5));
    const auto records = run.run([&](const epoch_record& r) {
        if (r.epoch == 2) run.request_stop();
    });
    EXPECT_EQ(records.size(), 2u);
}

TEST(Validation, MetricsParseAndHoldOutIsSeededAndDisjoint) {
    EXPECT_EQ(to_string(parse_selection_metric("ndcg@3")), "ndcg@3");
    EXPECT_EQ(to_string(parse_selection_metric("psp@5")), "psp@5");
    EXPECT_THROW(parse_selection_metric("p@6"), error);
    EXPECT_THROW(parse_selection_metric("recall@1"), error);
    const dataset data = points(100);
    const auto a = hold_out(data, 0.2, 9), b = hold_out(data, 0.2, 9), c = hold_out(data, 0.2, 10);
    EXPECT_EQ(a.second.size(), 20u);
    EXPECT_EQ(a.first.size(), 80u);
    EXPECT_EQ(a.second.feature_offsets, b.second.feature_offsets);
    EXPECT_EQ(a.second.label_ids, b.second.label_ids);
    EXPECT_NE(a.second.label_ids, c.second.label_ids);
    EXPECT_THROW(hold_out(data, 0.001, 1), error);
    EXPECT_THROW(hold_out(data, 1.0, 1), error);
}
