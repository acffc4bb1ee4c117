// Validation metrics and the held-out split (see validation.hpp).
#include "hslide/validation.hpp"

#include "hslide/error.hpp"
#include "hslide/rng.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hslide {

selection_metric parse_selection_metric(const std::string& name) {
    selection_metric m;
    const size_t at = name.find('@');
    const std::string what = name.substr(0, at);
    int k = 0;
    if (at != std::string::npos && at + 2 == name.size() && name[at + 1] >= '1' &&
        name[at + 1] <= '5')
        k = name[at + 1] - '0';
    const bool known = what == "p" || what == "ndcg" || what == "psp";
    HSLIDE_CHECK(known && k > 0,
                 "unknown validation metric '{}' (p@k, ndcg@k or psp@k with k from 1 to 5)", name);
    m.which = what == "p"      ? selection_metric::kind::precision
              : what == "ndcg" ? selection_metric::kind::ndcg
                               : selection_metric::kind::psp;
    m.k = k;
    return m;
}

std::string to_string(const selection_metric& m) {
    const char* what = m.which == selection_metric::kind::precision ? "p"
                       : m.which == selection_metric::kind::ndcg    ? "ndcg"
                                                                    : "psp";
    return fmt::format("{}@{}", what, m.k);
}

double metric_value(const metrics_result& r, const selection_metric& m) {
    switch (m.which) {
        case selection_metric::kind::precision:
            return r.p_at(m.k);
        case selection_metric::kind::ndcg:
            return r.ndcg_at(m.k);
        case selection_metric::kind::psp:
            break;
    }
    HSLIDE_CHECK(!r.psp.empty(), "{} needs propensities (the training set's label counts)",
                 to_string(m));
    return r.psp_at(m.k);
}

void check_validation_fraction(double fraction) {
    HSLIDE_CHECK(fraction == 0 || (fraction > 0 && fraction < 1),
                 "the validation fraction (--valid-fraction, valid_fraction) must be in (0, 1), "
                 "or 0 for none; got {:g}",
                 fraction);
}

double holdout_noise(double value, size_t points) {
    if (points == 0) return 0.0;
    const double m = std::clamp(value, 0.0, 1.0);
    return std::sqrt(m * (1.0 - m) / double(points));
}

bool epoch_improves(double value, double reference, size_t points, double min_gain) {
    return value > reference + min_gain * holdout_noise(reference, points);
}

void parse_epochs(const std::string& text, train_config& train) {
    if (text == "auto") {
        train.epochs_auto = true;
        train.epochs = auto_epochs_defaults::max_epochs;
        return;
    }
    // Digits only: std::stoul would take "-1", " 7" or "7x".
    const bool digits =
        !text.empty() && text.size() <= 9 &&
        std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    const unsigned long count = digits ? std::stoul(text) : 0;
    HSLIDE_CHECK(count > 0,
                 "--epochs (epochs) must be 'auto' or a positive number of epochs, got '{}'", text);
    train.epochs_auto = false;
    train.epochs = uint32_t(count);
}

std::string epochs_to_string(const train_config& train) {
    return train.epochs_auto ? std::string("auto") : std::to_string(train.epochs);
}

std::pair<dataset, dataset> hold_out(const dataset& data, double fraction, uint64_t seed,
                                     size_t max_points) {
    HSLIDE_CHECK(fraction > 0 && fraction < 1,
                 "the validation fraction must be in (0, 1), got {:g}", fraction);
    const size_t n = data.size();
    size_t held = size_t(std::llround(fraction * double(n)));
    if (max_points > 0) held = std::min(held, max_points);
    HSLIDE_CHECK(held > 0 && held < n,
                 "a validation fraction of {} of {} points leaves {} for validation and {} for "
                 "training: both must be non-empty",
                 fraction, n, held, n - held);
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    rng gen(derive_seed(seed, 0x7a11d));
    shuffle(order.begin(), order.end(), gen);
    std::vector<uint32_t> valid(order.begin(), order.begin() + ptrdiff_t(held));
    std::vector<uint32_t> train(order.begin() + ptrdiff_t(held), order.end());
    std::sort(valid.begin(), valid.end());
    std::sort(train.begin(), train.end());
    std::pair<dataset, dataset> out{subset(data, train), subset(data, valid)};
    out.first.source = data.source;
    out.second.source = data.source + " (held out)";
    return out;
}

std::pair<dataset, dataset> hold_out_for_auto_epochs(const dataset& data, uint64_t seed) {
    HSLIDE_CHECK(data.size() >= 2,
                 "--epochs auto holds out validation points, and {} has only {} point(s): give "
                 "--epochs N",
                 data.source, data.size());
    // At least one point each side, however small the data.
    const double fraction = std::clamp(auto_epochs_defaults::holdout_fraction,
                                       1.0 / double(data.size()), 1.0 - 1.0 / double(data.size()));
    return hold_out(data, fraction, seed, auto_epochs_defaults::holdout_max_points);
}

}  // namespace hslide
