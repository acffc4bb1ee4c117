// Errors in two tiers, as the rest of hslide uses them.
//
//  - HSLIDE_CHECK(cond, fmt, args...) guards a caller's mistake (bad input file, bad flag, bad
//    argument): it throws hslide::error with a formatted message. The CLI prints the message
//    and exits with the error's exit code (2 for bad input, 1 otherwise).
//  - HSLIDE_ASSERT(cond) guards an internal invariant: a failure is a bug in hslide. It is
//    always on (never compiled out), has no side effects to lose, and aborts with file:line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hslide {

/// What kind of failure an error is; picks the CLI's exit code.
enum class error_kind {
    invalid_argument,  ///< a bad parameter or flag value (exit 2)
    bad_input,         ///< a malformed or missing input file (exit 2)
    io,                ///< an operating-system I/O failure (exit 1)
    unsupported,       ///< asked for something this build or machine cannot do (exit 1)
    runtime,           ///< anything else (exit 1)
};

/// The one exception type hslide throws for errors a caller can act on.
class error : public std::runtime_error {
  public:
    error(error_kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
    error_kind kind() const noexcept { return kind_; }
    /// The process exit code the CLI uses for this error.
    int exit_code() const noexcept {
        return (kind_ == error_kind::invalid_argument || kind_ == error_kind::bad_input) ? 2 : 1;
    }

  private:
    error_kind kind_;
};

/// A malformed input file: the message names the file, the 1-based line and the reason.
class input_error : public error {
  public:
    input_error(const std::string& file, size_t line, const std::string& reason)
        : error(error_kind::bad_input, line > 0 ? fmt::format("{}:{}: {}", file, line, reason)
                                                : fmt::format("{}: {}", file, reason)),
          file_(file),
          line_(line),
          reason_(reason) {}
    const std::string& file() const noexcept { return file_; }
    size_t line() const noexcept { return line_; }
    const std::string& reason() const noexcept { return reason_; }

  private:
    std::string file_;
    size_t line_;
    std::string reason_;
};

namespace detail {
[[noreturn]] void assert_failed(const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace hslide

/// Throws hslide::error(invalid_argument) with a fmt-formatted message when `cond` is false.
#define HSLIDE_CHECK(cond, ...)                                           \
    do {                                                                  \
        if (!(cond))                                                      \
            throw ::hslide::error(::hslide::error_kind::invalid_argument, \
                                  ::fmt::format(__VA_ARGS__));            \
    } while (0)

/// Like HSLIDE_CHECK with an explicit error_kind.
#define HSLIDE_CHECK_KIND(cond, kind, ...)                                      \
    do {                                                                        \
        if (!(cond)) throw ::hslide::error((kind), ::fmt::format(__VA_ARGS__)); \
    } while (0)

/// Aborts with the expression and location when an internal invariant does not hold.
#define HSLIDE_ASSERT(cond)                                                      \
    do {                                                                         \
        if (!(cond)) ::hslide::detail::assert_failed(#cond, __FILE__, __LINE__); \
    } while (0)
