// The output layer's rows and the labels they stand for.
//
// A model learns a label from the training points that carry it; a label no training point
// carries can only ever be a negative, and scoring it is wasted work. On extreme data most
// labels are like that: the synthetic Amazon-670K at --scale 0.05 carries 72,295 of its
// 670,091 labels, so a row per label spends nine tenths of the output layer's memory, search
// and updates on rows that can never be a right answer (bench/peers.md, "rows for
// the carried labels only"). `hslide train --label-rows carried` gives the output layer a row for
// each carried label only (not yet the default: at the default learning rate the smaller layer
// overfits sooner).
//
// The map works on the data, not in the backends: every dataset a run touches has its label
// ids rewritten into row ids before training (labels_to_rows), so every backend, the metrics
// and the sharded run see rows 0..rows-1 as they always did, and only what reaches the user
// (predict's output) is turned back into labels (label_of_row). A label without a row is
// rewritten to an id at or above `rows`, distinct for each such label and below the data's
// label count: the metrics count it as a true label that is never predicted (P@k, nDCG@k's
// ideal ranking, PSP@k's propensities all stay as they were), and no backend ever sees it as
// a training target. Checkpoints keep the map, so `hslide eval` and `predict` rewrite their
// data the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

struct dataset;

/// Which labels get a row of the output layer.
struct label_map {
    /// The label each row stands for, ascending and unique; empty: every label has a row and
    /// row r is label r (the map of a model trained with --label-rows all, or saved before
    /// maps existed).
    std::vector<uint32_t> labels;

    bool identity() const { return labels.empty(); }
    /// The label row `row` stands for.
    uint32_t label_of_row(uint32_t row) const { return identity() ? row : labels[row]; }
};

/// The map of the labels at least one point of `train` carries (ascending); the identity when
/// it carries every label.
label_map carried_labels(const dataset& train);

/// The output rows `--label-rows` asks for: "all" the identity, "carried" carried_labels,
/// "auto" carried_labels where the labels no training point carries are at least half of the
/// ids (the synthetic Amazon-670K: 89%), else the identity (the real sets carry all but a few
/// after the hold-out: a layer renumbered for them saves nothing and trains other draws).
label_map output_label_rows(const dataset& train, const std::string& mode);

/// Rewrites the label ids of `data` into row ids of a model with `map`: label map.labels[r]
/// becomes r; a label without a row becomes labels.size() + its rank among the labels without
/// one, so ids stay distinct and below data.n_labels (which grows to one past the map's last
/// label where it is smaller). The identity map leaves `data` as it is. Throws hslide::error
/// (invalid_argument) when the map is not ascending and unique.
void labels_to_rows(dataset& data, const label_map& map);

}  // namespace hslide
