// Parsing of the enum settings and validation of the configuration.
#include "hslide/config.hpp"

#include "common/util/enum_names.hpp"
#include "hslide/error.hpp"

#include <algorithm>
#include <cmath>

namespace hslide {

namespace {
using detail::name_of;
using detail::parse_named;

const std::pair<const char*, sparsity_mode> sparsity_names[] = {{"auto", sparsity_mode::automatic},
                                                                {"lsh", sparsity_mode::lsh},
                                                                {"dense", sparsity_mode::dense},
                                                                {"topk", sparsity_mode::topk}};
const std::pair<const char*, neuron_selection> selection_names[] = {
    {"all", neuron_selection::all},
    {"lsh", neuron_selection::lsh},
    {"topk", neuron_selection::top_k}};
const std::pair<const char*, top_k_search> search_names[] = {
    {"exact", top_k_search::exact}, {"ivf", top_k_search::ivf}, {"auto", top_k_search::automatic}};
const std::pair<const char*, adam_mode> adam_names[] = {
    {"sparse", adam_mode::sparse},
    {"dense", adam_mode::dense},
    {"input-dense", adam_mode::input_dense},
    {"catch-up", adam_mode::catch_up},
    {"input-catch-up", adam_mode::input_catch_up}};
const std::pair<const char*, scoring_mode> scoring_names[] = {
    {"auto", scoring_mode::automatic},
    {"exact", scoring_mode::exact},
    {"exact-bf16", scoring_mode::exact_bf16},
    {"exact-fast", scoring_mode::exact_fast},
    {"lsh", scoring_mode::lsh},
    {"ivf", scoring_mode::ivf}};
const std::pair<const char*, lr_schedule> schedule_names[] = {{"constant", lr_schedule::constant},
                                                              {"linear", lr_schedule::linear}};
const std::pair<const char*, lr_batch_scaling> scaling_names[] = {
    {"none", lr_batch_scaling::none},
    {"sqrt", lr_batch_scaling::sqrt},
    {"linear", lr_batch_scaling::linear}};
const std::pair<const char*, input_normalization> normalization_names[] = {
    {"none", input_normalization::none}, {"l2", input_normalization::l2}};
const std::pair<const char*, precision_mode> precision_names[] = {{"fp32", precision_mode::fp32},
                                                                  {"bf16", precision_mode::bf16}};
const std::pair<const char*, moment_storage> moment_names[] = {{"fp32", moment_storage::fp32},
                                                               {"bf16", moment_storage::bf16}};
}  // namespace

std::vector<std::string> names_of(sparsity_mode) {
    return detail::names_in(sparsity_names);
}
std::vector<std::string> names_of(input_normalization) {
    return detail::names_in(normalization_names);
}
std::vector<std::string> names_of(top_k_search) {
    return detail::names_in(search_names);
}
std::vector<std::string> names_of(adam_mode) {
    return detail::names_in(adam_names);
}
std::vector<std::string> names_of(scoring_mode) {
    return detail::names_in(scoring_names);
}
std::vector<std::string> names_of(precision_mode) {
    return detail::names_in(precision_names);
}
std::vector<std::string> names_of(moment_storage) {
    return detail::names_in(moment_names);
}
std::vector<std::string> names_of(lr_schedule) {
    return detail::names_in(schedule_names);
}
std::vector<std::string> names_of(lr_batch_scaling) {
    return detail::names_in(scaling_names);
}

moment_storage parse_moment_storage(const std::string& name) {
    return parse_named(name, "moment storage", moment_names);
}
const char* to_string(moment_storage storage) {
    return name_of(storage, moment_names);
}

precision_mode parse_precision(const std::string& name) {
    return parse_named(name, "precision", precision_names);
}
const char* to_string(precision_mode mode) {
    return name_of(mode, precision_names);
}

lr_schedule parse_lr_schedule(const std::string& name) {
    return parse_named(name, "learning-rate schedule", schedule_names);
}
const char* to_string(lr_schedule schedule) {
    return name_of(schedule, schedule_names);
}

lr_batch_scaling parse_lr_batch_scaling(const std::string& name) {
    return parse_named(name, "learning-rate batch scaling", scaling_names);
}
const char* to_string(lr_batch_scaling scaling) {
    return name_of(scaling, scaling_names);
}

float scaled_learning_rate(const train_config& train) {
    const double ratio = double(train.batch_size) / double(train.lr_base_batch);
    switch (train.lr_scaling) {
        case lr_batch_scaling::none:
            return train.learning_rate;
        case lr_batch_scaling::sqrt:
            return float(train.learning_rate * std::sqrt(ratio));
        case lr_batch_scaling::linear:
            return float(train.learning_rate * ratio);
    }
    return train.learning_rate;
}

input_normalization parse_input_normalization(const std::string& name) {
    return parse_named(name, "input normalization", normalization_names);
}
const char* to_string(input_normalization mode) {
    return name_of(mode, normalization_names);
}

sparsity_mode parse_sparsity(const std::string& name) {
    return parse_named(name, "sparsity", sparsity_names);
}
const char* to_string(sparsity_mode mode) {
    return name_of(mode, sparsity_names);
}
const char* to_string(neuron_selection selection) {
    return name_of(selection, selection_names);
}
top_k_search parse_top_k_search(const std::string& name) {
    return parse_named(name, "top-k search", search_names);
}
const char* to_string(top_k_search search) {
    return name_of(search, search_names);
}

uint32_t automatic_ivf_clusters(uint32_t rows) {
    // Fewer, larger clusters than FAISS's 4-16 sqrt(rows): training moves the rows between
    // refreshes, and large clusters keep a moved row among the probed ones (bench/topk.md:
    // 3,274 clusters lost most of the top-k by the third epoch; 400 kept all of it).
    const double c = std::round(std::sqrt(double(rows)) / 2.0);
    return uint32_t(std::clamp<double>(c, 1.0, std::max(1.0, double(rows))));
}

uint32_t ivf_cluster_count(uint32_t given, uint32_t rows) {
    return std::min(given ? given : automatic_ivf_clusters(rows), rows);
}

uint32_t ivf_shard_cluster_count(uint32_t given, uint32_t total, uint32_t rows) {
    HSLIDE_ASSERT(rows > 0 && rows <= total);
    const uint32_t whole = ivf_cluster_count(given, total);
    if (rows == total) return whole;
    return uint32_t(
        std::max(1.0, std::round(double(whole) * std::sqrt(double(rows) / double(total)))));
}

uint32_t cpu_exact_rows_per_ivf_row(isa_level level) {
    if (level >= isa_level::amx) return 8;
    if (level >= isa_level::avx512 && cpu_exact_search_in_int8(level)) return 8;
    return level >= isa_level::avx2 ? 4 : 1;
}

top_k_search cpu_top_k_search(const layer_config& layer, isa_level level, uint32_t rows) {
    if (layer.search != top_k_search::automatic) return layer.search;
    const uint32_t clusters =
        ivf_shard_cluster_count(layer.ivf_clusters, layer.size, rows ? rows : layer.size);
    return uint64_t(layer.ivf_probes) * cpu_exact_rows_per_ivf_row(level) *
                       ivf_min_product_saving >=
                   clusters
               ? top_k_search::exact
               : top_k_search::ivf;
}
adam_mode parse_adam_mode(const std::string& name) {
    return parse_named(name, "adam mode", adam_names);
}
const char* to_string(adam_mode mode) {
    return name_of(mode, adam_names);
}
scoring_mode parse_scoring(const std::string& name) {
    return parse_named(name, "scoring mode", scoring_names);
}
const char* to_string(scoring_mode mode) {
    return name_of(mode, scoring_names);
}

neuron_selection model_config::selection(size_t l) const {
    HSLIDE_ASSERT(l < layers.size());
    if (l == 0) return neuron_selection::all;  // the sparse-input layer is dense in its outputs
    switch (layers[l].sparsity) {
        case sparsity_mode::lsh:
            return neuron_selection::lsh;
        case sparsity_mode::dense:
            return neuron_selection::all;
        case sparsity_mode::topk:
            return neuron_selection::top_k;
        case sparsity_mode::automatic:
            // A large output layer selects by top-k: it learns far more per epoch than LSH on
            // both devices, and dense's P@1 sooner (bench/topk.md, bench/gpu.md); a large
            // hidden layer by LSH (top-k needs the logits, which only the output layer has).
            if (layers[l].size <= auto_sparse_min) return neuron_selection::all;
            return l + 1 == layers.size() ? neuron_selection::top_k : neuron_selection::lsh;
    }
    return neuron_selection::all;
}

void validate(const model_config& model) {
    HSLIDE_CHECK(model.input_dim > 0, "the input dimension (number of features) must be positive");
    HSLIDE_CHECK(model.layers.size() >= 2,
                 "the network needs at least one hidden layer and the output layer");
    for (size_t l = 0; l < model.layers.size(); ++l) {
        const auto& layer = model.layers[l];
        HSLIDE_CHECK(layer.size > 0, "layer {} has no neurons", l);
        HSLIDE_CHECK(!(l == 0 && layer.sparsity == sparsity_mode::lsh),
                     "the first layer (over the sparse input features) cannot be LSH-sparse; "
                     "make a later layer sparse instead");
        // Top-k ranks logits: only the output layer has them before its activation is known
        // (a hidden layer's top-k would need its whole product, which is the dense layer).
        HSLIDE_CHECK(layer.sparsity != sparsity_mode::topk || l + 1 == model.layers.size(),
                     "layer {}: top-k selection is for the output layer only (hidden layers: "
                     "lsh or dense)",
                     l);
        if (model.selection(l) == neuron_selection::top_k) {
            HSLIDE_CHECK(layer.top_k >= 1, "layer {}: --top-k must be at least 1", l);
            if (layer.search != top_k_search::exact)
                HSLIDE_CHECK(layer.ivf_probes >= 1, "layer {}: --ivf-probes must be at least 1", l);
        }
        HSLIDE_CHECK(layer.fill_correction >= 0.0f && layer.fill_correction <= 1.0f,
                     "layer {}: --fill-correction must be in [0, 1], got {}", l,
                     layer.fill_correction);
        HSLIDE_CHECK(layer.fill_pool >= 0.0f && layer.fill_pool <= 1.0f,
                     "layer {}: --fill-pool must be in [0, 1], got {}", l, layer.fill_pool);
        HSLIDE_CHECK(layer.lr_scale > 0.0f && std::isfinite(layer.lr_scale),
                     "layer {}: its learning-rate scale (--output-lr-scale) must be a finite "
                     "number > 0, got {:g}",
                     l, layer.lr_scale);
        if (model.uses_lsh(l)) {
            validate(layer.lsh);
            HSLIDE_CHECK(
                layer.active.max_active == 0 || layer.active.max_active >= layer.active.min_active,
                "layer {}: max-active ({}) is below min-active ({})", l, layer.active.max_active,
                layer.active.min_active);
            HSLIDE_CHECK(layer.active.probes <= 64, "layer {}: --probes {} is more than 64", l,
                         layer.active.probes);
            HSLIDE_CHECK(layer.active.hit_threshold >= 1 &&
                             layer.active.hit_threshold <= static_cast<uint32_t>(layer.lsh.L),
                         "layer {}: hit-threshold must be in [1, L={}], got {}", l, layer.lsh.L,
                         layer.active.hit_threshold);
        }
    }
}

void validate(const model_config& model, const train_config& train) {
    HSLIDE_CHECK(train.loss != output_loss::logistic || model.layers.empty() ||
                     model.layers.back().fill_correction == 0.0f,
                 "--fill-correction corrects the softmax over a set; with --loss logistic (the "
                 "CPU's --loss auto) leave it at 0, or use --loss softmax");
}

void validate(const train_config& train) {
    HSLIDE_CHECK(train.epochs > 0, "--epochs must be at least 1 (in total, when resuming)");
    HSLIDE_CHECK(train.loss != output_loss::automatic,
                 "--loss auto is resolved for a backend before training (resolve_auto_training)");
    HSLIDE_CHECK(train.batch_size > 0, "batch-size must be positive");
    HSLIDE_CHECK(train.lr_base_batch > 0, "lr-base-batch must be positive");
    HSLIDE_CHECK(train.reuse_candidates_epochs >= 0 && std::isfinite(train.reuse_candidates_epochs),
                 "--reuse-candidates must be a finite number of epochs >= 0 (or -1: auto), got "
                 "{:g}",
                 train.reuse_candidates_epochs);
    HSLIDE_CHECK(train.ivf_min_recall >= 0 && train.ivf_min_recall <= 1,
                 "--ivf-min-recall must be a share in [0, 1], got {:g}", train.ivf_min_recall);
    // {:g}: an infinite or huge value prints as "inf" or "3.4e+38", not 300 digits.
    HSLIDE_CHECK(train.learning_rate > 0 && std::isfinite(train.learning_rate),
                 "--lr must be a finite number > 0, got {:g}", train.learning_rate);
    HSLIDE_CHECK(train.adam_beta1 >= 0 && train.adam_beta1 < 1,
                 "--beta1 must be in [0, 1), got {:g}", train.adam_beta1);
    HSLIDE_CHECK(train.adam_beta2 >= 0 && train.adam_beta2 < 1,
                 "--beta2 must be in [0, 1), got {:g}", train.adam_beta2);
    HSLIDE_CHECK(train.adam_epsilon > 0 && std::isfinite(train.adam_epsilon),
                 "--adam-eps must be a finite number > 0, got {:g}", train.adam_epsilon);
    HSLIDE_CHECK(train.rebuild_every > 0, "rebuild must be a positive number of samples");
    HSLIDE_CHECK(train.rebuild_decay >= 0 && std::isfinite(train.rebuild_decay),
                 "--rebuild-decay must be a finite number >= 0, got {:g}", train.rebuild_decay);
    check_thread_count(train.threads, "threads (--threads)");
    // Catch-up applies a row's skipped momentum steps in closed form from its fp32 moments.
    HSLIDE_CHECK(train.adam_moments == moment_storage::fp32 || train.adam != adam_mode::catch_up,
                 "--adam-moments bf16 needs Adam stepping the layers past the input one "
                 "(--adam sparse, dense, input-dense or input-catch-up), not --adam catch-up");
}

}  // namespace hslide

