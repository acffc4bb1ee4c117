// How well a backend's active sets retrieve what the full softmax weighs: measured on a few
// training points scored exactly, once an epoch (the instrument for the choice of sets).
#pragma once

#include <cstdint>

namespace hslide {

/// The output layer's active sets of `points` points, as training would choose them but
/// without the labels forced in, against each point's exact logits.
struct selection_quality {
    uint32_t points = 0;       ///< points measured (0: the backend does not measure)
    uint32_t top = 0;          ///< how many of the exact best logits the recall is against
    double top_recall = 0;     ///< mean share of a point's exact top `top` in its set
    double label_recall = 0;   ///< mean share of a point's labels in its set (labelled points)
    double mean_set_size = 0;  ///< mean neurons in a set (labels not forced)
    /// Whether a recall under train_config::ivf_min_recall makes the backend give its search
    /// up for the exact one (an automatic IVF search on the CPU, in one process).
    bool index_may_give_way = false;
    /// Whether the backend gave its automatic IVF search up for the exact one after this
    /// measurement: the sets from the next step on are exact.
    bool index_given_up = false;
};

}  // namespace hslide
