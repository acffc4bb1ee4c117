// Tests of the weight average (weight_average.hpp, train_config::ema_epochs): its decay and
// tick schedule, the blend against a scalar reference, the trainer's ticks and its end holding
// the average, checkpoints that keep the training weights beside the average, a resumed run
// that ends as the uninterrupted one, auto and explicit settings on a backend without a host
// model (averaged through exports), and the command line's --ema.
#include "hslide/backend_registry.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/error.hpp"
#include "hslide/model.hpp"
#include "hslide/model_options.hpp"
#include "hslide/synthetic.hpp"
#include "hslide/trainer.hpp"
#include "hslide/validation.hpp"
#include "hslide/weight_average.hpp"
#include "scripted_backend.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
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

/// The tiny synthetic preset's training points (deterministic).
const dataset& tiny_train() {
    static const dataset data = hslide::testing::tiny_synthetic_train(11);
    return data;
}

model_config tiny_config() {
    model_options mo;
    mo.hidden = {16};
    mo.min_active = {64};
    return make_model_config(mo, uint32_t(tiny_train().n_features),
                             uint32_t(tiny_train().n_labels));
}

train_config averaged_config(adam_mode adam) {
    train_config tc;
    tc.epochs = 3;
    tc.batch_size = 32;  // 3.1 steps a tick: ticks land mid-epoch and at its end
    tc.learning_rate = 0.01f;
    tc.seed = 5;
    tc.adam = adam;
    tc.ema_epochs = 0.5;
    return tc;
}

std::unique_ptr<backend> cpu_backend_for(const train_config& tc, model_state initial) {
    backend_options bo;
    bo.kind = backend_kind::cpu;
    bo.threads = 2;
    return create_backend(bo, std::move(initial), tc);
}

trainer_options quiet(const train_config& tc) {
    trainer_options o;
    o.train = tc;
    o.show_progress = false;
    o.eval.show_progress = false;
    o.selection_probe_points = 0;
    return o;
}

model_state parameters_of(const backend& be) {
    model_state m;
    be.export_state(m, /*with_optimizer=*/false);
    return m;
}

bool any_weight_differs(const model_state& a, const model_state& b) {
    for (size_t l = 0; l < a.layers.size(); ++l)
        if (!same_bytes(a.layers[l].weights, b.layers[l].weights)) return true;
    return false;
}

}  // namespace

TEST(WeightAverage, KeepIsTheTimeConstantsDecayPerTick) {
    EXPECT_FLOAT_EQ(weight_average_keep(0.5, 4), float(std::exp(-0.5)));
    EXPECT_FLOAT_EQ(weight_average_keep(2.0, 8), float(std::exp(-1.0 / 16)));
    // After an epoch's ticks a time constant of one epoch keeps 1/e of the old average.
    EXPECT_NEAR(std::pow(double(weight_average_keep(1.0)), weight_average_ticks_per_epoch),
                std::exp(-1.0), 1e-6);
    for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()})
        EXPECT_THROW(weight_average_keep(bad), error) << bad;
}

TEST(WeightAverage, TicksEndEvenSharesOfTheEpochAndAlwaysItsLastStep) {
    for (uint64_t steps : {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 33, 100}) {
        for (uint32_t ticks : {1u, 4u, 8u}) {
            std::vector<uint64_t> at;
            for (uint64_t s = 0; s < steps; ++s)
                if (weight_average_tick_after(s, steps, ticks)) at.push_back(s);
            ASSERT_EQ(at.size(), std::min<uint64_t>(steps, ticks)) << steps << " " << ticks;
            EXPECT_EQ(at.back(), steps - 1) << steps << " " << ticks;
            // Evenly spaced: the gaps differ by at most one step.
            uint64_t shortest = steps, longest = 0, previous = 0;
            for (size_t i = 0; i < at.size(); ++i) {
                const uint64_t gap = at[i] + 1 - (i ? previous + 1 : 0);
                shortest = std::min(shortest, gap);
                longest = std::max(longest, gap);
                previous = at[i];
            }
            EXPECT_LE(longest - shortest, 1u) << steps << " " << ticks;
        }
    }
}

