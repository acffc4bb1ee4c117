// LSH neuron selection (lsh_selector.hpp).
#include "lsh_selector.hpp"

#include "hslide/clock.hpp"

#include <omp.h>

namespace hslide::cpu {

lsh_selector::lsh_selector(rows_source rows, const layer_config& config,
                           const kernel_table& kernels, int threads)
    : neuron_selector(std::move(rows), kernels, threads),
      lsh_(config.lsh),
      active_(config.active),
      stale_(this->rows().rows),
      scratch_(size_t(threads)) {
    for (thread_scratch& s : scratch_) {
        s.builder = active_set_builder(this->rows().rows);
        s.codes.resize(size_t(lsh_.L));
    }
}

void lsh_selector::rows_changed(const uint32_t* ids, size_t n) {
    for (size_t i = 0; i < n; ++i) stale_.mark(ids[i]);
}

void lsh_selector::refresh(const refresh_point& at) {
    const layer_rows layer = rows();
    const uint32_t n = layer.rows, L = uint32_t(lsh_.L);
    if (!hash_ || hash_->seed() != at.hash_seed) {
        hash_ = hash_family::create(lsh_, layer.width, at.hash_seed);
        stale_.mark_all();  // new functions: every code changes
    }
    if (codes_.size() != size_t(n) * L) {
        codes_.resize(size_t(n) * L);
        stale_.mark_all();
    }
    // Only the rows changed or imported since they were hashed: the others' codes stand.
    std::vector<uint32_t> stale;
    stale_.take(stale);
    const hash_family& hash = *hash_;
    uint32_t* codes = codes_.data();
#pragma omp parallel for schedule(dynamic, 256) num_threads(threads_)
    for (int64_t k = 0; k < int64_t(stale.size()); ++k)
        hash.codes_dense(layer.row(stale[k]), &codes[size_t(stale[k]) * L]);
    if (tables_.n_items() == 0) tables_ = lsh_tables(lsh_);
    // The insertion order depends on the step count, so a resumed run rebuilds identically.
    tables_.build(codes, n, derive_seed(at.hash_seed, at.step));
}

void lsh_selector::select(selection_batch& batch, stage_times& times) {
    if (shard_.sharded()) return select_sharded(batch, times);
    for (thread_scratch& s : scratch_) s.times = {};
#pragma omp parallel num_threads(threads_)
    {
        const int thread = omp_get_thread_num();
#pragma omp for schedule(dynamic, 2)
        for (int64_t s = 0; s < int64_t(batch.size); ++s)
            select_one(batch.samples[s], batch.training, thread);
    }
    // Per-thread CPU seconds, averaged: the share of the parallel phase each stage took.
    for (const thread_scratch& s : scratch_) {
        times.hashing += s.times.hashing / threads_;
        times.active_sets += s.times.active_sets / threads_;
    }
}

uint32_t lsh_selector::hash_sample(const selection_sample& sample, bool training,
                                   thread_scratch& scratch) {
    const auto t0 = clock_type::now();
    const hash_family& hash = *hash_;
    const bool dense = sample.input_ids == nullptr;
    // Queries probe nearby buckets too (a dense input only; training never does).
    const uint32_t probes = training || !dense ? 0 : active_.probes;
    if (scratch.codes.size() < size_t(lsh_.L) * (1 + probes))
        scratch.codes.resize(size_t(lsh_.L) * (1 + probes));
    if (probes > 0)
        hash.probe_codes_dense(sample.input, probes, scratch.codes.data());
    else if (dense)
        hash.codes_dense(sample.input, scratch.codes.data());
    else
        hash.codes_sparse(sample.input_ids, sample.input, sample.input_count, scratch.codes.data());
    scratch.times.hashing += seconds_since(t0);
    return 1 + probes;
}

void lsh_selector::select_one(selection_sample& sample, bool training, int thread) {
    thread_scratch& scratch = scratch_[size_t(thread)];
    const uint32_t codes_per_table = hash_sample(sample, training, scratch);
    const auto t0 = clock_type::now();
    scratch.builder.build(tables_, scratch.codes.data(), sample.labels.ids, sample.labels.count,
                          active_, *sample.gen, *sample.ids, codes_per_table);
    scratch.times.active_sets += seconds_since(t0);
}

}  // namespace hslide::cpu
