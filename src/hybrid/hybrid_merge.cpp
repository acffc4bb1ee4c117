// The hybrid backend's merges: a worker's row changes added to the shared model, and the
// rows others changed taken back (see hslide/hybrid.hpp, "Row-sparse merges").
#include "hybrid/hybrid_backend.hpp"

#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

namespace hslide {

namespace detail {

namespace {

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

}  // namespace

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

hybrid_backend::worker* hybrid_backend::synchronize_models(bool lazy) {
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
    if (lazy)
        if (worker* sole = sole_trainer(caught_up)) return sole;
    // Every worker is idle: merge each that trained since its last merge, then give every
    // worker the rows changed since its sync, so that all replicas equal the shared model.
    // The merges have every worker's threads (a worker that trained alone, deferring its
    // merges, brings the changes of many batches).
    int threads = 0;
    for (const auto& w : workers_) threads += w->merge_threads;
    for (size_t i = 0; i < workers_.size(); ++i) {
        worker& w = *workers_[i];
        if (w.unmerged() || caught_up[i]) merge(w, /*full=*/true, threads);
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
    return nullptr;
}

hybrid_backend::worker* hybrid_backend::sole_trainer(const std::vector<char>& caught_up) {
    // Merging an epoch of a lone GPU worker's changes and sending them to a parked CPU replica
    // (most rows of a big output layer, device to host and into the CPU's copy: 0.3-1 s an
    // epoch at Amazon-670K) makes copies nobody reads before the parked worker trains again,
    // and it takes the shared model then anyway (resync_pending; merge_pending for the other).
    worker* sole = nullptr;
    {
        // The probe only changes after a batch, and every worker is idle: this holds until the
        // next one.
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& w : workers_) {
            if (probe_.parked(w->index)) {
                if (w->unmerged() || caught_up[w->index]) return nullptr;
            } else {
                if (sole) return nullptr;  // two train
                sole = w.get();
            }
        }
    }
    // Rows it caught up with nothing trained since its last merge would count for no merge.
    if (!sole || (sole->since_merge == 0 && caught_up[sole->index])) return nullptr;
    std::lock_guard<std::mutex> lock(shared_mu_);
    const bool has_every_merge = std::all_of(sole->synced.begin(), sole->synced.end(),
                                             [&](uint64_t v) { return v == version_; });
    return has_every_merge ? sole : nullptr;
}

}  // namespace detail

void add_replica_change(model_state& shared, const model_state& replica, const model_state& base) {
    HSLIDE_ASSERT(shared.layers.size() == replica.layers.size() &&
                  shared.layers.size() == base.layers.size());
    for (size_t l = 0; l < shared.layers.size(); ++l)
        detail::add_row_changes(shared.layers[l], replica.layers[l], base.layers[l], l, nullptr);
}

}  // namespace hslide
