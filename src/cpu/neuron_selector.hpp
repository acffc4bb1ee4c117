// A layer's neuron selection as an object: what the CPU backend's step asks for a batch's active
// sets (config.hpp's neuron_selection), one object per layer past the input one, owning its state
// and its refresh. FAISS's Index is the model: a small pure-virtual core (kind, select), optional
// virtuals with defaults, every argument's shape documented once, here.
//
// The implementations:
//  - all_neurons (this header): every neuron, empty sets; a dense layer.
//  - lsh_selector (lsh_selector.hpp): the hash functions, the L tables, every row's codes and
//    the rows whose codes are stale; a refresh re-hashes those rows and rebuilds the tables.
//  - exact_top_k and ivf_top_k (top_k_selector.hpp): labels, then the top_k highest logits,
//    then a random fill from the step's fill pool; the candidates found by exact scoring of
//    every row, or by the IVF index, which the object builds, keeps current between steps (its
//    stale rows, reassigned or refreshed with a Lloyd step on its own rhythm, before_step) and
//    rebuilds on refresh.
//
// What the backend does with them: select (training, and the selection probe through
// select_probe) and select_one (prediction's per-sample LSH pass); rows_changed after every
// update, import or catch-up of a row; refresh when the trainer asks (refresh_selections);
// before_step at the start of every training step; search and score_exactly for prediction.
//
// A label-sharded output layer (issue 32; top-k, exact or IVF, and every neuron, on CPU ranks)
// plugs in at search: a selection over rank r's contiguous shard of rows [first, first + n) reads
// a layer_rows view of the shard (IVF: its index is over those rows), and its search returns the
// shard's candidates (ids + first, scores, and the shard's log-partition where computed). A merge
// step between search and the set's construction then keeps each sample's best k of the ranks'
// candidates (ranks_above, as merge_thread_top_k merges threads) and combines the log-partitions by
// log-sum-exp; top_k_selector::build_set runs on the merged list as it does on one rank's (the fill
// pool is a function of the seed, the step and the layer's row count, so every rank draws the same
// fill). Each rank then computes the set's rows it owns.
#pragma once

#include "exact_scoring.hpp"
#include "kernels.hpp"
#include "layer_rows.hpp"

#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/rng.hpp"
#include "hslide/step_report.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace hslide::cpu {

/// One sample of a batch as a selection reads it (input, labels, generator) and writes it (the
/// set and what the loss needs of it).
struct selection_sample {
    /// The layer's input: `width` values when input_ids is null (dense), else input_count
    /// values, those of the layer below's active neurons input_ids[0..input_count).
    const float* input = nullptr;
    const uint32_t* input_ids = nullptr;
    uint32_t input_count = 0;
    /// Forced first into the set, in this order (an output layer's labels in training; none
    /// otherwise).
    label_row labels{nullptr, 0};
    rng* gen = nullptr;  ///< the sample's generator: the set's random fill
    /// A training step's sample: the point's row in the training set (what a top-k layer
    /// that reuses candidates keys them by); no_key elsewhere.
    uint32_t key = no_key;
    static constexpr uint32_t no_key = ~0u;
    std::vector<uint32_t>* ids = nullptr;  ///< out: the set (empty: every neuron)
    uint32_t fill_start = 0;               ///< out, top-k: where the random fill begins in *ids
    /// out, exact top-k: log sum_j exp(logit j) over every row (0 where not computed)
    double log_partition = 0;
};

/// A batch of samples to choose sets for.
struct selection_batch {
    selection_sample* samples = nullptr;
    uint32_t size = 0;
    bool training = true;     ///< a training step's sets (LSH: no multi-probe)
    uint64_t step = 0;        ///< the model's Adam step (top-k: the fill pool's seed)
    uint32_t pool_batch = 0;  ///< top-k: the fill pool is sized for a step of this many samples
};

/// What a refresh builds from: the model's Adam step (a resumed run rebuilds identically) and
/// the layer's hash seed (model_state::hash_seeds; a new one means new hash functions).
struct refresh_point {
    uint64_t step = 0;
    uint64_t hash_seed = 0;
};

/// The layer's rows as they are now, from the backend that owns them (a call per use: an
/// import may move them).
using rows_source = std::function<layer_rows()>;

/// A layer's neuron selection. Calls come from one thread (each opens its own OpenMP team of
/// the `threads` given at construction), except select_one, which the backend's threads call
/// concurrently, each with its own thread number.
class neuron_selector {
  public:
    virtual ~neuron_selector() = default;

    /// Which selection this is.
    virtual neuron_selection kind() const = 0;
    /// Chooses the set of every sample of `batch` (whose inputs are computed), adding the time
    /// it took to `times` (hashing, active_sets).
    virtual void select(selection_batch& batch, stage_times& times) = 0;

