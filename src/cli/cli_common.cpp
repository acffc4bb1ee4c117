// Shared option groups and data loading of the `hslide` subcommands.
#include "cli_common.hpp"

#include "hslide/error.hpp"
#include "hslide/isa.hpp"
#include "hslide/progress.hpp"
#include "hslide/synthetic.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

namespace hslide::cli {

void add_data_options(CLI::App& app, data_options& o, bool with_train) {
    if (with_train) {
        app.add_option("--train", o.train,
                       "training data file (XC or LibSVM); none: synthetic data");
        app.add_option("--train-split", o.train_split,
                       "XC split file selecting the training rows of --train");
        app.add_option("--preset", o.preset, "synthetic preset when no --train is given")
            ->capture_default_str();
        app.add_option("--scale", o.scale, "synthetic: multiplies the preset's point counts")
            ->check(CLI::PositiveNumber)
            ->capture_default_str();
        app.add_option("--labels", o.labels, "synthetic: number of labels (0 = the preset's)");
        app.add_option("--features", o.features,
                       "synthetic: number of features (0 = the preset's)");
        app.add_option("--data-seed", o.data_seed, "synthetic: generator seed")
            ->capture_default_str();
    }
    app.add_option("--test", o.test,
                   with_train ? "test data file (default with --test-split: the --train file)"
                              : "data file to evaluate on");
    app.add_option("--test-split", o.test_split, "XC split file selecting the test rows");
    app.add_option("--split-column", o.split_column, "which column (1-based) of the split files")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--format", o.format, "input format")
        ->check(CLI::IsMember({"auto", "xc", "libsvm"}))
        ->capture_default_str();
    app.add_flag("--no-cache", o.no_cache, "do not read or write the binary cache of parsed files");
    app.add_flag("--verify-cache", o.verify_cache,
                 "use a cache only if a checksum of every byte of the file matches (by default a "
                 "file over 16 MiB is checked by size, modification time and 256 sampled blocks)");
}

dataset load_file(const data_options& o, const std::string& path) {
    load_options lo;
    lo.format = o.format == "xc"       ? data_format::xc
                : o.format == "libsvm" ? data_format::libsvm
                                       : data_format::automatic;
    lo.use_cache = !o.no_cache;
    lo.verify_cache = o.verify_cache;
    lo.show_progress = o.show_progress;
    const auto t0 = std::chrono::steady_clock::now();
    dataset d = load_dataset(path, lo);
    spdlog::info("loaded {}: {} points, {} features, {} labels ({:.2f} s)", path, d.size(),
                 d.n_features, d.n_labels,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return d;
}

loaded_data load_data(const data_options& o) {
    loaded_data out;
    if (o.train.empty()) {
        HSLIDE_CHECK(o.test.empty() && o.test_split.empty() && o.train_split.empty(),
                     "--test/--test-split/--train-split need --train (without --train, synthetic "
                     "data is used)");
        synthetic_config sc;
        sc.preset = o.preset;
        sc.scale = o.scale;
        sc.n_labels = o.labels;
        sc.n_features = o.features;
        sc.seed = o.data_seed;
        const auto t0 = std::chrono::steady_clock::now();
        synthetic_data data = generate_synthetic(sc, o.show_progress);
        spdlog::info(
            "synthetic '{}' (scale {}): {} train / {} test points, {} features, {} labels ({:.1f} "
            "s)",
            o.preset, o.scale, data.train.size(), data.test.size(), data.train.n_features,
            data.train.n_labels,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        out.train = std::move(data.train);
        out.test = std::move(data.test);
        return out;
    }
    dataset train_file = load_file(o, o.train);
    const std::string test_path = !o.test.empty() ? o.test : (!o.test_split.empty() ? o.train : "");
    dataset test_file;
    if (!test_path.empty()) test_file = test_path == o.train ? train_file : load_file(o, test_path);
    if (!o.train_split.empty()) {
        out.train =
            subset(train_file, read_split(o.train_split, o.split_column, train_file.size()));
    } else {
        out.train = std::move(train_file);
    }
    if (!o.test_split.empty())
        out.test = subset(test_file, read_split(o.test_split, o.split_column, test_file.size()));
    else
        out.test = std::move(test_file);
    // Files without a header (LibSVM) only know the largest id they saw: use one size for both.
    const uint64_t d = std::max(out.train.n_features, out.test.n_features);
    const uint64_t l = std::max(out.train.n_labels, out.test.n_labels);
    out.train.n_features = out.test.n_features = d;
    out.train.n_labels = out.test.n_labels = l;
    return out;
}

namespace {
// A list option's default as it is typed (`4` or `256,128`): CLI11 would print "[4]", which
// --print-config writes as a quoted string.
template <class T>
std::string list_text(const std::vector<T>& values) {
    return fmt::format("{}", fmt::join(values, ","));
}
}  // namespace

std::vector<CLI::Option*> add_model_options(CLI::App& app, model_options& o) {
    const size_t before = app.get_options().size();
    app.add_option("--hidden", o.hidden, "hidden layer sizes, e.g. 128 or 256,128")
        ->delimiter(',')
        ->default_str(list_text(o.hidden));
    app.add_option("--normalize", o.normalize, "input scaling per point: l2 (unit norm) or none")
        ->check(CLI::IsMember({"l2", "none"}))
        ->capture_default_str();
    app.add_option("--output-sparsity", o.output_sparsity,
                   "output layer: topk (each sample's labels, its --top-k highest logits, found "
                   "as --top-k-search says, and random neurons up to --min-active), lsh (SLIDE's "
                   "hash tables), dense, or auto (topk above --auto-sparse-min neurons, else "
                   "dense)")
        ->check(CLI::IsMember({"auto", "lsh", "dense", "topk"}))
        ->capture_default_str();
    app.add_option("--top-k", o.top_k,
                   "top-k output layers: output neurons a training sample keeps besides its "
                   "labels")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--top-k-search", o.top_k_search,
                   "top-k output layers: how the top-k is found: exact (every output row "
                   "scored; the full-softmax loss), ivf (an inverted-file index: the rows "
                   "clustered, a sample scores the rows of its --ivf-probes best clusters; CPU "
                   "only, the loss over the set as LSH's) or auto (ivf on the CPU, exact on "
                   "the GPU)")
        ->check(CLI::IsMember({"exact", "ivf", "auto"}))
        ->capture_default_str();
    app.add_option("--ivf-clusters", o.ivf_clusters,
                   "--top-k-search ivf: clusters of output rows (0: about sqrt(rows) / 2)")
        ->capture_default_str();
    app.add_option("--ivf-probes", o.ivf_probes,
                   "--top-k-search ivf: clusters whose rows a sample's search scores")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--ivf-refresh", o.ivf_refresh,
                   "--top-k-search ivf: training steps between refreshes of the index (every "
                   "4th: rows reassigned, centroids recomputed; the others: the rows changed "
                   "since reassigned; 0: only its rebuilds, on --rebuild's schedule)")
        ->capture_default_str();
    app.add_option("--fill-correction", o.fill_correction,
                   "top-k output layers: weight (0..1) of the log-Q correction on the random "
                   "fill: 1 lets each random neuron stand for the rows outside the set it was "
                   "drawn from (needed where labels are rare, e.g. Amazon-3M), 0 is the plain "
                   "set softmax")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--fill-pool", o.fill_pool,
                   "top-k output layers: each step's random fill is drawn from one pool of "
                   "this many rows (0..1) per neuron of the step's sets (x batch x "
                   "--min-active, at least 4 x --min-active; none where a step would touch at "
                   "most a fifth of the layer): fewer rows touched and updated a step; 0 = the "
                   "whole layer")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--hidden-sparsity", o.hidden_sparsity,
                   "hidden layers after the first: auto, lsh or dense")
        ->check(CLI::IsMember({"auto", "lsh", "dense"}))
        ->capture_default_str();
    app.add_option(
           "--auto-sparse-min", o.auto_sparse_min,
           "'auto' layers with more neurons than this are sparse: top-k for the output layer, LSH "
           "for a hidden one")
        ->capture_default_str();
    // The LSH and active-set options take one value, or one per layer after the first.
    app.add_option("--hash", o.hash, "LSH family (one, or one per layer after the first)")
        ->check(CLI::IsMember({"dwta", "wta", "simhash", "minhash"}))
        ->delimiter(',')
        ->default_str(list_text(o.hash));
    app.add_option("--K", o.K, "hashes per bucket code")
        ->check(CLI::Range(1, 32))
        ->delimiter(',')
        ->default_str(list_text(o.K));
    app.add_option("--L", o.L, "hash tables")
        ->check(CLI::Range(1, 4096))
        ->delimiter(',')
        ->default_str(list_text(o.L));
    app.add_option("--bits", o.bits, "bits per hash (DWTA/WTA bins hold 2^bits coordinates)")
        ->check(CLI::Range(1, 16))
        ->delimiter(',')
        ->default_str(list_text(o.bits));
    app.add_option("--bucket-capacity", o.bucket_capacity, "neurons kept per bucket")
        ->check(CLI::PositiveNumber)
        ->delimiter(',')
        ->default_str(list_text(o.bucket_capacity));
    app.add_option("--insertion", o.insertion, "policy of a full bucket")
        ->check(CLI::IsMember({"fifo", "reservoir"}))
        ->delimiter(',')
        ->default_str(list_text(o.insertion));
    app.add_option("--min-active", o.min_active,
                   "random fill of an active set up to this many neurons")
        ->delimiter(',')
        ->default_str(list_text(o.min_active));
    app.add_option("--max-active", o.max_active,
                   "cap of an active set (0 = none; labels always kept)")
        ->delimiter(',')
        ->default_str(list_text(o.max_active));
    app.add_option("--hit-threshold", o.hit_threshold,
                   "keep neurons found in at least this many tables")
        ->check(CLI::PositiveNumber)
        ->delimiter(',')
        ->default_str(list_text(o.hit_threshold));
    add_probes_option(app, o.probes);
    const std::vector<CLI::Option*> all = app.get_options();
    return {all.begin() + ptrdiff_t(before), all.end()};
}

