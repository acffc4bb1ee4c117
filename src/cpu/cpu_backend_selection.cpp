// The CPU backend's neuron selection: the one seam through which a layer's active neurons are
// chosen for a batch (config.hpp's neuron_selection): every neuron, LSH (with its tables'
// rebuilds), or exact top-k over the blocked exact scoring that prediction uses too.
#include "cpu_backend.hpp"
#include "hslide/clock.hpp"

#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace hslide::cpu {

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

void cpu_backend::refresh_selections(bool new_functions) {
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        if (!model_.config.uses_lsh(l)) continue;
        if (new_functions)
            model_.hash_seeds[l] = derive_seed(model_.hash_seeds[l], model_.adam_step + 1);
        build_layer_tables(l);
    }
    if (searches_ivf()) build_output_index();
}

ivf_rows cpu_backend::output_rows() const {
    const size_t out_layer = model_.layers.size() - 1;
    const layer_state& layer = model_.layers[out_layer];
    ivf_rows rows;
    rows.weights = layer.weights.data();
    rows.stride = layer.stride;
    rows.bias = layer.bias.data();
    rows.rows = layer.rows;
    rows.width = layer.width;
    if (use_bf16()) {
        rows.weights16 = weights16_[out_layer].values.data();
        rows.stride16 = weights16_[out_layer].stride;
    }
    return rows;
}

void cpu_backend::build_output_index() {
    ivf_stale_.take(ivf_stale_rows_);  // the index is built from the rows as they are now
    const layer_config& cfg = model_.config.layers.back();
    build_ivf_index(ivf_, output_rows(), cfg.ivf_clusters,
                    step_seed(train_.seed, seed_stream::ivf_build, model_.adam_step), k_, threads_);
}

void cpu_backend::search_output_ivf(uint32_t first, uint32_t n, uint32_t k) {
    const size_t out_layer = model_.layers.size() - 1;
    std::vector<const float*> queries(n);
    for (uint32_t j = 0; j < n; ++j)
        queries[j] = samples_[first + j].layers[out_layer - 1].act.data();
    ivf_labels_.resize(size_t(n) * k);
    ivf_scores_.resize(size_t(n) * k);
    ivf_search(ivf_, output_rows(), k_, queries.data(), n,
               model_.config.layers[out_layer].ivf_probes, k, ivf_labels_.data(),
               ivf_scores_.data(), threads_);
}

void cpu_backend::select_active_sets(const batch_view& batch, size_t l, bool training,
                                     step_report& report) {
    switch (model_.config.selection(l)) {
        case neuron_selection::all:
            for (uint32_t s = 0; s < batch.size; ++s) samples_[s].layers[l].ids.clear();
            return;
        case neuron_selection::lsh:
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 2)
            for (int64_t s = 0; s < int64_t(batch.size); ++s)
                select_lsh(l, batch.data->labels(batch.rows[s]), uint32_t(s), training, scratch);
        }
            return;
        case neuron_selection::top_k: {
            const auto t0 = clock_type::now();
            select_top_k_sets(batch);
            report.times.active_sets += seconds_since(t0);
            return;
        }
    }
}

void cpu_backend::select_lsh(size_t l, const label_row& labels, uint32_t s, bool training,
                             thread_scratch& scratch) {
    sample_buffers& sb = samples_[s];
    const layer_buffers& in = sb.layers[l - 1];
    layer_buffers& out = sb.layers[l];
    const bool output = l + 1 == model_.layers.size();
    auto t0 = clock_type::now();
    const hash_family& hash = *lsh_[l].hash;
    // Queries probe nearby buckets too (a dense input only; training never does).
    const uint32_t probes = training || !in.ids.empty() ? 0 : model_.config.layers[l].active.probes;
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
    scratch.builder.build(lsh_[l].tables, scratch.codes.data(), force_labels ? labels.ids : nullptr,
                          force_labels ? labels.count : 0, model_.config.layers[l].active, sb.gen,
                          out.ids, 1 + probes);
    if (training && catches_up(l))
        bring_up_to_date(l, out.ids.data(), uint32_t(out.ids.size()), scratch);
    scratch.times.active_sets += seconds_since(t0);
}