TEST(WeightAverage, BlendMatchesAScalarReferenceAndTheFirstTickCopies) {
    const model_config config = tiny_config();
    const model_state a = model_state::create(config, 1), b = model_state::create(config, 2);
    model_state average;
    blend_into_average(average, a, 0.7f);
    expect_same_parameters(average, a);
    EXPECT_TRUE(average.layers[0].adam_m.size() == 0) << "the average holds no Adam state";

    const float keep = 0.8125f;
    blend_into_average(average, b, keep);
    for (size_t l = 0; l < a.layers.size(); ++l) {
        const layer_state &x = a.layers[l], &y = b.layers[l], &z = average.layers[l];
        ASSERT_EQ(z.weights.size(), x.weights.size());
        for (size_t i = 0; i < x.weights.size(); ++i) {
            const float want = keep * x.weights[i] + (1.0f - keep) * y.weights[i];
            ASSERT_NEAR(z.weights[i], want, 1e-6f * (1.0f + std::fabs(want))) << l << " " << i;
        }
        for (uint32_t r = 0; r < x.rows; ++r)
            for (uint32_t c = x.width; c < x.stride; ++c)
                ASSERT_EQ(z.row(r)[c], 0.0f) << "padding stays zero";
        for (size_t i = 0; i < x.bias.size(); ++i)
            EXPECT_NEAR(z.bias[i], keep * x.bias[i] + (1.0f - keep) * y.bias[i], 1e-6f);
    }
    EXPECT_TRUE(any_weight_differs(average, a) && any_weight_differs(average, b));

    model_options other;
    other.hidden = {8};
    const model_state wrong =
        model_state::create(make_model_config(other, config.input_dim, config.output_dim()), 3);
    EXPECT_THROW(blend_into_average(average, wrong, keep), error);
}

TEST(WeightAverage, TheRunEndsHoldingTheAverageOfItsTicks) {
    // Dense Adam defers nothing: what a step leaves is what a tick reads.
    const train_config tc = averaged_config(adam_mode::dense);
    auto be = cpu_backend_for(tc, model_state::create(tiny_config(), tc.seed));
    trainer_options o = quiet(tc);
    // The reference: the test's own ticks, after the steps the trainer ticks after.
    model_state reference, last_weights;
    const float keep = weight_average_keep(0.5);
    const uint64_t steps = (tiny_train().size() + tc.batch_size - 1) / tc.batch_size;
    uint64_t step = 0, ticks = 0;
    o.between_steps = [&] {
        if (weight_average_tick_after(step % steps, steps)) {
            last_weights = parameters_of(*be);
            blend_into_average(reference, last_weights, keep);
            ++ticks;
        }
        ++step;
    };
    trainer run(*be, tiny_train(), &tiny_train(), o);
    EXPECT_DOUBLE_EQ(run.ema_epochs(), 0.5);
    const auto records = run.run();
    ASSERT_EQ(records.size(), 3u);
    EXPECT_EQ(ticks, 3u * weight_average_ticks_per_epoch);
    const model_state held = parameters_of(*be);
    expect_same_parameters(held, reference);
    EXPECT_TRUE(any_weight_differs(held, last_weights)) << "the average, not the weights";
    // The last epoch's test metrics are the average's.
    evaluation_options eo;
    eo.show_progress = false;
    const metrics_result m = evaluate(*be, tiny_train(), eo);
    EXPECT_DOUBLE_EQ(m.p_at(1), records.back().metrics.p_at(1));
    EXPECT_GT(records.back().times.average, 0.0);
}

TEST(WeightAverage, ACheckpointKeepsTheTrainingWeightsBesideTheAverage) {
    temp_dir dir;
    const model_config config = tiny_config();
    const model_state average = model_state::create(config, 1);
    const model_state weights = model_state::create(config, 2);
    trainer_state ts;
    ts.epochs_done = 2;
    save_checkpoint(dir.file("a.ckpt"), average, ts, {}, 0, {}, &weights);
    const checkpoint_contents with = load_checkpoint(dir.file("a.ckpt"));
    expect_same_parameters(with.model, average);
    ASSERT_TRUE(with.training_weights);
    expect_same_parameters(*with.training_weights, weights);
    EXPECT_EQ(with.training_weights->hash_seeds, average.hash_seeds);

    save_checkpoint(dir.file("b.ckpt"), average, ts);
    EXPECT_FALSE(load_checkpoint(dir.file("b.ckpt")).training_weights);
    // Training weights of another shape are refused before anything is written.
    model_options other;
    other.hidden = {8};
    const model_state wrong =
        model_state::create(make_model_config(other, config.input_dim, config.output_dim()), 3);
    EXPECT_THROW(save_checkpoint(dir.file("c.ckpt"), average, ts, {}, 0, {}, &wrong), error);
}