void add_probes_option(CLI::App& app, std::vector<uint32_t>& probes) {
    app.add_option("--probes", probes,
                   "LSH queries at prediction: each table also looks in this many nearby buckets "
                   "(multi-probe; DWTA and WTA; more recall for more time; training never probes)")
        ->check(CLI::Range(0, 64))
        ->delimiter(',')
        ->default_str(list_text(probes));
}

void add_compute_options(CLI::App& app, compute_options& o) {
    app.add_option("--isa", o.isa,
                   "CPU kernel level: auto (the best this CPU has, or $HSLIDE_ISA), scalar, "
                   "avx2, avx512, avx512bf16")
        ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512", "avx512bf16"}))
        ->capture_default_str();
    app.add_option("--precision", o.precision,
                   "fp32, or bf16: bf16 weights and layer inputs in the products (fp32 master "
                   "weights, gradients and Adam state)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
    app.add_option("--gpu", o.gpu, "GPU index for --backend gpu/gpu-dense and hybrid gpu workers")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_flag("--gpu-async-rebuild", o.gpu_async_rebuild,
                 "GPU: rebuild the LSH tables on a side stream while training goes on with the "
                 "old ones, swapped in when done (default: the next step waits for them)");
}

void apply_compute_options(const compute_options& o, backend_options& backend) {
    if (o.isa != "auto") set_active_isa(parse_isa(o.isa));
    backend.precision = parse_precision(o.precision);
    backend.device = o.gpu;
    backend.gpu_async_rebuild = o.gpu_async_rebuild;
}

void add_hybrid_options(CLI::App& app, hybrid_cli& o) {
    app.add_option("--schedule", o.policy,
                   "hybrid: hogbatch (fixed --worker-batch sizes) or adaptive (sizes from "
                   "measured throughput, to meet --update-share)")
        ->check(CLI::IsMember({"hogbatch", "adaptive"}))
        ->capture_default_str();
    app.add_option("--workers", o.workers,
                   "hybrid: the workers, e.g. cpu,gpu or cpu,cpu (kinds: " +
                       join_names(backend_names(
                           [](const backend_entry& e) { return e.caps.hybrid_worker; })) +
                       ")")
        ->capture_default_str();
    app.add_option("--worker-threads", o.threads,
                   "hybrid: CPU threads per CPU worker (one value, or one per worker; 0 = the "
                   "cores left after the other workers' explicit counts and one core per GPU "
                   "worker, shared evenly)")
        ->capture_default_str();
    app.add_option("--worker-batch", o.batch,
                   "hybrid: batch size per worker (hogbatch: fixed; adaptive: the start); auto: "
                   "--batch-size for a CPU worker (a quarter of it beside a GPU worker, the "
                   "Hogbatch split), 8 x --batch-size for a GPU worker")
        ->capture_default_str();
    app.add_option("--update-share", o.share,
                   "hybrid, adaptive: relative share of model updates per worker")
        ->capture_default_str();
    app.add_option("--worker-output-sparsity", o.output_sparsity,
                   "hybrid: each worker's choice of output neurons, e.g. topk,lsh (model: the "
                   "model's --output-sparsity; one value, or one per worker)")
        ->capture_default_str();
    app.add_option(
           "--merge-every", o.merge_every,
           "hybrid: samples a worker trains between merges into the shared model (0 = "
           "automatic: after training twice as long as its last merge took; 1 = after every "
           "batch)")
        ->capture_default_str();
    app.add_option("--first-layer-merge-every", o.first_layer_merge_every,
                   "hybrid: the first layer's rows take part in every N-th merge of a worker "
                   "(and in those before evaluations, checkpoints and parking); they wait in "
                   "the replica meanwhile, never dropped (1 = every merge)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--merge-threads", o.merge_threads,
                   "hybrid: threads of a worker's merge passes (0 = a CPU worker's own threads, "
                   "1 for a GPU worker); merges before evaluations and checkpoints use every "
                   "worker's")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--min-batch", o.min_batch, "hybrid, adaptive: smallest batch size")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--max-batch", o.max_batch, "hybrid, adaptive: largest batch size")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--park-below-share", o.park_below_share,
                   "hybrid, adaptive: while the slowest worker trains less than this share of "
                   "the samples, measure whether the others are as fast without it, and if so "
                   "park it (no batches) for a while (0 = never)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
}

