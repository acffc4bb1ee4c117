// The CPU backend (see cpu_backend.hpp for the shape of a step).
#include "cpu_backend.hpp"

#include "top_k.hpp"

#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/rng.hpp"
#include "hslide/system_info.hpp"

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>

namespace hslide::cpu {

namespace {
using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The mark a row's step holds while a thread catches it up.
constexpr uint64_t catching_up = ~uint64_t{0};

void pause_briefly() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}
}  // namespace

cpu_backend::cpu_backend(model_state initial, const train_config& train, int threads,
                         const kernel_table& kernels, precision_mode precision)
    : model_(std::move(initial)),
      train_(train),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      k_(kernels),
      precision_(precision) {
    offer_rows(this);
    validate(model_.config);
    const size_t n_layers = model_.layers.size();
    lsh_.resize(n_layers);
    groups_.resize(n_layers);
    changed_.resize(n_layers);
    uint32_t max_sparse = 0, max_width = 0, max_L = 0;
    for (size_t l = 0; l < n_layers; ++l) {
        max_width = std::max(max_width, model_.layers[l].width);
        groups_[l].slot.assign(model_.layers[l].rows, -1);
        changed_[l].flag.assign(model_.layers[l].rows, 0);
        lsh_[l].stale.flag.assign(model_.layers[l].rows, 0);
        if (model_.config.is_sparse(l)) {
            max_sparse = std::max(max_sparse, model_.neurons(l));
            max_L = std::max<uint32_t>(max_L, model_.config.layers[l].lsh.L);
        }
    }
    scratch_.resize(threads_);
    for (auto& s : scratch_) {
        s.builder = active_set_builder(max_sparse);
        s.codes.resize(max_L);
        s.grad.resize(padded_stride(max_width));
        if (use_bf16()) s.input16.resize(max_width);
    }
    if (use_bf16()) {
        weights16_.resize(n_layers);
        for (size_t l = 0; l < n_layers; ++l) refresh_bf16_layer(l);
    }
    for (size_t l = 0; l < n_layers; ++l)
        if (model_.config.is_sparse(l)) build_layer_tables(l);
    if (catches_up()) {
        catch_up_ = adam_catch_up(train_.adam_beta1, train_.adam_beta2, train_.adam_epsilon,
                                  model_.adam_step);
        row_step_.resize(n_layers);
        for (size_t l = 0; l < n_layers; ++l)
            if (catches_up(l))
                row_step_[l] = std::make_unique<std::atomic<uint64_t>[]>(model_.layers[l].rows);
        restart_catch_up();
    }
}

void cpu_backend::restart_catch_up() {
    catch_up_.restart(model_.adam_step);
    for (size_t l = 0; l < row_step_.size(); ++l)
        if (row_step_[l])
            for (uint32_t r = 0; r < model_.layers[l].rows; ++r)
                row_step_[l][r].store(model_.adam_step, std::memory_order_relaxed);
}

void cpu_backend::catch_up_row(size_t l, uint32_t row, uint64_t from) {
    layer_state& layer = model_.layers[l];
    const catch_up_step c = catch_up_.from(from);
    const size_t off = size_t(row) * layer.stride;
    apply_catch_up(layer.weights.data() + off, layer.adam_m.data() + off, layer.adam_v.data() + off,
                   layer.width, c);
    if (l > 0) apply_catch_up(&layer.bias[row], &layer.bias_m[row], &layer.bias_v[row], 1, c);
    if (use_bf16()) k_.to_bf16(layer.row(row), weights16_[l].row(row), layer.width);
}

void cpu_backend::bring_up_to_date(size_t l, const uint32_t* ids, uint32_t n,
                                   thread_scratch& scratch) {
    const uint64_t now = catch_up_.current();
    std::atomic<uint64_t>* steps = row_step_[l].get();
    for (uint32_t i = 0; i < n; ++i) {
        std::atomic<uint64_t>& step = steps[ids[i]];
        uint64_t seen = step.load(std::memory_order_acquire);
        while (seen != now) {
            if (seen == catching_up) {
                // Another thread has it: one row's update, well under a microsecond, so a
                // pause rather than a trip through the scheduler.
                pause_briefly();
                seen = step.load(std::memory_order_acquire);
            } else if (step.compare_exchange_weak(seen, catching_up, std::memory_order_acquire,
                                                  std::memory_order_acquire)) {
                catch_up_row(l, ids[i], seen);
                step.store(now, std::memory_order_release);
                scratch.caught_up.emplace_back(uint32_t(l), ids[i]);
                break;
            }
        }
    }
}

void cpu_backend::bring_inputs_up_to_date(const batch_view& batch) {
    const uint64_t now = catch_up_.current();
    std::atomic<uint64_t>* steps = row_step_[0].get();
    const uint32_t rows = model_.layers[0].rows;
#pragma omp parallel num_threads(threads_)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const uint32_t lo = uint32_t(uint64_t(rows) * uint64_t(t) / uint64_t(n));
        const uint32_t hi = uint32_t(uint64_t(rows) * uint64_t(t + 1) / uint64_t(n));
        thread_scratch& scratch = scratch_[t];
        for (uint32_t s = 0; s < batch.size; ++s) {
            const feature_row x = batch.data->features(batch.rows[s]);
            for (uint32_t k = 0; k < x.count; ++k) {
                const uint32_t row = x.ids[k];
                if (row - lo >= hi - lo)
                    continue;  // another thread's (or not a row: forward says so)
                const uint64_t from = steps[row].load(std::memory_order_relaxed);
                if (from == now) continue;
                catch_up_row(0, row, from);
                steps[row].store(now, std::memory_order_relaxed);
                scratch.caught_up.emplace_back(0u, row);
            }
        }
    }
}

