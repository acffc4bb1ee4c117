// Model checkpoints on top of checkpoint_file (see checkpoint.hpp).
#include "hslide/checkpoint.hpp"

#include "common/util/json_util.hpp"
#include "hslide/checkpoint_file.hpp"
#include "hslide/error.hpp"
#include "hslide/memory.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>

namespace hslide {

namespace {
std::string section(size_t layer, const char* what) {
    return fmt::format("layer{}.{}", layer, what);
}

void add_floats(checkpoint_writer& w, const std::string& name, const aligned_floats& values) {
    w.add_unowned(name, values.data(), values.size() * sizeof(float));
}

void read_floats(const checkpoint_reader& r, const std::string& name, aligned_floats& out,
                 size_t expected) {
    const auto view = r.get(name);
    if (view.size != expected * sizeof(float))
        throw input_error(r.path(), 0,
                          fmt::format("section '{}' holds {} bytes, the model needs {}", name,
                                      view.size, expected * sizeof(float)));
    out.resize(expected);
    std::memcpy(out.data(), view.data, view.size);
}

void read_floats(const checkpoint_reader& r, const std::string& name, std::vector<float>& out,
                 size_t expected) {
    out = r.get_vector<float>(name);
    if (out.size() != expected)
        throw input_error(r.path(), 0,
                          fmt::format("section '{}' holds {} floats, the model needs {}", name,
                                      out.size(), expected));
}
}  // namespace

void save_checkpoint(const std::string& path, const model_state& model,
                     const trainer_state& trainer, const std::vector<uint32_t>& label_counts,
                     uint64_t train_points, const label_map& rows,
                     const model_state* training_weights, const candidate_cache* candidates) {
    if (training_weights) model.check_same_layout(*training_weights);
    checkpoint_writer w(path);
    nlohmann::json meta;
    meta["model"] = nlohmann::json::parse(model_config_to_json(model.config));
    meta["adam_step"] = model.adam_step;
    meta["hash_seeds"] = model.hash_seeds;
    meta["trainer"] = {
        {"epochs_done", trainer.epochs_done},
        {"samples_seen", trainer.samples_seen},
        {"next_rebuild", trainer.next_rebuild},
        {"rebuild_period", trainer.rebuild_period},
        {"next_rehash", trainer.next_rehash},
        {"seconds", trainer.seconds},
        {"shuffle_rng", std::vector<uint64_t>(trainer.shuffle_rng, trainer.shuffle_rng + 4)}};
    // Only where there is something to say: other checkpoints read as before.
    if (trainer.epochs_auto) meta["trainer"]["epochs_auto"] = true;
    if (trainer.best_epoch > 0) {
        meta["trainer"]["best_epoch"] = trainer.best_epoch;
        meta["trainer"]["best_value"] = trainer.best_value;
        if (trainer.improved_epoch != trainer.best_epoch) {
            meta["trainer"]["improved_epoch"] = trainer.improved_epoch;
            meta["trainer"]["improved_value"] = trainer.improved_value;
        }
    }
    if (trainer.lr_drops > 0) {
        meta["trainer"]["lr_drops"] = trainer.lr_drops;
        meta["trainer"]["lr_dropped_after"] = trainer.lr_dropped_after;
    }
    meta["train_points"] = train_points;
    if (model.holds_output_shard())  // a rank's file of a sharded checkpoint (shard_checkpoint.hpp)
        meta["output_shard"] = {{"first", model.output_first},
                                {"count", model.layers.back().rows},
                                {"rows", model.config.output_dim()}};
    const bool with_candidates = candidates && !candidates->empty();
    if (with_candidates) meta["candidates_width"] = candidates->width;
    w.add_json("meta", meta);
    for (size_t l = 0; l < model.layers.size(); ++l) {
        const layer_state& layer = model.layers[l];
        add_floats(w, section(l, "weights"), layer.weights);
        add_floats(w, section(l, "adam_m"), layer.adam_m);
        add_floats(w, section(l, "adam_v"), layer.adam_v);
        w.add_vector(section(l, "bias"), layer.bias);
        w.add_vector(section(l, "bias_m"), layer.bias_m);
        w.add_vector(section(l, "bias_v"), layer.bias_v);
        if (training_weights) {
            add_floats(w, section(l, "training_weights"), training_weights->layers[l].weights);
            w.add_vector(section(l, "training_bias"), training_weights->layers[l].bias);
        }
    }
    if (!label_counts.empty()) w.add_vector("label_counts", label_counts);
    if (!rows.identity()) w.add_vector("row_labels", rows.labels);
    if (with_candidates) {
        w.add_vector("candidates_ids", candidates->ids);
        w.add_vector("candidates_steps", candidates->steps);
    }
    w.commit();
}

checkpoint_contents load_checkpoint(const std::string& path) {
    checkpoint_reader r(path);
    checkpoint_contents c;
    const nlohmann::json meta = r.get_json("meta");
    try {
        const model_config config = model_config_from_json(meta.at("model").dump());
        c.model = model_state::layout(config);
        c.model.adam_step = detail::json_integer<uint64_t>(meta, "adam_step");
        c.model.hash_seeds = meta.at("hash_seeds").get<std::vector<uint64_t>>();
        const auto& t = meta.at("trainer");
        c.trainer.epochs_done = detail::json_integer<uint32_t>(t, "epochs_done");
        c.trainer.samples_seen = detail::json_integer<uint64_t>(t, "samples_seen");
        c.trainer.next_rebuild = detail::json_integer<uint64_t>(t, "next_rebuild");
        c.trainer.rebuild_period = t.at("rebuild_period").get<double>();
        c.trainer.next_rehash = detail::json_integer<uint64_t>(t, "next_rehash");
        c.trainer.seconds = t.at("seconds").get<double>();
        const auto rng_state = t.at("shuffle_rng").get<std::vector<uint64_t>>();
        if (rng_state.size() != 4)
            throw input_error(path, 0, "trainer RNG state must have 4 words");
        std::copy(rng_state.begin(), rng_state.end(), c.trainer.shuffle_rng);
        c.trainer.epochs_auto = t.value("epochs_auto", false);
        c.trainer.best_epoch = detail::json_integer_or<uint32_t>(t, "best_epoch", 0);
        c.trainer.best_value = t.value("best_value", 0.0);
        c.trainer.improved_epoch =
            detail::json_integer_or<uint32_t>(t, "improved_epoch", c.trainer.best_epoch);
        c.trainer.improved_value = t.value("improved_value", c.trainer.best_value);
        c.trainer.lr_drops = detail::json_integer_or<uint32_t>(t, "lr_drops", 0);
        c.trainer.lr_dropped_after = detail::json_integer_or<uint32_t>(t, "lr_dropped_after", 0);
        c.train_points = detail::json_integer_or<uint64_t>(meta, "train_points", 0);
        c.candidates.width = detail::json_integer_or<uint32_t>(meta, "candidates_width", 0);
        if (meta.contains("output_shard")) {
            // One rank's rows of the output layer: [first, first + count) of `rows`.
            const auto& shard = meta.at("output_shard");
            const uint32_t first = detail::json_integer<uint32_t>(shard, "first");
            const uint32_t count = detail::json_integer<uint32_t>(shard, "count");
            const uint32_t rows = detail::json_integer<uint32_t>(shard, "rows");
            if (rows != config.output_dim() || count == 0 || first >= rows || count > rows - first)
                throw input_error(
                    path, 0,
                    fmt::format("bad output shard: rows [{}, {}) of {}, the model "
                                "has {}",
                                first, uint64_t(first) + count, rows, config.output_dim()));
            c.model.layers.back().rows = count;
            c.model.output_first = first;
        }
        if (!(c.trainer.rebuild_period >= 0 && std::isfinite(c.trainer.rebuild_period) &&
              c.trainer.seconds >= 0 && std::isfinite(c.trainer.seconds)))
            throw input_error(path, 0, "bad checkpoint metadata: a negative or non-finite time");
    } catch (const nlohmann::json::exception& e) {
        throw input_error(path, 0, fmt::format("bad checkpoint metadata: {}", e.what()));
    } catch (const error& e) {
        throw input_error(path, 0, e.what());
    }
    if (c.model.hash_seeds.size() != c.model.layers.size())
        throw input_error(path, 0, "hash seeds do not match the number of layers");
    // A run that averaged its weights wrote the weights training was at beside them.
    const bool averaged = r.has(section(0, "training_weights"));
    check_host_allocation(fmt::format("{}: {}{}", path, describe_model_allocation(c.model, true),
                                      averaged ? " and its training weights" : ""),
                          model_allocation_bytes(c.model, true) +
                              (averaged ? model_allocation_bytes(c.model, false) : 0));
    // The checksums say the bytes are those written; a NaN written (a run that diverged, a
    // file made elsewhere) would score every label NaN and evaluate to P@1 0 without a word.
    const auto check_finite = [&](const auto& values, const std::string& name) {
        for (size_t i = 0; i < values.size(); ++i)
            if (!std::isfinite(values[i]))
                throw input_error(path, 0,
                                  fmt::format("section '{}' holds {} at index {}: the model "
                                              "diverged before it was saved, or the file is "
                                              "damaged",
                                              name, values[i], i));
    };
    for (size_t l = 0; l < c.model.layers.size(); ++l) {
        layer_state& layer = c.model.layers[l];
        const size_t n = size_t(layer.rows) * layer.stride;
        const size_t neurons = l == 0 ? c.model.neurons(0) : layer.rows;  // a shard's rows
        const std::pair<const char*, aligned_floats*> rows[] = {
            {"weights", &layer.weights}, {"adam_m", &layer.adam_m}, {"adam_v", &layer.adam_v}};
        for (const auto& [name, values] : rows) {
            read_floats(r, section(l, name), *values, n);
            check_finite(*values, section(l, name));
        }
        const std::pair<const char*, std::vector<float>*> biases[] = {
            {"bias", &layer.bias}, {"bias_m", &layer.bias_m}, {"bias_v", &layer.bias_v}};
        for (const auto& [name, values] : biases) {
            read_floats(r, section(l, name), *values, neurons);
            check_finite(*values, section(l, name));
        }
    }
    if (averaged) {  // every layer has its training weights
        c.training_weights = model_state::layout(c.model.config);
        model_state& t = *c.training_weights;
        t.layers.back().rows = c.model.layers.back().rows;
        t.output_first = c.model.output_first;
        t.adam_step = c.model.adam_step;
        t.hash_seeds = c.model.hash_seeds;
        for (size_t l = 0; l < t.layers.size(); ++l) {
            layer_state& layer = t.layers[l];
            read_floats(r, section(l, "training_weights"), layer.weights,
                        size_t(layer.rows) * layer.stride);
            read_floats(r, section(l, "training_bias"), layer.bias, c.model.layers[l].bias.size());
            check_finite(layer.weights, section(l, "training_weights"));
            check_finite(layer.bias, section(l, "training_bias"));
        }
    }
    if (r.has("label_counts")) c.label_counts = r.get_vector<uint32_t>("label_counts");
    if (r.has("row_labels")) {
        c.rows.labels = r.get_vector<uint32_t>("row_labels");
        const std::vector<uint32_t>& labels = c.rows.labels;
        if (labels.size() != c.model.config.output_dim() ||
            std::adjacent_find(labels.begin(), labels.end(), std::greater_equal<uint32_t>()) !=
                labels.end())
            throw input_error(path, 0,
                              fmt::format("section 'row_labels' must name {} labels, ascending, "
                                          "one for each output row",
                                          c.model.config.output_dim()));
    }
    // The counts are of every label the model knows: PSP@k looks each true label up in them.
    const uint64_t labels_known =
        c.rows.identity() ? c.model.config.output_dim() : uint64_t(c.rows.labels.back()) + 1;
    if (!c.label_counts.empty() && c.label_counts.size() < labels_known)
        throw input_error(path, 0,
                          fmt::format("section 'label_counts' holds {} counts, and the model's "
                                      "labels need {}",
                                      c.label_counts.size(), labels_known));
    if (!c.candidates.empty()) {
        c.candidates.ids = r.get_vector<uint32_t>("candidates_ids");
        c.candidates.steps = r.get_vector<uint64_t>("candidates_steps");
        if (c.candidates.ids.size() != c.candidates.steps.size() * c.candidates.width)
            throw input_error(
                path, 0,
                fmt::format("section 'candidates_ids' holds {} ids, and {} points "
                            "of {} candidates need {}",
                            c.candidates.ids.size(), c.candidates.steps.size(), c.candidates.width,
                            c.candidates.steps.size() * c.candidates.width));
    }
    return c;
}

void check_resume_epochs(const train_config& train, const trainer_state& done,
                         const std::string& path) {
    HSLIDE_CHECK(train.epochs_auto == done.epochs_auto,
                 "--resume {}: the checkpoint was written by an --epochs {} run, and this one is "
                 "--epochs {}: resume it with --epochs {}",
                 path, done.epochs_auto ? "auto" : "N", train.epochs_auto ? "auto" : "N",
                 done.epochs_auto ? std::string("auto")
                                  : fmt::format("N (more than its {} epochs)", done.epochs_done));
    const uint32_t epochs = train.epochs;
    HSLIDE_CHECK(epochs > done.epochs_done,
                 "--resume {}: the checkpoint has done {} epochs and --epochs {} counts them in "
                 "(it is the total), so there is nothing to train: give --epochs {} or more",
                 path, done.epochs_done, epochs, uint64_t(done.epochs_done) + 1);
}

}  // namespace hslide
