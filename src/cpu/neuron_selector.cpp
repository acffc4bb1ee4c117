// The neuron selections' defaults, every neuron's selection, and the choice of a layer's.
#include "neuron_selector.hpp"

#include "lsh_selector.hpp"
#include "top_k_selector.hpp"

#include "hslide/error.hpp"

namespace hslide::cpu {

void neuron_selector::select_one(selection_sample&, bool, int) {
    HSLIDE_CHECK_KIND(false, error_kind::unsupported,
                      "{} selection chooses a batch's sets together, not a sample's alone",
                      to_string(kind()));
}

void neuron_selector::select_probe(selection_batch& batch, const uint32_t*, uint32_t) {
    stage_times ignored;
    select(batch, ignored);
}

void neuron_selector::search(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                             float* scores, double* log_partition) {
    score_exactly(queries, n, k, labels, scores, log_partition);
}

void neuron_selector::score_exactly(const float* const* queries, uint32_t n, uint32_t k,
                                    uint32_t* labels, float* scores, double* log_partition) {
    HSLIDE_ASSERT(n <= exact_scoring::chunk(k));
    exact_.score(rows(), k_, threads_, queries, n, k, labels, scores, log_partition);
}

void all_neurons::select(selection_batch& batch, stage_times&) {
    for (uint32_t s = 0; s < batch.size; ++s) batch.samples[s].ids->clear();
}

void all_neurons::select_one(selection_sample& sample, bool, int) {
    sample.ids->clear();
}

std::unique_ptr<neuron_selector> make_selector(const model_config& config, size_t l,
                                               rows_source rows, uint64_t train_seed,
                                               const kernel_table& kernels, int threads,
                                               const output_shard* shard) {
    HSLIDE_ASSERT(l > 0 && l < config.layers.size());
    const layer_config& layer = config.layers[l];
    const bool sharded = shard && shard->sharded();
    HSLIDE_ASSERT(!sharded || l + 1 == config.layers.size());
    switch (config.selection(l)) {
        case neuron_selection::all:
            return std::make_unique<all_neurons>(std::move(rows), kernels, threads);
        case neuron_selection::lsh: {
            auto lsh = std::make_unique<lsh_selector>(std::move(rows), layer, kernels, threads);
            if (sharded) lsh->set_shard(*shard);
            return lsh;
        }
        case neuron_selection::top_k:
            if (cpu_top_k_search(layer, kernels.level, sharded ? shard->count : 0) ==
                top_k_search::exact) {
                auto exact = std::make_unique<exact_top_k>(std::move(rows), layer, train_seed,
                                                           kernels, threads);
                if (sharded) exact->set_shard(*shard);
                return exact;
            }
            auto ivf =
                std::make_unique<ivf_top_k>(std::move(rows), layer, train_seed, kernels, threads);
            if (sharded) ivf->set_shard(*shard);
            return ivf;
    }
    HSLIDE_ASSERT(false);
    return nullptr;
}

}  // namespace hslide::cpu
