// A set of rows of one layer marked one at a time (rows an update changed, rows whose LSH codes
// or IVF clusters are stale): marking and taking cost O(rows marked), never O(rows).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace hslide::cpu {

/// A flag per row and the list of marked rows, or every row at once (mark_all).
struct row_marks {
    std::vector<uint8_t> flag;  ///< one per row of the layer (size it before marking)
    std::vector<uint32_t> list;
    bool all = false;

    explicit row_marks(uint32_t rows = 0) : flag(rows, 0) {}
    void mark(uint32_t r) {
        if (!all && !flag[r]) {
            flag[r] = 1;
            list.push_back(r);
        }
    }
    void mark_all() { all = true; }
    /// Writes the marked rows into `out`, ascending, and unmarks them.
    void take(std::vector<uint32_t>& out) {
        out.clear();
        const uint32_t rows = uint32_t(flag.size());
        if (all) {
            out.resize(rows);
            std::iota(out.begin(), out.end(), 0u);
        } else if (list.size() * 8 >= rows) {
            // Most rows marked: a scan of the flags sorts them in O(rows).
            for (uint32_t r = 0; r < rows; ++r)
                if (flag[r]) out.push_back(r);
        } else {
            out.assign(list.begin(), list.end());
            std::sort(out.begin(), out.end());
        }
        for (uint32_t r : list) flag[r] = 0;
        list.clear();
        all = false;
    }
};

}  // namespace hslide::cpu
