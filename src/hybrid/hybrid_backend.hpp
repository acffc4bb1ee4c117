// The hybrid backend's class (see hslide/hybrid.hpp for the scheduling and merge design):
// the scheduling in hybrid_backend.cpp, the merges in hybrid_merge.cpp. Private to src/hybrid:
// everyone else makes one with create_hybrid_backend.
#pragma once

#include "hslide/clock.hpp"
#include "hslide/hybrid.hpp"
#include "hslide/row_transfer.hpp"
#include "hslide/worker_stats.hpp"
#include "hybrid/usefulness_probe.hpp"

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hslide::detail {

/// CPU seconds the calling thread has run.
inline double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// Several workers' backends training one model (hslide/hybrid.hpp); it offers their
/// statistics (worker_stats_source), and no row transfers of its own.
class hybrid_backend final : public backend, public worker_stats_source {
  public:
    hybrid_backend(const hybrid_options& options, const model_state& initial,
                   const train_config& train);
    ~hybrid_backend() override;

    step_report train_batch(const batch_view& batch, float learning_rate) override;
    void refresh_selections(bool new_functions) override;
    void predict(const batch_view& batch, uint32_t k, scoring_mode scoring, uint32_t* labels,
                 float* scores) override;
    void export_state(model_state& out, bool with_optimizer) const override;
    void import_state(const model_state& in, bool with_optimizer) override;
    backend_info info() const override;
    step_report synchronize() override;
    std::vector<worker_stats> take_worker_stats() override;

  private:
    struct queued_sample {
        uint32_t row;
        float learning_rate;
    };
    struct worker {
        hybrid_worker_options options;
        std::string name;
        size_t index = 0;
        std::unique_ptr<backend> device;
        row_transfer* rows = nullptr;  // device's row_transfer, or whole_model over it
        std::unique_ptr<row_transfer> whole_model;
        model_state base;          // per row: the shared row when it last took it (its last sync)
        model_state staging;       // exported rows of a replica not held in host memory
        row_sets changed, pulled;  // rows of its last merge: changes added, rows taken back
        row_sets chunk;            // rows of one layer imported at once
        std::vector<uint64_t> synced;  // per layer: the version its base rows are up to date with
        std::vector<uint32_t> first_layer_waiting;  // first-layer rows changed, merge deferred
        uint32_t merges_without_first = 0;          // merges since its first layer last took part
        int merge_threads = 1;
        std::vector<std::vector<uint32_t>> merge_parts;  // a parallel merge's rows, per thread
        uint32_t batch_size = 0;
        double seconds_per_sample = 0;  // exponential average; 0 = not measured yet
        double trained_seconds = 0;     // in train_batch, over the whole run
        uint64_t trained_samples = 0;
        uint64_t since_merge = 0;
        uint64_t merge_interval = 0;  // samples
        bool rebuild_pending = false, rehash_pending = false;
        bool training = false;        // in a batch (its merge included)
        bool was_parked = false;      // as the probe last said
        bool resync_pending = false;  // unparked: take the shared model before training
        bool merge_pending = false;   // another worker was unparked: merge after this batch
        worker_stats window;
        double staleness_sum = 0;
        std::thread thread;

        /// Whether its replica holds changes the shared model lacks (trained or deferred since
        /// its last merge).
        bool unmerged() const { return since_merge > 0 || !first_layer_waiting.empty(); }
    };

    void run_worker(worker& w);
    /// After a batch of w: whether w merges now (its interval is up and another worker trains,
    /// or one was just unparked: then `full`, the first layer too, for it to catch up).
    bool should_merge(worker& w, bool& full);
    /// Adds w's change to the shared model and makes the result w's replica (w idle). The
    /// first layer takes part in every first_layer_merge_every-th merge, or when `full`. The
    /// passes use up to `threads` threads (0: w's merge threads).
    void merge(worker& w, bool full, int threads = 0);
    /// Under shared_mu_: copies into w's base, and lists in w.pulled, every row changed in the
    /// shared model since w's last sync; w is then synced at version_ (no merge deferred).
    void pull_locked(worker& w);
    /// Under shared_mu_, merge `v` of w, layer l: adds the change of w's replica (`mine`) in
    /// `rows` (every row when null) to the shared layer, stamps those rows with v, and takes
    /// back into w's base (listing them in w.pulled[l]) the rows w's replica lacks.
    /// With `replica` (the writable replica layer, `mine` itself), those rows are also written
    /// into it and reported with rows_written chunk by chunk, while in cache; the seconds the
    /// reports took are returned.
    double merge_layer_locked(worker& w, size_t l, const layer_state& mine,
                              const std::vector<uint32_t>* rows, uint64_t v, layer_state* replica,
                              int max_threads);
    /// Under shared_mu_: the first layer's bias vector, merged whole (part of every merge).
    void merge_first_layer_bias_locked(worker& w, const layer_state& mine, layer_state* replica);
    /// Waits until the queue is empty and every worker idle; rethrows a worker's failure.
    void drain(std::unique_lock<std::mutex>& lock);
    /// drain, and every worker's held-back report; then, unless `lazy` finds the model in one
    /// replica, merge every worker: all replicas equal the shared model. The model is one
    /// replica's when its worker alone trained since it last took every merge and the others
    /// are parked with nothing of theirs unmerged (a GPU beside a parked CPU): the merges wait
    /// (for another worker to train again, for an export) and that worker is returned; else
    /// nullptr.
    worker* synchronize_models(bool lazy);
    /// After drain: the worker whose replica is the model, as synchronize_models(true) defines
    /// it, or nullptr. `caught_up`: per worker, whether the sync just moved deferred rows.
    worker* sole_trainer(const std::vector<char>& caught_up);
    void choose_batch_sizes();
    /// Under mu_, after a batch: the usefulness probe's step; true when it unparked a worker
    /// (the caller wakes the workers).
    bool run_probe();
    size_t queue_capacity() const;
    double now() const { return seconds_since(start_); }

    hybrid_options options_;
    std::vector<std::unique_ptr<worker>> workers_;

    mutable std::mutex mu_;  // the queue, pending report, flags, statistics
    std::condition_variable work_ready_, work_done_;
    std::deque<queued_sample> queue_;
    const dataset* data_ = nullptr;
    size_t busy_ = 0;
    bool stop_ = false;
    std::exception_ptr failure_;
    step_report pending_;
    const clock_type::time_point start_ = clock_type::now();
    clock_type::time_point window_start_ = start_;
    // A statistics window starts with its first queued batch: the caller's time between
    // windows (evaluation, checkpoints, setup) is not the workers' idle time. Where the
    // workers still had work when the last window was taken, the next one starts then.
    bool window_open_ = false;
    usefulness_probe probe_;
    bool idle_ = false;  // no queued work and no worker busy, since idle_since_
    double idle_since_ = 0;

    std::mutex shared_mu_;  // the shared model, its version and its rows' versions
    model_state shared_;
    model_config config_;   // the model's own (workers may choose their output neurons otherwise)
    uint64_t version_ = 0;  // merges (and imports) so far
    std::vector<std::vector<uint64_t>>
        row_version_;  // per layer and row: last version to change it
};

}  // namespace hslide::detail
