// Top-k neuron selection of an output layer, behind neuron_selector (neuron_selector.hpp): a
// sample's set is its labels, then the other rows among its top_k highest logits, then random
// rows up to min_active drawn from the step's fill pool (fill_pool.hpp). top_k_selector builds
// the sets from candidates; exact_top_k finds them by scoring every row (and computes each
// sample's log-partition, for the full-softmax loss), ivf_top_k through an IVF index
// (ivf_index.hpp) that it builds, keeps current and rebuilds.
#pragma once

#include "ivf_index.hpp"
#include "neuron_selector.hpp"
#include "row_marks.hpp"
#include "top_k_set.hpp"

#include "hslide/candidate_cache.hpp"
#include "hslide/fill_pool.hpp"
#include "hslide/output_shard.hpp"

#include <vector>

namespace hslide::cpu {

/// The sets of a top-k layer from each sample's candidates (search, which subclasses define).
class top_k_selector : public neuron_selector {
  public:
    neuron_selection kind() const override { return neuron_selection::top_k; }
    /// A chunk of samples at a time (exact_scoring::chunk): search for their top_k candidates
    /// (with their log-partitions where computed), then build_set for each. Adds the wall time
    /// to times.active_sets.
    void select(selection_batch& batch, stage_times& times) override;

    /// build_top_k_set over this layer's rows (a sharded layer's: the whole layer's), thread
    /// `thread`'s marks marking the members.
    uint32_t build_set(const uint32_t* best, uint32_t k, const label_row& labels, uint32_t fill,
                       const fill_pool& pool, rng& gen, int thread, std::vector<uint32_t>& ids);
    /// The fill pool of the training step `step` of `batch` samples.
    fill_pool step_pool(uint64_t step, uint32_t batch) const;
    /// The candidates a sample keeps (top_k, at most the rows) and the set size the fill
    /// reaches (min_active, at most the rows).
    uint32_t top_k() const;
    uint32_t fill() const;
    /// Makes this the selection of rank shard.comm->rank()'s rows of a label-sharded output
    /// layer (output_shard.hpp; rows() are the shard's): select searches the shard, merges
    /// every rank's candidates and log-partitions (merge_shard_top_k), and builds each
    /// sample's set on the merged list as one rank would, in ids of the whole layer, its fill
    /// drawn from the whole layer's rows. Every rank then holds the same sets.
    void set_shard(const output_shard& shard);
    /// Makes training steps reuse a point's candidates (selection_sample::key) while its last
    /// search is fewer than `steps` steps old (0: search every time, the default); searches
    /// at steps before `steps` are not kept. Not on a sharded layer, nor where the search
    /// computes the log-partition (the full-softmax loss needs it every step).
    void set_candidate_reuse(uint64_t steps);
    /// The points' kept candidates (empty where reuse is off), and back (a checkpoint's).
    const candidate_cache& candidates() const { return kept_; }
    void import_candidates(const candidate_cache& cache);

  protected:
    top_k_selector(rows_source rows, const layer_config& config, uint64_t train_seed,
                   const kernel_table& kernels, int threads);
    /// Builds the sets of batch.samples[first..first + n) from their candidates, sample j's
    /// top_k() first of best[j * stride..].
    void build_sets(selection_batch& batch, uint32_t first, uint32_t n, const uint32_t* best,
                    uint32_t stride);

    layer_config config_;
    uint64_t train_seed_;
    uint32_t rows_count_;  // the layer's rows (a sharded layer's: the whole layer's)
    output_shard shard_;   // not sharded by default