// --- JSON ------------------------------------------------------------------------------------

#include "common/util/json_util.hpp"

#include <nlohmann/json.hpp>

namespace hslide {

using detail::json_integer;
using detail::json_integer_or;

std::string model_config_to_json(const model_config& config) {
    nlohmann::json j;
    j["input_dim"] = config.input_dim;
    j["auto_sparse_min"] = config.auto_sparse_min;
    j["input_norm"] = to_string(config.input_norm);
    for (const auto& layer : config.layers) {
        j["layers"].push_back({{"size", layer.size},
                               {"sparsity", to_string(layer.sparsity)},
                               {"hash", to_string(layer.lsh.kind)},
                               {"K", layer.lsh.K},
                               {"L", layer.lsh.L},
                               {"bits_per_hash", layer.lsh.bits_per_hash},
                               {"bucket_capacity", layer.lsh.bucket_capacity},
                               {"insertion", to_string(layer.lsh.policy)},
                               {"min_active", layer.active.min_active},
                               {"max_active", layer.active.max_active},
                               {"hit_threshold", layer.active.hit_threshold},
                               {"probes", layer.active.probes},
                               {"top_k", layer.top_k},
                               {"top_k_search", to_string(layer.search)},
                               {"ivf_clusters", layer.ivf_clusters},
                               {"ivf_probes", layer.ivf_probes},
                               {"ivf_refresh", layer.ivf_refresh},
                               {"fill_correction", layer.fill_correction},
                               {"fill_pool", layer.fill_pool},
                               {"lr_scale", layer.lr_scale}});
    }
    return j.dump();
}

model_config model_config_from_json(const std::string& json_text) {
    try {
        const nlohmann::json j = nlohmann::json::parse(json_text);
        model_config config;
        config.input_dim = json_integer<uint32_t>(j, "input_dim");
        config.auto_sparse_min = json_integer<uint32_t>(j, "auto_sparse_min");
        config.input_norm = parse_input_normalization(j.at("input_norm").get<std::string>());
        for (const auto& jl : j.at("layers")) {
            layer_config layer;
            layer.size = json_integer<uint32_t>(jl, "size");
            layer.sparsity = parse_sparsity(jl.at("sparsity").get<std::string>());
            layer.lsh.kind = parse_hash_kind(jl.at("hash").get<std::string>());
            layer.lsh.K = json_integer<int>(jl, "K");
            layer.lsh.L = json_integer<int>(jl, "L");
            layer.lsh.bits_per_hash = json_integer<int>(jl, "bits_per_hash");
            layer.lsh.bucket_capacity = json_integer<int>(jl, "bucket_capacity");
            layer.lsh.policy = parse_insertion_policy(jl.at("insertion").get<std::string>());
            layer.active.min_active = json_integer<uint32_t>(jl, "min_active");
            layer.active.max_active = json_integer<uint32_t>(jl, "max_active");
            layer.active.hit_threshold = json_integer<uint32_t>(jl, "hit_threshold");
            layer.active.probes =
                json_integer_or<uint32_t>(jl, "probes", 0u);  // absent in older checkpoints
            layer.top_k = json_integer_or(jl, "top_k", layer_config{}.top_k);
            // Absent before --top-k-search: exact.
            layer.search = parse_top_k_search(jl.value("top_k_search", std::string("exact")));
            layer.ivf_clusters = json_integer_or(jl, "ivf_clusters", layer_config{}.ivf_clusters);
            layer.ivf_probes = json_integer_or(jl, "ivf_probes", layer_config{}.ivf_probes);
            layer.ivf_refresh = json_integer_or(jl, "ivf_refresh", layer_config{}.ivf_refresh);
            layer.fill_correction = jl.value("fill_correction", 0.0f);  // absent before
            // Absent before --fill-pool: the whole layer, as those models trained.
            layer.fill_pool = jl.value("fill_pool", 0.0f);
            layer.lr_scale = jl.value("lr_scale", 1.0f);  // absent before: every layer at lr
            config.layers.push_back(layer);
        }
        return config;
    } catch (const nlohmann::json::exception& e) {
        throw error(error_kind::bad_input, fmt::format("bad model configuration: {}", e.what()));
    } catch (const error& e) {
        throw error(error_kind::bad_input, fmt::format("bad model configuration: {}", e.what()));
    }
}

adam_corrections adam_bias_corrections(const train_config& train, uint64_t t) {
    return {float(1.0 / (1.0 - std::pow(double(train.adam_beta1), double(t)))),
            float(1.0 / (1.0 - std::pow(double(train.adam_beta2), double(t))))};
}

}  // namespace hslide