std::string join_names(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
}

CLI::Option* add_backend_option(CLI::App& app, std::string& name,
                                bool (*keep)(const backend_entry&)) {
    const std::vector<std::string> names = backend_names(keep);
    app.footer("Backends, and what each supports:\n" + describe_backends());
    return app
        .add_option("--backend", name,
                    "where to compute: " + join_names(names) + " (see Backends below)")
        ->check(CLI::IsMember(names))
        ->capture_default_str();
}

hybrid_options make_hybrid_options(const hybrid_cli& o, const backend_options& device,
                                   const train_config& train) {
    auto split = [](const std::string& text) {
        std::vector<std::string> parts;
        std::stringstream in(text);
        for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
        return parts;
    };
    const std::vector<std::string> names = split(o.workers);
    const size_t n = names.size();
    HSLIDE_CHECK(n > 0, "--workers names no worker");
    const std::vector<std::string> worker_kinds =
        backend_names([](const backend_entry& e) { return e.caps.hybrid_worker; });
    std::vector<backend_kind> kinds;
    for (const std::string& name : names) {
        HSLIDE_CHECK(
            std::find(worker_kinds.begin(), worker_kinds.end(), name) != worker_kinds.end(),
            "--workers: unknown worker '{}' ({})", name, join_names(worker_kinds));
        kinds.push_back(parse_backend_kind(name));
    }
    auto on_gpu = [&](size_t i) { return backend_entry_of(kinds[i]).caps.needs_gpu; };
    // The i-th value of a list flag as a number, the one value standing for every worker.
    auto value = [&](const std::string& text, const char* flag, size_t i) {
        const std::vector<std::string> values = split(text);
        HSLIDE_CHECK(values.size() == 1 || values.size() == n,
                     "{} has {} values for {} hybrid workers (give one, or one per worker)", flag,
                     values.size(), n);
        const std::string& v = values.size() == 1 ? values[0] : values[i];
        size_t used = 0;
        double x = 0;
        try {
            x = std::stod(v, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        HSLIDE_CHECK(used == v.size() && used > 0 && x >= 0, "{}: '{}' is not a number >= 0", flag,
                     v);
        return x;
    };
    std::vector<int> requested(n, 0);
    for (size_t i = 0; i < n; ++i)
        if (!on_gpu(i))
            requested[i] =
                check_thread_count(value(o.threads, "--worker-threads", i), "--worker-threads");
    const std::vector<int> threads = split_worker_threads(
        kinds, requested, train.threads > 0 ? train.threads : omp_get_max_threads());
    bool beside_gpu = false;
    for (size_t i = 0; i < n; ++i) beside_gpu = beside_gpu || on_gpu(i);
    hybrid_options h;
    h.policy = parse_schedule_policy(o.policy);
    h.reference_batch = train.batch_size;
    h.merge_every = o.merge_every;
    h.first_layer_merge_every = o.first_layer_merge_every;
    h.min_batch = o.min_batch;
    h.max_batch = o.max_batch;
    h.park_below_share = o.park_below_share;
    for (size_t i = 0; i < n; ++i) {
        hybrid_worker_options w;
        w.device = device;
        w.device.kind = kinds[i];
        if (!on_gpu(i)) w.device.threads = threads[i];
        w.merge_threads = o.merge_threads;
        if (o.batch == "auto") {
            w.batch_size = on_gpu(i)    ? 8 * train.batch_size
                           : beside_gpu ? std::max(1u, train.batch_size / 4)
                                        : train.batch_size;
        } else {
            w.batch_size = uint32_t(value(o.batch, "--worker-batch", i));
        }
        HSLIDE_CHECK(w.batch_size > 0, "--worker-batch sizes must be positive");
        w.update_share = value(o.share, "--update-share", i);
        HSLIDE_CHECK(w.update_share > 0, "--update-share values must be positive");
        const std::vector<std::string> sparsity = split(o.output_sparsity);
        HSLIDE_CHECK(sparsity.size() == 1 || sparsity.size() == n,
                     "--worker-output-sparsity has {} values for {} hybrid workers (give one, or "
                     "one per worker)",
                     sparsity.size(), n);
        const std::string& own = sparsity.size() == 1 ? sparsity[0] : sparsity[i];
        if (own != "model") w.output_sparsity = parse_sparsity(own);
        h.workers.push_back(w);
    }
    return h;
}

void add_output_options(CLI::App& app, output_options& o) {
    app.add_flag("-q,--quiet", o.quiet, "only warnings and errors on stderr");
    app.add_flag("--no-progress", o.no_progress, "no progress bars or progress lines");
    app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
        ->capture_default_str();
}

void add_config_option(CLI::App& app, const std::string& help) {
    app.set_config("--config", "", help);
    app.allow_config_extras(CLI::config_extras_mode::error);
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ConfigError& e) {
        // CLI11 says "INI was not able to parse KEY": name the file and what keys it takes.
        const CLI::Option* config = app.get_config_ptr();
        const std::string path = config && config->count() ? config->as<std::string>() : "";
        std::fprintf(stderr, "%s: error: %s%s (config keys are the long flag names; see --help)\n",
                     app.get_name().c_str(), path.empty() ? "" : (path + ": ").c_str(), e.what());
        return 2;
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
}

bool apply_output_options(const output_options& o) {
    setup_logging(o.log_level, o.quiet);
    return !o.quiet && !o.no_progress;
}

}  // namespace hslide::cli
