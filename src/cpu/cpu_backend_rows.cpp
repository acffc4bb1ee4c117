// The CPU backend's row bookkeeping and transfers: which rows changed (for the hybrid's
// row-sparse merges and the LSH rebuild's re-hashing), whole-state and row-level export and
// import.
#include "cpu_backend.hpp"

#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace hslide::cpu {

void cpu_backend::mark_updated_rows(size_t l, bool every_row, bool copy_written) {
    if (every_row) {
        changed_[l].mark_all();
        if (selections_[l] && !copy_written) selections_[l]->all_rows_changed();
        return;
    }
    const std::vector<uint32_t>& touched = groups_[l].touched;
    for (uint32_t row : touched) changed_[l].mark(row);
    if (!copy_written) selection_rows_changed(l, touched.data(), touched.size());
}

void cpu_backend::export_state(model_state& out, bool with_optimizer) const {
    const_cast<cpu_backend*>(this)->complete_deferred_updates();  // every row up to date
    out.copy_from(model_, with_optimizer);
    if (with_optimizer) widen_moments(out);
}

void cpu_backend::parameters_replaced() {
    std::vector<uint32_t> discard;
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        changed_[l].take(discard);  // a new starting point for take_changed_rows
        if (use_bf16()) refresh_bf16_layer(l);
    }
    for (size_t l = 1; l < model_.layers.size(); ++l) {  // new rows: new codes, new clusters
        selections_[l]->all_rows_changed();
        selections_[l]->refresh({model_.adam_step, model_.hash_seeds[l]});
    }
}

bool cpu_backend::swap_parameters(model_state& other) {
    model_.check_same_layout(other);
    for (size_t l = 0; l < model_.layers.size(); ++l)
        HSLIDE_CHECK(other.layers[l].bias.size() == model_.layers[l].bias.size(),
                     "swapped layer {} has {} biases, this model's has {}", l,
                     other.layers[l].bias.size(), model_.layers[l].bias.size());
    complete_deferred_updates();  // `other` gets every row up to date, as an export would
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        std::swap(model_.layers[l].weights, other.layers[l].weights);
        std::swap(model_.layers[l].bias, other.layers[l].bias);
    }
    parameters_replaced();
    return true;
}

void cpu_backend::import_state(const model_state& in, bool with_optimizer) {
    model_.assign(in, with_optimizer);
    if (with_optimizer && !moments16_.empty()) take_moments();
    parameters_replaced();
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
    // Imported rows are not this replica's changes (take_changed_rows), but the selection's
    // codes or clusters of them are stale until its next refresh.
    selection_rows_changed(l, ids.data(), ids.size());
}

}  // namespace hslide::cpu
