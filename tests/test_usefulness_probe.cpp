// Tests of the adaptive hybrid policy's usefulness probe, on simulated workers and a simulated
// clock: who is checked, the verdicts, parking and rejoining, and what time is not counted.
#include "hybrid/usefulness_probe.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using hslide::detail::usefulness_probe;
using hslide::detail::usefulness_settings;
using hslide::detail::usefulness_verdict;

namespace {

/// Simulated workers: every tick of `dt` seconds each active worker finishes a batch of
/// `samples[w]`, shrunk by `harm` (a fraction, summed over the active harmful workers) for the
/// harmless ones, as contention for cores would shrink them.
struct simulation {
    std::vector<double> samples;
    std::vector<double> harm;  // what worker w takes from every other worker while active
    double dt = 0.1, t = 0;
    std::vector<usefulness_verdict> verdicts;
    std::vector<double> trained;  // samples per worker over the simulation

    void run(usefulness_probe& probe, double seconds) {
        trained.resize(samples.size(), 0);
        const std::vector<bool> idle(samples.size(), false);
        for (const double end = t + seconds; t < end - 1e-9;) {
            t += dt;
            for (size_t w = 0; w < samples.size(); ++w) {
                if (probe.parked(w)) continue;
                double loss = 0;
                for (size_t o = 0; o < samples.size(); ++o)
                    if (o != w && !probe.parked(o)) loss += harm[o];
                const double n = samples[w] * std::max(0.0, 1 - loss);
                trained[w] += n;
                probe.on_batch(w, uint64_t(std::lround(n)), t);
            }
            probe.update(t, idle);
            for (const usefulness_verdict& v : probe.take_verdicts()) verdicts.push_back(v);
        }
    }
};

usefulness_settings one_second_windows() {
    usefulness_settings s;
    s.window_seconds = 1.0;
    s.window_batches = 3;
    s.probe_share = 0.25;
    s.min_gain = 0.05;
    s.recheck_windows = 16;
    s.park_windows_first = 4;
    s.park_windows_max = 16;
    return s;
}

TEST(UsefulnessProbe, ParksAWorkerThatSlowsTheOthersMoreThanItAdds) {
    // Worker 1 trains 8% of worker 0's samples and costs it a third of its speed.
    simulation sim{{100, 8}, {0, 1.0 / 3}};
    usefulness_probe probe(one_second_windows(), 2);
    sim.run(probe, 2.05);  // one together window, then the candidate sits out
    EXPECT_TRUE(probe.parked(1));
    EXPECT_TRUE(sim.verdicts.empty());
    sim.run(probe, 1.0);  // the window without it
    ASSERT_EQ(sim.verdicts.size(), 1u);
    const usefulness_verdict v = sim.verdicts[0];
    EXPECT_EQ(v.worker, 1u);
    EXPECT_FALSE(v.helps);
    // Together: (100 * 2/3 + 8) per 0.1 s; without: 100 per 0.1 s.
    EXPECT_NEAR(v.rate_all, 10 * (100.0 * 2 / 3 + 8), 15);
    EXPECT_NEAR(v.rate_without, 1000, 1);
    EXPECT_DOUBLE_EQ(v.parked_for_seconds, 4.0);
    EXPECT_FALSE(probe.parked(0));  // the last active worker is never parked

    // Parked for 4 windows (from t = 2.2 +- 0.1), it rejoins for one, is checked again and
    // parked twice as long.
    sim.run(probe, 3.0);
    EXPECT_TRUE(probe.parked(1));
    sim.run(probe, 0.3);
    EXPECT_FALSE(probe.parked(1));
    sim.run(probe, 2.5);
    ASSERT_EQ(sim.verdicts.size(), 2u);
    EXPECT_FALSE(sim.verdicts[1].helps);
    EXPECT_DOUBLE_EQ(sim.verdicts[1].parked_for_seconds, 8.0);

    // Its share of samples is near zero, and parked time is reported.
    sim.run(probe, 60);
    EXPECT_LT(sim.trained[1] / (sim.trained[0] + sim.trained[1]), 0.01);
    EXPECT_GT(probe.take_parked_seconds(1, sim.t), 0.8 * sim.t);
    EXPECT_EQ(probe.take_parked_seconds(0, sim.t), 0.0);
}

TEST(UsefulnessProbe, ParksAtOnceAWorkerThatCannotAddTheGain) {
    // Worker 1 trains 3% of worker 0's samples and harms nobody: even so it cannot add the 5%
    // asked, so the first together window parks it for the longest rest (16 windows), with
    // no window measured without it. Then it trains one together window and is parked again.
    simulation sim{{100, 3}, {0, 0}};
    usefulness_probe probe(one_second_windows(), 2);
    sim.run(probe, 1.15);  // the first window opens at the first tick
    ASSERT_EQ(sim.verdicts.size(), 1u);
    const usefulness_verdict v = sim.verdicts[0];
    EXPECT_EQ(v.worker, 1u);
    EXPECT_TRUE(v.bounded);
    EXPECT_FALSE(v.helps);
    EXPECT_NEAR(v.rate_all, 1030, 1);
    EXPECT_NEAR(v.rate_without, 1000, 1);  // the others' rate beside it
    EXPECT_DOUBLE_EQ(v.parked_for_seconds, 16.0);
    EXPECT_TRUE(probe.parked(1));
    sim.run(probe, 15.8);
    EXPECT_TRUE(probe.parked(1));
    EXPECT_EQ(sim.verdicts.size(), 1u);
    sim.run(probe, 0.3);
    EXPECT_FALSE(probe.parked(1));  // its together window
    sim.run(probe, 1.0);
    ASSERT_EQ(sim.verdicts.size(), 2u);
    EXPECT_TRUE(sim.verdicts[1].bounded);
    EXPECT_DOUBLE_EQ(sim.verdicts[1].parked_for_seconds, 16.0);
    EXPECT_TRUE(probe.parked(1));
    // Parked for all but two of the 18 seconds or so.
    EXPECT_NEAR(probe.take_parked_seconds(1, sim.t), sim.t - 2.0, 0.35);
}

TEST(UsefulnessProbe, KeepsASlowWorkerThatAddsEnough) {
    // Worker 1 adds 15% and harms nobody: it is checked once, kept, and not checked again
    // for 16 windows.
    simulation sim{{100, 15}, {0, 0}};
    usefulness_probe probe(one_second_windows(), 2);
    sim.run(probe, 3.05);
    ASSERT_EQ(sim.verdicts.size(), 1u);
    EXPECT_TRUE(sim.verdicts[0].helps);
    EXPECT_NEAR(sim.verdicts[0].rate_all, 1150, 1);
    EXPECT_NEAR(sim.verdicts[0].rate_without, 1000, 1);
    EXPECT_FALSE(probe.parked(1));
    sim.run(probe, 14.5);
    EXPECT_EQ(sim.verdicts.size(), 1u);
    EXPECT_FALSE(probe.parked(1));
    sim.run(probe, 4);
    EXPECT_EQ(sim.verdicts.size(), 2u);  // the recheck
    // Parked for the measuring windows only: 2 of about 21.5 s.
    EXPECT_NEAR(probe.take_parked_seconds(1, sim.t), 2.0, 0.25);
}

TEST(UsefulnessProbe, ChecksOnlyWorkersBelowTheShare) {
    // 30% of the samples: above the 25% share, so never checked, however much it harms.
    simulation sim{{70, 30}, {0, 0.2}};
    usefulness_probe probe(one_second_windows(), 2);
    sim.run(probe, 30);
    EXPECT_TRUE(sim.verdicts.empty());
    EXPECT_FALSE(probe.parked(1));
    // And a share of 0 turns the check off.
    usefulness_settings off = one_second_windows();
    off.probe_share = 0;
    simulation slow{{100, 1}, {0, 0.5}};
    usefulness_probe never(off, 2);
    slow.run(never, 30);
    EXPECT_TRUE(slow.verdicts.empty());
    EXPECT_FALSE(never.parked(1));
}

TEST(UsefulnessProbe, ParksUselessWorkersOneAfterAnotherButNeverTheLast) {
    simulation sim{{100, 1, 2}, {0, 0.2, 0.2}};
    usefulness_probe probe(one_second_windows(), 3);
    sim.run(probe, 5.5);
    ASSERT_GE(sim.verdicts.size(), 2u);
    EXPECT_TRUE(probe.parked(1));
    EXPECT_TRUE(probe.parked(2));
    EXPECT_FALSE(probe.parked(0));
}

TEST(UsefulnessProbe, TheWindowWithoutWaitsForTheCandidatesBatchAndSkipsIdleTime) {
    usefulness_probe probe(one_second_windows(), 2);
    const std::vector<bool> none{false, false}, candidate_busy{false, true};
    double t = 0;
    // A together window: worker 1 trains 8 samples a tick to worker 0's 90.
    for (int i = 0; i < 20 && !probe.parked(1); ++i) {
        t += 0.1;
        probe.on_batch(0, 90, t);
        probe.on_batch(1, 8, t);
        probe.update(t, candidate_busy);
    }
    ASSERT_TRUE(probe.parked(1));
    // Worker 1 is still in a batch: nothing counts until it is done.
    for (int i = 0; i < 30; ++i) {
        t += 0.1;
        probe.on_batch(0, 1, t);  // slow while worker 1 is busy
        probe.update(t, candidate_busy);
    }
    EXPECT_TRUE(probe.take_verdicts().empty());
    probe.on_batch(1, 1, t);  // its last batch: no window's
    probe.update(t, none);
    // Two seconds idle (the trainer evaluating), then a second of full speed.
    probe.pause(2.0);
    t += 2.0;
    for (int i = 0; i < 12; ++i) {
        t += 0.1;
        probe.on_batch(0, 100, t);
        probe.update(t, none);
    }
    const auto verdicts = probe.take_verdicts();
    ASSERT_EQ(verdicts.size(), 1u);
    EXPECT_NEAR(verdicts[0].rate_without, 1000, 1);  // neither the busy ticks nor the pause
    EXPECT_FALSE(verdicts[0].bounded);
    EXPECT_FALSE(verdicts[0].helps);  // 980 < 1.05 x 1000
}

}  // namespace
