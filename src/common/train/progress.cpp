// Progress bars / progress log lines, logging setup and human-readable formatting
// (see include/hslide/progress.hpp).
#include "hslide/progress.hpp"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <ctime>

#include "hslide/error.hpp"

namespace hslide {

namespace {

// 3 significant digits of a value in [1, 1000).
std::string three_digits(double v) {
    if (v < 9.995) return fmt::format("{:.2f}", v);
    if (v < 99.95) return fmt::format("{:.1f}", v);
    return fmt::format("{:.0f}", v);
}

// m:ss or h:mm:ss, as progress bars show elapsed time and ETA.
std::string clock_time(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    const long long t = std::llround(seconds);
    if (t < 3600) return fmt::format("{}:{:02}", t / 60, t % 60);
    return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
}

std::string wall_clock() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    return fmt::format("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

int terminal_width(FILE* out) {
    winsize ws{};
    if (::ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// formatting

std::string human_count(double value) {
    if (!std::isfinite(value)) return fmt::format("{}", value);
    if (value < 0) return "-" + human_count(-value);
    if (value < 999.5) {
        if (value == std::floor(value)) return fmt::format("{:.0f}", value);
        return value < 1 ? fmt::format("{:.2f}", value) : three_digits(value);
    }
    static const char* const suffixes[] = {"k", "M", "G", "T", "P", "E"};
    double v = value / 1000.0;
    size_t unit = 0;
    // Move up a unit whenever rounding to 3 digits would print 1000.
    while (v >= 999.5 && unit + 1 < std::size(suffixes)) {
        v /= 1000.0;
        ++unit;
    }
    return three_digits(v) + suffixes[unit];
}

std::string human_bytes(double bytes) {
    if (!std::isfinite(bytes)) return fmt::format("{} B", bytes);
    if (bytes < 0) return "-" + human_bytes(-bytes);
    if (bytes < 1024) return fmt::format("{:.0f} B", bytes);
    static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = bytes / 1024.0;
    size_t unit = 0;
    while (v >= 999.5 && unit + 1 < std::size(units)) {
        v /= 1024.0;
        ++unit;
    }
    return three_digits(v) + " " + units[unit];
}

std::string human_duration(double seconds) {
    if (!std::isfinite(seconds)) return "?";
    if (seconds < 0) return "-" + human_duration(-seconds);
    if (seconds < 0.9995e-3) return fmt::format("{:.0f} us", seconds * 1e6);
    if (seconds < 0.9995) return fmt::format("{:.0f} ms", seconds * 1e3);
    if (seconds < 9.995) return fmt::format("{:.2f} s", seconds);
    if (seconds < 59.95) return fmt::format("{:.1f} s", seconds);
    const long long t = std::llround(seconds);
    if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
    const long long m = std::llround(seconds / 60);
    if (m < 24 * 60) return fmt::format("{}h{:02}m", m / 60, m % 60);
    const long long h = std::llround(seconds / 3600);
    return fmt::format("{}d{:02}h", h / 24, h % 24);
}

// ---------------------------------------------------------------------------------------------
// logging

void setup_logging(const std::string& level, bool quiet) {
    spdlog::level::level_enum lvl;
    if (level == "trace")
        lvl = spdlog::level::trace;
    else if (level == "debug")
        lvl = spdlog::level::debug;
    else if (level == "info")
        lvl = spdlog::level::info;
    else if (level == "warn" || level == "warning")
        lvl = spdlog::level::warn;
    else if (level == "error" || level == "err")
        lvl = spdlog::level::err;
    else if (level == "critical")
        lvl = spdlog::level::critical;
    else if (level == "off")
        lvl = spdlog::level::off;
    else
        throw error(error_kind::invalid_argument,
                    fmt::format("unknown log level '{}' (expected trace, debug, info, warn, "
                                "error, critical or off)",
                                level));
    if (quiet && lvl < spdlog::level::warn) lvl = spdlog::level::warn;

    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto logger = std::make_shared<spdlog::logger>("hslide", std::move(sink));
    logger->set_pattern("[%H:%M:%S] %^%l%$ %v");
    logger->set_level(lvl);
    spdlog::set_default_logger(std::move(logger));
}

// ---------------------------------------------------------------------------------------------
// progress

progress::progress(std::string label, uint64_t total, std::string unit, bool enabled)
    : progress(std::move(label), total, std::move(unit), [&] {
          progress_options o;
          o.enabled = enabled;
          return o;
      }()) {}

progress::progress(std::string label, uint64_t total, std::string unit,
                   const progress_options& options)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      options_(options),
      start_(clock::now()) {
    if (!options_.out) options_.out = stderr;
    tty_ = options_.is_tty < 0 ? ::isatty(fileno(options_.out)) != 0 : options_.is_tty != 0;
    if (tty_ && options_.width <= 0) options_.width = terminal_width(options_.out);
    // A bar shows up at once; plain lines only once an interval has passed.
    next_draw_ns_ = tty_ ? 0 : static_cast<int64_t>(options_.log_interval_s * 1e9);
}

progress::~progress() {
    try {
        finish();
    } catch (...) {
        // Reporting must never turn unwinding into termination.
    }
}

double progress::elapsed_seconds() const {
    return std::chrono::duration<double>(clock::now() - start_).count();
}

void progress::update(uint64_t done) {
    done_.store(done, std::memory_order_relaxed);
    maybe_draw();
}

void progress::add(uint64_t n) {
    done_.fetch_add(n, std::memory_order_relaxed);
    maybe_draw();
}

void progress::set_suffix(std::string suffix) {
    std::lock_guard<std::mutex> lock(mutex_);
    suffix_ = std::move(suffix);
}

void progress::maybe_draw() {
    if (!options_.enabled) return;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start_).count();
    if (now < next_draw_ns_.load(std::memory_order_relaxed)) return;
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || finished_) return;
    if (now < next_draw_ns_.load(std::memory_order_relaxed)) return;  // another thread just drew
    const double interval = tty_ ? options_.redraw_interval_s : options_.log_interval_s;
    next_draw_ns_.store(now + static_cast<int64_t>(interval * 1e9), std::memory_order_relaxed);
    draw(false);
}

void progress::finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    if (options_.enabled) draw(true);
}

void progress::draw(bool final) {
    const double elapsed = elapsed_seconds();
    const uint64_t done = done_.load(std::memory_order_relaxed);
    // A rate measured over a few milliseconds is noise; say so until there is a real one.
    const bool rate_known = elapsed > 0 && (final || elapsed >= 0.2);
    const double rate = rate_known ? static_cast<double>(done) / elapsed : NAN;
    const double fraction =
        total_ > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)) : 0.0;
    double eta = NAN;
    if (total_ > 0 && done >= total_)
        eta = 0.0;
    else if (total_ > 0 && rate > 0)
        eta = static_cast<double>(total_ - done) / rate;
    const std::string done_text = human_count(static_cast<double>(done));
    const std::string rate_text =
        fmt::format("{} {}/s", rate_known ? human_count(rate) : "?", unit_);

