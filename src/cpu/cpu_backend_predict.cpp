// The CPU backend's prediction: the output layer's selector scores a chunk of points exactly
// (blocked over output rows and points) or searches its IVF index, or each point's LSH active
// set is scored; then each point's top k.
#include "cpu_backend.hpp"
#include "top_k_selector.hpp"

#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>

namespace hslide::cpu {

void cpu_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                          uint32_t* labels, float* scores) {
    HSLIDE_CHECK(k > 0, "top-k must be positive");
    complete_deferred_updates();
    const size_t out_layer = model_.layers.size() - 1;
    const bool top_k_layer = model_.config.selection(out_layer) == neuron_selection::top_k;
    HSLIDE_CHECK_KIND(scoring != scoring_mode::ivf || top_k_layer, error_kind::unsupported,
                      "--scoring ivf searches a top-k output layer's IVF index; this output "
                      "layer has none (use --scoring exact)");
    predict_rows(batch, k, scoring, labels, scores);
    // Sharded: each rank scored its rows (exactly, through its IVF index or its LSH tables);
    // the ranks' top k are merged, and every rank returns the same labels.
    if (shard_.sharded()) merge_shard_predictions(batch.size, k, labels, scores);
}

void cpu_backend::predict_rows(const batch_view& batch, uint32_t k, scoring_mode scoring,
                               uint32_t* labels, float* scores) {
    const size_t out_layer = model_.layers.size() - 1;
    if (scoring == scoring_mode::ivf ||
        (scoring == scoring_mode::automatic && output_selection().searches_ivf()))
        return predict_ivf(batch, k, labels, scores);
    // Otherwise only an LSH output layer has a cheaper way to score than every neuron.
    const bool exact = scores_every_neuron(scoring) || !model_.config.uses_lsh(out_layer);
    // The blocked exact path needs the output layer's input as a dense vector per sample.
    if (exact && !model_.config.has_active_sets(out_layer - 1)) {
        if (scoring == scoring_mode::exact_fast && searches_int8_copy(k_))
            return predict_exact_int8(batch, k, labels, scores);
        if ((scoring == scoring_mode::exact_bf16 || scoring == scoring_mode::exact_fast) &&
            k_.dots16_bf16)
            return predict_exact_bf16(batch, k, labels, scores);
        return predict_exact(batch, k, labels, scores);
    }
    // A sharded LSH layer's sets are built across ranks, a batch at a time.
    if (shard_.sharded()) return predict_shard_sets(batch, k, labels, scores);
    // One buffer set per thread, not per sample: exact scores of 670k labels are 2.7 MB a point.
    ensure_buffers(uint32_t(threads_));
    const uint64_t seed = predict_seed();
    const output_pass pass = exact ? output_pass::every_neuron : output_pass::active_set;
#pragma omp parallel num_threads(threads_)
    {
        const int thread = omp_get_thread_num();
        thread_scratch& scratch = scratch_[thread];
        std::vector<scored_label> heap;
#pragma omp for schedule(dynamic, 4)
        for (int64_t s = 0; s < int64_t(batch.size); ++s) {
            forward_sample(*batch.data, batch.rows[s], uint32_t(thread), pass,
                           derive_seed(seed, uint64_t(s)), scratch);
            const layer_buffers& out = samples_[thread].layers[out_layer];
            select_top_k(out.act.data(), out.ids.empty() ? nullptr : out.ids.data(),
                         uint32_t(out.act.size()), k, labels + size_t(s) * k,
                         scores + size_t(s) * k, heap);
        }
    }
}

void cpu_backend::forward_sample(const dataset& data, uint32_t point, uint32_t s,
                                 output_pass output_mode, uint64_t sample_seed,
                                 thread_scratch& scratch) {
    samples_[s].gen.reseed(sample_seed);
    forward_input_layer(data, point, s, scratch);
    forward_above_input(s, output_mode, scratch);
}

void cpu_backend::forward_above_input(uint32_t s, output_pass output_mode,
                                      thread_scratch& scratch) {
    const size_t n_layers = model_.layers.size();
    const size_t layers_to_run = n_layers - (output_mode == output_pass::skip ? 1 : 0);
    for (size_t l = 1; l < layers_to_run; ++l) {
        const bool every_neuron = l + 1 == n_layers && output_mode == output_pass::every_neuron;
        if (model_.config.uses_lsh(l) && !every_neuron) {
            selection_sample view = selection_view(l, s);  // no labels: not training
            selections_[l]->select_one(view, /*training=*/false, omp_get_thread_num());
        } else {
            samples_[s].layers[l].ids.clear();
        }
        layer_products(l, s, scratch);
    }
}

void cpu_backend::forward_hidden_chunk(const batch_view& batch, uint32_t begin, uint32_t n,
                                       uint64_t seed) {
    // Four points at a time: those with the same features share layer 0's row reads.
    const int64_t quads = (int64_t(n) + 3) / 4;
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
        for (int64_t q = 0; q < quads; ++q) {
            const uint32_t first = uint32_t(q) * 4, count = std::min(4u, n - first);
            for (uint32_t s = first; s < first + count; ++s)
                samples_[s].gen.reseed(derive_seed(seed, uint64_t(begin) + uint64_t(s)));
            forward_input_layers(*batch.data, batch.rows + begin + first, first, count, scratch);
            for (uint32_t s = first; s < first + count; ++s)
                forward_above_input(s, output_pass::skip, scratch);
        }
    }
}

void cpu_backend::predict_exact(const batch_view& batch, uint32_t k, uint32_t* labels,
                                float* scores) {
    neuron_selector& selector = output_selection();
    predict_chunks(batch, k, labels, scores,
                   [&](const float* const* queries, uint32_t n, uint32_t* l, float* sc) {
                       selector.score_exactly(queries, n, k, l, sc, nullptr);
                   });
}

