// The CPU backend: OpenMP data parallelism over the samples of a batch, per-layer active sets
// chosen by a selection object per layer (neuron_selector.hpp), and a race-free row-sparse
// update.
//
// A step has three phases:
//  1. layer by layer over the batch: the layer's active sets are chosen for every sample by
//     the layer's neuron_selector (select_active_sets hands it the batch: every neuron; LSH, a
//     query per sample in parallel, labels forced into the output layer's set; or top-k, the
//     candidates of an exact scoring or an IVF search, then labels + top-k + random fill),
//     then the samples' products are computed in parallel; at the output layer, softmax + loss
//     and the backward of the deltas follow per sample. Results go to per-sample buffers;
//     nothing shared is written.
//  2. grouping: for each layer, the (row, sample) pairs the batch touched are grouped by row
//     in sample order (sequential, O(entries), no O(rows) clearing).
//  3. per touched row, in parallel: the row's gradient is summed over its samples in sample
//     order and Adam is applied. Each row has one owner, so there are no races, and the
//     result does not depend on the number of threads.
//
// The selection seam. The backend keeps one neuron_selector per layer past the input one
// (all_neurons for a dense layer); each owns what its choice needs and refreshes it: the LSH
// tables and codes (lsh_selector), the exact-scoring buffers (every selector can score its
// rows exactly: exact top-k, exact prediction, the selection probe), the IVF index and its
// rhythm (ivf_top_k). The backend tells them which rows changed (rows_changed, after each
// update, import and catch-up), asks them to refresh (refresh_selections), calls their
// before_step hook at the start of each step (the IVF index's partial refreshes), and asks the
// output layer's for prediction's candidates (search, score_exactly) and the probe's sets.
// The backend knows no selection's internals; a label-sharded output layer plugs in as
// another selector (neuron_selector.hpp says how).
//
// The files: cpu_backend.cpp (the step), cpu_backend_selection.cpp (the seam's calls, the
// selection probe), cpu_backend_predict.cpp, cpu_backend_catch_up.cpp, cpu_backend_rows.cpp
// (changed-row tracking, exports and imports), cpu_backend_shard.cpp (a label-sharded output
// layer's step and prediction).
//
// A label-sharded output layer (issue 32, DESIGN.md "Past one device"). Given an output_shard
// that is sharded, the backend is one rank of several: model_'s output layer holds only the
// shard's rows (rows = shard.count; config keeps the whole layer's size), the input and hidden
// layers are whole and kept bit-identical on every rank. In a step every rank computes the
// hidden layers identically; the output layer's selection (every neuron, or exact top-k whose
// candidates the ranks merge) gives every rank the same set, and each keeps its own members
// (local row ids in layers.back().ids; empty is "no member" there, not "every neuron", unless
// the layer is dense). The set softmax takes the all-reduced maximum and sum of exponentials,
// the loss the all-reduced label logits (Megatron's vocab-parallel cross-entropy); under the
// logistic loss each member's delta is local and only the loss is all-reduced; each rank's
// share of the hidden layer's gradient, in double, is summed across ranks in rank order and
// rounded to float once, so every rank backpropagates the same bits, and the bits one rank
// would: the sums of exponentials and the gradient's shares are double sums rounded once, so
// the model does not depend on the split (N ranks train the bits of a one-rank group, which
// takes the same step over the whole layer; a plain backend's float sums differ by roundings).
// Each rank updates its own rows. A top-k layer searched by IVF keeps one index per rank, over
// its rows, whose candidates merge as exact scoring's do (top_k_selector.hpp); an LSH layer one
// set of tables per rank, whose candidates every rank builds the sets from (lsh_selector.hpp).
// Prediction scores the shard exactly, through its index or its tables, and merges the ranks'
// top k. --fill-correction, catch-up Adam of an LSH output layer and sparse hidden layers are
// not sharded (the constructor refuses them, naming the option).
//
// In bf16 precision the backend also holds a bf16 copy of every layer's weights (rows padded
// to 32 values, one cache line): the forward products and the backward W^T delta read it, and
// phase 3 re-rounds each row it updates. The fp32 weights stay the master copy (gradients,
// Adam, checkpoints and sparse-input gathers use them).
//
// Row tracking. The backend marks the rows each update changed (phase 3's touched rows; every
// row of a dense layer, or of every layer with dense Adam) for two readers: take_changed_rows
// (row-sparse merges of the hybrid backend) and the layer's selector (rows_changed), whose LSH
// refresh re-hashes only the rows changed or imported since they were hashed and whose IVF
// index reassigns them.
//
// Catch-up Adam (--adam catch-up, adam_catch_up.hpp; input-catch-up: layer 0 only). Every row
// of a layer updated sparsely (layer 0, LSH layers) has the step it is up to date at. Before
// phase 1, the rows of the batch's features are brought up to date, each thread the rows of
// its range (the features are known before the forward pass). An LSH layer's active rows are
// known only inside phase 1, which brings each up to date before reading it: the first thread
// to claim the row (an atomic exchange of its step for a busy mark) applies the closed form of
// the skipped steps, the others wait for it, so each row is caught up once and the result is
// the same whichever thread does it. Phase 3 then updates the touched rows as usual. Rows no step
// reads stay behind until complete_deferred_updates(), which predict, export_state and host_state
// call first, and the hybrid backend before its merges of synchronize(). The tables are built from
// the rows as they are: a rebuild does not wait for rows no step has read.
#pragma once

