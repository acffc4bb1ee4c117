// Reading JSON that came from a file (a checkpoint's metadata): parsed with a nesting limit,
// and numbers read into integer fields only when they fit.
//
// Why a nesting limit: nlohmann::json recurses on nested values (its destructor and dump
// among others), so a checkpoint whose metadata nests 100,000 arrays deep (checksums
// recomputed) would overflow the stack. hslide's own JSON nests 4 deep.
// Why checked integers: get<uint32_t>() of -1 is 4294967295, silently.
#pragma once

#include "hslide/error.hpp"

#include <nlohmann/json.hpp>

#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace hslide::detail {

/// The deepest nesting of arrays and objects parse_json_limited accepts.
constexpr size_t max_json_depth = 64;

/// Parses `text`; throws hslide::error (bad_input) naming `what` when it nests deeper than
/// `max_depth` or is not valid JSON.
nlohmann::json parse_json_limited(std::string_view text, const std::string& what,
                                  size_t max_depth = max_json_depth);

/// j[key] as the integer type T, or throws hslide::error (bad_input) naming `key` when it is
/// missing, not an integer, or out of T's range.
template <class T>
T json_integer(const nlohmann::json& j, const char* key) {
    static_assert(std::is_integral_v<T>, "json_integer reads integers");
    const auto it = j.find(key);
    HSLIDE_CHECK_KIND(it != j.end(), error_kind::bad_input, "'{}' is missing", key);
    bool fits = false;
    if (it->is_number_unsigned()) {
        fits = it->template get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
    } else if (it->is_number_integer()) {
        const int64_t v = it->template get<int64_t>();
        fits = v >= 0 ? uint64_t(v) <= uint64_t(std::numeric_limits<T>::max())
                      : std::is_signed_v<T> && v >= int64_t(std::numeric_limits<T>::min());
    } else {
        HSLIDE_CHECK_KIND(false, error_kind::bad_input, "'{}' is {}, not an integer", key,
                          it->dump());
    }
    HSLIDE_CHECK_KIND(fits, error_kind::bad_input, "'{}' = {} is out of range ({} to {})", key,
                      it->dump(), std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
    return it->template get<T>();
}

/// json_integer, or `fallback` when `key` is absent.
template <class T>
T json_integer_or(const nlohmann::json& j, const char* key, T fallback) {
    return j.contains(key) ? json_integer<T>(j, key) : fallback;
}

}  // namespace hslide::detail
