// LSH neuron selection (SLIDE): a layer's hash functions, its L bucket tables, every row's bucket
// codes and the rows whose codes are stale, behind neuron_selector (neuron_selector.hpp).
//
// A sample's set is the union of the buckets its input hashes to (its labels first in training,
// random fill up to min_active; lsh.hpp's active_set_builder). A refresh keeps every row's codes
// and re-hashes only the rows changed or imported since they were computed (all of them after
// new hash functions), then rebuilds the tables from the codes: the same tables as hashing every
// row, since a code is a function of the row and the hash functions.
//
// A label-sharded output layer (set_shard; lsh_selector_shard.cpp). Each rank's tables hold its
// rows, hashed by the functions every rank draws from the same seed, so a row lands in the
// buckets it would in one process's tables. In training each rank queries them for every
// sample's candidates (the bucket union of its rows, its labels left out, with their hits), one
// all-gather brings every rank's, and every rank builds each sample's set from them as
// active_set_builder builds one process's from its union: the labels, the candidates (in rank
// order) cut to max_active by hits (cut_by_hits), the random fill over the whole layer by the
// sample's generator (fill_randomly), in ids of the whole layer. Without overflowing buckets
// or a cut, that is one process's set, in another order, and the same fill. A bucket holds up
// to bucket_capacity of the rank's rows. Prediction (select_one) answers from the rank's rows
// alone; the backend merges the ranks' top k.
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

    /// Makes this the selection of rank shard.comm->rank()'s rows of a label-sharded output
    /// layer (output_shard.hpp; rows() are the shard's): select builds every sample's set over
    /// the whole layer with the other ranks (above), every rank the same sets.
    void set_shard(const output_shard& shard);

  private:
    /// A small set of ids of the whole layer (a sample's set): open addressing over a table
    /// sized for it, emptied by a new generation, so no O(rows) array per thread.
    class id_set {
      public:
        /// Empties it for up to `most` ids.
        void reset(size_t most);
        bool contains(uint32_t id) const;
        /// Adds `id`; whether it was not there.
        bool insert(uint32_t id);

      private:
        size_t slot_of(uint32_t id) const;
        std::vector<uint64_t> slots_;  // (generation << 32) | id; another generation: empty
        uint64_t generation_ = 0;
        int shift_ = 64;
    };
    struct thread_scratch {
        active_set_builder builder;
        std::vector<uint32_t> codes;
        stage_times times;
        // A sharded layer's: the rank's labels (its rows' ids), a query's union and hits, and
        // a set of the whole layer's ids with its fill's list.
        std::vector<uint32_t> labels, local, hits, list, level_counts;
        id_set members;
    };
    /// Hashes `sample`'s input into scratch.codes (multi-probe codes_per_table at prediction).
    uint32_t hash_sample(const selection_sample& sample, bool training, thread_scratch& scratch);
    /// select on a sharded layer (lsh_selector_shard.cpp).
    void select_sharded(selection_batch& batch, stage_times& times);
    lsh_config lsh_;
    active_set_config active_;
    std::unique_ptr<hash_family> hash_;
    lsh_tables tables_;
    std::vector<uint32_t> codes_;  // codes_[row * L + t], of the rows as last hashed
    row_marks stale_;              // rows changed or imported since they were hashed
    std::vector<thread_scratch> scratch_;
    output_shard shard_;  // not sharded by default
    // A sharded select's messages: this rank's candidates of the batch, every rank's, where
    // each rank's begins, and each rank's per-sample starts.
    std::vector<uint32_t> message_;
    std::vector<unsigned char> gathered_;
    std::vector<size_t> offsets_;
    std::vector<std::vector<uint32_t>> starts_;
};

}  // namespace hslide::cpu
