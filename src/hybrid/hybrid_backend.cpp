// The hybrid backend (see hybrid.hpp for the scheduling and merge design).
#include "hslide/hybrid.hpp"

#include "common/util/enum_names.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/row_transfer.hpp"
#include "hybrid/usefulness_probe.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <iterator>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

namespace hslide {

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}
/// CPU seconds the calling thread has run.
double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

constexpr std::pair<const char*, schedule_policy> policy_names[] = {
    {"hogbatch", schedule_policy::hogbatch}, {"adaptive", schedule_policy::adaptive}};

void copy_parameters(model_state& dst, const model_state& src) {
    for (size_t l = 0; l < src.layers.size(); ++l) {
        dst.layers[l].weights = src.layers[l].weights;
        dst.layers[l].bias = src.layers[l].bias;
    }
}

/// s += m - b, then b = s, over n floats (three distinct rows: restrict lets it vectorise
/// without overlap checks).
inline void add_change_and_take(float* __restrict s, const float* __restrict m, float* __restrict b,
                                size_t n) {
    for (size_t i = 0; i < n; ++i) {
        s[i] += m[i] - b[i];
        b[i] = s[i];
    }
}

/// s += m - b, then b = m = s: the same step for a replica written in place.
inline void add_change_and_give(float* __restrict s, float* __restrict m, float* __restrict b,
                                size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const float merged = s[i] + (m[i] - b[i]);
        s[i] = merged;
        b[i] = merged;
        m[i] = merged;
    }
}

/// shared.row(r) += replica.row(r) - base.row(r) for r in `rows` (every row when null), with
/// the biases that go with them (layer 0's whole bias vector). Rows are added and copied with
/// their padding (zero in every replica), a whole number of cache lines each.
void add_row_changes(layer_state& s, const layer_state& r, const layer_state& b, size_t l,
                     const std::vector<uint32_t>* rows) {
    HSLIDE_ASSERT(s.weights.size() == r.weights.size() && s.weights.size() == b.weights.size());
    HSLIDE_ASSERT(s.bias.size() == r.bias.size() && s.bias.size() == b.bias.size());
    auto add_row = [&](uint32_t row) {
        float* sw = s.row(row);
        const float* rw = r.row(row);
        const float* bw = b.row(row);
        for (uint32_t i = 0; i < s.stride; ++i) sw[i] += rw[i] - bw[i];
        if (l > 0) s.bias[row] += r.bias[row] - b.bias[row];
    };
    if (rows) {
        for (uint32_t row : *rows) {
            HSLIDE_ASSERT(row < s.rows);
            add_row(row);
        }
    } else {
        for (uint32_t row = 0; row < s.rows; ++row) add_row(row);
    }
    if (l == 0)
        for (size_t i = 0; i < s.bias.size(); ++i) s.bias[i] += r.bias[i] - b.bias[i];
}

detail::usefulness_settings probe_settings(const hybrid_options& o) {
    detail::usefulness_settings s;
    s.probe_share = o.policy == schedule_policy::adaptive ? o.park_below_share : 0;
    s.min_gain = o.park_min_gain;
    s.window_seconds = o.park_window_seconds;
    return s;
}

class hybrid_backend final : public backend, public worker_stats_source {
  public:
    hybrid_backend(const hybrid_options& options, const model_state& initial,
                   const train_config& train);
    ~hybrid_backend() override;

    step_report train_batch(const batch_view& batch, float learning_rate) override;
    void rebuild_tables(bool new_functions) override;
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
    /// drain, then merge every worker: all replicas equal the shared model.
    void synchronize_models();
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
    detail::usefulness_probe probe_;
    bool idle_ = false;  // no queued work and no worker busy, since idle_since_
    double idle_since_ = 0;

    std::mutex shared_mu_;  // the shared model, its version and its rows' versions
    model_state shared_;
    uint64_t version_ = 0;  // merges (and imports) so far
    std::vector<std::vector<uint64_t>>
        row_version_;  // per layer and row: last version to change it
};