void cpu_backend::mark_caught_up_rows() {
    for (auto& scratch : scratch_) {
        for (const auto& [l, row] : scratch.caught_up) {
            changed_[l].mark(row);
            if (model_.config.is_sparse(l)) lsh_[l].stale.mark(row);
        }
        scratch.caught_up.clear();
    }
}

bool cpu_backend::complete_deferred_updates() {
    if (!rows_behind_) return false;
    rows_behind_ = false;
    const uint64_t now = catch_up_.current();
    for (size_t l = 0; l < row_step_.size(); ++l) {
        if (!row_step_[l]) continue;
        std::atomic<uint64_t>* steps = row_step_[l].get();
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1024)
            for (int64_t r = 0; r < int64_t(model_.layers[l].rows); ++r) {
                const uint64_t from = steps[r].load(std::memory_order_relaxed);
                if (from == now) continue;
                catch_up_row(l, uint32_t(r), from);
                steps[r].store(now, std::memory_order_relaxed);
                scratch.caught_up.emplace_back(uint32_t(l), uint32_t(r));
            }
        }
    }
    bool moved = false;
    for (const auto& scratch : scratch_) moved = moved || !scratch.caught_up.empty();
    mark_caught_up_rows();
    return moved;
}

const model_state* cpu_backend::host_state() const {
    // Logically const: the model is the one with every row up to date; bringing the rows
    // there changes when the deferred steps are applied, not what the model is.
    const_cast<cpu_backend*>(this)->complete_deferred_updates();
    return &model_;
}

void cpu_backend::refresh_bf16_layer(size_t l) {
    const layer_state& layer = model_.layers[l];
    bf16_weights& w16 = weights16_[l];
    // 32 bf16 values are one cache line, so rows start on line boundaries.
    const uint32_t stride = (layer.width + 31u) & ~31u;
    if (w16.stride != stride || w16.values.size() != size_t(layer.rows) * stride) {
        w16.stride = stride;
        w16.values.resize(size_t(layer.rows) * stride);
    }
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t r = 0; r < int64_t(layer.rows); ++r)
        k_.to_bf16(layer.row(uint32_t(r)), w16.row(uint32_t(r)), layer.width);
}

void cpu_backend::row_marks::take(std::vector<uint32_t>& out) {
    out.clear();
    const uint32_t rows = uint32_t(flag.size());
    if (all) {
        out.resize(rows);
        std::iota(out.begin(), out.end(), 0u);
    } else if (list.size() * 8 >= rows) {
        // Most rows marked: a scan of the flags sorts them in O(rows).
        for (uint32_t r = 0; r < rows; ++r)
            if (flag[r]) out.push_back(r);
    } else {
        out.assign(list.begin(), list.end());
        std::sort(out.begin(), out.end());
    }
    for (uint32_t r : list) flag[r] = 0;
    list.clear();
    all = false;
}

void cpu_backend::mark_updated_rows(size_t l, bool every_row) {
    row_marks& stale = lsh_[l].stale;
    const bool sparse = model_.config.is_sparse(l);
    if (every_row) {
        changed_[l].mark_all();
        if (sparse) stale.mark_all();
        return;
    }
    for (uint32_t row : groups_[l].touched) {
        changed_[l].mark(row);
        if (sparse) stale.mark(row);
    }
}

void cpu_backend::build_layer_tables(size_t l) {
    const lsh_config& cfg = model_.config.layers[l].lsh;
    const layer_state& layer = model_.layers[l];
    sparse_layer& sl = lsh_[l];
    const uint32_t n = layer.rows, L = uint32_t(cfg.L);
    if (!sl.hash || sl.hash->seed() != model_.hash_seeds[l]) {
        sl.hash = hash_family::create(cfg, layer.width, model_.hash_seeds[l]);
        sl.stale.mark_all();  // new functions: every code changes
    }
    if (sl.codes.size() != size_t(n) * L) {
        sl.codes.resize(size_t(n) * L);
        sl.stale.mark_all();
    }
    // Only the rows changed or imported since they were hashed: the others' codes stand.
    std::vector<uint32_t> rows;
    sl.stale.take(rows);
    const hash_family& hash = *sl.hash;
    uint32_t* codes = sl.codes.data();
#pragma omp parallel for schedule(dynamic, 256) num_threads(threads_)
    for (int64_t k = 0; k < int64_t(rows.size()); ++k)
        hash.codes_dense(layer.row(rows[k]), &codes[size_t(rows[k]) * L]);
    if (sl.tables.n_items() == 0) sl.tables = lsh_tables(cfg);
    // The insertion order depends on the step count, so a resumed run rebuilds identically.
    sl.tables.build(codes, n, derive_seed(model_.hash_seeds[l], model_.adam_step));
}

void cpu_backend::rebuild_tables(bool new_functions) {
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        if (!model_.config.is_sparse(l)) continue;
        if (new_functions)
            model_.hash_seeds[l] = derive_seed(model_.hash_seeds[l], model_.adam_step + 1);
        build_layer_tables(l);
    }
}

void cpu_backend::ensure_buffers(uint32_t batch_size) {
    if (samples_.size() < batch_size) samples_.resize(batch_size);
    for (auto& s : samples_)
        if (s.layers.size() != model_.layers.size()) s.layers.resize(model_.layers.size());
}

