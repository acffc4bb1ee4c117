// Progress reporting for long loops (parsing, training, evaluation, generation), the logging
// setup, and human-readable formatting of counts, byte sizes and durations.
//
// A progress object draws on a terminal and logs on anything else:
//  - terminal (isatty): one line redrawn in place at most ~10 times a second,
//        epoch 1/3 [=========>          ]  45% 1.35M/3.00M [0:41<0:50, 33.0k samples/s] loss 0.1234
//    (unknown total: `parse 1.35M lines [0:41, 33.0k lines/s]`); the bar takes the columns the
//    text leaves (up to 30), the line is clipped to the terminal width, and finish() ends it
//    with a newline;
//  - otherwise (a log file, CI): a plain line at most every log_interval_s seconds,
//        [12:00:41] info epoch 1/3: 1.35M/3.00M samples (45%), 33.0k samples/s, ETA 50.0 s | loss
//        0.1234
//    and one final line at finish():
//        [12:01:31] info epoch 1/3: done, 3.00M samples in 1m31s (33.0k samples/s) | loss 0.1230
//
// Rates and ETAs show as "?" during the first 0.2 s (too little time to measure).
//
// add() may be called from many threads at once (an atomic counter; whichever thread finds a
// redraw due and the drawing lock free draws, the others return at once). Log lines written
// through spdlog while a terminal bar is showing land after the bar on the same line; finish()
// the bar first where that matters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace hslide {

/// How a progress object reports; the defaults suit the command line.
struct progress_options {
    bool enabled = true;             ///< false: count silently, print nothing
    FILE* out = nullptr;             ///< where to write; nullptr = stderr
    int is_tty = -1;                 ///< -1: isatty(out); 0: plain log lines; 1: redrawn bar
    double log_interval_s = 10.0;    ///< plain mode: at most one line per this many seconds
    double redraw_interval_s = 0.1;  ///< bar mode: at most one redraw per this many seconds
    int width = 0;                   ///< bar mode: line width; 0 = the terminal's (80 if unknown)
};

/// Progress of one loop over `total` units (0 = unknown total).
class progress {
  public:
    /// Reports to stderr with the default options (nothing at all when `enabled` is false).
    progress(std::string label, uint64_t total = 0, std::string unit = "items",
             bool enabled = true);
    progress(std::string label, uint64_t total, std::string unit, const progress_options& options);
    /// Calls finish() if it was not called.
    ~progress();
    progress(const progress&) = delete;
    progress& operator=(const progress&) = delete;

    /// Sets the number of units done so far.
    void update(uint64_t done);
    /// Adds `n` units done; thread-safe.
    void add(uint64_t n = 1);
    /// Text shown after the numbers (e.g. the running loss); thread-safe.
    void set_suffix(std::string suffix);
    /// Draws the final state (bar mode: then a newline; plain mode: the final line). Later calls
    /// do nothing.
    void finish();

    uint64_t done() const { return done_.load(std::memory_order_relaxed); }
    uint64_t total() const { return total_; }
    double elapsed_seconds() const;

  private:
    void maybe_draw();
    void draw(bool final);  // with mutex_ held

    using clock = std::chrono::steady_clock;
    std::string label_, unit_, suffix_;
    uint64_t total_;
    progress_options options_;
    bool tty_ = false;
    bool finished_ = false;
    clock::time_point start_;
    std::atomic<uint64_t> done_{0};
    std::atomic<int64_t> next_draw_ns_{0};  // since start_
    std::mutex mutex_;
};

/// Points the default spdlog logger at stderr with the pattern `[hh:mm:ss] level message`
/// (level coloured on a terminal). `level` is one of trace, debug, info, warn (warning), error
/// (err), critical, off; anything else is an hslide::error. `quiet` raises the level to warn.
void setup_logging(const std::string& level = "info", bool quiet = false);

/// 3 significant digits with a decimal suffix: 950, 3.50, 1.23k, 12.3M, 123G, 1.00T.
std::string human_count(double value);

/// 3 significant digits with a binary unit: 512 B, 1.50 KiB, 12.3 MiB, 123 GiB, 2.00 TiB.
std::string human_bytes(double bytes);

/// 12 us, 350 ms, 2.35 s, 42.0 s, 5m07s, 2h03m, 3d04h; "?" for NaN or infinity.
std::string human_duration(double seconds);

}  // namespace hslide