hybrid_backend::hybrid_backend(const hybrid_options& options, const model_state& initial,
                               const train_config& train)
    : options_(options), probe_(probe_settings(options), options.workers.size()) {
    HSLIDE_CHECK(!options_.workers.empty(), "the hybrid backend needs at least one worker");
    HSLIDE_CHECK(options_.min_batch >= 1 && options_.min_batch <= options_.max_batch,
                 "hybrid batch bounds must satisfy 1 <= min ({}) <= max ({})", options_.min_batch,
                 options_.max_batch);
    HSLIDE_CHECK(options_.reference_batch >= 1, "the reference batch size must be positive");
    HSLIDE_CHECK(options_.merge_every > 0 || options_.merge_overhead > 0,
                 "an automatic merge interval needs a positive merge overhead");
    HSLIDE_CHECK(options_.first_layer_merge_every >= 1,
                 "the first layer's merge period must be at least 1 (every merge)");
    HSLIDE_CHECK(options_.merge_rows_per_thread >= 1, "merge rows per thread must be positive");
    shared_ = initial.parameters();
    for (const layer_state& layer : shared_.layers) row_version_.emplace_back(layer.rows, 0);
    offer_worker_stats(this);
    std::vector<int> kind_count(backend_registry().size(), 0);
    for (const hybrid_worker_options& wo : options_.workers) {
        HSLIDE_CHECK(wo.update_share > 0, "every hybrid worker's update share must be positive");
        HSLIDE_CHECK(wo.batch_size >= 1, "every hybrid worker's batch size must be positive");
        HSLIDE_CHECK(wo.merge_threads >= 0, "a hybrid worker's merge threads cannot be negative");
        auto w = std::make_unique<worker>();
        w->options = wo;
        const backend_capabilities& caps = backend_entry_of(wo.device.kind).caps;
        w->name =
            fmt::format("{}{}", to_string(wo.device.kind), kind_count[size_t(wo.device.kind)]++);
        w->index = workers_.size();
        try {
            w->device = wo.make_device ? wo.make_device(initial, train)
                                       : create_backend(wo.device, initial, train);
        } catch (const error& e) {
            const bool no_gpu = caps.needs_gpu && e.kind() == error_kind::unsupported;
            throw error(
                e.kind(),
                fmt::format("hybrid worker {}: {}{}", w->name, e.what(),
                            no_gpu ? " (--workers cpu,cpu trains with CPU workers only)" : ""));
        }
        HSLIDE_CHECK(w->device != nullptr, "hybrid worker {} could not be created", w->name);
        w->rows = &rows_of(*w->device, w->whole_model);
        w->base = initial.parameters();
        w->batch_size = std::clamp(wo.batch_size, options_.min_batch, options_.max_batch);
        w->merge_interval = options_.merge_every ? options_.merge_every : 1;
        w->synced.assign(shared_.layers.size(), 0);
        w->merge_threads = wo.merge_threads > 0    ? wo.merge_threads
                           : caps.needs_gpu        ? 1
                           : wo.device.threads > 0 ? wo.device.threads
                                                   : omp_get_max_threads();
        w->window.name = w->name;
        workers_.push_back(std::move(w));
    }
    for (auto& w : workers_) w->thread = std::thread([this, &w] { run_worker(*w); });
}

hybrid_backend::~hybrid_backend() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        queue_.clear();
    }
    work_ready_.notify_all();
    for (auto& w : workers_)
        if (w->thread.joinable()) w->thread.join();
}

size_t hybrid_backend::queue_capacity() const {
    // Enough queued that every worker finds a full batch when it comes back.
    size_t sum = 0;
    for (const auto& w : workers_) sum += w->batch_size;
    return 2 * sum;
}

