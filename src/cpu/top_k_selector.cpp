// Top-k neuron selection (top_k_selector.hpp): the sets from candidates, exact and IVF search.
#include "top_k_selector.hpp"

#include "shard_merge.hpp"

#include "hslide/clock.hpp"
#include "hslide/error.hpp"
#include "hslide/seed_streams.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace hslide::cpu {

top_k_selector::top_k_selector(rows_source rows, const layer_config& config, uint64_t train_seed,
                               const kernel_table& kernels, int threads)
    : neuron_selector(std::move(rows), kernels, threads),
      config_(config),
      train_seed_(train_seed),
      rows_count_(this->rows().rows),
      scratch_(size_t(threads)) {}

uint32_t top_k_selector::top_k() const {
    return std::min(config_.top_k, rows_count_);
}

uint32_t top_k_selector::fill() const {
    return std::min(config_.active.min_active, rows_count_);
}

void top_k_selector::set_shard(const output_shard& shard) {
    HSLIDE_ASSERT(shard.count == rows().rows && shard.first + shard.count <= shard.total);
    shard_ = shard;
    rows_count_ = shard.total;
}

fill_pool top_k_selector::step_pool(uint64_t step, uint32_t batch) const {
    return {step_seed(train_seed_, seed_stream::fill_pool, step),
            fill_pool_size(config_.fill_pool, rows_count_, fill(), batch)};
}

void top_k_selector::select(selection_batch& batch, stage_times& times) {
    const auto t0 = clock_type::now();
    const uint32_t k = top_k();
    // Sharded, the merges' chunks are every rank's (shard_merge_chunk), which is the search's.
    const uint32_t chunk = exact_scoring::chunk(k);
    HSLIDE_ASSERT(!shard_.sharded() || chunk == shard_merge_chunk(k));
    const bool with_log_partition = computes_log_partition();
    double merge_seconds = 0;  // the merges' collectives: the step's transfer, not this stage
    const bool reuse = reuse_steps_ > 0 && batch.training;
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        searching_.clear();
        for (uint32_t j = 0; j < n; ++j)
            if (!reuse || !reusable(batch.samples[begin + j].key, batch.step))
                searching_.push_back(j);
        const uint32_t m = uint32_t(searching_.size());
        queries_.resize(m);
        for (uint32_t i = 0; i < m; ++i) queries_[i] = batch.samples[begin + searching_[i]].input;
        labels_.resize(size_t(n) * k);
        scores_.resize(size_t(n) * k);
        log_partition_.assign(n, 0.0);
        if (m > 0)
            search(queries_.data(), m, k, labels_.data(), scores_.data(),
                   with_log_partition ? log_partition_.data() : nullptr);
        if (reuse) {
            // The searched lists to their samples' places (backwards: searching_[i] >= i, so
            // no list is overwritten before it moves), then the kept ones, and keep the new.
            // (Their scores stay where the search wrote them: only a sharded merge reads them.)
            for (uint32_t i = m; i-- > 0;)
                if (searching_[i] != i)
                    std::copy_n(labels_.data() + size_t(i) * k, k,
                                labels_.data() + size_t(searching_[i]) * k);
            for (uint32_t j = 0, next = 0; j < n; ++j) {
                const uint32_t key = batch.samples[begin + j].key;
                uint32_t* list = labels_.data() + size_t(j) * k;
                if (next < m && searching_[next] == j) {
                    ++next;
                    keep(key, batch.step, list);
                } else {
                    std::copy_n(kept_.ids.data() + size_t(key) * k, k, list);
                }
            }
        }
        if (shard_.sharded()) {
            const double before = shard_.comm->traffic().seconds;
            merge_shard_top_k(*shard_.comm, shard_.first, n, k, labels_.data(), scores_.data(),
                              with_log_partition ? log_partition_.data() : nullptr, merge_scratch_);
            merge_seconds += shard_.comm->traffic().seconds - before;
        }
        build_sets(batch, begin, n, labels_.data(), k);
        for (uint32_t j = 0; j < n; ++j) batch.samples[begin + j].log_partition = log_partition_[j];
    }
    times.active_sets += seconds_since(t0) - merge_seconds;
}

void top_k_selector::set_candidate_reuse(uint64_t steps) {
    HSLIDE_ASSERT(!shard_.sharded() && !computes_log_partition());
    reuse_steps_ = steps;
    kept_ = candidate_cache{};
    if (steps > 0) kept_.width = top_k();
}

