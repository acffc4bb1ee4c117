// One check of an input matrix pair (features and labels in CSR form), shared by everything
// that takes a dataset from outside the text readers: the Python module's arrays, the binary
// cache's loader, dataset::push_back and the XC writer. The text readers check the same rules
// line by line while they parse (dataset.hpp), so every way in refuses the same things:
//
//  - CSR structure: rows + 1 offsets, the first 0, never decreasing, the last equal to the
//    number of entries (checked before any entry is read, so a forged offset cannot send a
//    reader past the arrays);
//  - feature ids < D and strictly ascending within a point, feature values finite;
//  - label ids < L and unique within a point.
#pragma once

#include "hslide/dataset.hpp"

#include <cstdint>
#include <string>

namespace hslide {

/// What is wrong with `rows + 1` CSR offsets over `entries` entries ("" when nothing is).
/// `what` names the matrix in the reason ("X", "the labels").
std::string csr_offsets_problem(const int64_t* offsets, size_t rows, uint64_t entries,
                                const std::string& what);
std::string csr_offsets_problem(const uint64_t* offsets, size_t rows, uint64_t entries,
                                const std::string& what);

/// What is wrong with one point ("" when nothing is), by the rules above.
std::string point_problem(const uint32_t* feature_ids, const float* feature_values,
                          uint32_t n_features_in_point, const uint32_t* label_ids,
                          uint32_t n_labels_in_point, uint64_t n_features, uint64_t n_labels);

/// What is wrong with the whole dataset ("" when nothing is): its offsets, then its points
/// (the first bad point by index, as "point 12: ..."). D and L must fit 32-bit ids (2^32).
std::string dataset_problem(const dataset& data);

/// Throws hslide::error (invalid_argument) naming data.source and both counts when `data`
/// cannot size a model: no labels or no features, or more than 2^32-1 of either (a model's
/// ids are 32-bit).
void check_model_dimensions(const dataset& data);

/// Throws hslide::input_error naming `name` (line 0) with dataset_problem's reason.
void check_dataset(const dataset& data, const std::string& name);

}  // namespace hslide
