// The label-sharded output layer without MPI (issue 32): the row ranges and --shard-weights,
// the communicators' rank-ordered reductions, a shard's initial rows, and CPU backends trained
// as 2 and 3 ranks on threads of this process (local_group) against one rank taking the same
// sharded step: the same model (every weight within 1e-5 relative; measured: the same bits),
// the replicated layers bit-identical on every rank, the same P@1, and each rank holding its
// share of the output layer's bytes; and against one plain process, the same P@1 and losses.
// The same code under mpirun is tests/test_mpi.sh's.
#include "gpu_test_util.hpp"
#include "test_util.hpp"

#include "cpu/cpu_backend.hpp"

#include "hslide/backend_registry.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/dataset.hpp"
#include "hslide/error.hpp"
#include "hslide/loss.hpp"
#include "hslide/metrics.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/shard_checkpoint.hpp"
#include "hslide/shard_comm.hpp"
#include "hslide/shard_softmax.hpp"
#include "hslide/trainer.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

namespace hslide {
namespace {

using testing::random_dataset;
using testing::two_layer_model;

TEST(ShardBounds, EqualSharesCoverEveryRowOnce) {
    EXPECT_EQ(shard_bounds(10, 1, {}), (std::vector<uint32_t>{0, 10}));
    EXPECT_EQ(shard_bounds(10, 3, {}), (std::vector<uint32_t>{0, 3, 6, 10}));
    EXPECT_EQ(shard_bounds(159, 2, {}), (std::vector<uint32_t>{0, 79, 159}));
}

TEST(ShardBounds, WeightsSplitInProportion) {
    EXPECT_EQ(shard_bounds(100, 2, {3, 1}), (std::vector<uint32_t>{0, 75, 100}));
    EXPECT_EQ(shard_bounds(100, 3, {1, 2, 1}), (std::vector<uint32_t>{0, 25, 75, 100}));
    EXPECT_EQ(parse_shard_weights("3,1", 2), (std::vector<double>{3, 1}));
    EXPECT_EQ(parse_shard_weights("0.5,1.5", 2), (std::vector<double>{0.5, 1.5}));
    EXPECT_TRUE(parse_shard_weights("", 4).empty());
}

TEST(ShardBounds, RefusesSharesThatLeaveARankNoRowsOrDoNotParse) {
    auto message = [](auto&& call) {
        try {
            call();
        } catch (const error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message([] { shard_bounds(2, 3, {}); }).find("would hold none"), std::string::npos);
    EXPECT_NE(message([] {
                  shard_bounds(10, 2, {1000, 1});
              }).find("--shard-weights"),
              std::string::npos);
    EXPECT_NE(message([] { parse_shard_weights("3,1", 3); }).find("2 shares for 3 ranks"),
              std::string::npos);
    EXPECT_NE(message([] { parse_shard_weights("3,x", 2); }).find("'x' is not a positive"),
              std::string::npos);
    EXPECT_NE(message([] { parse_shard_weights("3,-1", 2); }).find("--shard-weights"),
              std::string::npos);
}

/// Runs body(comm) on `ranks` threads, one communicator each; rethrows the first failure.
template <typename Body>
void on_ranks(int ranks, Body body) {
    auto comms = local_group::make(ranks);
    std::vector<std::exception_ptr> failures(static_cast<size_t>(ranks));
    std::atomic<int> first_failure{-1};
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            try {
                body(*comms[size_t(r)]);
            } catch (...) {
                failures[size_t(r)] = std::current_exception();
                int none = -1;
                first_failure.compare_exchange_strong(none, r);
                local_group::fail(*comms[size_t(r)]);  // the others must not wait for it
            }
        });
    for (auto& t : threads) t.join();
    // The first rank's to fail: the others' are "another rank failed".
    if (first_failure >= 0) std::rethrow_exception(failures[size_t(first_failure.load())]);
}

TEST(ShardComm, OneProcessIsTheIdentity) {
    single_process_comm comm;
    std::vector<double> v{1.5, -2};
    comm.all_reduce_sum(v.data(), v.size());
    EXPECT_EQ(v, (std::vector<double>{1.5, -2}));
    comm.check_same(7, "a value");
    comm.barrier();
    // A group of one holds every row, and takes the sharded step over them (the reference N
    // ranks are compared against); no group is no shard.
    const output_shard whole = make_output_shard(comm, 10, "");
    EXPECT_EQ(whole.first, 0u);
    EXPECT_EQ(whole.count, 10u);
    EXPECT_TRUE(whole.sharded());
    EXPECT_FALSE(output_shard{}.sharded());
}

TEST(ShardComm, ReductionsAreInRankOrderAndTheSameOnEveryRank) {
    constexpr int ranks = 3;
    std::vector<std::vector<float>> maxima(ranks), float_sums(ranks);
    std::vector<std::vector<double>> sums(ranks);
    std::vector<std::vector<uint8_t>> gathered(ranks);
    on_ranks(ranks, [&](shard_comm& comm) {
        const int r = comm.rank();
        // Values whose sum depends on the order: 1e16 + 1 - 1e16 is 0 left to right.
        std::vector<double> s{r == 0 ? 1e16 : r == 1 ? 1.0 : -1e16, double(r)};
        comm.all_reduce_sum(s.data(), s.size());
        std::vector<float> m{float(r), -float(r)};
        comm.all_reduce_max(m.data(), m.size());
        std::vector<float> f{r == 0 ? 1e8f : r == 1 ? 1.0f : -1e8f};
        comm.all_reduce_sum(f.data(), f.size());
        std::vector<uint8_t> g(size_t(ranks) * 2);
        const uint8_t mine[2] = {uint8_t(r), uint8_t(10 + r)};
        comm.all_gather(mine, 2, g.data());
        comm.barrier();
        comm.check_same(42, "a value");
        sums[size_t(r)] = s;
        maxima[size_t(r)] = m;
        float_sums[size_t(r)] = f;
        gathered[size_t(r)] = g;
    });
    for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(sums[size_t(r)], (std::vector<double>{(1e16 + 1.0) - 1e16, 3.0}));
        EXPECT_EQ(maxima[size_t(r)], (std::vector<float>{2.0f, 0.0f}));
        EXPECT_EQ(float_sums[size_t(r)], (std::vector<float>{(1e8f + 1.0f) - 1e8f}));
        EXPECT_EQ(gathered[size_t(r)], (std::vector<uint8_t>{0, 10, 1, 11, 2, 12}));
    }
}

TEST(ShardComm, ARankThatFailsBeforeACollectiveFailsTheOthersInsteadOfHangingThem) {
    // Rank 1 throws before the reduction rank 0 waits in; rank 0 must throw, not wait forever,
    // and on_ranks must report rank 1's error.
    try {
        on_ranks(2, [](shard_comm& comm) {
            if (comm.rank() == 1) throw std::runtime_error("rank 1's own error");
            double x = 1;
            comm.all_reduce_sum(&x, 1);
        });
        FAIL() << "no error";
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "rank 1's own error");
    }
}

TEST(ShardComm, CheckSameNamesTheDisagreement) {
    std::vector<std::string> messages(2);
    on_ranks(2, [&](shard_comm& comm) {
        try {
            comm.check_same(uint64_t(comm.rank()) + 5, "--seed");
        } catch (const error& e) {
            messages[size_t(comm.rank())] = e.what();
        }
    });
    for (const std::string& m : messages)
        EXPECT_NE(m.find("disagree on --seed (rank 0: 5, rank 1: 6)"), std::string::npos) << m;
}

/// Rank r's rows of `rows` under `weights` (shard_bounds), as a count.
uint32_t rows_of_rank(const std::vector<double>& weights, uint32_t rows, size_t r) {
    const std::vector<uint32_t> b = shard_bounds(rows, int(weights.size()), weights);
    return b[r + 1] - b[r];
}

TEST(ShardAuto, SharesFollowTheRatesInSixteenthsOfARanksEqualShare) {
    constexpr double row = 100, plenty = 1e12;  // bytes a row; memory that never binds
    // Three times the rate: three quarters of the rows, in units of 1/32 of the layer.
    const auto w = auto_shard_weights({{3e9, plenty}, {1e9, plenty}}, 1000, row);
    EXPECT_EQ(w, (std::vector<double>{24, 8}));
    EXPECT_EQ(rows_of_rank(w, 1000, 0), 750u);
    // Two measurements of the same machines a percent apart split alike.
    EXPECT_EQ(auto_shard_weights({{1e9, plenty}, {1.01e9, plenty}}, 1000, row),
              (std::vector<double>{16, 16}));
    EXPECT_EQ(auto_shard_weights({{1.01e9, plenty}, {1e9, plenty}}, 1000, row),
              (std::vector<double>{16, 16}));
    // Five ranks: the units add up to the layer, every rank at least one however slow.
    const auto five = auto_shard_weights(
        {{5e9, plenty}, {1e6, plenty}, {2e9, plenty}, {2e9, plenty}, {1e9, plenty}}, 100000, row);
    EXPECT_DOUBLE_EQ(std::accumulate(five.begin(), five.end(), 0.0), 80.0);
    EXPECT_EQ(five[1], 1.0);
    EXPECT_GT(five[0], five[2]);
    EXPECT_EQ(five[2], five[3]);
    EXPECT_GT(five[3], five[4]);
}

