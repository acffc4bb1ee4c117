// Validation-driven training: a validation set evaluated after every epoch, the metric that
// says which epoch is best, keeping that epoch's model (keep_best) and stopping when the
// metric has not improved for `patience` epochs, and --epochs auto, which turns all of that
// on with a held-out share of the training data. The trainer does the work (trainer.hpp);
// the CLI's --epochs/--valid/--valid-split/--valid-fraction/--keep-best/--patience and the
// Python API's arguments only fill these options.
#pragma once

#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/metrics.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace hslide {

/// A metric of metrics_result at one k: p@k, ndcg@k or psp@k.
struct selection_metric {
    enum class kind { precision, ndcg, psp };
    kind which = kind::precision;
    int k = 1;
};

/// "p@1", "ndcg@3", "psp@5" (k from 1 to 5); throws hslide::error (invalid_argument) otherwise.
selection_metric parse_selection_metric(const std::string& name);
/// The metric's name as parse_selection_metric reads it.
std::string to_string(const selection_metric& metric);
/// Its value in `result` (checked: k within the result, PSP computed).
double metric_value(const metrics_result& result, const selection_metric& metric);

/// What the trainer does with a validation set.
struct validation_options {
    /// Evaluated after every epoch (null or empty: no validation, and then neither keep_best
    /// nor patience may be set).
    const dataset* valid = nullptr;
    selection_metric metric;  ///< what "best" means (higher is better)
    /// End with the best epoch's model (held in memory as a copy of the model while training
    /// goes on): the backend, trainer state and --save checkpoint are then the best epoch's.
    bool keep_best = false;
    uint32_t patience = 0;  ///< stop after this many epochs without improvement (0 = never)
    /// With keep_best and patience: at a plateau (patience run out), this many times go back to
    /// the best epoch's model and trainer state and go on at a tenth of the learning rate
    /// (lr_drop_factor) before stopping. -1: auto_epochs_defaults::lr_drops under --epochs
    /// auto, else 0.
    int32_t lr_drops = -1;
    /// The most epochs trained at a dropped rate before the next drop or, after the last, the
    /// stop (0: until the next plateau). -1: auto_epochs_defaults::epochs_per_drop under
    /// --epochs auto, else 0.
    int32_t epochs_per_drop = -1;
    /// What patience counts as an improvement: an epoch improves when it is the best and beats
    /// the last epoch that improved by more than min_gain holdout_noise()s of that epoch's value
    /// (epoch_improves). 0: any gain; -1: under --epochs auto auto_epochs_defaults::min_gain on
    /// a hold-out of at least auto_epochs_defaults::min_gain_points points (0 on a smaller
    /// one), else 0. The best epoch is the one that scores highest either way.
    double min_gain = -1;
};

