// What `auto` makes of an output layer: dense or top-k, and the sizes of its sets, from the
// layer's shape.
//
// The measurements behind it (bench/peers.md, bench/topk.md): a top-k set (the labels, the k
// highest logits, random rows up to the set's size) learns more per epoch than the full softmax
// at every size measured, from 159 labels (Bibtex: 0.633 against 0.620 after 10 epochs) through
// 374 and 6,118 to 670,091, and the best set grows with the layer: 32 rows at 159 and 374, 128 at
// 6,118, 1,024 at 670,091, about 1.6 sqrt(rows) each time; the best k is about a quarter of
// the set. Where that set would hold every row the layer is dense (the same softmax, no search).
// How the top-k is found (exact scoring or an IVF index) is the backend's choice
// (cpu_top_k_search in config.hpp).
#pragma once

#include "hslide/config.hpp"

#include <cstdint>
#include <string>

namespace hslide {

/// The output layer `auto` chose.
struct output_plan {
    sparsity_mode sparsity = sparsity_mode::topk;  ///< topk, or dense where a set holds every row
    uint32_t top_k = 0;                            ///< candidates a sample keeps besides its labels
    uint32_t min_active = 0;                       ///< the set's size with its random fill
    std::string reason;                            ///< one line: what was chosen, and why
};

/// The set size of an automatic top-k layer of `rows` rows: 1.6 sqrt(rows) rounded up to a
/// power of two, within [32, 1024].
uint32_t automatic_set_size(uint32_t rows);
/// Its top-k: a quarter of the set, within [16, 64].
uint32_t automatic_top_k(uint32_t set_size);

/// The plan for an output layer of `rows` rows whose sparsity is `asked` (automatic or topk;
/// automatic becomes topk or dense), with --top-k `top_k` and --min-active `min_active` as
/// given (0: automatic, sized from the rows).
output_plan plan_output_layer(uint32_t rows, sparsity_mode asked, uint32_t top_k,
                              uint32_t min_active);

}  // namespace hslide
