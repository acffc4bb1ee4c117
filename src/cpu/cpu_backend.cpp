// The CPU backend (see cpu_backend.hpp for the shape of a step).
#include "cpu_backend.hpp"

#include "top_k.hpp"
#include "top_k_selector.hpp"

#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/rng.hpp"
#include "hslide/system_info.hpp"

#include "hslide/clock.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace hslide::cpu {

cpu_backend::cpu_backend(model_state initial, const train_config& train, int threads,
                         const kernel_table& kernels, precision_mode precision, output_shard shard)
    : model_(std::move(initial)),
      train_(train),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      k_(kernels),
      precision_(precision),
      shard_(std::move(shard)) {
    offer_rows(this);
    validate(model_.config);
    const size_t n_layers = model_.layers.size();
    if (shard_.sharded()) check_shardable();
    validate(model_.config, train_);
    if (model_.config.selection(n_layers - 1) == neuron_selection::top_k) {
        // Top-k scores every output row each step, so every row would have to catch up
        // every step: that is dense Adam, which --adam dense runs directly.
        HSLIDE_CHECK_KIND(!adam_catches_up_rows(train_.adam, n_layers - 1), error_kind::unsupported,
                          "--adam {} with a top-k output layer: top-k reads every output row each "
                          "step (use input-catch-up, sparse, input-dense or dense)",
                          to_string(train_.adam));
        HSLIDE_CHECK_KIND(!model_.config.has_active_sets(n_layers - 2), error_kind::unsupported,
                          "a top-k output layer needs a dense last hidden layer (its exact "
                          "scoring is a product of whole hidden vectors)");
    }
    groups_.resize(n_layers);
    changed_.resize(n_layers);
    uint32_t max_width = 0;
    for (size_t l = 0; l < n_layers; ++l) {
        max_width = std::max(max_width, model_.layers[l].width);
        groups_[l].slot.assign(model_.layers[l].rows, -1);
        changed_[l] = row_marks(model_.layers[l].rows);
    }
    scratch_.resize(threads_);
    for (auto& s : scratch_) {
        s.grad.resize(4 * padded_stride(max_width));
        if (use_bf16()) s.input16.resize(max_width);
    }
    if (use_bf16()) {
        weights16_.resize(n_layers);
        for (size_t l = 0; l < n_layers; ++l) refresh_bf16_layer(l);
    }
    if (train_.adam_moments == moment_storage::bf16) take_moments();
    // The selections read the rows through rows_of, so they see the bf16 copies and any import.
    selections_.resize(n_layers);
    for (size_t l = 1; l < n_layers; ++l) make_selection(l);
    if (catches_up()) {
        catch_up_ = adam_catch_up(train_.adam_beta1, train_.adam_beta2, train_.adam_epsilon,
                                  model_.adam_step);
        row_step_.resize(n_layers);
        for (size_t l = 0; l < n_layers; ++l)
            if (catches_up(l))
                row_step_[l] = std::make_unique<std::atomic<uint64_t>[]>(model_.layers[l].rows);
        restart_catch_up();
    }
}

void cpu_backend::take_moments() {
    moments16_.resize(model_.layers.size());
    for (size_t l = 1; l < model_.layers.size(); ++l) {
        layer_state& layer = model_.layers[l];
        const size_t n = size_t(layer.rows) * layer.stride;
        HSLIDE_ASSERT(n < (size_t{1} << 32));
        auto take = [&](aligned_floats& fp32, aligned_array<bf16>& out) {
            // A new model's moments are zeros: freed before the bf16 ones are made, so taking
            // them never raises the peak. Others (a resumed run's) are rounded first.
            const bool zeros = fp32.size() != n || std::all_of(fp32.data(), fp32.data() + n,
                                                               [](float x) { return x == 0.0f; });
            if (zeros) fp32.resize(0);
            out.resize(n);  // zeros
            if (!zeros) k_.to_bf16(fp32.data(), out.data(), uint32_t(n));
            fp32.resize(0);  // the fp32 copy is what the option saves
        };
        take(layer.adam_m, moments16_[l].m);
        take(layer.adam_v, moments16_[l].v);
    }
}

void cpu_backend::drop_widened_moments() {
    for (size_t l = 1; l < moments16_.size(); ++l) {
        model_.layers[l].adam_m.resize(0);
        model_.layers[l].adam_v.resize(0);
    }
}

void cpu_backend::widen_moments(model_state& out) const {
    for (size_t l = 1; l < moments16_.size(); ++l) {
        const bf16_moments_of_layer& b = moments16_[l];
        layer_state& layer = out.layers[l];
        layer.adam_m.resize(b.m.size());
        layer.adam_v.resize(b.v.size());
#pragma omp parallel for schedule(static) num_threads(threads_)
        for (int64_t i = 0; i < int64_t(b.m.size()); ++i) {
            layer.adam_m[size_t(i)] = bf16_to_float(b.m[size_t(i)]);
            layer.adam_v[size_t(i)] = bf16_to_float(b.v[size_t(i)]);
        }
    }
}