TEST(ShardAuto, ARankGetsNoMoreRowsThanItsMemoryHolds) {
    constexpr double row = 100;
    // The fast rank would take 75% of 1000 rows, but holds only 400 of them: the slow one the
    // rest.
    const auto w = auto_shard_weights({{3e9, 400 * row}, {1e9, 1e12}}, 1000, row);
    EXPECT_LE(rows_of_rank(w, 1000, 0), 400u);
    EXPECT_GE(rows_of_rank(w, 1000, 0), 370u) << "a unit (1/32) below its memory at most";
    // Memory too tight for whole units (the two hold 510 and 490 of 1000 rows): the shares
    // as they are, each within its memory.
    const auto tight = auto_shard_weights({{1e9, 510 * row}, {1e9, 490 * row}}, 1000, row);
    EXPECT_LE(rows_of_rank(tight, 1000, 0), 510u);
    EXPECT_LE(rows_of_rank(tight, 1000, 1), 490u);
    // Not enough memory together: a clear error, not a crash later.
    try {
        auto_shard_weights({{1e9, 300 * row}, {1e9, 300 * row}}, 1000, row);
        FAIL() << "600 rows of room took 1000";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("--shard-weights auto: the output layer's 1000 rows"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(auto_shard_weights({{0, 1e12}, {1e9, 1e12}}, 1000, row), error);
    EXPECT_THROW(auto_shard_weights({{std::nan(""), 1e12}, {1e9, 1e12}}, 1000, row), error);
}

TEST(ShardAuto, RanksExchangeTheirOffersAndSplitAlike) {
    // Two thread-ranks of one host: rank 0 offers three times rank 1's rate.
    std::vector<std::vector<uint32_t>> bounds(2);
    on_ranks(2, [&](shard_comm& comm) {
        bounds[size_t(comm.rank())] =
            auto_shard_bounds(comm, 4000, 100, 0, comm.rank() == 0 ? 3e9 : 1e9);
    });
    EXPECT_EQ(bounds[0], (std::vector<uint32_t>{0, 3000, 4000}));
    EXPECT_EQ(bounds[1], bounds[0]);
}

TEST(ShardAuto, ARankOnAGpuOffersItsGpusMemoryWhichTheRanksOnItDivide) {
    // Rank 0 scores three times as fast but its GPU holds only 1,000 rows of 100 bytes: it
    // gets those, rank 1 (host memory) the rest.
    const memory_pool gpu{"h GPU 0", 1000 * 100.0};
    std::vector<std::vector<uint32_t>> bounds(2);
    on_ranks(2, [&](shard_comm& comm) {
        bounds[size_t(comm.rank())] = auto_shard_bounds(
            comm, 4000, 100, 0, comm.rank() == 0 ? 3e9 : 1e9, comm.rank() == 0 ? &gpu : nullptr);
    });
    EXPECT_EQ(bounds[0], (std::vector<uint32_t>{0, 1000, 4000}));
    EXPECT_EQ(bounds[1], bounds[0]);
    // Two ranks on that GPU divide it: 500 rows each hold a quarter of the layer, short of it.
    on_ranks(2, [&](shard_comm& comm) {
        EXPECT_THROW(auto_shard_bounds(comm, 4000, 100, 0, 1e9, &gpu), error);
    });
}

#if HSLIDE_HAVE_CUDA
TEST(ShardAuto, TheGpuScoringRateIsMeasured) {
    HSLIDE_REQUIRE_GPU();
    backend_options o;
    o.kind = backend_kind::gpu;
    for (const precision_mode p : {precision_mode::fp32, precision_mode::bf16}) {
        o.precision = p;
        const double rate = measure_scoring_rate(o, 128);
        std::printf("  GPU 0 scores %.3g rows a second at width 128 (%s)\n", rate,
                    p == precision_mode::bf16 ? "bf16" : "fp32");
        EXPECT_GT(rate, 1e9) << "far below any GPU's rate: the measurement is broken";
    }
}
#endif

TEST(ShardAuto, TheCpuScoringRateIsMeasured) {
    backend_options o;
    o.kind = backend_kind::cpu;
    o.threads = 1;
    for (uint32_t width : {17u, 128u}) {
        const double rate = measure_scoring_rate(o, width);
        EXPECT_TRUE(std::isfinite(rate) && rate > 1e6) << width << ": " << rate;
    }
    o.kind = backend_kind::cpu_dense;
    EXPECT_THROW(measure_scoring_rate(o, 64), error);
}

TEST(ShardModel, AShardHoldsTheWholeModelsRows) {
    const model_config config = two_layer_model(30, 24, 2500, sparsity_mode::dense);
    const model_state whole = model_state::create(config, 7);
    for (auto [first, count] : {std::pair<uint32_t, uint32_t>{0, 1250},
                                {1250, 1250},
                                {1000, 77},
                                {2047, 453},
                                {0, 2500}}) {
        const model_state shard =
            model_state::create_shard(config, 7, moment_storage::fp32, first, count);
        ASSERT_EQ(shard.layers.back().rows, count);
        ASSERT_EQ(shard.layers.back().bias.size(), count);
        EXPECT_EQ(shard.config.output_dim(), 2500u);
        EXPECT_EQ(std::memcmp(shard.layers[0].weights.data(), whole.layers[0].weights.data(),
                              whole.layers[0].weights.size() * sizeof(float)),
                  0);
        const layer_state& out = whole.layers.back();
        EXPECT_EQ(std::memcmp(shard.layers.back().weights.data(), out.row(first),
                              size_t(count) * out.stride * sizeof(float)),
                  0)
            << "rows [" << first << ", " << first + count << ")";
        EXPECT_EQ(shard.layers.back().adam_m.size(), size_t(count) * out.stride);
    }
}

TEST(ShardModel, AShardsCheckpointKeepsItsRows) {
    const model_config config = two_layer_model(30, 24, 2500, sparsity_mode::dense);
    testing::temp_dir dir;
    const model_state shard = model_state::create_shard(config, 7, moment_storage::fp32, 1000, 77);
    save_checkpoint(dir.file("shard.ckpt"), shard, trainer_state{});
    const checkpoint_contents back = load_checkpoint(dir.file("shard.ckpt"));
    EXPECT_TRUE(back.model.holds_output_shard());
    EXPECT_EQ(back.model.output_first, 1000u);
    EXPECT_EQ(back.model.layers.back().rows, 77u);
    EXPECT_EQ(back.model.config.output_dim(), 2500u);
    EXPECT_EQ(back.model.layers.back().bias.size(), 77u);
    EXPECT_EQ(
        std::memcmp(back.model.layers.back().weights.data(), shard.layers.back().weights.data(),
                    shard.layers.back().weights.size() * sizeof(float)),
        0);
    // A whole model's checkpoint is no shard.
    save_checkpoint(dir.file("whole.ckpt"), model_state::create(config, 7), trainer_state{});
    EXPECT_FALSE(load_checkpoint(dir.file("whole.ckpt")).model.holds_output_shard());
    EXPECT_FALSE(is_shard_manifest(dir.file("whole.ckpt")));
}

/// What one rank of a sharded training run ends with.
struct rank_result {
    model_state model;
    std::vector<double> losses;
    double p_at_1 = 0;
    uint64_t checksum = 0;
    uint64_t memory_bytes = 0;
    output_shard shard;  // its comm is gone once the ranks end
    int rank = 0;
};

/// Trainer options for `tc` that print nothing.
trainer_options quiet_options(const train_config& tc) {
    trainer_options to;
    to.train = tc;
    to.show_progress = false;
    to.eval.show_progress = false;
    return to;
}

/// A rank's backend (1 thread) over its rows of `config`, drawn as the whole layer draws them.
cpu::cpu_backend rank_backend(const model_config& config, const train_config& tc,
                              const output_shard& shard) {
    return cpu::cpu_backend(
        model_state::create_shard(config, tc.seed, tc.adam_moments, shard.first, shard.count), tc,
        1, cpu::best_kernels(), precision_mode::fp32, shard);
}

TEST(ShardTraining, ARankWeighsTheAutomaticSearchOverItsOwnShard) {
    // 100 clusters for the whole layer's 2,500 rows, 71 for a half (100 sqrt(1/2)): probes
    // enough for the half's exact search but not the whole's, on this CPU's kernels.
    model_config config = two_layer_model(30, 16, 2500, sparsity_mode::topk);
    layer_config& out = config.layers.back();
    out.search = top_k_search::automatic;
    out.ivf_clusters = 100;
    const isa_level level = cpu::best_kernels().level;
    const uint32_t per_probe = cpu_exact_rows_per_ivf_row(level) * ivf_min_product_saving;
    out.ivf_probes = (71 + per_probe - 1) / per_probe;
    ASSERT_LT(out.ivf_probes * per_probe, 100u);
    ASSERT_EQ(ivf_shard_cluster_count(100, 2500, 1250), 71u);
    train_config tc;
    tc.loss = output_loss::logistic;
    const cpu::cpu_backend whole(model_state::create(config, 3), tc, 1);
    EXPECT_FALSE(whole.selection_is_exact());  // IVF
    std::atomic<int> exact{0};
    on_ranks(2, [&](shard_comm& comm) {
        const output_shard shard = make_output_shard(comm, config.output_dim(), "");
        exact += rank_backend(config, tc, shard).selection_is_exact();
    });
    EXPECT_EQ(exact.load(), 2);
}

/// Trains `config` on `train` for `epochs` epochs as `ranks` ranks (threads of a local_group;
/// one rank takes the sharded step over the whole layer, as N ranks do over their shares) and
/// evaluates on `test` after each epoch. plain: one unsharded backend instead (ranks = 1), the
/// single process's arithmetic. `kind` gpu: each rank a GPU backend on GPU 0.
std::vector<rank_result> train_as_ranks(const model_config& config, const train_config& tc,
                                        const dataset& train, const dataset& test, int ranks,
                                        const std::string& weights = "",
                                        precision_mode precision = precision_mode::fp32,
                                        bool plain = false, backend_kind kind = backend_kind::cpu) {
    std::vector<rank_result> results(static_cast<size_t>(ranks));
    auto run = [&](shard_comm* comm) {
        rank_result& out = results[comm ? size_t(comm->rank()) : 0];
        if (comm) out.shard = make_output_shard(*comm, config.output_dim(), weights);
        if (comm) out.rank = comm->rank();
        model_state initial = comm ? model_state::create_shard(config, tc.seed, tc.adam_moments,
                                                               out.shard.first, out.shard.count)
                                   : model_state::create(config, tc.seed, tc.adam_moments);
        if (tc.loss == output_loss::logistic) start_at_label_prior(initial, train);  // as the CLI
        std::unique_ptr<backend> engine;
        if (kind == backend_kind::cpu) {
            engine = std::make_unique<cpu::cpu_backend>(std::move(initial), tc, 1,
                                                        cpu::best_kernels(), precision, out.shard);
        } else {
            backend_options bo;
            bo.kind = kind;
            bo.precision = precision;
            bo.shard = out.shard;
            engine = create_backend(bo, std::move(initial), tc);
        }
        trainer run(*engine, train, &test, quiet_options(tc));
        for (const epoch_record& r : run.run()) {
            out.losses.push_back(r.loss);
            if (r.evaluated) out.p_at_1 = r.metrics.p_at(1);
        }
        engine->export_state(out.model, /*with_optimizer=*/true);
        out.checksum = replicated_layers_checksum(out.model.adam_step, out.model.layers.data(),
                                                  out.model.layers.size() - 1);
        out.memory_bytes = engine->info().memory_bytes;
    };
    if (plain) {
        HSLIDE_ASSERT(ranks == 1);
        run(nullptr);
    } else {
        on_ranks(ranks, [&](shard_comm& comm) { run(&comm); });
    }
    return results;
}

/// How far a rank's rows of a layer are from the one-rank model's: the largest |a - b| / |a|
/// over its weights (every weight within `max_relative` of itself), the largest |a - b| over
/// the layer's largest |a|, ||a - b|| / ||a|| (the layer as a whole), and how many weights
/// differ in any bit. Rows [a_first, a_first + b.rows) of a against b's rows (weights, and
/// biases: per row past layer 0, layer 0's whole).
struct difference {
    double max_relative = 0;
    double max_scaled = 0;
    double norm = 0;
    size_t differing = 0;
    size_t weights = 0;
};
difference compare_layers(const layer_state& a, uint32_t a_first, const layer_state& b,
                          bool bias_per_row) {
    difference d;
    double worst = 0, scale = 0, diff2 = 0, norm2 = 0;
    auto add = [&](float x, float y) {
        const double delta = std::fabs(double(x) - double(y));
        worst = std::max(worst, delta);
        scale = std::max(scale, std::fabs(double(x)));
        if (delta > 0)
            d.max_relative =
                std::max(d.max_relative, delta / std::max(std::fabs(double(x)), 1e-30));
        diff2 += delta * delta;
        norm2 += double(x) * double(x);
        d.differing += std::memcmp(&x, &y, sizeof x) != 0;
        ++d.weights;
    };
    for (uint32_t r = 0; r < b.rows; ++r) {
        for (uint32_t i = 0; i < a.width; ++i) add(a.row(a_first + r)[i], b.row(r)[i]);
        if (bias_per_row) add(a.bias[a_first + r], b.bias[r]);
    }
    if (!bias_per_row)
        for (size_t i = 0; i < a.bias.size(); ++i) add(a.bias[i], b.bias[i]);
    d.max_scaled = scale > 0 ? worst / scale : worst;
    d.norm = norm2 > 0 ? std::sqrt(diff2 / norm2) : std::sqrt(diff2);
    return d;
}

/// What "the same model" allows: every weight within max_relative of itself (the issue's
/// check: 1e-5).
struct tolerance {
    double max_relative = 1e-5;
};

/// Checks `ranks` ranks against one rank through the same sharded step (the arithmetic that
/// does not depend on the split): the replicated layers bit-identical across ranks, every
/// weight of every rank within `tol` of the one-rank model's (measured: the same bits), the
/// same P@1 to four digits and the same losses (1e-5 relative), and each rank's share of the
/// output layer's bytes. Then one plain unsharded process (the single process's own
/// arithmetic, whose float sums are in another order) against the ranks: the same P@1 to four
/// digits and the same losses (1e-5), as tests/test_mpi.sh checks `hslide train` under mpirun
/// against one process.
void expect_same_model(const model_config& config, const train_config& tc, const dataset& train,
                       const dataset& test, int ranks, const std::string& weights = "",
                       tolerance tol = {}, precision_mode precision = precision_mode::fp32) {
    const rank_result one = train_as_ranks(config, tc, train, test, 1, "", precision).front();
    const std::vector<rank_result> many =
        train_as_ranks(config, tc, train, test, ranks, weights, precision);
    const rank_result plain =
        train_as_ranks(config, tc, train, test, 1, "", precision, /*plain=*/true).front();
    const size_t out = config.layers.size() - 1;
    const layer_state& whole_out = one.model.layers[out];
    uint32_t rows_seen = 0;
    difference total;
    auto expect_close = [&](const difference& d, const std::string& what) {
        EXPECT_LE(d.max_relative, tol.max_relative)
            << what << ": the largest |difference| / |weight| (" << d.differing << " of "
            << d.weights << " weights differ; the largest difference is " << d.max_scaled
            << " of the layer's largest weight)";
        total.max_relative = std::max(total.max_relative, d.max_relative);
        total.max_scaled = std::max(total.max_scaled, d.max_scaled);
        total.differing += d.differing;
        total.weights += d.weights;
    };
    for (const rank_result& r : many) {
        SCOPED_TRACE("rank " + std::to_string(r.rank) + " of " + std::to_string(ranks));
        EXPECT_EQ(r.checksum, many[0].checksum);
        for (size_t l = 0; l < out; ++l) {
            const layer_state& a = r.model.layers[l];
            const layer_state& b = many[0].model.layers[l];
            EXPECT_EQ(
                std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(float)),
                0)
                << "layer " << l << " differs between ranks";
            EXPECT_EQ(a.bias, b.bias);
            expect_close(compare_layers(one.model.layers[l], 0, a, l > 0),
                         "layer " + std::to_string(l));
        }
        const layer_state& shard_out = r.model.layers[out];
        EXPECT_EQ(r.shard.first, rows_seen);
        EXPECT_EQ(shard_out.rows, r.shard.count);
        rows_seen += shard_out.rows;
        expect_close(compare_layers(whole_out, r.shard.first, shard_out, true),
                     "the output layer's rows [" + std::to_string(r.shard.first) + ", " +
                         std::to_string(r.shard.first + r.shard.count) + ")");
        // Its share of the output layer's bytes (weights, biases and their Adam state; in bf16
        // precision the weights' bf16 copy, rows of whole cache lines), and the rest whole.
        const uint64_t row16_bytes =
            precision == precision_mode::bf16 ? (whole_out.width + 31u) / 32u * 32u * 2u : 0;
        const uint64_t whole_output_bytes =
            3 * (whole_out.weights.size() + whole_out.bias.size()) * sizeof(float) +
            uint64_t(whole_out.rows) * row16_bytes;
        const uint64_t shard_output_bytes =
            3 * (uint64_t(r.shard.count) * whole_out.stride + r.shard.count) * sizeof(float) +
            uint64_t(r.shard.count) * row16_bytes;
        EXPECT_EQ(r.memory_bytes, one.memory_bytes - whole_output_bytes + shard_output_bytes);
        EXPECT_EQ(r.losses.size(), one.losses.size());
        for (const rank_result* ref : {&one, &plain}) {
            const char* which = ref == &one ? "one rank" : "one plain process";
            EXPECT_EQ(std::round(r.p_at_1 * 1e4), std::round(ref->p_at_1 * 1e4))
                << which << ": " << ref->p_at_1 << ", " << ranks << " ranks: " << r.p_at_1;
            ASSERT_EQ(r.losses.size(), ref->losses.size());
            for (size_t e = 0; e < ref->losses.size(); ++e)
                EXPECT_NEAR(r.losses[e], ref->losses[e], 1e-5 * ref->losses[e])
                    << which << ", epoch " << e + 1;
        }
    }
    EXPECT_EQ(rows_seen, config.output_dim());
    // What the plain process's float sums in their own order come to: the same model up to
    // roundings (measured on 2026-11-29: at most 5.3e-5 of a layer's largest weight, Bibtex
    // 2.6e-5; the float shares of ranks before made that 1.4e-2), checked loosely.
    double plain_scaled = 0;
    for (size_t l = 0; l <= out; ++l)
        plain_scaled = std::max(
            plain_scaled,
            compare_layers(one.model.layers[l], 0, plain.model.layers[l], l > 0).max_scaled);
    EXPECT_LE(plain_scaled, 1e-3) << "the plain process's model against one rank's";
    std::printf(
        "  %d ranks against one: %zu of %zu weights compared differ, at most %.3g "
        "relative (%.3g of a layer's largest); P@1 %.4f (one rank %.4f, plain %.4f); "
        "the plain process's model within %.3g of a layer's largest\n",
        ranks, total.differing, total.weights, total.max_relative, total.max_scaled, many[0].p_at_1,
        one.p_at_1, plain.p_at_1, plain_scaled);
}

model_config small_model(sparsity_mode output) {
    model_config config = two_layer_model(60, 32, 97, output);
    if (output == sparsity_mode::topk) {
        config.layers.back().top_k = 8;
        config.layers.back().active.min_active = 24;
        config.layers.back().search = top_k_search::exact;
    }
    return config;
}

train_config small_training() {
    train_config tc;
    tc.epochs = 3;
    tc.batch_size = 32;
    tc.seed = 3;
    return tc;
}

TEST(ShardTraining, DenseOutputOnTwoAndThreeRanksTrainsTheOneRankModel) {
    // Every 7th point unlabelled: skipped by the loss, counted in the batch mean, on every rank.
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    expect_same_model(small_model(sparsity_mode::dense), small_training(), train, test, 2);
    expect_same_model(small_model(sparsity_mode::dense), small_training(), train, test, 3);
}

TEST(ShardTraining, ExactTopKOnTwoAndThreeRanksTrainsTheOneRankModel) {
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    expect_same_model(small_model(sparsity_mode::topk), small_training(), train, test, 2);
    expect_same_model(small_model(sparsity_mode::topk), small_training(), train, test, 3, "1,2,1");
}

TEST(ShardTraining, AutomaticExactTopKOnTwoRanksTrainsTheOneRankModel) {
    // `auto`'s exact search, over each rank's int8 (or bf16) copy of its rows where the CPU
    // has those products: the ranks' merged candidates are one process's.
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    model_config config = small_model(sparsity_mode::topk);
    config.layers.back().search = top_k_search::automatic;
    expect_same_model(config, small_training(), train, test, 2);
}

TEST(ShardTraining, TopKLargerThanAShardTrainsTheOneRankModel) {
    // 97 rows on 3 ranks (32 or 33 each) and a top 40: each rank's candidates are all its rows,
    // padded, and the merge still keeps the 40 best of the layer.
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    model_config config = small_model(sparsity_mode::topk);
    config.layers.back().top_k = 40;
    config.layers.back().active.min_active = 60;
    expect_same_model(config, small_training(), train, test, 3);
}

TEST(ShardTraining, UnequalSharesTrainTheOneRankModel) {
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    expect_same_model(small_model(sparsity_mode::topk), small_training(), train, test, 2, "3,1");
    expect_same_model(small_model(sparsity_mode::dense), small_training(), train, test, 2, "1,5");
}

TEST(ShardTraining, Bf16PrecisionOnTwoRanksTrainsTheOneRankModel) {
    // bf16 weights in the products: each rank's share of the hidden gradient reads its rows'
    // bf16 copies (weighted_row_sum_bf16_f64).
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    expect_same_model(small_model(sparsity_mode::topk), small_training(), train, test, 2, "", {},
                      precision_mode::bf16);
    expect_same_model(small_model(sparsity_mode::dense), small_training(), train, test, 3, "", {},
                      precision_mode::bf16);
}

TEST(ShardLogistic, EachRanksDeltasAreOneProcesssAndTheLossIsSummed) {
    // A sample's set split across 3 ranks (some with none of its labels, one with no members)
    // against logistic_loss_gradient over the whole set: the same delta bits, the same loss.
    std::mt19937 rng(29);
    std::normal_distribution<float> logit(0.0f, 3.0f);
    const uint32_t sizes[] = {1, 15, 16, 17, 33};
    for (uint32_t set : sizes) {
        std::vector<float> logits(set), whole(set);
        for (float& z : logits) z = logit(rng);
        std::vector<uint32_t> label_ids;  // every third member a label
        for (uint32_t i = 0; i < set; i += 3) label_ids.push_back(i);
        const double loss = logistic_loss_gradient(logits.data(), set, label_ids.data(),
                                                   uint32_t(label_ids.size()), whole.data());
        // Rank r holds members [bounds[r], bounds[r + 1]); rank 1 none.
        const uint32_t bounds[] = {0, set / 2, set / 2, set};
        std::vector<std::vector<float>> deltas(3);
        std::vector<double> losses(3);
        on_ranks(3, [&](shard_comm& comm) {
            const int r = comm.rank();
            const uint32_t first = bounds[r], members = bounds[r + 1] - first;
            std::vector<uint32_t> index;
            for (uint32_t id : label_ids)
                if (id - first < members) index.push_back(id - first);
            std::vector<float> delta(members, 99.0f);
            shard_softmax_sample x;
            x.logits = logits.data() + first;
            x.delta = delta.data();
            x.members = members;
            x.label_index = index.data();
            x.label_members = uint32_t(index.size());
            x.labels = uint32_t(label_ids.size());
            x.log_partition = 1e30;  // not read
            shard_softmax_scratch scratch;
            sharded_set_logistic(comm, &x, 1, 1, scratch);
            deltas[size_t(r)] = delta;
            losses[size_t(r)] = x.loss;
            EXPECT_EQ(x.dropped_mass, 0.0);
        });
        for (int r = 0; r < 3; ++r) {
            SCOPED_TRACE("set of " + std::to_string(set) + ", rank " + std::to_string(r));
            EXPECT_NEAR(losses[size_t(r)], loss, 1e-12 * std::fabs(loss));
            EXPECT_EQ(losses[size_t(r)], losses[0]);  // summed in rank order: the same bits
            for (uint32_t i = 0; i < deltas[size_t(r)].size(); ++i)
                EXPECT_EQ(deltas[size_t(r)][i], whole[bounds[r] + i]) << "member " << i;
        }
    }
    // An unlabelled sample trains nothing: its deltas and loss are 0 on every rank.
    on_ranks(2, [&](shard_comm& comm) {
        float z[3] = {1.0f, -2.0f, 0.5f}, delta[3] = {7.0f, 7.0f, 7.0f};
        shard_softmax_sample x;
        x.logits = z;
        x.delta = delta;
        x.members = 3;
        shard_softmax_scratch scratch;
        sharded_set_logistic(comm, &x, 1, 1, scratch);
        EXPECT_EQ(x.loss, 0.0);
        for (float d : delta) EXPECT_EQ(d, 0.0f);
    });
}

TEST(ShardTraining, TheLogisticLossOnTwoAndThreeRanksTrainsTheOneRankModel) {
    // The output biases start at the label prior of the whole layer's rows on every rank.
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    train_config logistic = small_training();
    logistic.loss = output_loss::logistic;
    logistic.learning_rate = logistic_learning_rate;
    expect_same_model(small_model(sparsity_mode::dense), logistic, train, test, 2);
    expect_same_model(small_model(sparsity_mode::topk), logistic, train, test, 3, "1,2,1");
    // And it is not the softmax's model.
    const model_config config = small_model(sparsity_mode::topk);
    const rank_result with = train_as_ranks(config, logistic, train, test, 2)[0];
    train_config softmax = logistic;
    softmax.loss = output_loss::softmax;
    const rank_result without = train_as_ranks(config, softmax, train, test, 2)[0];
    EXPECT_GT(compare_layers(without.model.layers[0], 0, with.model.layers[0], false).differing,
              with.model.layers[0].weights.size() / 2);
}

TEST(ShardTraining, TheWeightAverageOnTwoAndThreeRanksIsTheOneRanks) {
    // Each rank averages what it holds (the replicated layers alike on every rank): the averaged
    // model the ranks score, keep and export is the one rank's, bit for bit.
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    train_config averaged = small_training();
    averaged.ema_epochs = 0.5;
    expect_same_model(small_model(sparsity_mode::topk), averaged, train, test, 2);
    expect_same_model(small_model(sparsity_mode::dense), averaged, train, test, 3, "1,2,1");
    // And it is an average: not the weights a run without one ends with.
    const model_config config = small_model(sparsity_mode::topk);
    const rank_result with = train_as_ranks(config, averaged, train, test, 2)[1];
    const rank_result without = train_as_ranks(config, small_training(), train, test, 2)[1];
    for (size_t l = 0; l < config.layers.size(); ++l)
        EXPECT_GT(compare_layers(without.model.layers[l], 0, with.model.layers[l], l > 0).differing,
                  with.model.layers[l].weights.size() / 2)
            << "layer " << l;
}

/// GPU ranks (`ranks` threads, each a GPU backend on GPU 0) against one GPU rank taking the same
/// sharded step, and that one against one CPU rank (the sets are built by the same host code,
/// from the same seeds): the replicated layer the same bits on every rank, every weight within
/// 1e-5 relative of the one GPU rank's, the same P@1 to four digits and losses within 1e-5;
/// the GPU's float products against the CPU's: P@1 within 0.02 and losses within 1e-3 (bf16,
/// whose GPU products also round the hidden activations: 1e-2).
void expect_gpu_ranks_train_one_ranks_model(const model_config& config, const train_config& tc,
                                            const dataset& train, const dataset& test, int ranks,
                                            precision_mode precision = precision_mode::fp32) {
    const rank_result one =
        train_as_ranks(config, tc, train, test, 1, "", precision, false, backend_kind::gpu).front();
    const rank_result cpu_one = train_as_ranks(config, tc, train, test, 1, "", precision).front();
    const std::vector<rank_result> many =
        train_as_ranks(config, tc, train, test, ranks, "", precision, false, backend_kind::gpu);
    const size_t out = config.layers.size() - 1;
    for (const rank_result& r : many) {
        SCOPED_TRACE("GPU rank " + std::to_string(r.rank) + " of " + std::to_string(ranks));
        EXPECT_EQ(r.checksum, many[0].checksum) << "the replicated layer differs between ranks";
        for (size_t l = 0; l <= out; ++l) {
            const difference d = compare_layers(one.model.layers[l], l == out ? r.shard.first : 0,
                                                r.model.layers[l], l > 0);
            EXPECT_LE(d.max_relative, 1e-5)
                << "layer " << l << ": " << d.differing << " of " << d.weights << " differ";
        }
        EXPECT_EQ(std::round(r.p_at_1 * 1e4), std::round(one.p_at_1 * 1e4))
            << "one GPU rank " << one.p_at_1 << ", " << ranks << ": " << r.p_at_1;
        ASSERT_EQ(r.losses.size(), one.losses.size());
        for (size_t e = 0; e < one.losses.size(); ++e)
            EXPECT_NEAR(r.losses[e], one.losses[e], 1e-5 * one.losses[e]) << "epoch " << e + 1;
    }
    EXPECT_NEAR(one.p_at_1, cpu_one.p_at_1, 0.02) << "one GPU rank against one CPU rank";
    ASSERT_EQ(one.losses.size(), cpu_one.losses.size());
    const double loss_tolerance = precision == precision_mode::bf16 ? 1e-2 : 1e-3;
    for (size_t e = 0; e < one.losses.size(); ++e)
        EXPECT_NEAR(one.losses[e], cpu_one.losses[e], loss_tolerance * cpu_one.losses[e])
            << "one GPU rank against one CPU rank, epoch " << e + 1;
    std::printf("  %d GPU ranks: P@1 %.4f (one GPU rank %.4f, one CPU rank %.4f)\n", ranks,
                many[0].p_at_1, one.p_at_1, cpu_one.p_at_1);
}

TEST(ShardTraining, GpuRanksOfADenseLayerTrainTheOneGpuRanksModel) {
    HSLIDE_REQUIRE_GPU();
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    expect_gpu_ranks_train_one_ranks_model(small_model(sparsity_mode::dense), small_training(),
                                           train, test, 2);
    expect_gpu_ranks_train_one_ranks_model(small_model(sparsity_mode::dense), small_training(),
                                           train, test, 3, precision_mode::bf16);
}

TEST(ShardTraining, GpuRanksWithTheLogisticLossTrainTheOneGpuRanksModel) {
    // The members' deltas through sharded_set_logistic on the host, as the CPU ranks'.
    HSLIDE_REQUIRE_GPU();
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    train_config logistic = small_training();
    logistic.loss = output_loss::logistic;
    logistic.learning_rate = logistic_learning_rate;
    expect_gpu_ranks_train_one_ranks_model(small_model(sparsity_mode::topk), logistic, train, test,
                                           2);
    expect_gpu_ranks_train_one_ranks_model(small_model(sparsity_mode::dense), logistic, train, test,
                                           3);
}

TEST(ShardTraining, GpuRanksOfAnExactTopKLayerTrainTheOneGpuRanksModel) {
    HSLIDE_REQUIRE_GPU();
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    expect_gpu_ranks_train_one_ranks_model(small_model(sparsity_mode::topk), small_training(),
                                           train, test, 2);
    expect_gpu_ranks_train_one_ranks_model(small_model(sparsity_mode::topk), small_training(),
                                           train, test, 3);
    // A top 40 of 97 rows on 3 ranks: each rank's candidates are all its rows, padded.
    model_config wide = small_model(sparsity_mode::topk);
    wide.layers.back().top_k = 40;
    wide.layers.back().active.min_active = 60;
    expect_gpu_ranks_train_one_ranks_model(wide, small_training(), train, test, 3,
                                           precision_mode::bf16);
}

TEST(ShardTraining, GpuRanksRefuseWhatTheyDoNotShard) {
    HSLIDE_REQUIRE_GPU();
    const model_config lsh = small_model(sparsity_mode::lsh);
    on_ranks(2, [&](shard_comm& comm) {
        backend_options bo;
        bo.kind = backend_kind::gpu;
        bo.shard = make_output_shard(comm, lsh.output_dim(), "");
        try {
            create_backend(bo,
                           model_state::create_shard(lsh, 3, moment_storage::fp32, bo.shard.first,
                                                     bo.shard.count),
                           small_training());
            ADD_FAILURE() << "an LSH output layer was sharded across GPU ranks";
        } catch (const error& e) {
            EXPECT_NE(std::string(e.what()).find("--output-sparsity lsh"), std::string::npos)
                << e.what();
        }
    });
}

/// Bibtex (train/test splits of ../shared/data/bibtex), hidden 256.
void bibtex(dataset& train, dataset& test) {
    const std::string dir = testing::shared_data_dir() + "/bibtex/";
    const dataset all = read_xc(dir + "Bibtex_data.txt");
    train = subset(all, read_split(dir + "bibtex_trSplit.txt", 1, all.size()));
    test = subset(all, read_split(dir + "bibtex_tstSplit.txt", 1, all.size()));
}

/// The issue's Bibtex checks: the splits, 3 epochs from seed 1, and the 1836 -> 256 -> 159
/// network whose output layer is `output` ("forced sparse": sets of 48, top-k's top 16).
struct bibtex_case {
    dataset train, test;
    train_config tc;
    model_config config;
};
bibtex_case bibtex_forced(sparsity_mode output) {
    bibtex_case c;
    bibtex(c.train, c.test);
    c.tc.epochs = 3;
    c.tc.seed = 1;
    c.config =
        two_layer_model(uint32_t(c.train.n_features), 256, uint32_t(c.train.n_labels), output);
    c.config.layers.back().active.min_active = 48;
    if (output == sparsity_mode::topk) c.config.layers.back().top_k = 16;
    return c;
}

TEST(ShardTraining, BibtexForcedSparseAndDenseOnTwoRanks) {
    HSLIDE_REQUIRE_SHARED_DATA();
    bibtex_case c = bibtex_forced(sparsity_mode::topk);
    const dataset &train = c.train, &test = c.test;
    const train_config& tc = c.tc;
    // The issue's check: every weight within 1e-5 relative after 3 epochs. Two ranks add the
    // hidden gradient's shares and the softmax's sums of exponentials in double and round once,
    // so they compute the one rank's bits (measured on 2026-11-29: not one weight differs,
    // sparse or dense). Before, with float shares, Adam amplified their roundings of
    // near-cancelled gradients to 1.5e-5 (sparse) and 1.4e-2 (dense) of a layer's largest weight.
    model_config& sparse = c.config;
    sparse.layers.back().search = top_k_search::exact;
    expect_same_model(sparse, tc, train, test, 2);
    expect_same_model(two_layer_model(uint32_t(train.n_features), 256, uint32_t(train.n_labels),
                                      sparsity_mode::dense),
                      tc, train, test, 2);
}

/// Trains `config` on 2 thread-ranks with the shares `weights` ("" = equal), saving a sharded
/// checkpoint at `path` after every epoch (each rank its file, rank 0 the manifest); returns each
/// rank's last epoch's test metrics (none without `test`).
std::vector<metrics_result> train_two_ranks_and_save(const model_config& config,
                                                     const train_config& tc, const dataset& train,
                                                     const dataset* test, const std::string& path,
                                                     const std::string& weights) {
    std::vector<metrics_result> trained(2);
    on_ranks(2, [&](shard_comm& comm) {
        const output_shard shard = make_output_shard(comm, config.output_dim(), weights);
        cpu::cpu_backend engine = rank_backend(config, tc, shard);
        trainer_options to = quiet_options(tc);
        to.save_path = shard_checkpoint_path(path, comm.rank(), comm.size());
        to.after_checkpoint = [&] { write_shard_manifest(comm, path, shard); };
        trainer run(engine, train, test, to);
        trained[size_t(comm.rank())] = run.run().back().metrics;
    });
    return trained;
}

/// The top `k` labels (and their scores) of every point of `data` and the metrics, as the
/// backend `engine` scores them (exactly).
struct scored {
    std::vector<uint32_t> labels;
    std::vector<float> scores;
    metrics_result metrics;
};
scored score(backend& engine, const dataset& data, scoring_mode scoring, uint32_t k = 5) {
    scored out;
    std::vector<uint32_t> rows(data.size());
    std::iota(rows.begin(), rows.end(), 0u);
    out.labels.resize(rows.size() * k);
    out.scores.resize(rows.size() * k);
    engine.predict({&data, rows.data(), uint32_t(rows.size())}, k, scoring, out.labels.data(),
                   out.scores.data());
    evaluation_options eo;
    eo.scoring = scoring;
    eo.show_progress = false;
    eo.batch_size = 64;  // several predict calls, each a merge across ranks
    out.metrics = evaluate(engine, data, eo);
    return out;
}

/// The same metrics, up to the roundings of their sums over points (evaluate's threads).
void expect_same_metrics(const metrics_result& a, const metrics_result& b,
                         const std::string& what) {
    EXPECT_EQ(a.n, b.n) << what;
    ASSERT_EQ(a.precision.size(), b.precision.size()) << what;
    ASSERT_EQ(a.ndcg.size(), b.ndcg.size()) << what;
    for (size_t k = 0; k < a.precision.size(); ++k) {
        EXPECT_NEAR(a.precision[k], b.precision[k], 1e-12) << what << ", P@" << k + 1;
        EXPECT_NEAR(a.ndcg[k], b.ndcg[k], 1e-12) << what << ", nDCG@" << k + 1;
    }
}

void expect_same_scores(const scored& a, const scored& b, const std::string& what) {
    EXPECT_EQ(a.labels, b.labels) << what;
    EXPECT_EQ(a.scores, b.scores) << what;
    expect_same_metrics(a.metrics, b.metrics, what);
}

/// `ranks` ranks (threads) score the checkpoint `path` as hslide eval|predict do
/// (load_for_scoring); rank r's result at [r]. One rank: the plain backend, the whole model.
std::vector<scored> score_as_ranks(const std::string& path, const dataset& test, int ranks,
                                   std::vector<output_shard>* shards = nullptr,
                                   scoring_mode scoring = scoring_mode::exact) {
    std::vector<scored> out(static_cast<size_t>(ranks));
    if (shards) shards->assign(size_t(ranks), {});
    on_ranks(ranks, [&](shard_comm& comm) {
        output_shard shard;
        checkpoint_contents ck = load_for_scoring(comm, path, shard);
        EXPECT_EQ(shard.sharded(), ranks > 1);
        if (ranks > 1) EXPECT_EQ(ck.model.layers.back().rows, shard.count);
        EXPECT_TRUE(ck.model.layers.back().adam_m.size() == 0 || !is_shard_manifest(path))
            << "scoring keeps no Adam moments of a sharded checkpoint";
        cpu::cpu_backend engine(std::move(ck.model), train_config{}, 1, cpu::best_kernels(),
                                precision_mode::fp32, shard);
        out[size_t(comm.rank())] = score(engine, test, scoring);
        if (shards) (*shards)[size_t(comm.rank())] = shard;
    });
    return out;
}

TEST(ShardEvaluation, ASavedShardedModelScoresTheSameOnRanksAndInOneProcess) {
    // 2 ranks train and save a sharded checkpoint as `hslide train --save` does under mpirun;
    // then it is scored as `hslide eval|predict` score it: under 2 ranks (each its own file),
    // 3 ranks (equal shares, read across the files), and in one process (assembled whole).
    // Every way returns the same top 5 labels and scores of every point and the same metrics,
    // those of the training run's last evaluation (the same model, scored exactly there too).
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    const model_config config = small_model(sparsity_mode::topk);
    const train_config tc = small_training();
    testing::temp_dir dir;
    const std::string path = dir.file("sharded.ckpt");
    const std::vector<metrics_result> trained =
        train_two_ranks_and_save(config, tc, train, &test, path, "3,1");
    ASSERT_TRUE(is_shard_manifest(path));
    EXPECT_EQ(read_shard_manifest(path).bounds, (std::vector<uint32_t>{0, 73, 97}));

    std::vector<output_shard> two_shards, three_shards;
    const std::vector<scored> two = score_as_ranks(path, test, 2, &two_shards);
    const std::vector<scored> three = score_as_ranks(path, test, 3, &three_shards);
    const std::vector<scored> one = score_as_ranks(path, test, 1);
    EXPECT_EQ(two_shards[1].first, 73u) << "as many ranks as saved it: the saved split";
    EXPECT_EQ(three_shards[1].first, 32u) << "another number of ranks: equal shares";
    for (int r = 0; r < 2; ++r)
        expect_same_scores(two[size_t(r)], one[0], "2 ranks, rank " + std::to_string(r));
    for (int r = 0; r < 3; ++r)
        expect_same_scores(three[size_t(r)], one[0], "3 ranks, rank " + std::to_string(r));
    expect_same_metrics(one[0].metrics, trained[0], "the training run's last evaluation");
    EXPECT_EQ(one[0].metrics.n, test.size());
    EXPECT_GT(one[0].metrics.p_at(1), 0.0);

    // A whole checkpoint (the sharded one's rows, with their Adam state, saved as one) scored
    // by 2 ranks: each takes its equal share of the rows.
    const std::string whole = dir.file("whole.ckpt");
    {
        const checkpoint_contents ck = load_shard_rows(path, 0, 97, /*with_optimizer=*/true);
        EXPECT_FALSE(ck.model.holds_output_shard());
        save_checkpoint(whole, ck.model, ck.trainer);
    }
    const std::vector<scored> whole_two = score_as_ranks(whole, test, 2);
    for (int r = 0; r < 2; ++r)
        expect_same_scores(whole_two[size_t(r)], one[0], "a whole checkpoint on 2 ranks");
}

TEST(ShardEvaluation, LshScoringOfAShardedModelIsOneProcesss) {
    // An LSH model trained by 2 ranks, scored through its tables (--scoring lsh): each point's
    // set is built across the ranks as one process builds it (multi-probe, fill), so 2 and 3
    // ranks return one process's labels and scores.
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    model_config config = small_model(sparsity_mode::lsh);
    config.layers.back().active.min_active = 24;
    config.layers.back().active.probes = 2;
    const train_config tc = small_training();
    testing::temp_dir dir;
    const std::string path = dir.file("lsh.ckpt");
    train_two_ranks_and_save(config, tc, train, nullptr, path, "");
    const std::vector<scored> one = score_as_ranks(path, test, 1, nullptr, scoring_mode::lsh);
    for (int ranks : {2, 3}) {
        const std::vector<scored> many =
            score_as_ranks(path, test, ranks, nullptr, scoring_mode::lsh);
        for (int r = 0; r < ranks; ++r)
            expect_same_scores(many[size_t(r)], one[0],
                               std::to_string(ranks) + " ranks, rank " + std::to_string(r));
    }
    // Through the tables, not exactly (the sets leave rows out).
    EXPECT_NE(score_as_ranks(path, test, 1).front().labels, one[0].labels);
}

TEST(ShardEvaluation, RowsOfAShardedCheckpoint) {
    // load_shard_rows: any range of rows, across the files' boundary, with or without the
    // Adam moments; keep_output_rows of a whole model gives the same rows.
    const model_config config = small_model(sparsity_mode::dense);
    testing::temp_dir dir;
    const std::string path = dir.file("ck");
    const model_state whole = model_state::create(config, 9);
    on_ranks(2, [&](shard_comm& comm) {
        const output_shard shard = make_output_shard(comm, config.output_dim(), "");
        model_state mine = whole;
        keep_output_rows(mine, shard.first, shard.count);
        EXPECT_EQ(mine.output_first, shard.first);
        save_checkpoint(shard_checkpoint_path(path, comm.rank(), comm.size()), mine,
                        trainer_state{});
        write_shard_manifest(comm, path, shard);
    });
    for (auto [first, count] : {std::pair<uint32_t, uint32_t>{0, 97}, {40, 20}, {0, 48}, {96, 1}}) {
        for (bool optimizer : {false, true}) {
            SCOPED_TRACE("rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                         (optimizer ? "), with Adam state" : ")"));
            const checkpoint_contents c = load_shard_rows(path, first, count, optimizer);
            const layer_state& got = c.model.layers.back();
            const layer_state& want = whole.layers.back();
            EXPECT_EQ(c.model.output_first, first);
            ASSERT_EQ(got.rows, count);
            EXPECT_EQ(std::memcmp(got.weights.data(), want.row(first),
                                  size_t(count) * want.stride * sizeof(float)),
                      0);
            EXPECT_TRUE(std::equal(got.bias.begin(), got.bias.end(), want.bias.begin() + first));
            EXPECT_EQ(got.adam_m.size(), optimizer ? size_t(count) * want.stride : 0u);
            EXPECT_EQ(std::memcmp(c.model.layers[0].weights.data(), whole.layers[0].weights.data(),
                                  whole.layers[0].weights.size() * sizeof(float)),
                      0);
        }
    }
    EXPECT_THROW(load_shard_rows(path, 90, 8, false), error);
}

