// Name <-> value tables for the enum settings (hash family, sparsity, Adam mode...): one
// lookup, and one error message listing the valid names, for every enum the CLI parses.
#pragma once

#include "hslide/error.hpp"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace hslide::detail {

/// The value called `name` in `table`; throws hslide::error (invalid_argument) naming `what`
/// and listing the valid names otherwise.
template <class Enum, size_t N>
Enum parse_named(const std::string& name, const char* what,
                 const std::pair<const char*, Enum> (&table)[N]) {
    std::string valid;
    for (const auto& [n, v] : table) {
        if (name == n) return v;
        valid += valid.empty() ? n : std::string(", ") + n;
    }
    throw error(error_kind::invalid_argument,
                fmt::format("unknown {} '{}' (valid: {})", what, name, valid));
}

/// Every name in `table`, in its order.
template <class Enum, size_t N>
std::vector<std::string> names_in(const std::pair<const char*, Enum> (&table)[N]) {
    std::vector<std::string> names;
    for (const auto& entry : table) names.emplace_back(entry.first);
    return names;
}

/// The name of `value` in `table` ("?" when it has none).
template <class Enum, size_t N>
const char* name_of(Enum value, const std::pair<const char*, Enum> (&table)[N]) {
    for (const auto& [n, v] : table)
        if (v == value) return n;
    return "?";
}

}  // namespace hslide::detail