void cpu_backend::refresh_bf16_layer(size_t l) {
    const layer_state& layer = model_.layers[l];
    bf16_weights& w16 = weights16_[l];
    // 32 bf16 values are one cache line, so rows start on line boundaries.
    const uint32_t stride = (layer.width + 31u) & ~31u;
    if (w16.stride != stride || w16.values.size() != size_t(layer.rows) * stride) {
        w16.stride = stride;
        w16.values.resize(size_t(layer.rows) * stride);
    }
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t r = 0; r < int64_t(layer.rows); ++r)
        k_.to_bf16(layer.row(uint32_t(r)), w16.row(uint32_t(r)), layer.width);
}

void cpu_backend::ensure_buffers(uint32_t batch_size) {
    if (samples_.size() < batch_size) samples_.resize(batch_size);
    for (auto& s : samples_)
        if (s.layers.size() != model_.layers.size()) s.layers.resize(model_.layers.size());
}

void cpu_backend::forward_input_layer(const dataset& data, uint32_t point, uint32_t s,
                                      thread_scratch& scratch) {
    forward_input_layers(data, &point, s, 1, scratch);
}

void cpu_backend::forward_input_layers(const dataset& data, const uint32_t* points, uint32_t first,
                                       uint32_t count, thread_scratch& scratch) {
    HSLIDE_ASSERT(count >= 1 && count <= 4);
    const auto t0 = clock_type::now();
    const layer_state& layer = model_.layers[0];
    feature_row x[4];
    float* out[4];
    // Four samples with the same features (a dense input's) read each row once for the four:
    // the row reads bound this layer, and the sums are the bits each sample's alone would be.
    bool shared = count == 4 && !use_bf16();
    for (uint32_t j = 0; j < count; ++j) {
        x[j] = data.features(points[j]);
        layer_buffers& o = samples_[first + j].layers[0];
        o.ids.clear();
        o.act.assign(layer.bias.begin(), layer.bias.end());
        out[j] = o.act.data();
        for (uint32_t i = 0; i < x[j].count; ++i)
            HSLIDE_CHECK(x[j].ids[i] < layer.rows,
                         "{}: point {} has feature {} but the model has {} inputs", data.source,
                         points[j], x[j].ids[i], layer.rows);
        shared = shared && x[j].count == x[0].count &&
                 (x[j].ids == x[0].ids || x[0].count == 0 ||
                  std::memcmp(x[j].ids, x[0].ids, x[0].count * sizeof(uint32_t)) == 0);
    }
    if (shared) {
        const float* coef[4] = {x[0].values, x[1].values, x[2].values, x[3].values};
        k_.weighted_row_sum4(layer.weights.data(), layer.stride, layer.width, x[0].ids, coef,
                             x[0].count, out);
    } else {
        for (uint32_t j = 0; j < count; ++j) {
            if (use_bf16()) {
                const bf16_weights& w16 = weights16_[0];
                k_.weighted_row_sum_bf16(w16.values.data(), w16.stride, layer.width, x[j].ids,
                                         x[j].values, x[j].count, out[j]);
            } else {
                k_.weighted_row_sum(layer.weights.data(), layer.stride, layer.width, x[j].ids,
                                    x[j].values, x[j].count, out[j]);
            }
        }
    }
    for (uint32_t j = 0; j < count; ++j)
        for (float* a = out[j]; a != out[j] + layer.width; ++a) *a = *a > 0.0f ? *a : 0.0f;
    scratch.times.forward += seconds_since(t0);
}

void cpu_backend::layer_products(size_t l, uint32_t s, thread_scratch& scratch) {
    const auto t0 = clock_type::now();
    const layer_state& layer = model_.layers[l];
    const layer_buffers& in = samples_[s].layers[l - 1];
    layer_buffers& out = samples_[s].layers[l];
    const bool every_neuron = out.ids.empty();
    const uint32_t n_active = every_neuron ? layer.rows : uint32_t(out.ids.size());
    out.act.resize(n_active);
    const uint32_t* ids = every_neuron ? nullptr : out.ids.data();
    if (!in.ids.empty()) {
        // A sparse input (an LSH hidden layer before this one): gathers from the fp32 rows.
        for (uint32_t a = 0; a < n_active; ++a) {
            const uint32_t j = ids ? ids[a] : a;
            out.act[a] =
                k_.gather_dot(layer.row(j), in.ids.data(), in.act.data(), uint32_t(in.ids.size())) +
                layer.bias[j];
        }
    } else if (use_bf16()) {
        const bf16_weights& w16 = weights16_[l];
        k_.to_bf16(in.act.data(), scratch.input16.data(), layer.width);
        k_.active_dots_bf16(w16.values.data(), w16.stride, layer.width, ids, n_active,
                            scratch.input16.data(), layer.bias.data(), out.act.data());
    } else {
        k_.active_dots(layer.weights.data(), layer.stride, layer.width, ids, n_active,
                       in.act.data(), layer.bias.data(), out.act.data());
    }
    if (l + 1 < model_.layers.size())
        for (float& a : out.act) a = a > 0.0f ? a : 0.0f;
    scratch.times.forward += seconds_since(t0);
}