void hybrid_backend::run_worker(worker& w) {
    std::vector<uint32_t> rows;
    for (;;) {
        float lr = 0;
        bool rebuild = false, rehash = false, resync = false;
        {
            std::unique_lock<std::mutex> lock(mu_);
            // After a failure nothing more is trained: the caller gets the error instead.
            work_ready_.wait(lock, [&] {
                return stop_ || (!queue_.empty() && !failure_ && !probe_.parked(w.index));
            });
            if (stop_) return;
            const size_t n = std::min<size_t>(w.batch_size, queue_.size());
            rows.clear();
            lr = queue_.front().learning_rate;
            for (size_t i = 0; i < n; ++i) rows.push_back(queue_[i].row);
            queue_.erase(queue_.begin(), queue_.begin() + ptrdiff_t(n));
            rebuild = std::exchange(w.rebuild_pending, false);
            rehash = std::exchange(w.rehash_pending, false);
            resync = std::exchange(w.resync_pending, false);
            ++busy_;
            w.training = true;
        }
        work_done_.notify_all();  // room in the queue

        step_report report;
        const auto t0 = clock_type::now();
        bool woke = false;
        try {
            // Back from parking: its replica missed the others' merges meanwhile.
            if (resync) merge(w, /*full=*/true);
            if (rebuild || rehash) {
                const auto tr = clock_type::now();
                w.device->rebuild_tables(rehash);
                report.times.rebuild += seconds_since(tr);
            }
            const float scale = std::sqrt(float(rows.size()) / float(options_.reference_batch));
            const auto tt = clock_type::now();
            const double cpu_train = thread_cpu_seconds();
            report +=
                w.device->train_batch({data_, rows.data(), uint32_t(rows.size())}, lr * scale);
            if (w.options.injected_delay_per_sample > 0)
                std::this_thread::sleep_for(std::chrono::duration<double>(
                    w.options.injected_delay_per_sample * double(rows.size())));
            w.since_merge += rows.size();
            bool full_merge = false;
            const bool merge_now = should_merge(w, full_merge);
            // A backend that returns before its step is done (the GPU's) finishes it here, so
            // that the step's time counts as training, not as the merge's.
            if (merge_now) report += w.device->synchronize();
            const double train_seconds = seconds_since(tt);
            const double train_cpu = thread_cpu_seconds() - cpu_train;
            if (merge_now) merge(w, full_merge);

            bool parked_with_changes = false;
            {
                std::lock_guard<std::mutex> lock(mu_);
                const double per_sample = train_seconds / double(rows.size());
                w.trained_seconds += train_seconds;
                w.trained_samples += rows.size();
                w.seconds_per_sample = w.seconds_per_sample == 0
                                           ? per_sample
                                           : 0.7 * w.seconds_per_sample + 0.3 * per_sample;
                worker_stats& s = w.window;
                s.samples += rows.size();
                s.batches += 1;
                // A batch that began before its window (taken while it ran) counts from the
                // window's start.
                s.busy_seconds += seconds_since(std::max(t0, window_start_));
                s.train_cpu_seconds += train_cpu;
                const uint32_t size = uint32_t(rows.size());
                s.batch_min = s.batches == 1 ? size : std::min(s.batch_min, size);
                s.batch_max = std::max(s.batch_max, size);
                s.batch_last = size;
                pending_ += report;
                w.training = false;
                probe_.on_batch(w.index, rows.size(), now());
                if (options_.policy == schedule_policy::adaptive) {
                    woke = run_probe();
                    choose_batch_sizes();
                }
                parked_with_changes =
                    probe_.parked(w.index) && (w.since_merge > 0 || !w.first_layer_waiting.empty());
            }
            // A parked worker's changes reach the others now, not when it is back.
            if (parked_with_changes) merge(w, /*full=*/true);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!failure_) failure_ = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            w.training = false;
            --busy_;
            if (busy_ == 0 && queue_.empty()) {
                idle_ = true;
                idle_since_ = now();
            }
        }
        if (woke) work_ready_.notify_all();
        work_done_.notify_all();
    }
}

bool hybrid_backend::should_merge(worker& w, bool& full) {
    std::lock_guard<std::mutex> lock(mu_);
    full = false;
    if (std::exchange(w.merge_pending, false)) {
        full = true;
        return w.since_merge > 0 || !w.first_layer_waiting.empty();
    }
    if (w.since_merge < w.merge_interval) return false;
    // Alone (the only worker, or every other one parked), nobody would take its changes: its
    // merges wait until another worker trains again or the model is synchronised. They are
    // deferred, never dropped (a merge adds all the change since the last one), and the worker
    // trains at its own backend's speed, which is what the usefulness probe must compare with.
    for (const auto& other : workers_)
        if (other.get() != &w && !probe_.parked(other->index)) return true;
    return false;
}

bool hybrid_backend::run_probe() {
    std::vector<bool> busy(workers_.size());
    for (const auto& w : workers_) busy[w->index] = w->training;
    if (!probe_.update(now(), busy)) return false;
    bool woke = false;
    for (auto& w : workers_) {
        const bool parked = probe_.parked(w->index);
        if (w->was_parked && !parked) {
            w->resync_pending = true;
            woke = true;
            // The others may have deferred their merges while it was parked (should_merge):
            // they merge after their batch in flight, so it catches up at its next sync.
            for (auto& other : workers_)
                if (other.get() != w.get()) other->merge_pending = true;
        }
        w->was_parked = parked;
    }
    for (const detail::usefulness_verdict& v : probe_.take_verdicts()) {
        const std::string& name = workers_[v.worker]->name;
        if (v.helps)
            spdlog::info("hybrid: {} helps: {:.0f} samples/s with it, {:.0f} without; kept", name,
                         v.rate_all, v.rate_without);
        else
            spdlog::info(
                "hybrid: {} does not help: {:.0f} samples/s with it, {:.0f} without; parked "
                "for {:.1f} s",
                name, v.rate_all, v.rate_without, v.parked_for_seconds);
    }
    return woke;
}

