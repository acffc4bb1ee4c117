// Pieces the `hslide` subcommands share: data options and loading, model options, logging.
#pragma once

#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/hybrid.hpp"
#include "hslide/model_options.hpp"

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hslide::cli {

/// Where the training and test data come from: files (XC or LibSVM, optionally with XC split
/// files) or, when no --train is given, the built-in synthetic generator.
struct data_options {
    std::string train, train_split, test, test_split;
    int split_column = 1;
    std::string format = "auto";
    bool no_cache = false, verify_cache = false;
    std::string preset = "amazon670k";
    double scale = 0.05;
    uint64_t labels = 0, features = 0;
    uint64_t data_seed = 2024;
    bool show_progress = false;  ///< set from the output options, not a flag of its own
};

struct loaded_data {
    dataset train, test;
};

void add_data_options(CLI::App& app, data_options& options, bool with_train);
loaded_data load_data(const data_options& options);
/// Loads one file with the options' format and cache settings.
dataset load_file(const data_options& options, const std::string& path);

/// Adds the model flags to `app` and returns them (a resumed run checks which were given).
std::vector<CLI::Option*> add_model_options(CLI::App& app, model_options& options);
/// --probes: multi-probe LSH scoring, one value or one per layer after the first.
void add_probes_option(CLI::App& app, std::vector<uint32_t>& probes);

/// --isa / --precision: how the CPU computes.
struct compute_options {
    std::string isa = "auto";
    std::string precision = "fp32";
    int gpu = 0;  ///< GPU index for the gpu backends and hybrid gpu workers
    bool gpu_async_rebuild = false;
};
void add_compute_options(CLI::App& app, compute_options& options);
/// Forces the ISA level process-wide (hashing included) unless "auto", and fills the backend
/// options' precision and GPU index. Throws hslide::error when this CPU lacks the level asked for.
void apply_compute_options(const compute_options& options, backend_options& backend);

/// The flags of --backend=hybrid.
/// Lists are comma-separated text (one value, or one per worker), so defaults such as
/// "cpu,gpu" print in --print-config exactly as they read back.
struct hybrid_cli {
    std::string policy = "adaptive";
    std::string workers = "cpu,gpu";
    std::string threads = "0";
    std::string batch = "auto";  // a CPU worker: --batch-size (/ 4 beside a GPU); a GPU: x 8
    std::string share = "1";
    std::string output_sparsity = "model";  // per worker: model (the model's) or a sparsity
    uint64_t merge_every = 0;
    uint32_t first_layer_merge_every = hybrid_options{}.first_layer_merge_every;
    int merge_threads = 0;
    uint32_t min_batch = 8, max_batch = 8192;
    double park_below_share = 0.25;
};
void add_hybrid_options(CLI::App& app, hybrid_cli& options);
/// The hybrid backend's options: one worker per --workers entry, each list flag giving one
/// value per worker or one for all; `device` is the template for every worker (precision,
/// ISA). Throws hslide::error on a list of the wrong length.
hybrid_options make_hybrid_options(const hybrid_cli& options, const backend_options& device,
                                   const train_config& train);

/// --quiet / --log-level / --no-progress.
struct output_options {
    bool quiet = false;
    bool no_progress = false;
    std::string log_level = "info";
};
void add_output_options(CLI::App& app, output_options& options);
/// Configures logging; returns whether progress bars should be drawn.
bool apply_output_options(const output_options& options);

/// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

/// --backend: the name of a kind in the backend registry, among those for which `keep` holds;
/// the help lists them, and the footer what each supports (describe_backends).
CLI::Option* add_backend_option(CLI::App& app, std::string& name,
                                bool (*keep)(const backend_entry&));

/// Adds --config FILE (TOML-style, keys are the long flag names); a key that names no flag is
/// an error, never silently ignored.
void add_config_option(CLI::App& app,
                       const std::string& help = "config file mirroring these flags");

/// Parses the command line; returns the exit code when the command should stop here (--help:
/// 0, a usage error: 2, after CLI11 has printed it), nothing when it should go on.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

int run_train(int argc, char** argv);
int run_eval(int argc, char** argv);
int run_predict(int argc, char** argv);
int run_gen(int argc, char** argv);
int run_info(int argc, char** argv);

}  // namespace hslide::cli
