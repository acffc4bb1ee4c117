// The adaptive hybrid policy's test of whether a slow worker helps at all.
//
// A worker that trains a small share of the samples can cost the others more than it adds:
// its CPU threads compete with the GPU's feeding thread for cores and memory bandwidth, its
// merges hold the shared model's lock and send rows the others must import, and its stale
// updates are worth less. Throughput models cannot see those costs; a measurement can. So
// the probe compares, in windows of wall time, the samples per second of all active workers
// together with the samples per second of the others while the candidate (the active worker
// that trained the fewest samples) sits out:
//  - together: a window over the active workers gives rate_all. If the candidate trained
//    less than `probe_share` of its samples (and the check is due), it is parked, and once
//    its batch in flight is done, a window over the others gives rate_without.
//  - if rate_all >= (1 + min_gain) * rate_without it helps: it is unparked, and checked
//    again after `recheck_windows` windows. Otherwise it stays parked, first for
//    `park_windows_first` windows, doubling at every verdict of the kind up to
//    `park_windows_max`, then it trains one together window and is checked again.
//  - a candidate whose own samples in the together window are fewer than `min_gain` of the
//    others' cannot help, whatever it costs them (the others alone run at least as fast as
//    beside it): it is parked at once, for `park_windows_max` windows, without a window to
//    measure (a CPU beside a GPU that trains 100x faster: its trial windows and their merges
//    are what the hybrid would cost the GPU).
// A parked worker gets no batches: its share of samples and updates is zero. A window is
// complete when it has lasted `window_seconds` and every counted worker finished
// `window_batches` batches (or after 10 x window_seconds regardless). Time in which no
// worker had work (the trainer evaluating, or synchronising) is not counted (pause()).
// The last active worker is never parked. Everything here is single-threaded: the hybrid
// backend calls it under its queue lock, with times from one monotonic clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hslide::detail {

struct usefulness_settings {
    double window_seconds = 2.0;
    uint32_t window_batches = 3;
    /// Check the slowest worker only while it trains less than this share of the samples
    /// (0 = never check: no worker is ever parked).
    double probe_share = 0.25;
    double min_gain = 0.05;  ///< it must add at least this fraction of the others' rate
    uint32_t recheck_windows = 16;
    uint32_t park_windows_first = 4, park_windows_max = 64;
};

/// One decision of the probe, for the logs.
struct usefulness_verdict {
    size_t worker = 0;
    bool helps = false;
    double rate_all = 0, rate_without = 0;  ///< samples per second
    double parked_for_seconds = 0;          ///< when it does not help
    /// It trained too little to add min_gain (no window without it was measured:
    /// rate_without is the others' rate beside it).
    bool bounded = false;
};

class usefulness_probe {
  public:
    usefulness_probe(const usefulness_settings& settings, size_t workers);

    /// Worker w finished a batch of `samples` at time t (seconds).
    void on_batch(size_t w, uint64_t samples, double t);
    /// No worker had work for `seconds`: the current window is extended by as much.
    void pause(double seconds);
    /// Advances the state at time t, given which workers are in a batch now. Returns true
    /// when a worker was parked or unparked (the caller wakes its workers).
    bool update(double t, const std::vector<bool>& busy);

    bool parked(size_t w) const { return parked_[w]; }
    /// Seconds worker w spent parked up to time t since the last call for w.
    double take_parked_seconds(size_t w, double t);
    /// The verdicts since the last call.
    std::vector<usefulness_verdict> take_verdicts();

  private:
    enum class phase { together, without };
    void start_window(double t);
    bool window_complete(double t) const;
    void set_parked(size_t w, bool parked, double t);
    size_t active_count() const;

    usefulness_settings settings_;
    phase phase_ = phase::together;
    size_t candidate_ = 0;
    bool window_started_ = false;  // without: waits for the candidate's batch in flight
    double window_start_ = 0, paused_ = 0;
    std::vector<uint64_t> window_samples_, window_batches_;
    double rate_all_ = 0;
    double next_check_ = 0;
    std::vector<bool> parked_;
    std::vector<double> park_until_;  // parked for not helping: until then (else 0)
    std::vector<uint32_t> park_windows_;
    std::vector<double> parked_since_, parked_total_;
    std::vector<usefulness_verdict> verdicts_;
};

}  // namespace hslide::detail