void hybrid_backend::choose_batch_sizes() {
    // Worker w makes throughput_w / b_w updates a second; b_w = c * throughput_w / share_w gives
    // each the update share it asks for, and c makes the mean batch the reference size.
    // Parked workers take no batches and have no share.
    double sum = 0, active_share = 0;
    size_t active = 0;
    for (const auto& w : workers_) {
        if (probe_.parked(w->index)) continue;
        if (w->seconds_per_sample <= 0) return;  // not every worker measured yet
        active_share += w->options.update_share;
        ++active;
    }
    for (const auto& w : workers_)
        if (!probe_.parked(w->index))
            sum += (1.0 / w->seconds_per_sample) / (w->options.update_share / active_share);
    const double total = double(options_.reference_batch) * double(active);
    for (auto& w : workers_) {
        if (probe_.parked(w->index)) continue;
        const double want =
            total * (1.0 / w->seconds_per_sample) / (w->options.update_share / active_share) / sum;
        w->batch_size = uint32_t(
            std::clamp(want, double(options_.min_batch), double(options_.max_batch)) + 0.5);
    }
}

void hybrid_backend::merge(worker& w, bool full, int threads) {
    const auto t0 = clock_type::now();
    const double cpu0 = thread_cpu_seconds();
    // The rows the replica changed since its last merge: only their change is added (every
    // other row of the replica still equals its base, so its change there is zero).
    const bool tracked = w.rows->take_changed_rows(w.changed);
    HSLIDE_ASSERT(tracked || w.first_layer_waiting.empty());
    HSLIDE_ASSERT(!tracked || w.changed.size() == shared_.layers.size());
    // The first layer's rows wait in the replica through the merges it skips: they stay
    // changed (replica != base), so the merge that includes the layer adds all of it.
    const bool defer_first = tracked && !full && options_.first_layer_merge_every > 1 &&
                             shared_.layers.size() > 1 &&
                             ++w.merges_without_first < options_.first_layer_merge_every;
    if (tracked) {
        std::vector<uint32_t>& waiting = w.first_layer_waiting;
        std::vector<uint32_t> all;
        all.reserve(waiting.size() + w.changed[0].size());
        std::set_union(waiting.begin(), waiting.end(), w.changed[0].begin(), w.changed[0].end(),
                       std::back_inserter(all));
        if (defer_first) {
            waiting = std::move(all);
            w.changed[0].clear();  // nor exported (a replica off the host)
        } else {
            w.changed[0] = std::move(all);
            waiting.clear();
            w.merges_without_first = 0;
        }
    }
    // A host-resident replica is read in place (the worker is between batches), and written in
    // place where the backend allows it; others export their rows and import the merge's.
    model_state* in_place = tracked ? w.rows->writable_host_state() : nullptr;
    const model_state* held = in_place ? in_place : w.device->host_state();
    if (!held) {
        if (w.staging.layers.empty()) w.staging = w.base;  // the shapes, once
        if (tracked)
            w.rows->export_rows(w.changed, w.staging);
        else
            w.device->export_state(w.staging, /*with_optimizer=*/false);
    }
    const model_state& mine = held ? *held : w.staging;
    HSLIDE_ASSERT(mine.layers.size() == shared_.layers.size());
    w.pulled.resize(shared_.layers.size());
    uint64_t staleness = 0, rows_merged = 0;
    const auto t_wait = clock_type::now();
    double wait = 0, import = 0;
    {
        std::lock_guard<std::mutex> lock(shared_mu_);
        wait = seconds_since(t_wait);
        staleness = version_ - w.synced.back();
        const uint64_t v = ++version_;
        for (size_t l = 0; l < shared_.layers.size(); ++l) {
            if (l == 0 && defer_first) {
                // Its rows wait, and not even the others' rows come back (they would
                // overwrite the replica's own changes): the rows stay synced at the layer's
                // last merge. Its bias vector, which every row transfer carries whole, is
                // merged as always.
                merge_first_layer_bias_locked(w, mine.layers[0],
                                              in_place ? &in_place->layers[0] : nullptr);
                w.pulled[0].clear();
                continue;
            }
            const std::vector<uint32_t>* rows = tracked ? &w.changed[l] : nullptr;
            rows_merged += rows ? rows->size() : shared_.layers[l].rows;
            import += merge_layer_locked(w, l, mine.layers[l], rows, v,
                                         in_place ? &in_place->layers[l] : nullptr,
                                         threads > 0 ? threads : w.merge_threads);
            w.synced[l] = v;
        }
    }
    const auto t_import = clock_type::now();
    if (in_place) {
        // Written during the pass.
    } else if (tracked) {
        w.rows->import_rows(w.base, w.pulled);
        import = seconds_since(t_import);
    } else {
        // The whole-model fallback; the worker keeps its own hash functions and step count.
        w.base.hash_seeds = mine.hash_seeds;
        w.base.adam_step = mine.adam_step;
        w.device->import_state(w.base, /*with_optimizer=*/false);
        import = seconds_since(t_import);
    }
    uint64_t rows_pulled = 0;
    for (const auto& rows : w.pulled) rows_pulled += rows.size();
    w.since_merge = 0;
    const double cost = seconds_since(t0);
    const double cpu = thread_cpu_seconds() - cpu0;
    std::lock_guard<std::mutex> lock(mu_);
    if (options_.merge_every == 0 && w.seconds_per_sample > 0)
        w.merge_interval = uint64_t(
            std::clamp(cost / (options_.merge_overhead * w.seconds_per_sample), 1.0, 1e12));
    w.window.merges += 1;
    w.window.merge_seconds += cost;
    w.window.merge_cpu_seconds += cpu;
    w.window.merge_wait_seconds += wait;
    w.window.merge_import_seconds += import;
    w.window.rows_merged += rows_merged;
    w.window.rows_pulled += rows_pulled;
    w.staleness_sum += double(staleness);
    w.window.staleness_max = std::max(w.window.staleness_max, staleness);
}

