// Network settings to a checked model_config (see model_options.hpp).
#include "hslide/model_options.hpp"

#include "hslide/error.hpp"
#include "hslide/output_plan.hpp"

#include <fmt/format.h>

namespace hslide {

void set_probes(model_config& config, const std::vector<uint32_t>& probes) {
    const size_t n = config.layers.size() - 1;
    HSLIDE_CHECK(probes.size() == 1 || probes.size() == n,
                 "--probes takes one value or one per layer after the first ({} here), got {}", n,
                 probes.size());
    for (size_t l = 1; l < config.layers.size(); ++l)
        config.layers[l].active.probes = probes.size() == 1 ? probes[0] : probes[l - 1];
}

model_config make_model_config(const model_options& o, uint32_t input_dim, uint32_t output_dim,
                               std::string* output_choice) {
    if (output_choice) output_choice->clear();
    HSLIDE_CHECK(!o.hidden.empty(), "--hidden needs at least one layer size");
    model_config config;
    config.input_dim = input_dim;
    config.auto_sparse_min = o.auto_sparse_min;
    config.input_norm = parse_input_normalization(o.normalize);
    // Layer l >= 1 takes entry l - 1 of a per-layer list; a single value serves every layer.
    const size_t n_lists = o.hidden.size();
    auto pick = [&](const auto& values, const char* flag, size_t l) {
        HSLIDE_CHECK(values.size() == 1 || values.size() == n_lists,
                     "{} takes one value or one per layer after the first ({} here: the hidden "
                     "layers after the first, then the output layer), got {}",
                     flag, n_lists, values.size());
        return values.size() == 1 ? values[0] : values[l - 1];
    };
    const size_t n_layers = o.hidden.size() + 1;
    for (size_t l = 0; l < n_layers; ++l) {
        const bool output = l + 1 == n_layers;
        layer_config layer;
        layer.size = output             ? output_dim
                     : o.hidden[l] == 0 ? automatic_hidden_width(input_dim, output_dim)
                                        : o.hidden[l];
        layer.sparsity = l == 0   ? sparsity_mode::dense
                         : output ? parse_sparsity(o.output_sparsity)
                                  : parse_sparsity(o.hidden_sparsity);
        if (l > 0) {
            layer.lsh.kind = parse_hash_kind(pick(o.hash, "--hash", l));
            layer.lsh.K = pick(o.K, "--K", l);
            layer.lsh.L = pick(o.L, "--L", l);
            layer.lsh.bits_per_hash = pick(o.bits, "--bits", l);
            layer.lsh.bucket_capacity = pick(o.bucket_capacity, "--bucket-capacity", l);
            layer.lsh.policy = parse_insertion_policy(pick(o.insertion, "--insertion", l));
            layer.active.min_active = pick(o.min_active, "--min-active", l);
            layer.active.max_active = pick(o.max_active, "--max-active", l);
            layer.active.hit_threshold = pick(o.hit_threshold, "--hit-threshold", l);
            layer.active.probes = pick(o.probes, "--probes", l);
        }
        if (output) {
            layer.top_k = o.top_k;
            layer.fill_correction = o.fill_correction;
            layer.fill_pool = o.fill_pool;
            layer.lr_scale =
                o.output_lr_scale > 0 ? o.output_lr_scale : automatic_output_lr_scale(layer.size);
            layer.search = parse_top_k_search(o.top_k_search);
            layer.ivf_clusters = o.ivf_clusters;
            layer.ivf_probes = o.ivf_probes;
            layer.ivf_refresh = o.ivf_refresh;
            if (layer.sparsity == sparsity_mode::automatic ||
                layer.sparsity == sparsity_mode::topk) {
                const output_plan plan = plan_output_layer(layer.size, o.batch_size, layer.sparsity,
                                                           layer.top_k, layer.active.min_active);
                layer.sparsity = plan.sparsity;
                layer.top_k = plan.top_k;
                layer.active.min_active = plan.min_active;
                if (output_choice) *output_choice = plan.reason;
            }
            if (layer.top_k == 0) layer.top_k = layer_config{}.top_k;  // unused: not top-k
            if (output_choice && o.output_lr_scale == 0 && layer.lr_scale != 1.0f)
                *output_choice += fmt::format("{}output layer at {:.3g} x lr ({} rows, above {})",
                                              output_choice->empty() ? "" : "; ", layer.lr_scale,
                                              layer.size, output_lr_scale_rows);
        }
        if (l > 0 && layer.active.min_active == 0) layer.active.min_active = lsh_min_active;
        config.layers.push_back(layer);
    }
    validate(config);
    return config;
}

void normalize_inputs(dataset& data, const model_config& config) {
    if (config.input_norm == input_normalization::l2) normalize_rows_l2(data);
}

}  // namespace hslide