    std::string line;
    if (tty_) {
        std::string numbers;
        if (total_ > 0) {
            numbers = fmt::format(" {:3.0f}% {}/{} [{}<{}, {}]", std::floor(fraction * 100),
                                  done_text, human_count(static_cast<double>(total_)),
                                  clock_time(elapsed), clock_time(eta), rate_text);
        } else {
            numbers =
                fmt::format(" {} {} [{}, {}]", done_text, unit_, clock_time(elapsed), rate_text);
        }
        if (!suffix_.empty()) numbers += " " + suffix_;
        // The bar takes the room the text leaves, up to 30 columns; below 6 it is left out.
        const int room = options_.width - 1 - static_cast<int>(label_.size() + numbers.size()) - 3;
        const int bar = std::min(room, 30);
        line = label_;
        if (total_ > 0 && bar >= 6) {
            const int filled = static_cast<int>(fraction * bar);
            line += " [" + std::string(filled, '=') + (filled < bar ? ">" : "") +
                    std::string(bar - filled - (filled < bar ? 1 : 0), ' ') + "]";
        }
        line += numbers;
        // Never wrap: a wrapped line cannot be redrawn in place.
        if (options_.width > 1 && line.size() > static_cast<size_t>(options_.width - 1))
            line.resize(options_.width - 1);
        std::fprintf(options_.out, "\r%s\x1b[K%s", line.c_str(), final ? "\n" : "");
    } else {
        line = fmt::format("[{}] info {}: ", wall_clock(), label_);
        if (final) {
            line += fmt::format("done, {} {} in {} ({})", done_text, unit_, human_duration(elapsed),
                                rate_text);
        } else {
            line += done_text;
            if (total_ > 0)
                line += fmt::format("/{} {} ({:.0f}%)", human_count(static_cast<double>(total_)),
                                    unit_, std::floor(fraction * 100));
            else
                line += " " + unit_;
            line += ", " + rate_text;
            if (total_ > 0) line += ", ETA " + human_duration(eta);
        }
        if (!suffix_.empty()) line += " | " + suffix_;
        std::fprintf(options_.out, "%s\n", line.c_str());
    }
    std::fflush(options_.out);
}

}  // namespace hslide