void hybrid_backend::merge_first_layer_bias_locked(worker& w, const layer_state& m,
                                                   layer_state* replica) {
    // One vector over the layer's neurons: added whole, taken back whole.
    layer_state& s = shared_.layers[0];
    layer_state& b = w.base.layers[0];
    HSLIDE_ASSERT(s.bias.size() == m.bias.size() && s.bias.size() == b.bias.size());
    for (size_t i = 0; i < s.bias.size(); ++i) {
        s.bias[i] += m.bias[i] - b.bias[i];
        b.bias[i] = s.bias[i];
    }
    if (replica) replica->bias = s.bias;
}

double hybrid_backend::merge_layer_locked(worker& w, size_t l, const layer_state& m,
                                          const std::vector<uint32_t>* rows, uint64_t v,
                                          layer_state* replica, int max_threads) {
    // One pass over the layer's rows, each read and written while it is in cache (a Bibtex
    // batch touches most rows of the model, so the passes, not the row counts, set the cost).
    layer_state& s = shared_.layers[l];
    layer_state& b = w.base.layers[l];
    HSLIDE_ASSERT(s.weights.size() == m.weights.size() && s.weights.size() == b.weights.size());
    HSLIDE_ASSERT(s.bias.size() == m.bias.size() && s.bias.size() == b.bias.size());
    HSLIDE_ASSERT(!replica || replica == &m);
    if (l == 0) merge_first_layer_bias_locked(w, m, replica);
    std::vector<uint64_t>& version = row_version_[l];
    const uint64_t synced = w.synced[l];
    const size_t width = s.stride;  // whole padded rows (the padding is zero everywhere)
    // Merges rows [r0, r1): `next` is the position in *rows (ascending) of the first of them;
    // the rows that go to the replica are appended to `out`, and `written` is called after
    // each one appended. Returns how many of *rows the range held.
    auto merge_range = [&](uint32_t r0, uint32_t r1, size_t next, std::vector<uint32_t>& out,
                           auto&& written) {
        const size_t first = next;
        for (uint32_t r = r0; r < r1; ++r) {
            bool changed = true;
            if (rows) {
                changed = next < rows->size() && (*rows)[next] == r;
                next += changed;
            }
            // Its base holds the shared row exactly when no merge changed it since w's sync.
            const bool others = version[r] > synced;
            float* sw = s.row(r);
            float* bw = b.row(r);
            if (changed && !others) {
                // shared == base here, so shared + (mine - base) is mine: copied exactly, and
                // the replica, which holds it already, needs no import of this row.
                const float* mw = m.row(r);
                std::memcpy(sw, mw, width * sizeof(float));
                std::memcpy(bw, mw, width * sizeof(float));
                if (l > 0) s.bias[r] = b.bias[r] = m.bias[r];
                version[r] = v;
            } else if (changed) {
                if (l > 0) {
                    s.bias[r] += m.bias[r] - b.bias[r];
                    b.bias[r] = s.bias[r];
                }
                if (replica) {
                    add_change_and_give(sw, replica->row(r), bw, width);
                    if (l > 0) replica->bias[r] = s.bias[r];
                } else {
                    add_change_and_take(sw, m.row(r), bw, width);
                }
                version[r] = v;
                out.push_back(r);
                written();
            } else if (others) {
                std::memcpy(bw, sw, width * sizeof(float));
                if (l > 0) b.bias[r] = s.bias[r];
                if (replica) {
                    std::memcpy(replica->row(r), sw, width * sizeof(float));
                    if (l > 0) replica->bias[r] = s.bias[r];
                }
                out.push_back(r);
                written();
            }
        }
        return next - first;
    };

    std::vector<uint32_t>& pulled = w.pulled[l];
    pulled.clear();
    double written_seconds = 0;
    size_t written = 0;  // pulled[0, written) are reported to the replica's backend
    auto report_written = [&] {
        if (written == pulled.size()) return;
        const auto t0 = clock_type::now();
        w.chunk.resize(shared_.layers.size());
        for (auto& c : w.chunk) c.clear();
        w.chunk[l].assign(pulled.begin() + ptrdiff_t(written), pulled.end());
        w.rows->rows_written(w.chunk);
        written = pulled.size();
        written_seconds += seconds_since(t0);
    };
    const size_t n_rows = rows ? rows->size() : s.rows;
    const int threads =
        int(std::clamp<size_t>(n_rows / options_.merge_rows_per_thread, 1, size_t(max_threads)));
    size_t consumed = 0;
    if (threads == 1) {
        // One pass: the bf16 copies of the replica's new rows are rounded 64 rows at a time,
        // while the rows are in cache.
        constexpr size_t written_chunk = 64;  // rows: 64 KiB at 256 floats a row
        consumed = merge_range(0, s.rows, 0, pulled, [&] {
            if (replica && pulled.size() - written >= written_chunk) report_written();
        });
    } else {
        // Contiguous row ranges, one per thread (a big layer's merge is bound by memory
        // bandwidth, which one core does not saturate); their rows to the replica are listed
        // in order after, and the backend refreshes them in one call (in parallel itself).
        auto range_begin = [&](int t) {
            return uint32_t(uint64_t(s.rows) * uint64_t(t) / uint64_t(threads));
        };
        std::vector<std::vector<uint32_t>>& parts = w.merge_parts;
        parts.resize(size_t(threads));
        for (int t = 0; t < threads; ++t) {
            // Room for every row of the range: nothing allocates inside the parallel region
            // (an exception there would end the process).
            parts[size_t(t)].clear();
            parts[size_t(t)].reserve(range_begin(t + 1) - range_begin(t));
        }
        // A loop over the ranges, not one range per thread: the team may be smaller than asked
        // (OMP_THREAD_LIMIT, OMP_DYNAMIC), and every range must be merged.
#pragma omp parallel for schedule(static, 1) num_threads(threads) reduction(+ : consumed)
        for (int t = 0; t < threads; ++t) {
            const uint32_t r0 = range_begin(t), r1 = range_begin(t + 1);
            const size_t next =
                rows ? size_t(std::lower_bound(rows->begin(), rows->end(), r0) - rows->begin()) : 0;
            consumed += merge_range(r0, r1, next, parts[size_t(t)], [] {});
        }
        for (const auto& part : parts) pulled.insert(pulled.end(), part.begin(), part.end());
    }
    HSLIDE_ASSERT(!rows || consumed == rows->size());  // ascending, in range, each once
    if (replica) report_written();
    return written_seconds;
}

