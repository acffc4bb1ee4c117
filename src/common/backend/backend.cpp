// The reports' arithmetic (step_report.hpp, worker_stats.hpp), and the whole-model stand-in
// for a backend that offers no row-level transfers (row_transfer.hpp), so that every backend
// takes part in row-sparse merges.
#include "hslide/backend.hpp"
#include "hslide/error.hpp"
#include "hslide/row_transfer.hpp"
#include "hslide/step_report.hpp"
#include "hslide/worker_stats.hpp"

#include <algorithm>

namespace hslide {

stage_times& stage_times::operator+=(const stage_times& o) {
    hashing += o.hashing;
    active_sets += o.active_sets;
    forward += o.forward;
    backward += o.backward;
    update += o.update;
    rebuild += o.rebuild;
    transfer += o.transfer;
    average += o.average;
    return *this;
}

step_report& step_report::operator+=(const step_report& o) {
    samples += o.samples;
    loss_sum += o.loss_sum;
    full_softmax_samples += o.full_softmax_samples;
    dropped_mass_sum += o.dropped_mass_sum;
    output_touched_share_sum += o.output_touched_share_sum;
    steps_counted += o.steps_counted;
    if (active_per_layer.size() < o.active_per_layer.size())
        active_per_layer.resize(o.active_per_layer.size(), 0);
    for (size_t l = 0; l < o.active_per_layer.size(); ++l)
        active_per_layer[l] += o.active_per_layer[l];
    times += o.times;
    seconds += o.seconds;
    collectives += o.collectives;
    transfer_bytes += o.transfer_bytes;
    return *this;
}

worker_stats& worker_stats::operator+=(const worker_stats& o) {
    if (o.batches > 0) {
        batch_min = batches > 0 ? std::min(batch_min, o.batch_min) : o.batch_min;
        batch_max = std::max(batch_max, o.batch_max);
        batch_last = o.batch_last;
    }
    const uint64_t all_merges = merges + o.merges;
    staleness_mean = all_merges
                         ? (staleness_mean * double(merges) + o.staleness_mean * double(o.merges)) /
                               double(all_merges)
                         : 0;
    staleness_max = std::max(staleness_max, o.staleness_max);
    samples += o.samples;
    batches += o.batches;
    batch_mean = batches ? double(samples) / double(batches) : 0;
    busy_seconds += o.busy_seconds;
    wall_seconds += o.wall_seconds;
    merges = all_merges;
    merge_seconds += o.merge_seconds;
    merge_wait_seconds += o.merge_wait_seconds;
    merge_import_seconds += o.merge_import_seconds;
    train_cpu_seconds += o.train_cpu_seconds;
    merge_cpu_seconds += o.merge_cpu_seconds;
    rows_merged += o.rows_merged;
    rows_pulled += o.rows_pulled;
    parked_seconds += o.parked_seconds;
    return *this;
}

void row_transfer::rows_written(const row_sets&) {
    HSLIDE_CHECK(false, "rows_written: this backend has no writable host state");
}

bool whole_model_rows::take_changed_rows(row_sets& rows) {
    rows.clear();
    return false;
}

void whole_model_rows::export_rows(const row_sets& rows, model_state& out) const {
    model_state whole;
    device_.export_state(whole, /*with_optimizer=*/false);
    out.copy_rows(whole, rows);
}

void whole_model_rows::import_rows(const model_state& in, const row_sets& rows) {
    // The replica's own state supplies everything the rows do not: the other rows, its hash
    // seeds and its step count.
    model_state whole;
    device_.export_state(whole, /*with_optimizer=*/false);
    whole.copy_rows(in, rows);
    device_.import_state(whole, /*with_optimizer=*/false);
}

row_transfer& rows_of(backend& device, std::unique_ptr<row_transfer>& fallback) {
    if (row_transfer* offered = device.rows()) return *offered;
    if (!fallback) fallback = std::make_unique<whole_model_rows>(device);
    return *fallback;
}

}  // namespace hslide