#include "adam_catch_up.hpp"
#include "hslide/backend.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/rng.hpp"
#include "hslide/row_transfer.hpp"
#include "hslide/seed_streams.hpp"
#include "hslide/selection_quality.hpp"
#include "hslide/shard_softmax.hpp"
#include "kernels.hpp"
#include "neuron_selector.hpp"
#include "row_marks.hpp"
#include "top_k.hpp"

#include <atomic>

#include <memory>
#include <utility>
#include <vector>

namespace hslide::cpu {

class cpu_backend final : public backend, public row_transfer {
  public:
    /// With a `shard` that is sharded, `initial`'s output layer holds that shard's rows
    /// (model_state::create_shard) and the backend is that rank's (see above).
    cpu_backend(model_state initial, const train_config& train, int threads,
                const kernel_table& kernels = best_kernels(),
                precision_mode precision = precision_mode::fp32, output_shard shard = {});

    step_report train_batch(const batch_view& batch, float learning_rate) override;
    void refresh_selections(bool new_functions) override;
    void predict(const batch_view& batch, uint32_t k, scoring_mode scoring, uint32_t* labels,
                 float* scores) override;
    void export_state(model_state& out, bool with_optimizer) const override;
    void import_state(const model_state& in, bool with_optimizer) override;
    backend_info info() const override;
    /// Sharded: checks that every rank's replicated layers are the same bits
    /// (replicated_checksum), throwing hslide::error when not; nothing otherwise.
    step_report synchronize() override;
    /// An XXH3 hash of the layers every rank holds whole (all but the output layer): weights,
    /// biases and their fp32 Adam moments, and the Adam step.
    uint64_t replicated_checksum() const;
    const output_shard& shard() const { return shard_; }
    /// The model, with every row brought up to date first under --adam catch-up.
    const model_state* host_state() const override;
    /// --adam catch-up: brings every row the steps left behind up to date (they count as
    /// changed rows); nothing otherwise.
    bool complete_deferred_updates() override;
    bool take_changed_rows(row_sets& rows) override;
    void export_rows(const row_sets& rows, model_state& out) const override;
    /// Copies the rows and re-rounds their bf16 copy; the tables keep the imported neurons
    /// in their old buckets until the next refresh_selections, which re-hashes just those rows.
    void import_rows(const model_state& in, const row_sets& rows) override;
    model_state* writable_host_state() override { return &model_; }
    bool swap_parameters(model_state& other) override;
    void rows_written(const row_sets& rows) override;

    /// The output layer's sets for `batch` as training would choose them without the labels,
    /// against each point's exact top `top` logits (selection_quality.hpp), over the rows as
    /// they are (input rows behind under catch-up Adam stay so: the run's bits do not depend
    /// on when it measures); draws its random fills from its own seed.
    /// points == 0 when the layer before the output has active sets (no exact scoring).
    /// An automatic IVF search whose recall is under train_config::ivf_min_recall is replaced
    /// here by the exact one (index_given_up), its model config's ivf_probes raised to every
    /// cluster so that checkpoints and a resumed run search exactly too.
    selection_quality measure_selection(const batch_view& batch, uint32_t top) override;
    /// A dense output layer, or a top-k one searched by scoring every row (exact_top_k); not
    /// LSH, nor a top-k searched through an IVF index.
    bool selection_is_exact() const override;
    /// The candidates an exactly searched top-k output layer reuses (top_k_selector).
    const candidate_cache& candidates() const override;
    void import_candidates(const candidate_cache& cache) override;

