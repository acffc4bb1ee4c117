// The shared training loop (see trainer.hpp).
#include "hslide/trainer.hpp"
#include "hslide/clock.hpp"
#include "hslide/memory.hpp"

#include "hslide/checkpoint.hpp"
#include "hslide/error.hpp"
#include "hslide/output_file.hpp"
#include "hslide/progress.hpp"
#include "hslide/rng.hpp"
#include "hslide/row_transfer.hpp"
#include "hslide/system_info.hpp"
#include "hslide/weight_average.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>

namespace hslide {

namespace {

/// p@k, ndcg@k and (when computed) psp@k for k = 1..k_max, as keys of `j`.
void add_metrics(nlohmann::json& j, const metrics_result& m) {
    for (int k = 1; k <= int(m.precision.size()); ++k) {
        j[fmt::format("p@{}", k)] = m.p_at(k);
        j[fmt::format("ndcg@{}", k)] = m.ndcg_at(k);
        if (!m.psp.empty()) j[fmt::format("psp@{}", k)] = m.psp_at(k);
    }
}
}  // namespace

metrics_result evaluate(backend& engine, const dataset& test, const evaluation_options& options,
                        const std::vector<double>& inverse_propensities) {
    const size_t n = options.max_points ? std::min(options.max_points, test.size()) : test.size();
    const uint32_t k = uint32_t(options.metrics.max_k);
    metrics_accumulator acc(options.metrics.max_k, inverse_propensities);
    std::vector<uint32_t> rows, labels;
    std::vector<float> scores;
    progress bar("evaluate", n, "points", options.show_progress);
    for (size_t begin = 0; begin < n; begin += options.batch_size) {
        const uint32_t size = uint32_t(std::min<size_t>(options.batch_size, n - begin));
        rows.resize(size);
        std::iota(rows.begin(), rows.end(), uint32_t(begin));
        labels.resize(size_t(size) * k);
        scores.resize(size_t(size) * k);
        engine.predict({&test, rows.data(), size}, k, options.scoring, labels.data(),
                       scores.data());
        for (uint32_t s = 0; s < size; ++s) {
            const label_row y = test.labels(rows[s]);
            const uint32_t* top = labels.data() + size_t(s) * k;
            uint32_t n_pred = 0;
            while (n_pred < k && top[n_pred] != UINT32_MAX) ++n_pred;
            acc.add(top, n_pred, y.ids, y.count);
        }
        bar.add(size);
    }
    bar.finish();
    return acc.result();
}

void check_training_memory(const model_config& config, const train_config& train,
                           size_t train_points, bool keeps_best) {
    const model_state shape = model_state::layout(config);
    const uint64_t copies = uint64_t(train.ema_epochs != 0) + uint64_t(keeps_best);
    uint64_t hidden = 0;
    for (size_t l = 0; l + 1 < config.layers.size(); ++l) hidden += config.layers[l].size;
    // A step's activations and their gradients, into and out of each hidden layer.
    const uint64_t step_bytes =
        std::min<uint64_t>(train.batch_size, train_points) * hidden * sizeof(float) * 4;
    check_host_allocation(
        fmt::format("the run ({}, {} cop{} of its weights and a step's activations)",
                    describe_model_allocation(shape, true), copies, copies == 1 ? "y" : "ies"),
        model_allocation_bytes(shape, true) + copies * model_allocation_bytes(shape, false) +
            step_bytes);
}

trainer::trainer(backend& engine, const dataset& train, const dataset* test,
                 trainer_options options)
    : backend_(engine), train_(train), test_(test), options_(std::move(options)) {
    validate(options_.train);
    HSLIDE_CHECK(train_.size() > 0, "the training set {} has no points", train_.source);
    rng shuffle_gen(derive_seed(options_.train.seed, 0x5407f1e));
    std::copy(shuffle_gen.state(), shuffle_gen.state() + 4, state_.shuffle_rng);
    state_.rebuild_period = double(options_.train.rebuild_every);
    state_.next_rebuild = options_.train.rebuild_every;
    state_.next_rehash = options_.train.rehash_every;
    validation_options& v = options_.validation;
    const bool validating = v.valid && v.valid->size() > 0;
    // The labels' counts and (for PSP@k) their propensities, together, before either: a header
    // that declares 4 billion labels for a few points is refused at once, where the counts
    // alone would fit and take half a minute to fill before the propensities fail.
    const bool propensities = (test_ && test_->size() > 0) || validating;
    check_host_allocation(
        fmt::format("the labels' counts{} ({} declares {} labels)",
                    propensities ? " and propensities" : "", train_.source, train_.n_labels),
        train_.n_labels * (sizeof(uint32_t) + (propensities ? sizeof(double) : 0)));
    label_counts_ = label_counts(train_);
    HSLIDE_CHECK(validating || !options_.train.epochs_auto,
                 "--epochs auto needs a validation set (the command line and hslide.Model hold "
                 "one out of the training data when none is given)");
    HSLIDE_CHECK(validating || (!v.keep_best && v.patience == 0),
                 "keeping the best epoch and early stopping (patience) need a validation set");
    // The weight average lives in host memory, beside the model it averages; ranks average
    // only where every rank can (one of another backend may not).
    bool host_model = current_parameters() != nullptr;
    if (options_.ranks) {
        float without = host_model ? 0.0f : 1.0f;
        options_.ranks->all_reduce_max(&without, 1);
        host_model = without == 0.0f;
    }
    ema_epochs_ = options_.train.ema_epochs;
    HSLIDE_CHECK(ema_epochs_ == -1 || (ema_epochs_ >= 0 && std::isfinite(ema_epochs_)),
                 "--ema must be a time constant in epochs (0 = no average, -1 = auto), not {}",
                 ema_epochs_);
    // Under ranks each keeps the average of what it holds: the replicated layers' averages are
    // blends of the same bits, so they stay identical across ranks (or, where the ranks round
    // differently, rank 0's are copied: copy_first_ranks_replicas). A model held elsewhere (a
    // GPU's) is averaged only when asked: each tick exports it, which auto does not impose.
    if (ema_epochs_ < 0) ema_epochs_ = host_model ? weight_average_auto_epochs : 0.0;
    if (ema_epochs_ > 0) average_keep_ = weight_average_keep(ema_epochs_);
    if (options_.train.epochs_auto) {
        // What auto means: the best epoch's model, and a stop once it stops improving (an
        // explicit metric or patience replaces the default).
        if (!v.keep_best) v.metric = auto_epochs_defaults::metric();
        v.keep_best = true;
        if (v.patience == 0) v.patience = auto_epochs_defaults::patience_for(v.valid->size());
        if (v.lr_drops < 0)
            v.lr_drops = average_keep_ > 0 ? auto_epochs_defaults::lr_drops_with_average
                                           : auto_epochs_defaults::lr_drops;
        if (v.epochs_per_drop < 0) v.epochs_per_drop = auto_epochs_defaults::epochs_per_drop;
    }
    if (v.lr_drops < 0) v.lr_drops = 0;
    if (v.epochs_per_drop < 0) v.epochs_per_drop = 0;
    if (v.min_gain < 0)
        v.min_gain = options_.train.epochs_auto && validating &&
                             v.valid->size() >= auto_epochs_defaults::min_gain_points
                         ? auto_epochs_defaults::min_gain
                         : 0.0;
    HSLIDE_CHECK(v.min_gain == 0 || v.patience > 0,
                 "--min-gain says what --patience counts as an improvement: it needs --patience "
                 "(or --epochs auto)");
    HSLIDE_CHECK(v.lr_drops == 0 || (v.keep_best && v.patience > 0),
                 "--lr-drops goes back to the best epoch at a plateau: it needs --keep-best and "
                 "--patience (or --epochs auto)");
    if (propensities)
        inverse_propensities_ =
            inverse_propensities(label_counts_, train_.size(), options_.eval.metrics.propensity_a,
                                 options_.eval.metrics.propensity_b);
    // An exact selection's probe would measure its construction, at 3% of a Debian-recs epoch
    // (bench/peers.md, 2026-12-06): automatic runs it only where the selection is approximate.
    HSLIDE_CHECK(options_.selection_probe_points >= -1,
                 "the selection probe's points must be -1 (auto), 0 (never) or more, not {}",
                 options_.selection_probe_points);
    const uint32_t probe_points =
        options_.selection_probe_points >= 0 ? uint32_t(options_.selection_probe_points)
        : backend_.selection_is_exact()      ? 0
                                             : trainer_options::auto_selection_probe_points;
    if (probe_points > 0) {
        // A fixed sample, so every epoch's measurement is of the same points.
        std::vector<uint32_t> all(train_.size());
        std::iota(all.begin(), all.end(), 0u);
        rng probe_gen(derive_seed(options_.train.seed, 0x9e1ec7));
        shuffle(all.begin(), all.end(), probe_gen);
        all.resize(std::min<size_t>(all.size(), probe_points));
        std::sort(all.begin(), all.end());
        probe_rows_ = std::move(all);
    }
    state_.epochs_auto = options_.train.epochs_auto;
    if (options_.resume) {
        HSLIDE_CHECK(options_.resume->epochs_auto == options_.train.epochs_auto,
                     "a checkpoint of an --epochs {} run cannot be resumed with --epochs {}",
                     options_.resume->epochs_auto ? "auto" : "N",
                     options_.train.epochs_auto ? "auto" : "N");
        state_ = *options_.resume;
        spdlog::info("resuming after epoch {} ({} samples)", state_.epochs_done,
                     state_.samples_seen);
        if (options_.train.epochs_auto && state_.best_epoch > 0) {
            // An auto run's checkpoint holds its best epoch's model: the best so far, from
            // which patience counts again exactly as in the uninterrupted run (it redoes the
            // epochs it trained past the best before it was stopped).
            HSLIDE_CHECK(state_.best_epoch == state_.epochs_done,
                         "an --epochs auto checkpoint holds its best epoch's model, but this one "
                         "says it is epoch {}'s and its best is epoch {}",
                         state_.epochs_done, state_.best_epoch);
            best_epoch_ = state_.best_epoch;
            best_value_ = state_.best_value;
            HSLIDE_CHECK(state_.improved_epoch <= state_.best_epoch,
                         "an --epochs auto checkpoint says its last improving epoch is {}, after "
                         "its best, epoch {}",
                         state_.improved_epoch, state_.best_epoch);
            best_model_.emplace();
            backend_.export_state(*best_model_, best_needs_optimizer());
            best_state_ = state_;
        } else {
            // A fixed run's checkpoint is its last epoch's model: the best is tracked afresh.
            state_.best_epoch = 0;
            state_.best_value = 0;
            state_.improved_epoch = 0;
            state_.improved_value = 0;
        }
        if (average_keep_ > 0 && options_.resume_training_weights) {
            // The backend holds the checkpoint's average (the best epoch's, with its Adam
            // state); training goes on from the weights the optimizer was at.
            backend_.export_state(average_, /*with_optimizer=*/false);
            if (best_model_)
                best_training_weights_.copy_from(*options_.resume_training_weights, false);
            backend_.import_state(*options_.resume_training_weights, /*with_optimizer=*/false);
        }
    }
}

const model_state* trainer::current_parameters() {
    // The model as it is, rows the optimizer deferred (catch-up Adam) included: bringing every
    // row up to date at each tick took 1.7 ms of a Debian-recs tick's 3.9, and the steps a row
    // is behind are a few momentum steps, small beside the average's time constant. Where the
    // backend offers no writable view, host_state() (which brings them up to date).
    if (row_transfer* rows = backend_.rows())
        if (const model_state* model = rows->writable_host_state()) return model;
    return backend_.host_state();
}

void trainer::tick_average() {
    const model_state* current = current_parameters();
    if (!current) {  // a model elsewhere (a GPU's): exported for the tick
        backend_.export_state(exported_, /*with_optimizer=*/false);
        current = &exported_;
    }
    blend_into_average(average_, *current, average_keep_);
}

void trainer::show_average() {
    if (average_keep_ == 0 || showing_average_ || average_.layers.empty()) return;
    // A swap costs no copy and no memory (average_ then holds the training weights): at the
    // Amazon-670K shape an export and an import are 212 MB each, and the copy as much again.
    row_transfer* rows = backend_.rows();
    swapped_ = rows && rows->swap_parameters(average_);
    if (!swapped_) {
        backend_.export_state(training_weights_, /*with_optimizer=*/false);
        backend_.import_state(average_, /*with_optimizer=*/false);
    }
    showing_average_ = true;
}

void trainer::hide_average() {
    if (!showing_average_) return;
    if (swapped_) {
        const bool swapped = backend_.rows()->swap_parameters(average_);
        HSLIDE_ASSERT(swapped);
    } else {
        backend_.import_state(training_weights_, /*with_optimizer=*/false);
    }
    showing_average_ = false;
}

const model_state* trainer::shown_training_weights() const {
    if (!showing_average_) return nullptr;
    return swapped_ ? &average_ : &training_weights_;
}

double trainer::lr_drop_multiplier() const {
    return std::pow(auto_epochs_defaults::lr_drop_factor, double(state_.lr_drops));
}

bool trainer::drop_epochs_spent() const {
    const int32_t per_drop = options_.validation.epochs_per_drop;
    return state_.lr_drops > 0 && per_drop > 0 &&
           state_.epochs_done - state_.lr_dropped_after >= uint32_t(per_drop);
}

bool trainer::best_needs_optimizer() const {
    return options_.optimizer_after_run || options_.validation.lr_drops > 0 ||
           !options_.save_path.empty();
}

void trainer::restore_best_model() {
    hide_average();
    // Without its Adam state the backend keeps the moments it has (best_needs_optimizer: no
    // step is taken from them).
    backend_.import_state(*best_model_, best_needs_optimizer());
    if (average_keep_ == 0) return;
    // best_model_ holds the best epoch's average; the backend trains on from the weights it
    // had then where they were kept (else from the average: the run is ending).
    average_.copy_from(*best_model_, /*with_optimizer=*/false);
    if (!best_training_weights_.layers.empty())
        backend_.import_state(best_training_weights_, /*with_optimizer=*/false);
}

void trainer::drop_rate(uint32_t undone) {
    const double seconds = state_.seconds;
    state_ = best_state_;
    state_.seconds = seconds;
    state_.lr_drops = best_state_.lr_drops + 1;
    state_.lr_dropped_after = best_epoch_;
    best_state_.lr_drops = state_.lr_drops;
    best_state_.lr_dropped_after = state_.lr_dropped_after;
    epochs_undone_ += undone;
}

std::string trainer::gain_wanted() const {
    const validation_options& v = options_.validation;
    if (v.min_gain <= 0) return "";
    return fmt::format(" by more than {:g} x its hold-out noise ({:.4f})", v.min_gain,
                       v.min_gain * holdout_noise(state_.improved_value, v.valid->size()));
}

float trainer::learning_rate_now() const {
    const train_config& tc = options_.train;
    double rate = scaled_learning_rate(tc) * lr_drop_multiplier();
    // The warm-up reaches the full rate with the step that ends its samples.
    if (tc.warmup_samples > 0)
        rate *=
            std::min(1.0, double(state_.samples_seen + tc.batch_size) / double(tc.warmup_samples));
    if (tc.schedule == lr_schedule::constant) return float(rate);
    const double total = double(tc.epochs) * double(train_.size());
    const double left = std::max(0.0, 1.0 - double(state_.samples_seen) / total);
    // Never exactly 0: the last step still moves the rows it touches.
    return float(rate * std::max(left, 1e-3));
}

bool trainer::probe_due_within_epoch(uint64_t steps, uint64_t total) const {
    return state_.epochs_done == 0 && probes_within_epoch_ && !probe_rows_.empty() &&
           options_.train.ivf_min_recall > 0 && steps >= 64 && (steps & (steps - 1)) == 0 &&
           steps < total;
}

selection_quality trainer::probe_selection() {
    return backend_.measure_selection({&train_, probe_rows_.data(), uint32_t(probe_rows_.size())},
                                      options_.selection_probe_top);
}

void trainer::index_given_up(const selection_quality& q, const std::string& when) {
    spdlog::warn(
        "{}: the output layer's IVF index held {:.1f}% of the exact top {} (under "
        "--ivf-min-recall {:g}); the layer is searched exactly from the next step on",
        when, 100 * q.top_recall, q.top, options_.train.ivf_min_recall);
    if (options_.selection_probe_points < 0) probe_rows_.clear();
    probes_within_epoch_ = false;
}

epoch_record trainer::run_epoch(bool synchronize_at_end) {
    const train_config& tc = options_.train;
    epoch_record record;
    record.epoch = state_.epochs_done + 1;

    // A fresh shuffle every epoch, from a generator whose state the checkpoint keeps.
    rng shuffle_gen;
    shuffle_gen.set_state(state_.shuffle_rng);
    std::vector<uint32_t> order(train_.size());
    std::iota(order.begin(), order.end(), 0u);
    shuffle(order.begin(), order.end(), shuffle_gen);
    std::copy(shuffle_gen.state(), shuffle_gen.state() + 4, state_.shuffle_rng);

    const auto t_epoch = clock_type::now();
    if (state_.epochs_done > 0) {
        // Tables are rebuilt from the current weights at every epoch start, so a run resumed
        // from an end-of-epoch checkpoint continues exactly as an uninterrupted one.
        const auto t0 = clock_type::now();
        backend_.refresh_selections(false);
        record.times.rebuild += seconds_since(t0);
    }
    progress bar(fmt::format("epoch {}/{}", record.epoch, epochs_to_string(tc)), order.size(),
                 "samples", options_.show_progress);
    // Reports count the samples they cover: an asynchronous backend (hybrid) reports batches
    // as they finish, possibly after the epoch that queued them.
    double loss_sum = 0, dropped_mass_sum = 0;
    uint64_t active_output = 0, reported = 0, full_softmax_samples = 0;
    double touched_share_sum = 0;
    uint64_t steps_counted = 0;
    auto add_report = [&](const step_report& report, size_t at_sample) {
        HSLIDE_CHECK_KIND(
            std::isfinite(report.loss_sum), error_kind::runtime,
            // A backend may report a batch with a later call (GPU, hybrid): "at or before".
            "training diverged in epoch {}, at or before sample {} (loss is {}); lower the "
            "learning rate",
            record.epoch, at_sample, report.loss_sum);
        loss_sum += report.loss_sum;
        dropped_mass_sum += report.dropped_mass_sum;
        touched_share_sum += report.output_touched_share_sum;
        steps_counted += report.steps_counted;
        full_softmax_samples += report.full_softmax_samples;
        if (!report.active_per_layer.empty()) active_output += report.active_per_layer.back();
        reported += report.samples;
        record.times += report.times;
        record.collectives += report.collectives;
        record.transfer_bytes += report.transfer_bytes;
    };
    const uint64_t steps = (order.size() + tc.batch_size - 1) / tc.batch_size;
    for (size_t begin = 0; begin < order.size(); begin += tc.batch_size) {
        const uint32_t size = uint32_t(std::min<size_t>(tc.batch_size, order.size() - begin));
        add_report(backend_.train_batch({&train_, order.data() + begin, size}, learning_rate_now()),
                   begin);
        record.steps += 1;
        state_.samples_seen += size;
        if (state_.samples_seen >= state_.next_rebuild) {
            const bool rehash = tc.rehash_every > 0 && state_.samples_seen >= state_.next_rehash;
            if (rehash) state_.next_rehash = state_.samples_seen + tc.rehash_every;
            const auto t0 = clock_type::now();
            backend_.refresh_selections(rehash);
            record.times.rebuild += seconds_since(t0);
            state_.rebuild_period *= std::exp(tc.rebuild_decay);
            state_.next_rebuild =
                state_.samples_seen + uint64_t(std::llround(state_.rebuild_period));
        }
        if (average_keep_ > 0 && weight_average_tick_after(record.steps - 1, steps)) {
            const auto t0 = clock_type::now();
            tick_average();
            record.times.average += seconds_since(t0);
        }
        // On a large set the first epoch is long: an index that loses the top there gives way
        // within it, not after it (bench/topk.md, 2026-12-08).
        if (probe_due_within_epoch(record.steps, steps)) {
            const selection_quality q = probe_selection();
            if (!q.index_may_give_way) probes_within_epoch_ = false;
            if (q.index_given_up) {
                record.selection = q;  // the epoch's record (the automatic probe ends here)
                index_given_up(q, fmt::format("epoch {}, step {}", record.epoch, record.steps));
            }
        }
        bar.add(size);
        if (reported > 0) bar.set_suffix(fmt::format("loss {:.4f}", loss_sum / double(reported)));
        if (options_.between_steps) options_.between_steps();
    }
    if (options_.replicas_differ) {
        const auto t0 = clock_type::now();
        copy_first_ranks_replicas();
        record.times.transfer += seconds_since(t0);
    }
    if (synchronize_at_end) add_report(backend_.synchronize(), order.size());
    bar.finish();
    record.epoch_seconds = seconds_since(t_epoch);
    state_.seconds += record.epoch_seconds;
    state_.epochs_done += 1;
    record.seconds = state_.seconds;
    record.samples_per_s = double(order.size()) / record.epoch_seconds;
    record.loss = reported ? loss_sum / double(reported) : 0.0;
    record.mean_active_output = reported ? double(active_output) / double(reported) : 0.0;
    if (full_softmax_samples > 0)
        record.dropped_mass = dropped_mass_sum / double(full_softmax_samples);
    if (steps_counted > 0) record.touched_share = touched_share_sum / double(steps_counted);
    record.workers = backend_.take_worker_stats();
    if (options_.ranks) gather_rank_figures(record);
    return record;
}

void trainer::gather_rank_figures(epoch_record& record) {
    shard_comm& comm = *options_.ranks;
    const backend_info bi = backend_.info();
    rank_figures mine;
    mine.rank = uint32_t(comm.rank());
    mine.output_first = bi.output_first;
    mine.output_rows = bi.output_rows;
    mine.output_layer_bytes = bi.output_layer_bytes;
    mine.memory_bytes = bi.memory_bytes;
    mine.peak_rss_bytes = peak_rss_bytes();
    mine.steps = record.steps;
    mine.collectives = record.collectives;
    mine.transfer_bytes = record.transfer_bytes;
    mine.transfer_seconds = record.times.transfer;
    record.ranks.resize(size_t(comm.size()));
    comm.all_gather(&mine, sizeof mine, record.ranks.data());
}

std::string trainer::record_json(const epoch_record& r) const {
    nlohmann::json j;
    j["epoch"] = r.epoch;
    j["seconds"] = r.seconds;
    j["epoch_seconds"] = r.epoch_seconds;
    j["samples_per_s"] = r.samples_per_s;
    j["loss"] = r.loss;
    j["mean_active_output"] = r.mean_active_output;
    if (r.dropped_mass) j["dropped_mass"] = *r.dropped_mass;
    if (r.touched_share) j["touched_share"] = *r.touched_share;
    if (r.selection)
        j["selection"] = {{"points", r.selection->points},
                          {"top", r.selection->top},
                          {"top_recall", r.selection->top_recall},
                          {"label_recall", r.selection->label_recall},
                          {"mean_set_size", r.selection->mean_set_size},
                          {"index_given_up", r.selection->index_given_up},
                          {"seconds", r.selection_seconds}};
    const backend_info bi = backend_.info();
    j["backend"] = bi.kind;                // its name in the registry
    j["threads"] = omp_get_max_threads();  // the process's OpenMP team
    j["peak_rss_bytes"] = peak_rss_bytes();
    if (bi.output_rows > 0) j["output_layer_bytes"] = bi.output_layer_bytes;  // this process's
    // Per step averages over the epoch's training steps (the bytes this rank received).
    auto communication = [](uint64_t steps, uint64_t collectives, uint64_t bytes, double seconds) {
        const double per = steps ? 1.0 / double(steps) : 0.0;
        return nlohmann::json{{"steps", steps},
                              {"collectives", collectives},
                              {"bytes", bytes},
                              {"seconds", seconds},
                              {"bytes_per_step", double(bytes) * per},
                              {"seconds_per_step", seconds * per}};
    };
    if (r.collectives > 0)
        j["communication"] =
            communication(r.steps, r.collectives, r.transfer_bytes, r.times.transfer);
    for (const rank_figures& f : r.ranks)
        j["ranks"].push_back(
            {{"rank", f.rank},
             {"output_rows", {f.output_first, uint64_t(f.output_first) + f.output_rows}},
             {"output_layer_bytes", f.output_layer_bytes},
             {"memory_bytes", f.memory_bytes},
             {"peak_rss_bytes", f.peak_rss_bytes},
             {"communication",
              communication(f.steps, f.collectives, f.transfer_bytes, f.transfer_seconds)}});
    j["stage_seconds"] = {{"hashing", r.times.hashing},   {"active_sets", r.times.active_sets},
                          {"forward", r.times.forward},   {"backward", r.times.backward},
                          {"update", r.times.update},     {"rebuild", r.times.rebuild},
                          {"transfer", r.times.transfer}, {"average", r.times.average}};
    if (ema_epochs_ > 0) j["ema_epochs"] = ema_epochs_;
    for (const worker_stats& w : r.workers)
        j["workers"].push_back({{"name", w.name},
                                {"samples", w.samples},
                                {"batches", w.batches},
                                {"update_share", w.update_share},
                                {"utilisation", w.utilisation()},
                                {"busy_seconds", w.busy_seconds},
                                {"wall_seconds", w.wall_seconds},
                                {"batch_min", w.batch_min},
                                {"batch_mean", w.batch_mean},
                                {"batch_max", w.batch_max},
                                {"batch_last", w.batch_last},
                                {"merges", w.merges},
                                {"merge_seconds", w.merge_seconds},
                                {"merge_wait_seconds", w.merge_wait_seconds},
                                {"merge_import_seconds", w.merge_import_seconds},
                                {"parked_seconds", w.parked_seconds},
                                {"train_cpu_seconds", w.train_cpu_seconds},
                                {"merge_cpu_seconds", w.merge_cpu_seconds},
                                {"staleness_mean", w.staleness_mean},
                                {"staleness_max", w.staleness_max},
                                {"rows_merged", w.rows_merged},
                                {"rows_pulled", w.rows_pulled}});
    if (r.evaluated) {
        add_metrics(j, r.metrics);
        j["eval_seconds"] = r.eval_seconds;
        j["eval_points"] = r.metrics.n;
    }
    if (r.validated) {
        nlohmann::json valid;
        add_metrics(valid, r.valid_metrics);
        valid["points"] = r.valid_metrics.n;
        valid["seconds"] = r.valid_seconds;
        j["valid"] = valid;
        j["valid_metric"] = to_string(options_.validation.metric);
        j["best_epoch"] = r.best_epoch;
    }
    if (options_.train.epochs_auto) j["epochs"] = "auto";
    return j.dump();
}

void trainer::copy_first_ranks_replicas() {
    HSLIDE_ASSERT(options_.ranks);
    shard_comm& comm = *options_.ranks;
    model_state model;
    backend_.export_state(model, /*with_optimizer=*/true);
    auto copy = [&](auto& values) {
        comm.copy_from_first_rank(values.data(), values.size() * sizeof(values[0]));
    };
    for (size_t l = 0; l + 1 < model.layers.size(); ++l) {  // the output layer is sharded
        layer_state& layer = model.layers[l];
        for (auto* values : {&layer.weights, &layer.adam_m, &layer.adam_v}) copy(*values);
        for (auto* values : {&layer.bias, &layer.bias_m, &layer.bias_v}) copy(*values);
        if (!average_.layers.empty()) {
            copy(average_.layers[l].weights);
            copy(average_.layers[l].bias);
        }
    }
    backend_.import_state(model, /*with_optimizer=*/true);
}

void trainer::write_metrics_record(const epoch_record& r) {
    if (options_.metrics_out.empty()) return;
    append_to_file(options_.metrics_out, record_json(r) + '\n');
}

void trainer::save_checkpoint_now() {
    const candidate_cache& candidates = backend_.candidates();
    if (const model_state* held = backend_.host_state()) {
        save_checkpoint(options_.save_path, *held, state_, label_counts_, train_.size(),
                        options_.rows, shown_training_weights(), &candidates);
    } else {
        model_state snapshot;
        backend_.export_state(snapshot, /*with_optimizer=*/true);
        save_checkpoint(options_.save_path, snapshot, state_, label_counts_, train_.size(),
                        options_.rows, shown_training_weights(), &candidates);
    }
    if (options_.after_checkpoint) options_.after_checkpoint();
}

void trainer::test_into(epoch_record& record) {
    const auto t0 = clock_type::now();
    record.metrics = evaluate(backend_, *test_, options_.eval, inverse_propensities_);
    record.eval_seconds = seconds_since(t0);
    record.evaluated = true;
    state_.seconds += record.eval_seconds;
}

void trainer::validate_epoch(epoch_record& record) {
    const validation_options& v = options_.validation;
    const auto t0 = clock_type::now();
    // The hold-out only ranks the epochs against each other: int8 candidates re-scored in fp32
    // or bf16 products change the order of near-ties only, and cost less than fp32's
    // (exact-fast). In calls of up to 4,096 points: a call copies the rows.
    evaluation_options eval = options_.eval;
    if (eval.scoring == scoring_mode::exact) eval.scoring = scoring_mode::exact_fast;
    eval.batch_size = std::max<uint32_t>(eval.batch_size, 4096);
    record.valid_metrics = evaluate(backend_, *v.valid, eval, inverse_propensities_);
    record.valid_seconds = seconds_since(t0);
    record.validated = true;
    state_.seconds += record.valid_seconds;
    record.seconds = state_.seconds;
    const double value = metric_value(record.valid_metrics, v.metric);
    // The first epoch at a dropped rate is the schedule's anneal, which raises the test metric
    // far more often than not (bench/epochs.md): it wins unless the hold-out finds it worse
    // by more than the hold-out's own noise (bench/peers.md: on Bibtex it scored 0.6268 against
    // the best's 0.6270, under a hundredth of that noise, and the best's model was
    // kept at test P@1 0.6211 where the anneal's had 0.6282).
    const bool anneal = state_.lr_drops > 0 && record.epoch == state_.lr_dropped_after + 1;
    const double tolerance = anneal ? holdout_noise(best_value_, v.valid->size()) : 0.0;
    const bool best =
        best_epoch_ == 0 || value > best_value_ || (anneal && value >= best_value_ - tolerance);
    // Patience counts from the last epoch that gained more than min_gain (with 0: the best).
    if (best && (state_.improved_epoch == 0 || anneal ||
                 epoch_improves(value, state_.improved_value, v.valid->size(), v.min_gain))) {
        state_.improved_epoch = record.epoch;
        state_.improved_value = value;
    }
    if (best) {
        best_epoch_ = record.epoch;
        best_value_ = value;
        state_.best_epoch = best_epoch_;
        state_.best_value = best_value_;
        if (v.keep_best) {
            if (!best_model_) best_model_.emplace();
            backend_.export_state(*best_model_, best_needs_optimizer());
            // With an average, best_model_ holds it. The weights training was at are kept only
            // for a drop (which trains on from them) and a checkpoint (which a resumed run
            // does): at the Amazon-670K shape they are 212 MB.
            if (showing_average_ && (v.lr_drops > 0 || !options_.save_path.empty()))
                best_training_weights_.copy_from(*shown_training_weights(), false);
            else
                best_training_weights_ = model_state{};
            best_state_ = state_;
        }
    }
    record.best_epoch = best_epoch_;
}

std::vector<epoch_record> trainer::run(const std::function<void(const epoch_record&)>& on_epoch) {
    std::vector<epoch_record> records;
    const uint32_t total = options_.train.epochs;
    const bool automatic = options_.train.epochs_auto;
    const validation_options& v = options_.validation;
    const bool validating = v.valid && v.valid->size() > 0;
    const bool testing = test_ && test_->size() > 0;
    stop_requested_ = false;
    final_record_.reset();
    hide_average();  // a second run() trains on from the weights, not their average
    // A run resumed from its last drop's last epoch is done, as the uninterrupted run was.
    const auto drops_done = [&] {
        return state_.lr_drops >= uint32_t(v.lr_drops) && drop_epochs_spent();
    };
    while (state_.epochs_done < total && !stop_requested_ && !drops_done()) {
        // Evaluations, checkpoints and the run's end need the whole epoch applied; other
        // epochs flow into the next without a barrier.
        const uint32_t epoch = state_.epochs_done + 1;
        const bool last = epoch == total;
        const bool due = options_.eval_every > 0 && epoch % options_.eval_every == 0;
        // With keep_best the end's evaluation is of the kept model, after the loop.
        const bool evaluate_now = testing && (due || (last && !v.keep_best));
        const bool synchronized = evaluate_now || last || validating || !options_.save_path.empty();
        epoch_record record = run_epoch(synchronized);
        if (synchronized && !probe_rows_.empty()) {
            const auto t0 = clock_type::now();
            const selection_quality q = probe_selection();
            if (q.points > 0) {
                record.selection = q;
                record.selection_seconds = seconds_since(t0);
                state_.seconds += record.selection_seconds;
                record.seconds = state_.seconds;
                if (q.index_given_up) index_given_up(q, fmt::format("epoch {}", epoch));
            } else {
                probe_rows_.clear();  // the backend does not measure: stop asking
            }
        }
        // Scored, kept and saved: the average, where there is one.
        if (synchronized && average_keep_ > 0) {
            const auto t0 = clock_type::now();
            show_average();
            record.times.average += seconds_since(t0);
        }
        if (validating) validate_epoch(record);
        if (evaluate_now) {
            test_into(record);
            record.seconds = state_.seconds;
        }
        const bool plateau = v.patience > 0 && epoch - state_.improved_epoch >= v.patience;
        const bool drop = (plateau || drop_epochs_spent()) && epoch < total && best_model_ &&
                          state_.lr_drops < uint32_t(v.lr_drops);
        const uint32_t undone = drop ? epoch - best_epoch_ : 0;
        const uint32_t flat_epochs = epoch - state_.improved_epoch;
        // A drop at the best epoch (it gained, but too little) undoes nothing: it goes on from
        // the model the backend holds, and the checkpoint saved next carries the drop, so a run
        // resumed from it goes on at the lower rate as this one does.
        if (drop && undone == 0) drop_rate(0);
        // Under auto the checkpoint is always the best model so far: a resumed run then
        // starts from the best, as the uninterrupted one ends with it.
        const bool save_now = !options_.save_path.empty() && (!automatic || best_epoch_ == epoch);
        if (save_now) save_checkpoint_now();
        if (showing_average_) {
            const auto t0 = clock_type::now();
            hide_average();
            record.times.average += seconds_since(t0);
        }
        if (v.keep_best && best_epoch_ == epoch) best_record_ = record;
        write_metrics_record(record);
        if (on_epoch) on_epoch(record);
        records.push_back(std::move(record));
        if (drop) {
            // A plateau (or the last drop's epochs spent): back to the best epoch's model and
            // trainer state (as a run resumed from its checkpoint would be), on at a lower
            // rate. The epochs after the best are undone: the next one is numbered best + 1.
            if (undone > 0) {
                restore_best_model();
                drop_rate(undone);
            }
            const std::string why =
                plateau ? fmt::format("{} has not improved{} for {} epoch{}", to_string(v.metric),
                                      gain_wanted(), flat_epochs, flat_epochs == 1 ? "" : "s")
                        : fmt::format("{} epoch{} at the dropped rate done", v.epochs_per_drop,
                                      v.epochs_per_drop == 1 ? "" : "s");
            spdlog::info(
                "{}: on from epoch {}'s model (best, {:.4f}) at {:g} times the learning "
                "rate (drop {} of {})",
                why, best_epoch_, best_value_, lr_drop_multiplier(), state_.lr_drops, v.lr_drops);
            // The checkpoint stays the best epoch's as it was saved: a run resumed from it
            // redoes the undone epochs, meets the same plateau and drops the rate as this one.
            continue;
        }
        if (plateau && epoch < total) {
            spdlog::info(
                "stopping early: {} has not improved{} for {} epoch{} (best: epoch {}, {:.4f})",
                to_string(v.metric), gain_wanted(), flat_epochs, flat_epochs == 1 ? "" : "s",
                best_epoch_, best_value_);
            break;
        }
        if (drops_done() && epoch < total) {
            spdlog::info(
                "stopping: {} epoch{} at {:g} times the learning rate done (best: epoch "
                "{}, {} {:.4f})",
                v.epochs_per_drop, v.epochs_per_drop == 1 ? "" : "s", lr_drop_multiplier(),
                best_epoch_, to_string(v.metric), best_value_);
            break;
        }
    }
    epochs_run_ = state_.epochs_done;
    // The run ends with the backend holding the model it evaluated: the average, if any (the
    // kept epoch's where that is an earlier one: shown after going back to it, below).
    const bool going_back = v.keep_best && best_model_ && best_epoch_ != state_.epochs_done;
    if (!going_back) show_average();
    if (v.keep_best && best_model_) {
        if (going_back) {
            // The best epoch's model and trainer state replace the last epoch's: what the
            // backend holds, what state() says and what --save holds from here on.
            spdlog::info("keeping epoch {}'s model ({} {:.4f} on the validation set)", best_epoch_,
                         to_string(v.metric), best_value_);
            restore_best_model();
            const double seconds = state_.seconds;
            state_ = best_state_;
            state_.seconds = seconds;
            show_average();
            if (!options_.save_path.empty()) save_checkpoint_now();
        }
        // The run's final metrics are the kept model's. (A resumed auto run that never beat
        // its checkpoint has no record of the best epoch: it gets one here.)
        epoch_record kept;
        if (best_record_ && best_record_->epoch == best_epoch_) {
            kept = *best_record_;
        } else {
            kept.epoch = best_epoch_;
            kept.best_epoch = best_epoch_;
        }
        if (testing && !kept.evaluated) test_into(kept);
        kept.seconds = state_.seconds;
        for (epoch_record& r : records)
            if (r.epoch == best_epoch_ && !r.evaluated && kept.evaluated) {
                r.metrics = kept.metrics;
                r.eval_seconds = kept.eval_seconds;
                r.evaluated = true;
            }
        final_record_ = kept;
        if (!options_.metrics_out.empty()) {
            // The last line of --metrics-out is the kept model's: its epoch, the test metrics
            // of that model, and how many epochs the run trained to find it.
            nlohmann::json j = nlohmann::json::parse(record_json(kept));
            j["final"] = true;
            j["epochs_run"] = epochs_run_;
            if (epochs_undone_ > 0) j["epochs_undone"] = epochs_undone_;
            append_to_file(options_.metrics_out, j.dump() + '\n');
        }
    }
    best_model_.reset();
    best_record_.reset();
    return records;
}

}  // namespace hslide