float cpu_backend::fill_correction_shift(const sample_buffers& sb) const {
    const size_t out_layer = model_.layers.size() - 1;
    const float weight = model_.config.layers[out_layer].fill_correction;
    const size_t n = sb.layers[out_layer].ids.size();
    if (weight == 0.0f || sb.set_drawn_from >= n) return 0.0f;
    // r random neurons drawn from the M rows outside the labels and the top-k.
    const double drawn_from = double(model_.layers[out_layer].rows) - double(sb.set_drawn_from);
    return float(double(weight) * std::log(drawn_from / double(n - sb.set_drawn_from)));
}

void cpu_backend::output_loss(const label_row& y, uint32_t s, thread_scratch& scratch) {
    // Softmax over the output active set, against the label distribution 1/|y| per label, or
    // the logistic loss of each member of the set (loss.hpp).
    const auto t0 = clock_type::now();
    sample_buffers& sb = samples_[s];
    layer_buffers& out = sb.layers.back();
    sb.trained = y.count > 0;
    sb.loss = 0;
    sb.dropped_mass = 0;
    out.delta.assign(out.act.size(), 0.0f);
    if (sb.trained && train_.loss == hslide::output_loss::logistic) {
        // A sparse set puts the labels first (forced labels); a dense layer has them by id.
        HSLIDE_ASSERT(out.ids.empty() || (out.ids.size() >= y.count && out.ids[0] == y.ids[0]));
        sb.loss =
            logistic_loss_gradient(out.act.data(), uint32_t(out.act.size()),
                                   out.ids.empty() ? y.ids : nullptr, y.count, out.delta.data());
    } else if (sb.trained) {
        const size_t out_layer = model_.layers.size() - 1;
        const bool top_k = model_.config.selection(out_layer) == neuron_selection::top_k;
        const float correction = top_k ? fill_correction_shift(sb) : 0.0f;
        double log_sum;
        if (correction != 0.0f) {
            // The gradient's softmax sees the fill's logits raised by the log-Q correction; the
            // loss keeps the true logits.
            std::vector<float>& z = scratch.corrected_logits;
            z.assign(out.act.begin(), out.act.end());
            for (size_t i = sb.set_drawn_from; i < z.size(); ++i) z[i] += correction;
            log_sum = k_.softmax(z.data(), out.delta.data(), uint32_t(out.act.size()));
        } else {
            log_sum = k_.softmax(out.act.data(), out.delta.data(), uint32_t(out.act.size()));
        }
        if (output_selection().computes_log_partition()) {
            // The gradient is the softmax over the set (its hardest negatives), as for LSH:
            // with the full softmax's probabilities instead, a set holding little of the mass
            // (any set of a fresh 670k-label layer) gives the hidden layers almost no push
            // away from the negatives, and training stalls at the label prior (bench/topk.md).
            // The loss reported is the full cross-entropy, through the exact log-partition, and
            // the mass the set leaves out is measured against it.
            double kept = 0;
            for (size_t i = 0; i < out.act.size(); ++i)
                kept += std::exp(double(out.act[i]) - sb.log_partition);
            // Scored by another kernel, the set's logits may sum a rounding above 1.
            sb.dropped_mass = std::max(0.0, 1.0 - kept);
            log_sum = sb.log_partition;
        }
        const float target = 1.0f / float(y.count);
        if (out.ids.empty()) {
            for (uint32_t i = 0; i < y.count; ++i) {
                sb.loss -= target * (out.act[y.ids[i]] - log_sum);
                out.delta[y.ids[i]] -= target;
            }
        } else {
            // Forced labels come first in a sparse output active set.
            HSLIDE_ASSERT(out.ids.size() >= y.count);
            for (uint32_t i = 0; i < y.count; ++i) {
                HSLIDE_ASSERT(out.ids[i] == y.ids[i]);
                sb.loss -= target * (out.act[i] - log_sum);
                out.delta[i] -= target;
            }
        }
    }
    scratch.times.forward += seconds_since(t0);
}
void cpu_backend::transpose_product(size_t l, uint32_t s, float* out_gradient) const {
    const layer_state& layer = model_.layers[l];
    const layer_buffers& out = samples_[s].layers[l];
    std::fill(out_gradient, out_gradient + layer.width, 0.0f);
    const uint32_t n_active = out.ids.empty() ? layer.rows : uint32_t(out.ids.size());
    const uint32_t* ids = out.ids.empty() ? nullptr : out.ids.data();
    if (use_bf16()) {
        const bf16_weights& w16 = weights16_[l];
        k_.weighted_row_sum_bf16(w16.values.data(), w16.stride, layer.width, ids, out.delta.data(),
                                 n_active, out_gradient);
    } else {
        k_.weighted_row_sum(layer.weights.data(), layer.stride, layer.width, ids, out.delta.data(),
                            n_active, out_gradient);
    }
}

