// The hybrid backend: several backends (a CPU and a GPU; in tests, two CPUs) training one model
// together, Hogbatch style (Ma & Rusu 2020).
//
// Scheduling. The trainer's batches go into one queue of samples. Every worker (a backend on
// its own thread) takes its next batch from the front when it is free, so a fast device never
// waits for a slow one, and no barrier stands at an epoch's end unless the trainer asks for a
// consistent model (evaluation, checkpoint, the end of the run: synchronize()).
//  - hogbatch: every worker keeps its configured batch size (small on the CPU, large on the GPU).
//  - adaptive: batch sizes are re-chosen after every batch from each worker's measured
//    throughput (an exponential average of seconds per sample at its current size), so that
//    worker w makes share s_w of all model updates: b_w ∝ throughput_w / s_w, scaled so the
//    mean batch is the reference batch size, within [min_batch, max_batch].
//    Adaptive also tests whether the slowest worker helps at all (a CPU beside a much faster
//    GPU may cost the GPU more, in contended cores, merges and stale updates, than it adds):
//    while it trains less than `park_below_share` of the samples, the samples per second of
//    all workers together are compared, in windows of wall time, with those of the others
//    while it sits out; unless it adds at least `park_min_gain` of their rate it is parked
//    (no batches: a share of zero) for a while that doubles at each such verdict, then it is
//    tried again (src/hybrid/usefulness_probe.hpp). One that trains fewer than
//    `park_min_gain` of the others' samples cannot add that much: it is parked at once, for
//    the longest rest (a CPU beside a GPU 100x faster). A parked worker merges what it
//    trained before it rests, and takes the shared model before its next batch.
//  - learning rate: a worker with batch b uses lr * sqrt(b / reference_batch) (the square-root
//    rule, which keeps the noise scale of Adam's steps constant across batch sizes).
//
// Model sharing. Each worker trains its own replica (with its own Adam moments and tables). The
// shared model holds parameters only. Every `merge_every` samples (by default: after training
// twice as long as its last merge took) a worker merges: it adds its replica's change since
// its last sync (replica - base) to the shared model, under a lock, and takes back what the
// shared model has that its replica lacks. Changes are added, never overwritten, so no
// worker's work is dropped however the merges interleave; a worker's staleness is the number
// of other merges between its sync and its merge. Merges are per worker and asynchronous: no
// worker waits for another (except for the lock, for the length of one merge).
// synchronize() merges every worker once more, so after it all replicas equal the shared model
// (exports too; predictions synchronize as synchronize() does), except where one worker trains
// alone (below).
// The first layer (the input features' rows) takes part in every `first_layer_merge_every`-th
// merge of a worker only (default 2), and in every merge of synchronize() and of parking: its
// rows' changes wait in the replica meanwhile (replica - base keeps them), and so do the other
// workers' changes to them (taking those back would overwrite the waiting ones); its bias
// vector is merged every time. On Bibtex the first layer is 92% of a merge's rows, and its
// staleness costs far less accuracy than the output layer's (bench/hybrid.md).
// A merge pass over a big layer is bound by memory bandwidth, which one core does not
// saturate: it splits the layer's rows into contiguous ranges, one per thread of the worker's
// (a CPU worker's own threads, idle while it merges; one for a GPU worker, whose feeding thread
// has a core to itself), one thread per `merge_rows_per_thread` rows moved. The merges of
// synchronize() use every worker's threads (all are idle then).
// A worker that trains alone (the only one, or every other one parked) skips its periodic
// merges: nobody would take its changes, so it runs at its own backend's speed (a GPU beside a
// parked CPU pays no merges) until another worker trains again, which makes it merge after
// its batch in flight, or until an export. Its replica is the model meanwhile: if it has
// taken every merge so far and the parked workers have nothing unmerged, synchronize() and
// the predictions merge nothing (the lone worker predicts), so a GPU beside a parked CPU
// pays no merges at an epoch's end either; the parked replicas take the changes when they
// train again.
//
// Row-sparse merges. A merge moves rows, not models (a row: an input feature's layer-0
// weights, or a neuron's weights and bias; layer 0's bias vector goes with every merge):
//  - the worker's backend reports the rows its training changed since the last merge
//    (row_transfer::take_changed_rows; the CPU backend knows them from its update's row grouping,
//    the GPU backend from flags its update sets on the device);
//    every other row of the replica still equals the worker's base, so its change there is
//    zero, and adding only the reported rows is the whole change;
//  - the shared model stamps every row with the version (merge count) that last changed it,
//    and the worker's base holds, per row, the shared row as of its last sync. Under the
//    lock, in one pass per layer: a row the worker changed gets replica - base added and the
//    new version; a row whose version is newer than the worker's sync was changed by others
//    since, and is copied into its base. A row the worker changed that nobody else did is
//    copied (shared = base there, so the sum is the replica's row, exactly) and needs no
//    import; every other changed or newer row goes to the replica: one in host memory that
//    may be written in place (row_transfer::writable_host_state: the CPU backend's) gets it in
//    the same pass, stored with the shared and base rows (a third less merge traffic than copying
//    it after; its bf16 copies follow 64 rows at a time through row_transfer::rows_written,
//    while in cache, so the lock is held for them too); any other imports the rows after the lock,
//    in one call (row_transfer::import_rows; one transfer for a device). Bases and versions move
//    per row, so every change is counted once: an overlap of rows between workers adds both
//    changes, and a row is re-sent to a worker only once per change made by others.
//  - the cost is the rows moved plus an O(rows) scan of 8-byte versions per merge.
//    Where little of the model changes between merges (large output layers: a batch touches
//    its active sets only), that is far less than the model; where most rows change (Bibtex:
//    a 128-sample batch touches 88% of the 1836 input features) it saves the copies of
//    whole-model merges but not the rows themselves (bench/hybrid.md).
//  - a backend that offers no row transfers takes part through whole_model_rows, with
//    whole-model transfers: all its rows count as changed, and it imports the whole model.
//
// Tables. A row import does not rebuild the replica's LSH tables: the CPU backend re-hashes
// the imported rows at its next refresh_selections (it keeps every row's codes and re-hashes only
// rows changed or imported since), and rebuilds come on the trainer's schedule, passed to
// every worker (refresh_selections sets a flag each worker acts on before its next batch). This is
// the freshness single-backend training has: tables are an index for choosing candidate
// neurons, built from the weights of the last rebuild, while the update itself moves rows
// every batch; the rows other workers changed are such updates too. Forward and backward
// always read the current weights, labels are always in the active set, so stale buckets
// change which other neurons are sampled, never the arithmetic. (Whole-model merges rebuilt
// every worker's tables on every merge, which cost O(neurons x L) per merge.) The tables
// cannot take single neurons in and out cheaply: buckets are packed one after another (CSR).
#pragma once