    /// One sample's set, on backend thread `thread` (< threads): prediction's per-sample pass.
    /// Selections that choose a sample alone offer it (all, LSH); the default throws.
    virtual void select_one(selection_sample& sample, bool training, int thread);
    /// The sets training would choose for the selection probe, given each sample's exact
    /// top list exact[j * exact_k..] (exact_k at least the selection's top_k): by default
    /// select(batch); the exact top-k builds its sets from the list instead of scoring again.
    virtual void select_probe(selection_batch& batch, const uint32_t* exact, uint32_t exact_k);
    /// Rows ids[0..n) of the layer changed (an update, an import, a catch-up): their codes or
    /// clusters are stale until the next refresh. Default: nothing is kept of the rows.
    virtual void rows_changed(const uint32_t* ids, size_t n) {}
    /// Every row changed (a dense update, an imported model).
    virtual void all_rows_changed() {}
    /// A reduced-precision copy of the rows that the selection scores and that the update may
    /// write as it changes rows (write()): bf16 (row r at rows16 + r * stride16, rounded by the
    /// kernels' to_bf16) or int8 (rows8, quantized by to_int8_row); rows the update wrote
    /// there need no rows_changed. Empty: none (the default).
    struct search_copy {
        bf16* rows16 = nullptr;
        size_t stride16 = 0;
        int8_rows rows8;

        explicit operator bool() const { return rows16 != nullptr || bool(rows8); }
        /// Row r's `width` weights into the copy.
        void write(uint32_t r, const float* weights, uint32_t width, const kernel_table& k) const {
            if (rows16) k.to_bf16(weights, rows16 + size_t(r) * stride16, width);
            if (rows8) rows8.write(r, weights, width, k);
        }
    };
    virtual search_copy writable_search_copy() { return {}; }
    /// Brings the selection's structures up to the rows as they are (LSH: re-hash the stale
    /// rows, new functions when the seed changed, rebuild the tables; IVF: rebuild the index).
    /// Default: nothing to refresh.
    virtual void refresh(const refresh_point& at) {}
    /// Called at the start of every training step (step: the model's Adam step before it);
    /// returns the seconds spent (IVF: its partial or Lloyd refresh on its rhythm). Default: 0.
    virtual double before_step(uint64_t step) { return 0; }
    /// Whether a search goes through an IVF index (approximate; no log-partition).
    virtual bool searches_ivf() const { return false; }
    /// Whether select computes each sample's log-partition over every row (exact top-k).
    virtual bool computes_log_partition() const { return false; }
    /// The candidates: each of queries[0..n)'s (dense inputs, n <= exact_scoring::chunk(k)) k
    /// best rows as this selection finds them, into labels/scores[q * k..] (select_top_k's
    /// contract), and with log_partition != null each query's log-sum-exp over every row (only
    /// where computes_log_partition). Default: exact scoring.
    virtual void search(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                        float* scores, double* log_partition);

    /// Exact scoring of every row of the layer (the reference; exact prediction), as search's
    /// default.
    void score_exactly(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                       float* scores, double* log_partition);
    /// The layer's rows as they are now.
    layer_rows rows() const { return rows_(); }

  protected:
    neuron_selector(rows_source rows, const kernel_table& kernels, int threads)
        : rows_(std::move(rows)), k_(kernels), threads_(threads) {}

    rows_source rows_;
    const kernel_table& k_;
    int threads_;

  private:
    exact_scoring exact_;
};

/// Every neuron: the sets stay empty (a dense layer).
class all_neurons final : public neuron_selector {
  public:
    all_neurons(rows_source rows, const kernel_table& kernels, int threads)
        : neuron_selector(std::move(rows), kernels, threads) {}
    neuron_selection kind() const override { return neuron_selection::all; }
    void select(selection_batch& batch, stage_times& times) override;
    void select_one(selection_sample& sample, bool training, int thread) override;
};

/// The selection config.selection(l) names for layer l (> 0) of a model, reading the layer's
/// rows through `rows`; `train_seed` seeds its random structures (seed_streams.hpp). With a
/// `shard` that is sharded (the output layer of a label-sharded run, whose rows are the
/// shard's), a top-k selection (exact or IVF) searches the shard and merges the ranks'
/// candidates (top_k_selector::set_shard), LSH queries the shard's tables and builds the sets
/// with the other ranks (lsh_selector::set_shard); every neuron needs nothing more.
std::unique_ptr<neuron_selector> make_selector(const model_config& config, size_t l,
                                               rows_source rows, uint64_t train_seed,
                                               const kernel_table& kernels, int threads,
                                               const output_shard* shard = nullptr);

}  // namespace hslide::cpu