    /// Forward and backward on `batch` without updating: writes the batch-mean gradient of
    /// the loss into `gradient` (shaped like the model; zero where the batch did not touch)
    /// and returns the mean loss. For gradient checks.
    double compute_gradient(const batch_view& batch, model_state& gradient);

    /// The active neuron ids of `sample` (index in the last batch) in layer `l`; empty means
    /// every neuron.
    const std::vector<uint32_t>& last_active(uint32_t sample, size_t l) const {
        return samples_[sample].layers[l].ids;
    }
    /// Top-k output layers: where `sample`'s random fill begins in its last set.
    uint32_t last_fill_start(uint32_t sample) const { return samples_[sample].set_drawn_from; }
    /// Layer l's neuron selection (l > 0).
    const neuron_selector& selection(size_t l) const { return *selections_[l]; }

    const model_state& model() const { return model_; }
    int threads() const { return threads_; }
    const kernel_table& kernels() const { return k_; }
    precision_mode precision() const { return precision_; }

  private:
    struct layer_buffers {
        std::vector<uint32_t> ids;  // active neurons; empty = all
        std::vector<float> act;     // activations (logits for the output layer)
        std::vector<float> delta;   // dLoss/d pre-activation
    };
    struct sample_buffers {
        std::vector<layer_buffers> layers;
        double loss = 0;
        bool trained = false;      // false for points without labels
        rng gen;                   // the sample's random fills, layer after layer
        double log_partition = 0;  // exact top-k: log sum_j exp(logit j) over every output neuron
        double dropped_mass = 0;   // exact top-k: softmax mass of the output rows left out
        uint32_t set_drawn_from = 0;  // top-k: the set's first random neuron (labels, top-k before)
        // A sharded top-k output layer: the whole set's size, and how many of the labels (the
        // set's first members) are this rank's (the first members of its list).
        uint32_t set_size = 0;
        uint32_t shard_labels = 0;
    };
    struct thread_scratch {
        std::vector<float> dense;
        std::vector<float> grad;  // a row's gradient in the update (padded_stride floats)
        // The set's logits with the fill's log-Q correction, for the gradient's softmax.
        std::vector<float> corrected_logits;
        // A row's gradient terms in the update: its samples' dense input vectors and their
        // coefficients, and the (sample, coefficient) pairs whose input is sparse.
        std::vector<const float*> entry_vectors;
        std::vector<float> entry_coefs;
        std::vector<std::pair<uint32_t, float>> sparse_entries;
        std::vector<bf16> input16;  // a layer's input rounded to bf16 (bf16 precision)
        std::vector<std::pair<uint32_t, uint32_t>> caught_up;  // (layer, row) it caught up
        std::vector<std::pair<uint32_t, uint64_t>> due;  // input rows to catch up, and from when
        stage_times times;
    };
    /// A layer's weights rounded to bf16, rows `stride` values apart.
    struct bf16_weights {
        aligned_array<bf16> values;
        uint32_t stride = 0;
        const bf16* row(uint32_t r) const { return values.data() + size_t(r) * stride; }
        bf16* row(uint32_t r) { return values.data() + size_t(r) * stride; }
    };
    /// Rows touched by a batch (in increasing order), grouped: entries of touched[t] are
    /// [offsets[t], offsets[t+1]), each a sample and its coefficient for the row (layer 0:
    /// the feature's value; later layers: the neuron's delta).
    struct row_groups {
        std::vector<int32_t> slot;  // per row: index in touched, or -1
        std::vector<uint32_t> touched, offsets, entry_sample;
        std::vector<float> entry_coef;
        std::vector<uint32_t> count;  // per row, 0 between batches (grouping's counters)
    };

    /// What forward_sample does with the output layer.
    enum class output_pass {
        active_set,    ///< its LSH active set (every neuron when the layer is dense)
        every_neuron,  ///< every neuron, whatever the layer's sparsity
        skip,          ///< nothing: stop after the last hidden layer
    };