void cpu_backend::forward_sample(const dataset& data, uint32_t point, uint32_t s, bool training,
                                 output_pass output_mode, uint64_t sample_seed,
                                 thread_scratch& scratch) {
    HSLIDE_ASSERT(!training || output_mode == output_pass::active_set);
    sample_buffers& sb = samples_[s];
    const size_t n_layers = model_.layers.size();
    const size_t layers_to_run = n_layers - (output_mode == output_pass::skip ? 1 : 0);
    const feature_row x = data.features(point);
    const label_row y = data.labels(point);
    auto t0 = clock_type::now();

    // Layer 0: the weighted sum of the sample's feature rows, then ReLU.
    {
        const layer_state& layer = model_.layers[0];
        layer_buffers& out = sb.layers[0];
        out.ids.clear();
        out.act.assign(layer.bias.begin(), layer.bias.end());
        for (uint32_t i = 0; i < x.count; ++i)
            HSLIDE_CHECK(x.ids[i] < layer.rows,
                         "{}: point {} has feature {} but the model has {} inputs", data.source,
                         point, x.ids[i], layer.rows);
        if (use_bf16()) {
            const bf16_weights& w16 = weights16_[0];
            k_.weighted_row_sum_bf16(w16.values.data(), w16.stride, layer.width, x.ids, x.values,
                                     x.count, out.act.data());
        } else {
            k_.weighted_row_sum(layer.weights.data(), layer.stride, layer.width, x.ids, x.values,
                                x.count, out.act.data());
        }
        for (float& a : out.act) a = a > 0.0f ? a : 0.0f;
    }
    scratch.times.forward += seconds_since(t0);

    rng gen(sample_seed);
    for (size_t l = 1; l < layers_to_run; ++l) {
        const layer_state& layer = model_.layers[l];
        const layer_buffers& in = sb.layers[l - 1];
        layer_buffers& out = sb.layers[l];
        const bool output = l + 1 == n_layers;
        const bool sparse =
            model_.config.is_sparse(l) && !(output && output_mode == output_pass::every_neuron);

        t0 = clock_type::now();
        out.ids.clear();
        if (sparse) {
            const hash_family& hash = *lsh_[l].hash;
            // Queries probe nearby buckets too (a dense input only; training never does).
            const uint32_t probes =
                training || !in.ids.empty() ? 0 : model_.config.layers[l].active.probes;
            if (scratch.codes.size() < size_t(hash.config().L) * (1 + probes))
                scratch.codes.resize(size_t(hash.config().L) * (1 + probes));
            if (probes > 0)
                hash.probe_codes_dense(in.act.data(), probes, scratch.codes.data());
            else if (in.ids.empty())
                hash.codes_dense(in.act.data(), scratch.codes.data());
            else
                hash.codes_sparse(in.ids.data(), in.act.data(), uint32_t(in.ids.size()),
                                  scratch.codes.data());
            scratch.times.hashing += seconds_since(t0);
            t0 = clock_type::now();
            const bool force_labels = output && training;
            scratch.builder.build(lsh_[l].tables, scratch.codes.data(),
                                  force_labels ? y.ids : nullptr, force_labels ? y.count : 0,
                                  model_.config.layers[l].active, gen, out.ids, 1 + probes);
            if (training && catches_up(l))
                bring_up_to_date(l, out.ids.data(), uint32_t(out.ids.size()), scratch);
            scratch.times.active_sets += seconds_since(t0);
        }

        t0 = clock_type::now();
        const uint32_t n_active = sparse ? uint32_t(out.ids.size()) : layer.rows;
        out.act.resize(n_active);
        const uint32_t* ids = sparse ? out.ids.data() : nullptr;
        if (!in.ids.empty()) {
            // A sparse input (an LSH hidden layer before this one): gathers from the fp32 rows.
            for (uint32_t a = 0; a < n_active; ++a) {
                const uint32_t j = ids ? ids[a] : a;
                out.act[a] = k_.gather_dot(layer.row(j), in.ids.data(), in.act.data(),
                                           uint32_t(in.ids.size())) +
                             layer.bias[j];
            }
        } else if (use_bf16()) {
            const bf16_weights& w16 = weights16_[l];
            k_.to_bf16(in.act.data(), scratch.input16.data(), layer.width);
            k_.active_dots_bf16(w16.values.data(), w16.stride, layer.width, ids, n_active,
                                scratch.input16.data(), layer.bias.data(), out.act.data());
        } else {
            k_.active_dots(layer.weights.data(), layer.stride, layer.width, ids, n_active,
                           in.act.data(), layer.bias.data(), out.act.data());
        }
        if (!output)
            for (float& a : out.act) a = a > 0.0f ? a : 0.0f;
        scratch.times.forward += seconds_since(t0);
    }

    if (!training) return;

    // Softmax over the output active set, against the label distribution 1/|y| per label.
    t0 = clock_type::now();
    layer_buffers& out = sb.layers[n_layers - 1];
    sb.trained = y.count > 0;
    sb.loss = 0;
    out.delta.assign(out.act.size(), 0.0f);
    if (sb.trained) {
        const double log_sum =
            k_.softmax(out.act.data(), out.delta.data(), uint32_t(out.act.size()));
        const float target = 1.0f / float(y.count);
        if (out.ids.empty()) {
            for (uint32_t i = 0; i < y.count; ++i) {
                sb.loss -= target * (out.act[y.ids[i]] - log_sum);
                out.delta[y.ids[i]] -= target;
            }
        } else {
            // Forced labels come first in a sparse output active set.
            HSLIDE_ASSERT(out.ids.size() >= y.count);
            for (uint32_t i = 0; i < y.count; ++i) {
                HSLIDE_ASSERT(out.ids[i] == y.ids[i]);
                sb.loss -= target * (out.act[i] - log_sum);
                out.delta[i] -= target;
            }
        }
    }
    scratch.times.forward += seconds_since(t0);
}