/// --epochs auto's settings where the user gives none (bench/epochs.md measured them on the
/// real sets over several seeds).
struct auto_epochs_defaults {
    /// The most epochs an automatic run trains (train_config::epochs under auto).
    static constexpr uint32_t max_epochs = 30;
    /// Epochs without improvement before it stops (an explicit --patience replaces it), on a
    /// hold-out of min_gain_points or more. 1, not 2: on the real sets over 4 seeds each it
    /// kept the same epoch's model in 15 of 16 runs (the 16th stopped two epochs earlier with
    /// a better test P@1) for one epoch less.
    static constexpr uint32_t patience = 1;
    /// The same on a smaller hold-out (a training set under about 4,000 points), where one
    /// epoch's score moves by chance more than an epoch gains and min_gain does not apply: 2.
    /// Over seeds 1-8 it raised the mean test P@1 on Yeast (75 hold-out points) from 0.7690 to
    /// 0.7739 and on Debian's Provides (87) from 0.9250 to 0.9316, and kept it on Debian's
    /// Breaks+Replaces+Conflicts (163; 0.7739 against 0.7737), for an epoch more a run
    /// (bench/peers.md, 2026-12-07, sixth session).
    static constexpr uint32_t small_holdout_patience = 2;
    /// Plateaus answered by going back to the best model at a lower rate (validation_options::
    /// lr_drops): one. Continuing from the best epoch at a tenth of the rate raised test P@1 on
    /// Bibtex by 0.012 and 0.013 (seeds 1, 2), Yeast by 0.004 (seed 3), and kept it within 0.002
    /// elsewhere (Corel5k, Debian-recs; bench/epochs.md), for 1-3 more epochs.
    static constexpr int32_t lr_drops = 1;
    /// The same where the run scores an average of its weights (train_config::ema_epochs):
    /// none. The average does what the drop did, without the epochs at the lower rate
    /// (bench/peers.md, 2026-12-07).
    static constexpr int32_t lr_drops_with_average = 0;
    /// Epochs at the dropped rate (validation_options::epochs_per_drop): one. Training on at a
    /// tenth of the rate until the next plateau took 2-4 epochs after the drop; stopping after
    /// the first kept the mean test P@1 of seeds 1-4 within 0.002 on every real set (Debian-
    /// recs +0.0016) for 0.7-2.5 epochs fewer (Debian-recs 2.5; bench/epochs.md).
    static constexpr int32_t epochs_per_drop = 1;
    /// What a drop multiplies the learning rate by.
    static constexpr double lr_drop_factor = 0.1;
    /// An epoch improves, for patience, only when it gains more than half the hold-out's noise
    /// (validation_options::min_gain). Gains that small at the full rate were worth less than
    /// the drop's: over seeds 1-8, Debian-recs kept the same mean test P@1 (0.5062 against
    /// 0.5050) in 5-7 epochs instead of 7-9, Bibtex and Corel5k within 0.003, and the
    /// Amazon-670K shape lost 0.003 for a fifth of its time (bench/epochs.md).
    static constexpr double min_gain = 0.5;
    /// The smallest hold-out min_gain applies to. Half the noise of a smaller one is over 0.018
    /// (at a metric of 0.5), more than whole epochs gain there that still pay: on Yeast (75
    /// points, gains of 0.01-0.02 an epoch) it stopped 2 epochs early, and test P@5 fell by
    /// 0.015 in each of 8 seeds.
    static constexpr size_t min_gain_points = 200;
    /// The patience for a hold-out of `points` points: patience, or small_holdout_patience
    /// under min_gain_points.
    static constexpr uint32_t patience_for(size_t points) {
        return points >= min_gain_points ? patience : small_holdout_patience;
    }
    /// What "best" means unless --keep-best says: nDCG@5, not P@1. On a hold-out of a few
    /// hundred points P@1 moves by a few hundredths from epoch to epoch by chance, so it
    /// stopped Bibtex and Corel5k epochs before their peak (test P@1 0.594 and 0.387 against
    /// 0.617 and 0.405 by nDCG@5, means of 3 seeds); nDCG@5 averages five ranks per point.
    static selection_metric metric() { return {selection_metric::kind::ndcg, 5}; }
    /// The share of the training points held out for validation when no validation set is
    /// given, and at most this many points: validation then costs at most a few exact
    /// predictions of that many points an epoch, whatever the data's size.
    static constexpr double holdout_fraction = 0.05;
    static constexpr size_t holdout_max_points = 2000;
};

/// The noise of a hold-out's metric: the standard error of a mean of `points` per-point values
/// in [0, 1] whose mean is `value`, sqrt(value (1 - value) / points) (the binomial bound; value
/// clamped to [0, 1]). An epoch at a dropped rate is kept over the best when it scores within
/// this of it (trainer.hpp).
double holdout_noise(double value, size_t points);

/// Whether an epoch scoring `value` on a hold-out of `points` improves on the last epoch that
/// improved, which scored `reference`: value > reference + min_gain * holdout_noise(reference,
/// points) (validation_options::min_gain; with 0, any gain).
bool epoch_improves(double value, double reference, size_t points, double min_gain);

/// Reads --epochs: "auto" (epochs_auto, capped at auto_epochs_defaults::max_epochs) or a
/// positive count (exactly that many). Throws hslide::error (invalid_argument) naming
/// --epochs otherwise.
void parse_epochs(const std::string& text, train_config& train);
/// --epochs as parse_epochs reads it: "auto" or the count.
std::string epochs_to_string(const train_config& train);

/// Throws hslide::error (invalid_argument) unless `fraction` is 0 (no held-out set) or in
/// (0, 1): what --valid-fraction and the Python option valid_fraction take.
void check_validation_fraction(double fraction);

/// Splits `data` into (train, held out): round(fraction * size) points, but at most
/// `max_points` (0 = no cap), drawn at random from `seed`, each part in the data's order (a
/// cap keeps the uncapped draw's first points). fraction in (0, 1), and both parts non-empty
/// (hslide::error, invalid_argument, otherwise).
std::pair<dataset, dataset> hold_out(const dataset& data, double fraction, uint64_t seed,
                                     size_t max_points = 0);

/// --epochs auto's hold-out: auto_epochs_defaults' share of `data`, capped, drawn from `seed`.
std::pair<dataset, dataset> hold_out_for_auto_epochs(const dataset& data, uint64_t seed);

}  // namespace hslide