    void ensure_buffers(uint32_t batch_size);
    /// Layer 0 of sample s: its feature rows' weighted sum plus the bias, then ReLU.
    void forward_input_layer(const dataset& data, uint32_t point, uint32_t s,
                             thread_scratch& scratch);
    /// forward_input_layer for samples first..first+count-1 (count 1 to 4) of points
    /// points[0..count): four with the same features are summed together (the same bits).
    void forward_input_layers(const dataset& data, const uint32_t* points, uint32_t first,
                              uint32_t count, thread_scratch& scratch);
    /// The seam: asks layer l's selector for the active sets of every sample of the batch
    /// (whose layer l-1 is computed); the output layer's labels are forced in when training.
    /// Under catch-up Adam, an LSH layer's chosen rows are then brought up to date.
    void select_active_sets(const batch_view& batch, size_t l, bool training, step_report& report);
    /// Sample s's view for layer l's selector: its layer l-1 as input, its generator, its
    /// layer l ids as the set (no labels).
    selection_sample selection_view(size_t l, uint32_t s);
    /// Top-k: what fill_correction adds to the logits of sample `sb`'s random fill in the
    /// gradient's softmax (0 without a fill or a correction).
    float fill_correction_shift(const sample_buffers& sb) const;
    /// Layer l's rows as its selector reads them (bf16 copies in bf16 precision).
    layer_rows rows_of(size_t l) const;
    neuron_selector& output_selection() { return *selections_.back(); }
    const neuron_selector& output_selection() const { return *selections_.back(); }
    /// Makes layer l's selector from the model's config (and, on the output layer, its
    /// candidates' reuse where train_ asks for it), built from the rows as they are.
    void make_selection(size_t l);
    /// Whether the output layer's search is an automatic IVF one that gives way to the exact
    /// one under train_config::ivf_min_recall (> 0).
    bool index_may_give_way() const;
    /// Whether it does after a probe that measured `q`; gives it up if so.
    bool give_up_index(const selection_quality& q);
    /// Tells layer l's selector that rows ids[0..n) changed.
    void selection_rows_changed(size_t l, const uint32_t* ids, size_t n) {
        if (selections_[l]) selections_[l]->rows_changed(ids, n);
    }
    /// Layer l's products for sample s over its ids (empty: every neuron); ReLU below the
    /// output layer.
    void layer_products(size_t l, uint32_t s, thread_scratch& scratch);
    /// Softmax, loss and output deltas of training sample s with labels y (top-k: the
    /// probabilities of the full softmax through log_partition; dropped_mass set).
    void output_loss(const label_row& y, uint32_t s, thread_scratch& scratch);
    /// Prediction's whole pass for one sample: every layer (LSH layers query their tables,
    /// unless the output layer is asked for every neuron), or the hidden layers only.
    void forward_sample(const dataset& data, uint32_t point, uint32_t s, output_pass output,
                        uint64_t sample_seed, thread_scratch& scratch);
    /// forward_sample's layers past the input one, for sample s whose layer 0 is computed.
    void forward_above_input(uint32_t s, output_pass output, thread_scratch& scratch);
    /// The hidden layers (forward_sample, output skipped) of points batch.rows[begin..+n) into
    /// sample buffers 0..n-1, point i drawing from derive_seed(seed, i).
    void forward_hidden_chunk(const batch_view& batch, uint32_t begin, uint32_t n, uint64_t seed);
    /// predict's scoring of the rows this backend holds (a sharded layer's: its shard's, in
    /// its own ids), by `scoring`: exact, IVF or the per-sample pass.
    void predict_rows(const batch_view& batch, uint32_t k, scoring_mode scoring, uint32_t* labels,
                      float* scores);
    /// predict with exact scores, a chunk of points at a time (the output selector's
    /// score_exactly).
    void predict_exact(const batch_view& batch, uint32_t k, uint32_t* labels, float* scores);
    /// predict_exact with bf16 products (--scoring exact-bf16, on a level with dots16_bf16):
    /// the rows' bf16 copy (--precision bf16's, else rounded now into predict_rows16_) in
    /// exact scoring's tiles.
    void predict_exact_bf16(const batch_view& batch, uint32_t k, uint32_t* labels, float* scores);
    /// predict_exact ranked in int8 (--scoring exact-fast, on kernels the exact search scores
    /// int8 with): an int8 copy of the rows (quantized now into predict_rows8_) yields each
    /// point's best candidates (2k, at least 16), which are re-scored in fp32 (active_dots)
    /// for its k best.
    void predict_exact_int8(const batch_view& batch, uint32_t k, uint32_t* labels, float* scores);
    /// predict with an IVF index's top k: the output selector's search when it has one, else
    /// an index built from the rows now, for this prediction only.
    void predict_ivf(const batch_view& batch, uint32_t k, uint32_t* labels, float* scores);
    /// The chunk loop of predict_exact and predict_ivf: the hidden layers of a chunk, then
    /// score_chunk(queries, n, labels, scores), which writes the chunk's best (k a point).
    template <typename ScoreChunk>
    void predict_chunks(const batch_view& batch, uint32_t k, uint32_t* labels, float* scores,
                        ScoreChunk score_chunk);
    /// Backward of sample s from layer `top` down to layer 1 (top: the output layer unless a
    /// sharded step did the output layer's part).
    void backward_sample(uint32_t s, thread_scratch& scratch, size_t top);
    /// W_l^T delta_l of sample s over its active neurons of layer l (empty ids: every neuron),
    /// into out[0..width) (overwritten).
    void transpose_product(size_t l, uint32_t s, float* out) const;
    /// Sets layer l's deltas of sample s from the gradient of its activations (ReLU mask).
    void mask_delta(size_t l, uint32_t s, const float* gradient);
    /// Sharded output layer (cpu_backend_shard.cpp): the constructor's checks of what is
    /// sharded; each sample's set reduced to this rank's members (local ids); the set softmax,
    /// loss and output deltas with the all-reduced maximum and sums (the logistic loss: the
    /// deltas local, the loss all-reduced), the hidden gradient summed
    /// across ranks and the backward of the layers below; prediction's merge across ranks.
    void check_shardable() const;
    void keep_shard_members(const batch_view& batch);
    void sharded_output_backward(const batch_view& batch, step_report& report);
    void merge_shard_predictions(uint32_t n, uint32_t k, uint32_t* labels, float* scores);
    /// A sharded LSH layer's predict_rows: each point's set built with the other ranks as one
    /// process's (lsh_selector's sharded select, multi-probe), its members here scored, their
    /// top k (this shard's ids).
    void predict_shard_sets(const batch_view& batch, uint32_t k, uint32_t* labels, float* scores);
    /// The whole layer's id of row `row` of layer l (a sharded output layer's rows are local).
    uint32_t global_row(size_t l, uint32_t row) const {
        return l + 1 == model_.layers.size() ? row + shard_.first : row;
    }
    void run_forward_backward(const batch_view& batch, step_report& report);
    void group_rows(const batch_view& batch, size_t l);
    /// Calls visit(row, grad_row, bias_grad) for every row of layer l the batch touched,
    /// in parallel, with the batch-mean gradient (bias_grad unused for layer 0); and, while a
    /// row's gradient is summed, prefetch(r) for the row visited two after it.
    template <class Visit, class Prefetch>
    void for_each_row_gradient(const batch_view& batch, size_t l, Visit&& visit,
                               Prefetch&& prefetch);
    /// Marks the rows phase 3 of layer l updated (changed_, and its selector's rows_changed
    /// unless the update wrote them into the selector's bf16 copy: copy_written).
    void mark_updated_rows(size_t l, bool every_row, bool copy_written);
    /// Adds the batch-mean gradient of layer 0's bias (width floats) to `out`.
    void add_layer0_bias_gradient(const batch_view& batch, float* out) const;
    /// Rounds the bf16 copy of every row of layer l (bf16 precision only).
    void refresh_bf16_layer(size_t l);
    /// --adam-moments bf16: whether layer l's moments live in moments16_ (every layer past the
    /// input one), and the moves between them and model_'s fp32 arrays: take_moments rounds
    /// model_'s (to nearest even) into moments16_ and empties model_'s; widen_moments writes
    /// them into `out` (an export's copy of model_, or model_ itself for host_state(), until
    /// drop_widened_moments at the next step).
    bool bf16_moments(size_t l) const { return l < moments16_.size() && moments16_[l].m.size(); }
    /// Requests row `row` of layer l, its weights and Adam moments (in whichever form they are
    /// kept), for writing: ahead of an update or a catch-up of the row.
    void prefetch_row_state(size_t l, uint32_t row) const;
    void take_moments();
    /// After model_'s weights and biases were replaced whole (import_state, swap_parameters):
    /// a new start for take_changed_rows, fresh bf16 copies, every selection refreshed.
    void parameters_replaced();
    void widen_moments(model_state& out) const;
    void drop_widened_moments();
    /// Throws unless every id is a row of layer l.
    void check_row_ids(size_t l, const std::vector<uint32_t>& ids) const;
    /// Copies rows `ids` of layer l from `src` (none: they were written in place), re-rounds
    /// their bf16 copy and tells the layer's selector (import_rows, rows_written).
    void copy_and_refresh_rows(size_t l, const std::vector<uint32_t>& ids, const layer_state* src);
    bool use_bf16() const { return precision_ == precision_mode::bf16; }
    bool catches_up() const {
        return train_.adam == adam_mode::catch_up || train_.adam == adam_mode::input_catch_up;
    }
    /// Whether layer l's rows catch up: updated sparsely (layer 0, LSH layers), in a layer
    /// the mode covers.
    bool catches_up(size_t l) const {
        return (l == 0 || model_.config.uses_lsh(l)) && adam_catches_up_rows(train_.adam, l);
    }
    /// Brings rows `ids` of layer l up to date before a training step reads them (any thread).
    void bring_up_to_date(size_t l, const uint32_t* ids, uint32_t n, thread_scratch& scratch);
    /// Brings the rows of the batch's features up to date (layer 0), before the forward pass:
    /// each thread takes the rows of its own range, so no row is claimed twice.
    void bring_inputs_up_to_date(const batch_view& batch);
    /// Applies the steps row `row` of layer l skipped since step `from` (it is claimed).
    void catch_up_row(size_t l, uint32_t row, uint64_t from);
    /// Every row up to date at the model's step (creation, import_state).
    void restart_catch_up();
    /// Marks the rows the threads' scratch lists caught up as changed.
    void mark_caught_up_rows();
    /// The seed of predict's random draws (active-set fills), point i drawing from
    /// derive_seed(predict_seed(), i).
    uint64_t predict_seed() const {
        return step_seed(train_.seed, seed_stream::predict, model_.adam_step);
    }

