// What `auto` makes of an output layer: dense or top-k, and the sizes of its sets, from the
// layer's shape.
//
// The measurements behind it (bench/peers.md, bench/topk.md): a top-k set (the labels, the k
// highest logits, random rows up to the set's size) learns more per epoch than the full softmax
// at every size measured, from 159 labels (Bibtex: 0.633 against 0.620 after 10 epochs) through
// 374 and 6,118 to 670,091; the best set per epoch grows with the layer, about 1.6 sqrt(rows)
// (32 rows at 159 and 374, 1,024 at 670,091), and the best k is about a quarter of the set.
// Per second it is smaller where the steps would touch most of the layer: a step's Adam pass
// over the rows it touched is then a whole-layer pass, and the set's few extra random rows buy
// little (Debian-recs, 6,118 rows, batch 128, seeds 1-4: sets of 32 reach the same P@1 as sets
// of 128, 0.5056 against 0.5069, in 0.30 s an epoch instead of 0.50). So the set is also at most
// the largest power of two whose step touches half the rows. Where that set would hold every
// row the layer is dense (the same softmax, no search). How the top-k is found (exact scoring
// or an IVF index) is the backend's choice (cpu_top_k_search in config.hpp).
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

/// The set size of an automatic top-k layer of `rows` rows trained in steps of `batch` samples:
/// 1.6 sqrt(rows) rounded up to a power of two, within [32, 1024], and at most the largest
/// power of two whose step touches half the rows (batch x set uniform draws: batch x set <=
/// ln 2 x rows), unless that is below 32.
uint32_t automatic_set_size(uint32_t rows, uint32_t batch);
/// Whether the half-the-rows bound made the set smaller than 1.6 sqrt(rows) would.
bool set_size_bounded_by_touch(uint32_t rows, uint32_t batch);
/// Its top-k: a quarter of the set, within [16, 64].
uint32_t automatic_top_k(uint32_t set_size);

/// Rows up to which an automatic output layer trains at --lr (automatic_output_lr_scale).
constexpr uint32_t output_lr_scale_rows = 12288;
/// The automatic output layer's learning rate as a multiple of --lr: 1 up to
/// output_lr_scale_rows rows, output_lr_scale_rows / rows above. Measured (bench/peers.md,
/// 2026-12-05, third session): the real sets (14 to 6,118 rows) lose P@1 with their output
/// layer at half the rate (Corel5k 0.414 to 0.378, Yeast 0.751 to 0.735, Debian-recs 0.510 to
/// 0.506); the Amazon-670K shape's 69,410 carried rows overfit at the full rate (P@1 0.661,
/// the best epoch the third) and climb to 0.714 at a third, 0.737 at a sixth (about this rule's
/// 0.177); synthetic sets of 18k and 6k carried labels gain too.
float automatic_output_lr_scale(uint32_t rows);

/// Output rows and input features up to which --hidden 0 (auto) is wide_hidden_width, else
/// narrow_hidden_width.
constexpr uint32_t wide_hidden_max_rows = 1024;
constexpr uint32_t wide_hidden_max_features = 4096;
constexpr uint32_t wide_hidden_width = 512;
constexpr uint32_t narrow_hidden_width = 256;
/// A hidden layer's automatic width (--hidden 0) in a model of `input_features` features and
/// `rows` output rows: 512 up to wide_hidden_max_rows rows and wide_hidden_max_features
/// features, else 256. Measured (test P@1, means over seeds): at 512 Bibtex (1,836 features,
/// 159 rows, seeds 1-12) 0.6289 -> 0.6371, Yeast (103, 14, seeds 1-6) 0.7567 -> 0.7661, Corel5k
/// (499, 374) level, Debian's Pre-Depends (1,202, 26, seeds 1-8) 0.8202 -> 0.8449, in well under
/// a second; Debian-recs (6,118 rows) gains too (0.5092 -> 0.5154, seeds 1-3) but at 1.8x the
/// time, past napkinXC's, and a step over a larger layer costs in proportion to the width
/// (bench/peers.md, 2026-12-07, fourth session). Over a wide input layer 512 gains nothing and
/// costs a third to two fifths of the time (bench/peers.md, eighth session, seeds 1-8 or 1-4):
/// Debian's Provides (7,406 features, 480 rows) 0.9312 against 0.9316 at 256, debtags (15,941,
/// 575) 0.9476 against 0.9471, its long-description set (50,179) 0.9410 against 0.9416, the
/// Section set (28,276, 58 classes) 0.9097 against 0.9101.
uint32_t automatic_hidden_width(uint32_t input_features, uint32_t rows);
/// The plan for an output layer of `rows` rows whose sparsity is `asked` (automatic or topk;
/// automatic becomes topk or dense), trained in steps of `batch` samples, with --top-k `top_k`
/// and --min-active `min_active` as given (0: automatic, sized from the rows and the batch).
output_plan plan_output_layer(uint32_t rows, uint32_t batch, sparsity_mode asked, uint32_t top_k,
                              uint32_t min_active);

}  // namespace hslide