TEST(WeightAverage, AResumedRunEndsAsTheUninterruptedOne) {
    temp_dir dir;
    const train_config tc = averaged_config(adam_mode::input_catch_up);
    // Saved every epoch as the interrupted run is: a save brings the rows catch-up Adam deferred
    // up to date, and a run that did so at other steps would round otherwise.
    trainer_options whole = quiet(tc);
    whole.save_path = dir.file("whole.ckpt");
    auto straight = cpu_backend_for(tc, model_state::create(tiny_config(), tc.seed));
    trainer(*straight, tiny_train(), nullptr, whole).run();

    train_config two = tc;
    two.epochs = 2;
    trainer_options first = quiet(two);
    first.save_path = dir.file("two.ckpt");
    auto half = cpu_backend_for(two, model_state::create(tiny_config(), tc.seed));
    trainer(*half, tiny_train(), nullptr, first).run();
    checkpoint_contents ck = load_checkpoint(first.save_path);
    ASSERT_TRUE(ck.training_weights) << "the run averaged";
    expect_same_parameters(ck.model, parameters_of(*half));

    trainer_options second = quiet(tc);
    second.resume = ck.trainer;
    second.resume_training_weights = std::move(ck.training_weights);
    auto resumed = cpu_backend_for(tc, std::move(ck.model));
    trainer(*resumed, tiny_train(), nullptr, second).run();
    expect_same_parameters(parameters_of(*resumed), parameters_of(*straight));
}

TEST(WeightAverage, AnAutoRunWithADropEndsWithItsBestAverageAndResumesAsTheUninterruptedOne) {
    temp_dir dir;
    train_config tc = averaged_config(adam_mode::input_catch_up);
    parse_epochs("auto", tc);
    tc.learning_rate = 0.03f;  // overfits: a plateau, a drop, a stop
    const auto parts = hold_out_for_auto_epochs(tiny_train(), tc.seed);
    trainer_options o = quiet(tc);
    o.validation.valid = &parts.second;
    o.validation.lr_drops = 1;  // not auto's with an average (0): the drop's path is tested here

    trainer_options saved = o;
    saved.save_path = dir.file("whole.ckpt");
    auto straight = cpu_backend_for(tc, model_state::create(tiny_config(), tc.seed));
    trainer whole(*straight, parts.first, nullptr, saved);
    whole.run();
    ASSERT_EQ(whole.state().lr_drops, 1u) << "this rate meets a plateau";
    const uint32_t ran = whole.epochs_run();
    // The run ends with the kept epoch's average, which its checkpoint holds beside the
    // weights training was at.
    const checkpoint_contents end = load_checkpoint(saved.save_path);
    expect_same_parameters(end.model, parameters_of(*straight));
    ASSERT_TRUE(end.training_weights);
    EXPECT_TRUE(any_weight_differs(end.model, *end.training_weights));

    // Interrupted after the epoch before the last, and resumed from its checkpoint.
    trainer_options first = o;
    first.save_path = dir.file("auto.ckpt");
    auto half = cpu_backend_for(tc, model_state::create(tiny_config(), tc.seed));
    trainer interrupted(*half, parts.first, nullptr, first);
    interrupted.run([&](const epoch_record& r) {
        if (r.epoch == ran - 1) interrupted.request_stop();
    });
    const checkpoint_contents ck = load_checkpoint(first.save_path);
    ASSERT_TRUE(ck.training_weights);
    ASSERT_EQ(ck.trainer.lr_drops, 0u) << "the best before the drop";
    auto resume = [&](const trainer_state& state) {
        trainer_options second = o;
        second.resume = state;
        second.resume_training_weights = *ck.training_weights;
        auto be = cpu_backend_for(tc, ck.model);
        trainer resumed(*be, parts.first, nullptr, second);
        resumed.run();
        EXPECT_EQ(resumed.best_epoch(), whole.best_epoch());
        EXPECT_EQ(resumed.epochs_run(), ran);
        expect_same_parameters(parameters_of(*be), parameters_of(*straight));
    };
    // Resumed, it meets the plateau again and drops the rate as the whole run did.
    resume(ck.trainer);
    // The drop trains on from the best epoch's training weights and average, as a run resumed
    // from the best epoch's checkpoint at the dropped rate does.
    trainer_state dropped = ck.trainer;
    dropped.lr_drops = 1;
    dropped.lr_dropped_after = ck.trainer.epochs_done;
    resume(dropped);
}

/// A backend whose model is seen only through export_state and import_state, as a GPU's is: no
/// host_state, no row interface.
class exported_only final : public backend {
  public:
    explicit exported_only(backend& inner) : inner_(inner) {}
    step_report train_batch(const batch_view& batch, float learning_rate) override {
        return inner_.train_batch(batch, learning_rate);
    }
    void refresh_selections(bool new_functions) override {
        inner_.refresh_selections(new_functions);
    }
    void predict(const batch_view& batch, uint32_t k, scoring_mode scoring, uint32_t* labels,
                 float* scores) override {
        inner_.predict(batch, k, scoring, labels, scores);
    }
    void export_state(model_state& out, bool with_optimizer) const override {
        inner_.export_state(out, with_optimizer);
    }
    void import_state(const model_state& in, bool with_optimizer) override {
        inner_.import_state(in, with_optimizer);
    }
    backend_info info() const override { return inner_.info(); }
    step_report synchronize() override { return inner_.synchronize(); }
    bool selection_is_exact() const override { return inner_.selection_is_exact(); }

