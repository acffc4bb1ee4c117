// The dense baseline CPU backend (`--backend cpu-dense`): every neuron of every layer for every
// sample, a full softmax, no LSH. It is what a user would run without hslide's sparsity (a
// dense output layer through a real BLAS), so the sparse paths can be judged against it.
//
// It trains the same model_state networks as cpu_backend: the same layers, initialisation,
// loss (softmax cross-entropy against 1/|y| on each of the point's labels, points without
// labels skipped but counted in the batch mean) and Adam (same bias correction, same kernels).
// The layers' sparsity settings are ignored, but kept in the model, so a checkpoint written
// here continues on `--backend cpu` and the other way round.
//
// A step over a batch of B samples (activations are B x neurons matrices, one row a sample):
//  - forward: layer 0 (sparse input) is a CSR x dense product, each sample the weighted sum of
//    its feature rows (OpenMP over samples); every later layer is one SGEMM
//    Z_l = A_{l-1} W_l^T, then bias and ReLU (none on the output); the softmax and loss run per
//    sample, in place over the logits, which then hold the output deltas.
//  - backward: dA_{l-1} = delta_l W_l (SGEMM), masked by the ReLU's derivative.
//  - update: for every later layer, in blocks of rows, dW = delta_l^T A_{l-1} / B (SGEMM) and
//    Adam on every row of the block, every step (OpenMP over blocks, one single-threaded SGEMM
//    per block, so the block is still in cache for Adam). Layer 0 gets the row-sparse gradient an
//    embedding bag would: only the rows of features present in the batch's labelled points are
//    updated (every row under --adam dense and input-dense, and the catch-up modes, whose result
//    that is), each summed in sample order as cpu_backend does.
//
// Threads: the forward and backward GEMMs run on BLAS's threads, `threads` of them
// (openblas_set_num_threads where the library is OpenBLAS), the rest on `threads` OpenMP
// threads; the two pools take turns (a few times a step), never run at once. The update's
// GEMMs run inside the OpenMP region with BLAS set to one thread, so the pools never nest.
#pragma once

#include "hslide/backend.hpp"
#include "kernels.hpp"

#include <cstdint>
#include <vector>

namespace hslide::cpu {

class dense_backend final : public backend {
  public:
    /// Throws hslide::error when `precision` is not fp32 (the GEMMs are fp32 only).
    dense_backend(model_state initial, const train_config& train, int threads,
                  const kernel_table& kernels = best_kernels(),
                  precision_mode precision = precision_mode::fp32);

    step_report train_batch(const batch_view& batch, float learning_rate) override;
    /// Nothing to do: there are no tables.
    void refresh_selections(bool new_functions) override {}
    /// Exact scores of every output neuron whatever `scoring` asks (there are no LSH tables).
    void predict(const batch_view& batch, uint32_t k, scoring_mode scoring, uint32_t* labels,
                 float* scores) override;
    void export_state(model_state& out, bool with_optimizer) const override;
    void import_state(const model_state& in, bool with_optimizer) override;
    backend_info info() const override;
    const model_state* host_state() const override { return &model_; }

    /// Forward and backward on `batch` without updating: writes the batch-mean gradient of
    /// the loss into `gradient` (shaped like the model; layer 0 is zero in the rows of features
    /// the batch's labelled points lack) and returns the mean loss. For gradient checks.
    double compute_gradient(const batch_view& batch, model_state& gradient);

    const model_state& model() const { return model_; }
    int threads() const { return threads_; }

    /// The BLAS library this build calls, e.g. "OpenBLAS 0.3.21 Cooperlake" (its kernel core).
    static std::string blas_name();

  private:
    /// One (feature row, sample, position in the sample's feature list) of layer 0's gradient.
    struct input_entry {
        uint32_t row, sample, index;
    };

    void set_blas_threads() const;
    void ensure_capacity(uint32_t samples);
    /// Checks the points' feature and label ids against the model (before any parallel region,
    /// which an exception must not leave).
    void check_points(const dataset& data, const uint32_t* rows, uint32_t n, bool labels) const;
    /// Activations of every layer for data rows `rows[0..n)`; with `training`, also the
    /// softmax, loss and output deltas (in place of the logits).
    void forward(const dataset& data, const uint32_t* rows, uint32_t n, bool training);
    /// Hidden-layer deltas from the output deltas.
    void backward(uint32_t n);
    /// The batch-mean gradient of every parameter, handed to Adam (`step` set) or copied into
    /// `gradient_out` (`step` null, `gradient_out` laid out like the model).
    void apply_gradients(const batch_view& batch, const adam_step* step, model_state* gradient_out);
    void apply_gemm_layer(size_t l, uint32_t n, float inv_batch, const adam_step* step,
                          model_state* gradient_out);
    void apply_input_layer(const batch_view& batch, float inv_batch, const adam_step* step,
                           model_state* gradient_out);
    /// Row-major n x neurons(l) matrix of layer l's activations (output layer: logits, then
    /// deltas after a training forward); ld(l) floats between rows.
    float* act(size_t l) { return act_[l].data(); }
    /// Deltas of hidden layer l (l < last); the output layer's live in act(last).
    float* delta(size_t l) {
        return l + 1 == model_.layers.size() ? act_[l].data() : delta_[l].data();
    }
    size_t ld(size_t l) const { return ld_[l]; }

    model_state model_;
    train_config train_;
    int threads_;
    const kernel_table& k_;
    uint32_t capacity_ = 0;              // samples the batch buffers hold
    std::vector<size_t> ld_;             // per layer: padded_stride(neurons)
    std::vector<aligned_floats> act_;    // per layer: capacity_ x ld
    std::vector<aligned_floats> delta_;  // per hidden layer: capacity_ x ld (empty for the output)
    std::vector<double> loss_;           // per sample of the last batch
    std::vector<uint8_t> trained_;       // per sample: has labels
    std::vector<aligned_floats> grad_blocks_;  // per thread: a block of a layer's weight gradient
    std::vector<std::vector<float>> thread_grad_;  // per thread: one layer-0 row's gradient
    std::vector<input_entry> entries_;             // layer 0's (row, sample) pairs, grouped by row
    std::vector<uint32_t> row_offsets_;            // entries_ of the t-th touched row: [t], [t+1])
    std::vector<uint8_t> row_touched_;  // layer 0: 1 for rows the batch touched (--adam dense)
    std::vector<float> bias_grad_;
};

}  // namespace hslide::cpu
