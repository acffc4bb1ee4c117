// Tests of the hybrid backend: the merge rule, sample accounting, exact merges under
// concurrency, the adaptive policy's update shares, and hybrid training on Bibtex.
#include "cpu/cpu_backend.hpp"
#include "hslide/backend.hpp"
#include "hslide/hybrid.hpp"
#include "hslide/rng.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

using namespace hslide;

namespace {

model_config tiny_config() {
    model_config c;
    c.input_dim = 16;
    layer_config l;
    l.size = 8;
    l.sparsity = sparsity_mode::dense;
    c.layers.push_back(l);
    l.size = 24;
    c.layers.push_back(l);
    return c;
}

/// A dataset of n points with one feature and one label each (the fakes only use row ids).
dataset counting_dataset(uint32_t n) {
    dataset d;
    d.source = "counting";
    d.n_features = 16;
    d.n_labels = 24;
    for (uint32_t p = 0; p < n; ++p) {
        const uint32_t f = p % 16, y = p % 24;
        const float v = 1.0f;
        d.push_back(&f, &v, 1, &y, 1);
    }
    return d;
}

/// A device whose "training" adds 1 to output-layer weight (row % size) for every sample, and
/// records the rows it saw: merges must add up every replica's increments exactly (small
/// integers are exact in float), and every sample must be seen once.
class counting_backend final : public backend {
  public:
    counting_backend(const model_state& initial, double seconds_per_sample)
        : model_(initial), seconds_per_sample_(seconds_per_sample) {}

    step_report train_batch(const batch_view& batch, float) override {
        layer_state& out = model_.layers.back();
        for (uint32_t i = 0; i < batch.size; ++i) {
            seen.push_back(batch.rows[i]);
            out.weights[batch.rows[i] % out.weights.size()] += 1.0f;
        }
        std::this_thread::sleep_for(
            std::chrono::duration<double>(seconds_per_sample_ * batch.size));
        step_report r;
        r.samples = batch.size;
        r.loss_sum = batch.size;
        r.active_per_layer = {8, 24};
        return r;
    }
    void rebuild_tables(bool) override { ++rebuilds; }
    void predict(const batch_view&, uint32_t, scoring_mode, uint32_t*, float*) override {}
    void export_state(model_state& out, bool) const override { out = model_; }
    void import_state(const model_state& in, bool) override {
        for (size_t l = 0; l < in.layers.size(); ++l) {
            model_.layers[l].weights = in.layers[l].weights;
            model_.layers[l].bias = in.layers[l].bias;
        }
    }
    backend_info info() const override { return {"fake", "counting", "fp32", 0, 0}; }

    std::vector<uint32_t> seen;
    int rebuilds = 0;

  private:
    model_state model_;
    double seconds_per_sample_;
};

/// Hybrid options with counting workers of the given speeds; `devices` receives the fakes.
hybrid_options counting_workers(const std::vector<double>& seconds_per_sample,
                                std::vector<counting_backend*>& devices) {
    hybrid_options h;
    devices.assign(seconds_per_sample.size(), nullptr);
    for (size_t i = 0; i < seconds_per_sample.size(); ++i) {
        hybrid_worker_options w;
        const double sps = seconds_per_sample[i];
        counting_backend** slot = &devices[i];
        w.make_device = [sps, slot](const model_state& m, const train_config&) {
            auto d = std::make_unique<counting_backend>(m, sps);
            *slot = d.get();
            return std::unique_ptr<backend>(std::move(d));
        };
        w.batch_size = 16;
        h.workers.push_back(w);
    }
    return h;
}

/// Pushes rows [0, n) through train_batch in batches of `batch`, then synchronizes; returns
/// the samples the reports covered.
uint64_t feed(backend& b, const dataset& data, uint32_t n, uint32_t batch) {
    std::vector<uint32_t> rows(n);
    std::iota(rows.begin(), rows.end(), 0u);
    uint64_t reported = 0;
    for (uint32_t begin = 0; begin < n; begin += batch)
        reported +=
            b.train_batch({&data, rows.data() + begin, std::min(batch, n - begin)}, 1e-3f).samples;
    return reported + b.synchronize().samples;
}

}  // namespace

