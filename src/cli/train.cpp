// `hslide train`: flags (or a --config file mirroring them) -> data -> backend -> trainer.
#include "cli_common.hpp"

#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/checkpoint.hpp"
#include "hslide/error.hpp"
#include "hslide/fill_pool.hpp"
#include "hslide/gpu_devices.hpp"
#include "hslide/hybrid.hpp"
#include "hslide/input_check.hpp"
#include "hslide/label_map.hpp"
#include "hslide/model.hpp"
#include "hslide/output_plan.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/progress.hpp"
#include "hslide/shard_checkpoint.hpp"
#include "hslide/shard_comm.hpp"
#include "hslide/system_info.hpp"
#include "hslide/trainer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace hslide::cli {

namespace {

/// One line of a hybrid worker's statistics, for an epoch or (`whole_run`) the whole run.
void print_worker(const worker_stats& w, bool whole_run) {
    std::printf(
        "    %-5s %8llu samples  %6llu batches (%.0f%% of updates)  batch %u..%u (mean %.0f",
        w.name.c_str(), (unsigned long long)w.samples, (unsigned long long)w.batches,
        100 * w.update_share, w.batch_min, w.batch_max, w.batch_mean);
    if (!whole_run) std::printf(", now %u", w.batch_last);
    std::printf(
        ")  busy %.0f%%  %llu merges %.1f s  staleness %.1f (max %llu)  rows/merge %.0f out "
        "%.0f in",
        100 * w.utilisation(), (unsigned long long)w.merges, w.merge_seconds, w.staleness_mean,
        (unsigned long long)w.staleness_max,
        w.merges ? double(w.rows_merged) / double(w.merges) : 0.0,
        w.merges ? double(w.rows_pulled) / double(w.merges) : 0.0);
    if (w.parked_seconds > 0)
        std::printf("  parked %.0f%%",
                    w.wall_seconds > 0 ? 100 * w.parked_seconds / w.wall_seconds : 0.0);
    std::printf("\n");
}

/// The output layer's rows for `train`'s labels under `rows`.
uint32_t output_rows(const dataset& train, const label_map& rows) {
    return uint32_t(rows.identity() ? train.n_labels : rows.labels.size());
}

}  // namespace

