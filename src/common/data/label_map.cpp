// The output layer's rows and the labels they stand for (see label_map.hpp).
#include "hslide/label_map.hpp"

#include "hslide/dataset.hpp"
#include "hslide/error.hpp"

#include <algorithm>

namespace hslide {

label_map carried_labels(const dataset& train) {
    // Sorted ids, not a flag per label: the label count may be far beyond what memory holds
    // (the allocation of such a model must fail with its own message, not here).
    label_map map;
    map.labels = train.label_ids;
    std::sort(map.labels.begin(), map.labels.end());
    map.labels.erase(std::unique(map.labels.begin(), map.labels.end()), map.labels.end());
    // Every label carried is the identity (and so is none: a set without labels, as before).
    if (map.labels.size() == train.n_labels) map.labels.clear();
    return map;
}

label_map output_label_rows(const dataset& train, const std::string& mode) {
    HSLIDE_CHECK(mode == "all" || mode == "carried" || mode == "auto",
                 "--label-rows must be carried, all or auto, got '{}'", mode);
    if (mode == "all") return {};
    label_map map = carried_labels(train);
    if (mode == "auto" && !map.identity() && 2 * uint64_t(map.labels.size()) > train.n_labels)
        map.labels.clear();
    return map;
}

void labels_to_rows(dataset& data, const label_map& map) {
    if (map.identity()) return;
    const std::vector<uint32_t>& rows = map.labels;
    HSLIDE_CHECK(
        std::adjacent_find(rows.begin(), rows.end(), std::greater_equal<uint32_t>()) == rows.end(),
        "a label map must list its labels ascending, each once");
    data.n_labels = std::max<uint64_t>(data.n_labels, uint64_t(rows.back()) + 1);
    const auto count = uint32_t(rows.size());
    for (uint32_t& id : data.label_ids) {
        const auto at = std::lower_bound(rows.begin(), rows.end(), id);
        const auto below = uint32_t(at - rows.begin());
        // id - below: how many labels under id have no row, its rank among them.
        id = at != rows.end() && *at == id ? below : count + (id - below);
    }
}

}  // namespace hslide
