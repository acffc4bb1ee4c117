// The CPU backend's label-sharded output layer (cpu_backend.hpp, "A label-sharded output
// layer"): what is sharded, each rank's members of a set, the set softmax and loss over ranks
// (Megatron's vocab-parallel cross-entropy) or the logistic loss, the hidden gradient summed
// in rank order, the replicas' check and prediction's merge.
#include "cpu_backend.hpp"
#include "shard_merge.hpp"
#include "top_k.hpp"

#include "hslide/clock.hpp"
#include "hslide/error.hpp"
#include "hslide/shard_softmax.hpp"

#include <spdlog/spdlog.h>

#include <omp.h>

#include <cmath>
#include <limits>

namespace hslide::cpu {

void cpu_backend::check_shardable() const {
    const size_t out = model_.layers.size() - 1;
    const layer_config& c = model_.config.layers[out];
    const int ranks = shard_.comm->size();
    HSLIDE_ASSERT(model_.layers[out].rows == shard_.count &&
                  model_.layers[out].bias.size() == shard_.count &&
                  shard_.first + shard_.count <= shard_.total && c.size == shard_.total);
    HSLIDE_CHECK_KIND(!model_.config.uses_lsh(out) || !adam_catches_up_rows(train_.adam, out),
                      error_kind::unsupported,
                      "--adam {}: an LSH output layer sharded across MPI ranks ({} ranks) does "
                      "not catch its rows up (use input-catch-up, the default, or sparse)",
                      to_string(train_.adam), ranks);
    HSLIDE_CHECK_KIND(c.fill_correction == 0.0f, error_kind::unsupported,
                      "--fill-correction is not sharded across MPI ranks ({} ranks): leave it at 0",
                      ranks);
    for (size_t l = 1; l < out; ++l)
        HSLIDE_CHECK_KIND(!model_.config.has_active_sets(l), error_kind::unsupported,
                          "--hidden-sparsity: hidden layer {} has active sets, which a run sharded "
                          "across MPI ranks ({} ranks) does not support yet (dense hidden layers)",
                          l, ranks);
}

void cpu_backend::keep_shard_members(const batch_view& batch) {
    const size_t out = model_.layers.size() - 1;
    if (!model_.config.has_active_sets(out)) return;  // every row of the shard
    const uint32_t first = shard_.first, count = shard_.count;
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t s = 0; s < int64_t(batch.size); ++s) {
        sample_buffers& sb = samples_[s];
        std::vector<uint32_t>& ids = sb.layers[out].ids;  // the whole set, labels first
        const uint32_t labels = batch.data->labels(batch.rows[s]).count;
        sb.set_size = uint32_t(ids.size());
        sb.shard_labels = 0;
        size_t kept = 0;
        // In set order, so this rank's labels lead its list as the labels lead the set.
        for (size_t i = 0; i < ids.size(); ++i)
            if (ids[i] - first < count) {
                if (i < labels) ++sb.shard_labels;
                ids[kept++] = ids[i] - first;
            }
        ids.resize(kept);
    }
}