/// The --metrics-out records of `ranks` ranks (threads) training `config` 2 epochs with
/// trainer_options::ranks set, rank 0 writing them; and one plain process's backend_info.
std::vector<nlohmann::json> sharded_records(const model_config& config, const dataset& train,
                                            int ranks, backend_info& plain) {
    train_config tc = small_training();
    tc.epochs = 2;
    testing::temp_dir dir;
    const std::string out = dir.file("metrics.jsonl");
    on_ranks(ranks, [&](shard_comm& comm) {
        const output_shard shard = make_output_shard(comm, config.output_dim(), "");
        cpu::cpu_backend engine = rank_backend(config, tc, shard);
        trainer_options to = quiet_options(tc);
        to.ranks = &comm;
        if (comm.rank() == 0) to.metrics_out = out;
        trainer run(engine, train, &train, to);
        run.run();
    });
    plain = cpu::cpu_backend(model_state::create(config, tc.seed), tc, 1).info();
    std::vector<nlohmann::json> records;
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    return records;
}

TEST(ShardMetrics, RankZerosRecordsHoldEveryRanksBytesAndTraffic) {
    // Each rank's output-layer bytes (weights, biases, Adam state) as reported are 1/N of the
    // whole layer's, within one row's; together exactly the whole. The bytes a rank receives a
    // step are the model of bench/scale.md: per sample, 4 (the maximum) + 24 (three sums) +
    // 8 x hidden (the hidden gradient's share, doubles), and with exact top-k 8 x (k + 1) (the
    // candidates' ids and scores, the log-partition), each from N - 1 ranks.
    const dataset train = random_dataset(300, 60, 97, 11);
    const uint32_t hidden = 32, top_k = 8;
    for (sparsity_mode mode : {sparsity_mode::dense, sparsity_mode::topk}) {
        for (int ranks : {2, 3}) {
            SCOPED_TRACE(std::string(mode == sparsity_mode::dense ? "dense" : "top-k") + ", " +
                         std::to_string(ranks) + " ranks");
            backend_info whole;
            const std::vector<nlohmann::json> records =
                sharded_records(small_model(mode), train, ranks, whole);
            ASSERT_EQ(records.size(), 2u);
            const uint64_t row_bytes = 3 * (uint64_t(padded_stride(hidden)) + 1) * sizeof(float);
            EXPECT_EQ(whole.output_rows, 97u);
            EXPECT_EQ(whole.output_layer_bytes, 97 * row_bytes);
            const std::vector<uint32_t> bounds = shard_bounds(97, ranks, {});
            const uint64_t per_sample =
                4 + 24 + 8 * hidden + (mode == sparsity_mode::topk ? 8 * (top_k + 1) : 0);
            for (const nlohmann::json& j : records) {
                ASSERT_EQ(j.at("ranks").size(), size_t(ranks));
                uint64_t total = 0;
                for (int r = 0; r < ranks; ++r) {
                    const nlohmann::json& f = j.at("ranks")[size_t(r)];
                    EXPECT_EQ(f.at("rank"), r);
                    EXPECT_EQ(f.at("output_rows"),
                              (std::vector<uint32_t>{bounds[size_t(r)], bounds[size_t(r) + 1]}));
                    const uint64_t bytes = f.at("output_layer_bytes");
                    total += bytes;
                    EXPECT_LE(std::fabs(double(bytes) - double(whole.output_layer_bytes) / ranks),
                              double(row_bytes))
                        << "rank " << r << "'s output-layer bytes against 1/" << ranks
                        << " of the layer's";
                    EXPECT_GT(f.at("peak_rss_bytes").get<uint64_t>(), 0u);
                    const nlohmann::json& c = f.at("communication");
                    EXPECT_EQ(c.at("steps"), (300u + 31) / 32);
                    EXPECT_EQ(c.at("bytes").get<uint64_t>(),
                              uint64_t(ranks - 1) * 300 * per_sample);
                    EXPECT_DOUBLE_EQ(c.at("bytes_per_step").get<double>(),
                                     c.at("bytes").get<double>() / c.at("steps").get<double>());
                    EXPECT_GE(c.at("collectives").get<uint64_t>(),
                              3 * c.at("steps").get<uint64_t>());
                    EXPECT_GT(c.at("seconds").get<double>(), 0.0);
                }
                EXPECT_EQ(total, whole.output_layer_bytes);
                EXPECT_EQ(j.at("output_layer_bytes"), j.at("ranks")[0].at("output_layer_bytes"));
                EXPECT_EQ(j.at("communication"), j.at("ranks")[0].at("communication"));
            }
        }
    }
}

