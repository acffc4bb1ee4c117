// The adaptive hybrid policy's usefulness test (see usefulness_probe.hpp).
#include "hybrid/usefulness_probe.hpp"

#include "hslide/error.hpp"

#include <algorithm>
#include <utility>

namespace hslide::detail {

usefulness_probe::usefulness_probe(const usefulness_settings& settings, size_t workers)
    : settings_(settings),
      window_samples_(workers, 0),
      window_batches_(workers, 0),
      parked_(workers, false),
      park_until_(workers, 0),
      park_windows_(workers, settings.park_windows_first),
      parked_since_(workers, 0),
      parked_total_(workers, 0) {
    HSLIDE_CHECK(settings.window_seconds > 0, "the usefulness window must be positive");
    HSLIDE_CHECK(settings.probe_share >= 0 && settings.probe_share <= 1,
                 "the share below which a worker is checked must be in [0, 1], not {}",
                 settings.probe_share);
}

void usefulness_probe::on_batch(size_t w, uint64_t samples, double) {
    // A parked worker's batch in flight when it was parked belongs to no window.
    if (!window_started_ || parked_[w]) return;
    window_samples_[w] += samples;
    window_batches_[w] += 1;
}

void usefulness_probe::pause(double seconds) {
    if (window_started_) paused_ += seconds;
}

void usefulness_probe::start_window(double t) {
    window_started_ = true;
    window_start_ = t;
    paused_ = 0;
    std::fill(window_samples_.begin(), window_samples_.end(), 0);
    std::fill(window_batches_.begin(), window_batches_.end(), 0);
}

bool usefulness_probe::window_complete(double t) const {
    const double elapsed = t - window_start_ - paused_;
    if (elapsed < settings_.window_seconds) return false;
    if (elapsed >= 10 * settings_.window_seconds) return true;
    for (size_t w = 0; w < parked_.size(); ++w)
        if (!parked_[w] && window_batches_[w] < settings_.window_batches) return false;
    return true;
}

void usefulness_probe::set_parked(size_t w, bool parked, double t) {
    if (parked_[w] == parked) return;
    if (parked)
        parked_since_[w] = t;
    else
        parked_total_[w] += t - parked_since_[w];
    parked_[w] = parked;
}

size_t usefulness_probe::active_count() const {
    return size_t(std::count(parked_.begin(), parked_.end(), false));
}

bool usefulness_probe::update(double t, const std::vector<bool>& busy) {
    HSLIDE_ASSERT(busy.size() == parked_.size());
    if (settings_.probe_share <= 0 || parked_.size() < 2) return false;

    // Parked workers whose time is up train one together window and are checked again; a
    // measurement in progress is void, as its set of workers changed.
    bool rejoined = false;
    for (size_t w = 0; w < parked_.size(); ++w)
        if (parked_[w] && park_until_[w] > 0 && t >= park_until_[w]) {
            set_parked(w, false, t);
            park_until_[w] = 0;
            rejoined = true;
        }
    if (rejoined) {
        if (phase_ == phase::without) set_parked(candidate_, false, t);
        phase_ = phase::together;
        next_check_ = 0;
        start_window(t);
        return true;
    }

    if (!window_started_) {
        // Without: the window opens once the candidate's batch in flight is done, so that its
        // work does not count against the others.
        if (phase_ == phase::together || !busy[candidate_]) start_window(t);
        return false;
    }
    if (!window_complete(t)) return false;

    const double elapsed = t - window_start_ - paused_;
    uint64_t total = 0;
    size_t slowest = parked_.size();
    for (size_t w = 0; w < parked_.size(); ++w) {
        if (parked_[w]) continue;
        total += window_samples_[w];
        if (slowest == parked_.size() || window_samples_[w] < window_samples_[slowest]) slowest = w;
    }
    const double rate = double(total) / elapsed;

    if (phase_ == phase::together) {
        rate_all_ = rate;
        const bool check = total > 0 && active_count() >= 2 && t >= next_check_ &&
                           double(window_samples_[slowest]) < settings_.probe_share * double(total);
        if (!check) {
            start_window(t);
            return false;
        }
        const uint64_t others = total - window_samples_[slowest];
        if (double(window_samples_[slowest]) < settings_.min_gain * double(others)) {
            usefulness_verdict v;
            v.worker = slowest;
            v.rate_all = rate;
            v.rate_without = double(others) / elapsed;
            v.bounded = true;
            park_windows_[slowest] = settings_.park_windows_max;
            v.parked_for_seconds = settings_.park_windows_max * settings_.window_seconds;
            park_until_[slowest] = t + v.parked_for_seconds;
            set_parked(slowest, true, t);
            verdicts_.push_back(v);
            start_window(t);
            return true;
        }
        candidate_ = slowest;
        set_parked(candidate_, true, t);
        phase_ = phase::without;
        window_started_ = false;
        if (!busy[candidate_]) start_window(t);
        return true;
    }

    usefulness_verdict v;
    v.worker = candidate_;
    v.rate_all = rate_all_;
    v.rate_without = rate;
    v.helps = rate_all_ >= (1 + settings_.min_gain) * rate;
    if (v.helps) {
        set_parked(candidate_, false, t);
        park_windows_[candidate_] = settings_.park_windows_first;
        next_check_ = t + settings_.recheck_windows * settings_.window_seconds;
    } else {
        v.parked_for_seconds = park_windows_[candidate_] * settings_.window_seconds;
        park_until_[candidate_] = t + v.parked_for_seconds;
        park_windows_[candidate_] =
            std::min(2 * park_windows_[candidate_], settings_.park_windows_max);
    }
    verdicts_.push_back(v);
    phase_ = phase::together;
    start_window(t);
    return true;
}

double usefulness_probe::take_parked_seconds(size_t w, double t) {
    double seconds = parked_total_[w];
    parked_total_[w] = 0;
    if (parked_[w]) {
        seconds += t - parked_since_[w];
        parked_since_[w] = t;
    }
    return seconds;
}

std::vector<usefulness_verdict> usefulness_probe::take_verdicts() {
    return std::exchange(verdicts_, {});
}

}  // namespace hslide::detail
