// The CPU backend's side of the selection seam (neuron_selector.hpp): handing a batch to a
// layer's selector, the refreshes, and the selection probe (measure_selection).
#include "cpu_backend.hpp"
#include "top_k_selector.hpp"

#include "hslide/clock.hpp"
#include "hslide/error.hpp"

#include <omp.h>

#include <algorithm>
#include <numeric>

namespace hslide::cpu {

void cpu_backend::refresh_selections(bool new_functions) {
    for (size_t l = 1; l < model_.layers.size(); ++l) {
        if (new_functions && model_.config.uses_lsh(l))
            model_.hash_seeds[l] = derive_seed(model_.hash_seeds[l], model_.adam_step + 1);
        selections_[l]->refresh({model_.adam_step, model_.hash_seeds[l]});
    }
}

void cpu_backend::make_selection(size_t l) {
    const bool output = l + 1 == model_.layers.size();
    selections_[l] = make_selector(
        model_.config, l, [this, l] { return rows_of(l); }, train_.seed, k_, threads_,
        output ? &shard_ : nullptr);
    selections_[l]->refresh({model_.adam_step, model_.hash_seeds[l]});
    // Candidate reuse: on an output layer searched exactly over a copy of its rows (the fp32
    // search also gives the full softmax its log-partition every step), in one process.
    if (output && train_.reuse_candidates_steps > 0 && !shard_.sharded() &&
        model_.layers.back().rows >= train_.reuse_candidates_min_rows)
        if (auto* top_k = dynamic_cast<top_k_selector*>(selections_.back().get()))
            if (!top_k->searches_ivf() && !top_k->computes_log_partition())
                top_k->set_candidate_reuse(train_.reuse_candidates_steps);
}

bool cpu_backend::index_may_give_way() const {
    return train_.ivf_min_recall > 0 &&
           model_.config.layers.back().search == top_k_search::automatic &&
           output_selection().searches_ivf();
}

bool cpu_backend::give_up_index(const selection_quality& q) {
    if (!index_may_give_way() || q.points == 0 || q.top_recall >= train_.ivf_min_recall)
        return false;
    const size_t out = model_.layers.size() - 1;
    layer_config& layer = model_.config.layers[out];
    // Probing every cluster is what cpu_top_k_search calls exact: the model's config says so,
    // so a checkpoint saved from here on, and the run resumed from it, search exactly too.
    layer.ivf_probes =
        std::max(layer.ivf_probes, ivf_cluster_count(layer.ivf_clusters, layer.size));
    HSLIDE_ASSERT(cpu_top_k_search(layer, k_.level) == top_k_search::exact);
    make_selection(out);
    return true;
}

layer_rows cpu_backend::rows_of(size_t l) const {
    const layer_state& layer = model_.layers[l];
    layer_rows rows;
    rows.weights = layer.weights.data();
    rows.stride = layer.stride;
    rows.bias = layer.bias.data();
    rows.rows = layer.rows;
    rows.width = layer.width;
    if (use_bf16()) {
        rows.weights16 = weights16_[l].values.data();
        rows.stride16 = weights16_[l].stride;
    }
    return rows;
}

selection_sample cpu_backend::selection_view(size_t l, uint32_t s) {
    sample_buffers& sb = samples_[s];
    const layer_buffers& in = sb.layers[l - 1];
    selection_sample view;
    view.input = in.act.data();
    view.input_ids = in.ids.empty() ? nullptr : in.ids.data();
    view.input_count = uint32_t(in.ids.size());
    view.gen = &sb.gen;
    view.ids = &sb.layers[l].ids;
    return view;
}

void cpu_backend::select_active_sets(const batch_view& batch, size_t l, bool training,
                                     step_report& report) {
    const bool output = l + 1 == model_.layers.size();
    std::vector<selection_sample> views(batch.size);
    for (uint32_t s = 0; s < batch.size; ++s) {
        views[s] = selection_view(l, s);
        if (output && training) {
            views[s].labels = batch.data->labels(batch.rows[s]);
            views[s].key = batch.rows[s];
        }
    }
    selection_batch b{views.data(), batch.size, training, model_.adam_step, batch.size};
    selections_[l]->select(b, report.times);
    if (output)
        for (uint32_t s = 0; s < batch.size; ++s) {
            samples_[s].set_drawn_from = views[s].fill_start;
            samples_[s].log_partition = views[s].log_partition;
        }
    // Catch-up Adam: the rows an LSH layer chose are brought up to date before the products
    // read them (a row's catch-up does not depend on the thread that claims it).
    if (training && catches_up(l)) {
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
            const auto t0 = clock_type::now();
#pragma omp for schedule(dynamic, 2)
            for (int64_t s = 0; s < int64_t(batch.size); ++s) {
                const std::vector<uint32_t>& ids = samples_[s].layers[l].ids;
                bring_up_to_date(l, ids.data(), uint32_t(ids.size()), scratch);
            }
            scratch.times.active_sets += seconds_since(t0);
        }
    }
}