void cpu_backend::backward_sample(const dataset& data, uint32_t point, uint32_t s,
                                  thread_scratch& scratch) {
    sample_buffers& sb = samples_[s];
    const auto t0 = clock_type::now();
    for (size_t l = model_.layers.size() - 1; l >= 1; --l) {
        const layer_state& layer = model_.layers[l];
        const layer_buffers& out = sb.layers[l];
        layer_buffers& in = sb.layers[l - 1];
        // dL/d a_{l-1} = W_l^T delta_l over the active neurons, then the ReLU mask.
        scratch.dense.assign(layer.width, 0.0f);
        const uint32_t n_active = out.ids.empty() ? layer.rows : uint32_t(out.ids.size());
        const uint32_t* ids = out.ids.empty() ? nullptr : out.ids.data();
        if (use_bf16()) {
            const bf16_weights& w16 = weights16_[l];
            k_.weighted_row_sum_bf16(w16.values.data(), w16.stride, layer.width, ids,
                                     out.delta.data(), n_active, scratch.dense.data());
        } else {
            k_.weighted_row_sum(layer.weights.data(), layer.stride, layer.width, ids,
                                out.delta.data(), n_active, scratch.dense.data());
        }
        in.delta.resize(in.act.size());
        for (size_t i = 0; i < in.act.size(); ++i) {
            const uint32_t unit = in.ids.empty() ? uint32_t(i) : in.ids[i];
            in.delta[i] = in.act[i] > 0.0f ? scratch.dense[unit] : 0.0f;
        }
    }
    scratch.times.backward += seconds_since(t0);
}

void cpu_backend::run_forward_backward(const batch_view& batch, step_report& report) {
    HSLIDE_ASSERT(!catches_up() || catch_up_.current() == model_.adam_step);
    if (catches_up(0)) bring_inputs_up_to_date(batch);
    ensure_buffers(batch.size);
    for (auto& s : scratch_) s.times = {};
    const dataset& data = *batch.data;
    const uint64_t step_seed = derive_seed(train_.seed ^ 0x5eedf111ULL, model_.adam_step);
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 2)
        for (int64_t s = 0; s < int64_t(batch.size); ++s) {
            const uint32_t point = batch.rows[s];
            forward_sample(data, point, uint32_t(s), true, output_pass::active_set,
                           derive_seed(step_seed, uint64_t(s)), scratch);
            if (samples_[s].trained) backward_sample(data, point, uint32_t(s), scratch);
        }
    }
    if (catches_up()) mark_caught_up_rows();
    report.samples = batch.size;
    report.active_per_layer.assign(model_.layers.size(), 0);
    for (uint32_t s = 0; s < batch.size; ++s) {
        report.loss_sum += samples_[s].loss;
        for (size_t l = 0; l < model_.layers.size(); ++l) {
            const auto& lb = samples_[s].layers[l];
            report.active_per_layer[l] += lb.ids.empty() ? model_.neurons(l) : lb.ids.size();
        }
    }
    // Per-thread CPU seconds, averaged: the share of the parallel phase each stage took.
    for (const auto& s : scratch_) {
        report.times.hashing += s.times.hashing / threads_;
        report.times.active_sets += s.times.active_sets / threads_;
        report.times.forward += s.times.forward / threads_;
        report.times.backward += s.times.backward / threads_;
    }
}

void cpu_backend::group_rows(const batch_view& batch, size_t l) {
    row_groups& g = groups_[l];
    const uint32_t rows = model_.layers[l].rows;
    if (g.count.size() != rows) g.count.assign(rows, 0);
    // Entries carry their coefficient (feature value or delta), read here in sample order:
    // the gradient loop, which visits them by row, then reads no sample's arrays at random.
    size_t entries = 0;
    for (uint32_t s = 0; s < batch.size; ++s)
        if (samples_[s].trained)
            entries += l == 0 ? batch.data->features(batch.rows[s]).count
                              : samples_[s].layers[l].ids.size();
    // Each thread owns a range of rows and does the random-access work (counts, slots,
    // placement) for its rows only, while every thread reads all entries in order: the
    // grouping is serial work otherwise, about a sixth of a 2-thread step on the
    // Amazon-670K shape. The result is the serial one: rows ascending (so the update sweeps
    // memory nearly sequentially, which the prefetchers stream at close to full bandwidth),
    // each row's entries in sample order.
    const int threads = entries >= 16384 ? threads_ : 1;
    std::vector<uint32_t> touched_before(size_t(threads) + 1, 0), entries_before(touched_before);
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num();
        const uint32_t lo = uint32_t(uint64_t(rows) * uint64_t(t) / uint64_t(threads));
        const uint32_t hi = uint32_t(uint64_t(rows) * uint64_t(t + 1) / uint64_t(threads));
        auto for_my_entries = [&](auto&& on_entry) {
            for (uint32_t s = 0; s < batch.size; ++s) {
                if (!samples_[s].trained) continue;
                if (l == 0) {
                    const feature_row x = batch.data->features(batch.rows[s]);
                    for (uint32_t k = 0; k < x.count; ++k)
                        if (x.ids[k] - lo < hi - lo) on_entry(x.ids[k], s, x.values[k]);
                } else {
                    const auto& lb = samples_[s].layers[l];
                    for (uint32_t k = 0; k < lb.ids.size(); ++k)
                        if (lb.ids[k] - lo < hi - lo) on_entry(lb.ids[k], s, lb.delta[k]);
                }
            }
        };
        for_my_entries([&](uint32_t row, uint32_t, float) { ++g.count[row]; });
        uint32_t my_touched = 0, my_entries = 0;
        for (uint32_t r = lo; r < hi; ++r)
            if (g.count[r]) {
                ++my_touched;
                my_entries += g.count[r];
            }
        touched_before[t + 1] = my_touched;
        entries_before[t + 1] = my_entries;
#pragma omp barrier
#pragma omp single
        {
            for (int i = 0; i < threads; ++i) {
                touched_before[i + 1] += touched_before[i];
                entries_before[i + 1] += entries_before[i];
            }
            g.touched.resize(touched_before[threads]);
            g.offsets.resize(touched_before[threads] + 1);
            g.offsets.back() = entries_before[threads];
            g.entry_sample.resize(entries_before[threads]);
            g.entry_coef.resize(entries_before[threads]);
        }
        // Slots and offsets of my rows; their counts restart at 0 as placement cursors.
        uint32_t k = touched_before[t], e = entries_before[t];
        for (uint32_t r = lo; r < hi; ++r)
            if (g.count[r]) {
                g.touched[k] = r;
                g.offsets[k] = e;
                g.slot[r] = int32_t(k);
                e += g.count[r];
                g.count[r] = 0;
                ++k;
            }
        for_my_entries([&](uint32_t row, uint32_t s, float coef) {
            const uint32_t pos = g.offsets[uint32_t(g.slot[row])] + g.count[row]++;
            g.entry_sample[pos] = s;
            g.entry_coef[pos] = coef;
        });
        for (uint32_t i = touched_before[t]; i < touched_before[t + 1]; ++i)
            g.count[g.touched[i]] = 0;
    }
}