void cpu_backend::mask_delta(size_t l, uint32_t s, const float* gradient) {
    layer_buffers& in = samples_[s].layers[l];
    const size_t n = in.act.size();
    in.delta.resize(n);
    const float* act = in.act.data();
    float* delta = in.delta.data();
    // The gradient is read whatever the sign, so the select needs no branch (the dense loop
    // vectorises): a branch on ReLU's coin-flip sign was mispredicted every other element,
    // 13% of a step of Yeast's dense layers.
    if (in.ids.empty()) {
        for (size_t i = 0; i < n; ++i) {
            const float g = gradient[i];
            delta[i] = act[i] > 0.0f ? g : 0.0f;
        }
    } else {
        const uint32_t* ids = in.ids.data();
        for (size_t i = 0; i < n; ++i) {
            const float g = gradient[ids[i]];
            delta[i] = act[i] > 0.0f ? g : 0.0f;
        }
    }
}

void cpu_backend::backward_sample(uint32_t s, thread_scratch& scratch, size_t top) {
    const auto t0 = clock_type::now();
    for (size_t l = top; l >= 1; --l) {
        // dL/d a_{l-1} = W_l^T delta_l over the active neurons, then the ReLU mask.
        scratch.dense.resize(model_.layers[l].width);
        transpose_product(l, s, scratch.dense.data());
        mask_delta(l - 1, s, scratch.dense.data());
    }
    scratch.times.backward += seconds_since(t0);
}

void cpu_backend::run_forward_backward(const batch_view& batch, step_report& report) {
    HSLIDE_ASSERT(!catches_up() || catch_up_.current() == model_.adam_step);
    if (catches_up(0)) bring_inputs_up_to_date(batch);
    ensure_buffers(batch.size);
    for (auto& s : scratch_) s.times = {};
    const dataset& data = *batch.data;
    const size_t n_layers = model_.layers.size();
    const uint64_t sample_seed =
        step_seed(train_.seed, seed_stream::train_sample, model_.adam_step);
    // Layer 0 four samples at a time (those with the same features share the row reads), then
    // layer by layer over the batch: each layer's active sets are chosen for the whole batch
    // (select_active_sets, the one seam for every selection), then its products computed.
    // Every sample draws its random fills, layer after layer, from its own generator.
    const int64_t quads = (int64_t(batch.size) + 3) / 4;
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
        for (int64_t q = 0; q < quads; ++q) {
            const uint32_t first = uint32_t(q) * 4, count = std::min(4u, batch.size - first);
            for (uint32_t s = first; s < first + count; ++s)
                samples_[s].gen.reseed(derive_seed(sample_seed, uint64_t(s)));
            forward_input_layers(data, batch.rows + first, first, count, scratch);
        }
    }
    for (size_t l = 1; l < n_layers; ++l) {
        select_active_sets(batch, l, /*training=*/true, report);
        const bool output = l + 1 == n_layers;
        // A sharded output layer: this rank's members of each set; the loss and backward need
        // every rank's sums (sharded_output_backward, after the products).
        const bool sharded = output && shard_.sharded();
        const bool sparse = model_.config.has_active_sets(l);
        if (sharded) keep_shard_members(batch);
#pragma omp parallel num_threads(threads_)
        {
            thread_scratch& scratch = scratch_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 2)
            for (int64_t s = 0; s < int64_t(batch.size); ++s) {
                if (sharded && sparse && samples_[s].layers[l].ids.empty()) {
                    samples_[s].layers[l].act.clear();  // no member here (not every neuron)
                    continue;
                }
                layer_products(l, uint32_t(s), scratch);
                if (!output || sharded) continue;
                output_loss(data.labels(batch.rows[s]), uint32_t(s), scratch);
                if (samples_[s].trained) backward_sample(uint32_t(s), scratch, l);
            }
        }
        if (sharded) sharded_output_backward(batch, report);
    }
    if (catches_up()) mark_caught_up_rows();
    report.samples = batch.size;
    report.active_per_layer.assign(n_layers, 0);
    // Only the exact top-k search computes the full softmax's partition (IVF's loss is the
    // set's, as LSH's): dropped mass is reported where it is measured.
    const bool full_partition =
        train_.loss == hslide::output_loss::softmax && output_selection().computes_log_partition();
    for (uint32_t s = 0; s < batch.size; ++s) {
        report.loss_sum += samples_[s].loss;
        if (full_partition && samples_[s].trained) {
            report.dropped_mass_sum += samples_[s].dropped_mass;
            report.full_softmax_samples += 1;
        }
        for (size_t l = 0; l < n_layers; ++l) {
            const auto& lb = samples_[s].layers[l];
            const bool sharded_set =
                l + 1 == n_layers && shard_.sharded() && model_.config.has_active_sets(l);
            report.active_per_layer[l] += sharded_set      ? samples_[s].set_size
                                          : lb.ids.empty() ? model_.neurons(l)
                                                           : lb.ids.size();
        }
    }
    // Per-thread CPU seconds, averaged: the share of the parallel phase each stage took.
    for (const auto& s : scratch_) {
        report.times.hashing += s.times.hashing / threads_;
        report.times.active_sets += s.times.active_sets / threads_;
        report.times.forward += s.times.forward / threads_;
        report.times.backward += s.times.backward / threads_;
    }
}
void cpu_backend::group_rows(const batch_view& batch, size_t l) {
    row_groups& g = groups_[l];
    const uint32_t rows = model_.layers[l].rows;
    if (g.count.size() != rows) g.count.assign(rows, 0);
    // Entries carry their coefficient (feature value or delta), read here in sample order:
    // the gradient loop, which visits them by row, then reads no sample's arrays at random.
    size_t entries = 0;
    for (uint32_t s = 0; s < batch.size; ++s)
        if (samples_[s].trained)
            entries += l == 0 ? batch.data->features(batch.rows[s]).count
                              : samples_[s].layers[l].ids.size();
    // Each thread owns a range of rows and does the random-access work (counts, slots,
    // placement) for its rows only, while every thread reads all entries in order: the
    // grouping is serial work otherwise, about a sixth of a 2-thread step on the
    // Amazon-670K shape. The result is the serial one: rows ascending (so the update sweeps
    // memory nearly sequentially, which the prefetchers stream at close to full bandwidth),
    // each row's entries in sample order.
    const int threads = entries >= 16384 ? threads_ : 1;
    std::vector<uint32_t> touched_before(size_t(threads) + 1, 0), entries_before(touched_before);
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num();
        const uint32_t lo = uint32_t(uint64_t(rows) * uint64_t(t) / uint64_t(threads));
        const uint32_t hi = uint32_t(uint64_t(rows) * uint64_t(t + 1) / uint64_t(threads));
        auto for_my_entries = [&](auto&& on_entry) {
            for (uint32_t s = 0; s < batch.size; ++s) {
                if (!samples_[s].trained) continue;
                if (l == 0) {
                    const feature_row x = batch.data->features(batch.rows[s]);
                    for (uint32_t k = 0; k < x.count; ++k)
                        if (x.ids[k] - lo < hi - lo) on_entry(x.ids[k], s, x.values[k]);
                } else {
                    const auto& lb = samples_[s].layers[l];
                    for (uint32_t k = 0; k < lb.ids.size(); ++k)
                        if (lb.ids[k] - lo < hi - lo) on_entry(lb.ids[k], s, lb.delta[k]);
                }
            }
        };
        for_my_entries([&](uint32_t row, uint32_t, float) { ++g.count[row]; });
        uint32_t my_touched = 0, my_entries = 0;
        for (uint32_t r = lo; r < hi; ++r)
            if (g.count[r]) {
                ++my_touched;
                my_entries += g.count[r];
            }
        touched_before[t + 1] = my_touched;
        entries_before[t + 1] = my_entries;
#pragma omp barrier
#pragma omp single
        {
            for (int i = 0; i < threads; ++i) {
                touched_before[i + 1] += touched_before[i];
                entries_before[i + 1] += entries_before[i];
            }
            g.touched.resize(touched_before[threads]);
            g.offsets.resize(touched_before[threads] + 1);
            g.offsets.back() = entries_before[threads];
            g.entry_sample.resize(entries_before[threads]);
            g.entry_coef.resize(entries_before[threads]);
        }
        // Slots and offsets of my rows; their counts restart at 0 as placement cursors.
        uint32_t k = touched_before[t], e = entries_before[t];
        for (uint32_t r = lo; r < hi; ++r)
            if (g.count[r]) {
                g.touched[k] = r;
                g.offsets[k] = e;
                g.slot[r] = int32_t(k);
                e += g.count[r];
                g.count[r] = 0;
                ++k;
            }
        for_my_entries([&](uint32_t row, uint32_t s, float coef) {
            const uint32_t pos = g.offsets[uint32_t(g.slot[row])] + g.count[row]++;
            g.entry_sample[pos] = s;
            g.entry_coef[pos] = coef;
        });
        for (uint32_t i = touched_before[t]; i < touched_before[t + 1]; ++i)
            g.count[g.touched[i]] = 0;
    }
}