bool cpu_backend::selection_is_exact() const {
    const neuron_selector& selector = output_selection();
    return selector.kind() == neuron_selection::all ||
           (selector.kind() == neuron_selection::top_k && !selector.searches_ivf());
}

const candidate_cache& cpu_backend::candidates() const {
    const auto* top_k = dynamic_cast<const top_k_selector*>(&output_selection());
    return top_k ? top_k->candidates() : backend::candidates();
}

void cpu_backend::import_candidates(const candidate_cache& cache) {
    if (auto* top_k = dynamic_cast<top_k_selector*>(selections_.back().get()))
        top_k->import_candidates(cache);
}

selection_quality cpu_backend::measure_selection(const batch_view& batch, uint32_t top) {
    HSLIDE_CHECK(top > 0 && batch.size > 0, "a selection measurement needs points and a top");
    if (shard_.sharded()) return {};  // not measured across ranks (points == 0: not asked again)
    const size_t out_layer = model_.layers.size() - 1;
    const uint32_t rows = model_.layers[out_layer].rows;
    selection_quality q;
    q.top = std::min(top, rows);
    // Exact scoring needs the output layer's input dense (an LSH hidden layer before it: no).
    if (model_.config.has_active_sets(out_layer - 1)) return q;
    // The rows as they are: the input layer's that no step has read since may be behind (a
    // top-k output layer's never are). Bringing them up to date here would apply their
    // deferred steps in two parts, which changes their bits: the probe, asked within an epoch
    // too, would change the run it measures.
    neuron_selector& selector = output_selection();
    const neuron_selection selection = selector.kind();
    const uint32_t top_k = std::min(model_.config.layers[out_layer].top_k, rows);
    const uint32_t k = selection == neuron_selection::top_k ? std::max(q.top, top_k) : q.top;
    const uint32_t chunk = exact_scoring::chunk(k);
    const uint64_t seed = step_seed(train_.seed, seed_stream::selection_probe, model_.adam_step);
    ensure_buffers(std::min(chunk, batch.size));
    // Per point: top recall, label recall (-1: no labels), set size; summed in point order.
    std::vector<double> top_hits(batch.size), label_hits(batch.size), set_size(batch.size);
    std::vector<uint32_t> exact_labels(size_t(std::min(chunk, batch.size)) * k);
    std::vector<float> exact_scores(exact_labels.size());
    std::vector<const float*> queries;
    std::vector<selection_sample> views;
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t n = std::min(chunk, batch.size - begin);
        forward_hidden_chunk(batch, begin, n, seed);
        queries.resize(n);
        views.resize(n);
        for (uint32_t s = 0; s < n; ++s) {
            queries[s] = samples_[s].layers[out_layer - 1].act.data();
            views[s] = selection_view(out_layer, s);  // no labels: the sets without them
        }
        selector.score_exactly(queries.data(), n, k, exact_labels.data(), exact_scores.data(),
                               nullptr);
        // The sets training would choose (IVF: from the index's top-k), measured against the
        // exact top.
        selection_batch b{views.data(), n, /*training=*/true, model_.adam_step, train_.batch_size};
        selector.select_probe(b, exact_labels.data(), k);
#pragma omp parallel num_threads(threads_)
        {
            std::vector<uint32_t> set;
#pragma omp for schedule(dynamic, 4)
            for (int64_t s = 0; s < int64_t(n); ++s) {
                const uint32_t* best = exact_labels.data() + size_t(s) * k;
                if (selection == neuron_selection::all) {
                    set.resize(rows);
                    std::iota(set.begin(), set.end(), 0u);
                } else {
                    set = samples_[s].layers[out_layer].ids;
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
    q.index_may_give_way = index_may_give_way();
    q.index_given_up = give_up_index(q);
    return q;
}

}  // namespace hslide::cpu
