// The set softmax of a label-sharded output layer (shard_softmax.hpp).
#include "hslide/shard_softmax.hpp"

#include "hslide/clock.hpp"
#include "hslide/loss.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace hslide {

namespace {

template <class Visit>
void for_label_members(const shard_softmax_sample& s, Visit&& visit) {
    for (uint32_t i = 0; i < s.label_members; ++i) visit(s.label_index ? s.label_index[i] : i);
}

}  // namespace

void shard_label_rows(const dataset& data, const uint32_t* points, uint32_t n, uint32_t first,
                      uint32_t count, std::vector<uint32_t>& rows, std::vector<uint32_t>& begin) {
    rows.clear();
    begin.assign(size_t(n) + 1, 0);
    for (uint32_t s = 0; s < n; ++s) {
        const label_row y = data.labels(points[s]);
        for (uint32_t i = 0; i < y.count; ++i)
            if (y.ids[i] - first < count) rows.push_back(y.ids[i] - first);
        begin[s + 1] = uint32_t(rows.size());
    }
}

double sharded_set_softmax(shard_comm& comm, shard_softmax_sample* samples, uint32_t n,
                           bool full_partition, int threads, shard_softmax_scratch& scratch) {
    double comm_seconds = 0;
    auto collective = [&](auto&& call) {
        const auto t0 = clock_type::now();
        call();
        comm_seconds += seconds_since(t0);
    };
    // 1. The set's maximum logit, over ranks (exact: a maximum does not depend on the order).
    std::vector<float>& max = scratch.max;
    max.assign(n, -std::numeric_limits<float>::infinity());
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t s = 0; s < int64_t(n); ++s)
        for (uint32_t i = 0; i < samples[s].members; ++i)
            max[s] = std::max(max[s], samples[s].logits[i]);
    collective([&] { comm.all_reduce_max(max.data(), n); });
    // 2. Per sample, over ranks in rank order: the sum of exponentials (as the softmax kernel
    // sums them: float exponentials added in double), the full softmax's mass the set keeps
    // (exact top-k), and the labels' target-weighted logits (the loss).
    std::vector<double>& sums_all = scratch.sums;
    sums_all.assign(size_t(n) * 3, 0.0);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t s = 0; s < int64_t(n); ++s) {
        const shard_softmax_sample& x = samples[s];
        if (x.labels == 0) continue;
        double* sums = sums_all.data() + size_t(s) * 3;
        for (uint32_t i = 0; i < x.members; ++i) {
            sums[0] += std::exp(x.logits[i] - max[s]);
            if (full_partition) sums[1] += std::exp(double(x.logits[i]) - x.log_partition);
        }
        const float target = 1.0f / float(x.labels);
        for_label_members(x, [&](uint32_t i) { sums[2] += double(target) * x.logits[i]; });
    }
    collective([&] { comm.all_reduce_sum(sums_all.data(), sums_all.size()); });
    // 3. Deltas (softmax over the set minus the targets) and the loss, every rank the same.
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t s = 0; s < int64_t(n); ++s) {
        shard_softmax_sample& x = samples[s];
        x.loss = 0;
        x.dropped_mass = 0;
        std::fill(x.delta, x.delta + x.members, 0.0f);
        if (x.labels == 0) continue;
        const double* sums = sums_all.data() + size_t(s) * 3;
        const float inv_sum = float(1.0 / sums[0]);
        for (uint32_t i = 0; i < x.members; ++i)
            x.delta[i] = std::exp(x.logits[i] - max[s]) * inv_sum;
        const float target = 1.0f / float(x.labels);
        for_label_members(x, [&](uint32_t i) { x.delta[i] -= target; });
        // As output_loss: the set's log-sum-exp, or the full softmax's through the exact
        // log-partition (the gradient stays the set's softmax).
        const double log_sum =
            full_partition ? x.log_partition : double(max[s]) + std::log(sums[0]);
        if (full_partition) x.dropped_mass = std::max(0.0, 1.0 - sums[1]);
        x.loss = double(target) * double(x.labels) * log_sum - sums[2];
    }
    return comm_seconds;
}

double sharded_set_logistic(shard_comm& comm, shard_softmax_sample* samples, uint32_t n,
                            int threads, shard_softmax_scratch& scratch) {
    std::vector<double>& losses = scratch.sums;
    losses.assign(n, 0.0);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t s = 0; s < int64_t(n); ++s) {
        shard_softmax_sample& x = samples[s];
        x.dropped_mass = 0;
        if (x.labels == 0) {
            std::fill(x.delta, x.delta + x.members, 0.0f);
            continue;
        }
        // A rank without the sample's labels still trains its members as negatives.
        losses[size_t(s)] =
            logistic_loss_gradient(x.logits, x.members, x.label_index, x.label_members, x.delta);
    }
    const auto t0 = clock_type::now();
    comm.all_reduce_sum(losses.data(), n);
    const double comm_seconds = seconds_since(t0);
    for (uint32_t s = 0; s < n; ++s) samples[s].loss = samples[s].labels > 0 ? losses[s] : 0.0;
    return comm_seconds;
}

}  // namespace hslide