#include "hslide/backend.hpp"
#include "hslide/backend_registry.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hslide {

/// How the hybrid backend sizes each worker's batches.
enum class schedule_policy {
    hogbatch,  ///< fixed per-worker batch sizes
    adaptive,  ///< sizes chosen from measured throughput to meet per-worker update shares
};
schedule_policy parse_schedule_policy(const std::string& name);
const char* to_string(schedule_policy policy);
/// Every policy's name (the argument only picks the overload).
std::vector<std::string> names_of(schedule_policy);

/// One worker of a hybrid backend.
struct hybrid_worker_options {
    backend_options device;     ///< what to create (a kind that can be a hybrid worker, ...)
    uint32_t batch_size = 128;  ///< hogbatch: its batch size; adaptive: the starting size
    double update_share = 1.0;  ///< adaptive: relative share of model updates (normalised)
    /// Tests: seconds of sleep added per sample trained, to make a worker slower.
    double injected_delay_per_sample = 0;
    /// Threads of its merge passes (0 = its CPU threads for a CPU worker, 1 for a GPU worker:
    /// its feeding thread's core, the others being the CPU worker's).
    int merge_threads = 0;
    /// This worker's choice of output neurons, in place of the model's (e.g. top-k on a GPU
    /// worker beside LSH on a CPU one). Sound: the workers train one set of weights, and a
    /// selection only decides which rows a step reads and updates, so each replica may choose
    /// its own; merges move rows whatever chose them. The model (exports, checkpoints) keeps
    /// its own setting. Unset: the model's.
    std::optional<sparsity_mode> output_sparsity;
    /// Makes the device instead of create_backend(device, ...) when set (tests, custom devices).
    std::function<std::unique_ptr<backend>(const model_state&, const train_config&)> make_device;
};

struct hybrid_options {
    std::vector<hybrid_worker_options> workers;
    schedule_policy policy = schedule_policy::adaptive;
    uint32_t reference_batch = 128;  ///< the batch size the learning rate is meant for
    uint32_t min_batch = 8, max_batch = 8192;
    /// Samples a worker trains between merges; 0 = automatic: after each merge, the next
    /// comes once the worker has trained 1 / merge_overhead times the merge's duration (with
    /// 0.5, merges take about a third of its time: every batch or so for small models, whose
    /// accuracy suffers most from stale replicas; rarer for big ones, whose merges cost more).
    uint64_t merge_every = 0;
    double merge_overhead = 0.5;
    /// The first layer (the input features' rows) takes part in every N-th merge of a worker
    /// only, and in every merge of synchronize() and of parking; its changes wait in the
    /// replica meanwhile (deferred, never dropped). 1 = every merge. On Bibtex the first
    /// layer is 92% of a merge's rows and its staleness costs little accuracy (bench/hybrid.md).
    uint32_t first_layer_merge_every = 2;
    /// A merge pass over a layer uses one of its worker's merge threads per this many rows it
    /// moves (fewer would cost more in starting threads than they save).
    uint32_t merge_rows_per_thread = 1024;
    /// Adaptive: check whether the slowest worker helps while it trains less than this share
    /// of the samples (0 = never: no worker is parked).
    double park_below_share = 0.25;
    double park_min_gain = 0.05;     ///< it must add this fraction of the others' samples/s
    double park_window_seconds = 2;  ///< length of each measuring window
};

/// Creates the workers' backends from `initial` (each gets a copy) and starts their threads.
/// Throws hslide::error for an empty worker list, bad bounds, or a worker that cannot be made.
std::unique_ptr<backend> create_hybrid_backend(const hybrid_options& options,
                                               const model_state& initial,
                                               const train_config& train);

/// The CPU threads of each worker of a hybrid (by kind: a CPU or a GPU one): a CPU worker with
/// requested[i] > 0 gets that many; the CPU workers given 0 share evenly, at least one each, the
/// `cores` left after the explicit counts and one core for each GPU worker's feeding thread
/// (it stages batches and waits on its stream). GPU workers' entries are 0.
std::vector<int> split_worker_threads(const std::vector<backend_kind>& kinds,
                                      const std::vector<int>& requested, int cores);

/// Adds the change `replica - base` to `shared`, weights and biases of every layer
/// (the merge rule; all three must have the same shapes).
void add_replica_change(model_state& shared, const model_state& replica, const model_state& base);

}  // namespace hslide