void hybrid_backend::pull_locked(worker& w) {
    // A row whose version is at most w's synced version was last changed by a merge w has
    // already seen (versions are given and rows copied under this lock): its base holds it.
    // The scan is O(rows), 8 bytes a row, against O(changed rows x width) for the copies.
    // Rows taken back would overwrite unmerged changes.
    HSLIDE_ASSERT(w.first_layer_waiting.empty());
    w.pulled.resize(shared_.layers.size());
    for (size_t l = 0; l < shared_.layers.size(); ++l) {
        const layer_state& s = shared_.layers[l];
        layer_state& b = w.base.layers[l];
        const std::vector<uint64_t>& version = row_version_[l];
        std::vector<uint32_t>& pulled = w.pulled[l];
        pulled.clear();
        for (uint32_t r = 0; r < s.rows; ++r) {
            if (version[r] <= w.synced[l]) continue;
            std::memcpy(b.row(r), s.row(r), s.stride * sizeof(float));
            if (l > 0) b.bias[r] = s.bias[r];
            pulled.push_back(r);
        }
        if (l == 0) b.bias = s.bias;
    }
    std::fill(w.synced.begin(), w.synced.end(), version_);
}

void hybrid_backend::drain(std::unique_lock<std::mutex>& lock) {
    work_done_.wait(lock, [&] { return (queue_.empty() && busy_ == 0) || failure_; });
    if (failure_) {
        // The failed batch's samples are gone: the run cannot go on consistently.
        queue_.clear();
        std::rethrow_exception(failure_);
    }
}