template <class Visit, class Prefetch>
void cpu_backend::for_each_row_gradient(const batch_view& batch, size_t l, Visit&& visit,
                                        Prefetch&& prefetch) {
    const layer_state& layer = model_.layers[l];
    const float inv_batch = 1.0f / float(batch.size);
    const bool all_rows = !model_.config.has_active_sets(l) && l > 0;
    const row_groups& g = groups_[l];
    const int64_t n_rows = all_rows ? int64_t(layer.rows) : int64_t(g.touched.size());
    // Long runs of consecutive rows per thread keep the prefetchers streaming (128 rather
    // than 16 made the 2-thread Amazon-670K update ~10% faster); at least 16 chunks a
    // thread keep small layers balanced.
    const int64_t chunk = std::clamp<int64_t>(n_rows / (16 * int64_t(threads_)), 16, 128);
    // Whether every sample's vector for these rows is dense (layer 0's are its deltas).
    bool dense_vectors = true;
    if (l > 0)
        for (uint32_t s = 0; s < batch.size; ++s)
            dense_vectors =
                dense_vectors && (!samples_[s].trained || samples_[s].layers[l - 1].ids.empty());
    // Whether rows t..t+3 sum the same samples' vectors (a dense layer's rows; a dense input's
    // feature rows): weighted_vector_sum4 then reads each vector once for the four.
    auto same_samples = [&](int64_t t) {
        if (!dense_vectors) return false;
        if (all_rows) return true;
        const uint32_t first = g.offsets[t], n = g.offsets[t + 1] - first;
        for (int64_t j = t + 1; j < t + 4; ++j)
            if (g.offsets[j + 1] - g.offsets[j] != n ||
                (n > 0 && std::memcmp(&g.entry_sample[g.offsets[j]], &g.entry_sample[first],
                                      n * sizeof(uint32_t)) != 0))
                return false;
        return true;
    };
    const size_t grad_stride = padded_stride(layer.width);
    // A row's gradient is a weighted sum of per-sample vectors (layer 0's deltas, or the
    // layer's input): weighted_vector_sum keeps the row in registers while the vectors stream
    // past, where an axpy per entry loaded and stored the whole row each time (which made small
    // dense layers store-bound). Same roundings, same order. Sparse inputs (an active set of
    // the layer below) scatter into the row after the dense ones.
#pragma omp parallel num_threads(threads_)
    {
        thread_scratch& scratch = scratch_[omp_get_thread_num()];
        float* grad = scratch.grad.data();
        scratch.sparse_entries.clear();
        auto reserve_entries = [&](size_t entries, size_t coefs) {
            if (scratch.entry_vectors.size() < entries) scratch.entry_vectors.resize(entries);
            if (scratch.entry_coefs.size() < coefs) scratch.entry_coefs.resize(coefs);
        };
        const auto row_of = [&](int64_t t) { return all_rows ? uint32_t(t) : g.touched[t]; };
        const auto vector_of = [&](uint32_t s) {
            return l == 0 ? samples_[s].layers[0].delta.data()
                          : samples_[s].layers[l - 1].act.data();
        };
        auto one_row = [&](int64_t t) {
            const uint32_t row = row_of(t);
            // The update's rows are scattered (a sixth of the output layer a step): their
            // weights and moments are requested while this row's gradient is summed.
            if (t + 2 < n_rows) prefetch(row_of(t + 2));
            const size_t entries = all_rows ? batch.size : g.offsets[t + 1] - g.offsets[t];
            reserve_entries(entries, entries);
            float bias_grad = 0.0f;
            uint32_t n_dense = 0;
            // coef: layer 0, the feature's value x_f (row f gets x_f times the sample's
            // layer-0 delta); later layers, the neuron's delta d (its row gets d times the
            // layer's input, its bias d).
            auto add_entry = [&](uint32_t s, float coef) {
                const float c = coef * inv_batch;
                bias_grad += c;
                if (l == 0 || samples_[s].layers[l - 1].ids.empty()) {
                    scratch.entry_vectors[n_dense] = vector_of(s);
                    scratch.entry_coefs[n_dense++] = c;
                } else {
                    scratch.sparse_entries.push_back({s, c});
                }
            };
            if (all_rows) {
                for (uint32_t s = 0; s < batch.size; ++s)
                    if (samples_[s].trained) add_entry(s, samples_[s].layers[l].delta[row]);
            } else {
                for (uint32_t e = g.offsets[t]; e < g.offsets[t + 1]; ++e)
                    add_entry(g.entry_sample[e], g.entry_coef[e]);
            }
            // Written over the previous row's gradient (zeros where n_dense is 0): a memset of
            // the row first was 1.5% of a Debian-recs run.
            k_.weighted_vector_sum(scratch.entry_vectors.data(), scratch.entry_coefs.data(),
                                   n_dense, layer.width, grad);
            for (const auto& [s, c] : scratch.sparse_entries) {
                const layer_buffers& in = samples_[s].layers[l - 1];
                k_.scatter_axpy(c, in.ids.data(), in.act.data(), grad, uint32_t(in.ids.size()));
            }
            scratch.sparse_entries.clear();
            visit(row, grad, bias_grad);
        };
        // Rows t..t+3 with the same samples: each row's coefficients and bias gradient as
        // one_row forms them, its gradient the same bits.
        auto four_rows = [&](int64_t t) {
            for (int64_t j = t + 4; j < std::min(n_rows, t + 6); ++j) prefetch(row_of(j));
            const size_t entries = all_rows ? batch.size : g.offsets[t + 1] - g.offsets[t];
            reserve_entries(entries, 4 * entries);
            const float* coef[4];
            float* out[4];
            float bias_grad[4] = {};
            for (int j = 0; j < 4; ++j) {
                coef[j] = scratch.entry_coefs.data() + j * entries;
                out[j] = grad + j * grad_stride;
            }
            uint32_t n = 0;
            auto add_entry = [&](uint32_t s, const float(&coefs)[4]) {
                scratch.entry_vectors[n] = vector_of(s);
                for (int j = 0; j < 4; ++j) {
                    const float c = coefs[j] * inv_batch;
                    bias_grad[j] += c;
                    scratch.entry_coefs[j * entries + n] = c;
                }
                ++n;
            };
            if (all_rows) {
                for (uint32_t s = 0; s < batch.size; ++s) {
                    if (!samples_[s].trained) continue;
                    const float* delta = samples_[s].layers[l].delta.data();
                    add_entry(s, {delta[t], delta[t + 1], delta[t + 2], delta[t + 3]});
                }
            } else {
                const uint32_t first = g.offsets[t];
                for (uint32_t e = first; e < g.offsets[t + 1]; ++e) {
                    const uint32_t i = e - first;
                    add_entry(
                        g.entry_sample[e],
                        {g.entry_coef[e], g.entry_coef[g.offsets[t + 1] + i],
                         g.entry_coef[g.offsets[t + 2] + i], g.entry_coef[g.offsets[t + 3] + i]});
                }
            }
            k_.weighted_vector_sum4(scratch.entry_vectors.data(), coef, n, layer.width, out);
            for (int j = 0; j < 4; ++j) visit(row_of(t + j), out[j], bias_grad[j]);
        };
        // Blocks of four rows, chunks of at least four blocks.
        const int64_t blocks = (n_rows + 3) / 4;
#pragma omp for schedule(dynamic, chunk / 4)
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t t = 4 * b;
            if (t + 4 <= n_rows && same_samples(t)) {
                four_rows(t);
            } else {
                for (int64_t u = t; u < std::min(n_rows, t + 4); ++u) one_row(u);
            }
        }
    }
}

