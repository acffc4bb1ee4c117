// The CPU backend's label-sharded output layer (cpu_backend.hpp, "A label-sharded output
// layer"): what is sharded, each rank's members of a set, the set softmax and loss over ranks
// (Megatron's vocab-parallel cross-entropy), the hidden gradient summed in rank order, the
// replicas' check and prediction's merge.
#include "cpu_backend.hpp"
#include "shard_merge.hpp"
#include "top_k.hpp"

#include "hslide/clock.hpp"
#include "hslide/error.hpp"

#include <spdlog/spdlog.h>
#include <xxhash.h>

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
    const bool full_partition = output_selection().computes_log_partition();
    shard_comm& comm = *shard_.comm;
    double comm_seconds = 0;
    auto collective = [&](auto&& call) {
        const auto t0 = clock_type::now();
        call();
        comm_seconds += seconds_since(t0);
    };
    // This rank's labels of sample s: act[] indices (sparse: the list's first shard_labels).
    auto for_my_labels = [&](uint32_t s, const label_row& y, auto&& visit) {
        if (sparse) {
            for (uint32_t i = 0; i < samples_[s].shard_labels; ++i) visit(i);
        } else {
            for (uint32_t i = 0; i < y.count; ++i)
                if (y.ids[i] - first < count) visit(y.ids[i] - first);
        }
    };
    const auto t_forward = clock_type::now();
    // 1. The set's maximum logit, over ranks (exact: a maximum does not depend on the order).
    shard_max_.assign(n, -std::numeric_limits<float>::infinity());
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t s = 0; s < int64_t(n); ++s)
        for (float a : samples_[s].layers[out].act) shard_max_[s] = std::max(shard_max_[s], a);
    collective([&] { comm.all_reduce_max(shard_max_.data(), n); });
    // 2. Per sample, over ranks in rank order: the sum of exponentials (as the softmax kernel
    // sums them: float exponentials added in double), the full softmax's mass the set keeps
    // (exact top-k), and the labels' target-weighted logits (the loss).
    shard_sums_.assign(size_t(n) * 3, 0.0);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t s = 0; s < int64_t(n); ++s) {
        const label_row y = batch.data->labels(batch.rows[s]);
        if (y.count == 0) continue;
        const sample_buffers& sb = samples_[s];
        const std::vector<float>& act = sb.layers[out].act;
        double* sums = shard_sums_.data() + size_t(s) * 3;
        for (float a : act) {
            sums[0] += std::exp(a - shard_max_[s]);
            if (full_partition) sums[1] += std::exp(double(a) - sb.log_partition);
        }
        const float target = 1.0f / float(y.count);
        for_my_labels(uint32_t(s), y, [&](uint32_t i) { sums[2] += double(target) * act[i]; });
    }
    collective([&] { comm.all_reduce_sum(shard_sums_.data(), shard_sums_.size()); });
    // 3. Deltas (softmax over the set minus the targets) and the loss, every rank the same.
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t s = 0; s < int64_t(n); ++s) {
        sample_buffers& sb = samples_[s];
        layer_buffers& lb = sb.layers[out];
        const label_row y = batch.data->labels(batch.rows[s]);
        sb.trained = y.count > 0;
        sb.loss = 0;
        sb.dropped_mass = 0;
        lb.delta.assign(lb.act.size(), 0.0f);
        if (!sb.trained) continue;
        const double* sums = shard_sums_.data() + size_t(s) * 3;
        const float inv_sum = float(1.0 / sums[0]);
        for (size_t i = 0; i < lb.act.size(); ++i)
            lb.delta[i] = std::exp(lb.act[i] - shard_max_[s]) * inv_sum;
        const float target = 1.0f / float(y.count);
        for_my_labels(uint32_t(s), y, [&](uint32_t i) { lb.delta[i] -= target; });
        // As output_loss: the set's log-sum-exp, or the full softmax's through the exact
        // log-partition (the gradient stays the set's softmax).
        const double log_sum =
            full_partition ? sb.log_partition : double(shard_max_[s]) + std::log(sums[0]);
        if (full_partition) sb.dropped_mass = std::max(0.0, 1.0 - sums[1]);
        sb.loss = double(target) * double(y.count) * log_sum - sums[2];
    }
    const double forward_comm_seconds = comm_seconds;
    report.times.forward += seconds_since(t_forward) - forward_comm_seconds;
    // 4. Each rank's share of the last hidden layer's gradient, in double (its products are
    // exact there), summed over ranks in rank order and rounded to float once: the result does
    // not depend on how the rows were split (up to the double sums' roundings, which a float
    // rounding almost never sees), so N ranks compute the bits one rank does, and every rank
    // the same bits. Then the backward of the layers below.
    const auto t_backward = clock_type::now();
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
    XXH3_state_t* state = XXH3_createState();
    HSLIDE_ASSERT(state);
    XXH3_64bits_reset(state);
    auto add = [&](const void* p, size_t bytes) {
        if (bytes) XXH3_64bits_update(state, p, bytes);
    };
    add(&model_.adam_step, sizeof model_.adam_step);
    for (size_t l = 0; l + 1 < model_.layers.size(); ++l) {
        const layer_state& layer = model_.layers[l];
        add(layer.weights.data(), layer.weights.size() * sizeof(float));
        add(layer.adam_m.data(), layer.adam_m.size() * sizeof(float));
        add(layer.adam_v.data(), layer.adam_v.size() * sizeof(float));
        add(layer.bias.data(), layer.bias.size() * sizeof(float));
        add(layer.bias_m.data(), layer.bias_m.size() * sizeof(float));
        add(layer.bias_v.data(), layer.bias_v.size() * sizeof(float));
    }
    const uint64_t hash = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return hash;
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
