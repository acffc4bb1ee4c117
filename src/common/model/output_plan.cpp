// The automatic output layer (see output_plan.hpp).
#include "hslide/output_plan.hpp"

#include "hslide/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace hslide {

namespace {

uint32_t set_size_by_rows(uint32_t rows) {
    const double target = 1.6 * std::sqrt(double(rows));
    uint32_t size = 32;
    while (size < target && size < 1024) size *= 2;
    return size;
}

/// The largest power of two, at least 32, with batch x size <= ln 2 x rows.
uint32_t set_size_by_touch(uint32_t rows, uint32_t batch) {
    const double most = 0.6931471805599453 * double(rows) / double(std::max(batch, 1u));
    uint32_t size = 32;
    while (2.0 * size <= most && size < (1u << 30)) size *= 2;
    return size;
}

}  // namespace

uint32_t automatic_set_size(uint32_t rows, uint32_t batch) {
    return std::min(set_size_by_rows(rows), set_size_by_touch(rows, batch));
}

bool set_size_bounded_by_touch(uint32_t rows, uint32_t batch) {
    return set_size_by_touch(rows, batch) < set_size_by_rows(rows);
}

uint32_t automatic_top_k(uint32_t set_size) {
    return std::clamp<uint32_t>(set_size / 4, 16, 64);
}

uint32_t automatic_hidden_width(uint32_t input_features, uint32_t rows) {
    return rows <= wide_hidden_max_rows && input_features <= wide_hidden_max_features
               ? wide_hidden_width
               : narrow_hidden_width;
}

float automatic_output_lr_scale(uint32_t rows) {
    return rows <= output_lr_scale_rows ? 1.0f : float(double(output_lr_scale_rows) / rows);
}

output_plan plan_output_layer(uint32_t rows, uint32_t batch, sparsity_mode asked, uint32_t top_k,
                              uint32_t min_active) {
    HSLIDE_ASSERT(asked == sparsity_mode::automatic || asked == sparsity_mode::topk);
    output_plan plan;
    plan.min_active = min_active ? min_active : automatic_set_size(rows, batch);
    plan.top_k = top_k ? top_k : automatic_top_k(plan.min_active);
    const std::string set_rule =
        set_size_bounded_by_touch(rows, batch)
            ? fmt::format("at most half the rows touched by a step of {}", batch)
            : "about 1.6 sqrt(rows)";
    const std::string sizes =
        fmt::format("sets of {} with the top {}{}", plan.min_active, plan.top_k,
                    min_active == 0 && top_k == 0 ? fmt::format(" ({}, a quarter of it)", set_rule)
                    : min_active == 0             ? fmt::format(" (sets {})", set_rule)
                    : top_k == 0                  ? std::string(" (a quarter of the set)")
                                                  : std::string());
    if (asked == sparsity_mode::automatic && plan.min_active >= rows) {
        plan.sparsity = sparsity_mode::dense;
        plan.reason =
            fmt::format("auto: dense: a set of {} would hold all {} rows", plan.min_active, rows);
    } else {
        plan.sparsity = sparsity_mode::topk;
        plan.reason = fmt::format("{}top-k, {} of {} rows",
                                  asked == sparsity_mode::automatic ? "auto: " : "", sizes, rows);
    }
    return plan;
}

}  // namespace hslide