TEST(HybridMerge, AddsEveryReplicaChange) {
    const model_state base = model_state::create(tiny_config(), 3);
    model_state a = base, b = base, shared = base;
    rng gen(4);
    for (auto* m : {&a, &b})
        for (auto& layer : m->layers) {
            for (size_t i = 0; i < layer.weights.size(); ++i)
                layer.weights[i] += gen.normal() * 0.01f;
            for (float& x : layer.bias) x += gen.normal() * 0.01f;
        }
    add_replica_change(shared, a, base);
    add_replica_change(shared, b, base);
    for (size_t l = 0; l < base.layers.size(); ++l) {
        const auto &s = shared.layers[l], &x = a.layers[l], &y = b.layers[l], &z = base.layers[l];
        for (size_t i = 0; i < s.weights.size(); ++i) {
            const double want = double(x.weights[i]) + double(y.weights[i]) - double(z.weights[i]);
            ASSERT_NEAR(s.weights[i], want, 1e-6 * (1 + std::abs(want)))
                << "layer " << l << " " << i;
        }
        for (size_t i = 0; i < s.bias.size(); ++i)
            ASSERT_NEAR(s.bias[i], double(x.bias[i]) + y.bias[i] - z.bias[i], 1e-6);
    }
}

TEST(Hybrid, EverySampleTrainedOnceAndNoChangeDropped) {
    model_state initial = model_state::create(tiny_config(), 5);
    // Integral weights: every sum the merges make is exact, so "exactly" can be checked.
    layer_state& last = initial.layers.back();
    for (size_t i = 0; i < last.weights.size(); ++i) last.weights[i] = float(i % 7);
    const dataset data = counting_dataset(3000);
    std::vector<counting_backend*> devices;
    hybrid_options h = counting_workers({2e-6, 1e-5, 4e-6}, devices);
    h.policy = schedule_policy::hogbatch;
    h.workers[1].batch_size = 5;
    h.workers[2].batch_size = 37;
    h.merge_every = 50;  // many merges, interleaved across the three workers
    h.min_batch = 1;
    auto hybrid = create_hybrid_backend(h, initial, train_config{});
    const uint32_t n = 3000;
    EXPECT_EQ(feed(*hybrid, data, n, 64), n);

    std::vector<uint32_t> all;
    for (auto* d : devices) {
        EXPECT_FALSE(d->seen.empty()) << "a worker got no work";
        all.insert(all.end(), d->seen.begin(), d->seen.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<uint32_t> expected(n);
    std::iota(expected.begin(), expected.end(), 0u);
    EXPECT_EQ(all, expected);  // none lost, none twice

    // Every increment of every replica is in the merged model, exactly.
    model_state merged;
    hybrid->export_state(merged, false);
    const layer_state& out = merged.layers.back();
    const layer_state& before = initial.layers.back();
    std::vector<float> count(out.weights.size(), 0.0f);
    for (uint32_t r = 0; r < n; ++r) count[r % count.size()] += 1.0f;
    for (size_t i = 0; i < count.size(); ++i)
        ASSERT_EQ(out.weights[i], before.weights[i] + count[i]) << "weight " << i;

    const auto stats = hybrid->take_worker_stats();
    ASSERT_EQ(stats.size(), 3u);
    uint64_t samples = 0;
    for (const auto& s : stats) {
        samples += s.samples;
        EXPECT_GT(s.merges, 0u);
        EXPECT_GT(s.utilisation(), 0.0);
        EXPECT_LE(s.utilisation(), 1.0 + 1e-9);
    }
    EXPECT_EQ(samples, n);
    EXPECT_EQ(stats[1].batch_max, 5u);  // hogbatch keeps sizes fixed
}

TEST(Hybrid, AdaptivePolicyMeetsTheRequestedUpdateShares) {
    // The second worker is 4x slower per sample; shares 0.6 / 0.4 of updates are asked.
    const model_state initial = model_state::create(tiny_config(), 6);
    const dataset data = counting_dataset(40000);
    std::vector<counting_backend*> devices;
    hybrid_options h = counting_workers({5e-6, 2e-5}, devices);
    h.policy = schedule_policy::adaptive;
    h.reference_batch = 64;
    h.workers[0].update_share = 0.6;
    h.workers[1].update_share = 0.4;
    h.merge_every = 100000;
    auto hybrid = create_hybrid_backend(h, initial, train_config{});
    feed(*hybrid, data, 10000, 64);  // settling
    hybrid->take_worker_stats();
    feed(*hybrid, data, 30000, 64);
    const auto stats = hybrid->take_worker_stats();
    ASSERT_EQ(stats.size(), 2u);
    // Within 10% of the target shares.
    EXPECT_NEAR(stats[0].update_share, 0.6, 0.06);
    EXPECT_NEAR(stats[1].update_share, 0.4, 0.04);
    // The slow worker got the smaller batches.
    EXPECT_LT(stats[1].batch_mean, stats[0].batch_mean);
}

TEST(Hybrid, RebuildRequestsReachEveryWorker) {
    const model_state initial = model_state::create(tiny_config(), 7);
    const dataset data = counting_dataset(64);
    std::vector<counting_backend*> devices;
    auto hybrid = create_hybrid_backend(counting_workers({0, 0}, devices), initial, train_config{});
    hybrid->rebuild_tables(false);
    feed(*hybrid, data, 64, 8);
    // Each worker rebuilt before its next batch (the idle one when it next trains).
    int rebuilt = 0;
    for (auto* d : devices) rebuilt += d->rebuilds > 0;
    EXPECT_GE(rebuilt, 1);
}

TEST(Hybrid, TwoCpuWorkersTrainTheSameModelShape) {
    // Real CPU backends: training through the hybrid changes the model and keeps its shape.
    const model_config config = tiny_config();
    const model_state initial = model_state::create(config, 8);
    dataset data = counting_dataset(512);
    hybrid_options h;
    for (int i = 0; i < 2; ++i) {
        hybrid_worker_options w;
        w.device.kind = "cpu";
        w.device.threads = 1;
        w.batch_size = 32;
        h.workers.push_back(w);
    }
    h.merge_every = 128;
    auto hybrid = create_hybrid_backend(h, initial, train_config{});
    EXPECT_EQ(hybrid->info().kind, "hybrid");
    EXPECT_EQ(feed(*hybrid, data, 512, 64), 512u);
    model_state after;
    hybrid->export_state(after, true);
    ASSERT_EQ(after.layers.size(), initial.layers.size());
    double moved = 0;
    for (size_t i = 0; i < after.layers[1].weights.size(); ++i)
        moved += std::abs(after.layers[1].weights[i] - initial.layers[1].weights[i]);
    EXPECT_GT(moved, 0.0);
}

TEST(HybridCli, BibtexHybridOfTwoOneThreadWorkersMatchesSingleBackendP1) {
    HSLIDE_REQUIRE_SHARED_DATA();
    const std::string dir = hslide::testing::shared_data_dir() + "/bibtex/";
    hslide::testing::temp_dir tmp;
    const std::string data = "--train " + dir + "Bibtex_data.txt --train-split " + dir +
                             "bibtex_trSplit.txt --test-split " + dir +
                             "bibtex_tstSplit.txt --no-progress --eval-every 10 ";
    auto final_p1 = [&](const std::string& args, const std::string& name) {
        const std::string metrics = tmp.file(name + ".jsonl");
        const auto r =
            hslide::testing::run_hslide("train " + data + args + " --metrics-out " + metrics);
        EXPECT_EQ(r.exit_code, 0) << r.output;
        std::ifstream in(metrics);
        std::string line, last;
        while (std::getline(in, line)) last = line;
        return last.empty() ? 0.0 : nlohmann::json::parse(last).value("p@1", 0.0);
    };
    const double single = final_p1("--threads 2", "single");
    const double hybrid = final_p1(
        "--backend hybrid --workers cpu,cpu --worker-threads 1 --schedule adaptive "
        "--worker-batch 128 --merge-every 1",
        "hybrid");
    EXPECT_GT(single, 0.58);
    EXPECT_NEAR(hybrid, single, 0.01);
}