  private:
    std::vector<set_member_marks> scratch_;  // one per thread
    // A chunk's candidates and log-partitions.
    std::vector<uint32_t> labels_;
    std::vector<float> scores_;
    std::vector<double> log_partition_;
    std::vector<const float*> queries_;
    std::vector<unsigned char> merge_scratch_;
    // Candidate reuse: the period, the kept candidates, and the chunk's samples that search.
    uint64_t reuse_steps_ = 0;
    candidate_cache kept_;
    std::vector<uint32_t> searching_;
    /// Whether `key`'s kept candidates serve a step at `step`.
    bool reusable(uint32_t key, uint64_t step) const;
    /// Keeps row `key`'s candidates (k of them at `ids`) as searched at `step`.
    void keep(uint32_t key, uint64_t step, const uint32_t* ids);
};

/// Top-k found by scoring every row (top_k_search::exact, and automatic where it means exact).
///
/// Chosen by automatic (cpu_top_k_search) over fp32 rows, the search scores a copy of the rows
/// that the selection keeps (each row re-rounded when it changed, before the next search): in
/// int8 where the kernels have 8-bit products (dots16_u8s8, cpu_exact_search_in_int8: vpdpbusd,
/// twice vdpbf16ps' products an instruction, or vpmaddwd on avx2; the queries quantized to u8
/// each), else in bf16 where the CPU has bf16 products (AMX tiles, or vdpbf16ps). The
/// candidates are the top-k of those products (rows whose logits differ by less than the
/// rounding may swap), at a fraction of the fp32 GEMM's time (bench/peers.md). The set's
/// logits, the softmax and the gradient stay fp32; no log-partition is computed (the loss
/// reported is the set's, as IVF's). Kernels with neither (the scalar reference) score the fp32
/// rows, as `--top-k-search exact` does everywhere, with the full-softmax loss: the reference.
class exact_top_k final : public top_k_selector {
  public:
    exact_top_k(rows_source rows, const layer_config& config, uint64_t train_seed,
                const kernel_table& kernels, int threads);
    /// Not over a copy: its loss is the set's, as IVF's.
    bool computes_log_partition() const override { return copy_ == copy_kind::none; }
    /// The sets from the probe's exact lists: no second scoring.
    void select_probe(selection_batch& batch, const uint32_t* exact, uint32_t exact_k) override;
    void search(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                float* scores, double* log_partition) override;
    void rows_changed(const uint32_t* ids, size_t n) override;
    void all_rows_changed() override { stale_.mark_all(); }
    /// The copy the search scores: the update writes the rows it changes straight into it, a
    /// row hot in cache, instead of marking it for a second pass over it before the search.
    search_copy writable_search_copy() override;
    /// Whether the search scores the selection's bf16 copy of the rows.
    bool scores_bf16_copy() const { return copy_ == copy_kind::bf16; }
    /// Whether it scores an int8 copy (automatic, on kernels with dots16_u8s8).
    bool scores_int8_copy() const { return copy_ == copy_kind::int8; }

  private:
    enum class copy_kind { none, bf16, int8 };
    copy_kind copy_ = copy_kind::none;
    std::vector<bf16> rows16_;  // the bf16 copy: rows x stride16_
    size_t stride16_ = 0;
    int8_copy rows8_;  // the int8 copy
    row_marks stale_;  // rows changed since the copy last read them
    std::vector<uint32_t> stale_rows_;
    exact_scoring scoring_;
};

/// Top-k found through an IVF index over the layer's rows (top_k_search::ivf, automatic).
///
/// The index is built by refresh (seeded by the step, so a resumed run rebuilds identically)
/// and kept current between builds on its own rhythm (before_step): every config.ivf_refresh
/// steps the rows moved since the index last saw them are reassigned to their clusters, and
/// every ivf_lloyd_every-th such pass (by step, so a resumed run keeps the rhythm) is a whole
/// refresh with a Lloyd step. Training moves the rows fast enough that an index a few steps
/// old misses most of a sample's best rows (bench/topk.md); between Lloyd steps only the
/// changed rows (about 30% at the Amazon-670K shape with the fill pool) can have left their
/// clusters.
class ivf_top_k final : public top_k_selector {
  public:
    static constexpr uint32_t ivf_lloyd_every = 4;

    ivf_top_k(rows_source rows, const layer_config& config, uint64_t train_seed,
              const kernel_table& kernels, int threads);
    bool searches_ivf() const override { return true; }
    void search(const float* const* queries, uint32_t n, uint32_t k, uint32_t* labels,
                float* scores, double* log_partition) override;
    void rows_changed(const uint32_t* ids, size_t n) override;
    void all_rows_changed() override { stale_.mark_all(); }
    /// Builds the index from the rows as they are now.
    void refresh(const refresh_point& at) override;
    double before_step(uint64_t step) override;

    const ivf_index& index() const { return index_; }
    /// The clusters its index is built with: config's ivf_clusters (0: automatic); a rank's
    /// of a sharded layer, the whole layer's count times sqrt(its share of the rows) (the
    /// automatic count of its rows), each probed --ivf-probes at a time as one process's.
    uint32_t index_clusters() const;

  private:
    ivf_index index_;
    row_marks stale_;  // rows changed since the index's last pass
    std::vector<uint32_t> stale_rows_;
};

}  // namespace hslide::cpu