uint32_t cpu_backend::exact_chunk(uint32_t k) const {
    // 256 points a chunk, fewer when k is large: at most 2^22 candidates (32 MiB) a thread.
    return uint32_t(std::clamp<uint64_t>((uint64_t{1} << 22) / std::max(k, 1u), 1, 256));
}

void cpu_backend::select_top_k_sets(const batch_view& batch) {
    const size_t out_layer = model_.layers.size() - 1;
    const uint32_t k =
        std::min(model_.config.layers[out_layer].top_k, model_.layers[out_layer].rows);
    const uint32_t fill =
        std::min(model_.config.layers[out_layer].active.min_active, model_.layers[out_layer].rows);
    const uint32_t chunk = exact_chunk(k);
    const bool ivf = searches_ivf();
    const fill_pool pool = step_fill_pool(batch.size);
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        if (ivf)
            search_output_ivf(begin, n, k);
        else
            score_output_exactly(begin, n, k, /*with_log_partition=*/true);
        const uint32_t* best = ivf ? ivf_labels_.data() : exact_labels_.data();
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(static)
            for (int64_t j = 0; j < int64_t(n); ++j) {
                sample_buffers& sb = samples_[begin + uint32_t(j)];
                const label_row y = batch.data->labels(batch.rows[begin + uint32_t(j)]);
                sb.set_drawn_from = build_top_k_set(best + size_t(j) * k, k, y, fill, pool, sb.gen,
                                                    scratch, sb.layers[out_layer].ids);
                sb.log_partition = ivf ? 0.0 : exact_log_partition_[size_t(j)];
            }
        }
    }
}

fill_pool cpu_backend::step_fill_pool(uint32_t batch) const {
    const layer_config& cfg = model_.config.layers.back();
    const uint32_t rows = model_.layers.back().rows;
    return {step_seed(train_.seed, seed_stream::fill_pool, model_.adam_step),
            fill_pool_size(cfg.fill_pool, rows, std::min(cfg.active.min_active, rows), batch)};
}

uint32_t cpu_backend::build_top_k_set(const uint32_t* best, uint32_t k, const label_row& labels,
                                      uint32_t fill, const fill_pool& pool, rng& gen,
                                      thread_scratch& scratch, std::vector<uint32_t>& ids) const {
    // Labels first (the loss reads them there), then the top-k and the fill, each in
    // increasing id order (the products read them nearly in memory order): the fill apart,
    // so that its correction (fill_correction) knows where it begins.
    const label_row& y = labels;
    ids.assign(y.ids, y.ids + y.count);
    for (uint32_t i = 0; i < k && best[i] != std::numeric_limits<uint32_t>::max(); ++i)
        if (std::find(y.ids, y.ids + y.count, best[i]) == y.ids + y.count) ids.push_back(best[i]);
    std::sort(ids.begin() + y.count, ids.end());
    const uint32_t drawn_from = uint32_t(ids.size());
    if (ids.size() < fill) add_random_fill(ids, fill, pool, gen, scratch);
    std::sort(ids.begin() + drawn_from, ids.end());
    return drawn_from;
}