void top_k_selector::import_candidates(const candidate_cache& cache) {
    if (reuse_steps_ == 0) return;  // a checkpoint's candidates, unused by this run
    HSLIDE_CHECK(cache.empty() || (cache.width == top_k() &&
                                   cache.ids.size() == cache.points() * size_t(cache.width)),
                 "the checkpoint's reused candidates are {} a point for {} points in {} ids, and "
                 "this output layer keeps {}",
                 cache.width, cache.points(), cache.ids.size(), top_k());
    if (cache.empty())
        set_candidate_reuse(reuse_steps_);  // nothing kept yet
    else
        kept_ = cache;
}

bool top_k_selector::reusable(uint32_t key, uint64_t step) const {
    if (key == selection_sample::no_key || key >= kept_.points()) return false;
    // A search after `step` (kept before a return to an earlier model: a drop back to the best
    // epoch) is not the model's past: searched again.
    const uint64_t searched = kept_.steps[key];
    return searched != candidate_cache::never_searched && step >= searched &&
           step - searched < reuse_steps_;
}

void top_k_selector::keep(uint32_t key, uint64_t step, const uint32_t* ids) {
    // The first period's searches come from a model that moves fast: not worth keeping.
    if (key == selection_sample::no_key || step < reuse_steps_) return;
    const uint32_t k = kept_.width;
    if (key >= kept_.points()) {
        kept_.steps.resize(size_t(key) + 1, candidate_cache::never_searched);
        kept_.ids.resize(kept_.steps.size() * k, std::numeric_limits<uint32_t>::max());
    }
    std::copy_n(ids, k, kept_.ids.data() + size_t(key) * k);
    kept_.steps[key] = step;
}

void top_k_selector::build_sets(selection_batch& batch, uint32_t first, uint32_t n,
                                const uint32_t* best, uint32_t stride) {
    const fill_pool pool = step_pool(batch.step, batch.pool_batch);
    const uint32_t k = top_k(), target = fill();
#pragma omp parallel num_threads(threads_)
    {
        const int thread = omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t j = 0; j < int64_t(n); ++j) {
            selection_sample& s = batch.samples[first + uint32_t(j)];
            s.fill_start = build_set(best + size_t(j) * stride, k, s.labels, target, pool, *s.gen,
                                     thread, *s.ids);
        }
    }
}

uint32_t top_k_selector::build_set(const uint32_t* best, uint32_t k, const label_row& labels,
                                   uint32_t fill, const fill_pool& pool, rng& gen, int thread,
                                   std::vector<uint32_t>& ids) {
    return build_top_k_set(best, k, labels, fill, pool, rows_count_, gen, scratch_[size_t(thread)],
                           ids);
}

uint32_t build_top_k_set(const uint32_t* best, uint32_t k, const label_row& labels, uint32_t fill,
                         const fill_pool& pool, uint32_t rows, rng& gen, set_member_marks& marks,
                         std::vector<uint32_t>& ids) {
    // Labels first (the loss reads them there), then the top-k and the fill, each in
    // increasing id order (the products read them nearly in memory order): the fill apart,
    // so that its correction (fill_correction) knows where it begins.
    const label_row& y = labels;
    ids.assign(y.ids, y.ids + y.count);
    for (uint32_t i = 0; i < k && best[i] != std::numeric_limits<uint32_t>::max(); ++i)
        if (std::find(y.ids, y.ids + y.count, best[i]) == y.ids + y.count) ids.push_back(best[i]);
    std::sort(ids.begin() + y.count, ids.end());
    const uint32_t drawn_from = uint32_t(ids.size());
    if (ids.size() < fill) {
        if (marks.stamp.size() != rows) {
            marks.stamp.assign(rows, 0);
            marks.current = 0;
        }
        if (++marks.current == 0) {  // wrapped: no stale stamp may equal the new one
            std::fill(marks.stamp.begin(), marks.stamp.end(), 0);
            marks.current = 1;
        }
        for (uint32_t id : ids) marks.stamp[id] = marks.current;
        draw_fill(gen, pool, rows, uint32_t(ids.size()), fill, [&](uint32_t r) {
            if (marks.stamp[r] == marks.current) return false;
            marks.stamp[r] = marks.current;
            ids.push_back(r);
            return true;
        });
    }
    std::sort(ids.begin() + drawn_from, ids.end());
    return drawn_from;
}

}  // namespace hslide::cpu

namespace hslide {
bool cpu_exact_search_in_int8(isa_level level) {
    return isa_supported(level) && cpu::searches_int8_copy(cpu::kernels_for(level));
}
}  // namespace hslide

