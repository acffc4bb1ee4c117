// `hslide eval` and `hslide predict`: load a checkpoint, score a data file (in one process, or
// under mpirun as ranks that each score a share of the output layer's rows).
#include "cli_common.hpp"

#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/error.hpp"
#include "hslide/metrics.hpp"
#include "hslide/output_file.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/progress.hpp"
#include "hslide/shard_checkpoint.hpp"
#include "hslide/shard_comm.hpp"
#include "hslide/trainer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <omp.h>

#include <cstdio>
#include <numeric>
#include <optional>
#include <sstream>

namespace hslide::cli {

namespace {

/// The options eval and predict share: the model, how and where it scores (the table's
/// entries, their settings in a train_settings).
struct scoring_options {
    std::string model_path;
    train_settings settings;
};

void add_scoring_options(CLI::App& app, scoring_options& o, std::vector<std::string> table_names) {
    app.add_option("--model", o.model_path,
                   "checkpoint written by `hslide train --save` (or a sharded one's manifest)")
        ->required();
    o.settings.model.probes.clear();  // the model's own unless given
    for (const char* name : {"scoring", "threads", "backend", "isa", "precision", "gpu",
                             "gpu-async-rebuild", "probes", "quiet", "no-progress", "log-level"})
        table_names.push_back(name);
    add_table_options(app, o.settings, table_names);
    app.get_option("--scoring")
        ->description(
            "exact (every label), lsh (the LSH active set only), ivf (a top-k layer's IVF index: "
            "the rows of the --ivf-probes best clusters; CPU), or auto (the output layer's own "
            "index: lsh for LSH layers, ivf for top-k layers searched by IVF, else exact)");
    app.get_option("--probes")->default_str("the model's");
    // Any kind that is made alone (a hybrid trains; a checkpoint is scored on one device).
    restrict_backends(app, [](const backend_entry& e) { return e.create != nullptr; });
}

/// The checkpoint's model on the --backend, checked against the data's dimensions (its labels
/// only where `labels_scored`: eval's, not predict's);
/// scales `data` as the model's training inputs were and rewrites its labels into the model's
/// row ids (label_map.hpp). Under mpirun -np N (N > 1, `comm`) each
/// rank holds and scores a share of the output layer's rows and the ranks merge their top k
/// (cpu_backend's sharded prediction); in one process a sharded checkpoint is assembled whole
/// (load_for_scoring, shard_checkpoint.hpp).
std::unique_ptr<backend> open_backend(const scoring_options& o, dataset& data,
                                      checkpoint_contents& ck, shard_comm& comm,
                                      bool labels_scored) {
    const bool ranks = comm.size() > 1;
    output_shard shard;
    ck = load_for_scoring(comm, o.model_path, shard);
    if (is_shard_manifest(o.model_path) && !ranks)
        spdlog::info("{}: a checkpoint sharded across MPI ranks, assembled whole", o.model_path);
    HSLIDE_CHECK(data.n_features <= ck.model.config.input_dim,
                 "{} has {} features but the model {} takes {}", data.source, data.n_features,
                 o.model_path, ck.model.config.input_dim);
    // A model with rows for some labels only (label_map.hpp) scores any label id: those it
    // has no row for count as true labels it never predicts.
    // (predict reads no labels: a file's labels beyond the model's are no concern of its.)
    HSLIDE_CHECK(
        !labels_scored || !ck.rows.identity() || data.n_labels <= ck.model.config.output_dim(),
        "{} has {} labels but the model {} has {}", data.source, data.n_labels, o.model_path,
        ck.model.config.output_dim());
    labels_to_rows(data, ck.rows);
    const train_settings& s = o.settings;
    if (check_thread_count(s.train.threads, "--threads") > 0) omp_set_num_threads(s.train.threads);
    backend_options bo;
    bo.kind = parse_backend_kind(s.backend);
    bo.threads = s.train.threads;
    bo.shard = shard;
    apply_compute_options(s.compute, bo);
    if (ranks) {
        // Every rank must score the same points: one that read another file would wait in
        // another collective.
        comm.check_same(data.size(), "the number of points");
        comm.check_same(data.n_features * 0x9e3779b97f4a7c15ull ^ data.n_labels,
                        "the data's feature and label counts");
        bo.device = check_rank_backend(comm, bo.kind, s.compute).gpu;
        std::string shares;
        for (int r = 0; r < comm.size(); ++r)
            shares += fmt::format("{}[{}, {})", r ? " " : "", shard.bounds[size_t(r)],
                                  shard.bounds[size_t(r) + 1]);
        spdlog::info("{} ranks ({}): output rows per rank {}", comm.size(), comm.name(), shares);
    }
    if (!s.model.probes.empty()) set_probes(ck.model.config, s.model.probes);
    train_config scoring_only;
    scoring_only.adam = adam_mode::sparse;  // no training: every backend takes its Adam mode
    check_supported(bo.kind, ck.model.config, scoring_only, bo.precision, parse_scoring(s.scoring));
    train_config tc;
    normalize_inputs(data, ck.model.config);
    return create_backend(bo, std::move(ck.model), tc);
}

/// Under several MPI ranks, whether this rank is the one that prints and writes (rank 0); the
/// others stay quiet (warnings and errors only) and draw no progress.
bool speaks(shard_comm& comm, bool& show_progress) {
    if (comm.rank() == 0) return true;
    show_progress = false;
    if (spdlog::get_level() < spdlog::level::warn) spdlog::set_level(spdlog::level::warn);
    return false;
}

}  // namespace

int run_eval(int argc, char** argv) {
    CLI::App app{"Evaluate a saved model: P@k, nDCG@k and PSP@k (k = 1..5).", "hslide eval"};
    add_config_option(app);
    scoring_options so;
    add_scoring_options(app, so,
                        {"test", "test-split", "split-column", "format", "no-cache", "verify-cache",
                         "eval-max", "propensity-a", "propensity-b", "metrics-out"});
    app.get_option("--test")->description("data file to evaluate on");
    app.get_option("--metrics-out")
        ->description("append the result as one JSON record to this file");
    if (const auto exit_code = parse_command_line(app, argc, argv)) return *exit_code;
    data_options& data = so.settings.data;
    evaluation_options eo = so.settings.trainer.eval;
    eo.show_progress = apply_output_options(so.settings.output);
    // Under mpirun -np N, every rank scores its rows; rank 0 prints and writes --metrics-out.
    shard_comm& comm = world_comm();
    const bool rank0 = speaks(comm, eo.show_progress);
    const std::string metrics_out = rank0 ? so.settings.trainer.metrics_out : std::string();
    data.show_progress = eo.show_progress;
    eo.scoring = parse_scoring(so.settings.scoring);
    validate(eo.metrics);
    HSLIDE_CHECK(!data.test.empty(), "hslide eval needs --test FILE");
    check_outputs_apart({{"--model", so.model_path},
                         {"--test", data.test},
                         {"--test-split", data.test_split},
                         {"--config", config_path(app)}},
                        {{"--metrics-out", so.settings.trainer.metrics_out}});
    dataset file = load_file(data, data.test);
    dataset test = data.test_split.empty()
                       ? std::move(file)
                       : subset(file, read_split(data.test_split, data.split_column, file.size()));
    HSLIDE_CHECK(test.size() > 0, "{}{}: no points to evaluate", data.test,
                 data.test_split.empty() ? "" : " (" + data.test_split + ")");
    checkpoint_contents ck;
    auto engine = open_backend(so, test, ck, comm, /*labels_scored=*/true);
    const std::vector<double> inv_prop = saved_inverse_propensities(
        std::move(ck.label_counts), ck.train_points, test.n_labels, !ck.rows.identity(),
        eo.metrics.propensity_a, eo.metrics.propensity_b);
    const metrics_result r = evaluate(*engine, test, eo, inv_prop);
    if (!rank0) return 0;
    std::printf("%s  (%zu points)\n", format_metrics(r).c_str(), r.n);
    if (!metrics_out.empty()) {
        std::ostringstream out;
        out << "{\"model\":\"" << so.model_path << "\",\"points\":" << r.n;
        for (int k = 1; k <= int(r.precision.size()); ++k) {
            out << fmt::format(",\"p@{}\":{},\"ndcg@{}\":{}", k, r.p_at(k), k, r.ndcg_at(k));
            if (!r.psp.empty()) out << fmt::format(",\"psp@{}\":{}", k, r.psp_at(k));
        }
        out << "}\n";
        append_to_file(metrics_out, out.str());
    }
    return 0;
}

int run_predict(int argc, char** argv) {
    CLI::App app{
        "Write the top-k labels of every point: one line per point, `label:score ...` best first.",
        "hslide predict"};
    add_config_option(app);
    scoring_options so;
    add_scoring_options(app, so, {"format", "no-cache", "verify-cache"});
    app.get_option("--no-cache")->description("do not use the binary cache");
    std::string input, out_path;
    uint32_t labels_per_point = 5;
    app.add_option("--data", input, "data file to predict for (XC or LibSVM; labels are ignored)")
        ->required();
    app.add_option("--labels-per-point", labels_per_point, "labels written per point, best first")
        ->check(number_of_type<uint32_t>())
        ->check(meets({option_check::kind::positive}))
        ->capture_default_str();
    // The old spelling, easily read as train's --top-k (the selection): hidden, still taken.
    uint32_t deprecated_topk = 0;
    CLI::Option* topk_alias =
        app.add_option("--topk", deprecated_topk, "deprecated: --labels-per-point")
            ->check(number_of_type<uint32_t>())
            ->check(meets({option_check::kind::positive}))
            ->group("");
    app.add_option("--out", out_path, "output file")->required()->check(not_empty());
    if (const auto exit_code = parse_command_line(app, argc, argv)) return *exit_code;
    data_options& data = so.settings.data;
    bool show_progress = apply_output_options(so.settings.output);
    // Under mpirun -np N, every rank scores its rows of each point; rank 0 writes --out.
    shard_comm& comm = world_comm();
    const bool rank0 = speaks(comm, show_progress);
    data.show_progress = show_progress;
    if (topk_alias->count() > 0) {
        HSLIDE_CHECK(app.get_option("--labels-per-point")->count() == 0,
                     "give --labels-per-point, not also its deprecated spelling --topk");
        spdlog::warn(
            "--topk is deprecated (it reads like train's --top-k): use "
            "--labels-per-point");
        labels_per_point = deprecated_topk;
    }
    const uint32_t topk = labels_per_point;
    check_outputs_apart(
        {{"--model", so.model_path}, {"--data", input}, {"--config", config_path(app)}},
        {{"--out", out_path}});
    dataset points = load_file(data, input);
    checkpoint_contents ck;
    auto engine = open_backend(so, points, ck, comm, /*labels_scored=*/false);
    const scoring_mode scoring = parse_scoring(so.settings.scoring);

    std::optional<output_file> out;
    if (rank0) out.emplace(out_path);
    const uint32_t batch = 1024;
    std::vector<uint32_t> rows, labels;
    std::vector<float> scores;
    progress bar("predict", points.size(), "points", show_progress);
    fmt::memory_buffer line;
    for (size_t begin = 0; begin < points.size(); begin += batch) {
        const uint32_t size = uint32_t(std::min<size_t>(batch, points.size() - begin));
        rows.resize(size);
        std::iota(rows.begin(), rows.end(), uint32_t(begin));
        labels.resize(size_t(size) * topk);
        scores.resize(size_t(size) * topk);
        engine->predict({&points, rows.data(), size}, topk, scoring, labels.data(), scores.data());
        if (!rank0) continue;  // the same labels: rank 0 writes them
        for (uint32_t s = 0; s < size; ++s) {
            line.clear();
            for (uint32_t i = 0; i < topk; ++i) {
                const uint32_t row = labels[size_t(s) * topk + i];
                if (row == UINT32_MAX) break;
                const uint32_t label = ck.rows.label_of_row(row);
                fmt::format_to(std::back_inserter(line), "{}{}:{:.6g}", i ? " " : "", label,
                               scores[size_t(s) * topk + i]);
            }
            line.push_back('\n');
            out->write(line.data(), line.size());
        }
        bar.add(size);
    }
    bar.finish();
    if (!rank0) return 0;
    out->commit();
    spdlog::info("wrote the top {} labels of {} points to {}", topk, points.size(), out_path);
    return 0;
}

}  // namespace hslide::cli