selection_quality cpu_backend::measure_selection(const batch_view& batch, uint32_t top) {
    HSLIDE_CHECK(top > 0 && batch.size > 0, "a selection measurement needs points and a top");
    const size_t out_layer = model_.layers.size() - 1;
    const uint32_t rows = model_.layers[out_layer].rows;
    selection_quality q;
    q.top = std::min(top, rows);
    // Exact scoring needs the output layer's input dense (an LSH hidden layer before it: no).
    if (model_.config.has_active_sets(out_layer - 1)) return q;
    complete_deferred_updates();  // the rows as the next step reads them
    const neuron_selection selection = model_.config.selection(out_layer);
    const uint32_t top_k = std::min(model_.config.layers[out_layer].top_k, rows);
    const uint32_t fill = std::min(model_.config.layers[out_layer].active.min_active, rows);
    const fill_pool pool = step_fill_pool(train_.batch_size);
    const uint32_t k = selection == neuron_selection::top_k ? std::max(q.top, top_k) : q.top;
    const uint32_t chunk = exact_chunk(k);
    const uint64_t seed = step_seed(train_.seed, seed_stream::selection_probe, model_.adam_step);
    ensure_buffers(std::min(chunk, batch.size));
    // Per point: top recall, label recall (-1: no labels), set size; summed in point order.
    std::vector<double> top_hits(batch.size), label_hits(batch.size), set_size(batch.size);
    const label_row no_labels{nullptr, 0};
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        forward_hidden_chunk(batch, begin, n, seed);
        score_output_exactly(0, n, k, /*with_log_partition=*/false);
        // IVF: the sets from the index's top-k, measured against the exact top.
        const bool ivf = selection == neuron_selection::top_k && searches_ivf();
        if (ivf) search_output_ivf(0, n, top_k);
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
            std::vector<uint32_t> set;
#pragma omp for schedule(dynamic, 4)
            for (int64_t s = 0; s < int64_t(n); ++s) {
                sample_buffers& sb = samples_[s];
                const uint32_t* best = exact_labels_.data() + size_t(s) * k;
                // The set training would choose, without the labels.
                switch (selection) {
                    case neuron_selection::all:
                        set.resize(rows);
                        std::iota(set.begin(), set.end(), 0u);
                        break;
                    case neuron_selection::lsh:
                        select_lsh(out_layer, no_labels, uint32_t(s), /*training=*/true, scratch);
                        set = sb.layers[out_layer].ids;
                        break;
                    case neuron_selection::top_k:
                        build_top_k_set(ivf ? ivf_labels_.data() + size_t(s) * top_k : best, top_k,
                                        no_labels, fill, pool, sb.gen, scratch, set);
                        break;
                }
                std::sort(set.begin(), set.end());
                auto in_set = [&](uint32_t id) {
                    return std::binary_search(set.begin(), set.end(), id);
                };
                const size_t p = size_t(begin) + size_t(s);
                uint32_t hits = 0;
                for (uint32_t i = 0; i < q.top; ++i)
                    hits += best[i] != UINT32_MAX && in_set(best[i]);
                top_hits[p] = double(hits) / q.top;
                const label_row y = batch.data->labels(batch.rows[p]);
                uint32_t found = 0;
                for (uint32_t i = 0; i < y.count; ++i) found += in_set(y.ids[i]);
                label_hits[p] = y.count ? double(found) / y.count : -1.0;
                set_size[p] = double(set.size());
            }
        }
    }
    uint32_t labelled = 0;
    for (uint32_t p = 0; p < batch.size; ++p) {
        q.top_recall += top_hits[p];
        q.mean_set_size += set_size[p];
        if (label_hits[p] >= 0) {
            q.label_recall += label_hits[p];
            ++labelled;
        }
    }
    q.points = batch.size;
    q.top_recall /= batch.size;
    q.mean_set_size /= batch.size;
    q.label_recall = labelled ? q.label_recall / labelled : 0;
    return q;
}