int run_train(int argc, char** argv) {
    CLI::App app{"Train a model. With no --train, trains on the built-in synthetic data.",
                 "hslide train"};
    // --help's first group is the essentials: --help and --config join it.
    app.get_help_ptr()->group(title(option_group::essentials));
    add_config_option(app,
                      "TOML-style config file whose keys mirror these flags (flags override it)");
    app.get_config_ptr()->group(title(option_group::essentials));
    train_settings settings;
    const std::vector<CLI::Option*> options = add_table_options(app, settings);
    const std::vector<CLI::Option*> network_flags = model_flags(options);
    restrict_backends(app, [](const backend_entry&) { return true; });
    add_hybrid_worker_help(app);
    bool print_config = false;
    app.add_flag("--print-config", print_config, "print the effective configuration and exit")
        ->configurable(false)
        ->group(title(option_group::diagnostics));
    if (const auto exit_code = parse_command_line(app, argc, argv, /*train_table=*/true))
        return *exit_code;
    if (print_config) {
        // Unset paths print as `key=""`, which would read back as a path named "": leave them out.
        std::istringstream all(app.config_to_str(true, false));
        for (std::string line; std::getline(all, line);)
            if (line.size() < 3 || line.compare(line.size() - 3, 3, "=\"\"") != 0)
                std::cout << line << '\n';
        return 0;
    }
    data_options& data = settings.data;
    model_options& mopt = settings.model;
    train_config& tc = settings.train;
    trainer_options& to = settings.trainer;
    compute_options& compute = settings.compute;
    const std::string& backend_name = settings.backend;
    const std::string &valid_path = settings.valid, &valid_split = settings.valid_split,
                      &keep_best = settings.keep_best, &resume_path = settings.resume;
    const double valid_fraction = settings.valid_fraction;
    bool show_progress = apply_output_options(settings.output);
    // Under mpirun -np N (N > 1) this process is one rank of a label-sharded run
    // (hslide/shard_comm.hpp): rank 0 alone prints progress, epochs and --metrics-out.
    shard_comm& comm = world_comm();
    const bool sharded = comm.size() > 1;
    const bool speaks = comm.rank() == 0;
    if (!speaks) {
        show_progress = false;
        if (spdlog::get_level() < spdlog::level::warn) spdlog::set_level(spdlog::level::warn);
        to.metrics_out.clear();
    }
    data.show_progress = show_progress;
    settings.apply_names();
    to.eval.show_progress = show_progress;
    to.show_progress = show_progress;
    // The command saves only through --save: after the run the kept model's weights are
    // evaluated and the process ends, so its Adam state need not be kept beside them.
    to.optimizer_after_run = false;
    const backend_kind kind = parse_backend_kind(backend_name);
    validate_before_data(tc, kind, sharded);  // resolved after the split (the batch follows it)
    validate(to.eval.metrics);

    if (tc.threads > 0) omp_set_num_threads(tc.threads);
    if (sharded) {
        const rank_backend rb = check_rank_backend(comm, kind, compute);
        compute.gpu = rb.gpu;
        to.replicas_differ = rb.replicas_differ;
        spdlog::info("{} ranks ({}): the output layer's rows are split across them", comm.size(),
                     comm.name());
        if (!resume_path.empty() && !settings.shard_weights.empty())
            spdlog::warn("--shard-weights {}: ignored with --resume (the checkpoint's split)",
                         settings.shard_weights);
    } else if (!settings.shard_weights.empty()) {
        spdlog::warn(
            "--shard-weights {}: ignored in a run of one process (launch with mpirun "
            "-np N, N > 1)",
            settings.shard_weights);
    }

    // --save may be the --resume file: a run saves where it resumed from (atomically).
    const std::vector<named_path> inputs = {
        {"--train", data.train},           {"--test", data.test},
        {"--valid", valid_path},           {"--train-split", data.train_split},
        {"--test-split", data.test_split}, {"--valid-split", valid_split},
        {"--config", config_path(app)}};
    check_outputs_apart(inputs, {{"--save", to.save_path}, {"--metrics-out", to.metrics_out}});
    check_outputs_apart({{"--resume", resume_path}}, {{"--metrics-out", to.metrics_out}});
    HSLIDE_CHECK(
        int(!valid_path.empty()) + int(!valid_split.empty()) + int(valid_fraction > 0) <= 1,
        "give one of --valid, --valid-split and --valid-fraction");
    HSLIDE_CHECK(valid_split.empty() || !data.train.empty(), "--valid-split needs --train");
    loaded_data d = load_data(data);
    dataset valid;
    if (!valid_path.empty()) {
        valid = load_file(data, valid_path);
    } else if (!valid_split.empty()) {
        const dataset file = load_file(data, data.train);
        const std::vector<uint32_t> valid_rows =
            read_split(valid_split, data.split_column, file.size());
        if (!data.train_split.empty())
            warn_shared_rows("--train-split " + data.train_split, d.train_rows,
                             "--valid-split " + valid_split, valid_rows,
                             "the validation scores points the model trains on");
        valid = subset(file, valid_rows);
    } else if (valid_fraction > 0 || tc.epochs_auto) {
        // --epochs auto with no validation set of the user's: a small seeded hold-out.
        auto parts = valid_fraction > 0 ? hold_out(d.train, valid_fraction, tc.seed)
                                        : hold_out_for_auto_epochs(d.train, tc.seed);
        d.train = std::move(parts.first);
        valid = std::move(parts.second);
        spdlog::info("holding out {} of {} training points for validation{}", valid.size(),
                     valid.size() + d.train.size(),
                     valid_fraction > 0 ? "" : " (--epochs auto; --epochs N uses them all)");
    }
    // Under auto the test set is scored once, for the kept model, unless asked otherwise: the
    // epochs are chosen on the validation set, and each test evaluation costs time.
    if (tc.epochs_auto && app.get_option("--eval-every")->count() == 0) to.eval_every = 0;
    HSLIDE_CHECK(valid.size() > 0 || (keep_best.empty() && to.validation.patience == 0),
                 "--keep-best and --patience need a validation set: --valid, --valid-split or "
                 "--valid-fraction");
    if (valid.size() > 0) {
        // One size for every set (files without a header know only the largest id they saw).
        const uint64_t n_features = std::max(d.train.n_features, valid.n_features);
        const uint64_t n_labels = std::max(d.train.n_labels, valid.n_labels);
        d.train.n_features = d.test.n_features = valid.n_features = n_features;
        d.train.n_labels = d.test.n_labels = valid.n_labels = n_labels;
    }
    check_model_dimensions(d.train);
    const bool automatic_batch = tc.batch_size == 0;
    if (sharded) {
        // MPMD ranks may run kinds that differ: auto is the logistic loss where it is every
        // rank's backend's default. A collective every rank takes, whatever its --loss (a rank
        // given another is named by the check of --loss below).
        float lacks_logistic = backend_entry_of(kind).caps.logistic_loss_by_default ? 0.0f : 1.0f;
        comm.all_reduce_max(&lacks_logistic, 1);
        if (tc.loss == output_loss::automatic)
            tc.loss = lacks_logistic == 0.0f ? output_loss::logistic : output_loss::softmax;
    }
    resolve_auto_training(tc, kind, sharded, d.train.size());
    validate(tc);
    mopt.batch_size = tc.batch_size;  // the automatic output layer's sets follow the batch
    // The output layer's rows (label_map.hpp): one for each label the training points carry
    // under --label-rows carried; a checkpoint's own when resuming.
    label_map rows = output_label_rows(d.train, mopt.label_rows);
    // Every rank must train on the same data with the same settings: a rank that read another
    // file would train another model without a word.
    comm.check_same(d.train.size(), "the number of training points");
    comm.check_same(d.test.size(), "the number of test points");
    comm.check_same(d.train.n_features * 0x9e3779b97f4a7c15ull ^ d.train.n_labels,
                    "the data's feature and label counts");
    comm.check_same(tc.seed, "--seed");
    comm.check_same(uint64_t(tc.loss), "--loss");
    comm.check_same(tc.batch_size, "--batch-size");
    comm.check_same(uint64_t(tc.epochs) * 2 + uint64_t(tc.epochs_auto), "--epochs");
    output_shard shard;

    model_state initial;
    candidate_cache resumed_candidates;  // the checkpoint's reused candidates
    std::string output_choice;           // what an automatic output layer became, and why
    HSLIDE_CHECK(sharded || resume_path.empty() || !is_shard_manifest(resume_path),
                 "--resume {}: a checkpoint sharded across MPI ranks; resume it under mpirun with "
                 "as many ranks",
                 resume_path);
    if (!resume_path.empty()) {
        // A sharded run resumes its rank's file of the checkpoint, and the split it was saved
        // with (shard_checkpoint.hpp).
        checkpoint_contents ck = sharded ? load_shard_checkpoint(comm, resume_path, shard)
                                         : load_checkpoint(resume_path);
        rows = std::move(ck.rows);
        labels_to_rows(d.train, rows);
        const uint32_t* top = std::max_element(d.train.label_ids.data(),
                                               d.train.label_ids.data() + d.train.label_ids.size());
        HSLIDE_CHECK(ck.model.config.input_dim >= d.train.n_features &&
                         (top == d.train.label_ids.data() + d.train.label_ids.size() ||
                          *top < ck.model.config.output_dim()),
                     "{}: the checkpoint's model ({} features, rows for {} labels) does not fit "
                     "the data ({} features, {} labels{})",
                     resume_path, ck.model.config.input_dim, ck.model.config.output_dim(),
                     d.train.n_features, d.train.n_labels,
                     rows.identity() ? "" : ", some of which it has no row for");
        initial = std::move(ck.model);
        to.resume = ck.trainer;
        to.resume_training_weights = std::move(ck.training_weights);
        resumed_candidates = std::move(ck.candidates);
        check_resume_epochs(tc, ck.trainer, resume_path);
        // A resumed run goes on with the saved one (its shuffles, its schedule, its counts of
        // the labels): on other data it would be neither that run nor a new one.
        HSLIDE_CHECK(ck.train_points == 0 || ck.train_points == d.train.size(),
                     "{}: the checkpoint's run trained on {} points and this data has {}{}: "
                     "--resume goes on with the run it saved, on the same data and flags",
                     resume_path, ck.train_points, d.train.size(),
                     valid.size() > 0 ? " after its hold-out" : "");
        spdlog::info("resuming from {}", resume_path);
        // The checkpoint fixes the network; --probes only steers its evaluation, so it applies.
        std::string ignored;
        for (const CLI::Option* flag : network_flags) {
            if (flag->count() == 0) continue;
            if (flag->get_name() == "--probes")
                set_probes(initial.config, mopt.probes);
            else
                ignored += (ignored.empty() ? "" : ", ") + flag->get_name();
        }
        if (!ignored.empty())
            spdlog::warn("--resume: the checkpoint's model is used; ignoring {}", ignored);
    } else if (sharded) {
        // Each rank creates only its rows of the output layer, as the whole layer draws them.
        const model_config config = make_model_config(mopt, uint32_t(d.train.n_features),
                                                      output_rows(d.train, rows), &output_choice);
        // Every rank must split alike: auto is a collective all of them take, and the bounds
        // computed are compared (a rank given other --shard-weights would train other rows).
        const bool automatic = is_auto_shard_weights(settings.shard_weights);
        comm.check_same(automatic, "--shard-weights auto");
        std::vector<uint32_t> bounds;
        if (automatic) {
            // The model's own count of its bytes (model_allocation_bytes: weights and biases
            // with Adam's two moments): the output layer's a row, plus the bf16 copy the exact
            // search keeps on AMX; the rest is the layers every rank holds whole.
            const model_state shape = model_state::layout(config);
            const layer_state& out = shape.layers.back();
            const double fp32_row = 3.0 * sizeof(float) * (double(out.stride) + 1);
            const double bytes_per_row = fp32_row + 2.0 * (std::ceil(out.width / 32.0) * 32);
            const double replicated =
                double(model_allocation_bytes(shape, true)) - fp32_row * double(out.rows);
            backend_options probe;
            probe.kind = kind;
            probe.threads = tc.threads;
            apply_compute_options(compute, probe);
            // A GPU rank's rows live in its GPU's memory, which the ranks on that GPU divide.
            memory_pool pool = host_memory_pool();
            if (kind == backend_kind::gpu)
                pool = {fmt::format("{} GPU {}", pool.name, probe.device),
                        double(gpu_free_memory(probe.device))};
            bounds = auto_shard_bounds(comm, config.output_dim(), bytes_per_row, replicated,
                                       measure_scoring_rate(probe, out.width), &pool);
        } else {
            bounds = shard_bounds(config.output_dim(), comm.size(),
                                  parse_shard_weights(settings.shard_weights, comm.size()));
        }
        comm.check_same(XXH3_64bits(bounds.data(), bounds.size() * sizeof bounds[0]),
                        "--shard-weights (a hash of the rows each rank holds)");
        shard = make_output_shard(comm, std::move(bounds));
        initial =
            model_state::create_shard(config, tc.seed, tc.adam_moments, shard.first, shard.count);
    } else {
        const model_config config = make_model_config(mopt, uint32_t(d.train.n_features),
                                                      output_rows(d.train, rows), &output_choice);
        check_training_memory(config, tc, d.train.size(), tc.epochs_auto || !keep_best.empty());
        initial = model_state::create(config, tc.seed, tc.adam_moments);
    }
    // A new model under the logistic loss (a rank's shard too) starts at the labels' prior.
    if (resume_path.empty() && tc.loss == output_loss::logistic)
        start_at_label_prior(initial, d.train);
    // Every set in row ids from here on (a resumed run's training set already is).
    if (resume_path.empty()) labels_to_rows(d.train, rows);
    labels_to_rows(d.test, rows);
    labels_to_rows(valid, rows);
    if (!rows.identity())
        spdlog::info(
            "output rows: {} of the {} labels, those the {} training points carry "
            "(--label-rows all: a row for every label)",
            rows.labels.size(), d.train.n_labels, d.train.size());
    const model_config& mc = initial.config;
    normalize_inputs(d.train, mc);
    normalize_inputs(d.test, mc);
    normalize_inputs(valid, mc);
    // What `auto` chose is said here: the search each top-k layer runs on this backend.
    // A rank weighs the search over its own shard of the output layer (rank 0's is said).
    auto top_k_description = [&tc, kind, &shard, sharded](const layer_config& c) {
        std::string text = " (top-k";
        const std::string ivf =
            fmt::format("IVF: {} probes, refresh every {} steps", c.ivf_probes, c.ivf_refresh);
        const uint32_t searched_rows = sharded && c.size == shard.total ? shard.count : c.size;
        const uint32_t clusters = ivf_shard_cluster_count(c.ivf_clusters, c.size, searched_rows);
        const char* in_bf16 = active_isa() >= isa_level::amx           ? " in AMX tiles"
                              : cpu_exact_search_in_int8(active_isa()) ? " in int8 products"
                              : cpu_exact_search_in_bf16(active_isa()) ? " in bf16 products"
                                                                       : "";
        const std::string cpu_search =
            cpu_top_k_search(c, active_isa(), searched_rows) == top_k_search::ivf
                ? ivf
                : fmt::format("exact{}: an index would probe {} of its {} clusters", in_bf16,
                              std::min(c.ivf_probes, clusters), clusters);
        if (c.search == top_k_search::ivf)
            text += ", " + ivf;
        else if (c.search == top_k_search::automatic)
            text += kind == backend_kind::gpu      ? std::string("; exact on a GPU")
                    : kind == backend_kind::hybrid ? "; " + cpu_search + " on a CPU, exact on a GPU"
                                                   : "; " + cpu_search;
        const uint32_t pool = fill_pool_size(c.fill_pool, c.size,
                                             std::min(c.active.min_active, c.size), tc.batch_size);
        if (pool) text += fmt::format("; fill from a pool of {} rows a step", pool);
        return text + ")";
    };
    std::string shape = std::to_string(mc.input_dim);
    for (size_t l = 0; l < mc.layers.size(); ++l)
        shape += fmt::format(" -> {}{}", mc.layers[l].size,
                             backend_entry_of(kind).caps.computes_every_neuron ? std::string()
                             : mc.uses_lsh(l) ? std::string(" (LSH)")
                             : mc.selection(l) == neuron_selection::top_k
                                 ? top_k_description(mc.layers[l])
                                 : std::string());
    if (sharded) {
        std::string shares;
        for (int r = 0; r < comm.size(); ++r)
            shares += fmt::format("{}[{}, {})", r ? " " : "", shard.bounds[size_t(r)],
                                  shard.bounds[size_t(r) + 1]);
        spdlog::info(
            "model: {}; output rows per rank {}; rank {} holds {:.1f} M parameters, {} "
            "with optimizer state",
            shape, shares, comm.rank(), initial.parameter_count() / 1e6,
            human_bytes(double(initial.memory_bytes())));
    } else {
        spdlog::info("model: {} ({:.1f} M parameters, {} with optimizer state)", shape,
                     initial.parameter_count() / 1e6, human_bytes(double(initial.memory_bytes())));
    }
    if (resume_path.empty() && std::count(mopt.hidden.begin(), mopt.hidden.end(), 0u) > 0)
        spdlog::info(
            "hidden width: auto: {} ({} input features, {} output rows: {} up to {} features "
            "and {} rows, else {})",
            automatic_hidden_width(mc.input_dim, mc.output_dim()), mc.input_dim, mc.output_dim(),
            wide_hidden_width, wide_hidden_max_features, wide_hidden_max_rows, narrow_hidden_width);
    if (!output_choice.empty()) spdlog::info("output layer: {}", output_choice);
    for (size_t l = 0; l < mc.layers.size(); ++l)
        if (mc.uses_lsh(l))
            spdlog::info(
                "layer {} LSH: {} K={} L={} bits={} capacity={} {}, active min {} max {} threshold "
                "{}",
                l, to_string(mc.layers[l].lsh.kind), mc.layers[l].lsh.K, mc.layers[l].lsh.L,
                mc.layers[l].lsh.bits_per_hash, mc.layers[l].lsh.bucket_capacity,
                to_string(mc.layers[l].lsh.policy), mc.layers[l].active.min_active,
                mc.layers[l].active.max_active, mc.layers[l].active.hit_threshold);

    // Before the model moves into the backend (mc refers to it).
    const bool every_neuron = backend_entry_of(kind).caps.computes_every_neuron;
    if (every_neuron)
        for (size_t l = 0; l < mc.layers.size(); ++l)
            if (mc.has_active_sets(l))
                spdlog::info(
                    "{} computes every neuron: layer {}'s {} selection is kept in the model but "
                    "not used",
                    backend_name, l, to_string(mc.selection(l)));
    // An LSH output layer whose active sets hold a large share of it saves little: say why
    // after the first epoch (the settings are read here, before the model moves).
    const size_t out_layer = mc.layers.size() - 1;
    const bool sparse_output = mc.uses_lsh(out_layer) && !every_neuron;
    const uint32_t out_dim = mc.output_dim();
    const std::string dense_active_hint =
        fmt::format("the union of L = {} buckets of up to {} neurons, filled to --min-active {}",
                    mc.layers[out_layer].lsh.L, mc.layers[out_layer].lsh.bucket_capacity,
                    mc.layers[out_layer].active.min_active);
    bool dense_active_warned = false;
    // What a backend does not support (the GPU's one hidden layer, its Adam modes, multi-probe
    // or IVF scoring: the capability table) is refused before training, not at the first
    // evaluation.
    const scoring_mode eval_scoring = d.test.size() > 0 ? to.eval.scoring : scoring_mode::exact;
    backend_options bo;
    bo.kind = kind;
    bo.threads = tc.threads;
    bo.shard = shard;
    if (sharded) to.ranks = &comm;  // every rank's memory and traffic in rank 0's records
    if (sharded && !to.save_path.empty()) {
        // Each rank saves its own file; then rank 0 the manifest at --save's path.
        const std::string manifest = to.save_path;
        to.save_path = shard_checkpoint_path(manifest, comm.rank(), comm.size());
        to.after_checkpoint = [&comm, &shard, manifest] {
            write_shard_manifest(comm, manifest, shard);
        };
    }
    apply_compute_options(compute, bo);
    std::unique_ptr<backend> engine;
    if (kind == backend_kind::hybrid) {
        const hybrid_options ho = make_hybrid_options(settings.hybrid, bo, tc);
        for (const hybrid_worker_options& w : ho.workers)
            check_supported(w.device.kind, mc, tc, bo.precision, eval_scoring);
        engine = create_hybrid_backend(ho, initial, tc);
        initial = model_state{};  // the workers hold their copies
    } else {
        check_supported(kind, mc, tc, bo.precision, eval_scoring);
        engine = create_backend(bo, std::move(initial), tc);
    }
    engine->import_candidates(resumed_candidates);
    resumed_candidates = candidate_cache{};  // the backend holds its copy
    const backend_info bi = engine->info();
    spdlog::info("backend: {} on {}, {}, {} loss, batch {}{} at lr {:g}", bi.kind, bi.device,
                 bi.precision, to_string(tc.loss), tc.batch_size,
                 automatic_batch ? fmt::format(" (auto: {} training points)", d.train.size()) : "",
                 tc.learning_rate);

    if (!engine->candidates().empty())
        spdlog::info(
            "top-k candidates: each point's reused while its last search is under {:g} "
            "epoch{} ({} step{}) old (--reuse-candidates)",
            tc.reuse_candidates_epochs, tc.reuse_candidates_epochs == 1 ? "" : "s",
            tc.reuse_candidates_steps, tc.reuse_candidates_steps == 1 ? "" : "s");

    to.train = tc;
    if (valid.size() > 0) to.validation.valid = &valid;
    to.rows = rows;
    trainer run(*engine, d.train, d.test.size() ? &d.test : nullptr, to);
    // "P@1 0.5100", and the metric that chooses the best epoch when it is another.
    auto valid_summary = [&run](const epoch_record& r) {
        const selection_metric& metric = run.options().validation.metric;
        std::string text = fmt::format("P@1 {:.4f}", r.valid_metrics.p_at(1));
        if (to_string(metric) != "p@1")
            text +=
                fmt::format(" {} {:.4f}", to_string(metric), metric_value(r.valid_metrics, metric));
        return text;
    };
    const auto records = run.run([&](const epoch_record& r) {
        if (!speaks) return;
        std::string line = fmt::format(
            "epoch {:>3}/{}  {:7.1f} s  {:9.0f} samples/s  loss {:.4f}  active {:.0f}", r.epoch,
            epochs_to_string(tc), r.epoch_seconds, r.samples_per_s, r.loss, r.mean_active_output);
        if (r.dropped_mass) line += fmt::format("  dropped {:.4f}", *r.dropped_mass);
        if (r.touched_share) line += fmt::format("  rows {:.1f}%", 100 * *r.touched_share);
        if (r.selection)
            line += fmt::format("  recall@{} {:.3f} labels {:.3f} set {:.0f}", r.selection->top,
                                r.selection->top_recall, r.selection->label_recall,
                                r.selection->mean_set_size);
        if (r.evaluated)
            line += fmt::format("  P@1 {:.4f} P@3 {:.4f} P@5 {:.4f}", r.metrics.p_at(1),
                                r.metrics.p_at(3), r.metrics.p_at(5));
        if (r.validated)
            line += "  valid " + valid_summary(r) + fmt::format(" (best: epoch {})", r.best_epoch);
        std::printf("%s\n", line.c_str());
        if (sparse_output && !dense_active_warned && r.mean_active_output > 0.05 * out_dim) {
            dense_active_warned = true;
            std::fflush(stdout);  // after the epoch's line in a log of both streams
            spdlog::warn(
                "layer {}'s active sets average {:.0f} neurons, {:.1f}% of its {}: LSH saves "
                "little at that density ({}); a smaller --bucket-capacity, more --bits or --K "
                "(smaller buckets), --max-active or a smaller --min-active keeps it sparse",
                out_layer, r.mean_active_output, 100.0 * r.mean_active_output / out_dim, out_dim,
                dense_active_hint);
        }
        for (const worker_stats& w : r.workers) print_worker(w, /*whole_run=*/false);
        std::fflush(stdout);
    });
    if (!speaks) {
        // Rank 0 alone prints the run's end.
    } else if (const auto& kept = run.final_record()) {
        // keep_best (and --epochs auto): the kept model's metrics, and which epoch won.
        const std::string won =
            fmt::format("best epoch {} of {}", kept->epoch, run.epochs_run()) +
            (kept->validated ? " (valid " + valid_summary(*kept) + ")" : std::string()) +
            (run.epochs_undone() > 0
                 ? fmt::format(", {} more undone at a plateau", run.epochs_undone())
                 : std::string());
        if (kept->evaluated)
            std::printf("final: %s  (%.1f s, peak memory %s)  %s\n",
                        format_metrics(kept->metrics).c_str(), kept->seconds,
                        human_bytes(double(peak_rss_bytes())).c_str(), won.c_str());
        else
            std::printf("final: %s\n", won.c_str());
    } else {
        for (auto it = records.rbegin(); it != records.rend(); ++it) {
            if (!it->evaluated) continue;
            std::printf("final: %s  (%.1f s, peak memory %s)\n",
                        format_metrics(it->metrics).c_str(), it->seconds,
                        human_bytes(double(peak_rss_bytes())).c_str());
            break;
        }
    }
    // Hybrid: each worker over the whole run (the epochs' windows, which leave out evaluations).
    std::vector<worker_stats> run_totals;
    uint64_t all_batches = 0;
    for (const epoch_record& r : records)
        for (size_t i = 0; i < r.workers.size(); ++i) {
            if (run_totals.size() <= i) run_totals.push_back(worker_stats{r.workers[i].name});
            run_totals[i] += r.workers[i];
            all_batches += r.workers[i].batches;
        }
    if (!run_totals.empty()) std::printf("workers over the run:\n");
    for (worker_stats& w : run_totals) {
        w.update_share = all_batches ? double(w.batches) / double(all_batches) : 0;
        print_worker(w, /*whole_run=*/true);
    }
    return 0;
}

}  // namespace hslide::cli
