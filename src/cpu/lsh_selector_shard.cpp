// LSH selection of a label-sharded output layer (lsh_selector.hpp, "A label-sharded output
// layer"): each rank's candidates from its own tables, one all-gather, and every sample's set
// built over the whole layer, the same on every rank.
#include "lsh_selector.hpp"

#include "hslide/clock.hpp"
#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace hslide::cpu {

void lsh_selector::id_set::reset(size_t most) {
    size_t capacity = 16;
    while (capacity < 2 * most + 2) capacity <<= 1;
    if (slots_.size() < capacity) {
        slots_.assign(capacity, 0);
        generation_ = 0;
    }
    shift_ = 64 - __builtin_ctzll(uint64_t(slots_.size()));
    if (++generation_ >= (uint64_t{1} << 32)) {  // wrapped: no stale slot may match
        std::fill(slots_.begin(), slots_.end(), 0);
        generation_ = 1;
    }
}

size_t lsh_selector::id_set::slot_of(uint32_t id) const {
    size_t slot = size_t((uint64_t(id) * 0x9e3779b97f4a7c15ull) >> shift_);
    const size_t mask = slots_.size() - 1;
    while (slots_[slot] >> 32 == generation_ && uint32_t(slots_[slot]) != id)
        slot = (slot + 1) & mask;
    return slot;
}

bool lsh_selector::id_set::contains(uint32_t id) const {
    return slots_[slot_of(id)] >> 32 == generation_;
}

bool lsh_selector::id_set::insert(uint32_t id) {
    const size_t slot = slot_of(id);
    if (slots_[slot] >> 32 == generation_) return false;
    slots_[slot] = (generation_ << 32) | id;
    return true;
}

void lsh_selector::set_shard(const output_shard& shard) {
    HSLIDE_ASSERT(shard.count == rows().rows && shard.first + shard.count <= shard.total);
    shard_ = shard;
}

