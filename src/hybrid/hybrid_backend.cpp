// The hybrid backend: workers, the sample queue, batch sizes, parking, and the Backend
// calls (see hslide/hybrid.hpp for the design; the merges are in hybrid_merge.cpp).
#include "hybrid/hybrid_backend.hpp"

#include "common/util/enum_names.hpp"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace hslide {

namespace detail {

namespace {

constexpr std::pair<const char*, schedule_policy> policy_names[] = {
    {"hogbatch", schedule_policy::hogbatch}, {"adaptive", schedule_policy::adaptive}};

void copy_parameters(model_state& dst, const model_state& src) {
    for (size_t l = 0; l < src.layers.size(); ++l) {
        dst.layers[l].weights = src.layers[l].weights;
        dst.layers[l].bias = src.layers[l].bias;
    }
}

usefulness_settings probe_settings(const hybrid_options& o) {
    usefulness_settings s;
    s.probe_share = o.policy == schedule_policy::adaptive ? o.park_below_share : 0;
    s.min_gain = o.park_min_gain;
    s.window_seconds = o.park_window_seconds;
    return s;
}

}  // namespace

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
    config_ = initial.config;
    for (const layer_state& layer : shared_.layers) row_version_.emplace_back(layer.rows, 0);
    offer_worker_stats(this);
    std::vector<int> kind_count(backend_registry().size(), 0);
    for (const hybrid_worker_options& wo : options_.workers) {
        HSLIDE_CHECK(wo.update_share > 0, "every hybrid worker's update share must be positive");
        HSLIDE_CHECK(wo.batch_size >= 1, "every hybrid worker's batch size must be positive");
        check_thread_count(wo.merge_threads, "a hybrid worker's merge threads (--merge-threads)");
        check_thread_count(wo.device.threads, "a hybrid worker's threads (--worker-threads)");
        auto w = std::make_unique<worker>();
        w->options = wo;
        const backend_capabilities& caps = backend_entry_of(wo.device.kind).caps;
        w->name =
            fmt::format("{}{}", to_string(wo.device.kind), kind_count[size_t(wo.device.kind)]++);
        w->index = workers_.size();
        // A worker choosing its own output neurons holds a replica that says so.
        std::optional<model_state> own;
        if (wo.output_sparsity && *wo.output_sparsity != initial.config.layers.back().sparsity) {
            own = initial;
            own->config.layers.back().sparsity = *wo.output_sparsity;
        }
        try {
            if (own) validate(own->config);
            if (wo.make_device)
                w->device = wo.make_device(own ? *own : initial, train);
            else if (own)
                w->device = create_backend(wo.device, std::move(*own), train);  // no second copy
            else
                w->device = create_backend(wo.device, initial, train);
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
                w.device->refresh_selections(rehash);
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
                parked_with_changes = probe_.parked(w.index) && w.unmerged();
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
        return w.unmerged();
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
        if (v.bounded)
            spdlog::info(
                "hybrid: {} cannot help: it trains {:.0f} samples/s beside the others' {:.0f}, "
                "less than {:.0f}% of them; parked for {:.0f} s",
                name, v.rate_all - v.rate_without, v.rate_without, 100 * options_.park_min_gain,
                v.parked_for_seconds);
        else if (v.helps)
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

void hybrid_backend::drain(std::unique_lock<std::mutex>& lock) {
    work_done_.wait(lock, [&] { return (queue_.empty() && busy_ == 0) || failure_; });
    if (failure_) {
        // The failed batch's samples are gone: the run cannot go on consistently.
        queue_.clear();
        std::rethrow_exception(failure_);
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
    synchronize_models(/*lazy=*/true);
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(pending_, step_report{});
}

void hybrid_backend::refresh_selections(bool new_functions) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
        w->rebuild_pending = true;
        w->rehash_pending = w->rehash_pending || new_functions;
    }
}

void hybrid_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                             uint32_t* labels, float* scores) {
    if (worker* sole = synchronize_models(/*lazy=*/true)) {
        sole->device->predict(batch, k, scoring, labels, scores);  // its replica is the model
        return;
    }
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
    const_cast<hybrid_backend*>(this)->synchronize_models(/*lazy=*/false);
    // The first worker's replica is the shared model now, with its own Adam moments.
    workers_.front()->device->export_state(out, with_optimizer);
    out.config = config_;
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

}  // namespace detail

schedule_policy parse_schedule_policy(const std::string& name) {
    return detail::parse_named(name, "schedule policy", detail::policy_names);
}
const char* to_string(schedule_policy policy) {
    return detail::name_of(policy, detail::policy_names);
}
std::vector<std::string> names_of(schedule_policy) {
    return detail::names_in(detail::policy_names);
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
    return std::make_unique<detail::hybrid_backend>(options, initial, train);
}

}  // namespace hslide
