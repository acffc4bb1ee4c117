// Per-worker statistics of a multi-device backend (the hybrid one), and the small optional
// interface through which such a backend hands them out (backend::take_worker_stats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// One worker of a multi-device backend (the hybrid one), over a window of its work.
struct worker_stats {
    std::string name;         ///< e.g. "cpu0" or "gpu0": the worker's backend kind and index
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

/// Offered by a backend made of workers (backend::offer_worker_stats); a backend that does
/// not offer it has no workers, and backend::take_worker_stats returns nothing for it.
class worker_stats_source {
  public:
    virtual ~worker_stats_source() = default;
    /// Per-worker statistics since the last call, and a new window for each worker.
    virtual std::vector<worker_stats> take_worker_stats() = 0;
};

}  // namespace hslide