void cpu_backend::prefetch_row_state(size_t l, uint32_t row) const {
    const layer_state& layer = model_.layers[l];
    const size_t off = size_t(row) * layer.stride, width = layer.width;
    prefetch_bytes<true>(layer.weights.data() + off, width * sizeof(float));
    if (bf16_moments(l)) {
        prefetch_bytes<true>(moments16_[l].m.data() + off, width * sizeof(bf16));
        prefetch_bytes<true>(moments16_[l].v.data() + off, width * sizeof(bf16));
    } else {
        prefetch_bytes<true>(layer.adam_m.data() + off, width * sizeof(float));
        prefetch_bytes<true>(layer.adam_v.data() + off, width * sizeof(float));
    }
}

step_report cpu_backend::train_batch(const batch_view& batch, float learning_rate) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    const auto t_start = clock_type::now();
    step_report report;
    drop_widened_moments();  // a host_state() reader's copies: the bf16 moments move on
    // The selections' own rhythm between refreshes (the IVF index's partial refreshes), before
    // the step's selection so that rows imported since the last step are included.
    for (size_t l = 1; l < model_.layers.size(); ++l)
        report.times.rebuild += selections_[l]->before_step(model_.adam_step);
    // A sharded step's collectives (the selection's merge, the softmax's sums, the hidden
    // gradient): counted by the group; their stages leave their seconds out.
    const shard_comm::traffic_count before =
        shard_.sharded() ? shard_.comm->traffic() : shard_comm::traffic_count{};
    run_forward_backward(batch, report);
    if (shard_.sharded()) {
        const shard_comm::traffic_count& after = shard_.comm->traffic();
        report.collectives = after.collectives - before.collectives;
        report.transfer_bytes = after.bytes - before.bytes;
        report.times.transfer += after.seconds - before.seconds;
    }

    auto t0 = clock_type::now();
    model_.adam_step += 1;
    const adam_corrections corrections = adam_bias_corrections(train_, model_.adam_step);
    const adam_step base_step{learning_rate,       train_.adam_beta1, train_.adam_beta2,
                              train_.adam_epsilon, corrections.c1,    corrections.c2};
    const auto layer_step = [&](size_t l) {
        adam_step step = base_step;
        step.lr *= model_.config.layers[l].lr_scale;
        return step;
    };
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        const adam_step step = layer_step(l);
        const bool dense_adam = adam_moves_untouched_rows(train_.adam, l);
        layer_state& layer = model_.layers[l];
        std::atomic<uint64_t>* row_step = row_step_.empty() ? nullptr : row_step_[l].get();
        bf16_moments_of_layer* moments16 = bf16_moments(l) ? &moments16_[l] : nullptr;
        // The selection's copy of the rows (bf16 or int8), written as each row is updated.
        const neuron_selector::search_copy copy = selections_[l]
                                                      ? selections_[l]->writable_search_copy()
                                                      : neuron_selector::search_copy{};
        // The stochastic roundings' draws: a function of the step and the row only.
        const uint64_t moment_seed =
            derive_seed(step_seed(train_.seed, seed_stream::bf16_moments, model_.adam_step), l);
        // Adam on one row's weights and (past layer 0, whose bias is a vector) its bias.
        auto adam_row = [&](uint32_t row, const float* grad, float bias_grad) {
            if (row_step) {
                // The forward pass brought it up to date at the previous step.
                HSLIDE_ASSERT(row_step[row].load(std::memory_order_relaxed) + 1 ==
                              model_.adam_step);
                row_step[row].store(model_.adam_step, std::memory_order_relaxed);
            }
            const size_t off = size_t(row) * layer.stride;
            if (moments16)
                k_.adam_bf16_moments(layer.weights.data() + off, moments16->m.data() + off,
                                     moments16->v.data() + off, grad, layer.width, step,
                                     uint32_t(derive_seed(moment_seed, global_row(l, row))));
            else
                k_.adam(layer.weights.data() + off, layer.adam_m.data() + off,
                        layer.adam_v.data() + off, grad, layer.width, step);
            if (use_bf16()) k_.to_bf16(layer.row(row), weights16_[l].row(row), layer.width);
            if (copy) copy.write(row, layer.row(row), layer.width, k_);
            if (l > 0)
                k_.adam(&layer.bias[row], &layer.bias_m[row], &layer.bias_v[row], &bias_grad, 1,
                        step);
        };
        auto prefetch_row = [&](uint32_t row) { prefetch_row_state(l, row); };
        const bool all_rows = !model_.config.has_active_sets(l) && l > 0;
        if (!all_rows) group_rows(batch, l);
        for_each_row_gradient(batch, l, adam_row, prefetch_row);
        mark_updated_rows(l, all_rows || dense_adam, bool(copy));
        row_groups& g = groups_[l];
        if (dense_adam && !all_rows) {
            // SLIDE's behaviour: rows the batch did not touch still move with their momentum.
            const std::vector<float> zero(layer.stride, 0.0f);
#pragma omp parallel for schedule(static) num_threads(threads_)
            for (int64_t r = 0; r < int64_t(layer.rows); ++r)
                if (g.slot[r] < 0) adam_row(uint32_t(r), zero.data(), 0.0f);
        }
        if (l + 1 == model_.layers.size()) {
            const size_t touched = all_rows || dense_adam ? layer.rows : g.touched.size();
            report.output_touched_share_sum = double(touched) / double(layer.rows);
            report.steps_counted = 1;
        }
        for (uint32_t row : g.touched) g.slot[row] = -1;
        g.touched.clear();
    }
    {
        layer_state& layer = model_.layers[0];
        layer0_bias_grad_.assign(layer.width, 0.0f);
        add_layer0_bias_gradient(batch, layer0_bias_grad_.data());
        k_.adam(layer.bias.data(), layer.bias_m.data(), layer.bias_v.data(),
                layer0_bias_grad_.data(), layer.width, layer_step(0));
    }
    if (catches_up()) {
        catch_up_.record_step(learning_rate);
        rows_behind_ = true;
    }
    report.times.update = seconds_since(t0);
    report.seconds = seconds_since(t_start);
    return report;
}

