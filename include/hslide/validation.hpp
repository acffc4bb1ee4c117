// Validation-driven training: a validation set evaluated after every epoch, the metric that
// says which epoch is best, keeping that epoch's model (keep_best) and stopping when the
// metric has not improved for `patience` epochs. The trainer does the work (trainer.hpp);
// the CLI's --valid/--valid-split/--valid-fraction/--keep-best/--patience and the Python
// API's arguments only fill these options.
#pragma once

#include "hslide/dataset.hpp"
#include "hslide/metrics.hpp"

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
};

/// Throws hslide::error (invalid_argument) unless `fraction` is 0 (no held-out set) or in
/// (0, 1): what --valid-fraction and the Python option valid_fraction take.
void check_validation_fraction(double fraction);

/// Splits `data` into (train, held out): round(fraction * size) points drawn at random from
/// `seed`, each part in the data's order. fraction in (0, 1), and both parts non-empty
/// (hslide::error, invalid_argument, otherwise).
std::pair<dataset, dataset> hold_out(const dataset& data, double fraction, uint64_t seed);

}  // namespace hslide
