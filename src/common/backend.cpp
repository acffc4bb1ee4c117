// The Backend interface's default row-level transfers: whole-model export and import, so a
// backend that does not track its rows still takes part in row-sparse merges.
#include "hslide/backend.hpp"
#include "hslide/error.hpp"

namespace hslide {

bool backend::take_changed_rows(row_sets& rows) {
    rows.clear();
    return false;
}

void backend::export_rows(const row_sets& rows, model_state& out) const {
    model_state whole;
    export_state(whole, /*with_optimizer=*/false);
    out.copy_rows(whole, rows);
}

void backend::import_rows(const model_state& in, const row_sets& rows) {
    // The replica's own state supplies everything the rows do not: the other rows, its hash
    // seeds and its step count.
    model_state whole;
    export_state(whole, /*with_optimizer=*/false);
    whole.copy_rows(in, rows);
    import_state(whole, /*with_optimizer=*/false);
}

void backend::rows_written(const row_sets&) {
    HSLIDE_CHECK(false, "rows_written: this backend has no writable host state");
}

}  // namespace hslide
