// The backends this build knows, as one table: each kind's name, what it is, how to create it,
// and what it supports (capabilities). The CLI's help and validation and the hybrid's worker
// parsing read the table; nothing else tests a backend's name.
//
// The factories live with the backends (src/backends/registry.cpp, the one file that includes
// src/cpu and src/gpu); a kind this build cannot run (a GPU kind without CUDA) stays in the
// table, and creating it throws hslide::error (unsupported) saying why.
#pragma once

#include "hslide/backend.hpp"
#include "hslide/config.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"
#include "hslide/output_shard.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hslide {

/// Which backend.
enum class backend_kind {
    cpu,        ///< sparse (LSH or top-k active sets) on the CPU (OpenMP, ISA-dispatched kernels)
    cpu_dense,  ///< every neuron through BLAS GEMMs: the dense baseline
    gpu,        ///< LSH-sparse on one GPU
    gpu_dense,  ///< every neuron through cuBLAS on one GPU
    hybrid,     ///< several workers (CPU and GPU backends) training one model together
};
/// The kind's name in the table (cpu, cpu-dense, ...).
const char* to_string(backend_kind kind);
/// The kind named `name`; throws hslide::error (invalid_argument) listing the names otherwise.
backend_kind parse_backend_kind(const std::string& name);

/// Options for creating a backend.
struct backend_options {
    backend_kind kind = backend_kind::cpu;
    int threads = 0;  ///< CPU threads (0 = all)
    int device = 0;   ///< GPU index
    /// GPU: rebuild LSH tables on a side stream while training goes on with the old ones,
    /// swapped for the new ones when they are done (the functions' own rehashes excepted);
    /// off: the step after a rebuild uses the new tables.
    bool gpu_async_rebuild = false;
    precision_mode precision = precision_mode::fp32;
    /// CPU kernel level; unset = active_isa() (the --isa flag, HSLIDE_ISA or the best level).
    std::optional<isa_level> isa;
    /// The output layer's rows this rank holds in a label-sharded run (output_shard.hpp; the
    /// model given to create_backend holds them: model_state::create_shard). Default: the
    /// whole layer. Only the cpu and gpu kinds run sharded; the others refuse it.
    output_shard shard;
};

/// What a backend supports. The hybrid's entry is its workers' union; what one of its
/// workers does not support is checked on that worker's own entry.
struct backend_capabilities {
    bool bf16 = false;               ///< --precision bf16 (fp32 always)
    uint32_t max_hidden_layers = 0;  ///< 0 = any number
    uint32_t max_hidden_width = 0;   ///< neurons of a hidden layer at most (0 = any)
    /// Computes every neuron: a model's LSH settings are kept but not used, and predictions
    /// always score every label (exact).
    bool computes_every_neuron = false;
    bool multi_probe = false;  ///< LSH scoring with multi-probe (--probes)
    /// Selects a layer's active neurons by exact top-k (neuron_selection::top_k; LSH and
    /// `all` every sparse backend takes). Moot where it computes every neuron.
    bool top_k_selection = false;
    /// Finds top-k sets with the IVF index (--top-k-search ivf) besides exact scoring.
    bool ivf_top_k_search = false;
    /// Per adam_mode (indexed by its value): the mode it runs as (the same model), or nullopt
    /// when it refuses the mode.
    std::array<std::optional<adam_mode>, 5> adam_runs_as{};
    bool logistic_loss = false;  ///< --loss logistic (softmax always)
    /// --loss auto is logistic there: where the logistic loss was measured to win (the CPU's;
    /// the GPU's trains it but keeps the softmax, its measured default, until a GPU run has
    /// compared the two: scripts/gpu_check.sh's peers step).
    bool logistic_loss_by_default = false;
    bool needs_gpu = false;      ///< runs on a GPU (creating it fails without one)
    bool hybrid_worker = false;  ///< may be a worker of the hybrid backend (--workers)
};

/// One row of the table.
struct backend_entry {
    backend_kind kind;
    const char* name;         ///< for --backend and --workers
    const char* description;  ///< one line, for --help
    backend_capabilities caps;
    /// Creates it (null for the hybrid, which create_hybrid_backend makes from its workers).
    std::unique_ptr<backend> (*create)(const backend_options& options, model_state initial,
                                       const train_config& train);
};