void hybrid_backend::synchronize_models() {
    {
        std::unique_lock<std::mutex> lock(mu_);
        drain(lock);
    }
    // A worker's backend may itself hold back its last batch's report (the GPU backend
    // returns each step's report with the next one). Rows a backend brings up to date now
    // (catch-up Adam) are changes of its own, to merge like any other, even where it merged
    // after its last batch.
    std::vector<char> caught_up(workers_.size(), 0);
    for (size_t i = 0; i < workers_.size(); ++i) {
        const step_report last = workers_[i]->device->synchronize();
        caught_up[i] = workers_[i]->rows->complete_deferred_updates();
        std::lock_guard<std::mutex> lock(mu_);
        pending_ += last;
    }
    // Every worker is idle: merge each that trained since its last merge, then give every
    // worker the rows changed since its sync, so that all replicas equal the shared model.
    // The merges have every worker's threads (a worker that trained alone, deferring its
    // merges, brings the changes of many batches).
    int threads = 0;
    for (const auto& w : workers_) threads += w->merge_threads;
    for (size_t i = 0; i < workers_.size(); ++i) {
        worker& w = *workers_[i];
        if (w.since_merge > 0 || !w.first_layer_waiting.empty() || caught_up[i])
            merge(w, /*full=*/true, threads);
    }
    for (auto& w : workers_) {
        {
            std::lock_guard<std::mutex> lock(shared_mu_);
            if (std::all_of(w->synced.begin(), w->synced.end(),
                            [&](uint64_t v) { return v == version_; }))
                continue;
            pull_locked(*w);
        }
        // Rows, even for a backend without row tracking: its default import_rows keeps the
        // replica's own hash functions and step count.
        w->rows->import_rows(w->base, w->pulled);
    }
}

step_report hybrid_backend::train_batch(const batch_view& batch, float learning_rate) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    std::unique_lock<std::mutex> lock(mu_);
    if (failure_) std::rethrow_exception(failure_);
    if (data_ != batch.data) {
        drain(lock);
        data_ = batch.data;
    }
    work_done_.wait(lock, [&] {
        return queue_.size() + batch.size <= std::max<size_t>(queue_capacity(), batch.size) ||
               failure_;
    });
    if (failure_) std::rethrow_exception(failure_);
    if (!window_open_) {
        window_open_ = true;
        window_start_ = clock_type::now();
        // Parked time counts within windows too.
        for (const auto& w : workers_) probe_.take_parked_seconds(w->index, now());
    }
    for (uint32_t i = 0; i < batch.size; ++i) queue_.push_back({batch.rows[i], learning_rate});
    if (idle_) {
        // The workers had nothing to do (the trainer evaluated, or waited for a merge): that
        // time says nothing about their speed.
        probe_.pause(now() - idle_since_);
        idle_ = false;
    }
    work_ready_.notify_all();
    return std::exchange(pending_, step_report{});
}

step_report hybrid_backend::synchronize() {
    synchronize_models();
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(pending_, step_report{});
}

void hybrid_backend::rebuild_tables(bool new_functions) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
        w->rebuild_pending = true;
        w->rehash_pending = w->rehash_pending || new_functions;
    }
}

void hybrid_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                             uint32_t* labels, float* scores) {
    synchronize_models();
    // Every replica is the shared model now: the fastest trainer (per sample, over all it
    // trained: the last batches may be an epoch's small remainder) predicts, so a GPU worker
    // scores where there is one (exact scoring of a large output layer is a GEMM there, a
    // long pass on the CPU).
    worker* fastest = workers_.front().get();
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto per_sample = [](const worker& w) {
            return w.trained_samples ? w.trained_seconds / double(w.trained_samples) : 0.0;
        };
        for (auto& w : workers_)
            if (w->trained_samples > 0 &&
                (fastest->trained_samples == 0 || per_sample(*w) < per_sample(*fastest)))
                fastest = w.get();
    }
    fastest->device->predict(batch, k, scoring, labels, scores);
}