template <class Visit>
void cpu_backend::for_each_row_gradient(const batch_view& batch, size_t l, Visit&& visit) {
    const layer_state& layer = model_.layers[l];
    const float inv_batch = 1.0f / float(batch.size);
    const bool all_rows = l > 0 && !model_.config.is_sparse(l);
    const row_groups& g = groups_[l];
    const int64_t n_rows = all_rows ? int64_t(layer.rows) : int64_t(g.touched.size());
    // Long runs of consecutive rows per thread keep the prefetchers streaming (128 rather
    // than 16 made the 2-thread Amazon-670K update ~10% faster); at least 16 chunks a
    // thread keep small layers balanced.
    const int64_t chunk = std::clamp<int64_t>(n_rows / (16 * int64_t(threads_)), 16, 128);
    // A row's gradient is a weighted sum of per-sample vectors (layer 0's deltas, or the
    // layer's input): weighted_vector_sum keeps the row in registers while the vectors stream
    // past, where an axpy per entry loaded and stored the whole row each time (which made small
    // dense layers store-bound). Same roundings, same order. Sparse inputs (an active set of
    // the layer below) scatter into the row after the dense ones.
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
        float* grad = scratch.grad.data();
        scratch.sparse_entries.clear();
#pragma omp for schedule(dynamic, chunk)
        for (int64_t t = 0; t < n_rows; ++t) {
            std::fill(grad, grad + layer.stride, 0.0f);
            const uint32_t row = all_rows ? uint32_t(t) : g.touched[t];
            const size_t entries = all_rows ? batch.size : g.offsets[t + 1] - g.offsets[t];
            if (scratch.entry_vectors.size() < entries) {
                scratch.entry_vectors.resize(entries);
                scratch.entry_coefs.resize(entries);
            }
            float bias_grad = 0.0f;
            uint32_t n_dense = 0;
            // coef: layer 0, the feature's value x_f (row f gets x_f times the sample's
            // layer-0 delta); later layers, the neuron's delta d (its row gets d times the
            // layer's input, its bias d).
            auto add_entry = [&](uint32_t s, float coef) {
                const float c = coef * inv_batch;
                const sample_buffers& sb = samples_[s];
                bias_grad += c;
                if (l == 0 || sb.layers[l - 1].ids.empty()) {
                    scratch.entry_vectors[n_dense] =
                        l == 0 ? sb.layers[0].delta.data() : sb.layers[l - 1].act.data();
                    scratch.entry_coefs[n_dense++] = c;
                } else {
                    scratch.sparse_entries.push_back({s, c});
                }
            };
            if (all_rows) {
                for (uint32_t s = 0; s < batch.size; ++s)
                    if (samples_[s].trained) add_entry(s, samples_[s].layers[l].delta[row]);
            } else {
                for (uint32_t e = g.offsets[t]; e < g.offsets[t + 1]; ++e)
                    add_entry(g.entry_sample[e], g.entry_coef[e]);
            }
            k_.weighted_vector_sum(scratch.entry_vectors.data(), scratch.entry_coefs.data(),
                                   n_dense, layer.width, grad);
            for (const auto& [s, c] : scratch.sparse_entries) {
                const layer_buffers& in = samples_[s].layers[l - 1];
                k_.scatter_axpy(c, in.ids.data(), in.act.data(), grad, uint32_t(in.ids.size()));
            }
            scratch.sparse_entries.clear();
            visit(row, grad, bias_grad);
        }
    }
}