/// Trains `config` as one plain process and as `ranks` ranks, checks the replicated layers the
/// same bits on every rank, and returns the ranks' final P@1 and the one process's.
std::pair<double, double> ranks_and_one_p_at_1(const model_config& config, const train_config& tc,
                                               const dataset& train, const dataset& test,
                                               int ranks) {
    const rank_result plain =
        train_as_ranks(config, tc, train, test, 1, "", precision_mode::fp32, true).front();
    const std::vector<rank_result> many = train_as_ranks(config, tc, train, test, ranks);
    for (const rank_result& r : many) {
        EXPECT_EQ(r.checksum, many[0].checksum) << "rank " << r.rank;
        EXPECT_EQ(r.p_at_1, many[0].p_at_1) << "rank " << r.rank;
        EXPECT_EQ(r.losses.size(), plain.losses.size());
    }
    std::printf("  %d ranks: P@1 %.4f, one process %.4f; losses %.4f, %.4f (last epoch)\n", ranks,
                many[0].p_at_1, plain.p_at_1, many[0].losses.back(), plain.losses.back());
    return {many[0].p_at_1, plain.p_at_1};
}

/// ranks_and_one_p_at_1 with the ranks' final P@1 within `within` of the one process's (the
/// selections that are not exact: IVF, LSH).
void expect_close_p_at_1(const model_config& config, const train_config& tc, const dataset& train,
                         const dataset& test, int ranks, double within) {
    const auto [many, plain] = ranks_and_one_p_at_1(config, tc, train, test, ranks);
    EXPECT_NEAR(many, plain, within);
}

