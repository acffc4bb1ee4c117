// The Backend interface: what the trainer and the hybrid scheduler may ask of a device.
//
// A backend owns one replica of the model (parameters, optimizer state, LSH tables) in its
// own memory. It trains on batches of rows of a dataset, rebuilds its tables when asked,
// predicts, and exports/imports its parameters so replicas can be merged. The CPU backend
// (src/cpu) and the CUDA backend (src/gpu) implement it; nothing above this header knows
// which one it talks to. Calls on one backend are not concurrent; different backends may be
// driven from different threads.
#pragma once

#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/isa.hpp"
#include "hslide/model.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hslide {

/// A batch: `size` row indices into `data`.
struct batch_view {
    const dataset* data = nullptr;
    const uint32_t* rows = nullptr;
    uint32_t size = 0;
};

/// Seconds spent in each stage of a step (for breakdowns and benchmarks).
struct stage_times {
    double hashing = 0;      ///< LSH codes of the layer inputs
    double active_sets = 0;  ///< active-set queries: bucket unions, forced labels, random fill
    double forward = 0;      ///< forward pass (dot products, softmax, loss)
    double backward = 0;     ///< backpropagation of deltas
    double update = 0;       ///< gradient reduction and the optimizer
    double rebuild = 0;      ///< table rebuilds
    double transfer = 0;     ///< host<->device copies (GPU backends)

    stage_times& operator+=(const stage_times& o);
    double total() const {
        return hashing + active_sets + forward + backward + update + rebuild + transfer;
    }
};

/// What one training step did.
struct step_report {
    uint32_t samples = 0;
    double loss_sum = 0;                     ///< summed over the batch's samples
    std::vector<uint64_t> active_per_layer;  ///< neurons computed, summed over samples
    /// Samples whose loss is the exact full-softmax cross-entropy (a top-k output layer, which
    /// knows the log-partition over every neuron), and the softmax mass of the output rows
    /// their active sets left out (whose gradient was dropped), summed over them.
    uint64_t full_softmax_samples = 0;
    double dropped_mass_sum = 0;
    stage_times times;
    double seconds = 0;  ///< wall time of the step

    /// Sums another report into this one (per-layer counts elementwise).
    step_report& operator+=(const step_report& o);
};

/// What a backend is and has.
struct backend_info {
    std::string kind;                ///< "cpu", "cpu-dense" or "gpu"
    std::string device;              ///< e.g. CPU model with thread count, or GPU name
    std::string precision;           ///< "fp32" or "bf16"
    uint64_t memory_bytes = 0;       ///< bytes the model replica holds
    uint64_t free_memory_bytes = 0;  ///< free device memory (0 when not applicable)
};

/// One worker of a multi-device backend (the hybrid one), over a window of its work.
struct worker_stats {
    std::string name;         ///< e.g. "cpu0" or "gpu0"
    uint64_t samples = 0;     ///< samples trained
    uint64_t batches = 0;     ///< batches trained (each one model update of its replica)
    double update_share = 0;  ///< batches / all workers' batches in the window
    double busy_seconds = 0;  ///< training, rebuilding and merging
    /// Length of the window: from its first batch queued (or, when the workers were still
    /// busy at the last take, from that take) to this take.
    double wall_seconds = 0;
    uint32_t batch_min = 0, batch_max = 0, batch_last = 0;  ///< batch sizes chosen
    double batch_mean = 0;
    uint64_t merges = 0;              ///< merges of its replica into the shared model
    double merge_seconds = 0;         ///< time in merges (export, add, import)
    double merge_wait_seconds = 0;    ///< of which waiting for another worker's merge
    double merge_import_seconds = 0;  ///< of which importing the rows taken back
    /// Thread CPU time of its batches' training and of its merges (unlike wall times, these
    /// hardly move when other processes share the cores: for breakdowns on busy machines).
    double train_cpu_seconds = 0, merge_cpu_seconds = 0;
    double staleness_mean = 0;  ///< other workers' merges between its sync and its merge
    uint64_t staleness_max = 0;
    uint64_t rows_merged = 0;  ///< rows (all layers) whose change it added, summed over merges
    uint64_t rows_pulled = 0;  ///< rows it took from the shared model, summed over merges
    /// Hybrid, adaptive: time it was parked, found not to help (or sitting out a measurement).
    double parked_seconds = 0;

    double utilisation() const { return wall_seconds > 0 ? busy_seconds / wall_seconds : 0; }
    /// Appends the next window of the same worker: counts and times add, batch sizes and
    /// staleness combine; update_share, which needs the other workers, is left as it was.
    worker_stats& operator+=(const worker_stats& o);
};

class backend {
  public:
    virtual ~backend() = default;

    /// One SGD step on the batch: sparse forward, backward, Adam update of the touched rows.
    virtual step_report train_batch(const batch_view& batch, float learning_rate) = 0;

    /// Recomputes every sparse layer's tables; with `new_functions`, first draws new hash
    /// functions (from the seed stream it was created with). A backend may rebuild in the
    /// background (the GPU's gpu_async_rebuild): lookups use the old tables until then.
    virtual void rebuild_tables(bool new_functions) = 0;