void cpu_backend::add_random_fill(std::vector<uint32_t>& ids, uint32_t target,
                                  const fill_pool& pool, rng& gen, thread_scratch& scratch) const {
    const uint32_t rows = model_.layers.back().rows;
    if (scratch.member_stamp.size() != rows) {
        scratch.member_stamp.assign(rows, 0);
        scratch.stamp = 0;
    }
    if (++scratch.stamp == 0) {  // wrapped: no stale stamp may equal the new one
        std::fill(scratch.member_stamp.begin(), scratch.member_stamp.end(), 0);
        scratch.stamp = 1;
    }
    for (uint32_t id : ids) scratch.member_stamp[id] = scratch.stamp;
    // Rejection draws: a set far below the layer's (or the pool's) size takes few retries.
    // A pool is at least 4x the fill, so its draws end long before the bound; should a set
    // ever exhaust it, the rest comes from the whole layer.
    uint64_t pool_draws = pool.size ? uint64_t{64} * target : 0;
    while (ids.size() < target) {
        const uint32_t r =
            pool_draws > 0
                ? (--pool_draws, fill_pool_row(pool.seed, uint32_t(gen.below(pool.size)), rows))
                : uint32_t(gen.below(rows));
        if (scratch.member_stamp[r] == scratch.stamp) continue;
        scratch.member_stamp[r] = scratch.stamp;
        ids.push_back(r);
    }
}