    model_state model_;
    train_config train_;
    int threads_;
    const kernel_table& k_;
    precision_mode precision_;
    std::vector<bf16_weights> weights16_;  // per layer; empty in fp32 precision
    struct bf16_moments_of_layer {
        aligned_array<bf16> m, v;  // rows * stride each, as model_'s adam_m / adam_v
    };
    std::vector<bf16_moments_of_layer> moments16_;  // per layer; empty with fp32 moments
    // Per layer: its neuron selection (null for the input layer).
    std::vector<std::unique_ptr<neuron_selector>> selections_;
    std::vector<thread_scratch> scratch_;
    std::vector<sample_buffers> samples_;
    std::vector<row_groups> groups_;  // per layer
    std::vector<row_marks> changed_;  // per layer: rows updated since take_changed_rows
    std::vector<float> layer0_bias_grad_;
    exact_scoring predict_scoring_;     // predict_exact_bf16's scorer and its buffers
    std::vector<bf16> predict_rows16_;  // predict_exact_bf16's rounding of the output rows
    int8_copy predict_rows8_;           // predict_exact_int8's copy of the output rows
    // Catch-up Adam: per layer that catches up, the step each row is up to date at (a busy
    // mark while a thread catches it up); null for other layers, empty without catch-up.
    std::vector<std::unique_ptr<std::atomic<uint64_t>[]>> row_step_;
    adam_catch_up catch_up_;
    // Whether a step since the last complete_deferred_updates may have left rows behind: predict
    // (called a chunk of points at a time) and the exports then skip the O(rows) scan.
    bool rows_behind_ = false;
    output_shard shard_;  // the output layer's rows this rank holds (default: all, not sharded)
    // Sharded steps' buffers: the set softmax's samples and sums (shard_softmax.hpp), the hidden
    // layer's gradient (batch x width, in double until summed over ranks), and the merge's
    // messages.
    std::vector<shard_softmax_sample> shard_softmax_;
    // Every-row layers: this rank's labels' rows (shard_label_rows).
    std::vector<uint32_t> shard_label_index_, shard_label_begin_;
    shard_softmax_scratch shard_sums_;
    std::vector<double> shard_grad_;
    std::vector<unsigned char> shard_scratch_;
};

}  // namespace hslide::cpu