/// Every backend kind, in backend_kind's order.
const std::vector<backend_entry>& backend_registry();
/// The table's entry of `kind`.
const backend_entry& backend_entry_of(backend_kind kind);

/// The names of the kinds for which `keep` holds, in the table's order.
template <typename Pred>
std::vector<std::string> backend_names(Pred keep) {
    std::vector<std::string> names;
    for (const backend_entry& e : backend_registry())
        if (keep(e)) names.push_back(e.name);
    return names;
}
/// The table as text for --help: one line per backend, saying what it supports.
std::string describe_backends();

/// Checks that `kind` supports the model (its shape and selections), optimizer and precision,
/// and the evaluation's `scoring` (LSH scoring: the model's multi-probe settings; IVF scoring:
/// a top-k output layer and a backend with the IVF search); throws hslide::error
/// (unsupported) saying what it does not support and what does. The hybrid's own entry checks
/// nothing: check each worker's kind.
void check_supported(backend_kind kind, const model_config& model, const train_config& train,
                     precision_mode precision, scoring_mode scoring);
/// The Adam mode `kind` runs `mode` as (itself, or the mode that trains the same model);
/// throws hslide::error (unsupported) where it refuses it.
adam_mode adam_mode_run_by(backend_kind kind, adam_mode mode);

/// Resolves a front end's automatic training settings for a run on `kind` (`sharded`: as a
/// rank of a label-sharded run) over `training_points` points, before validate(train): --loss
/// auto becomes logistic where the backend has it by default (logistic_loss_by_default: cpu,
/// cpu-dense, cpu ranks; bench/peers.md: test P@1 as high or higher than the softmax's on every
/// real set), else softmax (the GPU backends, the hybrid; ranks of several kinds decide
/// together before: the CLI's train); --batch-size 0 becomes
/// automatic_batch_size(loss, training_points); --lr 0 becomes the loss's rate
/// (automatic_learning_rate: scaled by the square-root rule where the batch was auto);
/// --reuse-candidates -1 becomes reuse_candidates_auto_epochs on cpu in one process, else 0
/// (with reuse_candidates_min_rows = reuse_candidates_auto_min_rows), and
/// reuse_candidates_steps those epochs of `training_points` in steps of the batch.
/// --reuse-candidates' auto on the cpu backend, in epochs, on output layers of at least
/// reuse_candidates_auto_min_rows rows. Measured (bench/peers.md, 2026-12-07, fourth session):
/// the same P@1 on Debian's Depends (15,591 rows) and Debian-recs (6,118) in about 12-20% less
/// time; reused longer (1.5 epochs) Depends lost 0.002-0.003; on Bibtex (159 rows) and Corel5k
/// (374) the search is a small share of a step and nothing was gained.
constexpr double reuse_candidates_auto_epochs = 1.0;
constexpr uint32_t reuse_candidates_auto_min_rows = 4096;

void resolve_auto_training(train_config& train, backend_kind kind, bool sharded,
                           uint64_t training_points);
/// Checks a front end's `train` before the data are read: a copy resolved as for no training
/// points, then validate(train_config). The run resolves its own once it knows its points.
void validate_before_data(const train_config& train, backend_kind kind, bool sharded);

/// Creates a backend holding `initial` and builds its tables. Pass the state with std::move
/// where the caller no longer needs it: a copy doubles the peak memory of a large model.
/// Throws hslide::error (unsupported) when the kind cannot run in this build or machine.
std::unique_ptr<backend> create_backend(const backend_options& options, model_state initial,
                                        const train_config& train);

/// Row scores a second that a backend of `options` (its kind, threads and ISA; a gpu one's GPU
/// and precision) offers at rows of `width`: a tenth of a second's measurement of the exact
/// scoring a sharded rank's step is nearly all of (--shard-weights auto). Throws hslide::error
/// (unsupported) for a kind that does not run sharded.
double measure_scoring_rate(const backend_options& options, uint32_t width);

}  // namespace hslide
