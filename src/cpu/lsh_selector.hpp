// LSH neuron selection (SLIDE): a layer's hash functions, its L bucket tables, every row's bucket
// codes and the rows whose codes are stale, behind neuron_selector (neuron_selector.hpp).
//
// A sample's set is the union of the buckets its input hashes to (its labels first in training,
// random fill up to min_active; lsh.hpp's active_set_builder). A refresh keeps every row's codes
// and re-hashes only the rows changed or imported since they were computed (all of them after
// new hash functions), then rebuilds the tables from the codes: the same tables as hashing every
// row, since a code is a function of the row and the hash functions.
#pragma once

#include "neuron_selector.hpp"
#include "row_marks.hpp"

#include "hslide/lsh.hpp"

#include <memory>
#include <vector>

namespace hslide::cpu {

class lsh_selector final : public neuron_selector {
  public:
    /// LSH over the rows of a layer configured by `config` (its lsh and active settings). The
    /// tables are built by the first refresh.
    lsh_selector(rows_source rows, const layer_config& config, const kernel_table& kernels,
                 int threads);

    neuron_selection kind() const override { return neuron_selection::lsh; }
    /// Hashes each sample's input (dense or sparse; with multi-probe when not training and the
    /// input is dense) and builds its set from the buckets. Adds each thread's hashing and
    /// set-building seconds, averaged over the threads, to times.
    void select(selection_batch& batch, stage_times& times) override;
    void select_one(selection_sample& sample, bool training, int thread) override;
    void rows_changed(const uint32_t* ids, size_t n) override;
    void all_rows_changed() override { stale_.mark_all(); }
    /// New hash functions when at.hash_seed differs from the current ones' (every code
    /// recomputed), else the stale rows re-hashed; then the tables rebuilt, their insertion
    /// order seeded by (hash seed, step).
    void refresh(const refresh_point& at) override;

    const hash_family& hash() const { return *hash_; }
    const lsh_tables& tables() const { return tables_; }

  private:
    struct thread_scratch {
        active_set_builder builder;
        std::vector<uint32_t> codes;
        stage_times times;
    };
    lsh_config lsh_;
    active_set_config active_;
    std::unique_ptr<hash_family> hash_;
    lsh_tables tables_;
    std::vector<uint32_t> codes_;  // codes_[row * L + t], of the rows as last hashed
    row_marks stale_;              // rows changed or imported since they were hashed
    std::vector<thread_scratch> scratch_;
};

}  // namespace hslide::cpu