void cpu_backend::score_output_exactly(uint32_t first, uint32_t n, uint32_t k,
                                       bool with_log_partition) {
    // Scoring a point against every output row one point at a time streams the whole layer
    // from memory per point (686 MB at 670k x 256): memory-bound, ~30 ms a point on 2 cores.
    // Here a block of rows small enough to stay in L2 is scored against the chunk's points
    // before the next block is read, so the layer streams once a chunk. In fp32, dots16
    // multiplies the block by 16 points at once (the hidden vectors transposed): a GEMM
    // without horizontal sums; in bf16, dots16_bf16 does the same with vdpbf16ps. Their sums
    // run in another order than the per-point kernels', so scores can differ from those of the
    // forward pass in the last bits.
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
    // fp32: groups of 16 transposed points (n rounded up to 16); bf16: a row a point (using
    // half of each in_stride floats).
    hidden_matrix_.resize(size_t(n + 15) / 16 * 16 * in_stride);
    exact_labels_.resize(size_t(n) * k);
    exact_scores_.resize(size_t(n) * k);
    // Each block's log-partition per point, summed in block order afterwards: the result does
    // not depend on which thread scored which block.
    if (with_log_partition) {
        block_log_partition_.resize(size_t(n_blocks) * n);
        exact_log_partition_.resize(n);
    }
    // bf16 with a native dots16_bf16: the points in pairs, 16 at a time, as fp32's dots16 takes
    // them transposed (the buffer holds (n + 15) / 16 * 16 * in_stride floats, twice what this
    // needs); without one, a row of bf16 a point for active_dots_bf16.
    const bool paired = use_bf16() && k_.dots16_bf16;
    const uint32_t pairs = (width + 1) / 2;
    bf16* const hidden16 = reinterpret_cast<bf16*>(hidden_matrix_.data());
    std::vector<std::vector<scored_label>> best(static_cast<size_t>(threads_));
    std::vector<std::vector<uint32_t>> best_count(static_cast<size_t>(threads_));
#pragma omp parallel num_threads(threads_)
    {
        const int thread = omp_get_thread_num();
        thread_scratch& scratch = scratch_[thread];
#pragma omp for schedule(static)
        for (int64_t s = 0; s < int64_t(n); ++s) {
            const std::vector<float>& h = samples_[first + uint32_t(s)].layers[out_layer - 1].act;
            if (paired) {
                // Groups of 16 points in pairs: element i of point s at
                // [(s / 16) * pairs * 32 + (i / 2) * 32 + (s % 16) * 2 + i % 2].
                bf16* group = hidden16 + size_t(s / 16) * pairs * 32 + (s % 16) * 2;
                k_.to_bf16(h.data(), scratch.input16.data(), width);
                for (uint32_t i = 0; i < 2 * pairs; ++i)
                    group[size_t(i / 2) * 32 + i % 2] = i < width ? scratch.input16[i] : bf16{0};
            } else if (use_bf16()) {
                k_.to_bf16(h.data(),
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
        if (paired)
#pragma omp single
            for (uint32_t s = n; s % 16 != 0; ++s) {
                bf16* group = hidden16 + size_t(s / 16) * pairs * 32 + (s % 16) * 2;
                for (uint32_t i = 0; i < 2 * pairs; ++i) group[size_t(i / 2) * 32 + i % 2] = 0;
            }
        else if (!use_bf16())
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
        std::vector<float>& one_point = scratch.grad;  // a point's logits of the block (fp32)
        if (with_log_partition && one_point.size() < block_rows) one_point.resize(block_rows);
#pragma omp for schedule(dynamic, 1)
        for (int64_t blk = 0; blk < n_blocks; ++blk) {
            const uint32_t r0 = uint32_t(blk) * block_rows;
            const uint32_t nb = std::min(block_rows, layer.rows - r0);
            for (uint32_t s0 = 0; s0 < n; s0 += inputs) {
                const uint32_t n_x = std::min(inputs, n - s0);
                // Score of row r0 + i for point s0 + j: logits[i * row_step + j * col_step].
                size_t row_step = 1, col_step = block_rows;
                if (paired) {
                    const bf16_weights& w16 = weights16_[out_layer];
                    k_.dots16_bf16(w16.row(r0), w16.stride, width, nb,
                                   hidden16 + size_t(s0 / 16) * pairs * 32, layer.bias.data() + r0,
                                   logits.data());
                    row_step = inputs;
                    col_step = 1;
                } else if (use_bf16()) {
                    const bf16_weights& w16 = weights16_[out_layer];
                    const bf16* x16 = reinterpret_cast<const bf16*>(hidden_matrix_.data());
                    for (uint32_t j = 0; j < n_x; ++j)
                        k_.active_dots_bf16(w16.row(r0), w16.stride, width, nullptr, nb,
                                            x16 + size_t(s0 + j) * in_stride,
                                            layer.bias.data() + r0,
                                            logits.data() + size_t(j) * block_rows);
                } else {
                    k_.dots16(layer.row(r0), layer.stride, width, nullptr, nb,
                              hidden_matrix_.data() + size_t(s0) * width, layer.bias.data() + r0,
                              logits.data());
                    row_step = inputs;
                    col_step = 1;
                }
                for (uint32_t j = 0; j < n_x; ++j) {
                    const float* z = logits.data() + size_t(j) * col_step;
                    scored_label* heap = heaps.data() + size_t(s0 + j) * kept;
                    for (uint32_t i = 0; i < nb; ++i)
                        offer_top_k(heap, counts[s0 + j], kept, {z[size_t(i) * row_step], r0 + i});
                    if (with_log_partition) {
                        // The softmax kernel returns the block's log-sum-exp (its
                        // probabilities go to scratch).
                        for (uint32_t i = 0; i < nb; ++i) one_point[i] = z[size_t(i) * row_step];
                        block_log_partition_[size_t(blk) * n + s0 + j] =
                            k_.softmax(one_point.data(), one_point.data(), nb);
                    }
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
            merge_thread_top_k(best, best_count, team, size_t(s), kept, k,
                               exact_labels_.data() + size_t(s) * k,
                               exact_scores_.data() + size_t(s) * k, cand_score, cand_id, top);
            if (with_log_partition) {
                double max_lp = -std::numeric_limits<double>::infinity();
                for (int64_t b = 0; b < n_blocks; ++b)
                    max_lp = std::max(max_lp, block_log_partition_[size_t(b) * n + size_t(s)]);
                double sum = 0;
                for (int64_t b = 0; b < n_blocks; ++b)
                    sum += std::exp(block_log_partition_[size_t(b) * n + size_t(s)] - max_lp);
                exact_log_partition_[size_t(s)] = max_lp + std::log(sum);
            }
        }
    }
}

}  // namespace hslide::cpu