void hybrid_backend::export_state(model_state& out, bool with_optimizer) const {
    // Exporting reads the model, but the model is only defined once the workers are merged.
    const_cast<hybrid_backend*>(this)->synchronize_models();
    // The first worker's replica is the shared model now, with its own Adam moments.
    workers_.front()->device->export_state(out, with_optimizer);
}

void hybrid_backend::import_state(const model_state& in, bool with_optimizer) {
    {
        std::unique_lock<std::mutex> lock(mu_);
        drain(lock);
    }
    std::lock_guard<std::mutex> lock(shared_mu_);
    copy_parameters(shared_, in);
    ++version_;
    for (auto& version : row_version_) std::fill(version.begin(), version.end(), version_);
    for (auto& w : workers_) {
        w->device->import_state(in, with_optimizer);
        copy_parameters(w->base, in);
        w->base.hash_seeds = in.hash_seeds;
        if (with_optimizer) w->base.adam_step = in.adam_step;
        std::fill(w->synced.begin(), w->synced.end(), version_);
        w->first_layer_waiting.clear();
        w->merges_without_first = 0;
        w->since_merge = 0;
    }
}

backend_info hybrid_backend::info() const {
    backend_info bi;
    bi.kind = to_string(backend_kind::hybrid);
    for (const auto& w : workers_) {
        const backend_info wi = w->device->info();
        bi.device += fmt::format("{}{}: {} [{}]", bi.device.empty() ? "" : "; ", w->name, wi.device,
                                 to_string(options_.policy));
        bi.memory_bytes += wi.memory_bytes;
        if (bi.precision.empty()) bi.precision = wi.precision;
    }
    return bi;
}

std::vector<worker_stats> hybrid_backend::take_worker_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    const double wall = seconds_since(window_start_);
    window_start_ = clock_type::now();
    // Work still queued or running belongs to the next window, which starts now; otherwise
    // the next window starts with its first batch.
    window_open_ = busy_ > 0 || !queue_.empty();
    uint64_t all_batches = 0;
    for (const auto& w : workers_) all_batches += w->window.batches;
    std::vector<worker_stats> out;
    for (auto& w : workers_) {
        worker_stats s = w->window;
        s.wall_seconds = wall;
        s.update_share = all_batches ? double(s.batches) / double(all_batches) : 0;
        s.batch_mean = s.batches ? double(s.samples) / double(s.batches) : 0;
        s.staleness_mean = s.merges ? w->staleness_sum / double(s.merges) : 0;
        s.parked_seconds = probe_.take_parked_seconds(w->index, now());
        out.push_back(s);
        w->window = worker_stats{};
        w->window.name = w->name;
        w->staleness_sum = 0;
    }
    return out;
}

}  // namespace

schedule_policy parse_schedule_policy(const std::string& name) {
    return detail::parse_named(name, "schedule policy", policy_names);
}
const char* to_string(schedule_policy policy) {
    return detail::name_of(policy, policy_names);
}

void add_replica_change(model_state& shared, const model_state& replica, const model_state& base) {
    HSLIDE_ASSERT(shared.layers.size() == replica.layers.size() &&
                  shared.layers.size() == base.layers.size());
    for (size_t l = 0; l < shared.layers.size(); ++l)
        add_row_changes(shared.layers[l], replica.layers[l], base.layers[l], l, nullptr);
}

std::vector<int> split_worker_threads(const std::vector<backend_kind>& kinds,
                                      const std::vector<int>& requested, int cores) {
    HSLIDE_CHECK(requested.size() == kinds.size(), "{} thread counts for {} workers",
                 requested.size(), kinds.size());
    int explicit_threads = 0, automatic = 0, gpu_workers = 0;
    for (size_t i = 0; i < kinds.size(); ++i) {
        if (backend_entry_of(kinds[i]).caps.needs_gpu) {
            ++gpu_workers;
            continue;
        }
        HSLIDE_CHECK(requested[i] >= 0, "a negative thread count ({}) for worker {}", requested[i],
                     i);
        explicit_threads += requested[i];
        automatic += requested[i] == 0;
    }
    const int share =
        automatic ? std::max(1, (cores - explicit_threads - gpu_workers) / automatic) : 0;
    std::vector<int> threads(kinds.size(), 0);
    for (size_t i = 0; i < kinds.size(); ++i)
        if (!backend_entry_of(kinds[i]).caps.needs_gpu)
            threads[i] = requested[i] > 0 ? requested[i] : share;
    return threads;
}

std::unique_ptr<backend> create_hybrid_backend(const hybrid_options& options,
                                               const model_state& initial,
                                               const train_config& train) {
    return std::make_unique<hybrid_backend>(options, initial, train);
}

}  // namespace hslide