void cpu_backend::sharded_output_backward(const batch_view& batch, step_report& report) {
    const size_t out = model_.layers.size() - 1;
    const uint32_t n = batch.size, first = shard_.first, count = shard_.count;
    const bool sparse = model_.config.has_active_sets(out);
    shard_comm& comm = *shard_.comm;
    const auto t_forward = clock_type::now();
    // The set softmax, or the logistic loss, over ranks (shard_softmax.hpp). A sparse set
    // lists its labels first (keep_shard_members); every row's activations are indexed by row,
    // so this rank's labels are their rows.
    shard_softmax_.resize(n);
    std::vector<uint32_t>& label_begin = shard_label_begin_;
    if (!sparse)
        shard_label_rows(*batch.data, batch.rows, n, first, count, shard_label_index_, label_begin);
    for (uint32_t s = 0; s < n; ++s) {
        sample_buffers& sb = samples_[s];
        layer_buffers& lb = sb.layers[out];
        lb.delta.resize(lb.act.size());
        shard_softmax_sample& x = shard_softmax_[s];
        x.logits = lb.act.data();
        x.delta = lb.delta.data();
        x.members = uint32_t(lb.act.size());
        x.label_index = sparse ? nullptr : shard_label_index_.data() + label_begin[s];
        x.label_members = sparse ? sb.shard_labels : label_begin[s + 1] - label_begin[s];
        x.labels = batch.data->labels(batch.rows[s]).count;
        x.log_partition = sb.log_partition;
    }
    double comm_seconds =
        train_.loss == hslide::output_loss::logistic
            ? sharded_set_logistic(comm, shard_softmax_.data(), n, threads_, shard_sums_)
            : sharded_set_softmax(comm, shard_softmax_.data(), n,
                                  output_selection().computes_log_partition(), threads_,
                                  shard_sums_);
    for (uint32_t s = 0; s < n; ++s) {
        sample_buffers& sb = samples_[s];
        sb.trained = shard_softmax_[s].labels > 0;
        sb.loss = shard_softmax_[s].loss;
        sb.dropped_mass = shard_softmax_[s].dropped_mass;
    }
    const double forward_comm_seconds = comm_seconds;
    report.times.forward += seconds_since(t_forward) - forward_comm_seconds;
    // Each rank's share of the last hidden layer's gradient, in double (its products are
    // exact there), summed over ranks in rank order and rounded to float once: the result does
    // not depend on how the rows were split (up to the double sums' roundings, which a float
    // rounding almost never sees), so N ranks compute the bits one rank does, and every rank
    // the same bits. Then the backward of the layers below.
    const auto t_backward = clock_type::now();
    auto collective = [&](auto&& call) {
        const auto t0 = clock_type::now();
        call();
        comm_seconds += seconds_since(t0);
    };
    const layer_state& layer = model_.layers[out];
    const uint32_t width = layer.width;
    shard_grad_.assign(size_t(n) * width, 0.0);
#pragma omp parallel for schedule(dynamic, 2) num_threads(threads_)
    for (int64_t s = 0; s < int64_t(n); ++s) {
        const layer_buffers& lb = samples_[s].layers[out];
        if (!samples_[s].trained || (sparse && lb.ids.empty())) continue;
        const uint32_t members = lb.ids.empty() ? layer.rows : uint32_t(lb.ids.size());
        const uint32_t* ids = lb.ids.empty() ? nullptr : lb.ids.data();
        double* share = shard_grad_.data() + size_t(s) * width;
        if (use_bf16())
            k_.weighted_row_sum_bf16_f64(weights16_[out].values.data(), weights16_[out].stride,
                                         width, ids, lb.delta.data(), members, share);
        else
            k_.weighted_row_sum_f64(layer.weights.data(), layer.stride, width, ids, lb.delta.data(),
                                    members, share);
    }
    collective([&] { comm.all_reduce_sum(shard_grad_.data(), shard_grad_.size()); });
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 2)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            if (!samples_[s].trained) continue;
            const double* sum = shard_grad_.data() + size_t(s) * width;
            scratch.dense.resize(width);  // backward_sample's buffer, free until it starts
            for (uint32_t i = 0; i < width; ++i) scratch.dense[i] = float(sum[i]);
            mask_delta(out - 1, uint32_t(s), scratch.dense.data());
            backward_sample(uint32_t(s), scratch, out - 1);
        }
    }
    // The collectives' seconds are the step's transfer (train_batch reads them off the group).
    report.times.backward += seconds_since(t_backward) - (comm_seconds - forward_comm_seconds);
}

uint64_t cpu_backend::replicated_checksum() const {
    return replicated_layers_checksum(model_.adam_step, model_.layers.data(),
                                      model_.layers.size() - 1);
}

step_report cpu_backend::synchronize() {
    if (!shard_.sharded()) return {};
    const uint64_t checksum = replicated_checksum();
    shard_.comm->check_same(checksum,
                            "the replicated layers' checksum (they must stay bit-identical)");
    spdlog::debug("the replicated layers are the same on all {} ranks (checksum {:016x})",
                  shard_.comm->size(), checksum);
    return {};
}

void cpu_backend::predict_shard_sets(const batch_view& batch, uint32_t k, uint32_t* labels,
                                     float* scores) {
    const size_t out = model_.layers.size() - 1;
    const uint32_t chunk = 256, first = shard_.first, count = shard_.count;
    const uint64_t seed = predict_seed();
    ensure_buffers(std::min(chunk, batch.size));
    std::vector<selection_sample> views;
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        // Point begin + s draws from derive_seed(seed, begin + s), as the per-sample pass.
        forward_hidden_chunk(batch, begin, n, seed);
        views.resize(n);
        for (uint32_t s = 0; s < n; ++s) views[s] = selection_view(out, s);  // no labels
        selection_batch b{views.data(), n, /*training=*/false, model_.adam_step, n};
        stage_times ignored;
        output_selection().select(b, ignored);
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
            std::vector<scored_label> heap;
#pragma omp for schedule(dynamic, 4)
            for (int64_t s = 0; s < int64_t(n); ++s) {
                layer_buffers& lb = samples_[s].layers[out];
                size_t kept = 0;  // this rank's members, in its ids
                for (uint32_t id : lb.ids)
                    if (id - first < count) lb.ids[kept++] = id - first;
                lb.ids.resize(kept);
                if (kept == 0)
                    lb.act.clear();  // no member here (empty ids would be every row)
                else
                    layer_products(out, uint32_t(s), scratch);
                const size_t at = size_t(begin + uint32_t(s)) * k;
                select_top_k(lb.act.data(), lb.ids.data(), uint32_t(lb.act.size()), k, labels + at,
                             scores + at, heap);
            }
        }
    }
}

void cpu_backend::merge_shard_predictions(uint32_t n, uint32_t k, uint32_t* labels, float* scores) {
    merge_shard_top_k(*shard_.comm, shard_.first, n, k, labels, scores, nullptr, shard_scratch_);
}

}  // namespace hslide::cpu