TEST(ShardTraining, IvfSearchOnTwoAndThreeRanks) {
    // Each rank keeps an IVF index over its rows; the candidates merge as exact scoring's.
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    model_config config = small_model(sparsity_mode::topk);
    config.layers.back().search = top_k_search::ivf;
    config.layers.back().ivf_clusters = 6;
    config.layers.back().ivf_probes = 2;
    config.layers.back().ivf_refresh = 4;
    expect_close_p_at_1(config, small_training(), train, test, 2, 0.05);
    expect_close_p_at_1(config, small_training(), train, test, 3, 0.05);
}

TEST(ShardTraining, BibtexForcedSparseIvfOnTwoRanksWithinAHundredthOfOneRank) {
    // The issue's check for the selections that are not exact: 2 ranks within 0.01 P@1 of one
    // rank after 3 epochs (one rank's index: 8 clusters over 159 rows; each rank's: 8 over its
    // 79 or 80, 2 probed).
    HSLIDE_REQUIRE_SHARED_DATA();
    bibtex_case c = bibtex_forced(sparsity_mode::topk);
    c.config.layers.back().search = top_k_search::ivf;
    c.config.layers.back().ivf_clusters = 8;  // per rank: 2 of 8 clusters probed, not all rows
    c.config.layers.back().ivf_probes = 2;
    // Over seeds 1-6: each rank's index is another selection, and one seed's P@1 moves as much
    // with it as with the seed (2 ranks against one process: -0.014 to +0.012 a seed, one
    // process over the seeds 0.546 to 0.588; with normal rather than uniform initial weights
    // -0.026 to +0.018). The mean is what the ranks change.
    double many = 0, plain = 0;
    const int seeds = 6;
    for (int seed = 1; seed <= seeds; ++seed) {
        c.tc.seed = uint64_t(seed);
        const auto [m, p] = ranks_and_one_p_at_1(c.config, c.tc, c.train, c.test, 2);
        many += m / seeds;
        plain += p / seeds;
    }
    EXPECT_NEAR(many, plain, 0.01);
}