step_report cpu_backend::train_batch(const batch_view& batch, float learning_rate) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    const auto t_start = clock_type::now();
    step_report report;
    run_forward_backward(batch, report);

    auto t0 = clock_type::now();
    model_.adam_step += 1;
    const adam_corrections corrections = adam_bias_corrections(train_, model_.adam_step);
    const adam_step step{learning_rate,       train_.adam_beta1, train_.adam_beta2,
                         train_.adam_epsilon, corrections.c1,    corrections.c2};
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        const bool dense_adam = adam_moves_untouched_rows(train_.adam, l);
        layer_state& layer = model_.layers[l];
        std::atomic<uint64_t>* row_step = row_step_.empty() ? nullptr : row_step_[l].get();
        // Adam on one row's weights and (past layer 0, whose bias is a vector) its bias.
        auto adam_row = [&](uint32_t row, const float* grad, float bias_grad) {
            if (row_step) {
                // The forward pass brought it up to date at the previous step.
                HSLIDE_ASSERT(row_step[row].load(std::memory_order_relaxed) + 1 ==
                              model_.adam_step);
                row_step[row].store(model_.adam_step, std::memory_order_relaxed);
            }
            const size_t off = size_t(row) * layer.stride;
            k_.adam(layer.weights.data() + off, layer.adam_m.data() + off,
                    layer.adam_v.data() + off, grad, layer.width, step);
            if (use_bf16()) k_.to_bf16(layer.row(row), weights16_[l].row(row), layer.width);
            if (l > 0)
                k_.adam(&layer.bias[row], &layer.bias_m[row], &layer.bias_v[row], &bias_grad, 1,
                        step);
        };
        const bool all_rows = l > 0 && !model_.config.is_sparse(l);
        if (!all_rows) group_rows(batch, l);
        for_each_row_gradient(batch, l, adam_row);
        mark_updated_rows(l, all_rows || dense_adam);
        row_groups& g = groups_[l];
        if (dense_adam && !all_rows) {
            // SLIDE's behaviour: rows the batch did not touch still move with their momentum.
            const std::vector<float> zero(layer.stride, 0.0f);
#pragma omp parallel for schedule(static) num_threads(threads_)
            for (int64_t r = 0; r < int64_t(layer.rows); ++r)
                if (g.slot[r] < 0) adam_row(uint32_t(r), zero.data(), 0.0f);
        }
        for (uint32_t row : g.touched) g.slot[row] = -1;
        g.touched.clear();
    }
    {
        layer_state& layer = model_.layers[0];
        layer0_bias_grad_.assign(layer.width, 0.0f);
        add_layer0_bias_gradient(batch, layer0_bias_grad_.data());
        k_.adam(layer.bias.data(), layer.bias_m.data(), layer.bias_v.data(),
                layer0_bias_grad_.data(), layer.width, step);
    }
    if (catches_up()) {
        catch_up_.record_step(learning_rate);
        rows_behind_ = true;
    }
    report.times.update = seconds_since(t0);
    report.seconds = seconds_since(t_start);
    return report;
}

void cpu_backend::add_layer0_bias_gradient(const batch_view& batch, float* out) const {
    // Layer 0's bias is one dense vector: its gradient is the mean of the layer-0 deltas.
    for (uint32_t s = 0; s < batch.size; ++s)
        if (samples_[s].trained)
            k_.axpy(1.0f / float(batch.size), samples_[s].layers[0].delta.data(), out,
                    model_.layers[0].width);
}

double cpu_backend::compute_gradient(const batch_view& batch, model_state& gradient) {
    complete_deferred_updates();
    step_report report;
    run_forward_backward(batch, report);
    gradient = model_state::layout(model_.config);
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        const layer_state& src = model_.layers[l];
        layer_state& dst = gradient.layers[l];
        dst.weights.resize(size_t(src.rows) * src.stride);
        dst.bias.assign(src.bias.size(), 0.0f);
        const bool all_rows = l > 0 && !model_.config.is_sparse(l);
        if (!all_rows) group_rows(batch, l);
        for_each_row_gradient(batch, l, [&](uint32_t row, const float* grad, float bias_grad) {
            std::memcpy(dst.row(row), grad, src.width * sizeof(float));
            if (l > 0) dst.bias[row] = bias_grad;
        });
        for (uint32_t row : groups_[l].touched) groups_[l].slot[row] = -1;
        groups_[l].touched.clear();
    }
    add_layer0_bias_gradient(batch, gradient.layers[0].bias.data());
    return report.loss_sum / batch.size;
}

void cpu_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                          uint32_t* labels, float* scores) {
    HSLIDE_CHECK(k > 0, "top-k must be positive");
    complete_deferred_updates();
    const size_t out_layer = model_.layers.size() - 1;
    const bool exact = scoring == scoring_mode::exact ||
                       (scoring == scoring_mode::automatic && !output_is_sparse());
    // The blocked exact path needs the output layer's input as a dense vector per sample.
    if (exact && !model_.config.is_sparse(out_layer - 1))
        return predict_exact(batch, k, labels, scores);
    // One buffer set per thread, not per sample: exact scores of 670k labels are 2.7 MB a point.
    ensure_buffers(uint32_t(threads_));
    const uint64_t seed = predict_seed();
    const output_pass pass = exact ? output_pass::every_neuron : output_pass::active_set;
#pragma omp parallel num_threads(threads_)
    {
        const int thread = omp_get_thread_num();
        thread_scratch& scratch = scratch_[thread];
        std::vector<scored_label> heap;
#pragma omp for schedule(dynamic, 4)
        for (int64_t s = 0; s < int64_t(batch.size); ++s) {
            forward_sample(*batch.data, batch.rows[s], uint32_t(thread), false, pass,
                           derive_seed(seed, uint64_t(s)), scratch);
            const layer_buffers& out = samples_[thread].layers[out_layer];
            select_top_k(out.act.data(), out.ids.empty() ? nullptr : out.ids.data(),
                         uint32_t(out.act.size()), k, labels + size_t(s) * k,
                         scores + size_t(s) * k, heap);
        }
    }
}

