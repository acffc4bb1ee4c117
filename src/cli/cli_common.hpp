// Pieces the `hslide` subcommands share: data options and loading, model options, logging.
#pragma once

#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/hybrid.hpp"
#include "hslide/model_options.hpp"
#include "hslide/shard_comm.hpp"
#include "option_table.hpp"

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hslide::cli {

struct loaded_data {
    dataset train, test;
    std::vector<uint32_t> train_rows;  ///< --train-split's rows of the --train file (or none)
};

loaded_data load_data(const data_options& options);
/// Loads one file with the options' format and cache settings.
dataset load_file(const data_options& options, const std::string& path);

/// Warns where two splits of one file list the same rows (a split made wrong leaks the test or
/// validation points into training): how many, the first, and `consequence`.
void warn_shared_rows(const std::string& flag_a, const std::vector<uint32_t>& a,
                      const std::string& flag_b, const std::vector<uint32_t>& b,
                      const std::string& consequence);

/// Registers the table's options (option_table.hpp) bound to `settings`, each in its --help
/// group: `names` (the flags' spellings) in the table's order, or with no names every one the
/// command line takes. Returns them in that order.
std::vector<CLI::Option*> add_table_options(CLI::App& app, train_settings& settings,
                                            const std::vector<std::string>& names = {});
/// The table's model options (model_options: the network) among `options`.
std::vector<CLI::Option*> model_flags(const std::vector<CLI::Option*>& options);

/// Forces the ISA level process-wide (hashing included) unless "auto", and fills the backend
/// options' precision and GPU index. Throws hslide::error when this CPU lacks the level asked for.
void apply_compute_options(const compute_options& options, backend_options& backend);

/// What a rank of a run sharded across MPI ranks computes on (check_rank_backend).
struct rank_backend {
    /// The GPU a gpu rank uses: (--gpu + its local rank) modulo the GPUs it sees, so that the
    /// default --gpu 0 spreads a host's ranks over its GPUs; --gpu otherwise.
    int gpu = 0;
    /// The ranks compute the replicated layers differently (trainer_options::replicas_differ).
    bool replicas_differ = false;
};

/// A rank of a run sharded across MPI ranks (comm.size() > 1; a collective): checks that
/// `kind` shards its output layer (cpu, gpu) and gathers what every rank computes on (its
/// backend, CPU instruction set, precision). Where they differ, rank 0 logs each rank's.
rank_backend check_rank_backend(shard_comm& comm, backend_kind kind,
                                const compute_options& compute);

/// Adds the registry's hybrid worker kinds to --workers' help.
void add_hybrid_worker_help(CLI::App& app);
/// The hybrid backend's options: one worker per --workers entry, each list flag giving one
/// value per worker or one for all; `device` is the template for every worker (precision,
/// ISA). Throws hslide::error on a list of the wrong length.
hybrid_options make_hybrid_options(const hybrid_cli& options, const backend_options& device,
                                   const train_config& train);

/// Configures logging; returns whether progress bars should be drawn.
bool apply_output_options(const output_options& options);

/// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

/// Restricts the table's --backend (registered) to the registry's kinds for which `keep`
/// holds; the help lists them, and the footer what each supports (describe_backends).
void restrict_backends(CLI::App& app, bool (*keep)(const backend_entry&));

/// Adds --config FILE (TOML-style, keys are the long flag names); a key that names no flag is
/// an error, never silently ignored.
void add_config_option(CLI::App& app,
                       const std::string& help = "config file mirroring these flags");

/// Checks of an option's text, before CLI11 converts it (the table's options have them; an
/// option added by hand adds them): a number of type T (whole and in T's range for an integer:
/// "-1" is no unsigned value; finite for a floating type: "nan" passes every range check); one
/// that meets an option_check (option_value_problem's message); a value given explicitly that
/// is not empty (--save "", an unset shell variable, would quietly save nothing).
template <class T>
CLI::Validator number_of_type();
CLI::Validator meets(const option_check& check);
CLI::Validator not_empty();

/// A file a command reads or writes, and the flag that named it.
struct named_path {
    std::string flag;
    std::string path;
};
/// Refuses (hslide::error) an output that is one of the inputs or another output, by the file
/// it names (links and relative spellings included): writing it would destroy what the user
/// gave (`predict --out` onto its --model, `train --save` onto its --train). Empty paths are
/// none.
void check_outputs_apart(const std::vector<named_path>& inputs,
                         const std::vector<named_path>& outputs);
/// The --config file given ("" = none).
std::string config_path(const CLI::App& app);

/// Parses the command line; returns the exit code when the command should stop here (--help:
/// 0, a usage error: 2, after CLI11 or this has printed it), nothing when it should go on.
/// A list option (--hidden 256,128) given twice is refused rather than appended to. With
/// `train_table`, an unknown option is named with the nearest of the table's
/// (unknown_option_message, as hslide.Model says it).
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                      bool train_table = false);

int run_train(int argc, char** argv);
int run_eval(int argc, char** argv);
int run_predict(int argc, char** argv);
int run_gen(int argc, char** argv);
int run_info(int argc, char** argv);

}  // namespace hslide::cli
