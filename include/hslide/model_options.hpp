// A network described as the `hslide train` flags describe it (and as the Python API's
// keyword arguments do): layer sizes, sparsity, LSH and active-set settings, with the
// library's defaults, turned into a checked model_config.
#pragma once

#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/lsh.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// Network settings. The LSH and active-set settings take one value for every layer that can
/// be sparse (all but the first), or one value per such layer: the hidden layers after the
/// first, then the output layer (`--K 4,6`).
struct model_options {
    /// Hidden layer widths; 0: automatic (automatic_hidden_width, output_plan.hpp).
    std::vector<uint32_t> hidden{0};
    std::string normalize = "l2";
    /// carried: the output layer has a row for each label a training point carries (the
    /// others can never be learned: label_map.hpp); all: a row for every label id; auto:
    /// carried where most label ids are carried by no training point (output_label_rows).
    std::string label_rows = "auto";
    std::string output_sparsity = "auto";
    std::string hidden_sparsity = "dense";
    uint32_t top_k = 0;  ///< 0: automatic (output_plan.hpp)
    std::string top_k_search = "auto";
    uint32_t ivf_clusters = layer_config{}.ivf_clusters, ivf_probes = layer_config{}.ivf_probes,
             ivf_refresh = layer_config{}.ivf_refresh;
    float fill_correction = layer_config{}.fill_correction;
    float fill_pool = layer_config{}.fill_pool;
    /// The output layer's learning rate as a multiple of --lr (layer_config::lr_scale);
    /// 0: automatic (automatic_output_lr_scale, output_plan.hpp).
    float output_lr_scale = 0.0f;
    uint32_t auto_sparse_min = 4096;
    /// The training batch: an automatic output layer's sets are sized so that a step touches
    /// at most about half of its rows (output_plan.hpp).
    uint32_t batch_size = train_config{}.batch_size;
    std::vector<std::string> hash{"dwta"};
    // The library's defaults (hslide/lsh.hpp), so the CLI and the API cannot drift apart.
    std::vector<int> K{lsh_config{}.K}, L{lsh_config{}.L}, bits{lsh_config{}.bits_per_hash},
        bucket_capacity{lsh_config{}.bucket_capacity};
    std::vector<std::string> insertion{"fifo"};
    /// 0: automatic (a top-k layer's from output_plan.hpp, an LSH layer's lsh_min_active)
    std::vector<uint32_t> min_active{0}, max_active{0}, hit_threshold{1}, probes{0};
};

/// An LSH layer's --min-active when it is 0 (automatic): SLIDE's fill.
constexpr uint32_t lsh_min_active = 1024;

/// The checked configuration of a network with `input_dim` features and `output_dim` labels;
/// throws hslide::error (invalid_argument) naming the setting that is wrong. An automatic output
/// layer becomes top-k or dense and automatic sizes become numbers (output_plan.hpp), so the
/// configuration (and a checkpoint of it) says what was chosen; with `output_choice`, the
/// plan's one-line reason is written there ("" for an LSH or dense layer asked for).
model_config make_model_config(const model_options& options, uint32_t input_dim,
                               uint32_t output_dim, std::string* output_choice = nullptr);
/// Sets the LSH layers' probes from --probes values (one, or one per layer after the first).
void set_probes(model_config& config, const std::vector<uint32_t>& probes);
/// Scales `data`'s feature values as the model's input normalization says.
void normalize_inputs(dataset& data, const model_config& config);

}  // namespace hslide