namespace hslide::cpu {

exact_top_k::exact_top_k(rows_source rows, const layer_config& config, uint64_t train_seed,
                         const kernel_table& kernels, int threads)
    : top_k_selector(std::move(rows), config, train_seed, kernels, threads) {
    const layer_rows layer = this->rows();
    if (config.search != top_k_search::automatic || layer.weights16 != nullptr) return;
    if (searches_int8_copy(kernels) && layer.width <= 65536) {
        copy_ = copy_kind::int8;
        rows8_ = int8_copy(layer.rows, layer.width);
    } else if (cpu_exact_search_in_bf16(kernels.level)) {
        copy_ = copy_kind::bf16;
        stride16_ = bf16_copy_stride(layer.width);
        rows16_.assign(size_t(layer.rows) * stride16_, bf16{0});
    } else {
        return;  // the fp32 rows themselves (the scalar reference's kernels)
    }
    stale_ = row_marks(layer.rows);
    stale_.mark_all();
}

neuron_selector::search_copy exact_top_k::writable_search_copy() {
    search_copy copy;
    if (copy_ == copy_kind::bf16) {
        copy.rows16 = rows16_.data();
        copy.stride16 = stride16_;
    } else if (copy_ == copy_kind::int8) {
        copy.rows8 = rows8_.view();
    }
    return copy;
}

void exact_top_k::rows_changed(const uint32_t* ids, size_t n) {
    if (copy_ == copy_kind::none) return;
    for (size_t i = 0; i < n; ++i) stale_.mark(ids[i]);
}

void exact_top_k::search(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                         float* scores, double* log_partition) {
    if (copy_ == copy_kind::none) {
        score_exactly(queries, n, k, labels, scores, log_partition);
        return;
    }
    stale_.take(stale_rows_);
    if (copy_ == copy_kind::bf16) {
        const layer_rows layer = round_rows_to_bf16(rows(), k_, rows16_.data(), stale_rows_.data(),
                                                    stale_rows_.size(), threads_);
        scoring_.score(layer, k_, threads_, queries, n, k, labels, scores, log_partition);
        return;
    }
    const layer_rows layer = rows();
    const int8_rows copy = rows8_.view();
    quantize_rows_to_int8(layer, k_, copy, stale_rows_.data(), stale_rows_.size(), threads_);
    scoring_.score(layer, k_, threads_, queries, n, k, labels, scores, nullptr, &copy);
    if (log_partition) std::fill(log_partition, log_partition + n, 0.0);  // not computed
}

void exact_top_k::select_probe(selection_batch& batch, const uint32_t* exact, uint32_t exact_k) {
    HSLIDE_ASSERT(exact_k >= top_k());
    build_sets(batch, 0, batch.size, exact, exact_k);
}

ivf_top_k::ivf_top_k(rows_source rows, const layer_config& config, uint64_t train_seed,
                     const kernel_table& kernels, int threads)
    : top_k_selector(std::move(rows), config, train_seed, kernels, threads), stale_(rows_count_) {}

void ivf_top_k::search(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                       float* scores, double* log_partition) {
    ivf_search(index_, rows(), k_, queries, n, config_.ivf_probes, k, labels, scores, threads_);
    if (log_partition) std::fill(log_partition, log_partition + n, 0.0);  // not computed
}

void ivf_top_k::rows_changed(const uint32_t* ids, size_t n) {
    for (size_t i = 0; i < n; ++i) stale_.mark(ids[i]);
}

uint32_t ivf_top_k::index_clusters() const {
    if (!shard_.sharded()) return config_.ivf_clusters;  // 0: build_ivf_index's automatic count
    return ivf_shard_cluster_count(config_.ivf_clusters, shard_.total, shard_.count);
}

void ivf_top_k::refresh(const refresh_point& at) {
    stale_.take(stale_rows_);  // the index is built from the rows as they are now
    build_ivf_index(index_, rows(), index_clusters(),
                    step_seed(train_seed_, seed_stream::ivf_build, at.step), k_, threads_);
}

double ivf_top_k::before_step(uint64_t step) {
    const uint32_t every = config_.ivf_refresh;
    if (every == 0 || step == 0 || step % every != 0) return 0;
    const auto t0 = clock_type::now();
    const bool whole = stale_.all || (step / every) % ivf_lloyd_every == 0;
    stale_.take(stale_rows_);
    if (whole)
        refresh_ivf_index(index_, rows(), k_, threads_);
    else
        reassign_ivf_rows(index_, rows(), k_, stale_rows_.data(), uint32_t(stale_rows_.size()),
                          threads_);
    return seconds_since(t0);
}

}  // namespace hslide::cpu
