// The CPU backend's prediction: exact scoring (blocked over output rows and points), the IVF
// index's search (a top-k layer) or the LSH active set's scores, then each point's top k.
#include "cpu_backend.hpp"

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
    if (scoring == scoring_mode::ivf || (scoring == scoring_mode::automatic && searches_ivf()))
        return predict_ivf(batch, k, labels, scores);
    // Otherwise only an LSH output layer has a cheaper way to score than every neuron.
    const bool exact = scoring == scoring_mode::exact || !model_.config.uses_lsh(out_layer);
    // The blocked exact path needs the output layer's input as a dense vector per sample.
    if (exact && !model_.config.has_active_sets(out_layer - 1))
        return predict_exact(batch, k, labels, scores);
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
    const size_t n_layers = model_.layers.size();
    const size_t layers_to_run = n_layers - (output_mode == output_pass::skip ? 1 : 0);
    samples_[s].gen.reseed(sample_seed);
    forward_input_layer(data, point, s, scratch);
    for (size_t l = 1; l < layers_to_run; ++l) {
        const bool every_neuron = l + 1 == n_layers && output_mode == output_pass::every_neuron;
        if (model_.config.uses_lsh(l) && !every_neuron)
            select_lsh(l, data.labels(point), s, /*training=*/false, scratch);
        else
            samples_[s].layers[l].ids.clear();
        layer_products(l, s, scratch);
    }
}

void cpu_backend::forward_hidden_chunk(const batch_view& batch, uint32_t begin, uint32_t n,
                                       uint64_t seed) {
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 4)
        for (int64_t s = 0; s < int64_t(n); ++s)
            forward_sample(*batch.data, batch.rows[begin + s], uint32_t(s), output_pass::skip,
                           derive_seed(seed, uint64_t(begin) + uint64_t(s)), scratch);
    }
}

void cpu_backend::predict_exact(const batch_view& batch, uint32_t k, uint32_t* labels,
                                float* scores) {
    predict_chunks(batch, k, labels, scores, [&](uint32_t n) {
        score_output_exactly(0, n, k, /*with_log_partition=*/false);
        return std::make_pair(exact_labels_.data(), exact_scores_.data());
    });
}

void cpu_backend::predict_ivf(const batch_view& batch, uint32_t k, uint32_t* labels,
                              float* scores) {
    // A layer that trains with the index has it current (refreshed every few steps); any other
    // top-k layer gets one built from its rows now, for this prediction only.
    if (!searches_ivf()) build_output_index();
    predict_chunks(batch, k, labels, scores, [&](uint32_t n) {
        search_output_ivf(0, n, k);
        return std::make_pair(ivf_labels_.data(), ivf_scores_.data());
    });
}

template <typename ScoreChunk>
void cpu_backend::predict_chunks(const batch_view& batch, uint32_t k, uint32_t* labels,
                                 float* scores, ScoreChunk score_chunk) {
    // The blocked scorers need the output layer's input as a dense vector per sample: predict
    // scores exactly per sample after a sparse last hidden layer, and the constructor refuses
    // a top-k layer (the IVF index's) after one.
    HSLIDE_ASSERT(!model_.config.has_active_sets(model_.layers.size() - 2));
    const uint32_t chunk = exact_chunk(k);
    const uint64_t seed = predict_seed();
    ensure_buffers(std::min(chunk, batch.size));
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        forward_hidden_chunk(batch, begin, n, seed);
        const auto [best, best_scores] = score_chunk(n);
        std::copy(best, best + size_t(n) * k, labels + size_t(begin) * k);
        std::copy(best_scores, best_scores + size_t(n) * k, scores + size_t(begin) * k);
    }
}

}  // namespace hslide::cpu
