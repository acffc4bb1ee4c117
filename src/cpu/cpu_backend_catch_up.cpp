// The CPU backend's catch-up Adam: rows the steps skipped are brought up to date when a step
// next reads them, or all at once before predictions and exports (cpu_backend.hpp explains the
// claims; adam_catch_up.hpp the closed form).
#include "cpu_backend.hpp"

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <thread>

namespace hslide::cpu {

namespace {
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

void cpu_backend::restart_catch_up() {
    catch_up_.restart(model_.adam_step);
    for (size_t l = 0; l < row_step_.size(); ++l)
        if (row_step_[l])
            for (uint32_t r = 0; r < model_.layers[l].rows; ++r)
                row_step_[l][r].store(model_.adam_step, std::memory_order_relaxed);
}

void cpu_backend::catch_up_row(size_t l, uint32_t row, uint64_t from) {
    layer_state& layer = model_.layers[l];
    catch_up_step c = catch_up_.from(from);
    // The schedule's displacement is linear in the rate, its epsilon' is not (adam_catch_up.hpp).
    c.displacement *= model_.config.layers[l].lr_scale;
    const size_t off = size_t(row) * layer.stride;
    k_.catch_up(layer.weights.data() + off, layer.adam_m.data() + off, layer.adam_v.data() + off,
                layer.width, c);
    if (l > 0) k_.catch_up(&layer.bias[row], &layer.bias_m[row], &layer.bias_v[row], 1, c);
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
        // The rows first, then their catch-ups with the rows two ahead requested: the rows
        // are scattered over the layer, and each catch-up was a wait on memory (a catch-up
        // kernel 10x faster on rows in cache made no difference on Amazon-670K).
        scratch.due.clear();
        for (uint32_t s = 0; s < batch.size; ++s) {
            const feature_row x = batch.data->features(batch.rows[s]);
            for (uint32_t k = 0; k < x.count; ++k) {
                const uint32_t row = x.ids[k];
                if (row - lo >= hi - lo)
                    continue;  // another thread's (or not a row: forward says so)
                const uint64_t from = steps[row].load(std::memory_order_relaxed);
                if (from == now) continue;
                steps[row].store(now, std::memory_order_relaxed);  // listed once
                scratch.due.emplace_back(row, from);
            }
        }
        for (size_t i = 0; i < scratch.due.size(); ++i) {
            if (i + 2 < scratch.due.size()) prefetch_row_state(0, scratch.due[i + 2].first);
            const auto [row, from] = scratch.due[i];
            catch_up_row(0, row, from);
            scratch.caught_up.emplace_back(0u, row);
        }
    }
}

void cpu_backend::mark_caught_up_rows() {
    for (auto& scratch : scratch_) {
        for (const auto& [l, row] : scratch.caught_up) {
            changed_[l].mark(row);
            selection_rows_changed(l, &row, 1);
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
    // With bf16 moments model_ keeps none past the input layer: they are widened into it for
    // the reader (a checkpoint, written without a copy of the whole model) and dropped again
    // at the next step.
    if (!moments16_.empty()) widen_moments(const_cast<cpu_backend*>(this)->model_);
    // Logically const: the model is the one with every row up to date; bringing the rows
    // there changes when the deferred steps are applied, not what the model is.
    const_cast<cpu_backend*>(this)->complete_deferred_updates();
    return &model_;
}

}  // namespace hslide::cpu