void lsh_selector::select_sharded(selection_batch& batch, stage_times& times) {
    const uint32_t n = batch.size, first = shard_.first, count = shard_.count;
    const uint32_t total = shard_.total;
    const int L = lsh_.L;
    const uint32_t threshold = std::max<uint32_t>(1, active_.hit_threshold);
    for (thread_scratch& s : scratch_) s.times = {};
    // 1. Each sample's candidates among this rank's rows: the union of its buckets, hit at
    // least `threshold` times, its labels here left out (they lead the set), with their hits;
    // no cut, no fill (those are the whole set's). The message: each sample's count, then
    // its (id of the whole layer, hits) pairs, sample after sample.
    std::vector<std::vector<uint32_t>> found(n);
    active_set_config union_only = active_;
    union_only.min_active = union_only.max_active = 0;
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[size_t(omp_get_thread_num())];
        rng unused;  // the union draws nothing; the sample's generator is the fill's
#pragma omp for schedule(dynamic, 2)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            const selection_sample& sample = batch.samples[s];
            const uint32_t per_table = hash_sample(sample, batch.training, scratch);
            const auto t0 = clock_type::now();
            scratch.labels.clear();
            for (uint32_t i = 0; i < sample.labels.count; ++i)
                if (sample.labels.ids[i] - first < count)
                    scratch.labels.push_back(sample.labels.ids[i] - first);
            scratch.builder.build(tables_, scratch.codes.data(), scratch.labels.data(),
                                  uint32_t(scratch.labels.size()), union_only, unused,
                                  scratch.local, per_table, &scratch.hits);
            std::vector<uint32_t>& pairs = found[size_t(s)];
            pairs.clear();
            for (size_t i = scratch.labels.size(); i < scratch.local.size(); ++i) {
                pairs.push_back(scratch.local[i] + first);
                pairs.push_back(scratch.hits[i]);
            }
            scratch.times.active_sets += seconds_since(t0);
        }
    }
    message_.assign(n, 0);
    for (uint32_t s = 0; s < n; ++s) message_[s] = uint32_t(found[s].size() / 2);
    for (uint32_t s = 0; s < n; ++s)
        message_.insert(message_.end(), found[s].begin(), found[s].end());
    // 2. Every rank's candidates.
    shard_.comm->all_gather_varying(message_.data(), message_.size() * sizeof(uint32_t), gathered_,
                                    offsets_);
    const auto t_sets = clock_type::now();
    const int ranks = shard_.comm->size();
    starts_.resize(size_t(ranks));
    std::vector<const uint32_t*> pairs_of(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
        const uint32_t* words = reinterpret_cast<const uint32_t*>(gathered_.data() + offsets_[r]);
        HSLIDE_ASSERT(offsets_[size_t(r) + 1] - offsets_[size_t(r)] >= size_t(n) * 4);
        std::vector<uint32_t>& start = starts_[size_t(r)];
        start.assign(size_t(n) + 1, 0);
        for (uint32_t s = 0; s < n; ++s) start[s + 1] = start[s] + words[s];
        pairs_of[size_t(r)] = words + n;
    }
    // 3. Each sample's set over the whole layer, as active_set_builder builds one process's:
    // the labels, the candidates in rank order (cut to max_active by hits), the random fill.
    size_t target = active_.min_active;
    if (active_.max_active > 0) target = std::min<size_t>(target, active_.max_active);
    target = std::min<size_t>(target, total);
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[size_t(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 2)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            selection_sample& sample = batch.samples[s];
            std::vector<uint32_t>& ids = *sample.ids;
            size_t candidates = 0;
            for (int r = 0; r < ranks; ++r)
                candidates += starts_[size_t(r)][s + 1] - starts_[size_t(r)][s];
            scratch.members.reset(sample.labels.count + candidates + target);
            ids.clear();
            for (uint32_t i = 0; i < sample.labels.count; ++i) {
                const uint32_t id = sample.labels.ids[i];
                HSLIDE_CHECK(id < total, "forced active id {} out of range ({} items)", id, total);
                if (scratch.members.insert(id)) ids.push_back(id);
            }
            const size_t forced = ids.size();
            hits_cut cut{threshold, std::numeric_limits<size_t>::max()};
            if (active_.max_active > 0 && forced + candidates > active_.max_active) {
                scratch.level_counts.assign(size_t(L) + 2, 0);
                for (int r = 0; r < ranks; ++r)
                    for (uint32_t j = starts_[size_t(r)][s]; j < starts_[size_t(r)][s + 1]; ++j)
                        ++scratch.level_counts[std::min<uint32_t>(pairs_of[size_t(r)][2 * j + 1],
                                                                  uint32_t(L) + 1)];
                const size_t room = active_.max_active > forced ? active_.max_active - forced : 0;
                cut = cut_by_hits(scratch.level_counts.data(), L, threshold, room);
            }
            for (int r = 0; r < ranks; ++r)
                for (uint32_t j = starts_[size_t(r)][s]; j < starts_[size_t(r)][s + 1]; ++j) {
                    const uint32_t id = pairs_of[size_t(r)][2 * j];
                    const uint32_t h = pairs_of[size_t(r)][2 * j + 1];
                    if (h < cut.level) continue;
                    if (h == cut.level) {
                        if (cut.quota == 0) continue;
                        if (cut.quota != std::numeric_limits<size_t>::max()) --cut.quota;
                    }
                    scratch.members.insert(id);
                    ids.push_back(id);
                }
            if (ids.size() < target)
                fill_randomly(
                    *sample.gen, total, target - ids.size(), total - ids.size(),
                    [&](uint32_t id) { return scratch.members.contains(id); },
                    [&](uint32_t id) {
                        scratch.members.insert(id);
                        ids.push_back(id);
                    },
                    scratch.list);
        }
    }
    // Per-thread CPU seconds, averaged, and the sets' wall time; the all-gather is the step's
    // transfer.
    for (const thread_scratch& s : scratch_) {
        times.hashing += s.times.hashing / threads_;
        times.active_sets += s.times.active_sets / threads_;
    }
    times.active_sets += seconds_since(t_sets);
}

}  // namespace hslide::cpu