void cpu_backend::predict_exact(const batch_view& batch, uint32_t k, uint32_t* labels,
                                float* scores) {
    // Scoring a point against every output row one point at a time streams the whole layer
    // from memory per point (686 MB at 670k x 256): memory-bound, ~30 ms a point on 2 cores.
    // Here a block of rows small enough to stay in L2 is scored against a chunk of points
    // before the next block is read, so the layer streams once a chunk. In fp32, dots16
    // multiplies the block by 16 points at once (the hidden vectors transposed): a GEMM
    // without horizontal sums. Its sums run in element order, so scores can differ from the
    // per-point kernel's in the last bits; bf16 keeps the per-point kernel over the block.
    const size_t out_layer = model_.layers.size() - 1;
    const layer_state& layer = model_.layers[out_layer];
    const uint32_t width = layer.width;
    const size_t in_stride = use_bf16() ? weights16_[out_layer].stride : layer.stride;
    const size_t value_bytes = use_bf16() ? sizeof(bf16) : sizeof(float);
    const uint32_t block_rows = uint32_t(std::clamp<size_t>(
        (size_t(512) << 10) / (in_stride * value_bytes), 16, std::max<size_t>(layer.rows, 16)));
    const int64_t n_blocks = (int64_t(layer.rows) + block_rows - 1) / block_rows;
    // Each thread keeps a min-heap of the best `kept` labels per point over the blocks it
    // scores (offer_top_k, as select_top_k ranks them).
    const uint32_t kept = std::min(k, layer.rows);
    // 256 points a chunk, fewer when k is large: at most 2^22 candidates (32 MiB) a thread.
    const uint32_t chunk = uint32_t(std::clamp<uint64_t>((uint64_t{1} << 22) / kept, 1, 256));
    const uint64_t seed = predict_seed();
    ensure_buffers(std::min(chunk, batch.size));
    // fp32: groups of 16 transposed points (the chunk rounded up to 16); bf16: a row a point
    // (using half of each in_stride floats).
    hidden_matrix_.resize(size_t(chunk + 15) / 16 * 16 * in_stride);
    std::vector<std::vector<scored_label>> best(static_cast<size_t>(threads_));
    std::vector<std::vector<uint32_t>> best_count(static_cast<size_t>(threads_));
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
#pragma omp parallel num_threads(threads_)
        {
            const int thread = omp_get_thread_num();
            thread_scratch& scratch = scratch_[thread];
#pragma omp for schedule(dynamic, 4)
            for (int64_t s = 0; s < int64_t(n); ++s) {
                // The hidden layers only (the seed serves LSH hidden layers, as per point).
                forward_sample(*batch.data, batch.rows[begin + s], uint32_t(s), false,
                               output_pass::skip, derive_seed(seed, uint64_t(begin) + uint64_t(s)),
                               scratch);
                const std::vector<float>& h = samples_[s].layers[out_layer - 1].act;
                if (use_bf16()) {
                    k_.to_bf16(
                        h.data(),
                        reinterpret_cast<bf16*>(hidden_matrix_.data()) + size_t(s) * in_stride,
                        width);
                } else {
                    // Groups of 16 points, each transposed: element i of point s at
                    // [(s / 16) * width * 16 + i * 16 + s % 16].
                    float* group = hidden_matrix_.data() + size_t(s / 16) * width * 16;
                    for (uint32_t i = 0; i < width; ++i) group[size_t(i) * 16 + s % 16] = h[i];
                }
            }
            // The last group's missing points: zeros (their scores are never read).
            if (!use_bf16())
#pragma omp single
                for (uint32_t s = n; s % 16 != 0; ++s) {
                    float* group = hidden_matrix_.data() + size_t(s / 16) * width * 16;
                    for (uint32_t i = 0; i < width; ++i) group[size_t(i) * 16 + s % 16] = 0.0f;
                }
            std::vector<scored_label>& heaps = best[size_t(thread)];
            std::vector<uint32_t>& counts = best_count[size_t(thread)];
            heaps.resize(size_t(n) * kept);
            counts.assign(n, 0);
            constexpr uint32_t inputs = 16;  // points per dots16 call
            std::vector<float>& logits = scratch.dense;
            logits.resize(size_t(inputs) * block_rows);
#pragma omp for schedule(dynamic, 1)
            for (int64_t blk = 0; blk < n_blocks; ++blk) {
                const uint32_t r0 = uint32_t(blk) * block_rows;
                const uint32_t nb = std::min(block_rows, layer.rows - r0);
                for (uint32_t s0 = 0; s0 < n; s0 += inputs) {
                    const uint32_t n_x = std::min(inputs, n - s0);
                    // Score of row r0 + i for point s0 + j: logits[i * row_step + j * col_step].
                    size_t row_step = 1, col_step = block_rows;
                    if (use_bf16()) {
                        const bf16_weights& w16 = weights16_[out_layer];
                        const bf16* x16 = reinterpret_cast<const bf16*>(hidden_matrix_.data());
                        for (uint32_t j = 0; j < n_x; ++j)
                            k_.active_dots_bf16(w16.row(r0), w16.stride, width, nullptr, nb,
                                                x16 + size_t(s0 + j) * in_stride,
                                                layer.bias.data() + r0,
                                                logits.data() + size_t(j) * block_rows);
                    } else {
                        k_.dots16(layer.row(r0), layer.stride, width, nb,
                                  hidden_matrix_.data() + size_t(s0) * width,
                                  layer.bias.data() + r0, logits.data());
                        row_step = inputs;
                        col_step = 1;
                    }
                    for (uint32_t j = 0; j < n_x; ++j) {
                        const float* z = logits.data() + size_t(j) * col_step;
                        scored_label* heap = heaps.data() + size_t(s0 + j) * kept;
                        for (uint32_t i = 0; i < nb; ++i)
                            offer_top_k(heap, counts[s0 + j], kept,
                                        {z[size_t(i) * row_step], r0 + i});
                    }
                }
            }
            // Merge the team's candidates per point (after the loop's implicit barrier; the
            // team may be smaller than threads_ when OpenMP limits it).
            const int team = omp_get_num_threads();
            std::vector<scored_label> top;
            std::vector<float> cand_score;
            std::vector<uint32_t> cand_id;
#pragma omp for schedule(static)
            for (int64_t s = 0; s < int64_t(n); ++s) {
                cand_score.clear();
                cand_id.clear();
                for (int t = 0; t < team; ++t)
                    for (uint32_t j = 0; j < best_count[size_t(t)][size_t(s)]; ++j) {
                        const scored_label& c = best[size_t(t)][size_t(s) * kept + j];
                        cand_score.push_back(c.first);
                        cand_id.push_back(c.second);
                    }
                const size_t at = size_t(begin + uint32_t(s)) * k;
                select_top_k(cand_score.data(), cand_id.data(), uint32_t(cand_score.size()), k,
                             labels + at, scores + at, top);
            }
        }
    }
}

