// JSON parsing with a nesting limit (see json_util.hpp).
#include "common/util/json_util.hpp"

namespace hslide::detail {

nlohmann::json parse_json_limited(std::string_view text, const std::string& what,
                                  size_t max_depth) {
    // Count the nesting outside strings before the library sees the text: its parser is
    // iterative, but other operations on the value it builds recurse.
    size_t depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            HSLIDE_CHECK_KIND(++depth <= max_depth, error_kind::bad_input,
                              "{}: JSON nested deeper than {} levels", what, max_depth);
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    try {
        return nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::exception& e) {
        throw error(error_kind::bad_input, fmt::format("{}: not valid JSON: {}", what, e.what()));
    }
}

}  // namespace hslide::detail