void cpu_backend::add_layer0_bias_gradient(const batch_view& batch, float* out) const {
    // Layer 0's bias is one dense vector: its gradient is the mean of the layer-0 deltas.
    for (uint32_t s = 0; s < batch.size; ++s)
        if (samples_[s].trained)
            k_.axpy(1.0f / float(batch.size), samples_[s].layers[0].delta.data(), out,
                    model_.layers[0].width);
}

double cpu_backend::compute_gradient(const batch_view& batch, model_state& gradient) {
    complete_deferred_updates();
    step_report report;
    run_forward_backward(batch, report);
    gradient = model_state::layout(model_.config);
    for (size_t l = 0; l < model_.layers.size(); ++l) {
        const layer_state& src = model_.layers[l];
        layer_state& dst = gradient.layers[l];
        dst.weights.resize(size_t(src.rows) * src.stride);
        dst.bias.assign(src.bias.size(), 0.0f);
        const bool all_rows = !model_.config.has_active_sets(l) && l > 0;
        if (!all_rows) group_rows(batch, l);
        for_each_row_gradient(
            batch, l,
            [&](uint32_t row, const float* grad, float bias_grad) {
                std::memcpy(dst.row(row), grad, src.width * sizeof(float));
                if (l > 0) dst.bias[row] = bias_grad;
            },
            [](uint32_t) {});
        for (uint32_t row : groups_[l].touched) groups_[l].slot[row] = -1;
        groups_[l].touched.clear();
    }
    add_layer0_bias_gradient(batch, gradient.layers[0].bias.data());
    return report.loss_sum / batch.size;
}