void cpu_backend::predict_exact_bf16(const batch_view& batch, uint32_t k, uint32_t* labels,
                                     float* scores) {
    const size_t out_layer = model_.layers.size() - 1;
    layer_rows rows = rows_of(out_layer);
    if (!rows.weights16) {
        // Rounded here, for this call: a copy kept between calls would have to follow every
        // way the rows change (steps, imports, row transfers), and rounding the rows costs a
        // small part of scoring them (one pass, against one a chunk of 256 points). The
        // buffer is kept (zeroed when its size changes, so the rows' tails stay zero).
        const size_t size = size_t(rows.rows) * bf16_copy_stride(rows.width);
        if (predict_rows16_.size() != size) predict_rows16_.assign(size, bf16{0});
        rows = round_rows_to_bf16(rows, k_, predict_rows16_.data(), nullptr, rows.rows, threads_);
    }
    predict_chunks(batch, k, labels, scores,
                   [&](const float* const* queries, uint32_t n, uint32_t* l, float* sc) {
                       predict_scoring_.score(rows, k_, threads_, queries, n, k, l, sc, nullptr);
                   });
}

void cpu_backend::predict_exact_int8(const batch_view& batch, uint32_t k, uint32_t* labels,
                                     float* scores) {
    const size_t out_layer = model_.layers.size() - 1;
    const layer_rows rows = rows_of(out_layer);
    const uint32_t candidates = std::min(rows.rows, std::max(2 * k, 16u));
    // predict_chunks' chunks are sized for k; a score call of `candidates` takes as many
    // points only while its buffers stay small (k up to 8,192; past it, exact scoring).
    if (exact_scoring::chunk(candidates) < exact_scoring::chunk(k))
        return predict_exact(batch, k, labels, scores);
    // Copied now, for this call, as predict_exact_bf16 rounds: the buffer is kept.
    if (predict_rows8_.scale.size() != rows.rows) predict_rows8_ = int8_copy(rows.rows, rows.width);
    const int8_rows copy = predict_rows8_.view();
    quantize_rows_to_int8(rows, k_, copy, nullptr, rows.rows, threads_);
    std::vector<uint32_t> best;
    std::vector<float> best_scores;
    predict_chunks(batch, k, labels, scores,
                   [&](const float* const* queries, uint32_t n, uint32_t* l, float* sc) {
                       best.resize(size_t(n) * candidates);
                       best_scores.resize(best.size());
                       predict_scoring_.score(rows, k_, threads_, queries, n, candidates,
                                              best.data(), best_scores.data(), nullptr, &copy);
#pragma omp parallel num_threads(threads_)
                       {
                           std::vector<float> exact(candidates);
                           std::vector<scored_label> heap;
#pragma omp for schedule(static)
                           for (int64_t q = 0; q < int64_t(n); ++q) {
                               const uint32_t* ids = best.data() + size_t(q) * candidates;
                               // Padding (UINT32_MAX) only past the rows, at the end.
                               const uint32_t found =
                                   uint32_t(std::find(ids, ids + candidates, UINT32_MAX) - ids);
                               k_.active_dots(rows.weights, rows.stride, rows.width, ids, found,
                                              queries[q], rows.bias, exact.data());
                               select_top_k(exact.data(), ids, found, k, l + size_t(q) * k,
                                            sc + size_t(q) * k, heap);
                           }
                       }
                   });
}

void cpu_backend::predict_ivf(const batch_view& batch, uint32_t k, uint32_t* labels,
                              float* scores) {
    // A layer that trains with the index has it current (refreshed every few steps); any other
    // top-k layer gets one built from its rows now, for this prediction only.
    neuron_selector* index = &output_selection();
    std::unique_ptr<neuron_selector> built;
    if (!index->searches_ivf()) {
        const size_t out_layer = model_.layers.size() - 1;
        auto ivf =
            std::make_unique<ivf_top_k>([this, out_layer] { return rows_of(out_layer); },
                                        model_.config.layers[out_layer], train_.seed, k_, threads_);
        if (shard_.sharded()) ivf->set_shard(shard_);  // its clusters (the merge is predict's)
        ivf->refresh({model_.adam_step, model_.hash_seeds[out_layer]});
        built = std::move(ivf);
        index = built.get();
    }
    predict_chunks(batch, k, labels, scores,
                   [&](const float* const* queries, uint32_t n, uint32_t* l, float* sc) {
                       index->search(queries, n, k, l, sc, nullptr);
                   });
}

template <typename ScoreChunk>
void cpu_backend::predict_chunks(const batch_view& batch, uint32_t k, uint32_t* labels,
                                 float* scores, ScoreChunk score_chunk) {
    // The blocked scorers need the output layer's input as a dense vector per sample: predict
    // scores exactly per sample after a sparse last hidden layer, and the constructor refuses
    // a top-k layer (the IVF index's) after one.
    HSLIDE_ASSERT(!model_.config.has_active_sets(model_.layers.size() - 2));
    const size_t out_layer = model_.layers.size() - 1;
    const uint32_t chunk = exact_scoring::chunk(k);
    const uint64_t seed = predict_seed();
    ensure_buffers(std::min(chunk, batch.size));
    std::vector<const float*> queries;
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        forward_hidden_chunk(batch, begin, n, seed);
        queries.resize(n);
        for (uint32_t j = 0; j < n; ++j) queries[j] = samples_[j].layers[out_layer - 1].act.data();
        score_chunk(queries.data(), n, labels + size_t(begin) * k, scores + size_t(begin) * k);
    }
}

}  // namespace hslide::cpu
