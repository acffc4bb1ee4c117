// The one table of `hslide train`'s options: each declared once (name, group, help, the
// setting it fills, its choices and range check, whether hslide.Model takes it). The CLI
// registers its flags from it (and so reads --config files from it), `hslide eval` and
// `hslide predict` take the entries they share, and the Python module checks and applies
// its keyword arguments from it. It holds no CLI11 types, so the Python module builds it too.
//
// Values are validated where they always were: a range or choice check here is what the
// command line applies while parsing (the Python module leaves those to the library's
// parse_* and validate() functions, which both front ends call).
#pragma once

#include "hslide/config.hpp"
#include "hslide/hybrid.hpp"
#include "hslide/model_options.hpp"
#include "hslide/trainer.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
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

/// --isa / --precision / --gpu: how and where the backend computes.
struct compute_options {
    std::string isa = "auto";
    std::string precision = "fp32";
    int gpu = 0;  ///< GPU index for the gpu backends and hybrid gpu workers
    bool gpu_async_rebuild = false;
};

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

/// --quiet / --log-level / --no-progress.
struct output_options {
    bool quiet = false;
    bool no_progress = false;
    std::string log_level = "info";
};

/// train_config as the front ends (the command line, hslide.Model) default it: the weight
/// average, the loss, the batch, the candidates' reuse and the learning rate on auto
/// (resolve_auto_training).
inline train_config front_end_train_config() {
    train_config train;
    train.ema_epochs = -1;
    train.reuse_candidates_epochs = -1;
    train.ivf_min_recall = front_end_ivf_min_recall;
    train.loss = output_loss::automatic;
    train.batch_size = 0;
    train.learning_rate = 0;
    return train;
}

/// Every setting of a training run, as the table's options fill them. The enum settings are
/// held by name (the choices the help lists) and parsed by apply_names().
struct train_settings {
    data_options data;
    model_options model;
    train_config train = front_end_train_config();
    trainer_options trainer;
    std::string backend = "cpu";
    compute_options compute;
    hybrid_cli hybrid;
    output_options output;
    std::string adam = to_string(train_config{}.adam);
    std::string adam_moments = to_string(train_config{}.adam_moments);
    std::string lr_schedule = to_string(train_config{}.schedule);
    std::string lr_scaling = to_string(train_config{}.lr_scaling);
    std::string loss = to_string(output_loss::automatic);
    std::string scoring = to_string(evaluation_options{}.scoring);
    /// --epochs: "auto" (the default) or a count, parsed into train.epochs/epochs_auto.
    std::string epochs = "auto";
    std::string valid, valid_split, keep_best, resume;
    std::string
        shard_weights;  ///< --shard-weights: the ranks' shares of the output layer ("" = equal)
    double valid_fraction = 0;
    bool progress = false;  ///< hslide.Model's progress bars (the CLI has --no-progress)

    /// Parses the enum settings held by name into `train` and `trainer` (throws hslide::error
    /// naming the setting and its valid names).
    void apply_names();
};

/// The --help sections, in the order they print.
enum class option_group {
    essentials,   ///< data, model size, epochs, batch, learning rate, where, save/resume, ...
    data,         ///< synthetic data, file formats, input scaling
    selection,    ///< which output (and hidden) neurons a step computes: top-k, IVF
    lsh,          ///< the LSH tables
    optimiser,    ///< Adam and the learning-rate schedule
    hybrid,       ///< --backend hybrid
    evaluation,   ///< how and when the test set is scored
    diagnostics,  ///< probes of the selection, logging, kernels
};
const char* title(option_group group);

/// A range check the command line applies while parsing (CLI11's validators).
struct option_check {
    enum class kind { none, positive, non_negative, range } which = kind::none;
    double low = 0, high = 0;  ///< kind::range: [low, high]
};
/// What is wrong with `value` under `check` ("must be from 0 to 1, not 2"), or "" when
/// nothing: a non-finite value never passes. The CLI's validators and hslide.Model say the same.
std::string option_value_problem(const option_check& check, double value);

/// The setting an option fills.
using option_target =
    std::variant<bool*, int*, uint32_t*, uint64_t*, float*, double*, std::string*,
                 std::vector<uint32_t>*, std::vector<int>*, std::vector<std::string>*>;

/// Which front ends take an option.
enum class option_surface { both, cli, python };

/// One option of `hslide train`.
struct option_spec {
    std::string name;  ///< the long flag without "--" (Python: with '_' for '-')
    option_group group;
    std::string help;
    std::function<option_target(train_settings&)> target;
    std::vector<std::string> choices;  ///< empty: any value (lists: each element)
    option_check check;
    option_surface surface = option_surface::both;
    std::string short_name;  ///< e.g. "-q" ("" = none)

    option_spec(std::string name_, option_group group_, std::string help_,
                std::function<option_target(train_settings&)> target_,
                std::vector<std::string> choices_, option_check check_, option_surface surface_,
                std::string short_name_ = "")
        : name(std::move(name_)),
          group(group_),
          help(std::move(help_)),
          target(std::move(target_)),
          choices(std::move(choices_)),
          check(check_),
          surface(surface_),
          short_name(std::move(short_name_)) {}
};

/// The table, in --help order (grouped, essentials first).
const std::vector<option_spec>& train_option_table();
/// The entry called `name` (the flag's spelling), or null.
const option_spec* find_option(const std::string& name);

/// The message for an unknown option, the same from the CLI and from hslide.Model:
/// "unknown option 'NAME' (did you mean 'A' or 'B'?)". `name` and the suggestions (the
/// nearest names of the table's options on that surface) are spelled with `separator`
/// between words ('-' for flags, '_' for Python keywords).
std::string unknown_option_message(const std::string& name, option_surface surface, char separator);

}  // namespace hslide::cli