backend_info cpu_backend::info() const {
    backend_info bi;
    bi.kind = to_string(backend_kind::cpu);
    bi.device = read_system_info().cpu_model + " (" + std::to_string(threads_) + " threads, " +
                k_.name + ")";
    bi.precision = to_string(precision_);
    if (shard_.sharded())
        bi.device += fmt::format(", rank {} of {}: output rows [{}, {}) of {}", shard_.comm->rank(),
                                 shard_.comm->size(), shard_.first, shard_.first + shard_.count,
                                 shard_.total);
    bi.memory_bytes = model_.memory_bytes();
    for (const bf16_weights& w16 : weights16_) bi.memory_bytes += w16.values.size() * sizeof(bf16);
    // --adam-moments bf16: the moments model_ does not hold.
    for (const bf16_moments_of_layer& m16 : moments16_)
        bi.memory_bytes += (m16.m.size() + m16.v.size()) * sizeof(bf16);
    const size_t out = model_.layers.size() - 1;
    const layer_state& layer = model_.layers[out];
    bi.output_first = shard_.sharded() ? shard_.first : 0;
    bi.output_rows = layer.rows;
    bi.output_layer_bytes = (layer.weights.size() + layer.adam_m.size() + layer.adam_v.size() +
                             layer.bias.size() + layer.bias_m.size() + layer.bias_v.size()) *
                            sizeof(float);
    if (!weights16_.empty()) bi.output_layer_bytes += weights16_[out].values.size() * sizeof(bf16);
    if (bf16_moments(out))
        bi.output_layer_bytes +=
            (moments16_[out].m.size() + moments16_[out].v.size()) * sizeof(bf16);
    return bi;
}

}  // namespace hslide::cpu