void cpu_backend::export_state(model_state& out, bool with_optimizer) const {
    const model_state& model = *host_state();  // every row up to date
    out = with_optimizer ? model : model.parameters();
}

void cpu_backend::import_state(const model_state& in, bool with_optimizer) {
    model_.assign(in, with_optimizer);
    std::vector<uint32_t> discard;
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        changed_[l].take(discard);  // a new starting point for take_changed_rows
        if (use_bf16()) refresh_bf16_layer(l);
        if (model_.config.is_sparse(l)) {
            lsh_[l].stale.mark_all();
            build_layer_tables(l);
        }
    }
    // New Adam state: every row is up to date at its step. Parameters alone keep the
    // replica's moments and step, and with them its rows' deferred steps.
    if (catches_up() && with_optimizer) {
        restart_catch_up();
        rows_behind_ = false;
    }
}

bool cpu_backend::take_changed_rows(row_sets& rows) {
    rows.resize(model_.layers.size());
    for (size_t l = 0; l < model_.layers.size(); ++l) changed_[l].take(rows[l]);
    return true;
}

void cpu_backend::export_rows(const row_sets& rows, model_state& out) const {
    out.copy_rows(model_, rows);
}

void cpu_backend::import_rows(const model_state& in, const row_sets& rows) {
    HSLIDE_CHECK(in.layers.size() == model_.layers.size() && rows.size() == model_.layers.size(),
                 "imported rows: {} layers of a {}-layer model, this one has {}", rows.size(),
                 in.layers.size(), model_.layers.size());
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        layer_state& dst = model_.layers[l];
        const layer_state& src = in.layers[l];
        HSLIDE_CHECK(src.rows == dst.rows && src.width == dst.width && src.stride == dst.stride &&
                         src.weights.size() == dst.weights.size() &&
                         src.bias.size() == dst.bias.size(),
                     "imported layer {} is {}x{}, this model's is {}x{}", l, src.rows, src.width,
                     dst.rows, dst.width);
        check_row_ids(l, rows[l]);
        copy_and_refresh_rows(l, rows[l], &src);
        if (l == 0) {
            dst.bias = src.bias;
        } else {
            for (uint32_t r : rows[l]) dst.bias[r] = src.bias[r];
        }
    }
}

void cpu_backend::rows_written(const row_sets& rows) {
    HSLIDE_CHECK(rows.size() == model_.layers.size(), "rows written: {} layers of a {}-layer model",
                 rows.size(), model_.layers.size());
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        check_row_ids(l, rows[l]);
        copy_and_refresh_rows(l, rows[l], nullptr);
    }
}

void cpu_backend::check_row_ids(size_t l, const std::vector<uint32_t>& ids) const {
    for (uint32_t r : ids)
        HSLIDE_CHECK(r < model_.layers[l].rows,
                     "imported row {} of layer {} is out of range ({} rows)", r, l,
                     model_.layers[l].rows);
}

void cpu_backend::copy_and_refresh_rows(size_t l, const std::vector<uint32_t>& ids,
                                        const layer_state* src) {
    layer_state& dst = model_.layers[l];
    if (src || use_bf16()) {
        // The bf16 copy is rounded while the row is in cache.
#pragma omp parallel for schedule(static) num_threads(threads_) if (ids.size() >= 1024)
        for (int64_t k = 0; k < int64_t(ids.size()); ++k) {
            const uint32_t r = ids[size_t(k)];
            if (src) std::memcpy(dst.row(r), src->row(r), dst.stride * sizeof(float));
            if (use_bf16()) k_.to_bf16(dst.row(r), weights16_[l].row(r), dst.width);
        }
    }
    // Imported rows are not this replica's changes (take_changed_rows), but their codes are
    // stale: the next rebuild re-hashes them.
    if (model_.config.is_sparse(l))
        for (uint32_t r : ids) lsh_[l].stale.mark(r);
}

backend_info cpu_backend::info() const {
    backend_info bi;
    bi.kind = to_string(backend_kind::cpu);
    bi.device = read_system_info().cpu_model + " (" + std::to_string(threads_) + " threads, " +
                k_.name + ")";
    bi.precision = to_string(precision_);
    bi.memory_bytes = model_.memory_bytes();
    for (const bf16_weights& w16 : weights16_) bi.memory_bytes += w16.values.size() * sizeof(bf16);
    return bi;
}

}  // namespace hslide::cpu