    /// Top-k labels per sample: labels[s*k + i], scores[s*k + i], best first; padded with
    /// UINT32_MAX / -inf when fewer than k are scored.
    virtual void predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                         uint32_t* labels, float* scores) = 0;

    /// Copies the replica into `out` (parameters; with `with_optimizer`, Adam state too).
    virtual void export_state(model_state& out, bool with_optimizer) const = 0;

    /// Replaces the replica's parameters (and Adam state when `with_optimizer`) with `in`,
    /// then rebuilds the tables with the hash seeds in `in`.
    virtual void import_state(const model_state& in, bool with_optimizer) = 0;

    /// The replica itself when it is held in host memory as a model_state (the CPU backend),
    /// so a checkpoint can be written without a copy the size of the model; nullptr when
    /// export_state is the only way to read it.
    virtual const model_state* host_state() const { return nullptr; }

    // Row-level transfers, for row-sparse merges (the hybrid backend): a merge moves only the
    // rows that changed. A backend that knows the rows its updates touch overrides all three;
    // the defaults fall back to whole-model export_state / import_state, so every backend can
    // take part in a hybrid, just with whole-model cost.

    /// Writes into `rows` the rows of each layer this replica's training changed since the
    /// last call (or since it was created or last imported a whole state with import_state),
    /// and starts a new period; rows written by import_rows are not changes of its own. Rows
    /// may be reported that did not move (a touched row whose update was zero). Returns false
    /// when the backend does not track rows (the default): treat every row as changed.
    virtual bool take_changed_rows(row_sets& rows);

    /// Copies the weights and biases (not Adam state) of `rows` into `out`, which must have
    /// this model's shapes already; other rows of `out` are left as they are. The default
    /// exports the whole state and copies the rows out of it.
    virtual void export_rows(const row_sets& rows, model_state& out) const;

    /// Overwrites the weights and biases of `rows` with those of `in` (shaped like this
    /// model), keeping Adam state, hash functions and the step count. Derived copies (a bf16
    /// copy) follow at once; LSH tables may keep the imported neurons in their old buckets
    /// until the next rebuild_tables (a backend's own updates leave them stale the same way).
    /// The default exports the whole state, patches the rows and imports it (tables rebuilt).
    virtual void import_rows(const model_state& in, const row_sets& rows);

    /// The replica's parameters, writable in place, where it lives in host memory and a
    /// merge may write rows straight into it (saving import_rows' copy: the merge has the
    /// rows in cache); nullptr (the default) where rows go through import_rows. Whoever writes
    /// rows through it calls rows_written with them before the next train_batch.
    virtual model_state* writable_host_state() { return nullptr; }

    /// Makes rows written in place through writable_host_state() current, as import_rows
    /// does after its copy (derived bf16 copies; the tables re-hash them at the next rebuild).
    /// The writer has set the rows' weights and biases (layer 0's bias vector whole).
    /// The default throws: there is nothing to write into.
    virtual void rows_written(const row_sets& rows);

    virtual backend_info info() const = 0;

    /// Applies updates the optimizer deferred (--adam catch-up: the momentum steps of rows the
    /// batches skipped), so that the replica is the model dense Adam would have; the rows it
    /// moves count as changed rows. predict and the exports do it themselves; a multi-device
    /// backend calls it on each device before merging them whole. Returns whether it moved any
    /// row. The default: nothing is deferred.
    virtual bool complete_deferred_updates() { return false; }

    /// Waits until every batch handed to train_batch is applied and the model is consistent,
    /// and returns the report of work finished since the last train_batch or synchronize.
    /// train_batch of an asynchronous backend (the hybrid one) may return before its batch is
    /// trained, with the report of earlier ones; synchronous backends return an empty report.
    virtual step_report synchronize() { return {}; }

    /// Per-worker statistics since the last call (multi-device backends; empty otherwise).
    virtual std::vector<worker_stats> take_worker_stats() { return {}; }
};

/// Options for creating a backend.
struct backend_options {
    /// "cpu" | "cpu-dense" (every neuron, BLAS GEMMs: the dense baseline) | "gpu"
    std::string kind = "cpu";
    int threads = 0;  ///< CPU threads (0 = all)
    int device = 0;   ///< GPU index
    /// GPU: rebuild LSH tables on a side stream while training goes on with the old ones,
    /// swapped for the new ones when they are done (the functions' own rehashes excepted);
    /// off: the step after a rebuild uses the new tables.
    bool gpu_async_rebuild = false;
    precision_mode precision = precision_mode::fp32;
    /// CPU kernel level; unset = active_isa() (the --isa flag, HSLIDE_ISA or the best level).
    std::optional<isa_level> isa;
};

/// Creates a backend holding `initial` and builds its tables. Pass the state with std::move
/// where the caller no longer needs it: a copy doubles the peak memory of a large model.
/// Throws hslide::error (unsupported) when the kind cannot run in this build or machine.
std::unique_ptr<backend> create_backend(const backend_options& options, model_state initial,
                                        const train_config& train);

}  // namespace hslide