TEST(ShardTraining, LshOnTwoAndThreeRanks) {
    // Each rank's tables over its rows; every rank builds the same sets from all ranks'
    // candidates (the replicas stay the same bits), close to one process's.
    const dataset train = random_dataset(600, 60, 97, 11), test = random_dataset(200, 60, 97, 12);
    model_config config = small_model(sparsity_mode::lsh);
    config.layers.back().active.min_active = 24;
    expect_close_p_at_1(config, small_training(), train, test, 2, 0.05);
    expect_close_p_at_1(config, small_training(), train, test, 3, 0.05);
    config.layers.back().active.min_active = 10;  // the cut by hits, across ranks
    config.layers.back().active.max_active = 12;
    expect_close_p_at_1(config, small_training(), train, test, 2, 0.05);
}

TEST(ShardTraining, BibtexForcedSparseLshOnTwoRanksWithinAHundredthOfOneRank) {
    // The issue's check: 2 ranks within 0.01 P@1 of one rank after 3 epochs, LSH sets.
    HSLIDE_REQUIRE_SHARED_DATA();
    const bibtex_case c = bibtex_forced(sparsity_mode::lsh);
    expect_close_p_at_1(c.config, c.tc, c.train, c.test, 2, 0.01);
}

TEST(ShardTraining, RefusesWhatIsNotSharded) {
    train_config tc = small_training();
    auto message = [&](model_config config) {
        std::string text = "no error";
        on_ranks(2, [&](shard_comm& comm) {
            const output_shard shard = make_output_shard(comm, config.output_dim(), "");
            try {
                cpu::cpu_backend engine(model_state::create_shard(config, 1, moment_storage::fp32,
                                                                  shard.first, shard.count),
                                        tc, 1, cpu::best_kernels(), precision_mode::fp32, shard);
            } catch (const error& e) {
                if (comm.rank() == 0) text = e.what();
            }
        });
        return text;
    };
    train_config catching_up = small_training();
    catching_up.adam = adam_mode::catch_up;
    std::string text = "no error";
    on_ranks(2, [&](shard_comm& comm) {
        const model_config config = small_model(sparsity_mode::lsh);
        const output_shard shard = make_output_shard(comm, config.output_dim(), "");
        try {
            cpu::cpu_backend engine(model_state::create_shard(config, 1, moment_storage::fp32,
                                                              shard.first, shard.count),
                                    catching_up, 1, cpu::best_kernels(), precision_mode::fp32,
                                    shard);
        } catch (const error& e) {
            if (comm.rank() == 0) text = e.what();
        }
    });
    EXPECT_NE(text.find("--adam catch-up: an LSH output layer sharded"), std::string::npos) << text;
    model_config corrected = small_model(sparsity_mode::topk);
    corrected.layers.back().fill_correction = 1;
    EXPECT_NE(message(corrected).find("--fill-correction"), std::string::npos);
    // What --loss auto, --batch-size 0 and --lr 0 become: the softmax, its batch and its rate
    // on GPUs (ranks of several kinds agree before, in the CLI); the logistic loss elsewhere,
    // whose batch doubles on large sets, its rate by sqrt(2).
    for (backend_kind kind : {backend_kind::cpu, backend_kind::cpu_dense, backend_kind::gpu}) {
        for (bool sharded : {false, true}) {
            for (uint64_t points : {uint64_t{0}, large_batch_points - 1, large_batch_points}) {
                train_config automatic;
                automatic.loss = output_loss::automatic;
                automatic.batch_size = 0;
                automatic.learning_rate = 0;
                automatic.reuse_candidates_epochs = -1;
                resolve_auto_training(automatic, kind, sharded, points);
                const bool logistic = kind != backend_kind::gpu;
                const bool large = logistic && points >= large_batch_points;
                EXPECT_EQ(automatic.loss, logistic ? output_loss::logistic : output_loss::softmax);
                EXPECT_EQ(automatic.batch_size, large ? 256u : 128u);
                // Candidates reused for an epoch of steps on one cpu process, on large layers.
                const bool reuses = kind == backend_kind::cpu && !sharded;
                EXPECT_EQ(automatic.reuse_candidates_epochs, reuses ? 1.0 : 0.0);
                EXPECT_EQ(automatic.reuse_candidates_steps,
                          reuses && points > 0
                              ? (points + automatic.batch_size - 1) / automatic.batch_size
                              : 0u);
                EXPECT_EQ(automatic.reuse_candidates_min_rows, reuse_candidates_auto_min_rows);
                const float rate = logistic ? logistic_learning_rate : softmax_learning_rate;
                EXPECT_FLOAT_EQ(automatic.learning_rate, large ? rate * std::sqrt(2.0f) : rate);
                // A batch given keeps the loss's rate; a rate given is kept.
                automatic = train_config{};
                automatic.loss = output_loss::automatic;
                automatic.batch_size = 512;
                automatic.learning_rate = 0;
                resolve_auto_training(automatic, kind, sharded, points);
                EXPECT_EQ(automatic.batch_size, 512u);
                EXPECT_EQ(automatic.learning_rate, rate);
                automatic.learning_rate = 0.01f;
                automatic.batch_size = 0;
                resolve_auto_training(automatic, kind, sharded, points);
                EXPECT_EQ(automatic.learning_rate, 0.01f);
                EXPECT_EQ(automatic.batch_size, large ? 256u : 128u);
                // Given epochs of reuse hold on a layer of any size.
                automatic.reuse_candidates_epochs = 2;
                resolve_auto_training(automatic, kind, sharded, points);
                EXPECT_EQ(automatic.reuse_candidates_min_rows, 0u);
                EXPECT_EQ(automatic.reuse_candidates_steps,
                          points > 0
                              ? (2 * points + automatic.batch_size - 1) / automatic.batch_size
                              : 0u);
            }
        }
    }
}