  private:
    backend& inner_;
};

TEST(WeightAverage, AutoIsOffWhereTheModelIsNotInHostMemoryAndAnExplicitOneAveragesItsExports) {
    const dataset points = labelled_points(30);
    trainer_options o;
    o.train.epochs = 1;
    o.show_progress = false;
    o.selection_probe_points = 0;
    o.train.ema_epochs = -1;
    scripted_backend scripted({5}, 30);
    EXPECT_EQ(trainer(scripted, points, nullptr, o).ema_epochs(), 0.0);
    o.train.ema_epochs = -0.5;
    EXPECT_THROW(trainer(scripted, points, nullptr, o), error);
    // An explicit average of a model seen only through exports ends as the one read in host
    // memory (sparse Adam defers no row, so the two read the same weights), bit for bit.
    const train_config tc = averaged_config(adam_mode::sparse);
    const model_state initial = model_state::create(tiny_config(), tc.seed);
    auto direct = cpu_backend_for(tc, initial), inner = cpu_backend_for(tc, initial);
    exported_only wrapped(*inner);
    trainer a(*direct, tiny_train(), nullptr, quiet(tc));
    trainer b(wrapped, tiny_train(), nullptr, quiet(tc));
    EXPECT_DOUBLE_EQ(b.ema_epochs(), 0.5);
    a.run();
    b.run();
    expect_same_parameters(parameters_of(*direct), parameters_of(wrapped));
    // And that is an average, not the weights.
    train_config plain = tc;
    plain.ema_epochs = 0;
    auto raw = cpu_backend_for(plain, initial);
    trainer(*raw, tiny_train(), nullptr, quiet(plain)).run();
    EXPECT_TRUE(any_weight_differs(parameters_of(*raw), parameters_of(wrapped)));
}

TEST(WeightAverageCli, TheDefaultAveragesAndZeroScoresTheWeights) {
    temp_dir dir;
    const std::string args = " --train " + generated_data_dir() + "/train.txt --test " +
                             generated_data_dir() + "/test.txt --no-cache --no-progress " +
                             "--threads 2 --hidden 16 --min-active 64 --epochs 2 --metrics-out ";
    auto last_record = [&](const std::string& file) {
        std::ifstream in(file);
        std::string line, last;
        while (std::getline(in, line)) last = line;
        return nlohmann::json::parse(last);
    };
    const auto averaging =
        run_hslide("train" + args + dir.file("auto.jsonl") + " --save " + dir.file("m.ckpt"));
    ASSERT_EQ(averaging.exit_code, 0) << averaging.output;
    // The saved model is the average the run tested: `eval` scores it the same.
    const auto scored = run_hslide("eval --model " + dir.file("m.ckpt") + " --test " +
                                   generated_data_dir() + "/test.txt --threads 2 --no-progress");
    ASSERT_EQ(scored.exit_code, 0) << scored.output;
    auto p_at_1 = [](const std::string& text, const std::string& after) {
        const size_t at = text.find("P@1 ", text.find(after));
        return at == std::string::npos ? std::string("none") : text.substr(at, 10);
    };
    const std::string tested = p_at_1(averaging.output, "final:");
    EXPECT_NE(tested, "none") << averaging.output;
    EXPECT_EQ(p_at_1(scored.output, "P@1"), tested);
    EXPECT_TRUE(load_checkpoint(dir.file("m.ckpt")).training_weights);
    const auto averaged = last_record(dir.file("auto.jsonl"));
    EXPECT_DOUBLE_EQ(averaged.at("ema_epochs").get<double>(), weight_average_auto_epochs);
    EXPECT_GT(averaged.at("stage_seconds").at("average").get<double>(), 0.0);

    const auto off = run_hslide("train" + args + dir.file("off.jsonl") + " --ema 0");
    ASSERT_EQ(off.exit_code, 0) << off.output;
    const auto plain = last_record(dir.file("off.jsonl"));
    EXPECT_FALSE(plain.contains("ema_epochs"));
    EXPECT_EQ(plain.at("stage_seconds").at("average").get<double>(), 0.0);

    const auto bad = run_hslide("train" + args + dir.file("bad.jsonl") + " --ema -2");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("--ema"), std::string::npos) << bad.output;
}