TEST(ShardTraining, DivergedReplicasAreCaught) {
    const model_config config = small_model(sparsity_mode::dense);
    const train_config tc = small_training();
    std::vector<std::string> messages(2);
    on_ranks(2, [&](shard_comm& comm) {
        const output_shard shard = make_output_shard(comm, config.output_dim(), "");
        model_state m =
            model_state::create_shard(config, 1, moment_storage::fp32, shard.first, shard.count);
        if (comm.rank() == 1) m.layers[0].weights[5] += 1e-6f;  // one bit of drift is enough
        cpu::cpu_backend engine(std::move(m), tc, 1, cpu::best_kernels(), precision_mode::fp32,
                                shard);
        try {
            engine.synchronize();
        } catch (const error& e) {
            messages[size_t(comm.rank())] = e.what();
        }
    });
    for (const std::string& m : messages)
        EXPECT_NE(m.find("replicated layers' checksum"), std::string::npos) << m;
}

// Ranks whose kernels round differently (one on the scalar kernels, one on this CPU's best: as
// ranks on CPUs of different instruction sets, or a CPU rank beside a GPU rank) would end an
// epoch with replicas a few roundings apart, which the check refuses; with replicas_differ
// rank 0's are copied to every rank at each epoch's end (weights, Adam state and weight
// average), so the check passes, and the model is one rank's up to those roundings.
TEST(ShardTraining, RanksThatRoundDifferentlyTakeRankZerosReplicasAtEachEpochsEnd) {
    if (cpu::best_kernels().level == isa_level::scalar)
        GTEST_SKIP() << "this CPU has no SIMD level: every rank rounds alike";
    const dataset train = random_dataset(600, 60, 97, 11, 7),
                  test = random_dataset(200, 60, 97, 12);
    const model_config config = small_model(sparsity_mode::topk);
    train_config tc = small_training();
    tc.ema_epochs = 0.5;
    const rank_result one = train_as_ranks(config, tc, train, test, 1).front();
    for (const bool replicas_differ : {true, false}) {
        std::vector<rank_result> results(2);
        std::vector<std::string> failures(2);
        on_ranks(2, [&](shard_comm& comm) {
            rank_result& out = results[size_t(comm.rank())];
            out.shard = make_output_shard(comm, config.output_dim(), "");
            cpu::cpu_backend engine(
                model_state::create_shard(config, tc.seed, tc.adam_moments, out.shard.first,
                                          out.shard.count),
                tc, 1, comm.rank() == 0 ? cpu::best_kernels() : cpu::kernels_for(isa_level::scalar),
                precision_mode::fp32, out.shard);
            trainer_options to = quiet_options(tc);
            to.ranks = &comm;
            to.replicas_differ = replicas_differ;
            try {
                trainer run(engine, train, &test, to);
                for (const epoch_record& r : run.run()) out.p_at_1 = r.metrics.p_at(1);
            } catch (const error& e) {
                failures[size_t(comm.rank())] = e.what();
                return;
            }
            engine.export_state(out.model, /*with_optimizer=*/true);
            out.checksum = replicated_layers_checksum(out.model.adam_step, out.model.layers.data(),
                                                      out.model.layers.size() - 1);
        });
        if (!replicas_differ) {  // the check catches the drift
            for (const std::string& f : failures)
                EXPECT_NE(f.find("replicated layers' checksum"), std::string::npos) << f;
            continue;
        }
        for (const std::string& f : failures) EXPECT_EQ(f, "");
        EXPECT_EQ(results[0].checksum, results[1].checksum);
        for (const rank_result& r : results) {
            EXPECT_NEAR(r.p_at_1, one.p_at_1, 0.02);
            const difference d = compare_layers(one.model.layers[0], 0, r.model.layers[0], false);
            EXPECT_LE(d.max_scaled, 1e-3) << "the first layer, against one rank's";
            EXPECT_GT(d.differing, 0u) << "the ranks' roundings did not differ: no test";
        }
    }
}

}  // namespace
}  // namespace hslide
